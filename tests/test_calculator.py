"""Serving memory and compute (issue 23): every layer kind through one registry, its formula in config keys, the
figures never beyond the maximum context, the tied LM head's FLOPs, and the page's calculator, whose script must
show exactly what explorer/figures/calculator.py's `evaluate` computes."""

from __future__ import annotations

import gzip
import re
from dataclasses import replace
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT
from test_browser import browser, tabs  # noqa: F401  (the same Chromium fixtures: missing Chromium fails, never skips)

from explorer.content.model_content import load_model_content
from explorer.figures.calculator import calculator_view, evaluate, page_data, size
from explorer.figures.engines import sglang, vllm
from explorer.figures.engines.rule import milli
from explorer.model.components import serving
from explorer.pipeline import prepare_model
from explorer.render.site_writer import environment

BROWSER_CASES = {  # one model per layer kind, each with inputs that are not multiples of the engine's block
    "kimi-k2": [(40_001, 3, "FP8", "BF16", 2_000)],  # MLA
    "llama-3.1-8b": [(5_000, 7, "BF16", "as stored", 24), (131_072, 1, "FP4", "4-bit", 80)],  # GQA
    "gpt-oss-20b": [(100_003, 2, "FP8", "as stored", 80)],  # sliding window beside full attention
    "gemma-4-26b-a4b": [(77_777, 4, "BF16", "FP8", 48)],  # keys as values, per-layer shapes
    "llama-4-scout-17b-16e": [(123_457, 2, "FP4", "BF16", 300)],  # chunked + NoPE global layers
    "qwen3.5-27b": [(65_537, 8, "BF16", "as stored", 80)],  # Gated DeltaNet state
    "nemotron-3-nano-30b-a3b": [(262_144, 16, "FP8", "FP8", 141)],  # Mamba-2 state
    "deepseek-v3.2": [(163_840, 1, "BF16", "as stored", 1_500), (2_049, 2, "FP8", "4-bit", 0)],  # DSA
    "deepseek-v4-flash": [(1_000_003, 2, "FP8", "as stored", 400)],  # compressed streams
    "gpt2": [(999_999, 1, "BF16", "as stored", 1)],  # clamped to its 1,024
    "qwen3-8b": [("1e5", "2", "BF16", "as stored", 80), ("100,000", "0", "FP8", "as stored", 0)],  # as typed
    "gemma-3-270m": [(20_001, 3, "BF16", "as stored", 8, "300", False)],  # llama.cpp's settings: n_ubatch, swa_full
    # the engines' settings: vLLM's block_size, max_num_batched_tokens, gpu_memory_utilization, SGLang's two ratios
    "gpt-oss-120b": [(50_001, 5, "FP8", "as stored", 141, "512", True, "32", "2048", "0.85", "0.5", "0.9")],
    "qwen3-next-80b-a3b": [(30_000, 3, "BF16", "as stored", 200, "512", True, "64", "4096", "0.95", "0.8", "1.5")],
    # llama.cpp's flash attention off (every V as wide as the widest) and kv_unified on (one stream)
    "mimo-v2-flash": [(10_001, 3, "BF16", "as stored", 80, "300", False, "16", "8192", "0.9", "0.8", "0.9", False,
                       True)],
    "nemotron-h-56b": [(7_000, 5, "FP8", "as stored", 80, "512", True, "16", "8192", "0.9", "0.8", "0.9", False,
                        True)],  # Mamba-2 rows beside attention, flash attention off and a unified stream
}
TYPED = {"1e5": 100_000, "100,000": 100_000, "2": 2, "0": 0}
"""What a reader types, and the number the page must read it as (the script once read "1e5" as 1)."""


@cache
def prepared(slug: str):
    return prepare_model(load_model_content(ROOT / "content" / "models" / slug), progress=lambda m: None)


def all_slugs() -> list[str]:
    return sorted(p.name for p in (ROOT / "content" / "models").iterdir() if (p / "model.toml").exists())


def _evaluate_formula(formula: str, values: dict) -> int:
    """A formula in config keys, evaluated on the config (× − / as written on the page)."""
    expr = formula.split(" (")[0] if "(one vector" in formula or "(the key and" in formula else formula
    expr = expr.replace("×", "*").replace("−", "-").replace("/", "//")
    return eval(expr, {"__builtins__": {}}, {k: v for k, v in values.items() if isinstance(v, int)})  # noqa: S307


# -------------------------------------------------------------------------------------------- the data

@pytest.mark.parametrize("slug", all_slugs())
def test_each_layer_kind_formula_evaluates_to_its_elements(slug):
    """The formula a page states for each layer kind, evaluated on the recorded config, is the number it states."""
    p = prepared(slug)
    kinds = p.figures.serving.kinds
    assert kinds, "every model has at least one layer kind"
    for k in kinds:
        assert k.layers > 0
        parts = [(k.formula, k.per_token)] if not k.state else [(s.formula, s.elements) for s in k.state]
        for formula, elements in parts:
            assert _evaluate_formula(formula, p.spec.values) == elements, (k.title, formula)


def test_wrong_per_layer_formula_fails(monkeypatch):
    """Mutation: an MLA entry that forgets the shared rotary key no longer matches its formula."""
    real = serving.LAYER_MEMORY["mla"]
    monkeypatch.setitem(serving.LAYER_MEMORY, "mla", lambda comp, values: tuple(
        replace(k, per_token=k.per_token - values["qk_rope_head_dim"]) for k in real(comp, values)))
    prepared.cache_clear()
    try:
        with pytest.raises(AssertionError):
            test_each_layer_kind_formula_evaluates_to_its_elements("kimi-k2")
    finally:
        prepared.cache_clear()


def test_kimi_k2_per_token_bytes():
    f = prepared("kimi-k2").figures
    assert f.get("kv_cache_per_token").value == 61 * (512 + 64) == 35_136
    assert f.get("kv_cache_bytes_per_token_bf16").value == 70_272
    assert f.get("kv_cache_bytes_per_token_fp8").value == 35_136
    assert evaluate(f.serving, 1).get("per-token").value == 70_272


@pytest.mark.parametrize("slug", all_slugs())
def test_no_figure_beyond_the_maximum_context(slug):
    f = prepared(slug).figures
    maximum = f.serving.max_context
    assert f.get("max_context").value == maximum
    for fig in f.figures:
        stated = [int(n.replace(",", "")) for n in re.findall(r"(\d[\d,]*) (?:tokens|context)", fig.label)]
        assert all(n <= maximum for n in stated), fig.label
    view = calculator_view(f.serving, "max_position_embeddings")
    contexts = [int(r[0].split(" ")[0].replace(",", "")) for r in view.table_rows]
    assert max(contexts) == maximum and all(c <= maximum for c in contexts)


def test_gpt2_stops_at_1024():
    f = prepared("gpt2").figures
    assert f.serving.max_context == 1_024
    assert f.get("kv_cache_bytes_bf16").value == 12 * 2 * 12 * 64 * 1_024 * 2
    assert [r[0] for r in calculator_view(f.serving, "n_positions").table_rows] == ["1,024 (maximum)"]
    assert evaluate(f.serving, 131_072).get("total").value == evaluate(f.serving, 1_024).get("total").value


def test_the_table_without_javascript_says_what_llama_cpp_allocates():
    """The static table's llama.cpp column is evaluate()'s "llama-cpp" line at each context (Nemotron-H's attention
    cache and Mamba-2 rows among them), and says "not modelled" where llama.cpp's rules are not (DeepSeek-V4)."""
    for slug in ("nemotron-h-56b", "deepseek-v4-flash"):
        f = prepared(slug).figures
        view = calculator_view(f.serving, "max_position_embeddings")
        column = view.table_head.index("llama.cpp allocates")
        for row in view.table_rows:
            e = evaluate(f.serving, int(row[0].split(" ")[0].replace(",", "")))
            want = f"{e.get('llama-cpp').value:,}" if "llama-cpp" in e.keys() else "not modelled"
            assert row[column] == want
        assert (slug == "deepseek-v4-flash") == (view.table_rows[0][column] == "not modelled")


def test_tied_lm_head_counted_in_flops():
    """Gemma 3 270M ties its head to the embedding: stored once, but every token still multiplies it."""
    p = prepared("gemma-3-270m")
    f, values = p.figures, p.spec.values
    head = values["vocab_size"] * values["hidden_size"]
    assert head == 262_144 * 640 and f.serving.tied_head == head
    assert f.serving.matmul == f.get("active_parameters_no_embedding").value + head
    attention = f.get("flops_decode").value - 2 * f.serving.matmul
    assert 0 < attention < head  # the head's matmul is the larger share at this size
    untied = prepared("llama-3.1-8b").figures.serving
    assert untied.tied_head == 0


def test_engine_view_rounds_each_layer_to_blocks():
    s = prepared("llama-3.1-8b").figures.serving
    e = evaluate(s, 4_097)
    assert e.get("cache").value == 32 * 2 * 8 * 128 * 4_097 * 2
    assert e.get("engine").value == 32 * 2 * 8 * 128 * 4_112 * 2  # 4,097 rounded up to 257 blocks of 16


def test_tokens_that_fit_is_the_longest_context():
    s = prepared("llama-3.1-8b").figures.serving
    e = evaluate(s, 1, batch=1, gpu_gb=24)
    weights = dict(s.weights)["as stored"]
    per_token = 32 * 2 * 8 * 128 * 2
    assert e.fits == min(s.max_context, (24 * 10 ** 9 - weights) // per_token)  # GB: 10^9 bytes


@pytest.mark.parametrize("slug", all_slugs())
def test_script_and_data_within_30_kb_gzip(slug):
    data = page_data(prepared(slug).figures.serving)
    script = (ROOT / "static" / "calc.js").read_bytes()
    assert len(gzip.compress(script)) + len(gzip.compress(data.encode())) <= 30_000


# ------------------------------------------------------------------------------------------ the browser

def _render_pages(out: Path, script: str, slugs) -> Path:
    """Each model's calculator section, rendered by the site's own template, beside `script` as static/calc.js."""
    (out / "static").mkdir(parents=True)
    (out / "static" / "calc.js").write_text(script, encoding="utf-8")
    env = environment(ROOT / "templates")
    template = env.from_string('<!doctype html><html lang="en"><head><meta charset="utf-8"><title>t</title></head>'
                               '<body><main>{% include "_calculator.html" %}</main></body></html>')
    (out / "models").mkdir()
    for slug in slugs:
        f = prepared(slug).figures
        page = SimpleNamespace(root="../", calculator=calculator_view(f.serving, f.get("max_context").formula))
        (out / "models" / f"{slug}.html").write_text(template.render(page=page), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def calculator_pages(tmp_path_factory) -> Path:
    return _render_pages(tmp_path_factory.mktemp("calc"), (ROOT / "static" / "calc.js").read_text("utf-8"),
                         BROWSER_CASES)


def _shown_and_wanted(tabs, site: Path, slug: str, case, preset: str = "") -> tuple[list, list, object]:  # noqa: F811
    """What the page shows after a reader enters `case` (and picks the GPU `preset`), and what evaluate() says."""
    c, batch, kv, weights, gpu, *engine = case
    ubatch, swa_full, *paged = engine or ("512", True)
    vblock, vmnbt, vutil, sswa, smamba, *ll = paged or ("16", "8192", "0.9", "0.8", "0.9")
    flash, unified = ll or (True, False)
    with tabs.open(site, f"models/{slug}.html", 1280) as page:
        page.fill("form.calc input[name=context]", str(c))
        page.fill("form.calc input[name=batch]", str(batch))
        page.select_option("form.calc select[name=kv]", kv)
        page.select_option("form.calc select[name=weights]", weights)
        page.fill("form.calc input[name=gpu]", str(gpu) if gpu else "")
        page.fill("form.calc input[name=ubatch]", ubatch)
        page.set_checked("form.calc input[name=swafull]", swa_full)
        page.set_checked("form.calc input[name=flashattn]", flash)
        page.set_checked("form.calc input[name=kvunified]", unified)
        for name, value in (("vblock", vblock), ("vmnbt", vmnbt), ("vutil", vutil), ("sswa", sswa),
                            ("smamba", smamba)):
            page.fill(f"form.calc input[name={name}]", value)
        page.select_option("form.calc select[name=preset]", preset)
        shown = page.evaluate("""() => Array.from(document.querySelectorAll('table.calc-out tbody tr'))
            .map(r => [r.dataset.key, ...Array.from(r.children).map(td => td.textContent)])""")
        fits = page.text_content("#calc-fits")
        assert page.errors == []
        assert [u for u in page.requests if not u.startswith(site.as_uri())] == []
        assert page.locator("table.calc-static tbody tr").count() >= 1  # the table without JavaScript
        note = page.text_content("#calc-note") if page.is_visible("#calc-note") else ""
    want = evaluate(prepared(slug).figures.serving, TYPED.get(c, c), TYPED.get(batch, batch), kv, weights, gpu or None,
                    swa_full, int(ubatch), preset,
                    vllm.Settings(int(vblock), int(vmnbt), milli(float(vutil))),
                    sglang.Settings(milli(float(sswa)), milli(float(smamba))), flash, unified)
    expected = [[line.key, line.label, f"{line.value:,}",
                 "" if line.key in ("decode", "decode-absorbed", "prefill") or
                 line.key.startswith(("fits", "bound", "count")) else size(line.value), line.equation]
                for line in want.lines]
    return shown + [fits, note], expected + [want.fits_text, want.note], want


@pytest.mark.parametrize("slug", BROWSER_CASES)
def test_calculator_shows_the_builds_numbers(tabs, calculator_pages, slug):  # noqa: F811 (the fixture)
    """Every row (label, exact value, GiB, equation) and the tokens that fit, as evaluate() gives them."""
    for case in BROWSER_CASES[slug]:
        shown, expected, _ = _shown_and_wanted(tabs, calculator_pages, slug, case)
        assert shown == expected


def test_a_wrong_script_formula_is_caught(tabs, tmp_path):  # noqa: F811 (the fixture)
    """Mutation: a compressed stream whose prefill count drops one position per query differs from evaluate()."""
    script = (ROOT / "static" / "calc.js").read_text("utf-8")
    wrong = script.replace("cap * (c - cap * r + 1n)", "cap * (c - cap * r)")
    assert wrong != script
    site = _render_pages(tmp_path / "site", wrong, ["deepseek-v4-flash"])
    shown, expected, _ = _shown_and_wanted(tabs, site, "deepseek-v4-flash", BROWSER_CASES["deepseek-v4-flash"][0])
    assert shown != expected
    no_ubatch = script.replace("(seqs / streams) + ll.ubatch", "(seqs / streams)")  # llama.cpp's sliding admission
    assert no_ubatch != script
    site = _render_pages(tmp_path / "ll", no_ubatch, ["gemma-3-270m"])
    shown, expected, _ = _shown_and_wanted(tabs, site, "gemma-3-270m", BROWSER_CASES["gemma-3-270m"][0])
    assert shown != expected
    for n, (slug, wrong) in enumerate((  # V left at its own width without flash attention; one state row in all
            ("mimo-v2-flash", script.replace("B(k.p) - B(k.v) + widestV()", "B(k.p)")),
            ("nemotron-h-56b", script.replace("* (seqs > 1n ? seqs : 1n) * B(d.ll.rb)", "* B(d.ll.rb)")))):
        assert wrong != script
        site = _render_pages(tmp_path / f"ll{n}", wrong, [slug])
        shown, expected, _ = _shown_and_wanted(tabs, site, slug, BROWSER_CASES[slug][0])
        assert shown != expected
    window_alone = script.replace("ceilDiv(min(x.span - 1n + vs.mnbt, c), x.block) + 1n", "ceilDiv(min(x.span, c), x.block)")
    no_split = script.replace("full * gs.sr / 1000n", "full")  # SGLang's sliding pool as large as the full one
    for n, wrong in enumerate((window_alone, no_split)):
        assert wrong != script
        site = _render_pages(tmp_path / f"paged{n}", wrong, ["gpt-oss-120b"])
        shown, expected, _ = _shown_and_wanted(tabs, site, "gpt-oss-120b", BROWSER_CASES["gpt-oss-120b"][0])
        assert shown != expected


def test_save_plan_downloads_the_inputs_and_every_figure(tabs, calculator_pages):  # noqa: F811 (the fixture)
    """The "Save plan" button downloads JSON of the inputs as evaluated and every figure shown, each equal to
    evaluate()'s (values as exact integers in strings), with no request beyond the page's own files."""
    import json

    slug, case = "qwen3-next-80b-a3b", BROWSER_CASES["qwen3-next-80b-a3b"][0]
    _, _, want = _shown_and_wanted(tabs, calculator_pages, slug, case)
    c, batch, kv, weights, gpu, ubatch, swa_full, vblock, vmnbt, vutil, sswa, smamba = case
    with tabs.open(calculator_pages, f"models/{slug}.html", 1280) as page:
        for name, value in (("context", str(c)), ("batch", str(batch)), ("gpu", str(gpu)), ("ubatch", ubatch),
                            ("vblock", vblock), ("vmnbt", vmnbt), ("vutil", vutil), ("sswa", sswa),
                            ("smamba", smamba)):
            page.fill(f"form.calc input[name={name}]", value)
        page.select_option("form.calc select[name=kv]", kv)
        page.select_option("form.calc select[name=weights]", weights)
        with page.expect_download() as download:
            page.click("#calc-save")
        plan = json.loads(Path(download.value.path()).read_text("utf-8"))
        assert download.value.suggested_filename == "memory-plan.json"
        assert page.errors == []
        assert [u for u in page.requests if not u.startswith((calculator_pages.as_uri(), "blob:"))] == []
    assert [(f["key"], f["label"], int(f["value"]), f["equation"]) for f in plan["figures"]] == [
        (line.key, line.label, line.value, line.equation) for line in want.lines]
    assert plan["inputs"]["context"] == str(c) and plan["inputs"]["gpu_memory_gb"] == str(gpu)
    assert plan["inputs"]["vllm"] == {"block_size": vblock, "max_num_batched_tokens": vmnbt,
                                      "gpu_memory_utilization": vutil}
    assert plan["inputs"]["sglang"] == {"swa_full_tokens_ratio": sswa, "mamba_full_memory_ratio": smamba}
    assert plan["inputs"]["llama_cpp"] == {"n_ubatch": ubatch, "swa_full": swa_full, "flash_attn": True,
                                           "kv_unified": False}
    assert plan["fits"] == want.fits_text


@pytest.mark.parametrize("ratio,cap", [(1, None), (4, None), (4, 512), (128, 3), (7, 1)])
def test_closed_forms_match_the_sums(ratio, cap):
    """The prefill's key counts in closed form equal the sums over positions they stand for."""
    for context in (1, 2, 5, 127, 128, 129, 2_049, 5_000):
        want = sum(min(t // ratio, cap if cap is not None else t) for t in range(1, context + 1))
        assert serving.pooled_capped(context, ratio, cap) == want
        assert serving.triangle_capped(context, cap) == sum(min(t, cap or t) for t in range(1, context + 1))
    chunked = serving.LayerKind(10, "x", chunk=64)
    assert chunked.keys_read_prefill(200) == sum((t - 1) % 64 + 1 for t in range(1, 201))


@pytest.mark.parametrize("slug", ["llama-3.1-8b", "qwen3-8b", "gemma-3-270m"])
def test_cache_agrees_with_the_reference_cache(slug):
    """The keys and values transformers' DynamicCache holds after a prefill on the meta device, against the
    calculator's elements (FP8: one byte each). Full-attention layers agree exactly at any length; a sliding layer
    stores window − 1 positions between steps (the next token's own key joins them while it attends), and the
    calculator counts the window it attends over, so beyond the window it is one position per sliding layer more."""
    import torch

    from explorer.execute.reference import build_reference_model

    p = prepared(slug)
    model = build_reference_model(p.spec)
    s = p.figures.serving
    for length in (300, 1_000):
        with torch.no_grad():
            out = model(input_ids=torch.zeros(1, length, dtype=torch.long, device="meta"), use_cache=True)
        theirs = sum(layer.keys.numel() + layer.values.numel() for layer in out.past_key_values.layers)
        beyond = sum(k.layers * k.per_token for k in s.kinds if k.window and length >= k.window)
        assert evaluate(s, length, kv_dtype="FP8").get("cache").value == theirs + beyond
    if slug == "gemma-3-270m":
        assert beyond == 15 * 1 * 2 * 256  # 15 sliding layers, one key/value head of 256, K and V


@pytest.mark.parametrize("slug", all_slugs())
def test_per_kind_rows_sum_to_the_total(slug):
    """The model page's per-kind rows (figures, BF16 at the stated context) are the calculator's per-kind lines, and
    with the fixed states they add up to the page's total and the calculator's cache line; the growth per token
    counts only the kinds that keep every position."""
    f = prepared(slug).figures
    s = f.serving
    stated = min(131_072, s.max_context)
    e = evaluate(s, stated, kv_dtype="BF16")
    lines = [e.get(f"kind-{i}").value for i in range(len(s.kinds))]
    assert sum(lines) == e.get("cache").value
    cached = [(i, k) for i, k in enumerate(s.kinds) if k.per_token or k.entry]
    assert sum(lines[i] for i, _ in cached) == f.get("kv_cache_bytes_bf16").value
    rows = {k.key: lines[i] for i, k in cached if k.by_kind}
    for key, value in rows.items():
        assert f.get(f"kv_cache_bytes_bf16_{key}").value == value, key
    if rows and len(rows) == len(cached):
        assert sum(rows.values()) == f.get("kv_cache_bytes_bf16").value
    growth = sum(k.layers * k.per_token for k in s.kinds if (k.per_token or k.entry) and not (k.window or k.chunk))
    assert f.get("kv_cache_per_token").value == growth
    assert e.get("per-token").value == 2 * growth


def test_llama_4_chunked_row_is_capped_at_one_chunk():
    """Mutation of the issue's example: the chunked layers' row at 131,072 tokens holds one 8,192-token chunk, and a
    row that let every position stay would not sum to the total."""
    f = prepared("llama-4-scout-17b-16e").figures
    chunked = next(k for k in f.serving.kinds if k.chunk)
    assert chunked.chunk == 8_192
    assert f.get(f"kv_cache_bytes_bf16_{chunked.key}").value == chunked.layers * chunked.per_token * 8_192 * 2
    wrong = chunked.layers * chunked.per_token * 131_072 * 2
    others = sum(f.get(f"kv_cache_bytes_bf16_{k.key}").value for k in f.serving.kinds if k.by_kind and k is not chunked)
    assert wrong + others != f.get("kv_cache_bytes_bf16").value


def test_headline_is_the_growth_per_token_with_the_fixed_part_beside_it():
    """DeepSeek-V4-Flash: its two sliding-only layers and every window stop growing at 128 positions, so the
    growth per token is the compressed streams' alone; the fixed part holds the windows and the buffers."""
    f = prepared("deepseek-v4-flash").figures
    kinds = f.serving.kinds
    growth = sum(k.layers * k.per_token for k in kinds if k.ratio > 1)
    assert f.get("kv_cache_per_token").value == growth
    windows = sum(k.layers * k.per_token * min(k.window, f.serving.max_context) for k in kinds if k.window)
    buffers = sum(k.layers * (k.overlap + k.pending * (k.ratio - 1)) for k in kinds if k.ratio > 1)
    assert f.get("kv_cache_fixed_elements").value == windows + buffers > 0
    assert f.get("kv_cache_fixed_bytes_bf16").value == 2 * (windows + buffers)
    qwen = prepared("qwen3.5-27b").figures
    state = sum(k.layers * k.state_bytes for k in qwen.serving.kinds)
    assert qwen.get("kv_cache_fixed_bytes_bf16").value == state > 0


def test_inputs_outside_the_model_are_clamped_with_a_note():
    s = prepared("gpt2").figures.serving
    assert evaluate(s, 999_999).note == "Context 999,999 is beyond this model's maximum: evaluated at 1,024 tokens."
    assert evaluate(s, 999_999).get("cache").value == evaluate(s, 1_024).get("cache").value
    assert evaluate(s, 0, batch=0).note == ("Context 0 is below one token: evaluated at 1. Batch 0 is below one "
                                            "sequence: evaluated at 1.")
    assert evaluate(s, 1_024).note == ""


def test_sizes_read_in_one_decimal_family():
    assert [size(n) for n in (0, 999, 1_000, 466_000, 1_209_999_999, 2_890_000_000_000, -1_500)] == [
        "0 bytes", "999 bytes", "1.00 kB", "466.00 kB", "1.20 GB", "2.89 TB", "−1.50 kB"]
