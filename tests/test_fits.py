"""What fits in a memory budget and the speed bounds (explorer/figures/fits.py, weights_read.py and the calculator's
fit and bound lines), against values worked by hand from each model's config.json, never from the code under test:
Llama 3.1 8B (dense) and Qwen3-30B-A3B (128 experts, 8 routed per token), on the H100 SXM and RTX 4090 presets; and
the page's script, which must show exactly the build's numbers for a chosen GPU."""

from __future__ import annotations

import pytest
from test_browser import browser, tabs  # noqa: F401  (the same Chromium fixtures)
from test_calculator import ROOT, _render_pages, _shown_and_wanted, prepared

from explorer.figures import fits, weights_read
from explorer.figures.calculator import evaluate
from explorer.figures.model_figures import not_run_for_text, routed_children

H100, RTX4090 = "NVIDIA H100 SXM 80GB", "NVIDIA GeForce RTX 4090 24GB"

# Llama 3.1 8B: hidden 4,096, 32 layers, 32 query and 8 key/value heads of 128, MLP 14,336, vocab 128,256, untied.
LLAMA_LAYER = 2 * 4_096 * 4_096 + 2 * 4_096 * 1_024 + 3 * 4_096 * 14_336 + 2 * 4_096  # attention, MLP, two norms
LLAMA_READ = 32 * LLAMA_LAYER + 4_096 + 128_256 * 4_096 + 4_096  # layers, final norm, whole head, one embedding row
LLAMA_STORED = 2 * (32 * LLAMA_LAYER + 4_096 + 2 * 128_256 * 4_096)  # every parameter at BF16, embedding and head
LLAMA_KV_TOKEN = 32 * 2 * 8 * 128 * 2  # bytes per token of context at BF16: layers × K and V × heads × width × 2

# Qwen3-30B-A3B: hidden 2,048, 48 layers, 32 query and 4 key/value heads of 128 (QK-norm), 128 experts of 768, top 8,
# vocab 151,936, untied.
QWEN_ATTN = 2_048 * 4_096 + 2 * 2_048 * 512 + 4_096 * 2_048 + 2 * 128
QWEN_EXPERT = 3 * 2_048 * 768
QWEN_LAYER = QWEN_ATTN + 2 * 2_048 + 128 * 2_048 + 8 * QWEN_EXPERT  # norms, router, the 8 routed experts
QWEN_READ = 48 * QWEN_LAYER + 2_048 + 151_936 * 2_048 + 2_048


def test_dense_bytes_read_per_token_and_the_bounds_on_an_h100():
    s = prepared("llama-3.1-8b").figures.serving
    assert dict(s.read)["BF16"] == dict(s.read)["as stored"] == 2 * LLAMA_READ == 15_009_857_536
    assert dict(s.weights)["as stored"] == LLAMA_STORED
    e = evaluate(s, 4_096, batch=4, gpu=H100)
    cache = LLAMA_KV_TOKEN * 4_096
    assert e.get("bound-decode").value == 3_350 * 10 ** 9 // (2 * LLAMA_READ + cache) == 215
    assert e.get("bound-aggregate").value == 4 * 3_350 * 10 ** 9 // (2 * LLAMA_READ + 4 * cache) == 781
    # prefill: 2 FLOPs per multiply-add of every matrix (no embedding row) per token, plus 4 × 32 heads × 128
    # FLOPs per key per layer over the causal 1 + 2 + … + 4,096 keys; at the BF16 dense peak, 989.5 TFLOP/s
    flops = 4_096 * 2 * (LLAMA_READ - 4_096) + 32 * 4 * 32 * 128 * (4_096 * 4_097 // 2)
    assert e.get("prefill").value == flops
    assert e.get("bound-prefill").value == -(-flops * 10 ** 6 // (989_500 * 10 ** 9)) == 66_579
    assert e.get("fits-sequences").value == (80 * 10 ** 9 - LLAMA_STORED) // cache == 119
    assert e.get("fits-context").value == 131_072  # the whole context fits in 80 GB


def test_dense_what_fits_in_24_gb_in_theory_and_in_llama_cpp():
    s = prepared("llama-3.1-8b").figures.serving
    e = evaluate(s, 4_096, gpu=RTX4090)
    room = 24 * 10 ** 9 - LLAMA_STORED
    assert e.get("fits-context").value == room // LLAMA_KV_TOKEN == 60_573
    assert e.get("fits-llama-context").value == room // LLAMA_KV_TOKEN // 256 * 256 == 60_416  # cells pad to 256
    assert e.get("fits-llama-sequences").value == room // (LLAMA_KV_TOKEN * 4_096) == 14
    assert "bound-prefill" in [line.key for line in e.lines]


def test_moe_reads_k_of_n_experts():
    p = prepared("qwen3-30b-a3b")
    s = p.figures.serving
    assert dict(s.read)["as stored"] == dict(s.read)["BF16"] == 2 * QWEN_READ == 6_083_739_648
    assert dict(s.read)["FP8"] == QWEN_READ
    e = evaluate(s, 4_096, gpu=H100)
    cache = 48 * 2 * 4 * 128 * 2 * 4_096
    assert e.get("bound-decode").value == 3_350 * 10 ** 9 // (2 * QWEN_READ + cache) == 516


def test_counting_every_expert_fails_the_hand_value():
    """Mutation: a token that read all 128 experts (no routed program named) reads 120 more per layer."""
    p = prepared("qwen3-30b-a3b")
    every = weights_read.read_as_stored(p.spec, p.ledger, {}, not_run_for_text(), False)
    assert every == 2 * (QWEN_READ + 48 * 120 * QWEN_EXPERT) != 2 * QWEN_READ
    right = weights_read.read_as_stored(p.spec, p.ledger, routed_children(), not_run_for_text(), False)
    assert right == 2 * QWEN_READ


def test_peaks_fall_back_to_a_wider_dtype_and_apple_has_none():
    a100, apple = fits.gpu("NVIDIA A100 SXM 80GB"), fits.gpu("Apple M4 Max 128GB (unified memory)")
    assert a100 is not None and apple is not None
    assert fits.peak(a100, "FP4") == ("BF16", 312 * 10 ** 12)
    assert fits.peak(apple, "BF16") is None
    e = evaluate(prepared("llama-3.1-8b").figures.serving, 4_096, gpu=apple.name)
    assert "bound-prefill" not in [line.key for line in e.lines] and e.get("bound-decode").value == \
        546 * 10 ** 9 // (2 * LLAMA_READ + LLAMA_KV_TOKEN * 4_096)
    assert all(g.source and g.memory and g.bandwidth for g in fits.GPUS)


def test_the_api_plan_carries_each_preset():
    from explorer.figures.calculator import plan
    rows = plan(prepared("llama-3.1-8b").figures.serving)
    assert [r["gpu"] for r in rows] == [g.name for g in fits.GPUS]
    h100 = next(r for r in rows if r["gpu"] == H100)
    assert {f["key"]: f["value"] for f in h100["figures"]}["bound-decode"] == 215


FIT_CASES = {  # (case as test_calculator's, preset)
    "llama-3.1-8b": ((4_096, 4, "BF16", "as stored", 0), H100),
    "qwen3-30b-a3b": ((10_001, 3, "FP8", "FP8", 0), "NVIDIA H200 SXM 141GB"),
    "gemma-3-270m": ((20_001, 5, "BF16", "MXFP4", 0, "300", False), "NVIDIA GeForce RTX 5090 32GB"),
    "kimi-k2": ((40_001, 2, "FP8", "as stored", 2_000), "Apple M4 Max 128GB (unified memory)"),
    "qwen3.5-27b": ((65_537, 8, "BF16", "4-bit", 0), "NVIDIA B200 (DGX B200, per GPU)"),
}


@pytest.fixture(scope="module")
def fit_pages(tmp_path_factory):
    return _render_pages(tmp_path_factory.mktemp("fits"), (ROOT / "static" / "calc.js").read_text("utf-8"), FIT_CASES)


@pytest.mark.parametrize("slug", FIT_CASES)
def test_calculator_shows_the_builds_fits_and_bounds(tabs, fit_pages, slug):  # noqa: F811 (the fixture)
    case, preset = FIT_CASES[slug]
    shown, expected, want = _shown_and_wanted(tabs, fit_pages, slug, case, preset)
    assert any(line.key.startswith("bound") for line in want.lines)
    assert shown == expected


def test_a_script_that_reads_the_weights_per_sequence_is_caught(tabs, tmp_path):  # noqa: F811 (the fixture)
    script = (ROOT / "static" / "calc.js").read_text("utf-8")
    wrong = script.replace("bw * batch / (read + batch * cache)", "bw * batch / (batch * (read + cache))")
    assert wrong != script
    site = _render_pages(tmp_path / "site", wrong, ["llama-3.1-8b"])
    case, preset = FIT_CASES["llama-3.1-8b"]
    shown, expected, _ = _shown_and_wanted(tabs, site, "llama-3.1-8b", case, preset)
    assert shown != expected


def test_gpt2_reads_one_row_of_each_embedding_table_and_its_tied_head_whole():
    """GPT-2 stores F32 and ties its head to the token table: a token reads every matrix of its 12 blocks, the
    final norm, the 50,257 × 768 table once (as the head) and one 768-wide row of each table; no causal mask."""
    norms = 2 * 2 * 768  # ln_1 and ln_2, weight and bias
    block = norms + (768 * 2_304 + 2_304) + (768 * 768 + 768) + (768 * 3_072 + 3_072) + (3_072 * 768 + 768)
    params = 12 * block + 2 * 768 + 50_257 * 768 + 768 + 768  # ln_f, the head (wte), a row of wte and of wpe
    assert params == 123_654_912
    assert dict(prepared("gpt2").figures.serving.read)["as stored"] == 4 * params
