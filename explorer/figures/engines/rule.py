"""What every engine module shares: a rule as data (what the engine does, and the file and function of its tree that
does it), and the integer arithmetic the rules are written in, so that static/calc.js can mirror each step exactly."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rule:
    """One allocation rule of an engine, with where it is written."""

    text: str
    source: str
    """File and function in the engine's tree."""


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for whole numbers, as the engines' own cdiv and ceil_div."""
    return -(-a // b)


def milli(ratio: float) -> int:
    """A ratio setting (0.9, 0.8) in thousandths, so every later step stays in integers; the page reads a typed
    decimal the same way (Math.round of it × 1,000)."""
    return math.floor(ratio * 1000 + 0.5)


def conv_kept(elements: int, columns: int) -> int:
    """Elements of a conv state an engine keeps when it holds kernel − 1 of its `columns` columns (vLLM's and
    SGLang's state shapes), where the theory counts the full kernel as the reference holds it; other parts whole."""
    return elements if columns < 2 else elements // columns * (columns - 1)


def ratio_text(thousandths: int) -> str:
    """A ratio in thousandths as a reader types it: 800 -> "0.8", 1000 -> "1", 850 -> "0.85" (calc.js the same)."""
    return f"{thousandths // 1000}.{thousandths % 1000:03d}".rstrip("0").rstrip(".")
