"""Decoder blocks (pre-norm, with optional post-norms as Gemma's sandwich), the stack of blocks whose layers differ
by type (dense or MoE, sliding or global), and the whole model: embedding, stack, final norm, head."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import (
    PROGRAMS,
    Ctx,
    Run,
    options,
    program,
    reference_call,
    relative_module,
    run_child,
    tensor_prefix,
)
from explorer.model.components.norms import NormOptions, apply_norm
from explorer.model.components.part_facts import facts
from explorer.model.components.rope import RopeOptions, rotary_angles
from explorer.spec.types import Citation, Component, Port, Step


def feed_forward_heading(ffn: Component) -> str:
    """The heading a block's step list gives its feed-forward: the one its part declares, else the part's title."""
    return facts(ffn.program).ffn_heading or ffn.title + ":"


class BlockPorts(NamedTuple):
    """The residual stream through one pre-norm block, named alike on every family's pages: the block's input, each
    norm's output (the branch inputs), the stream between the branches, and each branch's output."""

    x: Port
    x_attn: Port
    x_mid: Port
    x_ffn: Port
    delta_attn: Port
    delta_ffn: Port


def block_ports(ctx: Ctx) -> BlockPorts:
    x = Port("x_n", ctx.tokens("hidden_size"), "x")
    return BlockPorts(x, Port(r"x_{\mathrm{attn}}", x.shape, "x_attn"), Port("x'_n", x.shape, "x_mid"),
                      Port(r"x_{\mathrm{ffn}}", x.shape, "x_ffn"), Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                      Port(r"\Delta_{\mathrm{ffn}}", x.shape, "delta_ffn"))


@dataclass(frozen=True, slots=True)
class BlockOptions:
    post_attn_norm: bool = False
    post_ffn_norm: bool = False


def decoder_block(ctx: Ctx, key: str, title: str, *, layer_indices: tuple[int, ...], attn_norm: Component,
                  attn: Component, ffn_norm: Component, ffn: Component, kind: str, description: str,
                  citations: tuple[Citation, ...], post_attn_norm: Component | None = None,
                  post_ffn_norm: Component | None = None, attn_heading: str = "", ffn_heading: str = "") -> Component:
    """x' = x + Attn(Norm(x)); x_next = x' + FFN(Norm(x')), with post-norms on each branch where given."""
    x = attn_norm.inputs[0]
    # with post-norms (Gemma's sandwich), the residual adds the normalised branch
    delta_attn = post_attn_norm.outputs[0].latex if post_attn_norm else r"\Delta_{\mathrm{attn}}"
    delta_ffn = post_ffn_norm.outputs[0].latex if post_ffn_norm else r"\Delta_{\mathrm{ffn}}"
    residual_attn = Step(rf"x'_n=x_n+{delta_attn}", x.shape, "residual-attn")
    residual_ffn = Step(rf"x_{{n+1}}=x'_n+{delta_ffn}", x.shape, "residual-ffn")
    steps = [attn_norm.equations[0], Step(rf"\text{{{attn_heading or attn.title}:}}", heading=True, name="attention"),
             *attn.steps]
    if post_attn_norm is not None:
        steps.append(post_attn_norm.equations[0])
    steps += [residual_attn, ffn_norm.equations[0],
              Step(rf"\text{{{ffn_heading or feed_forward_heading(ffn)}}}", heading=True, name="ffn"), *ffn.steps]
    if post_ffn_norm is not None:
        steps.append(post_ffn_norm.equations[0])
    steps.append(residual_ffn)
    n = len(layer_indices)
    children = (attn_norm, attn) + ((post_attn_norm,) if post_attn_norm else ()) + (ffn_norm, ffn) + (
        (post_ffn_norm,) if post_ffn_norm else ())
    noun = f"{kind} block" + ("s" if n != 1 else "")
    return Component(
        key=key, title=title, kind="learned", code=f"{ctx.reference.prefix}DecoderLayer(config, layer_idx)",
        description=description, repeat=n, repeat_label=noun, crumb=f"{n} {noun}",
        inputs=(x, *attn.inputs[1:]), outputs=(Port("x_{n+1}", x.shape, "x_next"),),
        equations=(residual_attn, residual_ffn), steps=tuple(steps), children=children, citations=citations,
        program="block", options=BlockOptions(post_attn_norm is not None, post_ffn_norm is not None),
    )


def _norm(comp: Component, key: str, run: Run, name: str, x: torch.Tensor) -> torch.Tensor:
    child = comp.child(key)
    return apply_norm(run, name, x, options(child, NormOptions), relative_module(comp, child))


@program("block", layout="residual-block")
def run_block(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """rest: what the attention takes besides x (rotary angles and mask; only the mask without rotary)."""
    o = options(comp, BlockOptions)
    x_attn = _norm(comp, "attn_norm", run, "attn_norm", x)
    delta_attn = run_child(comp, "attn", run, x_attn, *rest)
    if o.post_attn_norm:
        delta_attn = _norm(comp, "post_attn_norm", run, "post_attn_norm", delta_attn)
    x_mid = run.rec("residual-attn", x + delta_attn)
    x_ffn = _norm(comp, "ffn_norm", run, "ffn_norm", x_mid)
    ffn = next(c for c in comp.children if facts(c.program).ffn_heading)
    delta_ffn = run_child(comp, ffn.key, run, x_ffn)
    if o.post_ffn_norm:
        delta_ffn = _norm(comp, "post_ffn_norm", run, "post_ffn_norm", delta_ffn)
    return [run.rec("residual-ffn", x_mid + delta_ffn)]


# -------------------------------------------------------------------------------------------------- stack

def stack(ctx: Ctx, blocks: tuple[Component, ...], *, layers: int, description: str, citations: tuple[Citation, ...],
          ) -> Component:
    """The decoder layers in order; each block kind repeats over the layer indices of its tensors."""
    return Component(
        key="blocks", title="Transformer blocks", crumb=f"{layers} transformer blocks", kind="group",
        code=f"nn.ModuleList({ctx.reference.prefix}DecoderLayer(config, i) for i in range(num_hidden_layers))",
        description=description, inputs=blocks[0].inputs, outputs=blocks[0].outputs,
        equations=(Step(r"x_{n+1}=\operatorname{Block}_n(x_n),\quad n=1,\dots," + str(layers),
                        blocks[0].inputs[0].shape, "stack"),),
        children=blocks, citations=citations, program="stack", reference="-",
    )


def block_layers(block: Component) -> tuple[int, ...]:
    """The layer indices a block kind stands for, from its tensors' {layer} range."""
    for c in _walk(block):
        for t in c.tensors:
            for r in t.ranges:
                if r.var == "layer":
                    return r.values
    return ()


def layer_order(stack_c: Component) -> list[tuple[int, Component]]:
    """(layer index, block component) in execution order."""
    return sorted(((i, b) for b in stack_c.children for i in block_layers(b)), key=lambda p: p[0])


def rope_of(comp: Component) -> Component | None:
    """The rotary component a block (or model) uses: the first part inside it that declares itself rotary."""
    return next((c for c in _walk(comp) if facts(c.program).rotary), None)


def angles_for(block: Component, positions: torch.Tensor) -> torch.Tensor:
    rope_c = rope_of(block)
    if rope_c is None:
        return torch.zeros(positions.shape[0], 0, device=positions.device)
    return rotary_angles(Run({}), options(rope_c, RopeOptions), positions)


@program("stack", whole_model=True)
def run_stack(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """rest ends with the mask; each block kind gets its own rotary angles (empty where it has no rotary)."""
    M = rest[-1]
    positions = torch.arange(x.shape[1], device=x.device)
    per_kind = {b.key: angles_for(b, positions) for b in comp.children}
    order = layer_order(comp)
    if x.is_meta:  # shapes only: every layer of a kind maps x to the same shape, so trace each kind once
        order = [next(p for p in order if p[1] is b) for b in comp.children]
    for layer, block in order:
        module = tensor_prefix(block).format(layer=layer)
        (x,) = PROGRAMS[block.program](block, run.child(module, "_"), x, per_kind[block.key], M)
    return [run.rec("stack", x)]


def causal_mask(T: int, device: torch.device) -> torch.Tensor:
    return torch.full((T, T), float("-inf"), device=device).triu(1)


# -------------------------------------------------------------------------------------------------- model

def model_root(ctx: Ctx, children: tuple[Component, ...], *, code: str, description: str, layers: int,
               citations: tuple[Citation, ...]) -> Component:
    """The whole model: children keyed embed, blocks, (mtp), norm, lm_head."""
    head = children[-1]
    return Component(
        key="", title="Model", crumb="Model", kind="group", code=code, description=description,
        inputs=children[0].inputs, outputs=head.outputs,
        equations=(Step(children[0].equations[0].latex, None, "embed"),
                   Step(r"x_{n+1}=\operatorname{Block}_n(x_n)", None, "blocks"),
                   Step(rf"\ell=\operatorname{{{_norm_name(children)}}}(x_{{{layers + 1}}})\,{_head_matrix(head)}",
                        head.outputs[0].shape, "head")),
        children=children, citations=citations, program="model",
    )


def _norm_name(children: tuple[Component, ...]) -> str:
    norm = next(c for c in children if c.key == "norm")
    return "LayerNorm" if options(norm, NormOptions).kind == "layer" else "RMSNorm"


def _head_matrix(head: Component) -> str:
    return r"E_{\mathrm{tok}}^{\top}" if any(t.tied_to for t in head.tensors) else r"W_{\mathrm{vocab}}"


@program("model", whole_model=True, layout="whole-model")
def run_model(comp: Component, run: Run, ids: torch.Tensor) -> list[torch.Tensor]:
    x = run.rec("embed", run_child(comp, "embed", run.child(prefix="_"), ids))
    T_ = ids.shape[1]
    blocks = comp.child("blocks")  # its own program: a stack may carry more than x from layer to layer
    (x,) = PROGRAMS[blocks.program](blocks, run, x, torch.zeros(0), causal_mask(T_, ids.device))
    run.rec("blocks", x)
    x_hat = run_child(comp, "norm", run.child(prefix="_"), x)
    return [run.rec("head", run_child(comp, "lm_head", run.child(prefix="_"), x_hat))]


@reference_call("model")
def call_model(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (ids,) = inputs
    return ours, ref(ids).logits, "logits of the whole model"


def _walk(comp: Component) -> Iterator[Component]:
    yield comp
    for c in comp.children:
        yield from _walk(c)
