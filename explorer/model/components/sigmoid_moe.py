"""Top-k sigmoid routing with a shared expert, as Llama 4 does it: the router keeps the k highest logits (k = 1 in
Llama 4) and gates each kept expert by the sigmoid of its logit, with no normalisation over experts; the gate scales
the expert's input (not its output), the experts are stored fused with the input axis first, and a shared SwiGLU
expert runs on every token beside them.

References: "The Llama 4 herd" (Meta AI blog, April 2025); transformers' models/llama4/modeling_llama4.py
(Llama4Router, Llama4TextExperts, Llama4TextMoe), the reference binding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import (
    B,
    Ctx,
    Run,
    T,
    options,
    prefixed,
    program,
    reference_call,
    relative_module,
    run_child,
)
from explorer.model.components.mlp import ACT_OPERATOR, Activation, activation
from explorer.spec.storage import BlockFP8, Dense
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step, TensorSpec


@dataclass(frozen=True, slots=True)
class SigmoidTopKOptions:
    experts: int
    k: int


@dataclass(frozen=True, slots=True)
class InputGatedExpertsOptions:
    experts: int
    act: Activation = "silu"


def sigmoid_router(ctx: Ctx, *, weight: str, ranges: tuple[IndexRange, ...], x: Port, o: SigmoidTopKOptions,
                   experts_sym: str, code: str, citations: tuple[Citation, ...]) -> Component:
    """z = x W_r; keep the top k logits; G_i = σ(z_i) for the kept experts, 0 for the others."""
    experts = Dim("experts", o.experts)
    steps = (Step(rf"z={x.latex}W_{{r}}", ctx.tokens(experts), "logits"),
             Step(rf"E^{{\mathrm{{sel}}}}_i=\big[\,i\in\operatorname{{top}}_{{{o.k}}}(z)\,\big]", ctx.tokens(experts),
                  "select"),
             Step(r"G_i=\sigma(z_i)\,E^{\mathrm{sel}}_i\quad\text{(not normalised over experts)}", ctx.tokens(experts),
                  "gates"))
    pick = "the expert with the highest logit" if o.k == 1 else f"the {o.k} experts with the highest logits"
    return Component(
        key="router", title="Router (top-k sigmoid)", kind="learned", code=code,
        description=f"Score all {o.experts} experts, keep {pick} per token and gate {'it' if o.k == 1 else 'each'} by "
                    "the sigmoid of its logit; the gates are not normalised.",
        inputs=(x,), outputs=(Port("G", ctx.tokens(experts), "gates"),), equations=steps[1:], steps=steps,
        tensors=(ctx.tensor(weight, ranges, (ctx.sym(experts_sym), ctx.sym("hidden_size"))),),
        citations=citations, program="sigmoid_topk_router", options=o,
    )


def route(run: Run, o: SigmoidTopKOptions, x: torch.Tensor) -> torch.Tensor:
    z = run.rec("logits", F.linear(x, run.w("weight")))
    picked = z.topk(o.k, dim=-1).indices
    selected = run.rec("select", torch.zeros_like(z).scatter(-1, picked, 1.0))
    return run.rec("gates", torch.sigmoid(z.float()).to(z.dtype) * selected)


@program("sigmoid_topk_router")
def run_sigmoid_router(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    return [route(run, options(comp, SigmoidTopKOptions), x)]


@reference_call("sigmoid_topk_router")
def call_sigmoid_router(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference router returns (gates over all experts, 0 where not kept; logits)."""
    (x,) = inputs
    scores, _ = ref(x.reshape(-1, x.shape[-1]))
    return ours.reshape(scores.shape), scores, f"gates of all {scores.shape[1]} experts for {scores.shape[0]} tokens"


# ------------------------------------------------------------------------------------------------ experts

def input_gated_experts(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, gates: Port,
                        o: InputGatedExpertsOptions, experts_sym: str, width: str, code: str,
                        citations: tuple[Citation, ...]) -> Component:
    """Every expert's SwiGLU on its gated input G_e·x, stored as gate_up [E, d, 2·I] (gate columns first) and
    down [E, I, d], input axis first."""
    E, I, d = ctx.sym(experts_sym), ctx.sym(width), ctx.sym("hidden_size")
    experts, inner, hidden = Dim("experts", o.experts), ctx.dim(width), ctx.dim("hidden_size")
    per_expert = Shape((B, T, experts, inner))
    steps = (Step(rf"\tilde x_e=G_e\,{x.latex}", Shape((B, T, experts, hidden)), "gated-input"),
             Step(rf"[g\,u]_e=\tilde x_e W^{{gu}}_e,\quad g_e=[g\,u]_{{e,:{inner.size}}},\ "
                  rf"u_e=[g\,u]_{{e,{inner.size}:}}",
                  Shape((B, T, experts, Dim("2·" + inner.label, 2 * ctx.size(width)))), "gate-up"),
             Step(rf"m_e={ACT_OPERATOR[o.act]}(g_e)\odot u_e", per_expert, "product"),
             Step(r"E_e=m_e W^{d}_e", Shape((B, T, experts, hidden)), "down"),
             Step(rf"y^{{\mathrm{{routed}}}}=\sum_{{e=1}}^{{{o.experts}}}E_e", x.shape, "routed-sum"))
    return Component(
        key="experts", title="Routed experts (input-gated SwiGLU)", crumb="Routed experts", kind="learned", code=code,
        description=f"{o.experts} SwiGLU experts of width {inner.size:,}, stored as one gate_up and one down tensor per "
                    "layer; each expert reads the token already multiplied by its gate, so an expert the router did "
                    "not keep (gate 0) contributes nothing.",
        inputs=(x, gates), outputs=(Port(r"y^{\mathrm{routed}}", x.shape, "routed"),),
        equations=(steps[0], steps[-1]), steps=steps,
        tensors=(_stacked(ctx, prefix + "gate_up_proj", E, d, 2 * I, ranges),
                 _stacked(ctx, prefix + "down_proj", E, I, d, ranges)),
        citations=citations, program="input_gated_experts", options=o,
        notes=("The gate multiplies the expert's input, not its output: with SiLU, E(G·x) ≠ G·E(x).",
               "Each weight is stored [experts, in, out] (input axis first), as torch.bmm reads it."),
    )


def _stacked(ctx: Ctx, name: str, E, d_in, d_out, ranges: tuple[IndexRange, ...]) -> TensorSpec:
    """All experts' weights in one tensor, [E, in, out] as torch.bmm reads it; a block-wise FP8 checkpoint stores
    it [E, out, in] (the last two axes swapped) with a scale per block, as transformers' FP8Experts holds it."""
    storage = replace(ctx.quantized, swap_last=True) if isinstance(ctx.quantized, BlockFP8) else Dense(ctx.dtype)
    return TensorSpec(name, (E, d_in, d_out), ranges, storage=storage, layout="in_out")


def expert_outputs(run: Run, o: InputGatedExpertsOptions, x: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    xe = run.rec("gated-input", G.to(x.dtype)[..., None] * x[..., None, :])                   # [B, T, E, d]
    gu = run.rec("gate-up", torch.einsum("bted,edo->bteo", xe, run.w("gate_up_proj")))
    g, u = gu.chunk(2, dim=-1)
    h = run.rec("product", activation(g, o.act) * u)
    return run.rec("down", torch.einsum("btei,eid->bted", h, run.w("down_proj")))


@program("input_gated_experts")
def run_input_gated_experts(comp: Component, run: Run, x: torch.Tensor, G: torch.Tensor) -> list[torch.Tensor]:
    E_out = expert_outputs(run, options(comp, InputGatedExpertsOptions), x, G)
    return [run.rec("routed-sum", E_out.sum(dim=2))]


@reference_call("input_gated_experts")
def call_input_gated_experts(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference experts take the tokens repeated per expert and already scaled by that expert's gate."""
    x, G = inputs
    d, E = x.shape[-1], G.shape[-1]
    tokens = x.reshape(-1, d)
    routed_in = (G.reshape(-1, E).transpose(0, 1)[..., None] * tokens[None]).reshape(-1, d)  # [E·tokens, d]
    theirs = ref(routed_in).view(E, -1, d).sum(dim=0)
    return ours.reshape(-1, d), theirs, (f"all {E} experts on inputs scaled by the same random gates (routing not used: the "
                                         "gates our program drew, handed to the reference)")


# ----------------------------------------------------------------------------------------------- the MoE

def sigmoid_moe(*, x: Port, y_latex: str, router_c: Component, experts_c: Component, shared: Component, code: str,
                citations: tuple[Citation, ...]) -> Component:
    """y = Σ_e E_e(G_e x) + shared(x)."""
    o = options(router_c, SigmoidTopKOptions)
    out = Step(rf"{y_latex}=y^{{\mathrm{{routed}}}}+y^{{\mathrm{{shared}}}}", x.shape, "moe-out")
    return Component(
        key="moe", title="Mixture of experts", crumb="Mixture of experts", kind="learned", code=code,
        description=f"Route each token to {o.k} of {o.experts} experts, gated by a sigmoid, and add a shared expert "
                    "that every token runs.",
        inputs=(x,), outputs=(Port(y_latex, x.shape, "delta_ffn"),), equations=(experts_c.steps[-1], out),
        steps=(*router_c.steps, *experts_c.steps, *prefixed(shared.steps, "shared-"), out),
        children=(router_c, experts_c, shared), citations=citations, program="sigmoid_moe")


@program("sigmoid_moe", role="Mixture of experts", routed_experts="experts")
def run_sigmoid_moe(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    router_c = comp.child("router")
    G = route(run.child(relative_module(comp, router_c)), options(router_c, SigmoidTopKOptions), x)
    routed = run_child(comp, "experts", run, x, G)
    shared = run_child(comp, "shared", run, x, prefix="shared-")
    return [run.rec("moe-out", routed + shared)]


@reference_call("sigmoid_moe")
def call_sigmoid_moe(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference MoE returns (output over flattened tokens, router logits)."""
    (x,) = inputs
    out, _ = ref(x)
    return ours.reshape(out.shape), out, ""
