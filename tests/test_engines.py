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
    for slug, why in (("deepseek-v4-flash", "compressed caches"),):
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


def test_a_hybrid_model_gets_its_attention_cache_and_f32_state_rows_per_sequence():
    """Qwen3.5-27B, worked from its config: 16 gated-attention layers of 4 K/V heads × 256 (2 × 4 × 256 = 2,048
    elements a cell) and 48 Gated DeltaNet layers, each sequence one F32 row of the recurrent state (48 value heads ×
    128 × 128 = 786,432) and one of the conv state with kernel − 1 = 3 of its 4 columns ((2 × 16 × 128 + 48 × 128) ×
    3 = 30,720), src/llama-memory-recurrent.cpp. Two sequences of 4,096 tokens: 16 × 2,048 × 8,192 × 2 +
    48 × 817,152 × 2 × 4. The full kernel (the theory's conv state) or the conv state at its own dtype misses."""
    s = prepared("qwen3.5-27b").figures.serving
    attention = 16 * 2_048 * 2 * 4_096 * 2
    rows = 48 * (48 * 128 * 128 + (2 * 16 * 128 + 48 * 128) * 3) * 2 * 4
    assert engines.total_bytes(s.kinds, 4_096, 2) == attention + rows == 850_657_280
    assert evaluate(s, 4_096, 2).get("llama-cpp").value == attention + rows
    full_kernel = 48 * (48 * 128 * 128 + (2 * 16 * 128 + 48 * 128) * 4) * 2 * 4
    assert engines.total_bytes(s.kinds, 4_096, 2) != attention + full_kernel
    assert engines.total_bytes(s.kinds, 8_192, 1) == 16 * 2_048 * 8_192 * 2 + rows // 2  # rows per sequence, not cell
    nemotron = prepared("nemotron-h-56b").figures.serving.kinds  # Mamba-2, its conv state BF16 in the reference: F32
    mamba = next(k for k in nemotron if k.state)
    conv = next(p for p in mamba.state if p.name == "conv state")
    assert (conv.dtype, engines.state_row(mamba)) == ("bfloat16", 256 * 64 * 256 + (256 * 64 + 2 * 8 * 256) * 3)


def test_flash_attention_off_widens_every_v_to_the_widest():
    """MiMo-V2-Flash, from its config: global layers cache 4 K/V heads of 192-wide keys and 128-wide values
    (768 + 512 a cell), sliding layers 8 heads (1,536 + 1,024). Without flash attention V is stored transposed at
    n_embd_v_gqa_max() = 1,024 in every layer (src/llama-kv-cache.cpp), so a global cell holds 768 + 1,024; the
    sliding layers and MLA (K alone) are unchanged."""
    kinds = prepared("mimo-v2-flash").figures.serving.kinds
    glob = [k for k in kinds if not k.window]
    sliding = next(k for k in kinds if k.window)
    assert {engines.cell_elements(k, kinds, flash_attn=True) for k in glob} == {4 * (192 + 128)}
    assert {engines.cell_elements(k, kinds, flash_attn=False) for k in glob} == {4 * 192 + 8 * 128}
    assert engines.cell_elements(sliding, kinds, flash_attn=False) == 8 * (192 + 128)
    on = engines.total_bytes(kinds, 4_096, 1)
    off = engines.total_bytes(kinds, 4_096, 1, flash_attn=False)
    assert off - on == sum(k.layers for k in glob) * (8 - 4) * 128 * 4_096 * 2
    kimi = prepared("kimi-k2").figures.serving.kinds
    assert engines.total_bytes(kimi, 4_096, 1, flash_attn=False) == engines.total_bytes(kimi, 4_096, 1)


def test_a_unified_cache_is_one_stream_admitting_every_window():
    """kv_unified on (llama-server's choice when it picks the slots): one stream of pad256(n_ctx) cells, three
    sequences of 100 tokens in 512 cells where three streams take 768; a sliding layer (Gemma 3 270M's 512-token
    window, swa_full off) admits every sequence's window plus a micro-batch: pad256(min(n_ctx, 512 × 4 + 512)) =
    2,560 cells for four sequences of 8,192, where four streams take 4 × 1,024."""
    smol = next(iter(prepared("smollm2-135m").figures.serving.kinds))
    assert engines.cells(smol, 100, 3, kv_unified=True) == 512
    sliding = next(k for k in prepared("gemma-3-270m").figures.serving.kinds if k.window)
    assert engines.cells(sliding, 8_192, 4, swa_full=False, kv_unified=True) == 2_560
    assert engines.cells(sliding, 8_192, 4, swa_full=False) == 4 * 1_024
    assert engines.cells(sliding, 300, 4, swa_full=False, kv_unified=True) == 1_280  # the stream is shorter


def test_sparse_attention_caches_the_latent_and_the_indexer_key_at_f16():
    """DeepSeek-V3.2 from its config: 61 layers, each cell the 512-wide latent and 64-wide rotary key in the main
    cache and the indexer's 128-wide key in the indexer cache (src/llama-kv-cache-dsa.cpp), all F16: 61 × (512 + 64
    + 128) × 4,096 × 2 at 4,096 tokens. The indexer left out, or at vLLM's 132 bytes (FP8 with a scale), misses."""
    kinds = prepared("deepseek-v3.2").figures.serving.kinds
    assert engines.total_bytes(kinds, 4_096, 1) == 61 * (512 + 64 + 128) * 4_096 * 2 == 351_797_248
    assert engines.total_bytes(kinds, 4_096, 1) not in (61 * 576 * 4_096 * 2, 61 * (576 * 2 + 132) * 4_096)


def test_the_json_twin_gives_a_hybrid_model_llama_cpps_figure_and_the_settings_defaults():
    """site/api/SLUG.json's llama.cpp entry for Qwen3.5-27B: the bytes at the table's contexts for one sequence are
    the attention cache and one sequence's state rows (worked above), and the defaults name flash attention and
    kv_unified as llama_context_default_params makes the cache."""
    from explorer.views import api as api_mod

    s = prepared("qwen3.5-27b").figures.serving
    entry = api_mod._llama_cpp(s.kinds, s.max_context)
    assert entry["not_modelled"] is None
    rows = 48 * (48 * 128 * 128 + (2 * 16 * 128 + 48 * 128) * 3) * 4
    assert {"context": 4_096, "bytes": 16 * 2_048 * 4_096 * 2 + rows} in entry["kv_bytes_one_sequence"]
    assert (entry["defaults"]["flash_attn"], entry["defaults"]["kv_unified"]) == (True, False)
    assert any("llama-memory-recurrent.cpp" in r["source"] for r in entry["rules"])
