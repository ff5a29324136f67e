"""Manifold-constrained hyper-connections (DeepSeek-V4): the residual stream widened to hc_mult parallel streams.
Before each branch (attention, FFN) a small projection of the normalised streams gives three sets of weights:
`pre` collapses the streams into the branch input, `post` spreads the branch output back over the streams, and
`comb`, an hc_mult × hc_mult matrix pushed towards doubly stochastic by Sinkhorn iterations, mixes the old streams
into the new ones. At the end of the stack a head collapses the streams once more with its own `pre` weights.

References: "Hyper-Connections" (arXiv:2409.19606); "mHC: Manifold-Constrained Hyper-Connections" (Xie et al.,
2026) as cited by the DeepSeek-V4 report; transformers' models/deepseek_v4/modeling_deepseek_v4.py
(DeepseekV4HyperConnection, DeepseekV4HyperHead, DeepseekV4DecoderLayer) for the reference modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import B, Ctx, Run, T, fmt_eps, options, program, reference_call
from explorer.spec.storage import Dense
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step, TensorSpec


@dataclass(frozen=True, slots=True)
class HyperOptions:
    streams: int
    """hc_mult: parallel residual streams."""
    sinkhorn_iters: int
    """hc_sinkhorn_iters: one column normalisation, then this many minus one row-and-column rounds."""
    eps: float
    """hc_eps: added to pre and comb, and to every Sinkhorn denominator."""
    norm_eps: float
    """rms_norm_eps of the weightless RMSNorm over the flattened streams."""


def streams_shape(ctx: Ctx, n: int) -> Shape:
    """[B batch, T positions, n streams, d]."""
    return ctx.tokens(Dim("streams", n), "hidden_size")


def _norm_step(o: HyperOptions, ctx: Ctx, X: str) -> Step:
    flat = Dim("streams·d", o.streams * ctx.size("hidden_size"))
    return Step(rf"\hat X=\frac{{\operatorname{{flat}}({X})}}{{\sqrt{{\operatorname{{mean}}(\operatorname{{flat}}({X})^2)"
                rf"+{fmt_eps(o.norm_eps)}}}}}", ctx.tokens(flat), "hc-norm")


def hyper_connection(ctx: Ctx, key: str, title: str, *, prefix: str, ranges: tuple[IndexRange, ...], X: Port,
                     o: HyperOptions, branch: str, citations: tuple[Citation, ...]) -> Component:
    """The weights one branch (attention or FFN) mixes the streams with, and its collapsed input; tensors
    `prefix`fn [(2+n)n, n·d], base [(2+n)n], scale [3]."""
    n, N, d = o.streams, ctx.sym("hc_mult"), ctx.sym("hidden_size")
    streams, pair = Dim("streams", n), Dim("streams", n)
    coeffs = Dim("(2+streams)·streams", (2 + n) * n)
    x_out = Port(rf"\bar x_{{\mathrm{{{branch}}}}}", ctx.tokens("hidden_size"), "collapsed")
    eps = fmt_eps(o.eps)
    steps = (
        _norm_step(o, ctx, X.latex),
        Step(r"[a^{\mathrm{pre}};a^{\mathrm{post}};a^{\mathrm{res}}]=\hat X\,W_{\mathrm{hc}}^{\top}", ctx.tokens(coeffs),
             "hc-proj"),
        Step(rf"\pi^{{\mathrm{{pre}}}}=\sigma(\zeta_1a^{{\mathrm{{pre}}}}+b^{{\mathrm{{pre}}}})+{eps}", ctx.tokens(streams),
             "hc-pre"),
        Step(r"\pi^{\mathrm{post}}=2\,\sigma(\zeta_2a^{\mathrm{post}}+b^{\mathrm{post}})", ctx.tokens(streams), "hc-post"),
        Step(rf"P^{{(0)}}=\operatorname{{softmax}}_{{\mathrm{{row}}}}(\zeta_3a^{{\mathrm{{res}}}}+B^{{\mathrm{{res}}}})+{eps}",
             ctx.tokens(streams, pair), "hc-comb"),
        Step(rf"P\leftarrow P/(\mathbf{{1}}^{{\top}}P+{eps})\ \text{{then {o.sinkhorn_iters - 1}}}\times\ "
             rf"\big(P\leftarrow P/(P\mathbf{{1}}+{eps}),\ P\leftarrow P/(\mathbf{{1}}^{{\top}}P+{eps})\big)",
             ctx.tokens(streams, pair), "hc-sinkhorn"),
        Step(rf"{x_out.latex}=\textstyle\sum_{{i=1}}^{{{n}}}\pi^{{\mathrm{{pre}}}}_i\,{{{X.latex}}}_{{,i}}", x_out.shape,
             "hc-collapse"),
    )
    tensors = (TensorSpec(prefix + "fn", ((2 + N) * N, N * d), ranges, storage=Dense("F32")),
               TensorSpec(prefix + "base", ((2 + N) * N,), ranges, storage=Dense("F32")),
               TensorSpec(prefix + "scale", (sympy.Integer(3),), ranges, storage=Dense("F32")))
    return Component(
        key=key, title=title, kind="learned", code="DeepseekV4HyperConnection(config)",
        description=f"From the {n} residual streams, compute the weights that collapse them into the {branch} "
                    f"input, spread its output back, and mix the streams ({o.sinkhorn_iters} Sinkhorn "
                    "normalisations towards a doubly stochastic matrix).",
        inputs=(X,), outputs=(x_out, Port(r"\pi^{\mathrm{post}}", ctx.tokens(streams), "post"),
                              Port("P", ctx.tokens(streams, pair), "comb")),
        equations=(steps[5], steps[6]), steps=steps, tensors=tensors, citations=citations,
        program="hyper_connection", options=o,
        notes=("The projection, its bias and its three scales are kept in float32 (the reference lists the "
               "hyper-connection modules as strictly float32).",
               "P is applied transposed: stream j of the new residual is Σ_i P_ij · stream i of the old one."),
    )


def flat_norm(run: Run, X: torch.Tensor, eps: float) -> torch.Tensor:
    flat = X.reshape(*X.shape[:2], -1).float()
    return run.rec("hc-norm", flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps))


def sinkhorn(P: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """One column normalisation, then iters − 1 rounds of rows then columns."""
    P = P / (P.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        P = P / (P.sum(dim=-1, keepdim=True) + eps)
        P = P / (P.sum(dim=-2, keepdim=True) + eps)
    return P


def mixing_weights(run: Run, o: HyperOptions, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre, post, comb) for streams X [B, T, n, d]; run is the hyper-connection's."""
    n = o.streams
    a = run.rec("hc-proj", flat_norm(run, X, o.norm_eps) @ run.w("fn").float().T)
    a_pre, a_post, a_res = a.split([n, n, n * n], dim=-1)
    b_pre, b_post, b_res = run.w("base").float().split([n, n, n * n])
    s = run.w("scale").float()
    pre = run.rec("hc-pre", torch.sigmoid(s[0] * a_pre + b_pre) + o.eps)
    post = run.rec("hc-post", 2 * torch.sigmoid(s[1] * a_post + b_post))
    P0 = torch.softmax(s[2] * a_res.unflatten(-1, (n, n)) + b_res.view(n, n), dim=-1) + o.eps
    run.rec("hc-comb", P0)
    return pre, post, run.rec("hc-sinkhorn", sinkhorn(P0, o.sinkhorn_iters, o.eps))


def collapse(pre: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    return (pre.unsqueeze(-1) * X).sum(dim=2).to(X.dtype)


def expand(post: torch.Tensor, comb: torch.Tensor, delta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """New streams: post_j · Δ + Σ_i P_ij X_i."""
    return post.to(X.dtype).unsqueeze(-1) * delta.unsqueeze(-2) + torch.matmul(comb.to(X.dtype).transpose(-1, -2), X)


@program("hyper_connection", role="Hyper-connections")
def run_hyper_connection(comp: Component, run: Run, X: torch.Tensor) -> list[torch.Tensor]:
    pre, post, comb = mixing_weights(run, options(comp, HyperOptions), X)
    return [run.rec("hc-collapse", collapse(pre, X)), post, comb]


@reference_call("hyper_connection")
def call_hyper_connection(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference returns (post, comb, collapsed): all three are compared."""
    (X,) = inputs
    post, comb, collapsed = ref(X)
    mine = torch.cat([run.recorded["hc-post"].flatten(), run.recorded["hc-sinkhorn"].flatten(), ours.flatten()])
    theirs = torch.cat([post.flatten(), comb.flatten(), collapsed.flatten()])
    return mine, theirs, "post and comb weights and the collapsed branch input"


# ------------------------------------------------------------------------------------------------ head

def hyper_head(ctx: Ctx, *, prefix: str, X: Port, o: HyperOptions, citations: tuple[Citation, ...]) -> Component:
    """The last collapse of the streams, before the final RMSNorm: tensors hc_fn [n, n·d], hc_base [n], hc_scale [1]."""
    n, N, d = o.streams, ctx.sym("hc_mult"), ctx.sym("hidden_size")
    y = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
    steps = (
        _norm_step(o, ctx, X.latex),
        Step(rf"\pi^{{\mathrm{{head}}}}=\sigma\big(\zeta\,\hat X\,W_{{\mathrm{{head}}}}^{{\top}}+b\big)+{fmt_eps(o.eps)}",
             ctx.tokens(Dim("streams", n)), "hc-pre"),
        Step(rf"{y.latex}=\textstyle\sum_{{i=1}}^{{{n}}}\pi^{{\mathrm{{head}}}}_i\,{{{X.latex}}}_{{,i}}", y.shape, "hc-collapse"),
    )
    tensors = (TensorSpec(prefix + "hc_fn", (N, N * d), (), storage=Dense("F32")),
               TensorSpec(prefix + "hc_base", (N,), (), storage=Dense("F32")),
               TensorSpec(prefix + "hc_scale", (sympy.Integer(1),), (), storage=Dense("F32")))
    return Component(
        key="hc_head", title="Hyper-connection head", kind="learned", code="DeepseekV4HyperHead(config)",
        description=f"Collapse the {n} residual streams into one hidden state with weights computed from the "
                    "streams themselves.",
        inputs=(X,), outputs=(y,), equations=(steps[-1],), steps=steps, tensors=tensors, citations=citations,
        program="hyper_head", options=o,
    )


@program("hyper_head", role="Hyper-connections")
def run_hyper_head(comp: Component, run: Run, X: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, HyperOptions)
    mixes = flat_norm(run, X, o.norm_eps) @ run.w("hc_fn").float().T
    pre = run.rec("hc-pre", torch.sigmoid(mixes * run.w("hc_scale").float() + run.w("hc_base").float()) + o.eps)
    return [run.rec("hc-collapse", collapse(pre, X))]


__all__ = ["HyperOptions", "hyper_connection", "hyper_head", "expand", "collapse", "mixing_weights", "sinkhorn",
           "streams_shape", "B", "T"]
