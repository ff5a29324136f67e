"""The layer pattern of a hybrid model: which kind of token mixer each decoder layer runs, read once from the
config into kinds with their layer indices, so that every stage (the tree, the accounting, the memory figures, the
whole-model picture) takes the same reading. Qwen3.5 publishes `layer_types` ("linear_attention",
"full_attention"), or a `full_attention_interval` from which the reference derives it; Nemotron-H publishes a pattern
string; both reduce to a LayerPattern.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LayerPattern:
    """Each layer's kind, in order, as the config names it."""

    kinds: tuple[str, ...]

    @property
    def distinct(self) -> tuple[str, ...]:
        """The kinds in order of first appearance."""
        return tuple(dict.fromkeys(self.kinds))

    def layers(self, kind: str) -> tuple[int, ...]:
        """0-based indices of the layers of one kind."""
        return tuple(i for i, k in enumerate(self.kinds) if k == kind)

    def count(self, kind: str) -> int:
        return self.kinds.count(kind)

    def letters(self, letter: dict[str, str]) -> str:
        """The pattern as one letter per layer ("LLLF" for three linear layers then a full one)."""
        return "".join(letter[k] for k in self.kinds)


def from_layer_types(layer_types: tuple[str, ...] | None, layers: int, interval: int,
                     periodic: str, every: str) -> LayerPattern:
    """layer_types as published, or (absent) every `interval`-th layer of kind `every` and the others `periodic`,
    as the reference derives it."""
    if layer_types is not None:
        return LayerPattern(tuple(layer_types))
    return LayerPattern(tuple(every if (i + 1) % interval == 0 else periodic for i in range(layers)))


__all__ = ["LayerPattern", "from_layer_types"]
