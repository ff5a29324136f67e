"""Derived figures: what runs per token, what a token of context costs, how much compute and memory, computed
from the spec and the ledger (never in templates), each with its formula and its definition written out.

- Active parameters: every parameter a token's forward pass reads, routed experts counted k of N; with and
  without the token embedding (a lookup reads one row, not the matrix). Multi-token-prediction modules are not
  part of the main forward pass and are left out.
- KV cache: elements cached per token per layer (MLA: the latent plus the shared rotary key; attention: K and V of
  every key/value head), the multiple against plain multi-head attention of the same width, and bytes at a
  context length, with sliding-window layers capped at their window.
- Forward FLOPs per token: 2 × the multiply-adds of the projections a token runs, plus the attention scores and
  the weighted sum over the cached context, for decode (one token at context C) and prefill (C tokens).
- Weight memory: the stored bytes (from the checkpoint ledger where one is recorded, else the storage schemes'
  prediction), and the parameters at BF16, FP8 and 4-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from .account import Ledger
from .components.attention import ScoresOptions
from .components.compressed_attention import CompressorOptions, IndexerOptions, V4AttentionOptions
from .components.mla import MLAOptions
from .components.moe import RouterOptions
from .reconcile import Reconciliation
from .spec.types import Component, ModelSpec, path_key, walk

CONTEXT = 131_072
"""The context length at which per-sequence figures are stated (128K tokens)."""
FLOP_CONTEXT = 4_096
"""The context length at which attention FLOPs are stated."""
CACHE_DTYPES = (("BF16", 2), ("FP8", 1))
WEIGHT_DTYPES = (("BF16", 2.0), ("FP8", 1.0), ("4-bit", 0.5))


@dataclass(frozen=True, slots=True)
class Figure:
    """One derived number with what it counts and how it was computed."""

    key: str
    label: str
    value: int
    formula: str
    definition: str


@dataclass(frozen=True, slots=True)
class AttentionCost:
    """Per-layer KV cache and attention FLOPs of one block kind."""

    block: str
    title: str
    """The block kind's title ("MoE transformer block")."""
    layers: int
    cache_per_token: int
    """Elements cached per token in one layer."""
    mha_per_token: int
    """The same for plain multi-head attention of the same heads and head widths."""
    window: int | None
    flops_per_key: int
    """2 × multiply-adds per query per cached key: scores and weighted values over every head."""
    ratio: int = 1
    """Positions pooled into one cached entry (DeepSeek-V4's compressed streams: 4 or 128; else 1)."""
    entry: int = 0
    """Elements of one cached entry (0: cache_per_token, one entry per position)."""
    reads: int | None = None
    """The most entries a query reads in this stream (the indexer's top-k); None: all it may see."""
    formula: str = ""
    """How cache_per_token follows from the config (empty: the family's usual formula)."""
    note: str = ""
    """What the stream is, where it is not a layer's only cache."""

    def entries(self, context: int) -> int:
        """Entries cached for a sequence of `context` positions."""
        return min(context, self.window or context) // self.ratio

    def keys_read(self, context: int) -> int:
        """Entries one query at position `context` reads."""
        return min(self.entries(context), self.reads if self.reads is not None else self.entries(context))


@dataclass(frozen=True, slots=True)
class DerivedFigures:
    """Every derived figure of one model."""

    figures: tuple[Figure, ...]
    attention: tuple[AttentionCost, ...]

    def get(self, key: str) -> Figure:
        return next(f for f in self.figures if f.key == key)


def derive(spec: ModelSpec, ledger: Ledger, stored: Reconciliation | None) -> DerivedFigures:
    """The derived figures of one model."""
    inactive, inactive_text = _inactive_experts(spec, ledger)
    mtp = sum(ledger.accounts[p].total for p, c in _paths(spec) if c.program == "mtp")
    embed = ledger.accounts["embed"].total if "embed" in ledger.accounts else 0
    total = ledger.total
    # an image encoder (Gemma 3's vision tower and projector) runs once per image, not for a text token
    vision = sum(ledger.accounts[p].total for p, c in _paths(spec) if c.program in ("vision_tower", "projector"))
    active = total - mtp - inactive - vision
    costs = _attention_costs(spec, ledger)
    matmul = active - embed  # every parameter a token multiplies (the embedding is a row lookup)
    cache = sum(c.layers * c.cache_per_token for c in costs)
    mha = sum(c.layers * c.mha_per_token for c in costs)
    at_context = sum(c.layers * (c.entry or c.cache_per_token) * c.entries(CONTEXT) for c in costs)
    decode_attn = sum(c.layers * c.flops_per_key * c.keys_read(FLOP_CONTEXT) for c in costs)
    prefill_attn = sum(c.layers * c.flops_per_key * _prefill_keys(FLOP_CONTEXT, c) for c in costs)
    mha_costs = [c for c in costs if c.mha_per_token]
    mtp_text = (" − MTP modules" if mtp else "") + (" − vision tower and projector" if vision else "")
    figures = [
        Figure("total_parameters", "Parameters stored (all)", total, "sum of the ledger's rows",
               "Every learned parameter the checkpoint stores, tied tensors once."),
        Figure("active_parameters", "Active parameters per token", active,
               f"total{mtp_text} − {inactive_text}" if inactive else f"total{mtp_text}",
               "Every parameter a token's forward pass reads: all dense weights, the router, shared experts, and the "
               "routed experts counted k of N; the embedding and the LM head included"
               + ("; multi-token-prediction modules excluded (not part of the main forward pass)" if mtp else "")
               + ("; the vision tower and projector excluded (they run once per image, not per text token)"
                  if vision else "") + "."),
        Figure("active_parameters_no_embedding", "Active parameters per token, without the token embedding",
               active - embed, "active − vocab_size × hidden_size",
               "As above, less the token embedding matrix, of which a token reads one row."),
        *(Figure(f"kv_cache_per_layer_{c.block.rsplit('.', 1)[-1]}",
                 f"KV cache per token per layer ({c.title.lower()}, {c.layers} layer{'s' if c.layers != 1 else ''})",
                 c.cache_per_token, c.formula or _cache_formula(spec, c), _cache_definition(c))
          for c in costs),
        Figure("kv_cache_per_token", "KV cache per token (all layers)", cache,
               " + ".join(f"{c.layers} × {c.cache_per_token}" for c in costs),
               "Elements cached for one token across every layer (before any window applies)."),
        Figure("kv_cache_vs_mha", "Plain multi-head attention would cache (per token)", mha,
               " + ".join(f"{c.layers} × {c.mha_per_token}" for c in mha_costs),
               "K and V of every query head at full width, for comparison."),
        *(Figure(f"kv_cache_bytes_{name.lower()}", f"KV cache at {CONTEXT:,} tokens, {name}", at_context * size,
                 f"Σ layers × per-token elements × min({CONTEXT:,}, window) × {size} byte{'s' if size > 1 else ''}"
                 + (" (a compressed stream: entry elements × ⌊tokens / ratio⌋)" if any(c.ratio > 1 for c in costs)
                    else ""),
                 f"Bytes cached for one sequence of {CONTEXT:,} tokens with {name} cache entries; sliding-window "
                 "layers keep only their window.") for name, size in CACHE_DTYPES),
        Figure("flops_decode", f"Forward FLOPs per token, decode at {FLOP_CONTEXT:,} context",
               2 * matmul + decode_attn, f"2 × {matmul:,} + attention over {FLOP_CONTEXT:,} keys",
               "Two FLOPs per multiply-add: every projection a token runs (active parameters less the embedding), "
               "plus the scores and weighted values over the cached keys."),
        Figure("flops_prefill", f"Forward FLOPs, prefill of {FLOP_CONTEXT:,} tokens",
               FLOP_CONTEXT * 2 * matmul + prefill_attn,
               f"{FLOP_CONTEXT:,} × 2 × {matmul:,} + causal attention over 1..{FLOP_CONTEXT:,} keys",
               "Every position's projections, plus causal attention where position t sees t keys (or its window)."),
        Figure("weight_bytes_stored", "Weight memory as stored", _stored_bytes(ledger, stored),
               "Σ stored tensor bytes" + (" (checkpoint ledger)" if stored is not None else " (predicted storage)"),
               "Bytes of every stored tensor: values, block scales and buffers, at their stored dtypes."),
        *(Figure(f"weight_bytes_{name.lower().replace('-', '')}", f"Weight memory at {name}", int(total * size),
                 f"total × {size:g} byte{'s' if size > 1 else ''}", f"Every parameter at {name}, with no scales.")
          for name, size in WEIGHT_DTYPES),
    ]
    return DerivedFigures(tuple(figures), tuple(costs))


def _paths(spec: ModelSpec) -> list[tuple[str, Component]]:
    return [(path_key(anc, c), c) for anc, c in walk(spec.root)]


def _inactive_experts(spec: ModelSpec, ledger: Ledger) -> tuple[int, str]:
    """Parameters of the routed experts a token does not run, and the formula, over every MoE module."""
    total, parts = 0, []
    for path, comp in _paths(spec):
        if comp.program not in ("moe", "fused_moe", "shared_and_routed_moe") or path.startswith("mtp"):
            continue
        router = next(c for c in comp.children if c.program in ("router", "hash_router"))
        o = router.options
        assert isinstance(o, RouterOptions)
        if comp.program == "moe":  # one expert component, repeated
            per_expert = ledger.accounts[f"{path}.expert"].per_instance
        else:  # all experts in one component whose every tensor has a leading experts axis
            per_expert = ledger.accounts[f"{path}.experts"].per_instance // o.experts
        instances = ledger.accounts[path].instances
        total += instances * (o.experts - o.k) * per_expert
        parts.append(f"{instances} × ({o.experts} − {o.k}) × {per_expert:,}")
    return total, " − ".join(parts)


def _attention_costs(spec: ModelSpec, ledger: Ledger) -> list[AttentionCost]:
    out = []
    for path, comp in _paths(spec):
        if comp.program == "v4_attention":
            out += _v4_streams(spec, ledger, path, comp)
        if comp.program not in ("mla", "attention", "fused_attention") or path.startswith("mtp"):
            continue
        scores = next(c for c in comp.children if c.program == "scores")
        so = scores.options
        assert isinstance(so, ScoresOptions)
        layers = ledger.accounts[path].instances
        if comp.program == "mla":
            o = comp.options
            assert isinstance(o, MLAOptions)
            cache, mha = o.kv_lora_rank + o.rope, o.heads * (o.nope + o.rope + o.v)
            per_key = 2 * o.heads * (o.nope + o.rope + o.v)
        else:
            d = int(spec.values["head_dim"])
            cache, mha, per_key = 2 * so.kv_heads * d, 2 * so.heads * d, 2 * so.heads * 2 * d
        block = path.rsplit(".", 1)[0]
        title = next(c.title for p, c in _paths(spec) if p == block)
        out.append(AttentionCost(block, title, layers, cache, mha, so.window, per_key))
    return out


def _v4_streams(spec: ModelSpec, ledger: Ledger, path: str, comp: Component) -> list[AttentionCost]:
    """DeepSeek-V4: one shared key-value vector per position in the window; with a compressor, one entry of head_dim
    per `ratio` positions, kept for the whole context; with the indexer, its own keys of index_head_dim per entry.
    Per token of context a stream costs entry / ratio elements (exact for Flash's widths; floored otherwise)."""
    o = comp.options
    assert isinstance(o, V4AttentionOptions)
    layers, block = ledger.accounts[path].instances, path.rsplit(".", 1)[0]
    title = next(c.title for p, c in _paths(spec) if p == block)
    per_key = 2 * o.heads * 2 * o.head_dim  # scores and the weighted sum, every head, over one shared vector
    out = [AttentionCost(f"{block}_window", f"{title}: sliding window", layers, o.head_dim, 2 * o.heads * o.head_dim,
                         o.window, per_key, formula="head_dim (one vector is the key and the value)",
                         note=f"The window branch: one {o.head_dim}-element vector per position, the last {o.window:,} "
                              "positions kept.")]
    compressor = next((c for c in comp.children if c.key == "compressor"), None)
    if compressor is None:
        return out
    co = compressor.options
    assert isinstance(co, CompressorOptions)
    m = co.ratio
    index = next((c.options for c in compressor.children if isinstance(c.options, IndexerOptions)), None)
    out.append(AttentionCost(f"{block}_compressed", f"{title}: compressed stream", layers, o.head_dim // m, 0, None,
                             per_key, ratio=m, entry=o.head_dim, reads=index.topk if index else None,
                             formula=f"head_dim / {m}", note=f"One {o.head_dim}-element entry per {m} positions, kept "
                             "for the whole context" + (f"; a query reads at most {index.topk:,} of them (the "
                                                        "indexer's top-k)." if index else "; a query reads all of them.")))
    if index is not None:
        out.append(AttentionCost(f"{block}_indexer", f"{title}: indexer keys", layers, index.head_dim // m, 0, None,
                                 2 * index.heads * index.head_dim, ratio=m, entry=index.head_dim,
                                 formula=f"index_head_dim / {m}", note=f"The lightning indexer's own "
                                 f"{index.head_dim}-element key per {m} positions, scored for every query."))
    return out


def _cache_definition(c: AttentionCost) -> str:
    if not c.mha_per_token:  # a compressed stream beside a layer's window
        return f"Elements one layer caches per token of context in this stream. {c.note}"
    return ("Elements one layer caches for one token; plain multi-head attention of the same heads would cache "
            f"{c.mha_per_token:,} ({c.mha_per_token / c.cache_per_token:.3g}×)."
            + (f" This layer keeps only its last {c.window:,} tokens." if c.window else ""))


def _prefill_keys(context: int, c: AttentionCost) -> int:
    """Entries the positions 1..C of a causal prefill read in one stream."""
    if c.ratio == 1 and c.reads is None:
        return _keys_seen(context, c.window)
    return sum(min(t // c.ratio, c.reads if c.reads is not None else t) for t in range(1, context + 1))


def _cache_formula(spec: ModelSpec, c: AttentionCost) -> str:
    if "kv_lora_rank" in spec.values:
        return "kv_lora_rank + qk_rope_head_dim"
    if "num_key_value_heads" not in spec.values:  # multi-head attention: every head keeps its own keys and values
        return "2 × num_attention_heads × head_dim"
    return "2 × num_key_value_heads × head_dim"


def _keys_seen(context: int, window: int | None) -> int:
    """Σ_{t=1..C} min(t, W): the keys every position of a causal prefill attends to."""
    if window is None or window >= context:
        return context * (context + 1) // 2
    return window * (window + 1) // 2 + (context - window) * window


def _stored_bytes(ledger: Ledger, stored: Reconciliation | None) -> int:
    if stored is not None:
        return sum(t.bytes for t in stored.totals)
    return sum(ta.spec.count * st.nbytes for acc in ledger.accounts.values() for ta in acc.tensors
               for st in ta.stored if st.role != "buffer" and not ta.spec.tied_to)  # a tied head is stored once


# --------------------------------------------------------------------------------------- published claims

@dataclass(frozen=True, slots=True)
class ClaimMatch:
    """A lab's published "active parameters" figure and the definition that reproduces it."""

    claim: str
    """As published, e.g. "32B"."""
    source: str
    matched: Figure | None
    """The first derived figure that rounds to the claim at its precision, or None."""


def parse_claim(claim: str) -> tuple[float, float]:
    """"32B" -> (32e9, 1e9): the value and the unit of its last digit; "12.9B" -> (12.9e9, 1e8)."""
    number = claim.strip().rstrip("BbMm")
    scale = 1e9 if claim.strip()[-1:] in "Bb" else 1e6
    decimals = len(number.split(".", 1)[1]) if "." in number else 0
    return float(number) * scale, scale / 10 ** decimals


def match_claim(figures: DerivedFigures, claim: str, source: str) -> ClaimMatch:
    """The definition (with or without the embedding) whose value rounds to the claim."""
    value, unit = parse_claim(claim)
    for key in ("active_parameters", "active_parameters_no_embedding"):
        figure = figures.get(key)
        if abs(figure.value - value) <= unit / 2:
            return ClaimMatch(claim, source, figure)
    return ClaimMatch(claim, source, None)
