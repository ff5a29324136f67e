"""Normalisation layers: RMSNorm (gain w, or Gemma's 1 + w) and LayerNorm with a bias."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import Ctx, Run, fmt_eps, options, program
from explorer.spec.types import Citation, Component, IndexRange, Port, Step

Gain = Literal["w", "1+w"]
GAIN_SUBSCRIPT = {"w": "", "1+w": r"_{1+\gamma}"}


@dataclass(frozen=True, slots=True)
class NormOptions:
    kind: Literal["rms", "layer"]
    eps: float
    gain: Gain = "w"
    """RMSNorm's learned gain: multiply by w, or by (1 + w) as Gemma stores it (zero-initialised)."""


def rmsnorm(ctx: Ctx, key: str, title: str, *, weight: str, ranges: tuple[IndexRange, ...], size: str, x: Port,
            y: Port, code: str, eps: float, gain: Gain = "w", citations: tuple[Citation, ...] = ()) -> Component:
    """RMSNorm over the last dimension with a learned per-feature gain."""
    g = r"\gamma" if gain == "w" else r"(1+\gamma)"
    detail = (rf"{y.latex}=\frac{{{x.latex}}}{{\sqrt{{\operatorname{{mean}}(({x.latex})^2)+{fmt_eps(eps)}}}}}"
              rf"\odot {g}")
    gain_text = "a learned gain" if gain == "w" else "one plus a learned gain (stored as the offset from 1)"
    return Component(
        key=key, title=title, kind="learned", code=code,
        description=f"Scale each {ctx.size(size):,}-feature vector to unit root mean square, then by {gain_text}.",
        inputs=(x,), outputs=(y,),
        # Gemma's gain shows in the headline too, so a block's steps say which RMSNorm it is
        equations=(Step(rf"{y.latex}=\operatorname{{RMSNorm}}{GAIN_SUBSCRIPT[gain]}({x.latex})", y.shape, key),),
        steps=(Step(detail, y.shape, key),),
        tensors=(ctx.tensor(weight, ranges, (ctx.sym(size),)),),
        citations=citations or (ctx.citations("rmsnorm", (ctx.reference.cite(
            "RMSNorm divides by the root mean square over the last dimension (plus eps) and multiplies by a "
            "learned weight of that length.", "RMSNorm"),)) if gain == "w" else (ctx.reference.cite(
            "RMSNorm divides by the root mean square over the last dimension (plus eps) and multiplies by 1 + "
            "weight, a learned weight of that length stored as its offset from 1.", "RMSNorm"),)),
        program="norm", options=NormOptions("rms", eps, gain),
    )


def layernorm(ctx: Ctx, key: str, title: str, *, weight: str, ranges: tuple[IndexRange, ...], size: str, x: Port,
              y: Port, code: str, eps: float, citations: tuple[Citation, ...] = ()) -> Component:
    """LayerNorm: subtract the mean, divide by the standard deviation, scale by w and add b."""
    # the variance written out (the biased one LayerNorm uses), not as σ²: σ is the sigmoid on every page
    detail = (rf"{y.latex}=\frac{{{x.latex}-\mu}}{{\sqrt{{\operatorname{{mean}}(({x.latex}-\mu)^2)"
              rf"+{fmt_eps(eps)}}}}}\odot\gamma+b,\quad \mu=\operatorname{{mean}}({x.latex})")
    return Component(
        key=key, title=title, kind="learned", code=code,
        description=f"Centre and scale each {ctx.size(size):,}-feature vector, then apply a learned gain and bias.",
        inputs=(x,), outputs=(y,),
        equations=(Step(rf"{y.latex}=\operatorname{{LayerNorm}}({x.latex})", y.shape, key),),
        steps=(Step(detail, y.shape, key),),
        tensors=(ctx.tensor(weight, ranges, (ctx.sym(size),)),
                 ctx.tensor(weight.removesuffix(".weight") + ".bias", ranges, (ctx.sym(size),))),
        citations=citations, program="norm", options=NormOptions("layer", eps),
    )


def apply_norm(run: Run, name: str, x: torch.Tensor, opts: NormOptions, module: str) -> torch.Tensor:
    """The norm whose weights are `module`weight (and bias); records the result as step `name`."""
    w = run.w(module + "weight")
    if opts.kind == "layer":
        return run.rec(name, F.layer_norm(x, (x.shape[-1],), w, run.w(module + "bias"), opts.eps))
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + opts.eps)
    if opts.gain == "1+w":
        return run.rec(name, (y * (1.0 + w.float())).to(x.dtype))
    return run.rec(name, w * y.to(x.dtype))


@program("norm", role="Norms")
def run_norm(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    return [apply_norm(run, comp.steps[0].name, x, options(comp, NormOptions), "")]
