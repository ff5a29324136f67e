"""L2 QK-norm: queries and keys scaled per head to unit root mean square with no learned gain (an RMSNorm without
weight), applied after the rotation (Llama 4's RoPE layers, use_qk_norm); a weightless RMS of the values is the
same operation (Gemma 4's v_norm).

References: "Query-Key Normalization for Transformers" (arXiv:2010.04245); transformers' models/llama4
(Llama4TextL2Norm) and models/gemma4 (Gemma4RMSNorm with with_scale=False).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import fmt_eps
from explorer.spec.types import Shape, Step


def unit_rms_step(out: str, x: str, eps: float, shape: Shape, name: str) -> Step:
    """out = x / √(mean(x²) + ε), per head, no gain."""
    return Step(rf"{out}=\frac{{{x}}}{{\sqrt{{\operatorname{{mean}}({x}^2)+{fmt_eps(eps)}}}}}", shape, name)


def unit_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Scale the last axis to unit root mean square, in float32, back in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)
