"""A SwiGLU clamped after its activation (Step-3.7-Flash's swiglu_limits and swiglu_limits_shared): the activated
gate SiLU(g) is capped from above at the layer's limit L and the up value clamped to [-L, L] before their product.
gpt-oss and DeepSeek-V4 clamp the gate before the activation (min(g, L), then SiLU: mlp.clamped_glu); here the
activation comes first, so a large gate is capped at L itself rather than at SiLU(L). The limit is set per layer (a
list over the layers in the config, 0 or null meaning no clamp), so blocks group by their limits too.

Two forms: a dense MLP or shared expert (three projections, as gated_mlp stores them) and all routed experts of a
layer stored fused as transformers holds them (gate_up [E, 2·I, d], gate rows first, and down [E, d, I]).

References: "GLU Variants Improve Transformer" (arXiv:2002.05202) for SwiGLU; transformers'
models/step3p7/modeling_step3p7.py (Step3p7MLP and Step3p7Experts._apply_gate), the reference this is checked
against.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import sympy

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import B, Ctx, Run, T, fmt_num, options, program, reference_call, run_child
from explorer.model.components.mlp import activation, gated_mlp
from explorer.model.components.parallel_moe import call_halves_experts
from explorer.spec.storage import BlockFP8, Dense
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step, TensorSpec


@dataclass(frozen=True, slots=True)
class ActivatedClampOptions:
    limit: float
    """L: SiLU(g) is capped at L from above, u clamped to [-L, L]."""


@dataclass(frozen=True, slots=True)
class ActivatedClampExpertsOptions:
    experts: int
    limit: float


def clamp_after_activation(g: torch.Tensor, u: torch.Tensor, limit: float
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, min(a, L), clamp(u, -L, L)) for the gate pre-activation g, a = SiLU(g), and the up value u."""
    a = activation(g, "silu")
    return a, a.clamp(max=limit), u.clamp(-limit, limit)


def _clamp_steps(g: str, u: str, a: str, m: str, limit: float, shape: Shape) -> tuple[Step, Step, Step]:
    lim = fmt_num(limit)
    return (Step(rf"{a}={g}\,\sigma({g})", shape, "silu"),
            Step(rf"\hat {a}=\min({a},{lim}),\quad \hat {u}=\operatorname{{clamp}}({u},-{lim},{lim})", shape, "clamp"),
            Step(rf"{m}=\hat {a}\odot \hat {u}", shape, "product"))


# ------------------------------------------------------------------------------------------ the dense form

def activated_clamp_mlp(ctx: Ctx, key: str, title: str, crumb: str, *, prefix: str, ranges: tuple[IndexRange, ...],
                        d_ff: sympy.Expr, ff_dim: Dim, x: Port, y: Port, limit: float, description: str, code: str,
                        citations: tuple[Citation, ...], sub: str = "") -> Component:
    """down(min(SiLU(gate x), L) ⊙ clamp(up x, ±L)): gated_mlp's projections with the clamp after the activation."""
    base = gated_mlp(ctx, key, title, crumb, prefix=prefix, ranges=ranges, d_ff=d_ff, ff_dim=ff_dim, x=x, y=y,
                     description=description, code=code, citations=citations, sub=sub)
    gate, up, down = base.children
    shape = gate.outputs[0].shape
    g, u = gate.outputs[0].latex, up.outputs[0].latex
    a, m = (f"a_{{{sub}}}", f"m_{{{sub}}}") if sub else ("a", "m")
    steps = (gate.steps[0], up.steps[0], *_clamp_steps(g, u, a, m, limit, shape), down.steps[0])
    return replace(base, steps=steps, program="activated_clamp_mlp", options=ActivatedClampOptions(limit),
                   title=title, extras=(("clamp limit L", fmt_num(limit)),),
                   notes=(f"The clamp follows the activation: SiLU(g) is capped at {fmt_num(limit)}, and the up value "
                          f"is clamped to ±{fmt_num(limit)}.",))


@program("activated_clamp_mlp", role="Feed-forward (dense)", dense_mlp=True, layout="swiglu",
         ffn_heading="SwiGLU MLP (clamped):")
def run_activated_clamp_mlp(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, ActivatedClampOptions)
    g = run_child(comp, "gate_proj", run, x)
    u = run_child(comp, "up_proj", run, x)
    a, a_hat, u_hat = clamp_after_activation(g, u, o.limit)
    run.rec("silu", a), run.rec("clamp", a_hat)
    h = run.rec("product", a_hat * u_hat)
    return [run.rec("swiglu", run_child(comp, "down_proj", run, h))]


# ------------------------------------------------------------------------------------- the routed experts

def activated_clamp_experts(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, gates: Port,
                            o: ActivatedClampExpertsOptions, experts_sym: str, width: str, code: str,
                            citations: tuple[Citation, ...]) -> Component:
    """Σ_e G_e · down_e(min(SiLU(g_e), L) ⊙ clamp(u_e, ±L)), gate_up [E, 2·I, d] (gate rows, then up) and down
    [E, d, I] as transformers holds them."""
    E, I, d = ctx.sym(experts_sym), ctx.sym(width), ctx.sym("hidden_size")
    experts, inner, hidden = Dim("experts", o.experts), ctx.dim(width), ctx.dim("hidden_size")
    per_expert = Shape((B, T, experts, inner))
    steps = (Step(rf"[g\,u]_e={x.latex}W^{{gu}}_e,\quad g_e=[g\,u]_{{e,:{inner.size}}},\ "
                  rf"u_e=[g\,u]_{{e,{inner.size}:}}",
                  Shape((B, T, experts, Dim("2·" + inner.label, 2 * ctx.size(width)))), "gate-up"),
             *_clamp_steps("g_e", "u_e", "a_e", "m_e", o.limit, per_expert),
             Step(r"E_e=m_e W^{d}_e", Shape((B, T, experts, hidden)), "down"),
             Step(rf"y^{{\mathrm{{routed}}}}=\sum_{{e=1}}^{{{o.experts}}}G_e\,E_e", x.shape, "routed-sum"))
    storage = ctx.quantized if isinstance(ctx.quantized, BlockFP8) else Dense(ctx.dtype)
    return Component(
        key="experts", title="Routed experts (SwiGLU clamped after the activation)", crumb="Routed experts",
        kind="learned", code=code,
        description=f"{o.experts} SwiGLU experts of width {inner.size:,}, stored as one gate_up and one down tensor "
                    f"per layer; SiLU(g) is capped at {fmt_num(o.limit)} and the up value clamped to "
                    f"±{fmt_num(o.limit)} before their product.",
        inputs=(x, gates), outputs=(Port(r"y^{\mathrm{routed}}", x.shape, "routed"),),
        equations=(steps[2], steps[-1]), steps=steps,
        tensors=(TensorSpec(prefix + "gate_up_proj", (E, 2 * I, d), ranges, storage=storage),
                 TensorSpec(prefix + "down_proj", (E, d, I), ranges, storage=storage)),
        citations=citations, program="activated_clamp_experts", options=o,
        extras=(("clamp limit L", fmt_num(o.limit)),),
    )


@program("activated_clamp_experts", role="Mixture of experts")
def run_activated_clamp_experts(comp: Component, run: Run, x: torch.Tensor, G: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, ActivatedClampExpertsOptions)
    gu = run.rec("gate-up", torch.einsum("btd,eod->bteo", x, run.w("gate_up_proj")))   # [B, T, E, 2·I]
    g, u = gu.chunk(2, dim=-1)
    a, a_hat, u_hat = clamp_after_activation(g, u, o.limit)
    run.rec("silu", a), run.rec("clamp", a_hat)
    h = run.rec("product", a_hat * u_hat)
    E_out = run.rec("down", torch.einsum("btei,edi->bted", h, run.w("down_proj")))     # [B, T, E, d]
    return [run.rec("routed-sum", torch.einsum("bte,bted->btd", G.to(E_out.dtype), E_out))]


reference_call("activated_clamp_experts")(call_halves_experts)
"""The reference experts take each token's expert indices and weights: every expert, weighted by our gates."""

__all__ = ["ActivatedClampExpertsOptions", "ActivatedClampOptions", "activated_clamp_experts", "activated_clamp_mlp",
           "clamp_after_activation"]
