"""Hash routing (DeepSeek-V4's first num_hash_layers MoE layers): which experts a token runs is a fixed lookup of
its token id in a stored table (tid2eid, vocab × k), not a learned top-k; the learned router still scores every
expert, and the scores of the looked-up experts, renormalised and scaled, weight their outputs. And the MoE that
DeepSeek-V4 builds around either router: fused clamped-SwiGLU experts plus a clamped shared expert.

References: "Hash Layers For Large Sparse Models" (arXiv:2106.04426); DeepSeek-V4 technical report, section 2.1;
transformers' models/deepseek_v4/modeling_deepseek_v4.py (DeepseekV4HashRouter, DeepseekV4SparseMoeBlock).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components import moe as moe_lib
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
from explorer.model.components.moe import (
    SCORE_LATEX,
    RouterOptions,
    RoutingMismatch,
    routing_example,
    score_symbol,
    scores,
)
from explorer.spec.storage import Dense
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step, TensorSpec


def hash_router(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, ids: Port, o: RouterOptions,
                code: str, citations: tuple[Citation, ...]) -> Component:
    """Learned scores, table-chosen experts: tensors `prefix`weight [experts, d] and the buffer `prefix`tid2eid
    [vocab, k]."""
    E, kk = o.experts, o.k
    experts = Dim("experts", E)
    scale = fmt_num(o.scaling) + r"\," if o.scaling != 1.0 else ""
    sym = score_symbol(o.scoring)
    steps = (
        Step(rf"z={x.latex}W_{{r}}", ctx.tokens(experts), "logits"),
        Step(SCORE_LATEX[o.scoring], ctx.tokens(experts), "scores"),
        Step(rf"E^{{\mathrm{{sel}}}}_i=\big[\,i\in\mathrm{{tid2eid}}[{ids.latex}]\,\big]\ \ ({kk}\text{{ experts per "
             r"token id})", ctx.tokens(experts), "select"),
        Step(rf"G_{{i}}={scale}\frac{{{sym}_i\,E^{{\mathrm{{sel}}}}_i}}{{\sum_{{j}}{sym}_j\,E^{{\mathrm{{sel}}}}_j}}",
             ctx.tokens(experts), "gates"),
    )
    tensors = (ctx.tensor(prefix + "weight", ranges, (ctx.sym("n_routed_experts"), ctx.sym("hidden_size"))),
               TensorSpec(prefix + "tid2eid", (ctx.sym("vocab_size"), ctx.sym("num_experts_per_tok")), ranges,
                          role="buffer", storage=Dense("I64")))
    return Component(
        key="router", title="Hash router", kind="learned", code=code,
        description=f"Run the {kk} experts a fixed table assigns to the token's id; weight them by their learned "
                    f"{'√softplus' if o.scoring == 'sqrtsoftplus' else o.scoring} scores, renormalised over the "
                    f"{kk} and × {fmt_num(o.scaling)}.",
        inputs=(x, ids), outputs=(Port("G", ctx.tokens(experts), "gates"),), equations=steps[-2:], steps=steps,
        tensors=tensors, citations=citations, program="hash_router", options=o,
        notes=("tid2eid is a stored buffer (vocab_size × num_experts_per_tok expert ids), not a trained parameter: "
               "it is listed beside the parameters, not counted among them.",),
    )


def hash_route(run: Run, o: RouterOptions, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gates G [B, T, E] and the looked-up experts [B, T, k]; run is the router's."""
    z = run.rec("logits", F.linear(x.float(), run.w("weight").float()))
    s = run.rec("scores", scores(z, o.scoring))
    picked = run.w("tid2eid")[ids].long()
    selected = run.rec("select", torch.zeros_like(s).scatter(-1, picked, 1.0))
    weighted = s * selected
    return run.rec("gates", o.scaling * weighted / (weighted.sum(-1, keepdim=True) + 1e-20)), picked


@program("hash_router", hashed_router=True)
def run_hash_router(comp: Component, run: Run, x: torch.Tensor, ids: torch.Tensor) -> list[torch.Tensor]:
    return [hash_route(run, options(comp, RouterOptions), x, ids)[0]]


worked_example("hash_router")(routing_example)


@reference_call("hash_router")
def call_hash_router(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference hash router takes the hidden states and the token ids; returns (logits, weights, indices)."""
    x, ids = inputs
    _, weights, idx = ref(x.reshape(-1, x.shape[-1]), ids)
    flat = ours.reshape(-1, ours.shape[-1])
    chosen = torch.zeros_like(flat).scatter(-1, idx, 1.0)
    if not torch.equal(chosen, run.recorded["select"].reshape(flat.shape)):
        raise RoutingMismatch(f"step 'select' looks up different experts from transformers' {type(ref).__name__}")
    gates = torch.zeros_like(flat).scatter(-1, idx, weights.float())
    return flat, gates, f"the table's {idx.shape[-1]} experts for all {flat.shape[0]} tokens"


# ----------------------------------------------------------------------------------------------- the MoE

def shared_and_routed_moe(*, x: Port, ids: Port, y_latex: str, router_c: Component, experts_c: Component,
                          shared: Component, code: str, citations: tuple[Citation, ...]) -> Component:
    """Route each token to k fused experts (by score or by table) and add the shared expert."""
    E, kk = options(router_c, RouterOptions).experts, options(router_c, RouterOptions).k
    out = Step(rf"{y_latex}=y^{{\mathrm{{routed}}}}+y^{{\mathrm{{shared}}}}", x.shape, "moe-out")
    how = "looked up by token id" if router_c.program == "hash_router" else "chosen by score"
    return Component(
        key="moe", title="Mixture of experts", crumb="Mixture of experts", kind="learned", code=code,
        description=f"Route each token to {kk} of {E} experts ({how}) and add one shared expert.",
        # Only a table router reads the token ids: a score-routed MoE takes x alone.
        inputs=(x, ids) if router_c.program == "hash_router" else (x,),
        outputs=(Port(y_latex, x.shape, "delta_ffn"),), equations=(experts_c.steps[-1], out),
        steps=(*router_c.steps, *experts_c.steps, *prefixed(shared.steps, "shared-"), out),
        children=(router_c, experts_c, shared), citations=citations, program="shared_and_routed_moe")


def gates_of(comp: Component, run: Run, x: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    router_c = comp.child("router")
    sub = run.child(relative_module(comp, router_c))
    o = options(router_c, RouterOptions)
    if router_c.program != "hash_router":
        return moe_lib.route(sub, o, x)[0]
    if ids is None:  # the port is declared wherever the router is a table: only a caller that skipped it gets here
        raise ValueError(f"{comp.key}: a hash-routed MoE needs the token ids")
    return hash_route(sub, o, x, ids)[0]


@program("shared_and_routed_moe", role="Mixture of experts", routed_experts="experts",
         layout="shared-and-routed-experts")
def run_shared_and_routed_moe(comp: Component, run: Run, x: torch.Tensor, *ids: torch.Tensor) -> list[torch.Tensor]:
    """ids: the token ids, which a block passes every MoE and only a table router reads."""
    routed = run_child(comp, "experts", run, x, gates_of(comp, run, x, ids[0] if ids else None))
    return [run.rec("moe-out", routed + run_child(comp, "shared", run, x, prefix="shared-"))]


@reference_call("shared_and_routed_moe")
def call_shared_and_routed_moe(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    x, ids = inputs[0], (inputs[1] if len(inputs) > 1 else None)  # a score-routed block ignores input_ids
    return ours, ref(x, input_ids=ids), "routed experts plus the shared expert"
