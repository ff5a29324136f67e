"""What an engine allocates, as data: llama.cpp's rules for its KV cache and recurrent states, each with the engine
version and the source file and function it was read from, evaluated on the layer kinds the figures stage derived
(explorer/model/components/serving.py); vllm.py and sglang.py beside it hold the other two engines. The calculator
shows the result beside the theoretical cache, with the reason for each difference (padding, a sliding layer's
admission of a whole micro-batch, K and V at F16, V widened without flash attention, states at F32 one conv column
short).

Only what is stated here is modelled: layers that cache K and V (or MLA's K alone) per position, full or capped by a
window or chunk, DeepSeek Sparse Attention's indexer keys beside its latent, and recurrent layers (Mamba-2, Gated
DeltaNet, KDA) with one state row per sequence. A model with a kind llama.cpp allocates by another rule
(DeepSeek-V4's compressed caches, src/llama-kv-cache-dsv4.cpp) gets no llama.cpp figure, and the page says which kind
and why.
"""

from __future__ import annotations

from explorer.figures.engines.rule import Rule, conv_kept
from explorer.model.components.serving import LayerKind

LLAMA_CPP_VERSION = "llama.cpp 0c1e570 (2026-10-01), as vendored by llama-cpp-python 0.3.36"
PAD = 256
"""Cells a KV cache is padded to: the context and each sliding cache round up to a multiple of 256."""
N_UBATCH = 512
"""The micro-batch llama.cpp runs a prompt in (llama_context_default_params' n_ubatch)."""
SWA_FULL = True
"""llama_context_default_params' swa_full: sliding layers get the whole context ("using full-size SWA cache")."""
FLASH_ATTN = True
"""llama_context_default_params' flash_attn_type is auto, and the cache is made as with flash attention on
(cparams.flash_attn = flash_attn_type != DISABLED, src/llama-context.cpp); llama-cpp-python's `Llama` class sets it
DISABLED unless given flash_attn=True, and llama-server's --flash-attn is auto."""
KV_UNIFIED = False
"""llama_context_default_params' kv_unified: one stream per sequence. llama-server turns it on when it picks the
number of slots itself (tools/server/server.cpp)."""
F16 = 2
"""Bytes per cached element: the cache's default type_k and type_v are F16."""
F32 = 4
"""Bytes per element of a recurrent state row: type_r and type_s are GGML_TYPE_F32 (src/llama-model.cpp,
llama_model::create_memory), whatever dtype the checkpoint's reference keeps them in."""


LLAMA_CPP_RULES = (
    Rule(f"The context of n_seq sequences is padded to a multiple of {PAD} cells, then split into one stream per "
         f"sequence (kv_unified off, the default), each stream padded again: n_ctx_seq = pad{PAD}(pad{PAD}(n_ctx) "
         f"/ n_seq) cells per sequence, n_ctx_seq × n_seq in all; with kv_unified on, one stream of "
         f"pad{PAD}(n_ctx) cells.", "src/llama-context.cpp, llama_context::llama_context"),
    Rule("Each layer with a KV cache allocates K and V, n_embd_k_gqa(il) and n_embd_v_gqa(il) elements per cell "
         "(per-layer head counts and widths honoured); MLA allocates K alone, the latent and the rotary key.",
         "src/llama-kv-cache.cpp, llama_kv_cache::llama_kv_cache; src/llama-hparams.cpp"),
    Rule("Without flash attention V is stored transposed, and every layer's V row is as wide as the widest "
         "layer's, n_embd_v_gqa_max() (MLA, with no V, is unchanged).",
         "src/llama-kv-cache.cpp, llama_kv_cache::llama_kv_cache (v_trans); src/llama-hparams.cpp, n_embd_v_gqa_max"),
    Rule(f"A sliding (or chunked) layer gets pad{PAD}(min(n_ctx_seq, n_swa + n_ubatch)) cells in each sequence's "
         f"stream (kv_unified on: pad{PAD}(min(n_ctx, n_swa × n_seq + n_ubatch)) in the one stream), or the whole "
         "stream with swa_full, which the library's default context parameters set.",
         "src/llama-kv-cache-iswa.cpp, llama_kv_cache_iswa::llama_kv_cache_iswa"),
    Rule("K and V are F16 by default (type_k, type_v), 2 bytes per element.", "include/llama.h, "
         "llama_context_default_params"),
    Rule("DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) keeps two caches of the same cells: the MLA latent and "
         "rotary key, and the lightning indexer's one key head of index_head_dim, both at type_k (F16), K alone "
         "(GLM-5 and 5.1 have an indexer in every layer: their n_ctx_train is under 1,048,576).",
         "src/llama-kv-cache-dsa.cpp, llama_kv_cache_dsa::llama_kv_cache_dsa; src/models/glm-dsa.cpp, "
         "load_arch_hparams"),
    Rule("A recurrent layer (Mamba-2, Gated DeltaNet, KDA) keeps max(1, n_seq) rows of F32, whatever the context: "
         "one of n_embd_s recurrent-state elements and one of n_embd_r conv-state elements, the conv's kernel − 1 "
         "columns (the oldest column is shifted out before it is read); a hybrid model's attention layers get the "
         "KV cache above beside it.",
         "src/llama-memory-recurrent.cpp, llama_memory_recurrent::llama_memory_recurrent; src/llama-hparams.cpp, "
         "n_embd_r and n_embd_s; src/llama-memory-hybrid.cpp"),
)


def unsupported(kinds: tuple[LayerKind, ...]) -> str:
    """Why llama.cpp's allocation is not modelled for these kinds ("" when it is)."""
    for k in kinds:
        if k.ratio > 1:
            return f"{k.title}: DeepSeek-V4's compressed caches (src/llama-kv-cache-dsv4.cpp) are not modelled here"
    return ""


def pad(n: int) -> int:
    return -(-n // PAD) * PAD


def cells(k: LayerKind, context: int, sequences: int, n_ubatch: int = N_UBATCH, swa_full: bool = SWA_FULL,
          kv_unified: bool = KV_UNIFIED) -> int:
    """Cells llama.cpp allocates for one layer of kind `k` for `sequences` sequences of `context` tokens each (0 for
    a recurrent kind, which has rows instead): one stream per sequence (kv_unified off), each padded, so three
    sequences of 100 tokens take 3 × 256 cells, not the 512 that padding their 300 tokens once would give; or one
    stream for all (kv_unified on), where a sliding layer admits every sequence's window."""
    if k.state:
        return 0
    streams = 1 if kv_unified else sequences
    per_stream = pad(pad(context * sequences) // streams)
    cap = k.window or k.chunk
    if cap is not None and not swa_full:
        per_stream = pad(min(per_stream, cap * (sequences // streams) + n_ubatch))
    return per_stream * streams


def cell_elements(k: LayerKind, kinds: tuple[LayerKind, ...], flash_attn: bool = FLASH_ATTN) -> int:
    """Elements one cell of one layer of kind `k` holds: K and V, V widened to the widest of the model's `kinds`
    without flash attention (MLA, which caches no V apart, keeps its K alone)."""
    if flash_attn or not k.values:
        return k.per_token
    return k.per_token - k.values + max(x.values for x in kinds)


def state_row(k: LayerKind) -> int:
    """Elements of one layer's state rows for one sequence: n_embd_s (the recurrent state) and n_embd_r (the conv
    state's kernel − 1 columns)."""
    return sum(conv_kept(p.elements, p.columns) for p in k.state)


def kind_bytes(k: LayerKind, context: int, sequences: int, n_ubatch: int = N_UBATCH, swa_full: bool = SWA_FULL,
               kinds: tuple[LayerKind, ...] = (), flash_attn: bool = FLASH_ATTN,
               kv_unified: bool = KV_UNIFIED) -> int:
    """Bytes all layers of kind `k` allocate: K and V (or MLA's K) at F16, or the state rows at F32; `kinds` the
    model's (for the widest V without flash attention; `k` alone when not given)."""
    if k.state:
        return k.layers * state_row(k) * max(1, sequences) * F32
    width = cell_elements(k, kinds or (k,), flash_attn)
    return k.layers * width * cells(k, context, sequences, n_ubatch, swa_full, kv_unified) * F16


def total_bytes(kinds: tuple[LayerKind, ...], context: int, sequences: int, n_ubatch: int = N_UBATCH,
                swa_full: bool = SWA_FULL, flash_attn: bool = FLASH_ATTN, kv_unified: bool = KV_UNIFIED) -> int | None:
    """The KV cache and states llama.cpp allocates for these kinds, or None where a kind is not modelled (see
    `unsupported`)."""
    if unsupported(kinds):
        return None
    return sum(kind_bytes(k, context, sequences, n_ubatch, swa_full, kinds, flash_attn, kv_unified) for k in kinds)
