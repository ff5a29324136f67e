"""Squared-ReLU feed-forward networks: the two-matrix MLP down(ReLU(up x)²) with no gate, used as Nemotron-H's
dense MLP layers, its shared expert and each of its routed experts; and the mixture of such experts under a router
from moe.py (sigmoid scores with a correction bias), plus a shared expert.

References: "Primer: Searching for Efficient Transformers for Language Modeling" (arXiv:2109.08668) for squared
ReLU; Nemotron-H (arXiv:2504.03624); transformers' models/nemotron_h/modeling_nemotron_h.py (NemotronHMLP,
NemotronHExperts, NemotronHMoE).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import sympy

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import Ctx, Run, options, prefixed, program, relative_module, run_child
from explorer.model.components.linear import linear
from explorer.model.components.moe import RouterOptions, route
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step


@dataclass(frozen=True, slots=True)
class Relu2Options:
    width: int


def relu2(u: torch.Tensor) -> torch.Tensor:
    """ReLU(u)²: zero for negative inputs, the square otherwise."""
    return torch.relu(u).square()


def relu2_mlp(ctx: Ctx, key: str, title: str, crumb: str, *, prefix: str, ranges: tuple[IndexRange, ...],
              width: sympy.Expr, width_dim: Dim, x: Port, y: Port, description: str, code: str,
              citations: tuple[Citation, ...], sub: str = "", model_width: str = "hidden_size") -> Component:
    """down(ReLU(x W_up)²): two bias-free projections named up_proj and down_proj; `sub` indexes every symbol (the
    routed expert i, the shared expert "sh"); `model_width` is the config key of the width it reads and writes
    (hidden_size, or a latent MoE's moe_latent_size)."""
    us, hs, ws = (f"u_{{{sub}}}", f"m_{{{sub}}}", f",{sub}") if sub else ("u", "m", "")
    d = ctx.size(model_width)
    u = Port(us, ctx.tokens(width_dim), "u")
    h = Port(hs, ctx.tokens(width_dim), "h")
    up = linear(ctx, "up_proj", "Up projection", weight=prefix + "up_proj.weight", ranges=ranges, d_in=model_width,
                d_out=width, out_dim=width_dim, x=x, y=u, equation=rf"{us}={x.latex}W_{{\mathrm{{up}}{ws}}}",
                code="self.up_proj(x)", description=f"Project {d:,} features to {width_dim.size:,}.")
    down = linear(ctx, "down_proj", "Down projection", weight=prefix + "down_proj.weight", ranges=ranges,
                  d_in=width, d_out=model_width, out_dim=ctx.dim(model_width), x=h, y=y,
                  equation=rf"{y.latex}={hs}W_{{\mathrm{{down}}{ws}}}", code="self.down_proj(self.act_fn(...))",
                  description=f"Map {width_dim.size:,} activated features back to {d:,}.")
    act = Step(rf"{hs}=\max({us},0)^{{2}}", h.shape, "relu2")
    return Component(
        key=key, title=title, crumb=crumb, kind="learned", code=code, description=description, inputs=(x,),
        outputs=(y,), equations=(Step(rf"{y.latex}=\operatorname{{ReLU}}({x.latex}W_{{\mathrm{{up}}}})^{{2}}"
                                      rf"W_{{\mathrm{{down}}}}", y.shape, "relu2-mlp"),),
        steps=(up.steps[0], act, down.steps[0]), children=(up, down), citations=citations, program="relu2_mlp",
        options=Relu2Options(width_dim.size or 0),
    )


@program("relu2_mlp", role="Feed-forward (dense)", dense_mlp=True)
def run_relu2_mlp(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    u = run_child(comp, "up_proj", run, x)
    h = run.rec("relu2", relu2(u))
    return [run.rec("relu2-mlp", run_child(comp, "down_proj", run, h))]


def relu2_experts(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, experts: int, k: int,
                  width: str, experts_sym: str, code: str, citations: tuple[Citation, ...],
                  model_width: str = "hidden_size") -> Component:
    """One routed squared-ReLU expert of width `width` (a config key), repeated `experts` times, reading and writing
    `model_width` features (x's width)."""
    expert_ranges = ranges + (IndexRange("expert", tuple(range(experts))),)
    e = relu2_mlp(ctx, "expert", "Routed expert", "Routed expert", prefix=prefix + "{expert}.", ranges=expert_ranges,
                  width=ctx.sym(width), width_dim=ctx.dim(width), x=x, y=Port("E_i", x.shape, "expert_out"), sub="i",
                  description=f"One of {experts} squared-ReLU experts of width {ctx.size(width):,}; each token runs "
                              f"{k} of them.", code=code, citations=citations, model_width=model_width)
    return replace(e, repeat=experts, repeat_label="routed experts", repeat_formula=experts_sym,
                   row_label="Routed experts")


def relu2_moe(ctx: Ctx, *, x: Port, y: Port, router_c: Component, expert: Component, shared: Component,
              code: str, citations: tuple[Citation, ...]) -> Component:
    """Route each token to k squared-ReLU experts, sum their gated outputs, and add the shared expert's."""
    E, kk = expert.repeat, options(router_c, RouterOptions).k
    steps = (*router_c.steps, *prefixed(expert.steps, "expert-"),
             Step(rf"y^{{\mathrm{{routed}}}}=\sum_{{i=1}}^{{{E}}}G_i\,E_i", x.shape, "routed-sum"),
             *prefixed(shared.steps, "shared-"),
             Step(rf"{y.latex}=y^{{\mathrm{{routed}}}}+y^{{\mathrm{{shared}}}}", x.shape, "moe-out"))
    return Component(
        key="moe", title="Mixture of experts", crumb="Mixture of experts", kind="learned", code=code,
        description=f"Route each token to {kk} of {E} squared-ReLU experts and add one shared expert.",
        inputs=(x,), outputs=(y,), equations=tuple(s for s in steps if s.name in ("routed-sum", "moe-out")),
        steps=steps, children=(router_c, expert, shared), citations=citations, program="relu2_moe",
    )


@program("relu2_moe", role="Mixture of experts", routed_experts="expert")
def run_relu2_moe(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    router_c = comp.child("router")
    G, _ = route(run.child(relative_module(comp, router_c)), options(router_c, RouterOptions), x)
    y = run.rec("routed-sum", routed_relu2_sum(comp, run, x, G))
    y = y + run_child(comp, "shared", run, x, prefix="shared-")
    return [run.rec("moe-out", y)]


def routed_relu2_sum(comp: Component, run: Run, x: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Σ_i G_i down_i(ReLU(up_i x)²) over the child "expert"'s stacked weights, in x's width (the model's, or a
    latent MoE's latent width); records the first sequence's expert steps under "expert-"."""
    stacked = relative_module(comp, comp.child("expert")).replace("{expert}.", "")
    W_up, W_down = run.w(stacked + "up_proj.weight"), run.w(stacked + "down_proj.weight")   # [E, I, d], [E, d, I]
    ex = run.child(prefix="expert-")
    u = torch.einsum("btd,eid->ebti", x, W_up)
    h = relu2(u)
    ex.rec("relu2", h[0])
    E_out = torch.einsum("ebti,edi->ebtd", h, W_down)                                   # [E, B, T, d]
    ex.rec("up_proj", u[0]), ex.rec("down_proj", E_out[0])
    return torch.einsum("bte,ebtd->btd", G.to(E_out.dtype), E_out)
