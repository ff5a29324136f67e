"""vLLM's pages and SGLang's pools (explorer/figures/engines/vllm.py and sglang.py) against values worked by hand from
the engines' rules and the recorded configs, each beside a deliberately wrong rule that misses it. Neither engine runs
here (they need a GPU); the rules are read from vLLM's public tree and the SGLang 0.5.23 wheel, as the modules say."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_calculator import prepared

from explorer.figures.calculator import evaluate
from explorer.figures.engines import sglang, vllm

GB = 10 ** 9


def kinds(slug: str):
    return prepared(slug).figures.serving.kinds


# ------------------------------------------------------------------------------------------------------ vLLM

def test_qwen3_5_27b_gets_784_token_blocks():
    """Qwen3.5-27B (config: 48 value heads and 16 key heads of 128 in its Gated DeltaNet layers, conv kernel 4; 4
    key/value heads of 256 in its attention layers). One state page: the float32 delta-rule state 48 × 128 × 128 ×
    4 = 3,145,728 bytes, and the conv state's kernel − 1 = 3 columns of 2 × 16 × 128 + 48 × 128 = 10,240 channels in
    bfloat16, 61,440 bytes: 3,207,168. An attention token: 2 × 4 × 256 × 2 = 4,096 bytes. The block grows to
    16 × cdiv(3,207,168, 16 × 4,096) = 16 × cdiv(3,207,168, 65,536) = 16 × 49 = 784 tokens (48.94 rounds up)."""
    k = kinds("qwen3.5-27b")
    assert vllm.hybrid_block(k, 4, vllm.DEFAULTS) == 784
    lay = vllm.layout(k, 4, vllm.DEFAULTS)
    assert {sp.page for sp in lay.specs} == {784 * 4_096}  # the state page padded to the attention page
    assert evaluate(prepared("qwen3.5-27b").figures.serving, 4_096).get("count-vllm-block").value == 784


def test_qwen3_5_27b_pages_at_8192_tokens():
    """At max_model_len 8,192, one request: each of the 16 attention layers holds cdiv(8,192, 784) = 11 pages (10.45
    rounds up), each of the 48 state layers one; the 16 and 48 layers form groups of 16 (the fewer), none padded:
    (16 × 11 + 48) × 784 × 4,096 = 224 × 3,211,264 = 719,323,136 bytes."""
    assert vllm.total_bytes(kinds("qwen3.5-27b"), 8_192, 1) == 719_323_136
    assert vllm.total_bytes(kinds("qwen3.5-27b"), 8_192, 3) == 3 * 719_323_136


def test_the_full_conv_kernel_misses_784():
    """Mutation: a state page with the full kernel (4 columns, as the theory counts the reference's cache), 81,920
    bytes of conv, 3,227,648 in all: 16 × cdiv(3,227,648, 65,536) = 16 × 50 = 800, not 784."""
    full_kernel = tuple(replace(k, state=tuple(replace(p, columns=0) for p in k.state)) for k in kinds("qwen3.5-27b"))
    assert vllm.hybrid_block(full_kernel, 4, vllm.DEFAULTS) == 800 != 784


def test_gpt_oss_20b_sliding_layers_admit_the_window_plus_one_prefill_chunk():
    """gpt-oss-20b: 12 sliding layers of window 128 and 12 full ones, 8 key/value heads of 64: a token is
    2 × 8 × 64 × 2 = 2,048 bytes per layer, a page of 16 tokens 32,768. At max_model_len 131,072 and
    max_num_batched_tokens 8,192, a sliding layer holds cdiv(min(128 − 1 + 8,192, 131,072), 16) + 1 =
    cdiv(8,319, 16) + 1 = 520 + 1 = 521 pages = 8,336 tokens, 65 × the window; a full layer cdiv(131,072, 16) =
    8,192 pages. Equal counts (12 and 12): one group each, no padding. In all 12 × 32,768 × (521 + 8,192) =
    393,216 × 8,713 = 3,426,091,008 bytes."""
    k = kinds("gpt-oss-20b")
    lay = vllm.layout(k, 4, vllm.DEFAULTS)
    sliding = next(sp for sp in lay.specs if sp.cls == vllm.SLIDING)
    assert vllm.pages(sliding, 131_072, vllm.DEFAULTS) * sliding.block == 8_336
    assert vllm.total_bytes(k, 131_072, 1) == 3_426_091_008
    two_k = vllm.Settings(max_num_batched_tokens=2_048)  # the smaller GPUs' default: cdiv(2,175, 16) + 1 = 137 pages
    assert vllm.pages(sliding, 131_072, two_k) == 137


def test_the_window_alone_or_no_block_rounding_misses(monkeypatch):
    """Mutations: a sliding layer that admits only its window (cdiv(128, 16) = 8 pages), or a full layer's pages
    not rounded up to whole blocks (131,067 tokens: 8,191 pages, not 8,192), miss 3,426,091,008 bytes."""
    real = vllm.pages
    monkeypatch.setattr(vllm, "pages", lambda sp, c, s: -(-min(sp.span, c) // sp.block) if sp.cls == vllm.SLIDING
                        else real(sp, c, s))
    assert vllm.total_bytes(kinds("gpt-oss-20b"), 131_072, 1) == 393_216 * (8 + 8_192) != 3_426_091_008
    monkeypatch.setattr(vllm, "pages", real)
    assert vllm.total_bytes(kinds("gpt-oss-20b"), 131_072 - 5, 1) == 3_426_091_008  # 131,067 still 8,192 pages
    monkeypatch.setattr(vllm, "pages", lambda sp, c, s: real(sp, c, s) if sp.cls != vllm.FULL else c // sp.block)
    assert vllm.total_bytes(kinds("gpt-oss-20b"), 131_072 - 5, 1) != 3_426_091_008


def test_deepseek_v3_2_indexer_keys_are_132_bytes_beside_the_latent(monkeypatch):
    """DeepSeek-V3.2: 61 layers, each caching the MLA latent and rotary key, 512 + 64 = 576 elements (BF16: 1,152
    bytes a token), and the indexer's key, 128 FP8 bytes + a 4-byte scale = 132. Both are full attention: one group,
    each layer its own page size. At 4,096 tokens: 61 × 256 pages × 16 × (1,152 + 132) = 320,815,104 bytes."""
    assert vllm.total_bytes(kinds("deepseek-v3.2"), 4_096, 1) == 320_815_104
    monkeypatch.setattr(vllm, "indexer_bytes", lambda k: 2 * k.indexer)  # mutation: the indexer keys at BF16
    assert vllm.total_bytes(kinds("deepseek-v3.2"), 4_096, 1) == 61 * 256 * 16 * (1_152 + 256) != 320_815_104


def test_an_fp8_sparse_mla_cache_takes_656_bytes_a_token(monkeypatch):
    """DeepSeek-V3.2 at an FP8 cache: both engines store the 512-element latent in FP8, a 4-byte scale per 128 of it
    (16 bytes) and the 64-element rotary key in BF16 (128): 656 bytes, and the indexer's 132 beside it. vLLM at 4,096
    tokens: 61 × 256 pages × 16 × (656 + 132) = 61 × 4,096 × 788 = 196,886,528 bytes; an SGLang cell 61 × 788 =
    48,068 bytes. Mutation: the latent as plain FP8 (576 bytes) misses both."""
    k = kinds("deepseek-v3.2")
    assert vllm.total_bytes(k, 4_096, 1, half=2) == 196_886_528
    assert sglang.cells(k, 2).full == 48_068
    monkeypatch.setattr(vllm, "FP8_DS_MLA", 576)
    monkeypatch.setattr(sglang, "FP8_DS_MLA", 576)
    assert vllm.total_bytes(k, 4_096, 1, half=2) == 61 * 4_096 * (576 + 132) != 196_886_528
    assert sglang.cells(k, 2).full == 61 * (576 + 132) != 48_068


def test_vllm_is_not_modelled_for_compressed_caches_or_fp4():
    assert "compressed caches" in vllm.unsupported(kinds("deepseek-v4-flash"))
    assert "FP4" in vllm.unsupported(kinds("llama-3.1-8b"), half=1)
    assert vllm.unsupported(kinds("llama-3.1-8b")) == ""
    assert "vllm" not in evaluate(prepared("llama-3.1-8b").figures.serving, 4_096, kv_dtype="FP4").keys()


def test_vllm_fits_use_the_utilization_share(monkeypatch):
    """Llama 3.1 8B on 24 GB: vLLM may take 0.9 × 24 × 10⁹ = 21.6 × 10⁹ bytes; one token is 32 layers × 2 × 8 × 128
    × 2 = 131,072 bytes, a block of 16 is 2,097,152, so after the weights W the longest context is
    ⌊(21.6 × 10⁹ − W) / 2,097,152⌋ × 16 tokens (a context takes whole blocks)."""
    s = prepared("llama-3.1-8b").figures.serving
    weights = dict(s.weights)["as stored"]
    e = evaluate(s, 8_192, gpu_gb=24)
    assert e.get("fits-vllm-context").value == (21_600_000_000 - weights) // 2_097_152 * 16
    assert e.get("fits-vllm-sequences").value == (21_600_000_000 - weights) // (512 * 2_097_152)
    monkeypatch.setattr(vllm, "budget", lambda memory, s=vllm.DEFAULTS: memory)  # mutation: the whole GPU
    assert evaluate(s, 8_192, gpu_gb=24).get("fits-vllm-context").value != e.get("fits-vllm-context").value


# ---------------------------------------------------------------------------------------------------- SGLang

def test_sglang_splits_a_sliding_model_0_8_to_1():
    """gpt-oss-20b in a 10⁹-byte budget: a full cell is 12 full layers × 2,048 = 24,576 bytes, a sliding cell as
    much. Full tokens = ⌊10⁹ / (24,576 + 0.8 × 24,576 = 44,236.8)⌋ = 22,605 (22,606 × 44,236.8 = 1,000,017,100.8 is
    over); sliding tokens = ⌊0.8 × 22,605⌋ = 18,084, and 40,689 × 24,576 = 999,972,864 bytes are allocated. The
    longest single context is the full pool's 22,605; at 8,192 tokens ⌊22,605 / 8,192⌋ = 2 requests fit (the sliding
    pool would take ⌊18,084 / (128 + 1)⌋ = 140); at 100 tokens the sliding pool binds: a request takes
    min(100, 128) + 1 = 101 of its cells, ⌊18,084 / 101⌋ = 179 requests, where the full pool holds ⌊22,605 / 100⌋ =
    226."""
    k = kinds("gpt-oss-20b")
    p = sglang.pools(sglang.cells(k, 4), GB)
    assert (p.full_tokens, p.swa_tokens) == (22_605, 18_084)
    assert sglang.max_context(k, GB, 131_072) == 22_605
    assert sglang.max_sequences(k, GB, 8_192) == 2
    assert sglang.max_sequences(k, GB, 100) == 179


def test_one_pool_for_all_layers_misses_the_split(monkeypatch):
    """Mutation: pools without the ratio (every layer in one pool of ⌊10⁹ / 49,152⌋ = 20,345 tokens) miss 22,605."""
    monkeypatch.setattr(sglang, "pools", lambda c, budget, s=sglang.DEFAULTS: sglang.Pools(
        budget // (c.full + c.swa), budget // (c.full + c.swa), 0, None))
    assert sglang.max_context(kinds("gpt-oss-20b"), GB, 131_072) == 20_345 != 22_605


def test_sglang_gives_states_0_9_of_1_9(monkeypatch):
    """Qwen3.5-27B in 10¹⁰ bytes: one request's state is 48 layers × 3,207,168 = 153,944,064 bytes. The state pool
    gets ⌊10¹⁰ × 0.9 / 1.9⌋ = 4,736,842,105 bytes: ⌊4,736,842,105 / 153,944,064⌋ − 1 = 30 − 1 = 29 slots (a padding
    slot), 30 × 153,944,064 = 4,618,321,920 bytes; the rest, 5,381,678,080, holds ⌊5,381,678,080 / 65,536⌋ = 82,117
    cells of the 16 attention layers' 16 × 4,096 = 65,536 bytes. With 3 slots a request, ⌊29 / 3⌋ = 9 run at once."""
    c = sglang.cells(kinds("qwen3.5-27b"), 4)
    assert (c.state, c.full) == (153_944_064, 65_536)
    p = sglang.pools(c, 10 * GB)
    assert (p.state_slots, p.full_tokens, p.max_requests) == (29, 82_117, 9)
    assert sglang.max_sequences(kinds("qwen3.5-27b"), 10 * GB, 4_096) == 9  # 9 × 4,096 cells fit; the slots cap
    # mutation: half the budget to the states (ratio 1): ⌊5 × 10⁹ / 153,944,064⌋ − 1 = 31 slots, not 29
    assert sglang.pools(c, 10 * GB, sglang.Settings(mamba_ratio=1000)).state_slots == 31 != 29


@pytest.mark.parametrize("slug,context,sequences", [("gpt-oss-20b", 8_192, 2), ("qwen3.5-27b", 4_096, 3),
                                                    ("llama-3.1-8b", 5_000, 7), ("deepseek-v3.2", 2_049, 1)])
def test_sglang_smallest_budget_is_the_smallest(slug, context, sequences):
    """The budget `total_bytes` gives admits the requests and one byte less does not."""
    k = kinds(slug)
    need = sglang.total_bytes(k, context, sequences)
    assert need is not None
    c = sglang.cells(k, 4)
    assert sglang.admits(c, sglang.pools(c, need), context, sequences)
    assert not sglang.admits(c, sglang.pools(c, need - 1), context, sequences)


def test_sglang_llama_3_1_8b_is_one_cell_a_token():
    """No sliding layers, no state: the budget for 7 × 5,000 tokens is 35,000 cells × 131,072 bytes exactly."""
    assert sglang.total_bytes(kinds("llama-3.1-8b"), 5_000, 7) == 35_000 * 131_072


def test_sglang_is_not_modelled_for_chunked_or_compressed_kinds():
    assert "chunked" in sglang.unsupported(kinds("llama-4-scout-17b-16e"))
    assert "compressed" in sglang.unsupported(kinds("deepseek-v4-flash"))
    assert "sglang" not in evaluate(prepared("llama-4-scout-17b-16e").figures.serving, 4_096).keys()


def test_the_json_twin_carries_each_engine_with_its_rules_and_figures():
    """site/api/SLUG.json: per engine its version, rules with sources, defaults, and the figures at the table's
    contexts: gpt-oss-20b's vLLM pages at 131,072 tokens are the 3,426,091,008 bytes worked above."""
    from explorer.views import api as api_mod

    s = prepared("gpt-oss-20b").figures.serving
    api = {"llama.cpp": api_mod._llama_cpp(s.kinds, s.max_context), "vLLM": api_mod._vllm(s.kinds, s.max_context),
           "SGLang": api_mod._sglang(s.kinds, s.max_context)}  # as model_api's "engines" (a whole build needs torch)
    assert all(e["version"] and all(r["source"] for r in e["rules"]) for e in api.values())
    assert {"context": 131_072, "bytes": 3_426_091_008} in api["vLLM"]["bytes_one_sequence"]
    assert api["vLLM"]["defaults"]["max_num_batched_tokens"] == 8_192
    assert api["SGLang"]["cell_bytes"] == {"full": 24_576, "sliding": 24_576, "window": 128, "state_per_request": 0}
    assert api["SGLang"]["defaults"]["swa_full_tokens_ratio"] == 0.8
