"""The built site as a reader meets it: what the seed pages show, links that resolve, byte-identical
rebuilds, and templates that only display what the views prepared."""

from __future__ import annotations

import filecmp
import html
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import ROOT


def text_of(page: Path) -> str:
    """Visible text, tags stripped and whitespace collapsed (for asserting what a reader sees)."""
    raw = re.sub(r"<annotation[^>]*>.*?</annotation>", "", page.read_text().replace("<wbr>", ""), flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", raw)))


def test_moe_block_page_shows_what_the_seed_shows(built_site):
    page = built_site / "models/kimi-k2/blocks.moe.html"
    text = text_of(page)
    for expected in [
        "Kimi K2", "Moonshot AI · Jul 2025", "Latent attention and experts",
        "moonshotai/Kimi-K2-Instruct @ fd1984e", "parameter count checked against the checkpoint’s tensor headers",
        "How to read", "61 transformer blocks", "MoE transformer block", "Open inside →",
        "DeepseekV3DecoderLayer(config, layer_idx)",
        "MLA and a mixture of experts, each added to the residual stream; blocks 1–60.",
        "[B batch, T positions, 7168 d]", "[T positions, 32 pairs]", "[T queries, T keys]",
        "17,059,365,248 · × 60 MoE blocks = 1,023,561,914,880",
        "17,059,365,248 parameters per MoE block, across its learned components",
        "Exact per-instance accounting", "Attention RMSNorm", "101,124,096 across its components",
        "MoE RMSNorm", "16,958,226,816 across its components", "Per-instance total",
        "Across 60 independent MoE blocks:", "equal to the count of the checkpoint’s tensors read from its "
        "safetensors headers (FP8 block scales and stored rotary buffers excluded)",
        "Direct evidence", "A block applies input RMSNorm, attention and a residual addition",
        "modeling_deepseek.py", "Pinned revision fd1984e2b7a3",
    ]:
        assert expected in text, expected
    assert re.search(r"All \d+ steps", text)


def test_moe_block_steps_cover_the_seeds_steps(built_site):
    """Every step the seed lists for the MoE block (as LaTeX source) is among the page's steps."""
    source = (built_site / "models/kimi-k2/blocks.moe.html").read_text()
    steps = source.split('id="steps"', 1)[1]
    # the seed's h = a ⊙ u reads m_i = a_i ⊙ u_i here: h is the head index, and each expert's symbols carry i;
    # its s = σ(z) reads ρ = σ(z): s is the key position, ρ the router's affinity (issue 25, one notation)
    for latex in [r"x_{\mathrm{attn}}=\operatorname{RMSNorm}(x_n)", r"\rho=\sigma(z)", r"a_{i}=g_{i}\,\sigma(g_{i})",
                  r"m_{i}=a_{i}\odot u_{i}", r"y^{\mathrm{routed}}=\sum_{i=1}^{384}G_i\,E_i",
                  r"\Delta_{\mathrm{ffn}}=y^{\mathrm{routed}}+y^{\mathrm{shared}}", r"x_{n+1}=x'_n+\Delta_{\mathrm{ffn}}",
                  r"G_{i}=2.827\,\frac{\rho_i\,E^{\mathrm{sel}}_i}{\sum_{j}\rho_j\,E^{\mathrm{sel}}_j}",
                  r"E^{\mathrm{sel}}_i=\big[\,i\in\operatorname{top}_{8}(\rho+b)\,\big]"]:
        assert html.escape(latex, quote=True) in steps, latex


def test_pages_show_traced_shapes_checks_and_a_diagram(built_site):
    moe = text_of(built_site / "models/kimi-k2/blocks.moe.moe.html")
    assert "Equations executed and checked against transformers 5.23.0 DeepseekV3MoE on the tiny test configuration" in moe
    assert re.search(r"within the tolerance 0\.0001 \(max \|Δ\| = (\d\.\de[-+]\d\d) on the machine that built this page\)",
                     moe)
    assert "Shapes traced by running this component at full size on the meta device" in moe
    router = text_of(built_site / "models/kimi-k2/blocks.moe.moe.router.html")
    assert "same 4 of 5 experts selected for all 10 tokens" in router
    scores = text_of(built_site / "models/kimi-k2/blocks.moe.attn.scores.html")
    assert "checked as part of Multi-head latent attention" in scores
    page = (built_site / "models/kimi-k2/blocks.moe.moe.html").read_text()
    svg = re.search(r"<svg.*?</svg>", page, flags=re.S).group(0)
    assert 'aria-label="Data flow of Mixture of experts"' in svg and "[B batch, T positions, 7168 d]" in svg
    assert 'href="blocks.moe.moe.router.html"' in svg
    index = (built_site / "index.html").read_text()
    assert 'aria-label="Parameter budget of Kimi K2"' in index and "60 MoE blocks: 99.7%" in index


def test_down_projection_page_shows_what_the_seed_shows(built_site):
    text = text_of(built_site / "models/kimi-k2/blocks.dense.mlp.down_proj.html")
    for expected in [
        "SwiGLU MLP", "61 transformer blocks", "1 dense block", "SwiGLU", "Down projection",
        "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
        "Map 18,432 gated features back to 7,168 features.",
        "[B batch, T positions, 18432 d_ff]", "[B batch, T positions, 7168 d]", "132,120,576 parameters per instance.",
        "Weight matrix", "18,432 × 7,168", "This projection has no bias parameter.",
        "The reference module holds the weight output by input, [out, in].",
        "Across 1 independent dense blocks:", "modeling_deepseek.py 374–390", "config.json 38–46",
        "The dense feed-forward network is a SwiGLU MLP", "Weights are stored in FP8 (e4m3) with one scale per "
        "128 × 128 block; the scales are quantization metadata and are excluded from parameter counts.",
        "model.layers.0.mlp.down_proj.weight", "F8_E4M3", "weight_scale_inv [56, 144] F32",
    ]:
        assert expected in text, expected
    crumbs = re.search(r'<nav class="crumbs".*?</nav>', (built_site / "models/kimi-k2/blocks.dense.mlp.down_proj.html")
                       .read_text(), flags=re.S).group(0)
    assert [html.unescape(t) for t in re.findall(r">([^<>]+)</a>", crumbs)] == [
        "61 transformer blocks", "1 dense block", "SwiGLU"]


def test_transformers_excerpts_are_real_file_lines(built_site):
    from explorer.checkpoint.sources import locate_symbol
    from explorer.model.transformers_files import transformers_file

    path = transformers_file("models/deepseek_v3/modeling_deepseek_v3.py")
    first, last = locate_symbol(path.read_text(), "DeepseekV3MLP")
    page = (built_site / "models/kimi-k2/blocks.dense.mlp.html").read_text()
    assert f"modeling_deepseek_v3.py {first}–{last}" in text_of(built_site / "models/kimi-k2/blocks.dense.mlp.html")
    code = html.unescape(re.sub(r"<[^>]+>", "", page))  # highlighted tokens joined back into source text
    for line in path.read_text().splitlines()[first - 1:last]:
        assert line in code, line


def test_deepseek_v3_pages_carry_their_own_numbers(built_site):
    text = text_of(built_site / "models/deepseek-v3/blocks.moe.html")
    assert "11,507,286,272 · × 58 MoE blocks = 667,422,603,776" in text
    assert "checked against the reference implementation only" in text
    router = text_of(built_site / "models/deepseek-v3/blocks.moe.moe.router.html")
    assert "restricted to the best 4 of 8 expert groups" in router
    mtp = text_of(built_site / "models/deepseek-v3/mtp.html")
    assert "13,463,426,304" in mtp and "model.layers.61.eh_proj.weight" in mtp


def test_model_page_has_ledger_outline_and_children(built_site):
    text = text_of(built_site / "models/kimi-k2/index.html")
    assert "1,026,408,232,448" in text
    assert "0 unowned, 0 owned twice, 0 missing, 0 shape mismatches, 0 dtype mismatches" in text
    assert "FP8 block scales" in text and "62,495,192" in text and "3,416" in text
    assert "Outline" in text and "Open inside" in text


def test_index_lists_every_model_with_a_preview(built_site):
    text = text_of(built_site / "index.html")
    assert "Kimi K2" in text and "DeepSeek-V3" in text
    assert "1,026,408,232,448" in text and "684,489,845,504" in text


def test_how_to_read_explains_each_page_element(built_site):
    text = text_of(built_site / "how-to-read.html")
    for heading in ["An annotated example", "Breadcrumbs", "Equations", "in / out / parameters", "Data flow",
                    "Parameters", "Stored tensors", "Checkpoint ledger", "Sources and Code", "Notation"]:
        assert heading in text, heading


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.resources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag in ("link", "script", "img") and (a.get("href") or a.get("src")):
            self.resources.append(a.get("href") or a.get("src"))


@pytest.fixture(scope="module")
def parsed_pages(built_site) -> dict[Path, _Links]:
    """Every page's links, resources and ids, parsed once for the tests that walk them all."""
    parsed: dict[Path, _Links] = {}
    for page in sorted(built_site.rglob("*.html")):
        p = _Links()
        p.feed(page.read_text())
        parsed[page] = p
    return parsed


def test_every_internal_link_and_anchor_resolves(built_site, parsed_pages):
    files = {os.path.normpath(p) for p in built_site.rglob("*")}  # the site holds no links: normpath is resolve
    broken = []
    for page, p in parsed_pages.items():
        for href in p.links + p.resources:
            if href.startswith(("http://", "https://")):
                continue
            assert not href.startswith("/"), f"{page}: absolute link {href}"
            target, _, frag = href.partition("#")
            dest = Path(os.path.normpath(page.parent / target)) if target else page
            if str(dest) not in files:
                broken.append(f"{page.relative_to(built_site)} -> {href}")
            elif frag and "=" not in frag and dest.suffix == ".html" and frag not in parsed_pages[dest].ids:  # a=…: picker state
                broken.append(f"{page.relative_to(built_site)} -> {href} (no such anchor)")
    assert broken == []
    compare = sum(1 for _ in built_site.glob("compare/*.html"))
    parts = sum(1 for _ in built_site.glob("parts/*.html"))
    assert len(parsed_pages) == 3 + sum(1 for _ in built_site.glob("models/*/*.html")) + compare + parts  # index, how to read, notation


def test_resources_never_leave_the_site(parsed_pages):
    for page, p in parsed_pages.items():
        assert all(not r.startswith(("http", "//")) for r in p.resources), page


def test_sitemap_and_api(built_site):
    assert not (built_site / "sitemap.xml").exists()  # built without --site-url: no address, no sitemap
    data = json.loads((built_site / "api/kimi-k2.json").read_text())
    comps = {c["path"]: c for c in data["components"]}
    block = comps["blocks.moe"]
    assert (block["parameters_per_instance"], block["instances"], block["parameters_total"]) == (
        17_059_365_248, 60, 1_023_561_914_880)
    assert comps["blocks.moe.moe.router"]["tensors"][1]["pattern"] == "model.layers.1-60.mlp.gate.e_score_correction_bias"
    assert comps["blocks.dense.mlp.down_proj"]["shapes"]["outputs"][0]["shape"] == "[B batch, T positions, 7168 d]"
    assert any(e["lines"] == [374, 390] for e in comps["blocks.dense.mlp"]["evidence"])


@pytest.fixture(scope="module")
def one_process_build(built_site, tmp_path_factory):
    """The real site built again, by one process (the fixture's build used a pool of two), from the full cache that
    build left; its last line of output says whether it imported torch (three tests share this one build, a
    whole-site build: the slow tier)."""
    out = tmp_path_factory.mktemp("again") / "site"
    code = ("import sys, build; code = build.main(['--out', sys.argv[1], '--jobs', '1']); "
            "print(code, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0 and result.stdout.splitlines()[-1].startswith("0 "), result.stdout + result.stderr
    return out, result


@pytest.mark.slow
def test_two_builds_are_byte_identical(built_site, one_process_build):
    """A build in one process writes the same bytes as the fixture's build by a pool of two."""
    again, _ = one_process_build
    cmp = filecmp.dircmp(built_site, again)

    def differences(c: filecmp.dircmp) -> list[str]:
        out = c.left_only + c.right_only + c.diff_files
        for sub in c.subdirs.values():
            out += differences(sub)
        return out

    assert differences(cmp) == []
    for page in built_site.rglob("*"):
        if page.is_file():
            assert page.read_bytes() == (again / page.relative_to(built_site)).read_bytes(), page


@pytest.mark.slow
def test_build_shows_progress(one_process_build):
    _, result = one_process_build
    assert "kimi-k2: spec, accounting" in result.stderr and re.search(r"rendered \d+ pages", result.stderr)


FORBIDDEN_IN_TEMPLATES = [r"\|\s*sum", r"\|\s*format", r"\|\s*round", r"\{\{[^}]*[*/+%-][^}]*\}\}",
                          r"\{%[^%]*[*/+%][^%]*%\}", r"\|\s*length"]


@pytest.mark.parametrize("template", sorted(p.name for p in (ROOT / "templates").glob("*.html")))
def test_templates_hold_no_arithmetic(template):
    # string literals ("per-token" anchors) are names, not arithmetic
    source = re.sub(r'"[^"]*"', '""', (ROOT / "templates" / template).read_text())
    for pattern in FORBIDDEN_IN_TEMPLATES:
        assert not re.search(pattern, source), (template, pattern)


def test_missing_view_field_fails_the_render():
    from jinja2 import UndefinedError

    from explorer.render.site_writer import environment

    env = environment(ROOT / "templates")
    with pytest.raises(UndefinedError):
        env.get_template("prose.html").render(page=object())


def test_every_page_is_within_the_weight_budget(built_site):
    """Issue 5's budget: HTML + CSS + JS under 100 KB gzip for every page (the search index loads on demand)."""
    import gzip

    assets = sum(len(gzip.compress((built_site / f"static/{n}").read_bytes(), 9)) for n in ("style.css", "search.js", "scroll.js"))
    for page in built_site.rglob("*.html"):
        assert len(gzip.compress(page.read_bytes(), 9)) + assets < 100_000, page


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def test_build_workers_run_torch_on_one_thread(monkeypatch):
    """Issue 14: each pool worker pins torch to one thread, whether torch was imported before the fork or after."""
    import multiprocessing
    import os
    import sys

    from explorer.pipeline import _one_torch_thread

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch = sys.modules.get("torch")
    previous = torch.get_num_threads() if torch else 0
    if torch:
        torch.set_num_threads(2)  # what a worker inherits from this process without the pin
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            unpinned = pool.apply(_torch_threads)
        with multiprocessing.get_context("fork").Pool(1, initializer=_one_torch_thread) as pool:
            assert pool.apply(_torch_threads) == 1
        assert unpinned > 1 or len(os.sched_getaffinity(0)) == 1  # the check above can fail
    finally:
        if torch:
            torch.set_num_threads(previous)


@pytest.mark.slow
def test_a_build_from_a_full_cache_never_imports_torch(one_process_build):
    """Issue 14: with every torch stage cached, the build builds specs and pages only; importing torch would be a
    third of its time."""
    _, result = one_process_build
    assert result.stdout.splitlines()[-1] == "0 False", result.stdout + result.stderr


KIMI_PAGES = ["blocks.moe.html", "blocks.moe.attn.html", "blocks.moe.moe.html", "blocks.dense.mlp.html",
              "index.html", "blocks.moe.moe.router.html"]


def _flow(page: Path) -> str:
    return re.search(r'<figure class="flow".*?</figure>', page.read_text(), flags=re.S).group(0)


def test_every_diagram_draws_every_child_and_its_boxes_add_up(built_site):
    """Issue 12: the attention diagram drew 6 of 9 children (42.4M of 101.1M); MTP dropped its head."""
    for page in sorted((built_site / "models").rglob("*.html")):
        source = page.read_text()
        flow = _flow(page)
        drawn = [int(v) for v in re.findall(r'data-params="(\d+)"', flow)]
        total = re.search(r'Per-instance total</th><td class="num">([\d,]+)<', source)
        assert sum(drawn) == (int(total.group(1).replace(",", "")) if total else 0), page
        cards = re.findall(r'<a class="card" href="([^"]+)"', source)
        assert sorted(re.findall(r'<a href="([^"]+)" class="box"', flow)) == sorted(cards), page


def test_diagrams_show_residual_adds_streams_and_the_expert_sum(built_site):
    block, attn, moe, mtp = (_flow(built_site / f"models/{p}") for p in (
        "kimi-k2/blocks.moe.html", "kimi-k2/blocks.moe.attn.html", "kimi-k2/blocks.moe.moe.html",
        "deepseek-v3/mtp.html"))
    # the residual's label is its step, in the equations' symbols (x′_n = x_n + Δ_attn, scripts set as tspans,
    # the label wrapped over lines)
    words = " ".join(re.sub(r"<[^>]+>", "", block.replace("</text>", " </text>")).split())
    assert block.count('class="a skip"') == 2 and "x′n = xn + Δattn" in words
    assert "query stream" in attn and "key-value stream" in attn and "Output projection" in attn
    assert "selected routed experts" in moe and "384 × 44,040,192" in moe and "Σ" in moe
    assert "MTP output head" in mtp and "926,679,040 params" in mtp


def test_no_page_gives_build_instructions(built_site):
    """Issue 12: cards said "build with --fetch-sources"; build advice belongs in the build log."""
    for page in sorted(built_site.rglob("*.html")):
        text = text_of(page)
        for advice in ("--fetch-sources", "build.py", "pip install", "Excerpt unavailable"):
            assert advice not in text, (page, advice)


def test_offline_evidence_is_quoted_or_linked_in_reader_terms(built_site):
    page = built_site / "models/kimi-k2/blocks.dense.mlp.down_proj.html"
    text = text_of(page)
    excerpt = page.read_text().split("config.json 38–46", 2)[2].split("</figure>", 1)[0]
    assert '"quant_method"' in html.unescape(re.sub(r"<[^>]+>", "", excerpt))
    assert "Regenerated from the configuration values recorded for fd1984e, and verified" in text
    assert "The pinned file is not bundled with this site; read lines 374–390 at fd1984e on Hugging Face" in text
    assert "stored rotary buffers" not in text and "(FP8 block scales excluded)" in text


def test_each_excerpt_is_shown_once_and_every_claim_points_to_one(built_site):
    for name in KIMI_PAGES:
        source = (built_site / "models/kimi-k2" / name).read_text()
        captions = re.findall(r'<figure class="excerpt" id="(code-\d+)">\s*<figcaption>([^<]+)', source)
        assert len({c for _, c in captions}) == len(captions), name
        targets = re.findall(r'<a href="#(code-\d+)">Code: ', source)
        assert targets and set(targets) <= {i for i, _ in captions}, name


def test_formulas_in_config_names_are_visible_text(built_site):
    text = text_of(built_site / "models/kimi-k2/blocks.dense.mlp.down_proj.html")
    assert "18,432 × 7,168" in text and "intermediate_size × hidden_size" in text


def test_equation_blocks_link_the_glossary_and_the_tiny_config_is_said_once(built_site):
    for name in KIMI_PAGES:
        assert 'href="../../glossary.html">Notation: every symbol defined' in (built_site / "models/kimi-k2" /
                                                                                name).read_text()
    glossary = text_of(built_site / "glossary.html")
    assert "indexes a routed expert" in glossary and "indexes a head" in glossary
    model = text_of(built_site / "models/kimi-k2/index.html")
    assert "at the family's tiny config: d 64, 4 heads" in model
    for leaf in ("blocks.dense.mlp.down_proj.html", "blocks.dense.attn.rope.html"):
        assert "d 64, 4 heads" not in text_of(built_site / "models/kimi-k2" / leaf), leaf


def test_search_acronyms_leave_out_parenthetical_qualifiers():
    from explorer.views.search import acronyms

    assert acronyms("Multi-head latent attention") == {"mla", "mhla"}
    assert acronyms("Routed experts (clamped SwiGLU)") == set()  # was {"re(s"}
