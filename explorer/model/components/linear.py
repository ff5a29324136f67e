"""Linear projections: y = xW (+ b), stored [out, in] (nn.Linear) or [in, out] (GPT-2's Conv1D)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import Ctx, Run, options, program
from explorer.spec.types import Citation, Component, Dim, IndexRange, Layout, Port, Step, TensorSpec


@dataclass(frozen=True, slots=True)
class LinearOptions:
    bias: bool = False
    layout: Layout = "out_in"
    """How the weight is stored: [out, in] as nn.Linear holds it, or [in, out] as Conv1D does."""


def linear(ctx: Ctx, key: str, title: str, *, weight: str, ranges: tuple[IndexRange, ...],
           d_in: sympy.Expr | str, d_out: sympy.Expr | str, out_dim: Dim, x: Port, y: Port, equation: str,
           description: str, code: str, bias: bool = False, layout: Layout = "out_in", quantize: bool = True,
           citations: tuple[Citation, ...] = ()) -> Component:
    """One projection with its weight (and bias) tensors; `weight` is the weight's name template."""
    d_in = ctx.sym(d_in) if isinstance(d_in, str) else d_in
    d_out = ctx.sym(d_out) if isinstance(d_out, str) else d_out
    shape = (d_out, d_in) if layout == "out_in" else (d_in, d_out)
    tensors: tuple[TensorSpec, ...] = (ctx.tensor(weight, ranges, shape, quantize=quantize, layout=layout),)
    if bias:
        tensors += (ctx.tensor(weight.removesuffix(".weight") + ".bias", ranges, (d_out,)),)
    if quantize and ctx.quantized is not None:
        citations += (quantization_citation(ctx),)
    step = Step(equation, y.shape, key)
    return Component(
        key=key, title=title, kind="learned", code=code, description=description, inputs=(x,), outputs=(y,),
        equations=(step,), steps=(step,), tensors=tensors, citations=citations, notes=linear_notes(bias, layout),
        program="linear", options=LinearOptions(bias, layout),
    )


def linear_notes(bias: bool, layout: Layout) -> tuple[str, ...]:
    return (
        f"This projection has {'a bias vector of its output width' if bias else 'no bias parameter'}.",
        "The reference module holds the weight output by input, [out, in]." if layout == "out_in" else
        "The reference module (Conv1D) holds the weight input by output, [in, out], so y = xW + b needs no transpose.",
    )


def quantization_citation(ctx: Ctx) -> Citation:
    """What backs the quantized storage: the config's quantization_config, unless the family names another source
    (a GGUF file has no config.json to cite)."""
    stored_as = getattr(ctx.quantized, "stored_as", "quantized")
    default = Citation(f"Weights are stored {stored_as}; the scales are quantization metadata and are excluded from "
                       "parameter counts.", "config", "quantization_config")
    return ctx.citations("quantization", (default,))[0]


def apply_linear(run: Run, x: torch.Tensor, module: str, opts: LinearOptions) -> torch.Tensor:
    """xWᵀ + b for weights stored [out, in]; xW + b for [in, out]; the weights are `module`weight (and bias)."""
    w = run.w(module + "weight")
    b = run.w(module + "bias") if opts.bias else None
    if opts.layout == "in_out":
        y = x @ w
        return y + b if b is not None else y
    return F.linear(x, w, b)


@program("linear", quantized_linear=True)
def run_linear(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec(comp.steps[0].name, apply_linear(run, x, "", options(comp, LinearOptions)))]
