"""Routed experts stored fused, one tensor per layer for all experts, with gpt-oss's clamped SwiGLU: the gate and
up columns interleaved in one gate_up projection with a bias, both clamped at `limit`, the gate through
g·σ(αg) and the up value shifted by one; and the MoE that routes tokens to them.

References: gpt-oss model card (arXiv:2508.10925), section 2 (the clamped SwiGLU, α = 1.702, limit 7);
transformers' models/gpt_oss/modeling_gpt_oss.py (GptOssExperts, GptOssMLP), the reference binding.
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
    B,
    Ctx,
    Run,
    T,
    fmt_num,
    options,
    program,
    reference_call,
    relative_module,
    run_child,
)
from explorer.model.components.mlp import clamped_glu
from explorer.spec.storage import Storage
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step, TensorSpec


@dataclass(frozen=True, slots=True)
class ClampedSwiGLUOptions:
    experts: int
    alpha: float
    limit: float
    interleaved: bool = True
    """gate_up's columns alternate gate, up (gpt-oss); False: the gate half, then the up half (DeepSeek-V4)."""
    up_shift: float = 1.0
    """Added to the clamped up value before the product: 1 in gpt-oss, 0 in DeepSeek-V4."""
    bias: bool = True
    """gate_up and down carry biases (gpt-oss); DeepSeek-V4's experts have none."""


def clamped_experts(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, gates: Port, o: ClampedSwiGLUOptions,
                    k: int, experts_sym: str, width: str, storage: Storage, code: str,
                    citations: tuple[Citation, ...]) -> Component:
    """All experts of a layer as two stacked projections with biases: gate_up [E, 2·I, d] (gate and up columns
    interleaved) and down [E, d, I], the weights in `storage`, the biases dense."""
    E, I = ctx.sym(experts_sym), ctx.sym(width)
    d = ctx.sym("hidden_size")
    experts, inner, hidden = Dim("experts", o.experts), ctx.dim(width), ctx.dim("hidden_size")
    per_expert = Shape((B, T, experts, inner))
    steps = clamped_steps(o, x.latex, per_expert, Shape((B, T, experts, Dim("2·" + inner.label, 2 * ctx.size(width)))),
                          Shape((B, T, experts, hidden)), x.shape)
    dense = ctx.tensor  # biases stay in the model's dtype
    tensors: tuple[TensorSpec, ...] = (TensorSpec(prefix + "gate_up_proj", (E, 2 * I, d), ranges, storage=storage),)
    if o.bias:
        tensors += (dense(prefix + "gate_up_proj_bias", ranges, (E, 2 * I)),)
    tensors += (TensorSpec(prefix + "down_proj", (E, d, I), ranges, storage=storage),)
    if o.bias:
        tensors += (dense(prefix + "down_proj_bias", ranges, (E, d)),)
    layout = ("Column 2j of the gate_up projection is the gate of feature j and column 2j + 1 its up value "
              "(interleaved, not two halves)." if o.interleaved else
              "The first half of the gate_up projection's outputs are the gates, the second half the up values.")
    stored = ("The checkpoint stores each weight as [experts, out, in]; transformers holds the transpose, [experts, "
              "in, out]." if o.bias else "transformers holds each weight as [experts, out, in].")
    with_bias = "with biases" if o.bias else "without biases"
    shift = " and the up value shifted by one" if o.up_shift else ""
    return Component(
        key="experts", title="Routed experts (clamped SwiGLU)", crumb="Routed experts", kind="learned", code=code,
        description=f"{o.experts} SwiGLU experts of width {inner.size:,}, stored as one gate_up and one down tensor "
                    f"per layer, {with_bias}; the gate and up values are clamped at {fmt_num(o.limit)}{shift}. Each "
                    f"token runs {k} of them.",
        inputs=(x, gates), outputs=(Port(r"y^{\mathrm{routed}}", x.shape, "routed"),),
        equations=(steps[2], steps[4]), steps=steps, tensors=tensors, citations=citations, program="clamped_experts",
        options=o, extras=(("α (swiglu_alpha)", fmt_num(o.alpha)), ("limit (swiglu_limit)", fmt_num(o.limit))),
        notes=(layout, stored),
    )


def clamped_steps(o: ClampedSwiGLUOptions, x: str, per_expert: Shape, both: Shape, out: Shape, y: Shape,
                  ) -> tuple[Step, ...]:
    """The clamped SwiGLU's steps for every expert e, then the gated sum."""
    lim, alpha = fmt_num(o.limit), fmt_num(o.alpha)
    b_gu, b_d = (r"+b^{gu}_e", r"+b^{d}_e") if o.bias else ("", "")
    split = (r"g_{e,j}=[g\,u]_{e,2j},\quad u_{e,j}=[g\,u]_{e,2j+1}" if o.interleaved else
             r"[g_e;\,u_e]=[g\,u]_e\ \text{(two halves)}")
    glu = rf"a=\hat g\,\sigma({alpha}\,\hat g)" if o.alpha != 1.0 else r"a=\hat g\,\sigma(\hat g)"
    shifted = rf"(\hat u+{fmt_num(o.up_shift)})" if o.up_shift else r"\hat u"
    return (
        Step(rf"[g\,u]_e={x}W^{{gu}}_e{b_gu}", both, "gate-up"),
        Step(split, per_expert, "split"),
        Step(rf"\hat g=\min(g,{lim}),\quad \hat u=\operatorname{{clamp}}(u,-{lim},{lim})", per_expert, "clamp"),
        Step(glu, per_expert, "glu"),
        Step(rf"m={shifted}\odot a", per_expert, "product"),
        Step(rf"E_e=m\,W^{{d}}_e{b_d}", out, "down"),
        Step(rf"y^{{\mathrm{{routed}}}}=\sum_{{e=1}}^{{{o.experts}}}G_e\,E_e", y, "routed-sum"),
    )


def expert_outputs(run: Run, o: ClampedSwiGLUOptions, x: torch.Tensor) -> torch.Tensor:
    """E_e for every expert e: [B, T, E, d]."""
    gu = torch.einsum("btd,eod->bteo", x, run.w("gate_up_proj"))
    gu = run.rec("gate-up", gu + run.w("gate_up_proj_bias") if o.bias else gu)
    g, u = (gu[..., 0::2], gu[..., 1::2]) if o.interleaved else gu.chunk(2, dim=-1)
    run.rec("split", g)
    h = clamped_glu(g, u, o.limit, o.alpha, o.up_shift, run.rec)
    down = torch.einsum("btei,edi->bted", h, run.w("down_proj"))
    return run.rec("down", down + run.w("down_proj_bias") if o.bias else down)


@program("clamped_experts")
def run_clamped_experts(comp: Component, run: Run, x: torch.Tensor, G: torch.Tensor) -> list[torch.Tensor]:
    E_out = expert_outputs(run, options(comp, ClampedSwiGLUOptions), x)
    return [run.rec("routed-sum", torch.einsum("bte,bted->btd", G.to(E_out.dtype), E_out))]


@reference_call("clamped_experts")
def call_clamped_experts(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference experts take each token's expert indices and weights: here every expert, weighted by G."""
    x, G = inputs
    tokens, E = x.shape[0] * x.shape[1], G.shape[-1]
    indices = torch.arange(E).expand(tokens, E)
    theirs = ref(x.reshape(tokens, -1), indices, G.reshape(tokens, E))
    return ours.reshape(tokens, -1), theirs, (f"all {E} experts weighted by the same random gates, {tokens} tokens "
                                              "(routing not used: the gates our program drew, handed to the reference)")


# ----------------------------------------------------------------------------------------------- the MoE

def fused_moe(*, x: Port, y_latex: str, router_c: Component, experts_c: Component, code: str,
              citations: tuple[Citation, ...]) -> Component:
    """Route each token to k experts and sum their gated outputs (no shared expert); the experts are any fused part
    whose program takes (x, G) and whose options count them (the clamped ones here, parallel_moe's halves)."""
    E, kk = experts_of(experts_c), options(router_c, moe_lib.RouterOptions).k
    out = Step(rf"{y_latex}=y^{{\mathrm{{routed}}}}", x.shape, "moe-out")
    return Component(
        key="moe", title="Mixture of experts", crumb="Mixture of experts", kind="learned", code=code,
        description=f"Route each token to {kk} of {E} experts and add their gated outputs.", inputs=(x,),
        outputs=(Port(y_latex, x.shape, "delta_ffn"),), equations=(experts_c.steps[-1], out),
        steps=(*router_c.steps, *experts_c.steps, out), children=(router_c, experts_c), citations=citations,
        program="fused_moe")


def experts_of(experts_c: Component) -> int:
    """How many experts a fused experts part holds, from its options."""
    count = getattr(experts_c.options, "experts", None)
    if not isinstance(count, int):
        raise TypeError(f"{experts_c.key}: fused_moe needs experts options that count the experts, got "
                        f"{type(experts_c.options).__name__}")
    return count


@program("fused_moe", role="Mixture of experts", routed_experts="experts",
         ffn_heading="Mixture of experts:")
def run_fused_moe(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    router_c = comp.child("router")
    G, _ = moe_lib.route(run.child(relative_module(comp, router_c)), options(router_c, moe_lib.RouterOptions), x)
    return [run.rec("moe-out", run_child(comp, "experts", run, x, G))]


@reference_call("fused_moe")
def call_fused_moe(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference MoE returns (output, router scores)."""
    (x,) = inputs
    out = ref(x)
    return ours, out[0] if isinstance(out, tuple) else out, ""


# ---------------------------------------------------------------- the steps' formulas, tied to expert_outputs()

CANONICAL_EXPERTS = {
    "gpt-oss": ClampedSwiGLUOptions(8, 1.702, 7.0),
    "halves": ClampedSwiGLUOptions(8, 1.0, 10.0, interleaved=False, up_shift=0.0, bias=False),
}
"""Options that take every branch of expert_outputs() and clamped_glu() once (gpt-oss's and DeepSeek-V4's)."""

STEP_FINGERPRINTS: dict[str, str] = {
    "gpt-oss.gate-up": "ce13f2dde3b12f12",
    "gpt-oss.split": "725b48e0ff0a74f9",
    "gpt-oss.clamp": "a439776ae81fb118",
    "gpt-oss.glu": "b9853e3323929059",
    "gpt-oss.product": "6d801481c54371ee",
    "gpt-oss.down": "3e83e9bf479440ad",
    "gpt-oss.routed-sum": "96fc45ed3f7f9c86",
    "halves.gate-up": "552da5495aa83861",
    "halves.split": "2c2d03bbb1369260",
    "halves.clamp": "5d2ae1d1d9af5573",
    "halves.glu": "54e8d48fb5361cfc",
    "halves.product": "1077e0be7169f86b",
    "halves.down": "00780051a6a3804a",
    "halves.routed-sum": "96fc45ed3f7f9c86",
}
"""sha256 (first 16 hex digits) of each step's LaTeX on CANONICAL_EXPERTS, by "variant.step": the program above
computes what these formulas say, so a formula edited without it (or it without its formula) also changes this
table, beside the program; tests/test_truth.py recomputes it."""


def canonical_steps() -> dict[str, str]:
    """clamped_steps on each of CANONICAL_EXPERTS, by "variant.step" name."""
    s = Shape(())
    return {f"{variant}.{step.name}": step.latex for variant, o in CANONICAL_EXPERTS.items()
            for step in clamped_steps(o, "x", s, s, s, s)}
