"""A latent mixture of experts (Nemotron 3 Super and Ultra): the router scores experts on the token at the model's
width, but the routed experts run in a smaller latent width. One projection takes the token into the latent width
before the experts, and one takes the experts' weighted sum back out; the shared expert stays at the model's width.

    x_lat = x W_lat,in                      [B, T, d] -> [B, T, d_latent]   (fc1_latent_proj)
    y_lat = Σ_i G_i E_i(x_lat)              each E_i: d_latent -> I -> d_latent, squared ReLU
    y     = y_lat W_lat,out + y_shared       [B, T, d_latent] -> [B, T, d]  (fc2_latent_proj)

The gates G come from the full-width token, so routing is unchanged; what shrinks is every routed expert's two
matrices (d_latent × I instead of d × I each), which is where almost all of a large MoE's parameters are. Both
projections are computed once per token, whichever experts it picks, so they count as active parameters.

References: transformers' models/nemotron_h/modeling_nemotron_h.py (NemotronHMoE: fc1_latent_proj,
fc2_latent_proj; NemotronHExperts built with input_dim = moe_latent_size); NVIDIA's Nemotron 3 Super/Ultra model
cards on the Hub (LatentMoE).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import (
    Ctx,
    Run,
    options,
    prefixed,
    program,
    reference_call,
    relative_module,
    run_child,
)
from explorer.model.components.check_words import OWN_ROUTING
from explorer.model.components.linear import linear
from explorer.model.components.moe import RouterOptions, route
from explorer.model.components.relu2_experts import routed_relu2_sum
from explorer.spec.types import Citation, Component, IndexRange, Port, Step

LATENT = "moe_latent_size"
"""The config key of the experts' latent width."""


def latent_ports(ctx: Ctx) -> tuple[Port, Port]:
    """The token in the latent width (the routed experts' input) and the experts' weighted sum there."""
    return (Port(r"x^{\mathrm{lat}}", ctx.tokens(LATENT), "x_latent"),
            Port(r"y^{\mathrm{lat}}", ctx.tokens(LATENT), "routed_latent"))


def latent_projections(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, x_lat: Port,
                       y_lat: Port, bias: bool) -> tuple[Component, Component]:
    """fc1_latent_proj (d -> d_latent) and fc2_latent_proj (d_latent -> d), Linear modules with a bias where the
    config's mlp_bias asks for one."""
    d, latent = ctx.size("hidden_size"), ctx.size(LATENT)
    routed = Port(r"y^{\mathrm{routed}}", x.shape, "routed")
    into = linear(ctx, "fc1_latent_proj", "Projection into the latent width", weight=prefix + "fc1_latent_proj.weight",
                  ranges=ranges, d_in="hidden_size", d_out=LATENT, out_dim=ctx.dim(LATENT), x=x, y=x_lat,
                  equation=rf"{x_lat.latex}={x.latex}W_{{\mathrm{{lat,in}}}}", bias=bias,
                  code="self.fc1_latent_proj(hidden_states)",
                  description=f"Project the token's {d:,} features to the experts' latent width, {latent:,}.")
    out = linear(ctx, "fc2_latent_proj", "Projection out of the latent width",
                 weight=prefix + "fc2_latent_proj.weight", ranges=ranges, d_in=LATENT, d_out="hidden_size",
                 out_dim=ctx.dim("hidden_size"), x=y_lat, y=routed,
                 equation=rf"y^{{\mathrm{{routed}}}}={y_lat.latex}W_{{\mathrm{{lat,out}}}}", bias=bias,
                 code="self.fc2_latent_proj(hidden_states)",
                 description=f"Map the routed experts' weighted sum from {latent:,} features back to {d:,}.")
    return into, out


def latent_relu2_moe(ctx: Ctx, *, x: Port, y: Port, router_c: Component, into: Component, expert: Component,
                     out: Component, shared: Component, code: str, citations: tuple[Citation, ...]) -> Component:
    """Route on the full-width token, run the k chosen squared-ReLU experts in the latent width, project their
    weighted sum back, and add the shared expert's output."""
    E, kk = expert.repeat, options(router_c, RouterOptions).k
    y_lat = out.inputs[0]
    steps = (*router_c.steps, into.steps[0], *prefixed(expert.steps, "expert-"),
             Step(rf"{y_lat.latex}=\sum_{{i=1}}^{{{E}}}G_i\,E_i", y_lat.shape, "routed-sum"),
             out.steps[0], *prefixed(shared.steps, "shared-"),
             Step(rf"{y.latex}=y^{{\mathrm{{routed}}}}+y^{{\mathrm{{shared}}}}", x.shape, "moe-out"))
    latent, d = into.outputs[0].shape.dims[-1].size, x.shape.dims[-1].size
    return Component(
        key="moe", title="Latent mixture of experts", crumb="Latent mixture of experts", kind="learned", code=code,
        description=f"Route each token to {kk} of {E} squared-ReLU experts that run in a latent width of "
                    f"{latent:,} (projected from and back to {d:,}), and add one shared expert at full width.",
        inputs=(x,), outputs=(y,),
        equations=tuple(s for s in steps if s.name in ("fc1_latent_proj", "routed-sum", "fc2_latent_proj",
                                                        "moe-out")),
        steps=steps, children=(router_c, into, expert, out, shared), citations=citations,
        program="latent_relu2_moe",
        notes=("The router reads the token at full width, before the projection into the latent width: which "
               "experts run is decided as in an MoE without one.",
               "The two latent projections run once per token whatever experts it picks: their parameters are "
               "active for every token."),
    )


@program("latent_relu2_moe", role="Mixture of experts", routed_experts="expert")
def run_latent_relu2_moe(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    router_c = comp.child("router")
    G, _ = route(run.child(relative_module(comp, router_c)), options(router_c, RouterOptions), x)
    x_lat = into_latent(comp, run, x)                                                    # [B, T, d_latent]
    y_lat = run.rec("routed-sum", routed_relu2_sum(comp, run, x_lat, G))                # [B, T, d_latent]
    y = out_of_latent(comp, run, y_lat)                                                  # [B, T, d]
    y = y + run_child(comp, "shared", run, x, prefix="shared-")
    return [run.rec("moe-out", y)]


def into_latent(comp: Component, run: Run, x: torch.Tensor) -> torch.Tensor:
    """x W_lat,in: the token in the experts' latent width."""
    return run_child(comp, "fc1_latent_proj", run, x)


def out_of_latent(comp: Component, run: Run, y_lat: torch.Tensor) -> torch.Tensor:
    """y_lat W_lat,out: the routed experts' sum back at the model's width."""
    return run_child(comp, "fc2_latent_proj", run, y_lat)


@reference_call("latent_relu2_moe")
def call_latent_moe(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """NemotronHMoE on the same normalised token: it routes, projects and sums on its own."""
    (x,) = inputs
    return ours, ref(x), OWN_ROUTING
