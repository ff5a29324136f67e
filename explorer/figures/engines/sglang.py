"""What SGLang 0.5.23 allocates, as data: token-granular pools sized from the memory budget, each rule with the file
and function of the wheel it was read from, evaluated on the layer kinds of explorer/model/components/serving.py.

SGLang does not size its cache from the requests: it splits the budget into pools once (a full pool of
`max_total_num_tokens` cells; for sliding-window models a second pool at swa_full_tokens_ratio of it; for models with
a recurrent state a pool of state slots taking mamba_full_memory_ratio / (1 + ratio) of the budget), then admits
requests while cells and slots are free. So the figures here are the pools a budget gives (`pools`), whether B
sequences of C tokens fit them (`admits`), and the smallest budget that admits them (`total_bytes`).

Read from the sglang 0.5.23 wheel on the package index: sglang/srt/model_executor/pool_configurator.py,
sglang/srt/mem_cache/kv_cache_configurator.py, sglang/srt/configs/mamba_utils.py and the defaults in
sglang/srt/arg_groups/fields/schedule.py. Not modelled, and the page says so: chunked local attention, DeepSeek-V4's
compressed caches, an FP4 cache, and mem_fraction_static (SGLang picks it per GPU; the budget here is the memory
less the weights).
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.figures.engines.rule import FP8_DS_MLA, Rule, conv_kept, milli, sparse_mla_fp8
from explorer.figures.fits import largest
from explorer.model.components.serving import LayerKind

SGLANG_VERSION = "SGLang 0.5.23 (the wheel on the package index)"
SWA_FULL_TOKENS_RATIO = 0.8
"""Cells of the sliding pool per cell of the full pool (schedule.py's fallback for swa_full_tokens_ratio)."""
MAMBA_FULL_MEMORY_RATIO = 0.9
"""State memory per byte of KV memory (schedule.py's fallback for mamba_full_memory_ratio): 0.9 / 1.9 of the budget."""
STATE_SLOTS_PER_REQUEST = 3
"""State slots a running request may need with the radix cache on (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO)."""
PAGE_SIZE = 1
"""Tokens per page: the pools are token-granular by default."""
INDEXER_QUANT_BLOCK = 128
"""DeepSeek Sparse Attention's indexer keys: uint8 FP8 elements plus a 4-byte scale per 128 (132 bytes for 128)."""


@dataclass(frozen=True, slots=True)
class Settings:
    swa_ratio: int = milli(SWA_FULL_TOKENS_RATIO)
    """swa_full_tokens_ratio in thousandths (800)."""
    mamba_ratio: int = milli(MAMBA_FULL_MEMORY_RATIO)
    """mamba_full_memory_ratio in thousandths (900)."""


DEFAULTS = Settings()


def clamped(s: Settings) -> Settings:
    """The settings as evaluated: a sliding ratio in (0, 1], as SGLang requires, and a positive state ratio."""
    return Settings(min(1000, max(1, s.swa_ratio)), max(1, s.mamba_ratio))


@dataclass(frozen=True, slots=True)
class Cells:
    """Bytes per cell of each pool, all layers of that pool together."""

    full: int
    """One token in every full-attention layer (MLA: the latent and rotary key; DSA: and the indexer's 132 bytes)."""
    swa: int
    """One token in every sliding layer (0: no sliding pool)."""
    window: int
    """The sliding window (0: none)."""
    state: int
    """One request's recurrent state in every state layer (0: no state pool)."""


@dataclass(frozen=True, slots=True)
class Pools:
    """What a budget gives: cells of each pool, state slots, and the requests the slots allow."""

    full_tokens: int
    swa_tokens: int
    state_slots: int
    max_requests: int | None
    """Requests the state slots allow (None: no state pool limits them)."""


SGLANG_RULES = (
    Rule("Pools are token-granular (page_size 1): a full-attention cell holds one token in every layer, kv_heads × "
         "(head + head_v) × dtype bytes per layer; MLA the latent and rotary key; DeepSeek Sparse Attention adds its "
         "indexer's 132 bytes (128 FP8 + a 4-byte scale) per layer; max_total_num_tokens = budget // cell.",
         "sglang/srt/model_executor/pool_configurator.py, DefaultPoolConfigurator._compute_cell_size and "
         "_compute_dsa_indexer_cell_size"),
    Rule(f"An FP8 cache of a sparse-attention model stores the latent in FP8 with a 4-byte scale per 128 and the "
         f"rotary key in BF16: {FP8_DS_MLA} bytes a token for 512 + 64.",
         "sglang/srt/mem_cache/kv_cache_configurator.py, calculate_mla_kv_cache_dim"),
    Rule("A sliding-window model keeps a second pool for its sliding layers at swa_full_tokens_ratio (default 0.8) of "
         "the full pool's tokens: full tokens = budget // (full cell + 0.8 × sliding cell), sliding tokens = 0.8 × "
         "that; a request takes min(its tokens, the window) + page_size sliding cells.",
         "sglang/srt/model_executor/pool_configurator.py, HybridSWAPoolConfigurator, validate_swa_pool_size"),
    Rule("A model with a recurrent state gives its state pool mamba_full_memory_ratio / (1 + ratio) of the budget "
         "(default 0.9 / 1.9): slots = that // state per request − 1 (a padding slot), the rest for KV cells; with the "
         "radix cache on a running request may hold 3 slots, so at most slots // 3 requests run.",
         "sglang/srt/mem_cache/kv_cache_configurator.py, _handle_max_mamba_cache, _calculate_mamba_ratio, "
         "resolve_max_num_reqs"),
    Rule("A state slot holds every state layer's SSM or delta-rule state (float32 unless the config names another "
         "dtype) and kernel − 1 conv columns (bfloat16).",
         "sglang/srt/configs/mamba_utils.py, mamba2_state_dtype, BaseLinearStateParams.mamba_cache_per_req"),
)


def unsupported(kinds: tuple[LayerKind, ...], half: int = 4) -> str:
    """Why SGLang's pools are not modelled for these kinds at a cache of `half` half-bytes ("" when they are)."""
    if half < 2:
        return "an FP4 cache (block scales beside the data) is not modelled here"
    for k in kinds:
        if k.ratio > 1:
            return f"{k.title}: DeepSeek-V4's compressed pools (DSV4PoolConfigurator) are not modelled here"
        if k.chunk:
            return f"{k.title}: SGLang's pool for chunked local attention is not modelled here"
    if any(k.indexer and half == 2 and not sparse_mla_fp8(k.per_token, k.indexer, half) for k in kinds):
        return "the scaled FP8 layout of a latent other than 576 elements is not modelled here"
    if len({k.window for k in kinds if k.window}) > 1:
        return "sliding layers of different windows: SGLang's pool sizing for them is not modelled here"
    return ""


def cells(kinds: tuple[LayerKind, ...], half: int) -> Cells:
    full = sum(k.layers * (_latent_bytes(k, half) + indexer_bytes(k)) for k in kinds if not k.state and not k.window)
    swa = sum(k.layers * k.per_token * half // 2 for k in kinds if k.window)
    state = sum(k.layers * sum(conv_kept(p.elements, p.columns) * p.bytes for p in k.state) for k in kinds)
    return Cells(full, swa, max((k.window or 0 for k in kinds), default=0), state)


def _latent_bytes(k: LayerKind, half: int) -> int:
    """One full layer's bytes a token beside the indexer: sparse attention's MLA at FP8 in the scaled layout."""
    return FP8_DS_MLA if sparse_mla_fp8(k.per_token, k.indexer, half) else (k.per_token - k.indexer) * half // 2


def indexer_bytes(k: LayerKind) -> int:
    return k.indexer + k.indexer // INDEXER_QUANT_BLOCK * 4


def pools(c: Cells, budget: int, s: Settings = DEFAULTS) -> Pools:
    """The pools SGLang makes of `budget` bytes (after the weights): the state pool first, then the cells."""
    slots, requests, rest = 0, None, budget
    if c.state:
        state_budget = budget * s.mamba_ratio // (1000 + s.mamba_ratio)
        slots = max(state_budget // c.state - 1, 0)
        rest = budget - (slots + 1) * c.state
        requests = slots // STATE_SLOTS_PER_REQUEST
    if not c.swa:
        return Pools(max(rest, 0) // c.full if c.full else 0, 0, slots, requests)
    full = max(rest, 0) * 1000 // (1000 * c.full + s.swa_ratio * c.swa) if c.full else max(rest, 0) // c.swa
    swa = full * s.swa_ratio // 1000 if c.full else full
    return Pools(full if c.full else 0, swa, slots, requests)


def admits(c: Cells, p: Pools, context: int, sequences: int) -> bool:
    """Whether the pools hold `sequences` requests of `context` tokens at once."""
    if c.full and p.full_tokens < context * sequences:
        return False
    if c.swa and p.swa_tokens < sequences * (min(context, c.window) + PAGE_SIZE):
        return False
    return p.max_requests is None or p.max_requests >= sequences


def total_bytes(kinds: tuple[LayerKind, ...], context: int, sequences: int, half: int = 4,
                s: Settings = DEFAULTS) -> int | None:
    """The smallest budget whose pools admit `sequences` requests of `context` tokens, or None where not modelled:
    the pools only grow with the budget, so double a budget until it admits them, then bisect."""
    if unsupported(kinds, half):
        return None
    c = cells(kinds, half)
    hi = 1
    while not admits(c, pools(c, hi, s), context, sequences):
        hi *= 2
    lo = hi // 2  # not admitted at lo (or lo = 0 when hi = 1), admitted at hi
    while lo < hi - 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if admits(c, pools(c, mid, s), context, sequences) else (mid, hi)
    return hi


def max_context(kinds: tuple[LayerKind, ...], budget: int, maximum: int, half: int = 4, s: Settings = DEFAULTS) -> int:
    """The longest context (≤ the maximum) of one request the pools of `budget` bytes admit; 0 when none."""
    c = cells(kinds, half)
    p = pools(c, max(budget, 0), s)
    return largest(lambda n: admits(c, p, n, 1), maximum)


def max_sequences(kinds: tuple[LayerKind, ...], budget: int, context: int, half: int = 4,
                  s: Settings = DEFAULTS) -> int:
    """The most requests of `context` tokens the pools of `budget` bytes admit at once."""
    c = cells(kinds, half)
    p = pools(c, max(budget, 0), s)
    return largest(lambda n: admits(c, p, context, n), max(1, p.full_tokens + p.swa_tokens))
