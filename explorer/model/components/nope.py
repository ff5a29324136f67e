"""NoPE layers: attention with no positional encoding at all (no rotary, no learned positions), where order comes
only from the causal mask; Llama 4 gives every fourth layer no RoPE and scales its queries by a temperature that
grows slowly with the position (attn_temperature_tuning), so attention stays sharp over long contexts.

References: "Round and Round We Go! What makes Rotary Positional Encodings useful?" and "Length Generalization of
Causal Transformers without Position Encoding" (arXiv:2404.12224) for NoPE; "Scalable-Softmax Is Superior for
Attention" (arXiv:2501.19399) for the position-dependent temperature; transformers' models/llama4 (the reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import q
from explorer.spec.types import Shape, Step


@dataclass(frozen=True, slots=True)
class Temperature:
    """q_t ← q_t · (1 + attn_scale · log(1 + ⌊(t + 1) / floor_scale⌋)) on NoPE layers."""

    attn_scale: float
    floor_scale: int


def temperature_step(o: Temperature, shape: Shape, q_in: str) -> Step:
    out = q(r"Q^{\tau}_t")
    return Step(rf"{out}=\left(1+{o.attn_scale:g}\,\ln\!\left(1+\left\lfloor\frac{{t+1}}{{{o.floor_scale:,}}}"
                rf"\right\rfloor\right)\right){q_in}_t", shape, "temperature")


def temperature_scales(positions: torch.Tensor, o: Temperature) -> torch.Tensor:
    """The factor of each position, [T]."""
    return torch.log1p(torch.floor((positions.float() + 1.0) / o.floor_scale)) * o.attn_scale + 1.0

