"""Multi-head latent attention with no positional encoding (Kimi Linear's full-attention layers): DeepSeek-V3's MLA
(explorer/model/components/mla.py) with the rotary embedding taken out. The key still has a part shared by every
head, projected beside the latent by kv_a_proj_with_mqa, but nothing rotates it or the matching query features;
position reaches these layers only through the KDA layers between them, whose recurrence is ordered by
construction.

References: "Kimi Linear: An Expressive, Efficient Attention Architecture" (arXiv:2510.26692), section 3.3 (NoPE for
the MLA layers); transformers' models/kimi_linear/modeling_kimi_linear.py (KimiLinearAttention: "MLA ... with NoPE,
but the part of the keys where RoPE is applied is still shared").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from explorer.model.components.attention import call_with_rotary, headline_steps, scores_mask
from explorer.model.components.base import Ctx, Run, program, reference_call
from explorer.model.components.mla import MLA_HEADLINE, MLAOptions, mla, mla_forward, mla_memory
from explorer.model.components.rope import RopeOptions
from explorer.model.components.serving import LayerKind, layer_memory
from explorer.spec.types import Citation, Component, IndexRange, Port, Step

UNROTATED = {"q-concat": ("Q^{R}", r"Q^{\mathrm{pe}}"), "k-concat": ("k^{R}", r"k^{\mathrm{pe}}")}
"""The concatenation steps read the shared features as projected, not rotated."""


def mla_nope(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: MLAOptions,
             citations: tuple[Citation, ...], scores_citations: tuple[Citation, ...]) -> Component:
    """MLA's projections, norms and scores, without the rotary child or the rotation steps."""
    # MLA's builder is given plain rotary options only to share its projections; the rotary child is dropped below
    full = mla(ctx, prefix=prefix, ranges=ranges, x=x, o=o, rope_options=RopeOptions("default", 1.0, o.rope,
                                                                                       "interleaved"),
               citations=citations, rope_citations=(), scores_citations=scores_citations)
    steps = tuple(_unrotated(s) for s in full.steps if s.name not in ("q-rotate", "k-rotate"))
    return replace(
        full, title="Multi-head latent attention (no positions)", crumb="MLA (NoPE)", program="mla_nope",
        children=tuple(c for c in full.children if c.program != "rope"), steps=steps,
        inputs=(x, full.inputs[-1]),
        description=f"{o.heads} heads attend through a {o.kv_lora_rank}-dimensional key-value latent and a "
                    f"{o.rope}-dimensional key part shared by all heads, with no positional encoding: nothing is "
                    "rotated.",
        equations=headline_steps(steps, MLA_HEADLINE))


def _unrotated(step: Step) -> Step:
    if step.name not in UNROTATED:
        return step
    old, new = UNROTATED[step.name]
    return replace(step, latex=step.latex.replace(old, new))


@program("mla_nope", role="Attention", token_mixer=True,
         picture=("mla", "full, multi-head latent attention (MLA), no position encoding"), picture_rank=7,
         mask_pattern=scores_mask)
def run_mla_nope(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """MLA's computation with the identity in place of each rotation; rest ends with the mask (inside a stack the
    block also hands on its rotary angles, empty here)."""
    return mla_forward(comp, run, x, rest[-1], rotate_q=lambda t: t, rotate_k=lambda t: t)


reference_call("mla_nope")(call_with_rotary)


@layer_memory("mla_nope")
def mla_nope_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """The same cache as MLA's: the latent and the shared key part per token (unrotated, still cached)."""
    return mla_memory(comp, values)
