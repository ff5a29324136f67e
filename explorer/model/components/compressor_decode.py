"""The decode path of DeepSeek-V4's compressors: the pooling run one position at a time, as generation runs it,
carrying what a cache must hold between steps, and checked against the reference's own cache layers.

Between two steps a compressor holds (transformers' DeepseekV4HCACache and DeepseekV4CSACache, per compressor and,
for compressed sparse attention, per indexer):
- the entries emitted so far, one per closed window of m positions;
- the pending projections of the positions since the last closed window (fewer than m; their gate logits without
  the position bias, which is added when the window closes);
- with overlapping windows (ratio 4 and the indexer), the first series of the last closed window, keys and biased
  gate logits, which the next window's entry pools beside its own second series.
The batched form (compressed_attention.compress) pools every window of a whole sequence at once; this form must
give the same entries and leave the state the reference's cache holds after a prefill and single-token steps. The
serving figures count the same buffers (compressed_attention_memory.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

from explorer.model.components.base import Run, options, reference_call, relative_module
from explorer.model.components.compressed_attention import CompressorOptions, IndexerOptions, angles, rotate_tail
from explorer.model.components.decode_check import prefill_length
from explorer.model.components.norms import NormOptions, apply_norm
from explorer.spec.types import Component

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch


@dataclass(frozen=True, slots=True)
class PoolState:
    """What one compressor's cache holds after some positions."""

    entries: torch.Tensor
    """[B, n, width]: one per closed window, normalised and rotated at its window's first position."""
    pending_kv: torch.Tensor
    """[B, T mod m, s·width]: the projections of the positions since the last closed window."""
    pending_gate: torch.Tensor
    """[B, T mod m, s·width]: their gate logits, before the position bias."""
    overlap_kv: torch.Tensor | None
    """[B, m, width]: the last closed window's first series (overlapping windows only)."""
    overlap_gate: torch.Tensor | None
    """[B, m, width]: its gate logits, with the position bias."""

    def shapes(self) -> tuple[tuple[int, ...] | None, ...]:
        return tuple(None if p is None else tuple(p.shape) for p in
                     (self.entries, self.pending_kv, self.pending_gate, self.overlap_kv, self.overlap_gate))

    def flat(self) -> torch.Tensor:
        parts = [self.entries, self.pending_kv, self.pending_gate]
        parts += [p for p in (self.overlap_kv, self.overlap_gate) if p is not None]
        return torch.cat([p.float().flatten() for p in parts])


def first_series(kv: torch.Tensor, gate: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The series a closed window hands to the next one: the first `width` features of each (C^a, Z^a + B^a)."""
    return kv[..., :width], gate[..., :width]


def close_window(run: Run, o: CompressorOptions, kv: torch.Tensor, gate: torch.Tensor,
                 prior: tuple[torch.Tensor, torch.Tensor] | None, index: int) -> torch.Tensor:
    """The entry [B, width] of one closed window (kv, gate [B, m, s·width], the gate biased already): with overlap,
    the previous window's first series beside this one's second (weight zero where there is no previous window)."""
    w = o.width
    if o.overlap:
        before_kv, before_gate = prior if prior is not None else (
            torch.zeros_like(kv[..., :w]), torch.full_like(gate[..., :w], float("-inf")))
        kv, gate = torch.cat([before_kv, kv[..., w:]], dim=1), torch.cat([before_gate, gate[..., w:]], dim=1)
    pooled = (kv * gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)).sum(dim=1)
    normed = apply_norm(Run(run.weights, {}, "", run.module), "normed", pooled, NormOptions("rms", o.eps), "kv_norm.")
    position = torch.tensor([index * o.ratio], device=kv.device)
    return rotate_tail(normed[:, None], angles(o.rope, position))[:, 0]


def pool_token_by_token(run: Run, o: CompressorOptions, x: torch.Tensor) -> PoolState:
    """Feed x [B, T, d] one position at a time; `run` holds the compressor's weights (kv_proj, gate_proj,
    position_bias, kv_norm)."""
    W_kv, W_z, bias = run.w("kv_proj.weight"), run.w("gate_proj.weight"), run.w("position_bias")
    pending_kv: list[torch.Tensor] = []
    pending_gate: list[torch.Tensor] = []
    entries: list[torch.Tensor] = []
    prior = None
    for t in range(x.shape[1]):
        pending_kv.append(F.linear(x[:, t], W_kv))
        pending_gate.append(F.linear(x[:, t], W_z))
        if len(pending_kv) < o.ratio:
            continue
        kv, gate = torch.stack(pending_kv, dim=1), torch.stack(pending_gate, dim=1) + bias
        pending_kv, pending_gate = [], []
        entries.append(close_window(run, o, kv, gate, prior, len(entries)))
        if o.overlap:
            prior = first_series(kv, gate, o.width)
    Bn, s = x.shape[0], 2 if o.overlap else 1
    empty = x.new_zeros((Bn, 0, s * o.width))
    return PoolState(torch.stack(entries, dim=1) if entries else x.new_zeros((Bn, 0, o.width)),
                     torch.stack(pending_kv, dim=1) if pending_kv else empty,
                     torch.stack(pending_gate, dim=1) if pending_gate else empty,
                     *(prior if prior is not None else (None, None)))


@dataclass(frozen=True, slots=True)
class ReferenceDecode:
    """The reference compressor's cache layer after a prefill and single-token calls."""

    layer: object
    prefilled: int
    positions: int

    def state(self, name: str, overlap: bool) -> PoolState:
        """The cache's state of entry `name` ("compressor", or "indexer" for the CSA indexer's keys)."""
        layer = self.layer
        over = (layer.overlap_kv[name], layer.overlap_gate[name]) if overlap else (None, None)  # type: ignore[attr-defined]
        return PoolState(layer.compressed_kv[name], layer.buffer_kv[name],  # type: ignore[attr-defined]
                         layer.buffer_gate[name], *over)  # type: ignore[attr-defined]

    def detail(self, names: str) -> str:
        return (f"decode path run against the reference's own cache layer ({type(self.layer).__name__}: "
                f"{self.prefilled} positions prefilled, then {self.positions - self.prefilled} fed one at a time): "
                f"our token-by-token pooling gives the same {names} and leaves the state the cache holds (the "
                "pending projections, and with overlapping windows the last window's first series)")


def reference_decode(ref, model, x: torch.Tensor, c_q: torch.Tensor | None) -> ReferenceDecode:
    """Run the reference compressor `ref` through a cache layer of its own kind, as DeepseekV4Model's cache builds
    one per layer (DeepseekV4CSACache for the compressor with an indexer, DeepseekV4HCACache without): a prefill of
    the first positions, then one position at a time, each call given its absolute positions."""
    module = sys.modules[type(ref).__module__]
    kind = "CSA" if hasattr(ref, "indexer") else "HCA"
    layer = getattr(module, f"DeepseekV4{kind}Cache")(model.config)
    cache = SimpleNamespace(layers=[layer])  # the compressors read past_key_values.layers[layer_idx] alone
    Bn, Tn = x.shape[:2]
    P = prefill_length(Tn)
    spans = ([(0, P)] if P else []) + [(t, t + 1) for t in range(P, Tn)]
    for start, end in spans:
        positions = torch.arange(start, end)[None].expand(Bn, -1)
        ref(x[:, start:end], None if c_q is None else c_q[:, start:end], positions, cache, 0)
    return ReferenceDecode(layer, P, Tn)


def pooled_series(comp: Component, run: Run) -> tuple[tuple[str, Run, CompressorOptions], ...]:
    """Each series of entries a compressor component pools, named as the reference's cache names it: its own, and
    its indexer's keys where it has an indexer; with the run holding that series' weights."""
    pool = comp.child("pool")
    series = [("compressor", run.child(relative_module(comp, pool)), options(pool, CompressorOptions))]
    if len(comp.children) > 1:
        index = comp.child("indexer")
        series.append(("indexer", run.child(relative_module(comp, index)), options(index, IndexerOptions).compressor))
    return tuple(series)


@reference_call("v4_compressor")
def call_compressor(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference called without a cache returns the entries [B, 1, n, d] and an additive bias over them
    (entries and visibility, against our batched form); then the reference run through its cache layer one
    position at a time, against our token-by-token form's entries and state."""
    x, c_q = inputs[0], (inputs[1] if len(inputs) > 1 else None)  # the HCA compressor takes q_residual unread
    positions = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    entries, bias = ref(x, c_q, positions, None, 0)
    decoded = reference_decode(ref, model, x, c_q)
    series = pooled_series(comp, run)
    mine = [ours.flatten(), run.recorded["c-visible"].float().flatten()]
    theirs = [entries.flatten(), (bias[:, 0] == 0).float().flatten()]
    for name, series_run, o in series:
        ours_state, cache_state = pool_token_by_token(series_run, o, x), decoded.state(name, o.overlap)
        if ours_state.shapes() != cache_state.shapes():  # a wrong state is a failed check, not a shapeless Δ
            raise ValueError(f"decode check of the {name}'s pooling: our state {ours_state.shapes()} against the "
                             f"cache's {cache_state.shapes()}")
        mine.append(ours_state.flat())
        theirs.append(cache_state.flat())
    names = " and ".join(("entries", "indexer keys")[:len(series)])
    return torch.cat(mine), torch.cat(theirs), \
        f"{ours.shape[1]} entries per sequence and which queries see them; " + decoded.detail(names)


__all__ = ["call_compressor", "pooled_series", "PoolState", "ReferenceDecode", "close_window", "first_series", "pool_token_by_token",
           "reference_decode"]
