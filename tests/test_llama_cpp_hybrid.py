"""llama.cpp itself as the oracle of what explorer/figures/engines/llama_cpp.py adds to plain K and V caches: the
recurrent rows of hybrid models, the widened V of a context without flash attention and the one stream of a unified
cache. Tiny random GGUF checkpoints (tests/tiny_gguf.py, tests/tiny_gguf_linear.py) are loaded by llama.cpp 0c1e570
and what it logs is compared with the engine module's figures, with the helpers of tests/test_llama_cpp_oracle.py.

llama.cpp logs a hybrid model's two memories apart (src/llama-memory-hybrid.cpp): the attention layers' KV cache as
any model's, then `llama_memory_recurrent: size = 0.53 MiB (128 cells, 3 layers, 128 seqs 0 rs_seq), R (f32): 0.28
MiB, S (f32): 0.25 MiB, P (f32): 0.00 MiB` (src/llama-memory-recurrent.cpp): R the conv-state rows, S the
recurrent-state rows, both to 0.01 MiB, so the sequence counts are chosen large enough for a wrong rule to show.
"""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
from test_llama_cpp_oracle import (  # noqa: F401 (checkpoints: the fixture the tests take)
    HYBRID,
    SETTINGS,
    SPARSE,
    Logged,
    Setting,
    _logged,
    allocate,
    checkpoints,
    engine_kinds,
    expected,
    oracle_tiny,
    parse,
    printed_mib,
)

from explorer.figures import engines
from explorer.figures.engines.rule import conv_kept
from explorer.model.components.serving import LayerKind

pytestmark = pytest.mark.llama_cpp

RECURRENT = re.compile(r"llama_memory_recurrent: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+) seqs "
                       r"+(\d+) rs_seq\), R \(f32\): +([\d.]+) MiB, S \(f32\): +([\d.]+) MiB")

HYBRID_SETTINGS = (  # one and many sequences (LLAMA_MAX_SEQ is 256), contexts off the 256 grid, the two settings
    Setting(16, 1),
    Setting(1_000, 3),
    Setting(16, 128),
    Setting(333, 256, n_ubatch=100),
    Setting(100, 3, kv_unified=True),
    Setting(1_000, 200, flash_attn=False),
)


def recurrent_logged(log: str) -> tuple[int, int, str, str, str]:
    """(rows, sequences, total, R, S MiB) from llama_memory_recurrent's line."""
    (m,) = RECURRENT.findall(log)
    return int(m[1]), int(m[3]), m[0], m[5], m[6]


def recurrent_expected(kinds: tuple[LayerKind, ...], s: Setting, conv=conv_kept, rows=None
                       ) -> tuple[int, int, str, str, str]:
    """What the explorer says llama.cpp logs for the recurrent kinds: max(1, n_seq) rows (`rows`, a wrong rule's
    count where given), the total from engines.kind_bytes, R the conv parts (`conv`: elements kept of a part with
    `columns` columns) and S the recurrent states, at F32."""
    state = [k for k in kinds if k.state]
    n = max(1, s.sequences) if rows is None else rows
    r = sum(k.layers * conv(p.elements, p.columns) for k in state for p in k.state if p.columns) * n * engines.F32
    ss = sum(k.layers * p.elements for k in state for p in k.state if not p.columns) * n * engines.F32
    total = sum(engines.kind_bytes(k, s.context, s.sequences) for k in state)
    if conv is conv_kept and rows is None:
        assert total == r + ss, "the engine module's rows are R and S"
    else:
        total = r + ss
    return n, s.sequences, printed_mib(total), printed_mib(r), printed_mib(ss)


@pytest.mark.parametrize("s", HYBRID_SETTINGS, ids=str)
@pytest.mark.parametrize("slug", HYBRID)
def test_a_hybrid_model_gets_its_attention_cache_and_its_recurrent_rows(slug, s, checkpoints):  # noqa: F811 (the fixture)
    """Nemotron-H (Mamba-2), Qwen3.5 and Qwen3-Next (Gated DeltaNet) and Kimi Linear (KDA beside MLA): the attention
    layers' cache is the KV rule's and the recurrent layers keep max(1, n_seq) F32 rows of n_embd_s and n_embd_r,
    the conv's kernel − 1 columns (src/llama-memory-recurrent.cpp, src/llama-hparams.cpp), whatever the context,
    flash attention or kv_unified; engines.total_bytes is their sum."""
    kinds = engine_kinds(slug)
    log = allocate(checkpoints[slug], s, HYBRID_SETTINGS)
    assert parse(log) == expected(kinds, s), f"{slug} at {s}: the attention layers"
    assert recurrent_logged(log) == recurrent_expected(kinds, s), f"{slug} at {s}: the recurrent rows"
    total = engines.total_bytes(kinds, s.context, s.sequences, s.n_ubatch, s.swa_full, s.flash_attn is not False,
                                s.kv_unified)
    assert total is not None, f"{slug}: llama.cpp's figure is modelled"


def test_wrong_recurrent_rules_disagree_with_the_engine(checkpoints):  # noqa: F811 (the fixture)
    """Each wrong rule misses what llama.cpp logged somewhere: the conv state with its full kernel (as the theory
    and the reference hold it), one row for all sequences, and a row per cell of the context."""
    wrong = {"full kernel": dict(conv=lambda elements, columns: elements), "one row": dict(rows=1)}
    for name, rule in wrong.items():
        missed = [(slug, str(s)) for slug in HYBRID for s in HYBRID_SETTINGS
                  if recurrent_logged(allocate(checkpoints[slug], s, HYBRID_SETTINGS))
                  != recurrent_expected(engine_kinds(slug), s, **rule)]
        assert missed, f"{name} matches the engine everywhere"
    per_cell = [(slug, str(s)) for slug in HYBRID for s in HYBRID_SETTINGS
                if recurrent_logged(allocate(checkpoints[slug], s, HYBRID_SETTINGS))
                != recurrent_expected(engine_kinds(slug), s, rows=engines.pad(s.context * s.sequences))]
    assert per_cell, "rows per cell match the engine everywhere"


def test_the_oracle_configs_differ_from_the_tiny_ones_only_where_llama_cpp_needs():
    """Qwen3.5's and Qwen3-Next's oracle configs have d_v = d_k, Kimi Linear's as many KDA heads as attention
    heads, DeepSeek-V3.2's and GLM-5's a 64-wide indexer key; every other key is the tiny config's
    (test_serving_reference's `tiny`)."""
    from test_serving_reference import tiny

    for slug, keys in (("qwen3.5-27b", {"linear_value_head_dim"}), ("qwen3-next-80b-a3b", {"linear_value_head_dim"}),
                       ("kimi-linear-48b-a3b", {"linear_num_heads"}), ("deepseek-v3.2", {"index_head_dim"}),
                       ("glm-5", {"index_head_dim"})):
        a, b = tiny(slug)[0].config, oracle_tiny(slug)[0].config
        a, b = getattr(a, "text_config", a), getattr(b, "text_config", b)
        assert {f.name for f in fields(a) if getattr(a, f.name) != getattr(b, f.name)} == keys, slug


FLASH = (Setting(1_000, 1, swa_full=False, flash_attn=True), Setting(1_000, 1, swa_full=False, flash_attn=False),
         Setting(700, 2, swa_full=True, flash_attn=False), Setting(100, 3, swa_full=False, flash_attn=False,
                                                                  kv_unified=True))


@pytest.mark.parametrize("s", FLASH, ids=str)
@pytest.mark.parametrize("slug", ["mimo-v2-flash", "gemma-4-26b-a4b", "gemma-3-270m", "kimi-k2"])
def test_flash_attention_off_stores_every_v_as_wide_as_the_widest(slug, s, checkpoints):  # noqa: F811 (the fixture)
    """With flash attention disabled (llama-cpp-python's `Llama(flash_attn=False)` default; llama.cpp's own is auto,
    made as on) V is stored transposed and every layer's V row is as wide as the widest layer's (src/llama-kv-cache.cpp,
    n_embd_v_gqa_max() where v_trans): the tiny MiMo's global layers (one head of 16-wide values, the sliding
    layers two) take the widest; one width (Gemma 3, and the tiny Gemma 4, whose global and sliding V are both 32
    wide) and MLA's K alone (Kimi K2) are unchanged."""
    assert list(_logged(checkpoints[slug], s, FLASH)) == expected(engine_kinds(slug), s)


def test_v_at_its_own_width_without_flash_attention_disagrees(checkpoints):  # noqa: F811 (the fixture)
    """Wrong: V left at each layer's own width without flash attention misses what llama.cpp logs for MiMo (the
    tiny Gemma 4's global and sliding layers have equal V widths, 32, so only the real one's 1,024 and 2,048 widen)."""
    def own(k: LayerKind, kinds, flash: bool) -> int:
        return k.per_token
    for slug in ("mimo-v2-flash",):
        missed = [str(s) for s in FLASH if list(_logged(checkpoints[slug], s, FLASH))
                  != expected(engine_kinds(slug), s, width=own)]
        assert missed, f"{slug}: V at its own width matches the engine everywhere"


UNIFIED = (Setting(100, 3, kv_unified=True), Setting(1_000, 4, n_ubatch=250, swa_full=False, kv_unified=True),
           Setting(333, 3, n_ubatch=100, swa_full=False, kv_unified=True), Setting(8_192, 4, kv_unified=True))


@pytest.mark.parametrize("s", UNIFIED, ids=str)
@pytest.mark.parametrize("slug", ["smollm2-135m", "gemma-3-270m", "gpt-oss-20b", "qwen3.5-27b"])
def test_a_unified_cache_is_one_stream_of_the_padded_context(slug, s, checkpoints):  # noqa: F811 (the fixture)
    """kv_unified on, what llama-server sets when it picks the number of slots itself (tools/server/server.cpp):
    the sequences share one stream of pad256(n_ctx) cells (src/llama-context.cpp) and a sliding layer admits every
    sequence's window plus one micro-batch in it, pad256(min(n_ctx, n_swa × n_seq + n_ubatch))
    (src/llama-kv-cache-iswa.cpp); three sequences of 100 tokens take 512 cells, where three streams take 768."""
    kinds = engine_kinds(slug)
    logged = list(_logged(checkpoints[slug], s, UNIFIED))
    assert logged == expected(kinds, s)
    assert all(x.streams == 1 for x in logged)


def test_one_stream_per_sequence_disagrees_with_a_unified_cache(checkpoints):  # noqa: F811 (the fixture)
    """Wrong: the default's one stream per sequence, for a context made with kv_unified on."""
    def streams_apart(k: LayerKind, context: int, sequences: int, n_ubatch: int, swa_full: bool) -> int:
        return engines.cells(k, context, sequences, n_ubatch, swa_full, kv_unified=False)
    for slug in ("smollm2-135m", "gemma-3-270m"):
        missed = [str(s) for s in UNIFIED if list(_logged(checkpoints[slug], s, UNIFIED))
                  != expected(engine_kinds(slug), s, cells=streams_apart)]
        assert missed, f"{slug}: one stream per sequence matches the engine everywhere"


def sparse_expected(kinds: tuple[LayerKind, ...], s: Setting, indexer_bytes: int = engines.F16) -> list[Logged]:
    """What the explorer says llama.cpp logs for DeepSeek Sparse Attention: the main cache (latent and rotary key)
    then the indexer cache (`indexer_bytes` an element: F16, or a wrong rule's), the same cells; the two sum to
    engines.kind_bytes."""
    streams = 1 if s.kv_unified else s.sequences
    cells = {engines.cells(k, s.context, s.sequences, s.n_ubatch, s.swa_full, s.kv_unified) for k in kinds}
    assert len(cells) == 1, "one cell count for both caches"
    n, layers = cells.pop(), sum(k.layers for k in kinds)
    main = sum(k.layers * (k.per_token - k.indexer) for k in kinds) * n * engines.F16
    index = sum(k.layers * k.indexer for k in kinds) * n * indexer_bytes
    if indexer_bytes == engines.F16:
        assert main + index == sum(engines.kind_bytes(k, s.context, s.sequences, s.n_ubatch, s.swa_full, kinds,
                                                      True, s.kv_unified) for k in kinds)
    return [Logged("", n // streams, layers, s.sequences, streams, printed_mib(b)) for b in (main, index)]


@pytest.mark.parametrize("s", SETTINGS, ids=str)
@pytest.mark.parametrize("slug", SPARSE)
def test_sparse_attention_keeps_the_latent_and_the_indexer_keys_in_two_caches(slug, s, checkpoints):  # noqa: F811
    """DeepSeek-V3.2's and GLM-5's tiny checkpoints (deepseek32, glm-dsa): llama_kv_cache_dsa logs a main cache of
    the latent and rotary key and an indexer cache of one index_head_dim-wide key head, both K alone at F16 over the
    same cells (src/llama-kv-cache-dsa.cpp), at all nine settings of the plain models; their sum is
    engines.total_bytes."""
    kinds = engine_kinds(slug)
    assert list(_logged(checkpoints[slug], s)) == sparse_expected(kinds, s)
    assert engines.total_bytes(kinds, s.context, s.sequences, s.n_ubatch, s.swa_full) is not None


def test_an_fp8_indexer_disagrees_with_the_engine(checkpoints):  # noqa: F811 (the fixture)
    """Wrong: the indexer's keys at one byte (vLLM's and SGLang's FP8 layout) where llama.cpp keeps them at type_k."""
    for slug in SPARSE:
        missed = [str(s) for s in SETTINGS if list(_logged(checkpoints[slug], s))
                  != sparse_expected(engine_kinds(slug), s, indexer_bytes=1)]
        assert missed, slug
