"""llama.cpp's allocation (explorer/figures/engines/llama_cpp.py) against what llama.cpp 0c1e570 itself logged when it loaded two real
GGUF files (llama-cpp-python 0.3.36, recorded by hand from its verbose log; the engine is not built here):
- SmolLM2-135M-Instruct at n_ctx = 4096: `llama_kv_cache: size = 90.00 MiB (4096 cells, 30 layers, 1/1 seqs),
  K (f16): 45.00 MiB, V (f16): 45.00 MiB`;
- Gemma 3 270M at n_ctx = 32768: with the default context parameters ("using full-size SWA cache") the 15 sliding
  layers hold 32,768 cells each, 480.00 MiB, beside the 3 global layers' 96.00 MiB; with swa_full off the sliding
  layers hold 1,024 cells (512 + n_ubatch 512), 15.00 MiB."""

from __future__ import annotations

from test_calculator import prepared

from explorer.figures import engines
from explorer.figures.calculator import evaluate

MIB = 2 ** 20


def test_smollm2_at_4096_is_the_logged_90_mib():
    kinds = prepared("smollm2-135m").figures.serving.kinds
    assert engines.total_bytes(kinds, 4_096, 1) == 90 * MIB
    assert evaluate(prepared("smollm2-135m").figures.serving, 4_096).get("llama-cpp").value == 90 * MIB


def test_gemma_3_270m_sliding_layers_full_size_by_default_and_a_window_plus_ubatch_without():
    kinds = prepared("gemma-3-270m").figures.serving.kinds
    sliding, full = sorted(kinds, key=lambda k: k.window is None)
    assert (sliding.layers, full.layers) == (15, 3)
    assert engines.kind_bytes(sliding, 32_768, 1) == 480 * MIB
    assert engines.kind_bytes(full, 32_768, 1) == 96 * MIB
    assert engines.cells(sliding, 32_768, 1, swa_full=False) == 1_024
    assert engines.kind_bytes(sliding, 32_768, 1, swa_full=False) == 15 * MIB


def test_padding_and_a_wrong_rule_fail():
    """Mutations: without the padding to 256 cells, or with the window alone (no micro-batch), the logged sizes
    are missed; a context of 4,000 tokens pads to 4,096 cells."""
    smol = prepared("smollm2-135m").figures.serving.kinds
    assert engines.total_bytes(smol, 4_000, 1) == 90 * MIB
    sliding = next(k for k in prepared("gemma-3-270m").figures.serving.kinds if k.window)
    no_ubatch = engines.kind_bytes(sliding, 32_768, 1, n_ubatch=0, swa_full=False)
    assert no_ubatch != 15 * MIB
    assert sum(k.layers * k.per_token * 4_000 * 2 for k in smol) != 90 * MIB


def test_kinds_llama_cpp_allocates_otherwise_get_no_figure():
    for slug, why in (("qwen3.5-27b", "recurrent state"), ("deepseek-v4-flash", "compressed caches"),
                      ("deepseek-v3.2", "indexer cache")):
        s = prepared(slug).figures.serving
        assert why in engines.unsupported(s.kinds)
        assert "llama-cpp" not in [line.key for line in evaluate(s, 4_096).lines]
    kimi = prepared("kimi-k2").figures.serving.kinds  # MLA: K alone, the 576-element latent and rotary key
    assert engines.total_bytes(kimi, 4_096, 1) == 61 * 576 * 4_096 * 2


def test_each_sequence_gets_its_own_padded_stream():
    """llama.cpp's default (kv_unified off) splits the padded context into one stream per sequence and pads each
    again (src/llama-context.cpp): three sequences of 100 tokens take 3 × 256 = 768 cells, where padding their 300
    tokens once (the rule this replaced) gives 512. A sliding layer with swa_full off admits its window plus one
    micro-batch in each stream (src/llama-kv-cache-iswa.cpp), not the windows of all sequences in one."""
    smol = next(iter(prepared("smollm2-135m").figures.serving.kinds))
    assert engines.cells(smol, 100, 3) == 768
    assert engines.cells(smol, 100, 3) != engines.pad(100 * 3)
    assert engines.cells(smol, 4_096, 4) == 16_384
    assert engines.cells(smol, 1_000, 3) == 3 * 1_024  # pad(3,000) = 3,072; / 3 = 1,024, already padded
    sliding = next(k for k in prepared("gemma-3-270m").figures.serving.kinds if k.window)
    assert engines.cells(sliding, 32_768, 4, swa_full=False) == 4 * 1_024  # pad(512 + 512) per stream
    assert engines.cells(sliding, 200, 4, swa_full=False) == 4 * 256  # the stream is shorter than the window
    assert engines.cells(sliding, 32_768, 4, swa_full=True) == 4 * 32_768
