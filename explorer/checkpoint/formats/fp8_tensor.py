"""FP8 with static per-tensor scales (ModelOpt's quant_algo "FP8", compressed-tensors' float-quantized with strategy
"tensor", transformers' FP8Linear without weight_block_size): one F32 scale for the whole weight and one for the
layer's input, each max|x| / 448 so the largest magnitude lands on FP8 E4M3's largest finite value.

A weight W is stored as FP8 E4M3 values round(W / s) (round to nearest even in E4M3, clamped to ±448) and
`weight_scale` s (ModelOpt and compressed-tensors; transformers' own layer names it weight_scale_inv and the input's
activation_scale); it is read back as FP8(W / s) · s. E4M3 keeps 3 mantissa bits, so a normal value comes back
within a relative 2^-4 of where it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

E4M3_MAX = 448.0


def scale_of(x: torch.Tensor) -> torch.Tensor:
    """The static scale of a tensor (its largest magnitude over 448): F32 scalar; 1 for an all-zero tensor."""
    import torch

    amax = x.float().abs().amax()
    return torch.where(amax == 0, torch.ones(()), amax / E4M3_MAX).reshape(())


def quantize(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"weight": F8_E4M3 like weight, "weight_scale": F32 []}."""
    import torch

    scale = scale_of(weight)
    values = (weight.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return {"weight": values, "weight_scale": scale}


def dequantize(stored: dict[str, torch.Tensor]) -> torch.Tensor:
    return stored["weight"].float() * stored["weight_scale"]
