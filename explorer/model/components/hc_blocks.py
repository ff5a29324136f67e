"""Decoder blocks, stack and model over hyper-connected residual streams (DeepSeek-V4): each branch reads the streams
collapsed by its hyper-connection, and its output is spread back over the streams beside the mixed old streams;
the model widens the token embedding to hc_mult identical streams and collapses them with the hyper-connection
head before the final norm. The hash-routed blocks take the token ids too, for their table-routed MoE.

References: DeepSeek-V4 technical report, section 2.2; transformers' models/deepseek_v4/modeling_deepseek_v4.py
(DeepseekV4DecoderLayer, DeepseekV4Model).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import (
    PROGRAMS,
    Ctx,
    Run,
    T,
    options,
    prefixed,
    program,
    reference_call,
    run_child,
    tensor_prefix,
)
from explorer.model.components.blocks import causal_mask, layer_order
from explorer.model.components.compressed_attention import V4AttentionOptions, reference_inputs
from explorer.model.components.hyper_connections import HyperOptions, expand
from explorer.model.components.norms import NormOptions, apply_norm
from explorer.spec.types import Citation, Component, Port, Shape, Step


def _run_hc(comp: Component, key: str, run: Run, X: torch.Tensor, prefix: str):
    """(collapsed, post, comb) from the hyper-connection child `key`."""
    child = comp.child(key)
    sub = run.child(tensor_prefix(child)[len(tensor_prefix(comp)):], prefix)
    outs = PROGRAMS[child.program](child, sub, X)
    return outs[0], outs[1], outs[2]


def hc_block(ctx: Ctx, key: str, title: str, *, layer_indices: tuple[int, ...], attn_hc: Component,
             attn_norm: Component, attn: Component, ffn_hc: Component, ffn_norm: Component, ffn: Component,
             kind: str, description: str, citations: tuple[Citation, ...]) -> Component:
    """Streams X_n -> X'_n = post·Attn(Norm(pre·X_n)) + Pᵀ X_n -> X_{n+1} likewise with the FFN."""
    X = attn_hc.inputs[0]
    mid, nxt = Port("X'_n", X.shape, "streams_mid"), Port("X_{n+1}", X.shape, "streams_next")
    expand_attn = Step(r"X'_{n,j}=\pi^{\mathrm{post}}_j\,\Delta_{\mathrm{attn}}+\textstyle\sum_i P_{ij}X_{n,i}",
                       X.shape, "hc-expand-attn")
    expand_ffn = Step(r"X_{n+1,j}=\pi^{\mathrm{post}}_j\,\Delta_{\mathrm{ffn}}+\textstyle\sum_i P_{ij}X'_{n,i}",
                      X.shape, "hc-expand-ffn")
    steps = (Step(r"\text{Hyper-connection (attention):}", heading=True, name="attn-hc"),
             *prefixed(attn_hc.steps, "attn-"), attn_norm.equations[0],
             Step(rf"\text{{{attn.title}:}}", heading=True, name="attention"), *attn.steps, expand_attn,
             Step(r"\text{Hyper-connection (FFN):}", heading=True, name="ffn-hc"),
             *prefixed(ffn_hc.steps, "ffn-"), ffn_norm.equations[0],
             Step(r"\text{Mixture of experts:}", heading=True, name="ffn"), *ffn.steps, expand_ffn)
    n = len(layer_indices)
    noun = f"{kind} block" + ("s" if n != 1 else "")
    return Component(
        key=key, title=title, kind="learned", code="DeepseekV4DecoderLayer(config, layer_idx)",
        description=description, repeat=n, repeat_label=noun, crumb=f"{n} {noun}",
        # The token ids only where the MoE routes by them (a hash layer); the stack passes them to every block.
        inputs=(X, *ffn.inputs[1:], Port("M", Shape((T, T)), "mask")), outputs=(nxt,),
        equations=(expand_attn, expand_ffn),
        steps=steps, children=(attn_hc, attn_norm, attn, ffn_hc, ffn_norm, ffn), citations=citations,
        program="hc_block", options=options(attn_hc, HyperOptions),
        notes=(f"The residual stream is {mid.shape.dims[2].size} streams wide; each branch sees one collapsed "
               "stream and writes to all of them.",),
    )


def _norm(comp: Component, key: str, run: Run, x: torch.Tensor) -> torch.Tensor:
    child = comp.child(key)
    return apply_norm(run, key, x, options(child, NormOptions), tensor_prefix(child)[len(tensor_prefix(comp)):])


@program("hc_block", layout="hyper-connected-block")
def run_hc_block(comp: Component, run: Run, X: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """rest: the token ids and the mask, or the mask alone (a block whose MoE routes by score declares no ids)."""
    ids, M = (rest[0], rest[-1]) if len(rest) == 2 else (None, rest[-1])
    x, post, comb = _run_hc(comp, "attn_hc", run, X, "attn-")
    delta = run_child(comp, "attn", run, _norm(comp, "attn_norm", run, x), M)
    X = run.rec("hc-expand-attn", expand(post, comb, delta, X))
    x, post, comb = _run_hc(comp, "ffn_hc", run, X, "ffn-")
    delta = run_child(comp, "moe", run, _norm(comp, "ffn_norm", run, x), *(() if ids is None else (ids,)))
    return [run.rec("hc-expand-ffn", expand(post, comb, delta, X))]


@reference_call("hc_block")
def call_hc_block(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    X, ids = inputs[0], (inputs[1] if len(inputs) == 3 else None)  # the reference's MoE reads ids on hash layers
    window = options(comp.child("attn"), V4AttentionOptions).window
    pe, positions, mask = reference_inputs(model, X[:, :, 0], window)
    theirs = ref(X, input_ids=ids, position_embeddings=pe, position_ids=positions, attention_mask=mask)
    return ours, theirs, "the streams after both branches"


# -------------------------------------------------------------------------------------------------- stack

def hc_stack(blocks: tuple[Component, ...], *, layers: int, description: str,
             citations: tuple[Citation, ...]) -> Component:
    return Component(
        key="blocks", title="Transformer blocks", crumb=f"{layers} transformer blocks", kind="group",
        code="nn.ModuleList(DeepseekV4DecoderLayer(config, i) for i in range(num_hidden_layers))",
        description=description, inputs=max((b.inputs for b in blocks), key=len), outputs=blocks[0].outputs,
        equations=(Step(r"X_{n+1}=\operatorname{Block}_n(X_n),\quad n=1,\dots," + str(layers),
                        blocks[0].inputs[0].shape, "stack"),),
        children=blocks, citations=citations, program="hc_stack", reference="-",
    )


@program("hc_stack", whole_model=True)
def run_hc_stack(comp: Component, run: Run, X: torch.Tensor, ids: torch.Tensor, M: torch.Tensor) -> list[torch.Tensor]:
    order = layer_order(comp)
    if X.is_meta:  # shapes only: trace each block kind once
        order = [next(p for p in order if p[1] is b) for b in comp.children]
    for layer, block in order:
        (X,) = run_hc_block(block, run.child(tensor_prefix(block).format(layer=layer), "_"), X, ids, M)
    return [run.rec("stack", X)]


# -------------------------------------------------------------------------------------------------- model

def hc_model(ctx: Ctx, children: tuple[Component, ...], *, streams: int, code: str, description: str, layers: int,
             citations: tuple[Citation, ...]) -> Component:
    """Children keyed embed, blocks, hc_head, norm, lm_head."""
    embed, head = children[0], children[-1]
    X = children[1].inputs[0]
    return Component(
        key="", title="Model", crumb="Model", kind="group", code=code, description=description,
        inputs=embed.inputs, outputs=head.outputs,
        equations=(Step(embed.equations[0].latex, None, "embed"),
                   Step(rf"X_{{1,i}}=x_{{1}},\quad i=1,\dots,{streams}", X.shape, "streams"),
                   Step(r"X_{n+1}=\operatorname{Block}_n(X_n)", None, "blocks"),
                   Step(rf"\ell=\operatorname{{RMSNorm}}\big(\operatorname{{HcHead}}(X_{{{layers + 1}}})\big)\,"
                        r"W_{\mathrm{vocab}}", head.outputs[0].shape, "head")),
        children=children, citations=citations, program="hc_model",
    )


@program("hc_model", whole_model=True)
def run_hc_model(comp: Component, run: Run, ids: torch.Tensor) -> list[torch.Tensor]:
    x = run.rec("embed", run_child(comp, "embed", run.child(prefix="_"), ids))
    n = options(comp.child("hc_head"), HyperOptions).streams
    X = run.rec("streams", x.unsqueeze(2).expand(-1, -1, n, -1).contiguous())
    (X,) = run_hc_stack(comp.child("blocks"), run, X, ids, causal_mask(ids.shape[1], ids.device))
    run.rec("blocks", X)
    x = run_child(comp, "hc_head", run.child(prefix="_"), X)
    x_hat = run_child(comp, "norm", run.child(prefix="_"), x)
    return [run.rec("head", run_child(comp, "lm_head", run.child(prefix="_"), x_hat))]


@reference_call("hc_model")
def call_hc_model(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (ids,) = inputs
    return ours, ref(ids).logits, "logits of the whole model"


__all__ = ["hc_block", "hc_stack", "hc_model", "replace"]
