"""compressed-tensors' pack-quantized integers (Kimi K2.5's INT4 experts): quantizing, packing into int32 words and
back, and the stored tensors a weight becomes.

The format (compressed-tensors 0.20, compressors/pack_quantized and quantization/utils):
- Symmetric group quantization: each run of `group` consecutive inputs of a row shares one scale
  s = max|w| / ((q_max − q_min) / 2), which for 4 bits (q_min −8, q_max 7) is max|w| / 7.5; a code is
  q = clamp(round(w / s), −8, 7) (round half to even) and w is read back as q · s. No zero point is stored.
- Packing: the codes of a row, each offset by 2^(bits−1) (so 0 … 15 for 4 bits), are laid end to end in a bit
  string, code i at bits [bits·i, bits·(i+1)), and the string cut into int32 words, least significant bit first:
  with 4 bits, word j holds codes 8j … 8j+7, code 8j+k in bits 4k … 4k+3.
- Stored tensors of a weight `<module>.weight` [out, in]: `<module>.weight_packed` I32 [out, in·bits/32],
  `<module>.weight_scale` (the weight's dtype) [out, in/group] and `<module>.weight_shape` I64 [2], the logical
  shape, which the loader prefers over the packed width (transformers' integrations/compressed_tensors.py).

tests/test_storage_schemes.py checks the bit layout against a packed example worked out from that library's own
packer, and round trips on random tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def code_range(bits: int) -> tuple[int, int]:
    """(q_min, q_max) of signed `bits`-bit codes: (−8, 7) for 4 bits."""
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def quantize(weight: torch.Tensor, group: int = 32, bits: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes int8 [..., in] and scales float32 [..., in / group] of a weight [..., in] (in a multiple of group)."""
    import torch

    if weight.shape[-1] % group:
        raise ValueError(f"input dimension {weight.shape[-1]} is not a multiple of the group of {group}")
    low, high = code_range(bits)
    w = weight.float().unflatten(-1, (-1, group))                       # [..., G, group]
    scale = w.abs().amax(dim=-1) / ((high - low) / 2)                   # [..., G]
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)       # an all-zero group: codes 0
    codes = torch.round(w / safe.unsqueeze(-1)).clamp(low, high)
    return codes.flatten(-2).to(torch.int8), scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q · s, each scale repeated over its group: float32 [..., in]."""
    group = codes.shape[-1] // scale.shape[-1]
    return (codes.float().unflatten(-1, (-1, group)) * scale.float().unsqueeze(-1)).flatten(-2)


def pack(codes: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """int8 codes [..., in] -> int32 words [..., in·bits/32] (in·bits a multiple of 32; bits divides 32)."""
    import torch

    per_word = 32 // bits
    if 32 % bits or codes.shape[-1] % per_word:
        raise ValueError(f"{codes.shape[-1]} codes of {bits} bits do not fill whole int32 words")
    unsigned = (codes.long() + (1 << (bits - 1))).unflatten(-1, (-1, per_word))  # [..., W, per_word]
    shifts = torch.arange(per_word) * bits
    words = (unsigned << shifts).sum(dim=-1)                                      # 0 … 2^32 − 1
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def unpack(words: torch.Tensor, columns: int, bits: int = 4) -> torch.Tensor:
    """int32 words [..., W] -> int8 codes [..., columns]."""
    import torch

    per_word = 32 // bits
    shifts = torch.arange(per_word) * bits
    unsigned = (words.long().unsqueeze(-1) >> shifts) & ((1 << bits) - 1)          # [..., W, per_word]
    return (unsigned.flatten(-2)[..., :columns] - (1 << (bits - 1))).to(torch.int8)


def pack_weight(weight: torch.Tensor, group: int = 32, bits: int = 4) -> dict[str, torch.Tensor]:
    """The three stored tensors of one weight [out, in], by their suffix after `<module>.`."""
    import torch

    codes, scale = quantize(weight, group, bits)
    return {"weight_packed": pack(codes, bits), "weight_scale": scale.to(weight.dtype),
            "weight_shape": torch.tensor(weight.shape, dtype=torch.int64)}


def unpack_weight(stored: dict[str, torch.Tensor], bits: int = 4) -> torch.Tensor:
    """The weight back from its stored tensors (float32 [out, in]), its width read from weight_shape."""
    columns = int(stored["weight_shape"][-1])
    return dequantize(unpack(stored["weight_packed"], columns, bits), stored["weight_scale"])
