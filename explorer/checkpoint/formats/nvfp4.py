"""NVFP4 as NVIDIA ModelOpt exports it (hf_quant_config.json quant_algo "NVFP4", group_size 16): quantizing,
packing and back, with the E2M1 code arithmetic shared with MXFP4 (explorer/checkpoint/formats/mxfp4.py).

The format (ModelOpt 0.47, torch/quantization/qtensor/nvfp4_tensor.py and torch/export/quant_utils.py):
- Two levels of scale. The whole weight's `weight_scale_2` = max|W| / (6 · 448), F32, a scalar; each block of 16
  inputs has `weight_scale` = max|block| / (6 · weight_scale_2), clamped to [2^-9, 448] and cast to FP8 E4M3 (an
  all-zero block takes 1). So a block's largest value maps near 6, E2M1's largest magnitude, and the block scales
  use FP8's range.
- A value is the E2M1 code nearest to w / (weight_scale · weight_scale_2) (ties to the even code), read back as
  E2M1(code) · weight_scale · weight_scale_2.
- Packing: two codes per byte along the input axis, element 2j in the low nibble, 2j + 1 in the high nibble, stored
  as U8 under the weight's own name, [out, in / 2].
- `input_scale`, F32 scalar: the static scale of the layer's input, max|x| over calibration / (6 · 448).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from explorer.checkpoint.formats.mxfp4 import _nearest_e2m1, e2m1_value, unpack_nibbles

if TYPE_CHECKING:
    import torch

GROUP = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0


def global_scale(amax: torch.Tensor) -> torch.Tensor:
    """weight_scale_2 (or input_scale) for a tensor whose largest magnitude is amax: F32 scalar."""
    return (amax.float() / (E2M1_MAX * E4M3_MAX)).reshape(())


def quantize(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """weight [..., in] (in a multiple of 16) -> {"weight": U8 [..., in/2], "weight_scale": F8_E4M3 [..., in/16],
    "weight_scale_2": F32 []}."""
    import torch

    if weight.shape[-1] % GROUP:
        raise ValueError(f"input dimension {weight.shape[-1]} is not a multiple of the {GROUP}-value block")
    w = weight.float()
    scale_2 = global_scale(w.abs().amax())
    blocks = w.unflatten(-1, (-1, GROUP))                                      # [..., G, 16]
    per_block = blocks.abs().amax(dim=-1) / (E2M1_MAX * scale_2)
    per_block = torch.where(per_block == 0, torch.ones_like(per_block), per_block)
    scale = per_block.clamp(2 ** -9, E4M3_MAX).to(torch.float8_e4m3fn)
    codes = _nearest_e2m1((blocks / (scale.float() * scale_2).unsqueeze(-1)).double()).flatten(-2)
    return {"weight": pack(codes), "weight_scale": scale, "weight_scale_2": scale_2}


def pack(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes [..., in] -> U8 [..., in/2], element 2j in the low nibble."""
    import torch

    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """U8 [..., in/2] -> codes [..., in] (the same nibble order as MXFP4's blocks)."""
    return unpack_nibbles(packed.unsqueeze(-2)).squeeze(-2)


def dequantize(stored: dict[str, torch.Tensor]) -> torch.Tensor:
    """E2M1(code) · weight_scale · weight_scale_2, float32 [..., in]."""
    values = e2m1_value(unpack(stored["weight"])).unflatten(-1, (-1, GROUP))   # float64, exact
    scale = stored["weight_scale"].float().double() * stored["weight_scale_2"].double()
    return (values * scale.unsqueeze(-1)).flatten(-2).float()
