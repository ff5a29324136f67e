"""What an engine allocates, as data: llama.cpp's rules for its KV cache, each with the engine version and the source
file and function it was read from, evaluated on the layer kinds the figures stage derived
(explorer/model/components/serving.py); vllm.py and sglang.py beside it hold the other two engines. The calculator
shows the result beside the theoretical cache, with the reason for each difference (padding, a sliding layer's
admission of a whole micro-batch, K and V at F16).

Only what is stated here is modelled: layers that cache K and V (or MLA's K alone) per position, full or capped by a
window or chunk. A model with a kind llama.cpp allocates by another rule (a recurrent state per sequence, DeepSeek
Sparse Attention's indexer cache, DeepSeek-V4's compressed caches) gets no llama.cpp figure, and the page says which
kind and why.
"""

from __future__ import annotations

from explorer.figures.engines.rule import Rule
from explorer.model.components.serving import LayerKind

LLAMA_CPP_VERSION = "llama.cpp 0c1e570 (2026-10-01), as vendored by llama-cpp-python 0.3.36"
PAD = 256
"""Cells a KV cache is padded to: the context and each sliding cache round up to a multiple of 256."""
N_UBATCH = 512
"""The micro-batch llama.cpp runs a prompt in (llama_context_default_params' n_ubatch)."""
SWA_FULL = True
"""llama_context_default_params' swa_full: sliding layers get the whole context ("using full-size SWA cache")."""
F16 = 2
"""Bytes per cached element: the cache's default type_k and type_v are F16."""


LLAMA_CPP_RULES = (
    Rule(f"The context of n_seq sequences is padded to a multiple of {PAD} cells, then split into one stream per "
         f"sequence (kv_unified off, the default), each stream padded again: n_ctx_seq = pad{PAD}(pad{PAD}(n_ctx) "
         "/ n_seq) cells per sequence, n_ctx_seq × n_seq in all.", "src/llama-context.cpp, llama_context"),
    Rule("Each layer with a KV cache allocates K and V, n_embd_k_gqa(il) and n_embd_v_gqa(il) elements per cell "
         "(per-layer head counts and widths honoured); MLA allocates K alone, the latent and the rotary key.",
         "src/llama-kv-cache.cpp, llama_kv_cache::llama_kv_cache; src/llama-hparams.cpp"),
    Rule(f"A sliding (or chunked) layer gets pad{PAD}(min(n_ctx_seq, n_swa + n_ubatch)) cells in each sequence's "
         "stream, or the whole stream with swa_full, which the library's default context parameters set.",
         "src/llama-kv-cache-iswa.cpp, llama_kv_cache_iswa::llama_kv_cache_iswa"),
    Rule("K and V are F16 by default (type_k, type_v), 2 bytes per element.", "include/llama.h, "
         "llama_context_default_params"),
)


def unsupported(kinds: tuple[LayerKind, ...]) -> str:
    """Why llama.cpp's allocation is not modelled for these kinds ("" when it is)."""
    for k in kinds:
        if k.state:
            return f"{k.title}: a recurrent state per sequence (src/llama-memory-recurrent.cpp) is not modelled here"
        if k.ratio > 1:
            return f"{k.title}: DeepSeek-V4's compressed caches (src/llama-kv-cache-dsv4.cpp) are not modelled here"
        if k.topk:
            return f"{k.title}: the sparse-attention indexer cache (src/llama-kv-cache-dsa.cpp) is not modelled here"
    return ""


def pad(n: int) -> int:
    return -(-n // PAD) * PAD


def cells(k: LayerKind, context: int, sequences: int, n_ubatch: int = N_UBATCH, swa_full: bool = SWA_FULL) -> int:
    """Cells llama.cpp allocates for one layer of kind `k` for `sequences` sequences of `context` tokens each: one
    stream per sequence (kv_unified off), each padded, so three sequences of 100 tokens take 3 × 256 cells, not the
    512 that padding their 300 tokens once would give."""
    per_sequence = pad(pad(context * sequences) // sequences)
    cap = k.window or k.chunk
    if cap is not None and not swa_full:
        per_sequence = pad(min(per_sequence, cap + n_ubatch))
    return per_sequence * sequences


def kind_bytes(k: LayerKind, context: int, sequences: int, n_ubatch: int = N_UBATCH, swa_full: bool = SWA_FULL) -> int:
    """Bytes of K and V (or MLA's K) all layers of kind `k` allocate, at F16."""
    return k.layers * k.per_token * cells(k, context, sequences, n_ubatch, swa_full) * F16


def total_bytes(kinds: tuple[LayerKind, ...], context: int, sequences: int, n_ubatch: int = N_UBATCH,
                swa_full: bool = SWA_FULL) -> int | None:
    """The KV cache llama.cpp allocates for these kinds, or None where a kind is not modelled (see `unsupported`)."""
    if unsupported(kinds):
        return None
    return sum(kind_bytes(k, context, sequences, n_ubatch, swa_full) for k in kinds)
