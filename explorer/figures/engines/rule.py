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


FP8_DS_MLA = 656
"""Bytes a token of DeepSeek Sparse Attention's MLA cache takes at FP8 in vLLM and SGLang: the 512-element latent in
FP8, a float32 scale per 128 of it (16 bytes) and the 64-element rotary key kept in BF16 (128 bytes)."""
FP8_DS_MLA_LATENT = 576
"""The latent and rotary key that layout is for (kv_lora_rank 512 + qk_rope_head_dim 64)."""


def sparse_mla_fp8(per_token: int, indexer: int, half: int) -> bool:
    """Whether a kind's cache takes the fp8_ds_mla layout: sparse attention's MLA (an indexer beside it) at FP8."""
    return bool(indexer) and half == 2 and per_token - indexer == FP8_DS_MLA_LATENT
