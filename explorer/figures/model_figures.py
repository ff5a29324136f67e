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
  prediction), the parameters at BF16, FP8 and 4-bit, and as stored by MXFP4, NVFP4 and INT4 group-32 formats
  with their scales.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from explorer.checkpoint.reconcile import Reconciliation
from explorer.figures import weights_read
from explorer.figures.stored import STORED_DEFINITION, mtp_parameters, stored_buffers, stored_bytes
from explorer.model.account import Ledger
from explorer.model.components.moe import RouterOptions
from explorer.model.components.part_facts import facts, programs_where
from explorer.model.components.serving import LAYER_MEMORY, LayerKind
from explorer.spec.types import Component, ModelSpec, path_key, walk

CONTEXT = 131_072
"""The context length at which per-sequence figures are stated (128K tokens), or the model's maximum if smaller."""
FLOP_CONTEXT = 4_096
"""The context length at which attention FLOPs are stated (or the model's maximum if smaller)."""
CACHE_DTYPES = (("BF16", 2), ("FP8", 1))
WEIGHT_DTYPES = (("BF16", 2.0), ("FP8", 1.0), ("4-bit", 0.5))
QUANT_FORMATS = (
    ("MXFP4", "mxfp4", 0.5 + 1 / 32, "4-bit E2M1 values and one 1-byte E8M0 scale per 32"),
    ("NVFP4", "nvfp4", 0.5 + 1 / 16, "4-bit E2M1 values and one FP8 E4M3 scale per 16 (plus two FP32 scalars per "
                                     "tensor)"),
    ("INT4, group 32", "int4_g32", 0.5 + 2 / 32, "4-bit integers packed in int32 words and one BF16 scale per 32 (plus "
                                                 "an int64 shape per tensor), as compressed-tensors stores them"),
)
"""Stored formats with their bytes per parameter, scales included (per-tensor scalars left out: a few bytes)."""
MEMORY_CONTEXTS = (("4K", 4_096), ("128K", CONTEXT))
"""Context lengths at which a hybrid model's whole sequence memory is stated (and its maximum context)."""

AttentionCost = LayerKind
"""The per-layer-kind entry of explorer/model/components/serving.py, under the name the figures' readers know."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One derived number with what it counts and how it was computed."""

    key: str
    label: str
    value: int
    formula: str
    definition: str

    @property
    def unit(self) -> str:
        """What the value counts ("bytes per token", "elements", "FLOPs"), read from the figure's key, so that every view
        that sets figures side by side (the comparisons) names it."""
        per_token = "kv_cache_per_layer_", "kv_cache_per_token", "kv_cache_vs_mha"
        if self.key.startswith("kv_cache_bytes_per_token"):
            return "bytes per token"
        if self.key.startswith(per_token):
            return "elements per token"
        if "bytes" in self.key or self.key.startswith("sequence_memory"):
            return "bytes"
        if self.key.startswith("mla_flops_per_key"):
            return "FLOPs per cached position"
        if "flops" in self.key:
            return "FLOPs"
        if self.key.endswith("parameters"):
            return "parameters"
        if self.key == "max_context":
            return "tokens"
        return "elements"

    @property
    def is_bytes(self) -> bool:
        return self.unit.startswith("bytes")


@dataclass(frozen=True, slots=True)
class Serving:
    """What the calculator evaluates for one model: its layer kinds, its maximum context and its weights."""

    kinds: tuple[LayerKind, ...]
    """Every layer kind: those that cache per token and those that hold a fixed state."""
    max_context: int
    """The longest context the config allows (max_position_embeddings, or GPT-2's n_positions)."""
    matmul: int
    """Parameters a token multiplies: the active ones less the embedding lookup, plus a tied LM head's matrix."""
    tied_head: int
    """Elements of the LM head's matrix where it is the embedding's (0 when untied)."""
    weights: tuple[tuple[str, int], ...]
    """(format, bytes): as stored, BF16, FP8, 4-bit."""
    read: tuple[tuple[str, int], ...] = ()
    """(format, bytes one decoded token reads of the weights), the same formats (explorer/figures/weights_read.py)."""


@dataclass(frozen=True, slots=True)
class DerivedFigures:
    """Every derived figure of one model."""

    figures: tuple[Figure, ...]
    serving: Serving

    @property
    def attention(self) -> tuple[LayerKind, ...]:
        """The layer kinds that cache per token (attention and its streams)."""
        return tuple(k for k in self.serving.kinds if k.per_token or k.entry)

    def get(self, key: str) -> Figure:
        return next(f for f in self.figures if f.key == key)


def derive(spec: ModelSpec, ledger: Ledger, stored: Reconciliation | None) -> DerivedFigures:
    """The derived figures of one model."""
    inactive, inactive_text = _inactive_experts(spec, ledger)
    mtp = mtp_parameters(spec, ledger)
    embed = ledger.accounts["embed"].total if "embed" in ledger.accounts else 0
    total = ledger.stored_total
    # an image encoder (Gemma 3's vision tower and projector) runs once per image, not for a text token
    vision = sum(ledger.accounts[p].total for p, c in _paths(spec) if facts(c.program).vision)
    active = total - mtp - inactive - vision
    kinds = layer_kinds(spec, ledger)
    costs = [c for c in kinds if c.per_token or c.entry]
    maximum = max_context(spec)
    stated, flop_context = min(CONTEXT, maximum), min(FLOP_CONTEXT, maximum)
    tied = _tied_head(ledger)
    matmul = active - embed + tied  # every matrix a token multiplies (the embedding is a row lookup; its tied head is not)
    growing = [c for c in costs if c.grows]
    cache = sum(c.layers * c.cache_per_token for c in growing)
    fixed_cache = sum(c.fixed_elements(maximum) for c in costs)
    fixed_state = sum(k.layers * k.state_bytes for k in kinds if k.state)
    mha = sum(c.layers * c.mha_per_token for c in costs)
    at_context = sum(c.cache_elements(stated) for c in costs)
    decode_attn = attention_flops_decode(costs, flop_context)
    prefill_attn = attention_flops_prefill(costs, flop_context)
    mha_costs = [c for c in costs if c.mha_per_token]
    no_embed = _no_embedding_convention(spec)
    mtp_text = (" − MTP modules" if mtp else "") + (" − vision tower and projector" if vision else "")
    head_text = " (the tied LM head's vocab_size × hidden_size included: the embedding's matrix, multiplied again)" \
        if tied else ""
    as_stored = stored_bytes(ledger, stored)
    weights = (("as stored", as_stored), *((name, int(total * size)) for name, size in WEIGHT_DTYPES),
               *((name, int(total * size)) for name, _, size, _ in QUANT_FORMATS))  # 4-bit formats, scales included
    figures = [
        Figure("total_parameters", "Parameters stored (all)", total,
               f"main model {total - mtp:,} + multi-token-prediction layers {mtp:,}" if mtp else "sum of the ledger's rows",
               STORED_DEFINITION),
        *_mtp_figures(spec, ledger, mtp, stored is not None),
        Figure("stored_buffers", "Persistent buffers stored beside the parameters (elements)",
               *stored_buffers(ledger, stored), _buffers_definition(spec, ledger)),
        Figure("active_parameters", "Active parameters per token", active,
               f"total{mtp_text} − {inactive_text}" if inactive else f"total{mtp_text}",
               "Every parameter a token's forward pass reads: all dense weights, the router, shared experts, and the "
               "routed experts counted k of N; the embedding and the LM head included"
               + ("; multi-token-prediction modules excluded (not part of the main forward pass)" if mtp else "")
               + ("; the vision tower and projector excluded (they run once per image, not per text token)"
                  if vision else "") + "."),
        Figure("active_parameters_no_embedding", no_embed[0], active - embed, no_embed[1], no_embed[2]),
        Figure("max_context", "Maximum context (tokens)", maximum, _max_context_key(spec),
               "The longest sequence the configuration allows; no figure here is stated beyond it."),
        *(Figure(f"kv_cache_per_layer_{c.key}",
                 f"KV cache per token per layer ({c.title.lower()}, {c.layers} layer{'s' if c.layers != 1 else ''})",
                 c.cache_per_token, c.formula, _cache_definition(c))
          for c in costs),
        *_context_by_kind(costs, stated),
        Figure("kv_cache_per_token", "KV cache growth per added token (all layers)", cache,
               " + ".join(f"{c.layers} × {c.cache_per_token}" for c in growing) or "0",
               "Elements the cache grows by with each added token: the layers that keep every position (a compressed "
               "stream at its entry ÷ ratio); layers capped by a window or a chunk and fixed states do not grow once "
               "full, and are the fixed part beside it."),
        *(Figure(f"kv_cache_bytes_per_token_{name.lower()}", f"KV cache growth per added token (all layers), {name}",
                 cache * size, f"{cache:,} × {size} byte{'s' if size > 1 else ''}",
                 f"Bytes the cache grows by with each added token at {name} cache entries; the windows, chunks and "
                 "fixed states are the fixed part beside it.") for name, size in CACHE_DTYPES),
        Figure("kv_cache_fixed_elements", "Fixed part of the cache once full (elements per sequence)", fixed_cache,
               " + ".join(f"{c.fixed_elements(maximum):,}" for c in costs if c.fixed_elements(maximum)) or "0",
               "Elements that stop growing once the context fills them: every sliding window's and chunk's positions "
               f"(at most the maximum context, {maximum:,}), and a compressor's overlap and largest pending buffer."),
        Figure("kv_cache_fixed_bytes_bf16", "Fixed part of the cache and state once full, BF16 (bytes per sequence)",
               fixed_cache * CACHE_DTYPES[0][1] + fixed_state,
               f"{fixed_cache:,} × {CACHE_DTYPES[0][1]} bytes + {fixed_state:,} bytes of fixed state",
               "The fixed part at BF16 cache entries, plus the recurrent layers' states at their own dtypes: what a "
               "sequence holds beside the growth per token, whatever its length beyond the windows."),
        Figure("kv_cache_vs_mha", "Plain multi-head attention would cache (per token)", mha,
               " + ".join(f"{c.layers} × {c.mha_per_token}" for c in mha_costs),
               "K and V of every query head at full width, for comparison."),
        *(Figure(f"kv_cache_bytes_{name.lower()}", f"KV cache at {stated:,} tokens, {name}", at_context * size,
                 f"Σ layers × per-token elements × min({stated:,}, window) × {size} byte{'s' if size > 1 else ''}"
                 + (" (a compressed stream: entry elements × ⌊tokens / ratio⌋, plus its pending positions and "
                    "carried overlap)" if any(c.ratio > 1 for c in costs)
                    else ""),
                 f"Bytes cached for one sequence of {stated:,} tokens with {name} cache entries; sliding-window "
                 "layers keep only their window" + (", chunked layers at most one chunk" if any(c.chunk for c in costs)
                                                    else "") + "."
                 + (" The model's maximum context." if stated == maximum else ""))
          for name, size in CACHE_DTYPES),
        *_mamba_state_figures(kinds, costs, maximum),
        Figure("flops_decode", f"Forward FLOPs per token, decode at {flop_context:,} context",
               2 * matmul + decode_attn, f"2 × {matmul:,} + attention over {flop_context:,} keys" + _sparse_text(costs),
               "Two FLOPs per multiply-add: every projection a token runs (active parameters less the embedding), "
               f"plus the scores and weighted values over the cached keys{head_text}." + _mla_convention(costs)),
        *_mla_decode_figures(costs, matmul, flop_context),
        Figure("flops_prefill", f"Forward FLOPs, prefill of {flop_context:,} tokens",
               flop_context * 2 * matmul + prefill_attn,
               f"{flop_context:,} × 2 × {matmul:,} + causal attention over 1..{flop_context:,} keys" + _sparse_text(costs),
               f"Every position's projections{head_text}, plus causal attention where position t sees t keys (or its "
               "window)."),
        Figure("weight_bytes_stored", "Weight memory as stored", as_stored,
               "Σ stored tensor bytes" + (" (checkpoint ledger)" if stored is not None else " (predicted storage)"),
               "Bytes of every stored tensor: values, block scales and buffers, at their stored dtypes."),
        *(Figure(f"weight_bytes_{name.lower().replace('-', '')}", f"Weight memory at {name}", int(total * size),
                 f"total × {size:g} byte{'s' if size > 1 else ''}", f"Every parameter at {name}, with no scales.")
          for name, size in WEIGHT_DTYPES),
        *(Figure(f"weight_bytes_{key}", f"Weight memory as {name}", int(total * size),
                 f"total × {size:g} bytes", f"Every parameter stored as {what}: {size:g} bytes per parameter.")
          for name, key, size, what in QUANT_FORMATS),
    ]
    figures += _deltanet_state_figures(kinds, costs, maximum)
    params_read = weights_read.read_params(matmul, embed, spec)
    read = (("as stored", weights_read.read_as_stored(spec, ledger, routed_children(), not_run_for_text(), bool(tied))),
            *((name, int(params_read * size)) for name, size in WEIGHT_DTYPES),
            *((name, int(params_read * size)) for name, _, size, _ in QUANT_FORMATS))
    return DerivedFigures(tuple(figures), Serving(tuple(kinds), maximum, matmul, tied, weights, read))


# ------------------------------------------------------------------------------------------- layer kinds

def layer_kinds(spec: ModelSpec, ledger: Ledger) -> list[LayerKind]:
    """Every layer kind of the main forward pass, in model order, as its component module describes it
    (explorer/model/components/serving.py's registry), with its block, title and count of layers filled in."""
    blocks = {p: c for p, c in _paths(spec)}
    out = []
    for path, comp in blocks.items():
        entry = LAYER_MEMORY.get(comp.program)
        if entry is None or path.startswith("mtp"):
            continue
        block = path.rsplit(".", 1)[0]
        title = blocks[block].title
        for kind in entry(comp, spec.values):
            out.append(replace(kind, block=block, layers=ledger.accounts[path].instances,
                               title=f"{title}: {kind.stream_title}" if kind.stream_title else title))
    return out


def max_context(spec: ModelSpec) -> int:
    """The config's maximum context: max_position_embeddings (of the text model), or GPT-2's n_positions."""
    config = getattr(spec.config, "text_config", None) or spec.config
    return int(getattr(config, _max_context_key(spec)))


def _max_context_key(spec: ModelSpec) -> str:
    config = getattr(spec.config, "text_config", None) or spec.config
    return "max_position_embeddings" if getattr(config, "max_position_embeddings", None) else "n_positions"


def attention_flops_decode(kinds: list[LayerKind] | tuple[LayerKind, ...], context: int) -> int:
    """FLOPs of the attention of one token at position `context`: per kind, the entries it reads × its FLOPs per
    key, plus an indexer's score of every cached entry."""
    return sum(kind_flops_decode(c, context) for c in kinds)


def kind_flops_decode(c: LayerKind, context: int) -> int:
    """attention_flops_decode's term for the layers of one kind (the calculator shows each)."""
    return c.layers * (c.flops_per_key * c.keys_read(context) + c.index_flops_per_key * c.entries(context))


def attention_flops_prefill(kinds: list[LayerKind] | tuple[LayerKind, ...], context: int) -> int:
    """FLOPs of the causal attention of a `context`-token prefill: per kind, Σ_t of the entries position t reads."""
    return sum(kind_flops_prefill(c, context) for c in kinds)


def kind_flops_prefill(c: LayerKind, context: int) -> int:
    """attention_flops_prefill's term for the layers of one kind (the calculator shows each)."""
    return c.layers * (c.flops_per_key * c.keys_read_prefill(context)
                       + c.index_flops_per_key * c.keys_scored_prefill(context))


def mla_absorbed(kinds: list[LayerKind] | tuple[LayerKind, ...]) -> list[LayerKind]:
    """The kinds with every MLA layer in its absorbed form (scores and sums over the cached latent)."""
    return [replace(c, flops_per_key=c.absorbed_flops_per_key or c.flops_per_key) for c in kinds]


def _tied_head(ledger: Ledger) -> int:
    """Elements of the LM head's matrix where it is the embedding's: stored once, multiplied by every token."""
    head = ledger.accounts.get("lm_head")
    return sum(ta.elements or 0 for ta in head.tensors if ta.spec.tied_to) if head is not None else 0


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
        routed = facts(comp.program).routed_experts  # the key of its routed experts (part_facts.py)
        if not routed or path.startswith("mtp"):
            continue
        o = next(c for c in comp.children if c.key == "router").options
        assert hasattr(o, "experts") and hasattr(o, "k")  # RouterOptions or a library router's own options
        if routed == "expert":  # one expert component, repeated
            per_expert = ledger.accounts[f"{path}.expert"].per_instance
        else:  # all experts in one component whose every tensor has a leading experts axis
            per_expert = ledger.accounts[f"{path}.experts"].per_instance // o.experts
        instances = ledger.accounts[path].instances
        total += instances * (o.experts - o.k) * per_expert
        parts.append(f"{instances} × ({o.experts} − {o.k}) × {per_expert:,}")
    return total, " − ".join(parts)


def _cache_definition(c: LayerKind) -> str:
    if not c.mha_per_token:  # a compressed stream beside a layer's window
        return f"Elements one layer caches per token of context in this stream. {c.note}"
    return ("Elements one layer caches for one token" + (f" ({c.note})" if c.note else "") + "; plain multi-head "
            f"attention of the same heads would cache {c.mha_per_token:,} ({c.mha_per_token / c.cache_per_token:.3g}×)."
            + f" At BF16 that is {2 * c.cache_per_token:,} bytes per token, at FP8 {c.cache_per_token:,}."
            + (f" This layer keeps only its last {c.window:,} tokens." if c.window else "")
            + (f" This layer attends within chunks of {c.chunk:,} tokens and keeps at most one chunk." if c.chunk
               else ""))


def _mla_convention(costs: list[LayerKind]) -> str:
    """What the headline decode figure counts where MLA has two forms (issue 19: state the convention)."""
    mla = [c for c in costs if c.absorbed_flops_per_key]
    if not mla:
        return ""
    return (f" MLA layers are counted unabsorbed, with per-head keys and values as the steps compute them: "
            f"{mla[0].flops_per_key:,} FLOPs per cached position per layer ({mla[0].decode_forms[0]}), their rebuilding "
            "from the cached latent not counted. The absorbed form, which the cached latent implies, is stated beside "
            "it.")


def _mla_decode_figures(costs: list[LayerKind], matmul: int, context: int) -> list[Figure]:
    """MLA's decode cost in both forms: per cached position per layer, and the whole token's FLOPs with the absorbed
    form (the unabsorbed is the headline flops_decode). Every MLA layer of a model has the same heads and widths,
    so the first kind's per-position costs stand for all."""
    mla = [c for c in costs if c.absorbed_flops_per_key]
    if not mla:
        return []
    first = mla[0]
    absorbed = mla_absorbed(costs)
    return [
        Figure("mla_flops_per_key_unabsorbed", "MLA decode FLOPs per cached position per layer, unabsorbed (counted)",
               first.flops_per_key, first.decode_forms[0],
               "Each head scores a d_nope + d_rope query/key pair and sums a d_v value, with per-head keys and values at "
               "hand (rebuilt from the latent by kv_b_proj, or cached as plain multi-head attention would cache them); "
               "this is the form the Forward FLOPs per token, decode figure counts."),
        Figure("mla_flops_per_key_absorbed", "MLA decode FLOPs per cached position per layer, absorbed (latent cache)",
               first.absorbed_flops_per_key, first.decode_forms[1],
               "With only the latent and the rotary key cached (kv_lora_rank + qk_rope_head_dim elements per token "
               "and layer), W_UK folds into the query and W_UV into the output (once per token, their multiply-adds are "
               "the parameters'), so each head scores the d_ckv-wide latent and the rotary key and sums the latent: "
               "2 × d_ckv + d_rope multiply-adds per head and position."),
        Figure("flops_decode_absorbed", f"Forward FLOPs per token, decode at {context:,} context, MLA absorbed",
               2 * matmul + attention_flops_decode(absorbed, context),
               f"2 × {matmul:,} + attention over {context:,} keys, MLA absorbed" + _sparse_text(costs),
               "The decode figure above with every MLA layer in the absorbed form: what a server holding only the "
               "latent cache computes."),
    ]


def _sparse_text(costs: list[LayerKind]) -> str:
    """Where sparse attention caps the keys a query reads, say so beside the attention term."""
    caps = sorted({c.topk for c in costs if c.topk})
    return (f" (at most {', '.join(f'{n:,}' for n in caps)} of them read by attention, all scored by the lightning "
            "indexer)") if caps else ""


def _context_by_kind(costs: list[LayerKind], context: int) -> list[Figure]:
    """Per layer kind with attention shaped by its own formula (a layer attention, shaped attention or one of
    DeepSeek-V4's streams): the BF16 bytes a `context`-token sequence caches, a sliding kind capped at its window, a
    global kind growing with the context."""
    out = []
    for c in costs:
        if not c.by_kind:
            continue
        cap = c.window or c.chunk
        held = f"min({context:,}, {cap:,})" if cap else f"{context:,}"
        elements = f"{c.entry_elements:,} × ⌊{held} / {c.ratio}⌋" if c.ratio > 1 else f"({c.formula}) × {held}"
        buffered = f" + {c.buffered(context):,} buffered" if c.buffered(context) else ""
        out.append(Figure(
            f"kv_cache_bytes_bf16_{c.key}",
            f"KV cache at {context:,} tokens, BF16 ({c.title.lower()}, {c.layers} layer{'s' if c.layers != 1 else ''})",
            c.cache_elements(context) * 2,
            f"{c.layers} × ({elements}{buffered}) × 2 bytes" if buffered else f"{c.layers} × {elements} × 2 bytes",
            ("Bytes these layers cache for one sequence: each keeps only its last "
             f"{c.window:,} positions, however long the context grows." if c.window else
             f"Bytes these layers cache for one sequence: each keeps at most one {c.chunk:,}-token chunk, however "
             "long the context grows." if c.chunk else
             "Bytes these layers cache for one sequence: every position stays (one entry per ratio positions, with "
             "the positions not yet pooled and the carried overlap), so it grows linearly with the context."
             if c.ratio > 1 else
             "Bytes these layers cache for one sequence: every position stays, so it grows linearly with the "
             "context.")))
    return out


def _buffers_definition(spec: ModelSpec, ledger: Ledger) -> str:
    """What the buffers row counts, and, where this model counts its routers' correction biases with the parameters
    (as a listing of the checkpoint's tensors counts them), how many elements that convention moves out of this row."""
    text = ("Tensors the checkpoint stores that are not parameters of the reference module (a router's "
            "e_score_correction_bias, GPT-2's causal masks, rotary frequency tables), not in the parameter total. Where two models count such a "
            "tensor differently, this row shows that convention's share of a difference in totals.")
    counted = _correction_biases_counted_as_parameters(spec, ledger)
    if not counted:
        return text
    return text + (f" This model counts its routers' correction biases ({counted:,} elements) with its parameters, "
                   "as a listing of the checkpoint's tensors counts them; transformers holds them as buffers.")


def _correction_biases_counted_as_parameters(spec: ModelSpec, ledger: Ledger) -> int:
    out = 0
    for ancestors, comp in walk(spec.root):
        o = comp.options
        if isinstance(o, RouterOptions) and o.correction_bias:
            out += sum(ta.elements or 0 for ta in ledger.accounts[path_key(ancestors, comp)].tensors
                       if ta.spec.is_parameter and ta.spec.template.endswith(o.correction_bias_name))
    return out


def _mtp_figures(spec: ModelSpec, ledger: Ledger, mtp: int, listed: bool) -> list[Figure]:
    """The stored total's multi-token-prediction part, shown apart with how it was counted."""
    if not mtp:
        return []
    d = spec.declared_mtp
    if d is None:
        copies = _mtp_copies(spec, ledger)
        both = (f" They hold copies of the token embedding and the LM head ({copies:,} together), as DeepSeek-V3's "
                f"checkpoint stores them in its MTP layer; without the copies they hold {mtp - copies:,}"
                + ("" if listed else ", and no tensor listing recorded here settles whether this release stores "
                                     "them") + ".") if copies else ""
        return [Figure("mtp_parameters", "Of which multi-token-prediction layers", mtp, "the MTP module's rows",
                       "Described here as the checkpoint stores them (transformers skips them when it loads), and "
                       "left out of every active figure: they are not part of the main forward pass." + both)]
    per = ledger.declared["mtp"].per_instance
    return [Figure("mtp_parameters", "Of which multi-token-prediction layers", mtp,
                   f"{d.count} × {per:,} ({d.key} = {d.count}; one module from the family's formula)",
                   f"{d.basis} Without them the checkpoint's main model holds {ledger.total:,}.")]


def _mtp_copies(spec: ModelSpec, ledger: Ledger) -> int:
    """Parameters of the token-embedding and LM-head copies an MTP module the tree describes holds (DeepSeek-V3's
    embed and head children)."""
    return sum(ledger.accounts[f"{p}.{c.key}"].total for p, comp in _paths(spec) if facts(comp.program).mtp
               for c in comp.children if c.key in ("embed", "head"))


# --------------------------------------------------------------------------------------- recurrent state

def _recurrent(kinds: list[LayerKind], part: str) -> list[LayerKind]:
    """The recurrent kinds whose state has a part named `part` ("SSM state": Mamba-2; "recurrent state": DeltaNet)."""
    return [k for k in kinds if any(p.name == part for p in k.state)]


def _mixer_name(kind: LayerKind) -> str:
    """The token mixer a recurrent layer kind is named for: its block kind's title before " block" ("Gated DeltaNet
    block" -> "Gated DeltaNet", "KDA block (MoE)" -> "KDA")."""
    return kind.title.split(" block")[0]


def _deltanet_state_figures(kinds: list[LayerKind], costs: list[LayerKind], maximum: int) -> list[Figure]:
    """Delta-rule layers (Gated DeltaNet, KDA) keep a fixed state (conv and recurrent) whatever the context;
    attention layers' KV cache grows with it. Per mixer (block kinds of one mixer and one state size together),
    exactly, and the sequence's total at 4K, 128K and the maximum context."""
    groups: dict[tuple[str, int], list[LayerKind]] = {}
    for k in _recurrent(kinds, "recurrent state"):
        groups.setdefault((_mixer_name(k), k.state_bytes), []).append(k)
    if not groups:
        return []
    out, fixed, parts = [], 0, []
    for (mixer, _), group in groups.items():
        state, conv = group[0].state
        n = sum(k.layers for k in group)
        fixed += n * group[0].state_bytes
        parts.append(f"{n} × {group[0].state_bytes:,}")
        out += [
            Figure("recurrent_state_per_layer", f"Recurrent state per {mixer} layer ({n} layers)",
                   state.elements, state.formula,
                   f"Numbers in one layer's delta-rule state, held in {state.dtype} ({state.bytes} bytes each): "
                   f"{state.elements * state.bytes:,} bytes. It does not grow with the context."),
            Figure("conv_state_per_layer", f"Conv state per {mixer} layer ({n} layers)", conv.elements,
                   conv.formula,
                   f"The last kernel inputs of each convolution channel (the full kernel, as the reference's cache holds "
                   f"it and as Mamba-2's conv state is counted; a step reads kernel − 1 of them beside the new input), "
                   f"in {conv.dtype} ({conv.bytes} bytes "
                   f"each): {conv.elements * conv.bytes:,} bytes. It does not grow with the context."),
            Figure("state_update_flops_per_token", f"{mixer} state-update FLOPs per token ({n} layers)",
                   n * group[0].update_flops, f"{n} × {group[0].update_formula}",
                   f"{group[0].update_flops:,} per layer: two FLOPs per multiply-add of the one-token update a decode "
                   "step runs (the convolution over its window; per head the decay of S, the prediction Sᵀk, the "
                   "correction β(v − Sᵀk), the rank-1 write and the read Sᵀq); not included in the forward FLOPs, "
                   "which count projections and attention. The chunked form a prompt runs does more work per token."),
        ]
    mixers = " and ".join(dict.fromkeys(m for m, _ in groups))
    out.append(Figure("recurrent_state_bytes", f"Fixed state of all {mixers} layers (bytes per sequence)", fixed,
                      " + ".join(parts) + " (recurrent state bytes + conv state bytes, per layer)",
                      "Bytes every sequence holds in its linear-attention layers, the same at any context length."))
    kv_per_token = sum(c.layers * c.cache_per_token for c in costs) * 2
    for name, n_tokens in (*MEMORY_CONTEXTS, (f"{maximum:,} (maximum)", maximum)):
        if n_tokens > maximum:
            continue
        out.append(Figure(f"sequence_memory_{n_tokens}", f"Cache of one sequence at {name} tokens (BF16 KV)",
                          fixed + kv_per_token * n_tokens,
                          f"{fixed:,} fixed + {kv_per_token:,} × {n_tokens:,} (KV bytes per token × tokens)",
                          f"The {mixers} layers' fixed state plus the full-attention layers' KV cache, which "
                          "alone grows with the context."))
    return out


def _mamba_state_figures(kinds: list[LayerKind], costs: list[LayerKind], maximum: int) -> list[Figure]:
    """Per-sequence memory of Mamba-2 layers (constant in the context) and the total with the attention layers' KV
    cache (which grows with it) at 4K, 128K and the model's maximum context; none for a model without such layers."""
    states = _recurrent(kinds, "SSM state")
    if not states:
        return []
    s = states[0]
    ssm, conv = s.state
    fixed = sum(c.layers * c.state_bytes for c in states)
    kv_bytes = CACHE_DTYPES[0][1]
    per_token = sum(c.layers * c.cache_per_token for c in costs) * kv_bytes
    contexts = sorted(n for n in {4_096, CONTEXT, maximum} if n <= maximum)
    grows = " + ".join(f"{c.layers} × {c.cache_per_token:,}" for c in costs) or "0"
    figures = [
        Figure("ssm_state_per_layer", f"SSM state per sequence per layer ({s.title}, {s.layers} layers)",
               ssm.elements, ssm.formula,
               f"Elements of the state S one layer carries from token to token, the same at any context length; "
               f"cached at {ssm.bytes} bytes each (mamba_ssm_cache_dtype)."),
        Figure("conv_state_per_layer", f"Convolution window per sequence per layer ({s.layers} layers)", conv.elements,
               conv.formula,
               f"The last conv_kernel columns of x, B and C that the causal convolution reads, the same at any "
               f"context length; cached at {conv.bytes} bytes each (the activations' dtype)."),
        Figure("recurrent_state_bytes", "Mamba-2 state per sequence, all layers (does not grow with context)", fixed,
               " + ".join(f"{c.layers} × ({c.state[0].elements:,} × {c.state[0].bytes} + {c.state[1].elements:,} × "
                          f"{c.state[1].bytes})" for c in states),
               "Bytes of every Mamba-2 layer's SSM state and convolution window for one sequence."),
        Figure("scan_flops_per_token", "Mamba-2 recurrence FLOPs per token (beside the projections)",
               sum(c.layers * c.update_flops for c in states),
               " + ".join(f"{c.layers} × 2 × ({c.state[1].elements:,} + 3 × {c.state[0].elements:,} + 2 × channels)"
                          for c in states),
               "Two FLOPs per multiply-add of the one-token recurrence: the convolution over its window, the "
               "state's decay, its write Δ·x Bᵀ and its read S C, and Δ·x and the D skip (channels = mamba_num_heads "
               "× mamba_head_dim); not included in the forward FLOPs, which count projections and attention. The "
               "chunked form a prompt runs does more work per token inside a chunk."),
    ]
    figures += [Figure(f"context_memory_bytes_{n}", f"State and KV cache at {n:,} tokens (one sequence)",
                       fixed + per_token * n, f"{fixed:,} + ({grows}) × {n:,} × {kv_bytes}",
                       f"The fixed Mamba-2 state plus the attention layers' {CACHE_DTYPES[0][0]} KV cache, which grows "
                       f"by {per_token:,} bytes per token; only the attention layers grow with the context."
                       + (" The model's maximum context (max_position_embeddings)." if n == maximum else ""))
                for n in contexts]
    return figures


def routed_children() -> dict[str, str]:
    """MoE program -> the key of its routed experts' child, as each part declares it (part_facts.py)."""
    return {p: facts(p).routed_experts for p in sorted(programs_where("routed_experts"))}


def not_run_for_text() -> tuple[str, ...]:
    """Programs a text token does not run: MTP modules and vision towers, as their parts declare."""
    return tuple(sorted(programs_where("mtp") | programs_where("vision")))
