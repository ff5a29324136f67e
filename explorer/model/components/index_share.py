"""IndexShare (GLM-5.2 and later): a layer of DeepSeek Sparse Attention that keeps no lightning indexer of its own and
attends to the tokens the previous layer attended to. The config lists each layer as "full" (it runs its indexer,
explorer/model/components/dsa.py) or "shared"; transformers hands every layer the top-k indices the layer before it
used, so a run of shared layers reuses the selection of the last full one.

A shared layer is multi-head latent attention whose causal mask is the previous layer's narrowed mask M^DSA: it stores
no indexer tensors (wq_b, wk, k_norm, weights_proj) and caches no indexer keys, and the stack carries the selection
from layer to layer (`index_share_stack`).

References: transformers' models/glm_moe_dsa/modeling_glm_moe_dsa.py (GlmMoeDsaAttention: `indexer_types`,
`prev_topk_indices`; GlmMoeDsaModel.forward passes each layer's top-k to the next) and configuration_glm_moe_dsa.py
(indexer_types, or the schedule from index_topk_freq and index_skip_topk_offset).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.attention import headline_steps
from explorer.model.components.base import (
    PROGRAMS,
    Ctx,
    Run,
    options,
    program,
    reference_call,
    tensor_prefix,
)
from explorer.model.components.blocks import angles_for, layer_order, run_block
from explorer.model.components.check_words import OWN_ANGLES, covered, given_mask
from explorer.model.components.dsa import SCORES
from explorer.model.components.mla import MLAOptions, decode_costs, decode_form_formulas, mla, mla_cache, run_mla
from explorer.model.components.part_facts import BlockView, PictureKind
from explorer.model.components.rope import RopeOptions, reference_rotary
from explorer.model.components.serving import LayerKind, layer_memory
from explorer.spec.types import Citation, Component, IndexRange, Port, Step

SHARED_MASK = r"M^{\mathrm{DSA}}_{n-1}"
"""The narrowed mask the previous layer attended with, handed to a shared layer in place of the causal mask."""

HANDED_SELECTION = "the keys our handed mask keeps, handed to the reference as the previous layer's prev_topk_indices"


@dataclass(frozen=True, slots=True)
class SharedSelectionOptions(MLAOptions):
    """MLA's sizes, and the index_topk of the selection the layer reuses (what a query reads of its cache)."""

    topk: int = 0


def shared_selection_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: MLAOptions,
                               topk: int, rope_options: RopeOptions, citations: tuple[Citation, ...],
                               scores_citations: tuple[Citation, ...]) -> Component:
    """MLA over the keys the previous layer's indexer selection kept: no indexer, the mask handed in."""
    base = mla(ctx, prefix=prefix, ranges=ranges, x=x, o=o, rope_options=rope_options, citations=citations,
               rope_citations=(), scores_citations=scores_citations)
    x_, R, M = base.inputs
    handed = replace(M, latex=SHARED_MASK)
    reuse = Step(rf"M^{{\mathrm{{DSA}}}}_n={SHARED_MASK}\quad(\text{{the previous layer's selection of "
                 rf"{topk:,} keys per query}})", SCORES, "handed-mask")
    first = next(i for i, s in enumerate(base.steps) if s.name in ("repeat", "softmax"))
    steps = (*base.steps[:first], reuse, *(_narrowed(s) for s in base.steps[first:]))
    scores_c = base.child("scores")
    scores_c = replace(scores_c, steps=tuple(_narrowed(s) for s in scores_c.steps),
                       equations=tuple(_narrowed(s) for s in scores_c.equations),
                       inputs=tuple(replace(p, latex=r"M^{\mathrm{DSA}}_n") if p.name == "mask" else p
                                    for p in scores_c.inputs),
                       description=scores_c.description.rstrip(".") + ", over only the keys the previous layer's "
                                   "selection kept for each query.")
    return replace(
        base, title="DeepSeek Sparse Attention, selection shared", inputs=(x_, R, handed),
        children=tuple(scores_c if c.key == "scores" else c for c in base.children), steps=steps,
        equations=headline_steps(steps, ("handed-mask",)), program="shared_dsa",
        options=SharedSelectionOptions(**{f: getattr(o, f) for f in MLAOptions.__dataclass_fields__}, topk=topk),
        description=base.description.rstrip(".") + f"; each query attends only to the {topk:,} earlier tokens the "
                    "previous layer's selection kept: this layer has no indexer of its own (indexer_types "
                    "\"shared\").")


def _narrowed(step: Step) -> Step:
    """The softmax over the mask handed on from the previous layer."""
    if step.name != "softmax":
        return step
    return replace(step, latex=step.latex.replace("+M", r"+M^{\mathrm{DSA}}_n"))


# ---------------------------------------------------------------------------------------------- programs

def handed_mask(run: Run, M: torch.Tensor, batch: int) -> torch.Tensor:
    """M^DSA_n [B, T, T]: the mask handed in, the same for every query head (a causal [T, T] one when run alone)."""
    return run.rec("handed-mask", M.expand(batch, *M.shape[-2:]))


def shared_selection_picture(block: BlockView) -> PictureKind:
    return "dsa", (f"sparse (DSA: the previous layer's {block.option('topk'):,} tokens reused, no indexer), "
                   "latent KV")


@program("shared_dsa", role="Attention", token_mixer=True, picture=shared_selection_picture, picture_rank=5,
         layout="latent-attention")
def run_shared_dsa(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor,
                   M: torch.Tensor) -> list[torch.Tensor]:
    M_n = handed_mask(run, M, x.shape[0])
    (delta,) = run_mla(comp, run, x, angles, M_n[:, None])                       # heads broadcast
    return [run.rec("shared_dsa", delta)]


@program("shared_selection_block", layout="residual-block")
def run_shared_selection_block(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """A pre-norm block whose attention is handed the previous layer's mask (run_block's computation)."""
    return run_block(comp, run, x, *rest)


def shared_selection_block(block: Component) -> Component:
    """A decoder block (explorer/model/components/blocks.py) whose attention reuses the previous selection: its
    reference layer must be handed that selection, so it runs under a program of its own."""
    return replace(block, program="shared_selection_block")


def reuses_selection(block: Component) -> bool:
    return any(c.program == "shared_dsa" for c in block.children)


def selection_recorded(run: Run) -> torch.Tensor:
    """The narrowed mask M^DSA a layer that ran its indexer attended with (its step 'dsa-mask'): what transformers
    hands the next layer as prev_topk_indices."""
    return run.recorded[run.prefix + "dsa-mask"]


def index_share_stack(stack: Component) -> Component:
    """The stack of blocks (explorer/model/components/blocks.py stack) run in layer order with the selection carried:
    each shared layer gets the narrowed mask of the layer before it."""
    return replace(stack, program="index_share_stack")


@program("index_share_stack", whole_model=True)
def run_index_share_stack(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    M = rest[-1]
    positions = torch.arange(x.shape[1], device=x.device)
    per_kind = {b.key: angles_for(b, positions) for b in comp.children}
    order = layer_order(comp)
    if x.is_meta:  # shapes only: every layer of a kind maps x to the same shape, so trace each kind once
        order = [next(p for p in order if p[1] is b) for b in comp.children]
    handed = M  # replaced by the first layer's selection: a config whose first layer shares is refused
    for layer, block in order:
        sub = run.child(tensor_prefix(block).format(layer=layer), "_")
        shares = reuses_selection(block)
        (x,) = PROGRAMS[block.program](block, sub, x, per_kind[block.key], handed if shares else M)
        if not shares:
            handed = selection_recorded(sub)
    return [run.rec("stack", x)]


# ---------------------------------------------------------------------------------------------- reference

def kept_indices(M: torch.Tensor, batch: int) -> torch.Tensor:
    """[B, T, K] int32: for each query, the keys a 0/-inf mask keeps, as the top-k indices transformers hands a
    shared layer (K the most any query keeps; a query keeping fewer repeats its first kept key, a no-op in the
    scatter that turns indices back into a mask)."""
    keep = (M == 0).expand(batch, *M.shape[-2:])
    counts = keep.sum(-1, keepdim=True)
    width = int(counts.max())
    kept_first = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[..., :width]
    padded = torch.where(torch.arange(width) < counts, kept_first, kept_first[..., :1])
    return padded.to(torch.int32)


def _reference_kwargs(model, comp: Component, x: torch.Tensor, M: torch.Tensor) -> dict[str, Any]:
    """What GlmMoeDsaModel hands a shared layer: the causal mask, the rotary cos/sin and the previous top-k."""
    B_, T_ = x.shape[:2]
    rope_c = next(c for c in _walk(comp) if c.program == "rope")
    pe = reference_rotary(model.model.rotary_emb, options(rope_c, RopeOptions), x,
                          torch.arange(T_)[None].expand(B_, T_))
    causal = torch.full((T_, T_), float("-inf")).triu(1)
    return {"attention_mask": causal[None, None].expand(B_, 1, T_, T_), "position_embeddings": pe,
            "prev_topk_indices": kept_indices(M, B_)}


@reference_call("shared_dsa")
def call_shared_dsa(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    x, _, M = inputs
    out = ref(hidden_states=x, **_reference_kwargs(model, comp, x, M))
    return ours, out[0], covered(given_mask(), HANDED_SELECTION, OWN_ANGLES)


@reference_call("shared_selection_block")
def call_shared_selection_block(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    x, _, M = inputs
    out = ref(x, **_reference_kwargs(model, comp, x, M))
    return ours, out[0], covered(given_mask(), HANDED_SELECTION, OWN_ANGLES)


def _walk(comp: Component):
    yield comp
    for c in comp.children:
        yield from _walk(c)


# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("shared_dsa")
def shared_dsa_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """The MLA latent and rotary key per token, and no indexer key: the layer scores nothing, it reads at most
    index_topk cached tokens per query, the ones the previous layer selected."""
    o = comp.options
    assert isinstance(o, SharedSelectionOptions)
    full = o.heads * (o.nope + o.rope + o.v)
    return (LayerKind(
        mla_cache(o), "kv_lora_rank + qk_rope_head_dim", flops_per_key=2 * full, mha_per_token=full, topk=o.topk,
        absorbed_flops_per_key=2 * decode_costs(o)[0].per_key, decode_forms=decode_form_formulas(o),
        note=f"the MLA latent and rotary key, {mla_cache(o)}, and no indexer key: attention reads at most "
             f"{o.topk:,} cached tokens per query, those the previous layer's indexer selected"),)
