"""Hybrid layer patterns: which kind of layer sits at each depth, read once from the config into layer kinds that
the family then groups into one block kind each.

Hybrid models spell their depth two ways: a pattern string with one letter per layer (Nemotron-H's
hybrid_override_pattern, "M" Mamba-2, "*" attention, "E" mixture of experts, "-" MLP) or a list of layer-type names
(layer_types, as Qwen3.5 publishes it, or derives it from full_attention_interval, and as transformers' NemotronHConfig.layers_block_type hold it). Both are read here into the
same `LayerPattern`, so a family never indexes a pattern string itself, and a per-layer property is never read
from layer 0 only.

References: transformers' models/nemotron_h/configuration_nemotron_h.py (NemotronHConfig._pattern_to_list, the
letter mapping); Nemotron-H (arXiv:2504.03624) for the pattern notation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NEMOTRON_H_LETTERS: dict[str, str] = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}
"""hybrid_override_pattern letter -> layer kind, as NemotronHConfig._pattern_to_list maps them (there to
linear_attention, full_attention, moe and mlp)."""

NEMOTRON_H_TYPES: dict[str, str] = {"linear_attention": "mamba", "full_attention": "attention", "moe": "moe",
                                    "mlp": "mlp"}
"""transformers' layers_block_type names -> the same layer kinds."""


@dataclass(frozen=True, slots=True)
class LayerPattern:
    """The kind of every layer, in depth order."""

    kinds: tuple[str, ...]
    """One kind per layer ("mamba", "attention", ...)."""
    spelled: str = ""
    """The pattern as the config spells it (shown on the pages)."""

    def __len__(self) -> int:
        return len(self.kinds)

    def indices(self, kind: str) -> tuple[int, ...]:
        """The 0-based layers of one kind."""
        return tuple(i for i, k in enumerate(self.kinds) if k == kind)

    def present(self) -> tuple[str, ...]:
        """The kinds that occur, in order of first appearance."""
        return tuple(dict.fromkeys(self.kinds))

    def count(self, kind: str) -> int:
        return len(self.indices(kind))

    def letters(self, letter: Mapping[str, str]) -> str:
        """The pattern as one letter per layer ("LLLF" for three linear layers then a full one)."""
        return "".join(letter[k] for k in self.kinds)


def read_pattern(pattern: str | Sequence[str], names: Mapping[str, str]) -> LayerPattern:
    """A pattern string (one letter per layer) or a list of layer-type names, read through `names`; KeyError names
    the first unknown symbol (callers validate with `pattern_problems` first)."""
    symbols = list(pattern)
    spelled = pattern if isinstance(pattern, str) else ", ".join(pattern)
    return LayerPattern(tuple(names[s] for s in symbols), spelled)


def pattern_problems(pattern: str | Sequence[str], names: Mapping[str, str], key: str,
                     layers: int | None = None) -> list[str]:
    """"key 'k': message" for an unknown symbol, an empty pattern, or a length that disagrees with `layers`."""
    symbols = list(pattern)
    out = [f"key '{key}': symbol {s!r} at layer {i} is not one of {', '.join(repr(n) for n in names)}"
           for i, s in enumerate(symbols) if s not in names][:3]
    if not symbols:
        out.append(f"key '{key}': must name at least one layer")
    if layers is not None and symbols and len(symbols) != layers:
        out.append(f"key '{key}': has {len(symbols)} layers but num_hidden_layers is {layers}")
    return out


def runs(indices: tuple[int, ...]) -> str:
    """Layer numbers counted from 0 (as the tensor names count them) as runs: (0, 1, 2, 5) -> "0–2, 5"."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in spans)


def from_layer_types(layer_types: tuple[str, ...] | None, layers: int, interval: int,
                     periodic: str, every: str) -> LayerPattern:
    """layer_types as published, or (absent) every `interval`-th layer of kind `every` and the others `periodic`,
    as the reference derives it."""
    if layer_types is not None:
        return LayerPattern(tuple(layer_types), ", ".join(layer_types))
    kinds = tuple(every if (i + 1) % interval == 0 else periodic for i in range(layers))
    return LayerPattern(kinds, f"every {interval}th layer {every}, the others {periodic} (full_attention_interval)")
