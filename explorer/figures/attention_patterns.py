"""Attention-pattern pictures: which keys each query reads, as a small grid of query rows × key columns computed by
the executor's own mask functions at small sizes (window 4, chunk 4, one compressed entry per 4 positions, top-3
tokens, top-2 entries over 16 positions), so that the picture and the computation cannot drift apart.

Each attention part declares its mask at the model's sizes (the `mask_pattern` part fact, a `MaskSpec`:
explorer/model/components/part_facts.py); `pattern_grid` shrinks that spec and runs the masks the programs run —
the causal mask (blocks.causal_mask), the window and chunk (layer_attention.mask: attention.window_mask then
chunked.chunk_mask), DeepSeek Sparse Attention's top-k (dsa.selection_mask) and DeepSeek-V4's closed entries, their
top-k and the window beside them (compressed_attention.visible, pick_entries, v4_mask). Where a selection depends on
learned scores, the grid ranks keys by a fixed illustrative score (`illustrative_scores`), and its caption says so.

Grids need torch, so they are cached beside the torch stages, keyed as they are (explorer/execute/cache.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.execute import cache
from explorer.execute.cache_seal import unsealed
from explorer.model.components import compressed_attention, dsa, layer_attention
from explorer.model.components.blocks import causal_mask
from explorer.model.components.part_facts import MaskSpec, facts
from explorer.spec.types import ModelSpec, path_key, walk

POSITIONS = 16
SMALL = MaskSpec(window=4, chunk=4, sinks=True, selected_tokens=3, entry_ratio=4, selected_entries=2)
"""The sizes a grid is drawn at, each used only where the model's mask has that kind."""
READS, HIDDEN, DROPPED = "#", ".", "o"
"""A cell: the query reads the key; the mask hides it; the mask lets it through but the selection drops it."""


@dataclass(frozen=True, slots=True)
class AttentionPattern:
    """One attention component's mask, drawn at small sizes."""

    path: str
    """The attention component's page (component path)."""
    model: MaskSpec
    """The mask at the model's own sizes."""
    drawn: MaskSpec
    """The same kinds at the sizes drawn."""
    positions: int
    entries: int
    """Compressed entry columns after the token columns (0 without a compressor)."""
    rows: tuple[str, ...]
    """Per query position, one cell per column (tokens 0..positions−1, then entries): READS, HIDDEN or DROPPED."""

    def reads(self, query: int) -> tuple[int, ...]:
        """The columns query `query` reads."""
        return tuple(i for i, c in enumerate(self.rows[query]) if c == READS)


def small_sizes(model: MaskSpec) -> MaskSpec:
    """The model's mask kinds at the drawn sizes (a kind the model lacks stays absent)."""
    return MaskSpec(**{f: getattr(SMALL, f) if getattr(model, f) else getattr(model, f) for f in asdict(model)})


def illustrative_scores(queries: int, keys: int) -> torch.Tensor:
    """A fixed score per (query, key), distinct along each row (5 is invertible mod 17), standing in for the
    indexer's learned scores: the picture shows how many keys a query keeps and where it may find them."""
    t, s = torch.arange(queries)[:, None], torch.arange(keys)[None, :]
    return ((5 * s + 3 * t) % 17).float()


def pattern_grid(path: str, model: MaskSpec, positions: int = POSITIONS) -> AttentionPattern:
    """The grid of one mask at small sizes, computed by the executor's mask functions."""
    drawn = small_sizes(model)
    M = causal_mask(positions, torch.device("cpu"))                                    # [T, T] additive
    if drawn.entry_ratio:
        return _compressed_grid(path, model, drawn, M)
    masked = layer_attention.mask(M, layer_attention.MaskOptions(drawn.window, drawn.chunk))
    reads = masked == 0
    dropped = torch.zeros_like(reads)
    if drawn.selected_tokens:  # DSA: M^DSA = M + M^sel, the indexer scoring with the causal mask added
        selection = dsa.selection_mask(illustrative_scores(positions, positions) + masked, drawn.selected_tokens)
        kept = (masked + selection) == 0
        reads, dropped = kept, reads & ~kept
    return AttentionPattern(path, model, drawn, positions, 0, _rows(reads, dropped))


def _compressed_grid(path: str, model: MaskSpec, drawn: MaskSpec, M: torch.Tensor) -> AttentionPattern:
    """DeepSeek-V4: the window's keys, then one entry per ratio positions, readable once closed (and selected)."""
    assert drawn.entry_ratio and drawn.window
    positions = M.shape[-1]
    n = positions // drawn.entry_ratio
    closed = compressed_attention.visible(drawn.entry_ratio, positions, n, M.device)     # [T, n]
    ok = closed
    if drawn.selected_entries:
        picked = compressed_attention.pick_entries(illustrative_scores(positions, n), closed, drawn.selected_entries)
        ok = closed & (picked > 0)
    reads = compressed_attention.v4_mask(M, drawn.window, ok) == 0                        # [T, T + n]
    dropped = torch.cat([torch.zeros_like(M, dtype=torch.bool), closed & ~ok], dim=-1)
    return AttentionPattern(path, model, drawn, positions, n, _rows(reads, dropped))


def _rows(reads: torch.Tensor, dropped: torch.Tensor) -> tuple[str, ...]:
    return tuple("".join(READS if r else DROPPED if d else HIDDEN for r, d in zip(rr.tolist(), dd.tolist()))
                 for rr, dd in zip(reads, dropped))


def declared_masks(spec: ModelSpec) -> tuple[tuple[str, MaskSpec], ...]:
    """(path, mask at the model's sizes) of every component whose part declares a mask pattern, in page order."""
    out = []
    for ancestors, comp in walk(spec.root):
        rule = facts(comp.program).mask_pattern
        if rule is not None:
            out.append((path_key(ancestors, comp), rule(comp)))
    return tuple(out)


def attention_patterns(spec: ModelSpec, cache_dir: Path | None) -> tuple[AttentionPattern, ...]:
    """Every attention component's grid, from the cache where it agrees with the spec, else computed (torch)."""
    declared = declared_masks(spec)
    path = cache_dir / f"{spec.slug}-patterns-{cache.execution_key(spec)}.json" if cache_dir is not None else None
    text = unsealed(path, cache.ENTRY_LIMIT) if path is not None else None
    if text is not None:
        cached = _from_json(text, declared)
        if cached is not None:
            return cached
    patterns = tuple(pattern_grid(p, m) for p, m in declared)
    if path is not None:
        cache.write_sealed(path, json.dumps([asdict(p) for p in patterns], sort_keys=True),
                           f"{spec.slug}-patterns-*.json", lambda name: name != path.name)
    return patterns


def _from_json(text: str, declared: tuple[tuple[str, MaskSpec], ...]) -> tuple[AttentionPattern, ...] | None:
    """The cached grids where they are the ones the spec declares now, each of its own size; else None (recomputed)."""
    try:
        patterns = tuple(_pattern(d) for d in json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None  # a damaged or edited entry is recomputed
    if tuple((p.path, p.model, p.drawn) for p in patterns) != tuple((p, m, small_sizes(m)) for p, m in declared):
        return None
    if not all(len(p.rows) == p.positions and all(len(r) == p.positions + p.entries and set(r) <= {READS, HIDDEN,
               DROPPED} for r in p.rows) for p in patterns):
        return None
    return patterns


def _pattern(d: dict[str, Any]) -> AttentionPattern:
    return AttentionPattern(str(d["path"]), MaskSpec(**d["model"]), MaskSpec(**d["drawn"]), int(d["positions"]),
                            int(d["entries"]), tuple(str(r) for r in d["rows"]))

