"""Results of the torch executor as plain data (no torch import), for the cache, the views and the API."""

from __future__ import annotations

import math
from dataclasses import dataclass

from explorer.spec.types import Shape

TOLERANCE = 1e-4
"""Largest |Δ| accepted between our float32 programs and the reference's at the tiny config."""


def within_tolerance(error: float, tolerance: float = TOLERANCE) -> bool:
    """Whether a measured max |Δ| passes: NaN and infinities never do (`error > tolerance` is False for NaN)."""
    return math.isfinite(error) and 0 <= error <= tolerance


@dataclass(frozen=True, slots=True)
class ComponentTrace:
    """Shapes recorded while running one component."""

    inputs: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]
    steps: dict[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class ShapeTrace:
    """Every component's traced shapes, by path."""

    device: str
    free: dict[str, int]
    components: dict[str, ComponentTrace]


@dataclass(frozen=True, slots=True)
class RoutingExample:
    """One token's routing in the executed check, as the router program recorded it: a row of values per step
    (logits, scores, gates; biases where the router has them), over every expert."""

    token: str
    """Which token: "batch 1, position 5"."""
    rows: tuple[tuple[str, tuple[float, ...]], ...]
    """(what the row holds, one value per expert)."""
    selected: tuple[int, ...]
    """The experts the router selected for this token (0-based), in index order."""


@dataclass(frozen=True, slots=True)
class EquationCheck:
    """One comparison of a component's step program with the reference implementation."""

    status: str
    """"checked", "part" (checked as part of an enclosing component) or "unchecked"."""
    reference: str = ""
    config: str = ""
    max_abs_error: float = 0.0
    tolerance: float = TOLERANCE
    detail: str = ""
    """E.g. "same experts selected for all 10 tokens", or why it is not checked."""
    part_of: str = ""
    """Path of the enclosing checked component, for status "part"."""
    example: RoutingExample | None = None
    """A router's worked example from this check (None for other components)."""


@dataclass(frozen=True, slots=True)
class Execution:
    """What the executor found for one model: traced shapes and equation checks."""

    trace: ShapeTrace
    checks: dict[str, EquationCheck]


@dataclass(frozen=True, slots=True)
class RealWeightCheck:
    """One component run on a checkpoint's real weights and compared with the reference on the same weights."""

    path: str
    """Component path, e.g. "blocks.block"."""
    layer: int
    source: str
    """The weights file."""
    reference: str
    max_abs_error: float
    tolerance: float
    detail: str


FREE_SIZES = {"B": 2, "T": 5}
"""The sizes of the free dimensions (batch, positions) wherever a shape is traced."""


def free_size(symbol: str, free: dict[str, int] = FREE_SIZES) -> int:
    """The traced size of a free dimension: "T" -> 5; "T/4" (one per closed window of 4 positions) -> 1;
    "T+T/4" (positions and compressed entries side by side) -> 6; "⌈T/2⌉" (blocks of 2 positions, the last one
    partial) -> 3."""
    total = 0
    for term in symbol.split("+"):
        ceil = term.startswith("⌈") and term.endswith("⌉")
        base, _, ratio = term.strip("⌈⌉").partition("/")
        if not ratio:
            total += free[base]
        else:
            total += -(-free[base] // int(ratio)) if ceil else free[base] // int(ratio)
    return total


def label(traced: tuple[int, ...], shape: Shape, free: dict[str, int] = FREE_SIZES) -> str | None:
    """None when a traced shape agrees with the spec's named shape, else what disagrees."""
    if len(traced) != len(shape.dims):
        return f"rank {len(traced)} traced, {len(shape.dims)} in the spec"
    for size, dim in zip(traced, shape.dims):
        want = free_size(dim.symbol, free) if dim.size is None else dim.size
        if size != want:
            return f"dimension {dim.display!r} is {size} in the trace"
    return None
