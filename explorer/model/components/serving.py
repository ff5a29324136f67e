"""What one layer kind keeps while serving, as data: the elements it caches per token of context (or the fixed
state of a recurrent layer), what caps them (a window, a chunk, a compression ratio, a top-k read), and what a query
costs per key it reads, each with its formula in config keys.

Every component module that owns a layer kind registers how its components answer (`@layer_memory("mla")`), as
`base.program` registers their torch programs; `explorer/figures/model_figures.py` walks a model's components and asks the
registry, so it names no program. The arithmetic on these entries (bytes at a context, keys a query reads) lives
here too, once: the derived figures, the calculator's table and the tests all call it, and the page's script mirrors
exactly these functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from explorer.spec.types import Component


@dataclass(frozen=True, slots=True)
class StatePart:
    """One tensor a recurrent layer carries from token to token, the same size at any context length."""

    name: str
    """"SSM state", "conv state"."""
    elements: int
    """Numbers in it, for one sequence and one layer."""
    dtype: str
    """The dtype it is cached in ("float32")."""
    bytes: int
    """Bytes per number at that dtype."""
    formula: str
    """`elements` in config keys."""
    columns: int = 0
    """A conv state: the kernel columns it holds (elements = channels × columns; the reference keeps the full
    kernel, vLLM and SGLang keep kernel − 1); 0 for any other part."""


@dataclass(frozen=True, slots=True)
class LayerKind:
    """What one kind of layer (or one stream of a layer, for DeepSeek-V4) keeps and reads per sequence."""

    per_token: int
    """Elements cached per token of context (a compressed stream: entry / ratio, floored); 0 for a recurrent kind."""
    formula: str
    """`per_token` (or the fixed state) in config keys."""
    values: int = 0
    """Elements of V within `per_token`, where K and V are cached apart (an engine may widen V: llama.cpp without
    flash attention); 0 where no V is cached apart (MLA's latent, a recurrent kind)."""
    flops_per_key: int = 0
    """2 × multiply-adds one query spends per cached entry it reads: scores and the weighted sum, every head."""
    mha_per_token: int = 0
    """Plain multi-head attention of the same heads and widths would cache this (0: no comparison applies)."""
    window: int | None = None
    """A sliding window: the cache keeps the last `window` positions."""
    chunk: int | None = None
    """Chunked attention: a query sees its own chunk, the cache keeps at most one chunk."""
    ratio: int = 1
    """Positions pooled into one cached entry (DeepSeek-V4's compressed streams: 4 or 128)."""
    entry: int = 0
    """Elements of one cached entry (0: `per_token`, one entry per position)."""
    topk: int | None = None
    """A query reads at most this many entries (sparse attention's index_topk)."""
    index_flops_per_key: int = 0
    """2 × multiply-adds per query per cached entry of a lightning indexer, which scores every entry."""
    state: tuple[StatePart, ...] = ()
    """The fixed state of a recurrent layer."""
    update_flops: int = 0
    """2 × multiply-adds per token of a recurrent layer's one-token state update, beside its projections."""
    update_formula: str = ""
    """`update_flops` in config keys, with the terms it counts (empty where the figure states its own)."""
    note: str = ""
    """What the cache is made of, where it has parts."""
    by_kind: bool = False
    """The kind has a shape of its own (a per-layer attention shape, a stream), so its bytes are stated apart."""
    stream: str = ""
    """A layer's stream key where one layer holds several ("window", "compressed", "indexer"); "" otherwise."""
    stream_title: str = ""
    """The stream's title ("sliding window")."""
    block: str = ""
    """The block's path (filled by the stage that walks the model)."""
    title: str = ""
    """The block kind's title, with the stream's ("MoE transformer block: sliding window")."""
    layers: int = 0
    """Layers of this kind in the model (filled by the stage)."""
    absorbed_flops_per_key: int = 0
    """MLA only: `flops_per_key` in the absorbed form, which the cached latent implies (W_UK folded into the query,
    W_UV into the output: each head scores the latent and the rotary key and sums the latent); 0 for a kind with
    one form. `flops_per_key` is then the unabsorbed form: per-head keys and values."""
    decode_forms: tuple[str, ...] = ()
    """MLA only: how `flops_per_key` and `absorbed_flops_per_key` follow from the config, in keys and in numbers."""
    pending: int = 0
    """A compressed stream: elements held per position not yet pooled into an entry (the compressor's projected
    values and gates, waiting for `ratio` positions): context mod ratio positions are pending."""
    indexer: int = 0
    """DeepSeek Sparse Attention: the elements of the indexer's key within `per_token` (an engine caches them apart,
    at a dtype of their own); 0 for every other kind."""
    overlap: int = 0
    """A compressed stream with overlapping windows: elements carried from the last pooled window to the next (its
    first half of values and gates), held once one entry has been pooled."""

    @property
    def key(self) -> str:
        """"moe", "block_window": the block's last path segment and the stream."""
        tail = self.block.rsplit(".", 1)[-1]
        return f"{tail}_{self.stream}" if self.stream else tail

    @property
    def cache_per_token(self) -> int:
        return self.per_token

    @property
    def entry_elements(self) -> int:
        return self.entry or self.per_token

    @property
    def state_bytes(self) -> int:
        """Bytes of one layer's fixed state, at the dtypes its parts are cached in."""
        return sum(p.elements * p.bytes for p in self.state)

    def entries(self, context: int) -> int:
        """Entries cached for a sequence of `context` positions: all, the window's, one chunk's, or one per ratio."""
        if not self.per_token and not self.entry:
            return 0
        return min(context, self.window or self.chunk or context) // self.ratio

    def keys_read(self, context: int) -> int:
        """Entries the query at position `context` reads: its own chunk's part, or every entry up to the top-k cap."""
        if self.chunk:
            return (context - 1) % self.chunk + 1
        return min(self.entries(context), self.topk or self.entries(context))

    def keys_read_prefill(self, context: int) -> int:
        """Σ over positions t = 1..C of the entries position t reads (a causal prefill)."""
        if not self.per_token and not self.entry:
            return 0
        if self.chunk:
            full, rest = divmod(context, self.chunk)
            return full * self.chunk * (self.chunk + 1) // 2 + rest * (rest + 1) // 2
        if self.ratio == 1:
            return triangle_capped(context, self.window or self.topk)
        return pooled_capped(context, self.ratio, self.topk)

    def keys_scored_prefill(self, context: int) -> int:
        """Σ_t of the entries a lightning indexer scores at position t (all cached ones)."""
        if self.ratio == 1:
            return triangle_capped(context, self.window)
        return pooled_capped(context, self.ratio, None)

    @property
    def grows(self) -> bool:
        """Whether the kind's cache grows with every added token (no window or chunk caps it, no fixed state)."""
        return bool(self.per_token or self.entry) and not (self.window or self.chunk)

    def buffered(self, context: int) -> int:
        """Elements one layer holds beside its entries at `context`: the positions waiting to be pooled and the
        overlap carried between pooled windows (a compressed stream; 0 for every other kind)."""
        if self.ratio == 1:
            return 0
        return self.pending * (context % self.ratio) + (self.overlap if context >= self.ratio else 0)

    def cache_elements(self, context: int) -> int:
        """Elements all layers of this kind cache for one sequence of `context` positions (not the fixed state)."""
        return self.layers * (self.entry_elements * self.entries(context) + self.buffered(context))

    def engine_elements(self, context: int, block: int) -> int:
        """The same, with each layer's entries rounded up to whole blocks of `block` entries (a paged engine)."""
        entries = self.entries(context)
        return self.layers * (self.entry_elements * (-(-entries // block) * block) + self.buffered(context))

    def fixed_elements(self, maximum: int) -> int:
        """Elements all layers of this kind hold once full that do not grow with further tokens: a window's or a
        chunk's entries (at most `maximum`), a compressed stream's overlap and its largest pending buffer."""
        if self.window or self.chunk:
            return self.cache_elements(maximum)
        if self.ratio > 1:
            return self.layers * (self.overlap + self.pending * (self.ratio - 1))
        return 0


def triangle_capped(context: int, cap: int | None) -> int:
    """Σ_{t=1..C} min(t, cap): the keys every position of a causal prefill reads."""
    if cap is None or cap >= context:
        return context * (context + 1) // 2
    return cap * (cap + 1) // 2 + (context - cap) * cap


def pooled_capped(context: int, ratio: int, cap: int | None) -> int:
    """Σ_{t=1..C} min(⌊t / ratio⌋, cap): the entries of a compressed stream position t reads (closed form)."""
    def pooled(n: int) -> int:  # Σ_{t=1..n} ⌊t / ratio⌋
        q, r = divmod(n, ratio)
        return ratio * q * (q - 1) // 2 + q * (r + 1)
    if cap is None or context < cap * ratio:
        return pooled(context)
    return pooled(cap * ratio - 1) + cap * (context - cap * ratio + 1)


MemoryEntry = Callable[[Component, Mapping[str, Any]], tuple[LayerKind, ...]]
"""(component, the config's values) -> the layer kinds one such component is (several streams, or one)."""

LAYER_MEMORY: dict[str, MemoryEntry] = {}
"""Program name -> what a component of that program keeps while serving."""


def layer_memory(name: str) -> Callable[[MemoryEntry], MemoryEntry]:
    """Register what components whose `program` is `name` cache per token or hold as fixed state."""
    def register(fn: MemoryEntry) -> MemoryEntry:
        LAYER_MEMORY[name] = fn
        return fn
    return register


def kv_heads_formula(values: Mapping[str, Any]) -> str:
    """Plain attention caches K and V of each key/value head; without num_key_value_heads every head has its own."""
    if "num_key_value_heads" not in values:
        return "2 × num_attention_heads × head_dim"
    return "2 × num_key_value_heads × head_dim"


def scores_child(comp: Component) -> Any:
    """The options of an attention's scores step (heads, kv_heads, window)."""
    return next(c for c in comp.children if c.program == "scores").options
