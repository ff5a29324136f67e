"""Mixture of experts: routers (sigmoid scores with a correction bias and group-limited top-k as in DeepSeek-V3;
softmax top-k with or without renormalisation; a router bias), routed experts stored per expert, shared experts,
and the gated sum.

References: Switch Transformers (arXiv:2101.03961); Mixtral of Experts (arXiv:2401.04088); DeepSeek-V3 technical
report (arXiv:2412.19437) for auxiliary-loss-free balancing (the correction bias) and node-limited routing.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import sympy

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import (
    Ctx,
    Run,
    fmt_num,
    options,
    prefixed,
    program,
    reference_call,
    relative_module,
    run_child,
    worked_example,
)
from explorer.model.components.mlp import Activation, MLPOptions, activation, clamped_glu, gated_mlp
from explorer.spec.results import RoutingExample
from explorer.spec.storage import Dense
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step, TensorRole, TensorSpec


@dataclass(frozen=True, slots=True)
class RouterOptions:
    experts: int
    k: int
    scoring: Literal["sigmoid", "softmax", "sqrtsoftplus"]
    """sqrtsoftplus: ρ = √softplus(z), DeepSeek-V4's affinity."""
    norm_topk_prob: bool
    scaling: float = 1.0
    correction_bias: bool = False
    """A learned bias added to the scores for selection only (DeepSeek-V3's e_score_correction_bias)."""
    n_group: int = 1
    topk_group: int = 1
    router_bias: bool = False
    """A bias added to the router logits (gpt-oss)."""
    softmax_after_topk: bool = False
    """Take the top-k logits first, then a softmax over those k (gpt-oss)."""
    weight_name: str = "weight"
    """The router weight below the router's module: "gate.weight" where the correction bias sits beside the gate,
    in the MoE block (MiniMax-M2), so that the block is the router's module."""
    correction_bias_name: str = "e_score_correction_bias"


SCORE_LATEX = {"sigmoid": r"\rho=\sigma(z)", "softmax": r"p=\operatorname{softmax}(z)",
               "sqrtsoftplus": r"\rho=\sqrt{\operatorname{softplus}(z)}=\sqrt{\ln(1+e^{z})}"}


def score_symbol(scoring: str) -> str:
    """The router scores' symbol: p for probabilities (a softmax over the experts), ρ for affinities each expert
    gets on its own (a sigmoid or √softplus of its logit); explorer/model/notation.py gives each one meaning."""
    return "p" if scoring == "softmax" else r"\rho"


def scores(z: torch.Tensor, scoring: str) -> torch.Tensor:
    """Expert affinities from router logits."""
    if scoring == "sigmoid":
        return torch.sigmoid(z)
    if scoring == "sqrtsoftplus":
        return F.softplus(z).sqrt()
    return F.softmax(z, dim=-1)


def router(ctx: Ctx, *, weight: str, ranges: tuple[IndexRange, ...], x: Port, o: RouterOptions, code: str,
           citations: tuple[Citation, ...], bias_name: str = "e_score_correction_bias",
           experts_sym: str = "n_routed_experts", bias_role: TensorRole = "parameter",
           bias_module: str = "", bias_groups: int = 0) -> Component:
    """Score every expert, select k per token, and weight the selected experts; `experts_sym` is the config key
    that counts the experts (num_local_experts in Mixtral and gpt-oss, num_experts in Qwen3-MoE); `bias_role`: the
    correction bias as a parameter, or as the persistent buffer the reference registers it as (not trained by
    gradient, stored beside the parameters); `bias_module`: the module holding the correction bias where it is not
    the router's own (MiniMax-M2's MoE block); `bias_groups`: a leading axis of that many rows the reference stores
    the bias with (ERNIE 4.5's [1, experts]; 0: none)."""
    if bias_module:
        o = replace(o, weight_name=weight.removeprefix(bias_module), correction_bias_name=bias_name)
    E, kk = o.experts, o.k
    experts = Dim("experts", E)
    bias_latex = r"+b_r" if o.router_bias else ""
    steps = [Step(rf"z={x.latex}W_{{r}}{bias_latex}", ctx.tokens(experts), "logits")]
    if o.softmax_after_topk:
        steps += [Step(rf"E^{{\mathrm{{sel}}}}_i=\big[\,i\in\operatorname{{top}}_{{{kk}}}(z)\,\big]", ctx.tokens(experts),
                       "select"),
                  Step(r"G_i=\frac{e^{z_i}E^{\mathrm{sel}}_i}{\sum_j e^{z_j}E^{\mathrm{sel}}_j}",
                       ctx.tokens(experts), "gates")]
    else:
        steps.append(Step(SCORE_LATEX[o.scoring],
                          ctx.tokens(experts), "scores"))
        sym = score_symbol(o.scoring)
        choice = f"{sym}+b" if o.correction_bias else sym
        if o.n_group > 1:
            steps.append(Step(rf"\mathcal{{G}}=\operatorname{{top}}_{{{o.topk_group}}}\Big(\textstyle\sum_{{\text{{top 2 in "
                              rf"group}}}}({choice})\Big)\ \text{{over {o.n_group} groups of {E // o.n_group}}}", None,
                              "groups"))
            # experts outside the kept groups are set to −∞ before the top-k, as the program and the reference do
            # (a product with an indicator would differ wherever ρ + b < 0)
            steps.append(Step(rf"E^{{\mathrm{{sel}}}}_i=\big[\,i\in\operatorname{{top}}_{{{kk}}}(\chi)\,\big],\quad "
                              rf"\chi_i=\begin{{cases}}({choice})_i & \operatorname{{group}}(i)\in\mathcal{{G}}\\ -\infty & "
                              r"\text{otherwise}\end{cases}", ctx.tokens(experts), "select"))
        else:
            paren = f"({choice})" if o.correction_bias else choice
            steps.append(Step(rf"E^{{\mathrm{{sel}}}}_i=\big[\,i\in\operatorname{{top}}_{{{kk}}}{paren}\,\big]",
                              ctx.tokens(experts), "select"))
        scale = fmt_num(o.scaling) + r"\," if o.scaling != 1.0 else ""
        steps.append(Step(rf"G_{{i}}={scale}\frac{{{sym}_i\,E^{{\mathrm{{sel}}}}_i}}{{\sum_{{j}}{sym}_j\,E^{{\mathrm{{sel}}}}_j}}"
                          if o.norm_topk_prob else rf"G_{{i}}={scale}{sym}_i\,E^{{\mathrm{{sel}}}}_i", ctx.tokens(experts),
                          "gates"))
    tensors = [ctx.tensor(weight, ranges, (ctx.sym(experts_sym), ctx.sym("hidden_size")))]
    prefix = weight.removesuffix("weight")
    if o.router_bias:
        tensors.append(ctx.tensor(prefix + "bias", ranges, (ctx.sym(experts_sym),)))
    if o.correction_bias:
        shape = ((sympy.Integer(bias_groups),) if bias_groups else ()) + (ctx.sym(experts_sym),)
        tensors.append(TensorSpec((bias_module or prefix) + bias_name, shape, ranges,
                                  storage=Dense("F32"), role=bias_role))
    return Component(
        key="router", title="Router", kind="learned", code=code, description=_describe(o), inputs=(x,),
        outputs=(Port("G", ctx.tokens(experts), "gates"),), equations=tuple(steps[-2:]), steps=tuple(steps),
        tensors=tuple(tensors), citations=citations,
        notes=("The correction bias b shifts which experts are selected but not the gate values G.",)
        if o.correction_bias else (), program="router", options=o,
    )


def _describe(o: RouterOptions) -> str:
    if o.softmax_after_topk:
        return (f"Score all {o.experts} experts, keep the {o.k} highest logits per token, and weight them by a "
                "softmax over those logits.")
    groups = f", restricted to the best {o.topk_group} of {o.n_group} expert groups" if o.n_group > 1 else ""
    if o.scoring in ("sigmoid", "sqrtsoftplus"):
        by = "score plus a correction bias" if o.correction_bias else "score"
        weight = (f"their normalised scores × {fmt_num(o.scaling)}" if o.norm_topk_prob else
                  f"their scores × {fmt_num(o.scaling)}")
        what = "sigmoid" if o.scoring == "sigmoid" else "√softplus"
        return f"Score all {o.experts} experts with {what} affinities, pick {o.k} by {by}{groups}, and weight them by {weight}."
    renorm = "renormalised over the selected experts" if o.norm_topk_prob else "as they are (not renormalised)"
    return f"Score all {o.experts} experts with a softmax, pick the top {o.k} per token, and weight them by their probabilities, {renorm}."


def route(run: Run, o: RouterOptions, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gates G [B, T, E] (zero for unselected experts) and the selected indices [B, T, k]; run is the router's."""
    z = F.linear(x.float(), run.w(o.weight_name).float(), run.w("bias").float() if o.router_bias else None)
    run.rec("logits", z)
    if o.softmax_after_topk:
        top = z.topk(o.k, dim=-1)
        run.rec("select", torch.zeros_like(z).scatter(-1, top.indices, 1.0))
        gates = torch.zeros_like(z).scatter(-1, top.indices, F.softmax(top.values, dim=-1))
        return run.rec("gates", gates), top.indices
    s = run.rec("scores", scores(z, o.scoring))
    # the bias steers selection only (stored [experts], or [1, experts]: one row, broadcast over the tokens)
    choice = s + run.w(o.correction_bias_name).flatten() if o.correction_bias else s
    if o.n_group > 1:
        per_group = choice.view(*choice.shape[:-1], o.n_group, -1)
        group_scores = per_group.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores).scatter(-1, group_scores.topk(o.topk_group, dim=-1).indices, 1.0)
        run.rec("groups", keep)
        mask = keep[..., None].expand(per_group.shape).reshape(choice.shape)
        choice = choice.masked_fill(mask == 0, float("-inf"))
    picked = choice.topk(o.k, dim=-1).indices
    selected = run.rec("select", torch.zeros_like(s).scatter(-1, picked, 1.0))
    weighted = s * selected
    if o.norm_topk_prob:
        weighted = weighted / (weighted.sum(-1, keepdim=True) + 1e-20)
    return run.rec("gates", o.scaling * weighted), picked


@worked_example("router")
def routing_example(comp: Component, run: Run) -> RoutingExample:
    """The last token of the first sequence: each expert's logit (and bias, score), the selection and the gates."""
    o = options(comp, RouterOptions)
    rec = run.recorded
    t = rec["logits"].shape[1] - 1
    rows: list[tuple[str, torch.Tensor]] = []
    if o.router_bias:
        rows.append(("router bias b_r (learned, added to every token's logits)", run.w("bias")))
    rows.append(("logit z = x W_r" + (" + b_r" if o.router_bias else ""), rec["logits"][0, t]))
    if "scores" in rec:
        rows.append(({"sigmoid": "affinity ρ = σ(z)", "sqrtsoftplus": "affinity ρ = √softplus(z)"}.get(
                         o.scoring, "probability p = softmax(z) over all experts"),
                     rec["scores"][0, t]))
    if o.correction_bias:
        rows.append(("correction bias b (selection only)", run.w(o.correction_bias_name).flatten()))
    rows.append(("gate G (0 where not selected)", rec["gates"][0, t]))
    selected = tuple(int(i) for i in rec["select"][0, t].nonzero().flatten())
    return RoutingExample(f"batch 1, position {t + 1}", tuple((label, tuple(float(v) for v in values.float()))
                                                              for label, values in rows), selected)


@program("router")
def run_router(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    return [route(run, options(comp, RouterOptions), x)[0]]


class RoutingMismatch(Exception):
    """The router selected different experts from the reference: not a number to compare."""


@reference_call("router")
def call_router(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference router returns (logits, weights of the k selected, their indices)."""
    (x,) = inputs
    # tokens on one axis, as the reference MoE blocks call their routers
    args: tuple[torch.Tensor, ...] = (x.reshape(-1, x.shape[-1]),)
    if "e_score_correction_bias" in inspect.signature(ref.forward).parameters:  # MiniMax-M2: the block hands it over
        args += (model.get_submodule(comp.reference.rsplit(".", 1)[0]).e_score_correction_bias,)
    out = ref(*args)
    their_weights, their_idx = out[-2], out[-1]
    ours_sel = run.recorded["select"].reshape(-1, run.recorded["select"].shape[-1])
    their_sel = torch.zeros_like(ours_sel).scatter(-1, their_idx.reshape(ours_sel.shape[0], -1), 1.0)
    if not torch.equal(ours_sel, their_sel):
        raise RoutingMismatch(f"step 'select' selects different experts from transformers' {type(ref).__name__}")
    gates = torch.zeros_like(ours_sel).scatter(-1, their_idx.reshape(ours_sel.shape[0], -1),
                                               their_weights.reshape(ours_sel.shape[0], -1).float())
    k = their_idx.shape[-1]
    return ours.reshape(gates.shape), gates, f"same {k} of {ours_sel.shape[1]} experts selected for all {ours_sel.shape[0]} tokens"


# ----------------------------------------------------------------------------------------------- the MoE

@dataclass(frozen=True, slots=True)
class MoEOptions:
    act: Activation
    shared: bool
    routed_scaling: float = 1.0
    """The routed experts' sum is multiplied by this before the shared expert's output is added (MiniMax-M3's
    routed_scaling_factor, applied in the MoE block, not by the router)."""
    clamped: bool = False
    """The experts are clamped SwiGLUs (their MLPOptions' limit): their steps are clamp, glu and product."""


def routed_experts(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, experts: int, k: int,
                   code: str, citations: tuple[Citation, ...], names: tuple[str, str, str] = (
                       "gate_proj", "up_proj", "down_proj"), act: Activation = "silu",
                   experts_sym: str = "n_routed_experts", width: str = "moe_intermediate_size",
                   clamp: MLPOptions | None = None) -> Component:
    """One routed SwiGLU expert of width `width` (a config key), repeated `experts` times, stored per expert; `clamp`:
    the clamped SwiGLU's limit, gain and up shift (MiniMax-M3's SwiGLU-OAI experts)."""
    expert_ranges = ranges + (IndexRange("expert", tuple(range(experts))),)
    o = clamp or MLPOptions(act)
    e = gated_mlp(ctx, "expert", "Routed expert", "Routed expert", prefix=prefix + "{expert}.", ranges=expert_ranges,
                  d_ff=ctx.sym(width), ff_dim=ctx.dim(width), x=x, limit=o.limit, alpha=o.alpha, up_shift=o.up_shift,
                  y=Port("E_i", x.shape, "expert_out"), names=names, act=act, sub="i",
                  description=f"One of {experts} SwiGLU experts of width {ctx.size(width):,}; each "
                              f"token runs {k} of them.", code=code, citations=citations)
    return replace(e, repeat=experts, repeat_label="routed experts", repeat_formula=experts_sym,
                   row_label="Routed experts")


def shared_expert(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, d_shared: sympy.Expr,
                  code: str, citations: tuple[Citation, ...]) -> Component:
    width = ctx.size(d_shared)
    return gated_mlp(ctx, "shared", "Shared expert", "Shared expert", prefix=prefix, ranges=ranges, d_ff=d_shared,
                     ff_dim=Dim("d_shared", width), x=x, y=Port(r"y^{\mathrm{shared}}", x.shape, "shared_out"),
                     sub=r"\mathrm{sh}",
                     description=f"A SwiGLU MLP of width {width:,} that every token runs.", code=code,
                     citations=citations)


def moe(ctx: Ctx, *, x: Port, y_latex: str, router_c: Component, expert: Component, shared: Component | None,
        code: str, citations: tuple[Citation, ...], routed_scaling: float = 1.0) -> Component:
    """Route each token to k experts and sum their gated outputs (times routed_scaling), plus the shared experts'."""
    E, kk = expert.repeat, options(router_c, RouterOptions).k
    scale = fmt_num(routed_scaling) + r"\," if routed_scaling != 1.0 else ""
    steps = [*router_c.steps, *prefixed(expert.steps, "expert-"),
             Step(rf"y^{{\mathrm{{routed}}}}={scale}\sum_{{i=1}}^{{{E}}}G_i\,E_i", x.shape, "routed-sum")]
    if shared is not None:
        steps += [*prefixed(shared.steps, "shared-"),
                  Step(rf"{y_latex}=y^{{\mathrm{{routed}}}}+y^{{\mathrm{{shared}}}}", x.shape, "moe-out")]
    else:
        steps.append(Step(rf"{y_latex}=y^{{\mathrm{{routed}}}}", x.shape, "moe-out"))
    n_shared = " and add one shared expert" if shared is not None else ""
    return Component(
        key="moe", title="Mixture of experts", crumb="Mixture of experts", kind="learned", code=code,
        description=f"Route each token to {kk} of {E} experts{n_shared}.",
        inputs=(x,), outputs=(Port(y_latex, x.shape, "delta_ffn"),),
        equations=tuple(s for s in steps if s.name in ("routed-sum", "moe-out")), steps=tuple(steps),
        children=(router_c, expert) + ((shared,) if shared is not None else ()), citations=citations, program="moe",
        options=MoEOptions(options(expert, MLPOptions).act, shared is not None, routed_scaling,
                           options(expert, MLPOptions).limit is not None),
    )


@program("moe", role="Mixture of experts", routed_experts="expert", layout="routed-experts",
         ffn_heading="Mixture of experts:")
def run_moe(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, MoEOptions)
    router_c, expert = comp.child("router"), comp.child("expert")
    G, _ = route(run.child(relative_module(comp, router_c)), options(router_c, RouterOptions), x)
    stacked = relative_module(comp, expert).replace("{expert}.", "")
    W1, W3, W2 = (run.w(f"{stacked}{c.key}.weight") for c in expert.children)       # [E, ...]
    ex = run.child(prefix="expert-")
    g = torch.einsum("btd,eid->ebti", x, W1)
    u = torch.einsum("btd,eid->ebti", x, W3)
    ex.rec(expert.children[0].key, g[0]), ex.rec(expert.children[1].key, u[0])
    eo = options(expert, MLPOptions)
    if eo.limit is not None:  # the clamped SwiGLU, recorded as the expert's own steps
        h = clamped_glu(g, u, eo.limit, eo.alpha, eo.up_shift, rec=lambda name, t: (ex.rec(name, t[0]), t)[1])
    else:
        a = activation(g, o.act)
        h = a * u
        ex.rec("silu" if o.act == "silu" else "gelu", a[0]), ex.rec("product", h[0])
    E_out = torch.einsum("ebti,edi->ebtd", h, W2)                                       # [E, B, T, d]
    ex.rec(expert.children[2].key, E_out[0])
    y = run.rec("routed-sum", o.routed_scaling * torch.einsum("bte,ebtd->btd", G.to(E_out.dtype), E_out))
    if o.shared:
        y = y + run_child(comp, "shared", run, x, prefix="shared-")
    return [run.rec("moe-out", y)]


# ------------------------------------------------------------------------ the steps' formulas, tied to route()

CANONICAL_ROUTERS = {
    "grouped": RouterOptions(8, 2, "sigmoid", True, 2.5, correction_bias=True, n_group=4, topk_group=2),
    "softmax": RouterOptions(8, 2, "softmax", True),
    "softmax-unnormalised": RouterOptions(8, 2, "softmax", False),
    "after-topk": RouterOptions(8, 2, "softmax", False, router_bias=True, softmax_after_topk=True),
}
"""Options that take every branch of route() once."""

STEP_FINGERPRINTS = {
    "grouped.logits": "002728efa9832e51",
    "grouped.scores": "b5c66091fe1f977f",
    "grouped.groups": "697152825be96f96",
    "grouped.select": "2adf1258ffd18481",
    "grouped.gates": "22899214f52bc2fd",
    "softmax.logits": "002728efa9832e51",
    "softmax.scores": "99709be4ce27fc56",
    "softmax.select": "ecc359285dd89384",
    "softmax.gates": "ee6ff4a8e4c66bb1",
    "softmax-unnormalised.logits": "002728efa9832e51",
    "softmax-unnormalised.scores": "99709be4ce27fc56",
    "softmax-unnormalised.select": "ecc359285dd89384",
    "softmax-unnormalised.gates": "042cb337467e2024",
    "after-topk.logits": "13e4d7b6e7a85400",
    "after-topk.select": "5af5e0e1018ecd8d",
    "after-topk.gates": "cb07c13e829db8e3",
    "routed-sum": "ce4401fb65e62631",
}
"""sha256 (first 16 hex digits) of each router step's and the routed sum's LaTeX on CANONICAL_ROUTERS: route()
and run_moe() compute what these formulas say, so a formula edited without its program (or a program without its
formula) also changes this table, beside the program; tests/test_truth.py recomputes it."""


def canonical_steps() -> dict[str, str]:
    """The router's steps on each of CANONICAL_ROUTERS and the MoE's routed sum, by "variant.step" name."""
    from explorer.model.components.base import Reference

    ctx = Ctx({"hidden_size": 8, "n_routed_experts": 8, "moe_intermediate_size": 4},
              {"hidden_size": "d", "n_routed_experts": "experts", "moe_intermediate_size": "d_expert"},
              Reference("", ""), "BF16")
    x = Port("x", ctx.tokens("hidden_size"), "x")
    out: dict[str, str] = {}
    for variant, o in CANONICAL_ROUTERS.items():
        r = router(ctx, weight="gate.weight", ranges=(), x=x, o=o, code="", citations=())
        out.update({f"{variant}.{s.name}": s.latex for s in r.steps})
    expert = routed_experts(ctx, prefix="experts.", ranges=(), x=x, experts=8, k=2, code="", citations=())
    m = moe(ctx, x=x, y_latex="y", router_c=r, expert=expert, shared=None, code="", citations=())
    out["routed-sum"] = next(s.latex for s in m.steps if s.name == "routed-sum")
    return out


def fingerprint(latex: str) -> str:
    import hashlib

    return hashlib.sha256(latex.encode()).hexdigest()[:16]
