"""What vLLM's v1 engine allocates, as data: its KV cache in pages of `block_size` tokens per layer, each rule with
the file and function of vLLM's tree it was read from, evaluated on the layer kinds of
explorer/model/components/serving.py.

vLLM sizes its pool from the memory left after the weights and a profiling run, then admits a request when the pages
it needs at `max_model_len` are free. The figure here is those pages for B requests of C tokens (max_model_len = C):
each layer kind becomes a spec (full attention, sliding window, chunked local, a recurrent state), hybrid models' pages
are made one size (the attention block grows until a page holds a recurrent state, smaller attention pages take more
tokens), and layers are grouped so every group has as many layers, padding the last group of a kind.

Read from the public vllm-project/vllm tree (vllm/v1/kv_cache_interface.py and vllm/v1/core/kv_cache_utils.py at
commit 001cabc; the hybrid alignment from Platform._align_hybrid_block_size). Not modelled, and the page says so:
DeepSeek-V4's compressed caches, and an FP4 cache (nvfp4 packs block scales beside the data).
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.figures.engines.rule import FP8_DS_MLA, Rule, cdiv, conv_kept, milli, sparse_mla_fp8
from explorer.model.components.serving import LayerKind

VLLM_VERSION = "vLLM v1 engine (vllm-project/vllm at commit 001cabc)"
BLOCK_SIZE = 16
"""CacheConfig's default block_size: tokens per page."""
MAX_NUM_BATCHED_TOKENS = 8_192
"""Tokens one scheduler step prefills at most: EngineArgs' default for `vllm serve` on a GPU of 70 GiB or more other
than an A100 (2,048 on smaller ones)."""
GPU_MEMORY_UTILIZATION = 0.9
"""The share of the GPU's memory vLLM may take (CacheConfig's default)."""
KERNEL_ALIGNMENT = 16
"""The FlashAttention backend's kernel block sizes are multiples of 16 (get_supported_kernel_block_sizes)."""
INDEXER_QUANT_BLOCK = 128
"""DeepSeek Sparse Attention's indexer keys are FP8 with one float32 scale per 128 elements: 128 + 4 = 132 bytes."""

FULL, SLIDING, CHUNKED, STATE = "full attention", "sliding window", "chunked local attention", "recurrent state"
"""The spec classes a layer kind becomes."""


@dataclass(frozen=True, slots=True)
class Settings:
    """The engine arguments the figure depends on, with vLLM's defaults."""

    block_size: int = BLOCK_SIZE
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    utilization: int = milli(GPU_MEMORY_UTILIZATION)
    """gpu_memory_utilization in thousandths (900)."""


DEFAULTS = Settings()


def clamped(s: Settings) -> Settings:
    """The settings as evaluated: at least one token per block and per step, a utilization in (0, 1]."""
    return Settings(max(1, s.block_size), max(1, s.max_num_batched_tokens), min(1000, max(1, s.utilization)))


@dataclass(frozen=True, slots=True)
class Spec:
    """One KV cache spec of the model, after hybrid alignment and page unification, and how many layers hold it."""

    cls: str
    """FULL, SLIDING, CHUNKED or STATE."""
    layers: int
    page: int
    """Bytes of one page (one block of `block` tokens, or one whole state) of one layer."""
    block: int
    """Tokens per page (a state page holds one request's state whatever its length)."""
    span: int = 0
    """The sliding window or the chunk."""


@dataclass(frozen=True, slots=True)
class Layout:
    """The specs and how vLLM groups them: `group_size` layers per group, every group's block table of its own."""

    specs: tuple[Spec, ...]
    group_size: int
    """0: one spec class only, every layer in one group with pages of its own size (UniformTypeKVCacheSpecs)."""
    block: int
    """The attention block size after hybrid alignment (784 for Qwen3.5-27B's float32 state), the setting otherwise."""


VLLM_RULES = (
    Rule("A full-attention layer holds cdiv(max_model_len, block_size) pages of block_size × kv_heads × (head + "
         "head_v) × dtype bytes; MLA one K-only head of kv_lora_rank + qk_rope_head_dim.",
         "vllm/v1/kv_cache_interface.py, FullAttentionSpec.max_memory_usage_bytes, MLAAttentionSpec"),
    Rule("A sliding-window layer admits the window plus one prefill chunk: cdiv(min(W − 1 + max_num_batched_tokens, "
         "max_model_len), block_size) + 1 pages (the window may start mid-block).",
         "vllm/v1/kv_cache_interface.py, SlidingWindowSpec.max_memory_usage_bytes"),
    Rule("A chunked local-attention layer admits its chunk plus one prefill chunk: cdiv(min(chunk + "
         "max_num_batched_tokens, max_model_len), block_size) pages.",
         "vllm/v1/kv_cache_interface.py, ChunkedLocalAttentionSpec.max_memory_usage_bytes"),
    Rule("A Mamba-like layer (Mamba-2, Gated DeltaNet, KDA) holds one page of its state per request (mamba_cache_mode "
         "none): the SSM or delta-rule state and kernel − 1 conv columns, at the state's dtypes.",
         "vllm/v1/kv_cache_interface.py, MambaSpec.page_size_bytes and max_memory_usage_bytes"),
    Rule(f"Hybrid with a state: the attention block grows to {KERNEL_ALIGNMENT} × cdiv(state page, "
         f"{KERNEL_ALIGNMENT} × attention bytes per token) tokens so one attention page holds a state page, and the "
         "state page is padded to the attention page.", "vllm/platforms/interface.py, Platform._align_hybrid_block_size"),
    Rule("Pages of different sizes are unified by enlarging smaller pages' block size by the ratio (it must divide); "
         "layers are grouped by spec, group size the fewest layers of a spec (the most, when under 1.5 × the fewest), "
         "each spec's last group padded; one block = one page in each of group_size layers.",
         "vllm/v1/core/kv_cache_utils.py, unify_kv_cache_spec_page_size, _get_kv_cache_groups_uniform_page_size"),
    Rule("DeepSeek Sparse Attention's indexer keys are a separate one-head cache of 132 bytes per token (128 FP8 + a "
         "4-byte scale) in each layer, beside the MLA latent; both are full attention, so one group with a page "
         "size per layer.", "vllm/model_executor/models/deepseek_v2.py, DeepseekV32IndexerCache.get_kv_cache_spec"),
    Rule(f"An FP8 cache of a sparse-attention model becomes fp8_ds_mla: {FP8_DS_MLA} bytes a token (the 512-element "
         "latent in FP8, its scales, the rotary key in BF16).",
         "vllm/model_executor/models/config.py, DeepseekV32ForCausalLM.verify_and_update_config; "
         "vllm/v1/kv_cache_interface.py, MLAAttentionSpec.real_page_size_bytes"),
    Rule("The pool is gpu_memory_utilization × the GPU's memory less the weights, the activation peak of a profiling "
         "run of max_num_batched_tokens and non-torch memory (here the weights only: the figures are upper bounds).",
         "vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory"),
)


def unsupported(kinds: tuple[LayerKind, ...], half: int = 4) -> str:
    """Why vLLM's allocation is not modelled for these kinds at a cache of `half` half-bytes ("" when it is)."""
    if half < 2:
        return "an FP4 cache (nvfp4 packs FP8 block scales beside the data) is not modelled here"
    for k in kinds:
        if k.ratio > 1:
            return f"{k.title}: DeepSeek-V4's compressed caches are not modelled here"
        if k.indexer and half == 2 and not sparse_mla_fp8(k.per_token, k.indexer, half):
            return f"{k.title}: the fp8_ds_mla layout of a latent other than 576 elements is not modelled here"
    try:
        layout(kinds, half, DEFAULTS)
    except ValueError as e:
        return str(e)
    return ""


def token_bytes(k: LayerKind, half: int) -> int:
    """Bytes one layer of an attention kind caches per token at the cache dtype (the indexer's keys apart; sparse
    attention's MLA at FP8 in the fp8_ds_mla layout)."""
    if sparse_mla_fp8(k.per_token, k.indexer, half):
        return FP8_DS_MLA
    return (k.per_token - k.indexer) * half // 2


def state_bytes(k: LayerKind) -> int:
    """Bytes of one layer's state page: every part at its dtype, conv states with kernel − 1 columns."""
    return sum(conv_kept(p.elements, p.columns) * p.bytes for p in k.state)


def hybrid_block(kinds: tuple[LayerKind, ...], half: int, s: Settings) -> int:
    """The attention block size: grown, where a recurrent state shares the pool, until one attention page holds the
    largest state page (the first attention kind's bytes per token set the page, as the model config's heads do)."""
    states = [state_bytes(k) for k in kinds if k.state]
    attention = [token_bytes(k, half) for k in kinds if not k.state]
    if not states or not attention:
        return s.block_size
    align = max(KERNEL_ALIGNMENT, s.block_size)
    return max(s.block_size, align * cdiv(max(states), align * attention[0]))


def layout(kinds: tuple[LayerKind, ...], half: int, s: Settings) -> Layout:
    """The model's specs, unified and grouped as vLLM's KV cache manager does (ValueError where vLLM refuses)."""
    block = hybrid_block(kinds, half, s)
    attention = [token_bytes(k, half) for k in kinds if not k.state]
    merged: dict[tuple[str, int, int, int], int] = {}  # (class, page, block, span) -> layers
    for k in kinds:
        for spec in _kind_specs(k, half, block, block * attention[0] if attention else 0):
            key = (spec.cls, spec.page, spec.block, spec.span)
            merged[key] = merged.get(key, 0) + spec.layers
    specs = [Spec(c, n, page, b, span) for (c, page, b, span), n in merged.items()]
    if len({(sp.cls, sp.span) for sp in specs}) == 1:
        return Layout(tuple(specs), 0, block)  # one class: one group, each layer with pages of its own size
    largest = max(sp.page for sp in specs)
    unified = []
    for sp in specs:
        if largest % sp.page:
            raise ValueError(f"a {sp.cls} page of {sp.page:,} bytes does not divide the largest, {largest:,}: vLLM "
                             "cannot unify the page sizes (unify_kv_cache_spec_page_size)")
        grown = sp.block if sp.cls == STATE else sp.block * (largest // sp.page)
        unified.append(Spec(sp.cls, sp.layers, largest, grown, sp.span))
    fewest, most = min(sp.layers for sp in unified), max(sp.layers for sp in unified)
    return Layout(tuple(unified), most if 2 * most < 3 * fewest else fewest, block)


def _kind_specs(k: LayerKind, half: int, block: int, padded_state: int) -> list[Spec]:
    """One kind's specs: a state page (padded to the attention page in a hybrid), or its attention pages and, for
    sparse attention, the indexer's."""
    if k.state:
        return [Spec(STATE, k.layers, max(padded_state, state_bytes(k)), 1)]
    cls = SLIDING if k.window else CHUNKED if k.chunk else FULL
    out = [Spec(cls, k.layers, block * token_bytes(k, half), block, k.window or k.chunk or 0)]
    if k.indexer:
        out.append(Spec(FULL, k.layers, block * indexer_bytes(k), block))
    return out


def indexer_bytes(k: LayerKind) -> int:
    """Bytes per token of one layer's indexer keys: FP8 elements and a float32 scale per 128 (132 for 128)."""
    return k.indexer + k.indexer // INDEXER_QUANT_BLOCK * 4


def pages(sp: Spec, context: int, s: Settings) -> int:
    """Pages one request of `context` tokens holds in one layer of spec `sp` (max_model_len = context)."""
    if sp.cls == STATE:
        return 1
    if sp.cls == SLIDING:
        return cdiv(min(sp.span - 1 + s.max_num_batched_tokens, context), sp.block) + 1
    if sp.cls == CHUNKED:
        return cdiv(min(sp.span + s.max_num_batched_tokens, context), sp.block)
    return cdiv(context, sp.block)


def slots(lay: Layout, sp: Spec) -> int:
    """Layers' worth of pages a spec takes per block: its layers, or whole groups of group_size (padding included)."""
    return sp.layers if not lay.group_size else cdiv(sp.layers, lay.group_size) * lay.group_size


def spec_bytes(lay: Layout, sp: Spec, context: int, sequences: int, s: Settings) -> int:
    return sequences * slots(lay, sp) * pages(sp, context, s) * sp.page


def total_bytes(kinds: tuple[LayerKind, ...], context: int, sequences: int, half: int = 4,
                s: Settings = DEFAULTS) -> int | None:
    """Bytes of the pages `sequences` requests of `context` tokens hold, or None where not modelled."""
    if unsupported(kinds, half):
        return None
    lay = layout(kinds, half, s)
    return sum(spec_bytes(lay, sp, context, sequences, s) for sp in lay.specs)


def budget(memory: int, s: Settings = DEFAULTS) -> int:
    """The memory vLLM may take: gpu_memory_utilization × the GPU's (weights and the pool inside it)."""
    return memory * s.utilization // 1000
