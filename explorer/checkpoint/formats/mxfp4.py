"""MXFP4, the storage of gpt-oss's expert weights: packing, the explorer's own dequantization equations, and the
stored tensors (names, shapes, dtypes, bytes) a weight becomes.

The format (OCP Microscaling Formats (MX) Specification v1.0, sections 5 and 6):
- A block of 32 consecutive elements along the input dimension shares one scale X; element i is X × P_i.
- P_i is FP4 E2M1, a 4-bit code: sign s (bit 3), exponent e (bits 2-1, bias 1), mantissa m (bit 0).
  e = 0 is subnormal: (-1)^s × (m / 2), i.e. 0 or 0.5; e > 0: (-1)^s × 2^(e - 1) × (1 + m / 2), i.e. 1, 1.5,
  2, 3, 4, 6. Largest magnitude 6, so emax of the element format is 2.
- X is E8M0: one byte holding only a biased exponent, X = 2^(byte - 127); byte 255 is NaN.
- Quantizing a block (section 6.3): X = 2^(floor(log2(max |V|)) - 2), each V / X rounded to the nearest E2M1
  value (ties to the even code), magnitudes above 6 saturating to 6.

How gpt-oss stores it (the layout transformers' MXFP4 loader reads, integrations/mxfp4.py): a weight of logical
shape [..., out, in] becomes `<name>_blocks` U8 [..., out, in / 32, 16] and `<name>_scales` U8
[..., out, in / 32]. Each byte packs two elements: element 2j in the low nibble (bits 0-3), element 2j + 1 in
the high nibble (bits 4-7). The spec leaves packing to the storage; tests/test_mxfp4.py proves this order
against transformers' dequantizer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.checkpoint.index import TensorInfo

if TYPE_CHECKING:
    import torch

BLOCK = 32
"""Elements sharing one scale."""
BYTES_PER_BLOCK = BLOCK // 2
"""Two 4-bit codes per byte."""
E8M0_BIAS = 127
E8M0_NAN = 255
E2M1_EMAX = 2
"""Exponent of the largest E2M1 magnitude (6 = 2^2 × 1.5): the block scale leaves room for it."""


# ------------------------------------------------------------------------------------------ numbers

def e2m1_value(codes: torch.Tensor) -> torch.Tensor:
    """Decode 4-bit E2M1 codes (integers 0-15) to their exact values, in float64."""
    import torch

    codes = codes.long()
    sign = 1.0 - 2.0 * ((codes >> 3) & 1).double()
    exponent = ((codes >> 1) & 3).double()
    mantissa = (codes & 1).double()
    normal = torch.pow(2.0, exponent - 1) * (1 + mantissa / 2)
    return sign * torch.where(exponent == 0, mantissa / 2, normal)


def unpack_nibbles(blocks: torch.Tensor) -> torch.Tensor:
    """Split each byte of [..., G, 16] blocks into two codes: [..., G, 32], element 2j from the low nibble."""
    import torch

    low, high = (blocks & 0x0F).long(), (blocks >> 4).long()
    return torch.stack((low, high), dim=-1).flatten(-2)  # [..., G, 16, 2] -> [..., G, 32]


def e8m0_scale(scales: torch.Tensor) -> torch.Tensor:
    """The power of two each E8M0 byte stands for, in float64 (NaN for byte 255)."""
    import torch

    exponent = scales.double() - E8M0_BIAS
    return torch.where(scales == E8M0_NAN, torch.nan, torch.pow(2.0, exponent))


def dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Values of an MXFP4 weight: blocks U8 [..., G, 16] and scales U8 [..., G] -> float32 [..., G × 32].

    Each value is an E2M1 magnitude (at most 6 = 1.5 × 2^2) times a power of two from 2^-127 to 2^127: exact
    in float64, and inside float32's range (subnormals included), so the final cast loses nothing.
    """
    if blocks.shape[-1] != BYTES_PER_BLOCK or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)}: expected "
                         f"[..., G, {BYTES_PER_BLOCK}] and [..., G]")
    values = e2m1_value(unpack_nibbles(blocks)) * e8m0_scale(scales).unsqueeze(-1)  # [..., G, 32]
    return values.float().flatten(-2)


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack a weight [..., in] (in a multiple of 32) as MXFP4: blocks U8 [..., in/32, 16], scales U8 [..., in/32]."""
    import torch

    if weight.shape[-1] % BLOCK:
        raise ValueError(f"last dimension {weight.shape[-1]} is not a multiple of the {BLOCK}-element block")
    if not torch.isfinite(weight).all():
        raise ValueError("weight has non-finite values, which MXFP4 blocks cannot scale")
    v = weight.double().unflatten(-1, (-1, BLOCK))  # [..., G, 32]
    _, exp = torch.frexp(v.abs().amax(dim=-1))  # max |V| = f × 2^exp with f in [0.5, 1): floor(log2) = exp - 1
    shared = (exp - 1 - E2M1_EMAX).clamp(-E8M0_BIAS, E8M0_BIAS)  # [..., G]
    codes = _nearest_e2m1(v / torch.pow(2.0, shared.double()).unsqueeze(-1))
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)  # [..., G, 16]
    return packed.to(torch.uint8), (shared + E8M0_BIAS).to(torch.uint8)


def _nearest_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Codes of the E2M1 values nearest to y; ties go to the even code; beyond ±6 saturates. No negative zero."""
    import torch

    magnitudes = e2m1_value(torch.arange(8))  # 0, 0.5, 1, 1.5, 2, 3, 4, 6
    distance = (y.abs().unsqueeze(-1) - magnitudes).abs()  # [..., 8]
    nearest = distance == distance.amin(dim=-1, keepdim=True)
    even = torch.arange(8) % 2 == 0
    code = (nearest.long() * 2 + (nearest & even).long()).argmax(dim=-1)
    return code | (((y < 0) & (code > 0)).long() << 3)


# ------------------------------------------------------------------------------------------ storage

@dataclass(frozen=True, slots=True)
class MXFP4Storage:
    """The stored tensors of one MXFP4 weight, as gpt-oss's safetensors hold them."""

    weight: str
    """Logical name, e.g. model.layers.0.mlp.experts.gate_up_proj (not itself stored)."""
    logical_shape: tuple[int, ...]
    """[..., out, in], blocks running along in. (transformers' GptOssExperts holds the transpose, [E, in, out].)"""
    blocks: TensorInfo
    scales: TensorInfo

    @property
    def parameters(self) -> int:
        """Logical parameters, one FP4 value each."""
        return math.prod(self.logical_shape)

    @property
    def nbytes(self) -> int:
        """Stored bytes: half a byte per value plus one scale byte per 32 values (4.25 bits per parameter)."""
        return self.blocks.nbytes + self.scales.nbytes


def mxfp4_storage(weight: str, logical_shape: tuple[int, ...], shard: str = "") -> MXFP4Storage:
    """The `_blocks` and `_scales` tensors (U8) that store a weight of logical shape [..., out, in] in MXFP4."""
    *lead, in_features = logical_shape
    if in_features % BLOCK:
        raise ValueError(f"{weight}: input dimension {in_features} is not a multiple of the {BLOCK}-element block")
    groups = in_features // BLOCK
    blocks = TensorInfo(f"{weight}_blocks", "U8", (*lead, groups, BYTES_PER_BLOCK), shard)
    scales = TensorInfo(f"{weight}_scales", "U8", (*lead, groups), shard)
    return MXFP4Storage(weight, tuple(logical_shape), blocks, scales)
