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
from .components import keys_as_values
from .components.attention import ScoresOptions
from .components.compressed_attention import CompressorOptions, V4AttentionOptions
from .components.compressed_attention import IndexerOptions as V4IndexerOptions
from .components.dsa import IndexerOptions
from .components.gated_deltanet import DeltaNetOptions
from .components.layer_attention import LayerAttentionOptions
from .components.mla import MLAOptions
from .components.shaped_attention import ShapedAttentionOptions
from .reconcile import Reconciliation
from .spec.types import Component, ModelSpec, path_key, walk

CONTEXT = 131_072
"""The context length at which per-sequence figures are stated (128K tokens)."""
FLOP_CONTEXT = 4_096
"""The context length at which attention FLOPs are stated."""
CACHE_DTYPES = (("BF16", 2), ("FP8", 1))
VISION_PROGRAMS = ("vision_tower", "projector", "gemma4_vision_tower", "gemma4_vision_embedder", "moonvit_tower",
                   "kimi_projector", "qwen_vision_tower")
"""Image encoders and their projectors (Gemma 3's SigLIP, Gemma 4's, Kimi K2.5's MoonViT): they run once per
image, not for a text token."""
ROUTED = {"moe": "expert", "fused_moe": "experts", "sigmoid_moe": "experts", "moe_beside_mlp": "experts",
          "shared_and_routed_moe": "experts", "relu2_moe": "expert"}
"""MoE programs -> the key of their routed experts (one expert repeated, or all experts in one component)."""
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
    attended: int | None = None
    """Keys a query attends to at most, whatever the context (DeepSeek Sparse Attention's index_topk); None: all of
    them (or its window)."""
    index_flops_per_key: int = 0
    """2 × multiply-adds per query per cached key of a lightning indexer, which scores every key."""
    note: str = ""
    """What the per-token cache is made of, where it has parts."""
    chunk: int | None = None
    """Chunked attention: the cache holds at most one chunk, and position t sees the keys of its own chunk."""
    formula: str = ""
    """cache_per_token as a formula in config keys where the attention states its own (shaped attention)."""
    ratio: int = 1
    """Positions pooled into one cached entry (DeepSeek-V4's compressed streams: 4 or 128; else 1)."""
    entry: int = 0
    """Elements of one cached entry (0: cache_per_token, one entry per position)."""

    def entries(self, context: int) -> int:
        """Entries cached for a sequence of `context` positions: all, the window's, one chunk's, or one per ratio."""
        return min(context, self.window or self.chunk or context) // self.ratio

    def keys_read(self, context: int) -> int:
        """Entries the query at position `context` reads: its own chunk's part, or every entry up to the top-k cap
        of a sparse attention (`attended`)."""
        if self.chunk:
            return (context - 1) % self.chunk + 1
        return min(self.entries(context), self.attended or self.entries(context))


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
    vision = sum(ledger.accounts[p].total for p, c in _paths(spec) if c.program in VISION_PROGRAMS)
    active = total - mtp - inactive - vision
    costs = _attention_costs(spec, ledger)
    matmul = active - embed  # every parameter a token multiplies (the embedding is a row lookup)
    cache = sum(c.layers * c.cache_per_token for c in costs)
    mha = sum(c.layers * c.mha_per_token for c in costs)
    at_context = sum(c.layers * (c.entry or c.cache_per_token) * c.entries(CONTEXT) for c in costs)
    decode_attn = sum(c.layers * (c.flops_per_key * c.keys_read(FLOP_CONTEXT)
                                  + c.index_flops_per_key * c.entries(FLOP_CONTEXT)) for c in costs)
    prefill_attn = sum(c.layers * (c.flops_per_key * _prefill_keys(FLOP_CONTEXT, c)
                                   + c.index_flops_per_key * _keys_seen(FLOP_CONTEXT, c.window)) for c in costs)
    mha_costs = [c for c in costs if c.mha_per_token]
    no_embed = _no_embedding_convention(spec)
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
        Figure("active_parameters_no_embedding", no_embed[0], active - embed, no_embed[1], no_embed[2]),
        *(Figure(f"kv_cache_per_layer_{c.block.rsplit('.', 1)[-1]}",
                 f"KV cache per token per layer ({c.title.lower()}, {c.layers} layer{'s' if c.layers != 1 else ''})",
                 c.cache_per_token, c.formula or _cache_formula(spec, c), _cache_definition(c))
          for c in costs),
        *_context_by_kind(costs),
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
                 "layers keep only their window" + (", chunked layers at most one chunk" if any(c.chunk for c in costs)
                                                    else "") + ".") for name, size in CACHE_DTYPES),
        *recurrent_state_figures(spec, ledger, costs),
        Figure("flops_decode", f"Forward FLOPs per token, decode at {FLOP_CONTEXT:,} context",
               2 * matmul + decode_attn, f"2 × {matmul:,} + attention over {FLOP_CONTEXT:,} keys" + _sparse_text(costs),
               "Two FLOPs per multiply-add: every projection a token runs (active parameters less the embedding), "
               "plus the scores and weighted values over the cached keys."),
        Figure("flops_prefill", f"Forward FLOPs, prefill of {FLOP_CONTEXT:,} tokens",
               FLOP_CONTEXT * 2 * matmul + prefill_attn,
               f"{FLOP_CONTEXT:,} × 2 × {matmul:,} + causal attention over 1..{FLOP_CONTEXT:,} keys" + _sparse_text(costs),
               "Every position's projections, plus causal attention where position t sees t keys (or its window)."),
        Figure("weight_bytes_stored", "Weight memory as stored", _stored_bytes(ledger, stored),
               "Σ stored tensor bytes" + (" (checkpoint ledger)" if stored is not None else " (predicted storage)"),
               "Bytes of every stored tensor: values, block scales and buffers, at their stored dtypes."),
        *(Figure(f"weight_bytes_{name.lower().replace('-', '')}", f"Weight memory at {name}", int(total * size),
                 f"total × {size:g} byte{'s' if size > 1 else ''}", f"Every parameter at {name}, with no scales.")
          for name, size in WEIGHT_DTYPES),
    ]
    figures += _recurrent_state_figures(spec, ledger, costs)
    return DerivedFigures(tuple(figures), tuple(costs))


MEMORY_CONTEXTS = (("4K", 4_096), ("128K", CONTEXT))
"""Context lengths at which a hybrid model's whole sequence memory is stated (and its maximum context)."""


def _recurrent_state_figures(spec: ModelSpec, ledger: Ledger, costs: list[AttentionCost]) -> list[Figure]:
    """Gated DeltaNet layers keep a fixed state (conv and recurrent) whatever the context; attention layers' KV
    cache grows with it. Per layer kind, exactly, and the sequence's total at 4K, 128K and the maximum context."""
    layers = [(c, ledger.accounts[path].instances) for path, c in _paths(spec) if c.program == "gated_deltanet"]
    if not layers:
        return []
    out, fixed, parts = [], 0, []
    for comp, n in layers:
        o = comp.options
        assert isinstance(o, DeltaNetOptions)
        per_layer = o.state_elements * o.state_bytes + o.conv_elements * o.conv_bytes
        fixed += n * per_layer
        parts.append(f"{n} × {per_layer:,}")
        out += [
            Figure("recurrent_state_per_layer", f"Recurrent state per Gated DeltaNet layer ({n} layers)",
                   o.state_elements, "linear_num_value_heads × linear_key_head_dim × linear_value_head_dim",
                   f"Numbers in one layer's delta-rule state ({o.v_heads} × {o.d_k} × {o.d_v}), held in "
                   f"{o.state_dtype} ({o.state_bytes} bytes each): {o.state_elements * o.state_bytes:,} bytes. It "
                   "does not grow with the context."),
            Figure("conv_state_per_layer", f"Conv state per Gated DeltaNet layer ({n} layers)", o.conv_elements,
                   "(2 × linear_num_key_heads × linear_key_head_dim + linear_num_value_heads × linear_value_head_dim)"
                   " × (linear_conv_kernel_dim − 1)",
                   f"The last {o.conv_kernel - 1} inputs of each of the {o.conv_dim:,} convolution channels, in "
                   f"{o.conv_dtype} ({o.conv_bytes} bytes each): {o.conv_elements * o.conv_bytes:,} bytes. It does "
                   "not grow with the context."),
        ]
    out.append(Figure("recurrent_state_bytes", "Fixed state of all Gated DeltaNet layers (bytes per sequence)", fixed,
                      " + ".join(parts) + " (recurrent state bytes + conv state bytes, per layer)",
                      "Bytes every sequence holds in its linear-attention layers, the same at any context length."))
    kv_per_token = sum(c.layers * c.cache_per_token for c in costs) * 2
    maximum = int(getattr(getattr(spec.config, "text_config", spec.config), "max_position_embeddings", CONTEXT))
    for name, n_tokens in (*MEMORY_CONTEXTS, (f"{maximum:,} (maximum)", maximum)):
        out.append(Figure(f"sequence_memory_{n_tokens}", f"Cache of one sequence at {name} tokens (BF16 KV)",
                          fixed + kv_per_token * n_tokens,
                          f"{fixed:,} fixed + {kv_per_token:,} × {n_tokens:,} (KV bytes per token × tokens)",
                          "The Gated DeltaNet layers' fixed state plus the full-attention layers' KV cache, which "
                          "alone grows with the context."))
    return out


def _no_embedding_convention(spec: ModelSpec) -> tuple[str, str, str]:
    """Label, formula and definition of "active without the embedding": what it subtracts, written out (GPT-2's
    embedding account holds the position table too, and a tied LM head is the same matrix as the embedding)."""
    embed = next((c for c in spec.root.children if c.key == "embed"), None)
    positions = embed is not None and any(c.key == "wpe" or "position" in c.title.lower() for c in embed.children)
    tied = any(t.tied_to for _, c in walk(spec.root) if c.key == "lm_head" for t in c.tensors)
    if positions:
        label = "Active parameters per token, without the token and position embeddings"
        formula = "active − (vocab_size + max_position_embeddings) × hidden_size"
        text = ("As above, less the token embedding matrix and the learned position table: a token reads one row of "
                "each (a lookup, not a multiply)")
    else:
        label = "Active parameters per token, without the token embedding"
        formula = "active − vocab_size × hidden_size"
        text = "As above, less the token embedding matrix, of which a token reads one row"
    text += ("; the LM head is tied to that matrix, so its multiply leaves with it" if tied else
             "; the LM head, a matrix of its own, stays counted")
    return label, formula, text + "."


def _paths(spec: ModelSpec) -> list[tuple[str, Component]]:
    return [(path_key(anc, c), c) for anc, c in walk(spec.root)]


def _inactive_experts(spec: ModelSpec, ledger: Ledger) -> tuple[int, str]:
    """Parameters of the routed experts a token does not run, and the formula, over every MoE module."""
    total, parts = 0, []
    for path, comp in _paths(spec):
        if comp.program not in ROUTED or path.startswith("mtp"):
            continue
        o = next(c for c in comp.children if c.key == "router").options
        assert hasattr(o, "experts") and hasattr(o, "k")  # RouterOptions or a library router's own options
        if ROUTED[comp.program] == "expert":  # one expert component, repeated
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
        if comp.program == "layer_attention" and not path.startswith("mtp"):
            out.append(_layer_cost(spec, ledger, path, comp))
            continue
        if comp.program == "v4_attention":
            out += _v4_streams(spec, ledger, path, comp)
            continue
        if comp.program not in ("mla", "dsa", "attention", "fused_attention", "shaped_attention",
                                "nope_attention", "gated_attention") or path.startswith("mtp"):
            continue
        scores = next(c for c in comp.children if c.program == "scores")
        so = scores.options
        assert isinstance(so, ScoresOptions)
        layers = ledger.accounts[path].instances
        if comp.program == "dsa":  # MLA's latent and rotary key, plus the indexer's own key
            out.append(_dsa_cost(comp, path, layers, next(c.title for p, c in _paths(spec) if p == path.rsplit(".", 1)[0])))
            continue
        formula = ""
        if comp.program == "shaped_attention":  # head counts and widths of this layer kind's own
            a = comp.options
            assert isinstance(a, ShapedAttentionOptions)
            cache, mha = a.cache_per_token, a.heads * (a.qk_head_dim + a.v_head_dim)
            per_key, formula = 2 * a.heads * (a.qk_head_dim + a.v_head_dim), a.cache_formula
        elif comp.program == "mla":
            o = comp.options
            assert isinstance(o, MLAOptions)
            cache, mha = o.kv_lora_rank + o.rope, o.heads * (o.nope + o.rope + o.v)
            per_key = 2 * o.heads * (o.nope + o.rope + o.v)
        else:
            d = int(spec.values["head_dim"])
            cache, mha, per_key = 2 * so.kv_heads * d, 2 * so.heads * d, 2 * so.heads * 2 * d
        block = path.rsplit(".", 1)[0]
        title = next(c.title for p, c in _paths(spec) if p == block)
        out.append(AttentionCost(block, title, layers, cache, mha, so.window, per_key, formula=formula))
    return out


def _dsa_cost(comp: Component, path: str, layers: int, title: str) -> AttentionCost:
    """DeepSeek Sparse Attention: the cache holds MLA's latent and rotary key and the indexer's key for every token;
    the indexer scores every cached key, MLA attends to at most index_topk of them."""
    o, io = comp.options, comp.child("indexer").options
    assert isinstance(o, MLAOptions) and isinstance(io, IndexerOptions)
    mla_cache = o.kv_lora_rank + o.rope
    return AttentionCost(
        path.rsplit(".", 1)[0], title, layers, mla_cache + io.head_dim, o.heads * (o.nope + o.rope + o.v), None,
        2 * o.heads * (o.nope + o.rope + o.v), attended=io.topk, index_flops_per_key=2 * io.heads * (io.head_dim + 1),
        note=f"the MLA latent and rotary key, {mla_cache}, and the indexer's key, {io.head_dim}; attention reads at "
             f"most {io.topk:,} cached tokens per query, the indexer scores all of them")


def _layer_cost(spec: ModelSpec, ledger: Ledger, path: str, comp: Component) -> AttentionCost:
    """A layer kind with its own attention shape: K and V of each key/value head at its own width, or K alone where
    the keys double as values (the values follow from the cached keys' projection: one tensor, not two)."""
    o = comp.options
    assert isinstance(o, LayerAttentionOptions)
    s = o.shape
    tensors = keys_as_values.cache_tensors(o.keys_as_values)
    block = path.rsplit(".", 1)[0]
    title = next(c.title for p, c in _paths(spec) if p == block)
    formula = f"{'2 × ' if tensors == 2 else ''}{s.kv_heads_key} × {s.head_dim_key}"
    return AttentionCost(block, title, ledger.accounts[path].instances, tensors * s.kv_heads * s.head_dim,
                         2 * s.heads * s.head_dim, o.window, 2 * s.heads * 2 * s.head_dim, chunk=o.chunk,
                         formula=formula)


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
    index = next((c.options for c in compressor.children if isinstance(c.options, V4IndexerOptions)), None)
    out.append(AttentionCost(f"{block}_compressed", f"{title}: compressed stream", layers, o.head_dim // m, 0, None,
                             per_key, ratio=m, entry=o.head_dim, attended=index.topk if index else None,
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
    return ("Elements one layer caches for one token" + (f" ({c.note})" if c.note else "") + "; plain multi-head "
            f"attention of the same heads would cache {c.mha_per_token:,} ({c.mha_per_token / c.cache_per_token:.3g}×)."
            + (f" This layer keeps only its last {c.window:,} tokens." if c.window else "")
            + (f" This layer attends within chunks of {c.chunk:,} tokens and keeps at most one chunk." if c.chunk
               else ""))


def _prefill_keys(context: int, c: AttentionCost) -> int:
    """Entries the positions 1..C of a causal prefill read in one stream: windowed, chunked, capped at the top-k
    of a sparse attention, or pooled `ratio` positions to an entry."""
    if c.chunk:
        full, rest = divmod(context, c.chunk)
        return full * c.chunk * (c.chunk + 1) // 2 + rest * (rest + 1) // 2
    if c.ratio == 1:
        return _keys_seen(context, c.window or c.attended)
    return sum(min(t // c.ratio, c.attended or t) for t in range(1, context + 1))


def _cache_formula(spec: ModelSpec, c: AttentionCost) -> str:
    if c.attended is not None and "index_head_dim" in spec.values:
        return "kv_lora_rank + qk_rope_head_dim + index_head_dim"
    if c.formula:
        return c.formula
    if "kv_lora_rank" in spec.values:
        return "kv_lora_rank + qk_rope_head_dim"
    if "num_key_value_heads" not in spec.values:  # multi-head attention: every head keeps its own keys and values
        return "2 × num_attention_heads × head_dim"
    return "2 × num_key_value_heads × head_dim"


def _sparse_text(costs: list[AttentionCost]) -> str:
    """Where sparse attention caps the keys a query reads, say so beside the attention term."""
    caps = sorted({c.attended for c in costs if c.attended})
    return (f" (at most {', '.join(f'{n:,}' for n in caps)} of them read by attention, all scored by the lightning "
            "indexer)") if caps else ""


def _context_by_kind(costs: list[AttentionCost]) -> list[Figure]:
    """Per layer kind with attention shaped by its own formula: the BF16 bytes a CONTEXT-token sequence caches, a
    sliding kind capped at its window, a global kind growing with the context."""
    out = []
    for c in costs:
        if not c.formula:
            continue
        kept = min(CONTEXT, c.window or CONTEXT)
        held = f"min({CONTEXT:,}, {c.window:,})" if c.window else f"{CONTEXT:,}"
        out.append(Figure(
            f"kv_cache_bytes_bf16_{c.block.rsplit('.', 1)[-1]}",
            f"KV cache at {CONTEXT:,} tokens, BF16 ({c.title.lower()}, {c.layers} layer{'s' if c.layers != 1 else ''})",
            c.layers * c.cache_per_token * kept * 2, f"{c.layers} × ({c.formula}) × {held} × 2 bytes",
            ("Bytes these layers cache for one sequence: each keeps only its last "
             f"{c.window:,} positions, however long the context grows." if c.window else
             "Bytes these layers cache for one sequence: every position stays, so it grows linearly with the "
             "context.")))
    return out


def _keys_seen(context: int, window: int | None) -> int:
    """Σ_{t=1..C} min(t, W): the keys every position of a causal prefill attends to."""
    if window is None or window >= context:
        return context * (context + 1) // 2
    return window * (window + 1) // 2 + (context - window) * window


def _stored_bytes(ledger: Ledger, stored: Reconciliation | None) -> int:
    if stored is not None:
        return sum(t.bytes for t in stored.totals)
    return sum(ta.spec.count * st.nbytes for acc in ledger.accounts.values() for ta in acc.tensors
               for st in ta.stored if (st.role != "buffer" or not ta.spec.optional)  # stored buffers count
               and not ta.spec.tied_to)  # a tied head is stored once


# --------------------------------------------------------------------------------------- published claims

@dataclass(frozen=True, slots=True)
class ClaimMatch:
    """A lab's published "active parameters" figure and the definition that reproduces it."""

    claim: str
    """As published, e.g. "32B"."""
    source: str
    matched: Figure | None
    """The derived figure that counts what the lab counts (or, where it does not say, the first one) when it
    states as the claim, or None."""
    rounding: str = "nearest"
    """How the lab states its count: "nearest" or "down" (cut to the claim's precision)."""
    evidence: str = ""
    """The lab's words on what it counts, and what could not be verified."""


def parse_claim(claim: str) -> tuple[float, float]:
    """"32B" -> (32e9, 1e9): the value and the unit of its last digit; "12.9B" -> (12.9e9, 1e8)."""
    number = claim.strip().rstrip("BbMm")
    scale = 1e9 if claim.strip()[-1:] in "Bb" else 1e6
    decimals = len(number.split(".", 1)[1]) if "." in number else 0
    return float(number) * scale, scale / 10 ** decimals


def match_claim(figures: DerivedFigures, claim: str, source: str, definition: str = "", rounding: str = "nearest",
                evidence: str = "") -> ClaimMatch:
    """The figure counting what the lab counts (`definition`; where empty, the first of with or without the
    embedding) whose value the lab would state as the claim: rounded to its precision, or cut down to it."""
    value, unit = parse_claim(claim)
    for key in (definition,) if definition else ("active_parameters", "active_parameters_no_embedding"):
        figure = figures.get(key)
        stated = (value <= figure.value < value + unit) if rounding == "down" else abs(figure.value - value) <= unit / 2
        if stated:
            return ClaimMatch(claim, source, figure, rounding, evidence)
    return ClaimMatch(claim, source, None, rounding, evidence)


# ------------------------------------------------------------------------------------ recurrent state (Mamba-2)

STATE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class StateCost:
    """What one recurrent layer kind keeps per sequence, whatever the context length."""

    title: str
    layers: int
    state: int
    """Elements of the SSM state S (heads × head_dim × state_size)."""
    state_bytes: int
    """Bytes per element of S (mamba_ssm_cache_dtype)."""
    conv: int
    """Elements of the convolution window (conv_dim × conv_kernel)."""
    conv_bytes: int
    channels: int
    """heads × head_dim: the width of x and y."""

    @property
    def scan_multiply_adds(self) -> int:
        """Per token: conv window, decay (S ⊙ ā), write (outer product, added), read (S C), Δ·x and D·x."""
        return self.conv + 3 * self.state + 2 * self.channels

    @property
    def per_layer_bytes(self) -> int:
        return self.state * self.state_bytes + self.conv * self.conv_bytes


def _state_costs(spec: ModelSpec, ledger: Ledger) -> list[StateCost]:
    from .components.mamba2 import Mamba2Options

    out = []
    for path, comp in _paths(spec):
        if comp.program != "mamba2":
            continue
        o = comp.options
        assert isinstance(o, Mamba2Options)
        out.append(StateCost(comp.title, ledger.accounts[path].instances, o.heads * o.head_dim * o.state_size,
                             STATE_DTYPE_BYTES[o.state_dtype], o.conv_dim * o.conv_kernel,
                             STATE_DTYPE_BYTES.get(o.conv_dtype, 2), o.inner))
    return out


def recurrent_state_figures(spec: ModelSpec, ledger: Ledger, costs: list[AttentionCost]) -> list[Figure]:
    """Per-sequence memory of Mamba-2 layers (constant in the context) and the total with the attention layers' KV
    cache (which grows with it) at 4K, 128K and the model's maximum context; none for a model without such layers."""
    states = _state_costs(spec, ledger)
    if not states:
        return []
    s = states[0]
    fixed = sum(c.layers * c.per_layer_bytes for c in states)
    kv_bytes = CACHE_DTYPES[0][1]
    per_token = sum(c.layers * c.cache_per_token for c in costs) * kv_bytes
    limit = getattr(spec.config, "max_position_embeddings", None)
    contexts = sorted({4_096, CONTEXT} | ({int(limit)} if limit else set()))
    grows = " + ".join(f"{c.layers} × {c.cache_per_token:,}" for c in costs) or "0"
    figures = [
        Figure("ssm_state_per_layer", f"SSM state per sequence per layer ({s.title}, {s.layers} layers)",
               s.state, "mamba_num_heads × mamba_head_dim × ssm_state_size",
               f"Elements of the state S one layer carries from token to token, the same at any context length; "
               f"cached at {s.state_bytes} bytes each (mamba_ssm_cache_dtype)."),
        Figure("conv_state_per_layer", f"Convolution window per sequence per layer ({s.layers} layers)", s.conv,
               "(mamba_num_heads × mamba_head_dim + 2 × n_groups × ssm_state_size) × conv_kernel",
               f"The last conv_kernel columns of x, B and C that the causal convolution reads, the same at any "
               f"context length; cached at {s.conv_bytes} bytes each (the activations' dtype)."),
        Figure("recurrent_state_bytes", "Mamba-2 state per sequence, all layers (does not grow with context)", fixed,
               " + ".join(f"{c.layers} × ({c.state:,} × {c.state_bytes} + {c.conv:,} × {c.conv_bytes})"
                          for c in states),
               "Bytes of every Mamba-2 layer's SSM state and convolution window for one sequence."),
    ]
    scan = sum(c.layers * c.scan_multiply_adds for c in states)
    figures.append(Figure(
        "scan_flops_per_token", "Mamba-2 recurrence FLOPs per token (beside the projections)", 2 * scan,
        "2 × " + " + ".join(f"{c.layers} × ({c.conv:,} + 3 × {c.state:,} + 2 × {c.channels:,})" for c in states),
        "Two FLOPs per multiply-add of the one-token recurrence: the convolution over its window, the state's decay, "
        "its write Δ·x Bᵀ and its read S C, and Δ·x and the D skip; not included in the forward FLOPs below, which "
        "count projections and attention. The chunked form a prompt runs does more work per token inside a chunk."))
    figures += [Figure(f"context_memory_bytes_{n}", f"State and KV cache at {n:,} tokens (one sequence)",
                       fixed + per_token * n, f"{fixed:,} + ({grows}) × {n:,} × {kv_bytes}",
                       f"The fixed Mamba-2 state plus the attention layers' {CACHE_DTYPES[0][0]} KV cache, which grows "
                       f"by {per_token:,} bytes per token; only the attention layers grow with the context."
                       + (" The model's maximum context (max_position_embeddings)." if n == limit else ""))
                for n in contexts]
    return figures
