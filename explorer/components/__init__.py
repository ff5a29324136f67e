"""The component library: every part a family composes, each owning its spec, program and reference call.

Importing this package registers every program (`base.PROGRAMS`) and reference call (`base.REFERENCE_CALLS`).
"""

from __future__ import annotations

from . import (  # noqa: F401  (registration)
    attention,
    blocks,
    embedding,
    fused_attention,
    fused_experts,
    hybrid_block,
    linear,
    mamba2,
    mla,
    mlp,
    moe,
    mtp,
    nope_attention,
    norms,
    relu2_experts,
    rope,
)
from .base import PROGRAMS, REFERENCE_CALLS, Ctx, Reference, Run

__all__ = ["PROGRAMS", "REFERENCE_CALLS", "Ctx", "Reference", "Run"]
