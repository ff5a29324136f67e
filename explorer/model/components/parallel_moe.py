"""A mixture of experts running beside a dense MLP (Gemma 4 26B-A4B): every token runs the dense MLP and its routed
experts in parallel from the same residual stream, each branch with its own pre- and post-norm, and the block adds
their sum. The router normalises the stream itself (RMS, a learned per-feature scale, d^-1/2), takes a softmax over
all experts, keeps the top k, renormalises them and multiplies each by a learned per-expert scale; the experts are
stored fused, gate and up as the two halves of one projection. The same fused experts serve the families whose
checkpoints store them so without the dense branch (Step-3.7-Flash; Qwen3-VL-MoE, input axis first).

References: Gemma 4 model card (Google DeepMind, 2026); transformers' models/gemma4/modeling_gemma4.py
(Gemma4TextRouter, Gemma4TextExperts, Gemma4TextDecoderLayer), the reference binding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components import moe as moe_lib
from explorer.model.components.base import (
    B,
    Ctx,
    Run,
    T,
    fmt_eps,
    options,
    prefixed,
    program,
    reference_call,
    relative_module,
    run_child,
)
from explorer.model.components.l2_qk_norm import unit_rms
from explorer.model.components.mlp import ACT_OPERATOR, Activation, activation
from explorer.model.components.norms import NormOptions, apply_norm
from explorer.spec.storage import BlockFP8, Dense
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step, TensorSpec


@dataclass(frozen=True, slots=True)
class ScaledRouterOptions:
    experts: int
    k: int
    eps: float


@dataclass(frozen=True, slots=True)
class HalvesExpertsOptions:
    experts: int
    act: Activation = "gelu_tanh"
    in_out: bool = False
    """Each weight is stored [experts, in, out], input axis first (Qwen3-VL-MoE's checkpoint: gate_up [E, d, 2·I],
    down [E, I, d], which transformers transposes on loading); False: [experts, out, in], as transformers holds it."""


GLU_NAMES: dict[Activation, str] = {"silu": "SwiGLU", "gelu_tanh": "GeGLU", "gelu": "GeGLU"}


def scaled_router(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: ScaledRouterOptions,
                  experts_sym: str, citations: tuple[Citation, ...]) -> Component:
    """r = RMS(x) ⊙ s · d^-1/2; p = softmax(r W_r); the top k of p renormalised, times a per-expert scale."""
    experts, d = Dim("experts", o.experts), ctx.size("hidden_size")
    steps = (Step(rf"x_{{\mathrm{{route}}}}=\frac{{{x.latex}}}{{\sqrt{{\operatorname{{mean}}({x.latex}^2)+{fmt_eps(o.eps)}}}}}\odot "
                  rf"s_{{\mathrm{{r}}}}\cdot {d}^{{-1/2}}", x.shape, "router-norm"),
             Step(r"z=x_{\mathrm{route}}\,W_{r}", ctx.tokens(experts), "logits"),
             Step(r"p=\operatorname{softmax}(z)", ctx.tokens(experts), "scores"),
             Step(rf"E^{{\mathrm{{sel}}}}_i=\big[\,i\in\operatorname{{top}}_{{{o.k}}}(p)\,\big]", ctx.tokens(experts),
                  "select"),
             Step(r"G_i=\frac{p_i\,E^{\mathrm{sel}}_i}{\sum_j p_j\,E^{\mathrm{sel}}_j}\,s^{E}_i", ctx.tokens(experts),
                  "gates"))
    E, D = ctx.sym(experts_sym), ctx.sym("hidden_size")
    return Component(
        key="router", title="Router (scaled, softmax top-k)", kind="learned", code="Gemma4TextRouter(config)",
        description=f"Normalise the residual stream, score all {o.experts} experts with a softmax, keep the top "
                    f"{o.k}, renormalise them and multiply each by its learned per-expert scale.",
        inputs=(x,), outputs=(Port("G", ctx.tokens(experts), "gates"),), equations=steps[-2:], steps=steps,
        tensors=(ctx.tensor(prefix + "scale", ranges, (D,)), ctx.tensor(prefix + "per_expert_scale", ranges, (E,)),
                 ctx.tensor(prefix + "proj.weight", ranges, (E, D), quantize=True)),  # an nn.Linear
        citations=citations, program="scaled_router", options=o,
        notes=("The router reads the residual stream before either branch's pre-norm and normalises it itself "
               "(an RMS without gain, then its own scale s_r).",),
    )


def route(run: Run, o: ScaledRouterOptions, x: torch.Tensor) -> torch.Tensor:
    r = run.rec("router-norm", unit_rms(x, o.eps) * run.w("scale") * x.shape[-1] ** -0.5)
    z = run.rec("logits", F.linear(r, run.w("proj.weight")))
    p = run.rec("scores", F.softmax(z, dim=-1, dtype=torch.float32))
    picked = p.topk(o.k, dim=-1).indices
    selected = run.rec("select", torch.zeros_like(p).scatter(-1, picked, 1.0))
    kept = p * selected
    return run.rec("gates", kept / kept.sum(-1, keepdim=True) * run.w("per_expert_scale").float())


@program("scaled_router", role="Mixture of experts")
def run_scaled_router(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    return [route(run, options(comp, ScaledRouterOptions), x)]


reference_call("scaled_router")(moe_lib.call_router)  # the reference returns (probabilities, weights, indices)


# ------------------------------------------------------------------------------------------------ experts

def halves_experts(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, gates: Port,
                   o: HalvesExpertsOptions, experts_sym: str, width: str, code: str,
                   citations: tuple[Citation, ...]) -> Component:
    """Σ_e G_e · down_e(act(g_e) ⊙ u_e), with gate_up [E, 2·I, d] (gate rows first, then up) and down [E, d, I], or
    their transposes [E, d, 2·I] and [E, I, d] where the checkpoint stores the input axis first (o.in_out)."""
    E, I, d = ctx.sym(experts_sym), ctx.sym(width), ctx.sym("hidden_size")
    experts, inner, hidden = Dim("experts", o.experts), ctx.dim(width), ctx.dim("hidden_size")
    per_expert = Shape((B, T, experts, inner))
    steps = (Step(rf"[g\,u]_e={x.latex}W^{{gu}}_e,\quad g_e=[g\,u]_{{e,:{inner.size}}},\ "
                  rf"u_e=[g\,u]_{{e,{inner.size}:}}",
                  Shape((B, T, experts, Dim("2·" + inner.label, 2 * ctx.size(width)))), "gate-up"),
             Step(rf"m_e={ACT_OPERATOR[o.act]}(g_e)\odot u_e", per_expert, "product"),
             Step(r"E_e=m_e W^{d}_e", Shape((B, T, experts, hidden)), "down"),
             Step(rf"y^{{\mathrm{{routed}}}}=\sum_{{e=1}}^{{{o.experts}}}G_e\,E_e", x.shape, "routed-sum"))
    glu = GLU_NAMES[o.act]
    notes: tuple[str, ...] = ()
    if o.in_out:
        halves = "gate columns first, then up columns"
        notes = (
            "Each weight is stored [experts, in, out], input axis first: gate_up_proj [experts, hidden_size, 2 × "
            f"{width}] and down_proj [experts, {width}, hidden_size]; transformers holds the transposes and its "
            "loader transposes the stored tensors to them.",)
        tensors = (_in_out(ctx, prefix + "gate_up_proj", (E, d, 2 * I), ranges),
                   _in_out(ctx, prefix + "down_proj", (E, I, d), ranges))
    else:
        storage = ctx.quantized if isinstance(ctx.quantized, BlockFP8) else Dense(ctx.dtype)  # as FP8Experts holds them
        halves = "gate rows first, then up rows"
        tensors = (TensorSpec(prefix + "gate_up_proj", (E, 2 * I, d), ranges, storage=storage),
                   TensorSpec(prefix + "down_proj", (E, d, I), ranges, storage=storage))
    return Component(
        key="experts", title=f"Routed experts (fused {glu})", crumb="Routed experts", kind="learned", code=code,
        description=f"{o.experts} {glu} experts of width {inner.size:,}, stored as one gate_up and one down tensor per "
                    f"layer ({halves}).",
        inputs=(x, gates), outputs=(Port(r"y^{\mathrm{routed}}", x.shape, "routed"),),
        equations=steps[-1:], steps=steps, tensors=tensors, citations=citations, program="halves_experts", options=o,
        notes=notes,
    )


def _in_out(ctx: Ctx, name: str, shape: tuple, ranges: tuple[IndexRange, ...]) -> TensorSpec:
    """All experts' weights in one tensor stored [E, in, out]; a block-wise FP8 checkpoint stores it [E, out, in]
    (the last two axes swapped) with a scale per block, as transformers' FP8Experts holds it."""
    storage = replace(ctx.quantized, swap_last=True) if isinstance(ctx.quantized, BlockFP8) else Dense(ctx.dtype)
    return TensorSpec(name, shape, ranges, storage=storage, layout="in_out")


def gate_up_halves(o: HalvesExpertsOptions, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every expert's gate and up values [B, T, E, I] from the stored gate_up weight: the first half of its outputs
    are the gates, the second half the up values."""
    gu = torch.einsum("btd,edo->bteo" if o.in_out else "btd,eod->bteo", x, w)
    g, u = gu.chunk(2, dim=-1)
    return g, u


def down_projection(o: HalvesExpertsOptions, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Every expert's output [B, T, E, d] from its hidden values and the stored down weight."""
    return torch.einsum("btei,eid->bted" if o.in_out else "btei,edi->bted", h, w)


@program("halves_experts", role="Mixture of experts")
def run_halves_experts(comp: Component, run: Run, x: torch.Tensor, G: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, HalvesExpertsOptions)
    g, u = gate_up_halves(o, x, run.w("gate_up_proj"))
    run.rec("gate-up", torch.cat((g, u), dim=-1))
    h = run.rec("product", activation(g, o.act) * u)
    E_out = run.rec("down", down_projection(o, h, run.w("down_proj")))
    return [run.rec("routed-sum", torch.einsum("bte,bted->btd", G.to(E_out.dtype), E_out))]


@reference_call("halves_experts")
def call_halves_experts(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference experts take each token's expert indices and weights: here every expert, weighted by G."""
    x, G = inputs
    tokens, E = x.shape[0] * x.shape[1], G.shape[-1]
    theirs = ref(x.reshape(tokens, -1), torch.arange(E).expand(tokens, E), G.reshape(tokens, E))
    return ours.reshape(tokens, -1), theirs, (f"all {E} experts weighted by the same random gates, {tokens} tokens "
                                              "(routing not used: the gates our program drew, handed to the reference)")


# -------------------------------------------------------------------------------------- the two branches

def moe_beside_mlp(ctx: Ctx, *, x_ffn: Port, x_mid: Port, y: Port, mlp: Component, post_mlp_norm: Component,
                   router_c: Component, pre_moe_norm: Component, experts_c: Component, post_moe_norm: Component,
                   citations: tuple[Citation, ...]) -> Component:
    """Δ = Norm₁(MLP(x_ffn)) + Norm₂(experts(Norm₀(x'), router(x'))): both branches from the same stream x'."""
    dense_out, moe_out = post_mlp_norm.outputs[0].latex, post_moe_norm.outputs[0].latex
    steps = (*mlp.steps, post_mlp_norm.equations[0], pre_moe_norm.equations[0], *prefixed(router_c.steps, "router-"),
             *prefixed(experts_c.steps, "expert-"), post_moe_norm.equations[0],
             Step(rf"{y.latex}={dense_out}+{moe_out}", y.shape, "branches-sum"))
    o = options(router_c, ScaledRouterOptions)
    return Component(
        key="ffn", title="Dense MLP and mixture of experts, side by side", crumb="MLP + MoE", kind="learned",
        code="Gemma4TextDecoderLayer.forward (mlp, router, experts)",
        description=f"Every token runs the dense GeGLU MLP and, in parallel from the same residual stream, {o.k} of "
                    f"{o.experts} routed experts; each branch has its own norms and the two outputs are added.",
        inputs=(x_ffn, x_mid), outputs=(y,), equations=steps[-1:], steps=steps,
        children=(mlp, post_mlp_norm, pre_moe_norm, router_c, experts_c, post_moe_norm), citations=citations,
        program="moe_beside_mlp", reference="-",
    )


def _norm(comp: Component, key: str, run: Run, x: torch.Tensor) -> torch.Tensor:
    child = comp.child(key)
    return apply_norm(run, child.steps[0].name, x, options(child, NormOptions), relative_module(comp, child))


@program("moe_beside_mlp", beside_dense_mlp=True, routed_experts="experts")
def run_moe_beside_mlp(comp: Component, run: Run, x_ffn: torch.Tensor, x_mid: torch.Tensor) -> list[torch.Tensor]:
    mlp_c = comp.children[0]
    dense = _norm(comp, comp.children[1].key, run, run_child(comp, mlp_c.key, run, x_ffn))
    routed_in = _norm(comp, comp.children[2].key, run, x_mid)
    router_c = comp.child("router")
    G = route(run.child(relative_module(comp, router_c), "router-"), options(router_c, ScaledRouterOptions), x_mid)
    routed = run_child(comp, "experts", run, routed_in, G, prefix="expert-")
    moe_out = _norm(comp, comp.children[5].key, run, routed)
    return [run.rec("branches-sum", dense + moe_out)]
