"""The SwiGLU MLP with its gate and up projections fused into one matrix (Phi-3, Phi-4: gate_up_proj): one
bias-free projection to 2·d_ff features whose first half is the gate and second half the up value, then
down(SiLU(g) ⊙ u). The same function as mlp.py's gated_mlp, stored as two matrices instead of three, so the
checkpoint's tensor names and the page's ledger differ while the arithmetic does not; the order of the halves does
(gate first: the reference chunks the output in two and activates the first).

References: "GLU Variants Improve Transformer" (arXiv:2002.05202); transformers' models/phi3/modeling_phi3.py
(Phi3MLP: gate, up_states = gate_up_proj(x).chunk(2, dim=-1)).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

if TYPE_CHECKING:
    import torch

from explorer.model.components.base import Ctx, Run, options, program, run_child
from explorer.model.components.linear import linear
from explorer.model.components.mlp import ACT_LATEX, MLPOptions, activation
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step


def fused_gated_mlp(ctx: Ctx, key: str, title: str, crumb: str, *, prefix: str, ranges: tuple[IndexRange, ...],
                    d_ff: sympy.Expr, ff_dim: Dim, x: Port, y: Port, description: str, code: str,
                    citations: tuple[Citation, ...], names: tuple[str, str] = ("gate_up_proj", "down_proj"),
                    ) -> Component:
    """down(SiLU(g) ⊙ u) with [g; u] = x W_gate_up: the gate the first d_ff outputs, the up value the rest."""
    F_, d = int(ff_dim.size or 0), ctx.size("hidden_size")
    both = Dim("2·d_ff", 2 * F_)
    g, h = Port("g", ctx.tokens(ff_dim), "g"), Port("m", ctx.tokens(ff_dim), "h")
    gate_up_n, down_n = names
    gate_up = linear(ctx, gate_up_n, "Fused gate-up projection", weight=f"{prefix}{gate_up_n}.weight", ranges=ranges,
                     d_in="hidden_size", d_out=2 * d_ff, out_dim=both, x=x, y=Port("[g;u]", ctx.tokens(both), "gu"),
                     equation=rf"[g;u]={x.latex}W_{{13}}", code=f"self.{gate_up_n}(hidden_states)",
                     description=f"Project {d:,} features to {2 * F_:,}: {F_:,} gate pre-activations, then {F_:,} "
                                 "values that the gate multiplies.")
    down = linear(ctx, down_n, "Down projection", weight=f"{prefix}{down_n}.weight", ranges=ranges, d_in=d_ff,
                  d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=h, y=y, equation=rf"{y.latex}=mW_{{2}}",
                  code=f"self.{down_n}(up_states * self.activation_fn(gate))",
                  description=f"Map {F_:,} gated features back to {d:,} features.")
    steps = (gate_up.steps[0],
             Step(rf"g=[g;u]_{{:,\,0:{F_}}},\ u=[g;u]_{{:,\,{F_}:{2 * F_}}}", ctx.tokens(ff_dim), "gate-up-split"),
             Step(ACT_LATEX["silu"], g.shape, "silu"), Step(r"m=a\odot u", h.shape, "product"), down.steps[0])
    return Component(
        key=key, title=title, crumb=crumb, kind="learned", code=code, description=description, inputs=(x,),
        outputs=(y,),
        equations=(Step(rf"{y.latex}=\left(\operatorname{{SiLU}}(g)\odot u\right)W_2,\quad [g;u]={x.latex}W_{{13}}",
                        y.shape, "swiglu"),),
        steps=steps, children=(gate_up, down), citations=citations, program="fused_gated_mlp",
        options=MLPOptions("silu"),
    )


@program("fused_gated_mlp", role="Feed-forward (dense)", dense_mlp=True, layout="fused-swiglu",
         ffn_heading="SwiGLU MLP:")
def run_fused_gated_mlp(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    gate_up_c, down_c = comp.children
    g, u = run_child(comp, gate_up_c.key, run, x).chunk(2, dim=-1)
    run.rec("gate-up-split", g)
    a = run.rec("silu", activation(g, options(comp, MLPOptions).act))
    h = run.rec("product", a * u)
    return [run.rec("swiglu", run_child(comp, down_c.key, run, h))]
