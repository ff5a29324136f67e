"""A mixture of experts whose routed sum is scaled after the experts, beside one shared expert (Step-3.7-Flash): the
router's gates are the selected experts' sigmoid scores renormalised to sum to one (the correction bias steering the
selection only), the experts run fused, and the block multiplies their weighted sum by a constant s
(moe_router_scaling_factor) before adding the shared expert, which every token runs unscaled and ungated.

DeepSeek-V3's router folds the same kind of constant into its gates (moe.router's scaling); here the reference's
router returns the renormalised gates and its MoE block scales the sum, so the router and the block are each checked
as the reference splits them.

References: "DeepSeek-V3 Technical Report" (arXiv:2412.19437), section 2.1.2, for sigmoid routing with a
selection-only bias; transformers' models/step3p7/modeling_step3p7.py (Step3p7TopKRouter, Step3p7SparseMoeBlock),
the reference this is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components import moe as moe_lib
from explorer.model.components.base import (
    Run,
    fmt_num,
    options,
    prefixed,
    program,
    reference_call,
    relative_module,
    run_child,
)
from explorer.spec.types import Citation, Component, Port, Step


@dataclass(frozen=True, slots=True)
class ScaledRoutedMoEOptions:
    scale: float
    """s: the routed experts' weighted sum is multiplied by it; the shared expert is not."""


def scaled_routed_moe(*, x: Port, y_latex: str, router_c: Component, experts_c: Component, shared: Component,
                      scale: float, code: str, citations: tuple[Citation, ...]) -> Component:
    """Δ = s · Σ_e G_e E_e(x) + shared(x)."""
    ro = options(router_c, moe_lib.RouterOptions)
    s = fmt_num(scale) + r"\," if scale != 1.0 else ""
    out = Step(rf"{y_latex}={s}y^{{\mathrm{{routed}}}}+y^{{\mathrm{{shared}}}}", x.shape, "moe-out")
    scaled = f", scale their sum by {fmt_num(scale)}" if scale != 1.0 else ""
    return Component(
        key="moe", title="Mixture of experts", crumb="Mixture of experts", kind="learned", code=code,
        description=f"Route each token to {ro.k} of {ro.experts} experts{scaled} and add one shared expert that every "
                    "token runs.",
        inputs=(x,), outputs=(Port(y_latex, x.shape, "delta_ffn"),), equations=(experts_c.steps[-1], out),
        steps=(*router_c.steps, *experts_c.steps, *prefixed(shared.steps, "shared-"), out),
        children=(router_c, experts_c, shared), citations=citations, program="scaled_routed_moe",
        options=ScaledRoutedMoEOptions(scale),
        extras=(("routed sum scaled by (moe_router_scaling_factor)", fmt_num(scale)),),
    )


def combine(routed: torch.Tensor, shared: torch.Tensor, scale: float) -> torch.Tensor:
    """s · y_routed + y_shared."""
    return routed * scale + shared


@program("scaled_routed_moe", role="Mixture of experts", routed_experts="experts",
         layout="shared-and-routed-experts", ffn_heading="Mixture of experts:")
def run_scaled_routed_moe(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    router_c = comp.child("router")
    G, _ = moe_lib.route(run.child(relative_module(comp, router_c)), options(router_c, moe_lib.RouterOptions), x)
    routed = run_child(comp, "experts", run, x, G)
    shared = run_child(comp, "shared", run, x, prefix="shared-")
    return [run.rec("moe-out", combine(routed, shared, options(comp, ScaledRoutedMoEOptions).scale))]


@reference_call("scaled_routed_moe")
def call_scaled_routed_moe(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference MoE block takes [B, T, d] and returns the same shape."""
    (x,) = inputs
    return ours, ref(x), "routed experts (scaled) plus the shared expert"


__all__ = ["ScaledRoutedMoEOptions", "combine", "scaled_routed_moe"]
