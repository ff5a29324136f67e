"""Bad input: each problem gives one message naming the file and the key, the build exits 1 and the
previous site stays as it was. Also: recorded content reproduces what it was recorded from."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from conftest import ROOT, build_main, run_build

from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.model.families import load_model_spec
from explorer.model.families.deepseek_v3 import TRANSFORMERS_FILE
from explorer.spec.types import Citation, walk

KIMI = "content/models/kimi-k2/model.toml"
KIMI_AND_FOLLOWED = ("kimi-k2", "deepseek-v3")
"""The models a build about Kimi K2 needs: it names DeepSeek-V3 as the model it follows."""


def edit(root: Path, rel: str, old: str, new: str) -> Path:
    path = root / rel
    text = path.read_text()
    assert re.search(old, text, flags=re.M), old
    path.write_text(re.sub(old, new, text, count=1, flags=re.M))
    return path


def problems_for(root: Path) -> tuple[str, ...]:
    with pytest.raises(ContentError) as info:
        content = load_model_content(root / "content/models/kimi-k2")
        load_model_spec(content)
    return info.value.problems


def test_missing_key_names_file_key_and_expectation(project_copy):
    """A key the family requires and DeepseekV3Config gives no literal default for (it reads rope_parameters);
    a key the class defaults takes its default instead (tests/test_config_defaults.py)."""
    path = edit(project_copy, KIMI, r"^rope_theta = .*\n", "")
    (msg,) = problems_for(project_copy)
    assert msg == f"{path}: table 'config': key 'rope_theta': missing (expected a number)"


def test_misspelled_key_suggests_the_right_one(project_copy):
    path = edit(project_copy, KIMI, r"^rope_theta = ", "rope_thetaa = ")
    msgs = problems_for(project_copy)
    assert f"{path}: table 'config': key 'rope_thetaa': unknown; did you mean 'rope_theta'?" in msgs
    assert f"{path}: table 'config': key 'rope_theta': missing (expected a number)" in msgs
    assert len(msgs) == 2


def test_mistyped_value_says_what_was_expected(project_copy):
    path = edit(project_copy, KIMI, r"^hidden_size = 7168", 'hidden_size = "7168"')
    (msg,) = problems_for(project_copy)
    assert msg == f"{path}: table 'config': key 'hidden_size': expected an integer, got a string '7168'"


def test_nested_table_key_is_named(project_copy):
    path = edit(project_copy, KIMI, r"\bfactor = 32.0", "factr = 32.0")
    msgs = problems_for(project_copy)
    assert f"{path}: table 'config': table 'rope_scaling': key 'factr': unknown; did you mean 'factor'?" in msgs


def test_self_contradicting_config(project_copy):
    path = edit(project_copy, KIMI, r"^num_experts_per_tok = 8", "num_experts_per_tok = 400")
    msgs = problems_for(project_copy)
    assert f"{path}: table 'config': key 'num_experts_per_tok': must be <= n_routed_experts (384), got 400" in msgs


def test_every_problem_is_reported_in_one_run(project_copy):
    edit(project_copy, KIMI, r"^hidden_size = 7168", 'hidden_size = "7168"')
    edit(project_copy, KIMI, r"^vocab_size = 163840\n", "")
    edit(project_copy, KIMI, r"^tagline = ", "tagleine = ")
    msgs = problems_for(project_copy)
    assert any("key 'tagleine': unknown; did you mean 'tagline'?" in m for m in msgs)
    assert any("key 'tagline': missing" in m for m in msgs)


def test_unknown_family(project_copy):
    path = edit(project_copy, KIMI, r'^family = "deepseek_v3"', 'family = "deepseek_v33"')
    (msg,) = problems_for(project_copy)
    assert msg == f"{path}: key 'model.family': unknown family 'deepseek_v33'; did you mean 'deepseek_v3'?"


def test_line_map_symbol_not_cited_by_the_family(project_copy):
    from explorer.checkpoint.sources import resolve_citations

    path = edit(project_copy, KIMI, r'^"DeepseekV3MLP" = ', '"DeepseekV3MLPP" = ')
    content = load_model_content(project_copy / "content/models/kimi-k2")
    with pytest.raises(ContentError) as info:
        resolve_citations(load_model_spec(content), content)
    msgs = info.value.problems
    assert (f"{path}: key 'checkpoint.source_lines.DeepseekV3MLPP': not cited by the deepseek_v3 family; "
            "did you mean 'DeepseekV3MLP'?") in msgs
    assert any("key 'checkpoint.source_lines.DeepseekV3MLP': missing" in m for m in msgs)


def test_cited_transformers_symbol_missing_from_its_file():
    from explorer.checkpoint.sources import _Resolver
    from explorer.model.transformers_files import transformers_file

    content = load_model_content(ROOT / "content/models/kimi-k2")
    resolver = _Resolver(content, fetch=False)
    assert resolver.resolve(Citation("claim", "transformers", "DeepseekV3MLPP", TRANSFORMERS_FILE)) is None
    path = transformers_file(TRANSFORMERS_FILE)
    assert resolver.problems == [f"{path}: symbol 'DeepseekV3MLPP': not found; did you mean 'DeepseekV3MLP'?"]


def test_citations_parse_each_file_once_and_read_the_version_once(tmp_path, monkeypatch):
    """Issue 14: Kimi K2 cites two transformers files 23 times and its own modeling file 28 times; each file is
    parsed once, and the package version read once."""
    import ast
    import importlib.metadata

    from explorer.checkpoint import sources

    content = load_model_content(ROOT / "content/models/kimi-k2")
    ref = content.checkpoint
    synthetic = synth_module(ref.source_lines)
    cache = fake_hf_cache(tmp_path / "hub", ref.repo_id, ref.revision, {ref.modeling_file: synthetic})
    ref = dataclasses.replace(ref, modeling_sha256=hashlib.sha256(synthetic.encode()).hexdigest())  # else not quoted
    content = dataclasses.replace(content, checkpoint=ref)
    monkeypatch.setattr(sources, "try_to_load_from_cache",
                        lambda repo, name, revision: str(cache / f"models--{repo.replace('/', '--')}/snapshots"
                                                         f"/{revision}/{name}") if name == ref.modeling_file else None)
    spec = load_model_spec(content)
    parsed, versions = [], []

    class CountingAst:  # the ast module as sources.py sees it, counting parses
        def __getattr__(self, name):
            return getattr(ast, name)

        def parse(self, text, *args, **kwargs):
            parsed.append(len(text))
            return ast.parse(text, *args, **kwargs)

    real_version = importlib.metadata.version
    monkeypatch.setattr(sources, "ast", CountingAst())
    monkeypatch.setattr(importlib.metadata, "version", lambda name: versions.append(name) or real_version(name))
    sources._symbol_lines.cache_clear()
    sources.transformers_version.cache_clear()
    citations = sources.resolve_citations(spec, content)
    cited = [c for cs in citations.values() for c in cs]
    assert sum(c.source == "transformers" for c in cited) > 10
    assert any(c.file == ref.modeling_file and c.lines for c in cited)
    files = {c.path for _, comp in walk(spec.root) for c in comp.citations if c.source == "transformers"}
    assert len(parsed) == len(files) + 1 < len(cited) / 10  # each transformers file and the modeling file
    assert versions.count("transformers") == 1


def test_failed_build_exits_1_and_leaves_the_previous_site(small_project_copy, tmp_path):
    project_copy = small_project_copy(*KIMI_AND_FOLLOWED)
    out = tmp_path / "sites" / "out"
    out.mkdir(parents=True)
    (out / ".explorer-site").write_text("")
    (out / "index.html").write_text("previous site")
    edit(project_copy, KIMI, r"^n_routed_experts = ", "n_routed_expert = ")
    result = run_build("--content", str(project_copy), "--out", str(out))
    assert result.returncode == 1
    assert "key 'n_routed_expert': unknown; did you mean 'n_routed_experts'?" in result.stderr
    assert "Traceback" not in result.stderr
    assert (out / "index.html").read_text() == "previous site"
    assert [p.name for p in out.parent.iterdir()] == ["out"]  # no half-written temporary folder left beside it


# ------------------------------------------------------------------------ checkpoint files in the HF cache

def synth_module(line_map: dict[str, tuple[int, int]]) -> str:
    """A Python file whose classes and methods occupy exactly the recorded line ranges."""
    lines = [""] * (max(last for _, last in line_map.values()) + 1)
    owners: dict[str, int] = {}
    for symbol, (first, last) in sorted(line_map.items(), key=lambda kv: kv[1]):
        if "." in symbol:
            cls, method = symbol.split(".")
            owners.setdefault(cls, first - 1)
            lines[first - 1] = f"    def {method}(self):"
            for i in range(first, last - 1):  # a body with no blank lines, so cited sub-ranges hold text
                lines[i] = f"        step_{i + 1} = {i + 1}"
            lines[last - 1] = "        return None"
        else:
            lines[first - 1] = f"class {symbol}:"
            lines[last - 1] = "    value = None"
    for cls, line in owners.items():
        lines[line - 1] = f"class {cls}:"
    return "\n".join(lines) + "\n"


def fake_hf_cache(root: Path, repo_id: str, revision: str, files: dict[str, str]) -> Path:
    snapshot = root / f"models--{repo_id.replace('/', '--')}" / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return root


def record_modeling_hash(project_copy: Path, text: str) -> None:
    """checkpoint.modeling_sha256 of a synthetic modeling file: a cached copy is quoted only when it hashes to the
    recorded sha256 (issue 37)."""
    edit(project_copy, KIMI, r"^modeling_file = (.*)$",
         rf'modeling_file = \1\nmodeling_sha256 = "{hashlib.sha256(text.encode()).hexdigest()}"')


def test_checkpoint_file_in_cache_is_excerpted(tmp_path, small_project_copy):
    content = load_model_content(ROOT / "content/models/kimi-k2")
    ref = content.checkpoint
    synthetic = synth_module(ref.source_lines)
    cache = fake_hf_cache(tmp_path / "hub", ref.repo_id, ref.revision, {ref.modeling_file: synthetic})
    out = tmp_path / "site"
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    project_copy = small_project_copy(*KIMI_AND_FOLLOWED)
    record_modeling_hash(project_copy, synthetic)
    result = run_build("--content", str(project_copy), "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr
    page = (out / "models/kimi-k2/blocks.dense.mlp.html").read_text()
    assert "Excerpt unavailable offline: modeling_deepseek.py" not in page
    # The excerpt of the cached file is shown under its own line numbers, 374-390.
    card = page.split("modeling_deepseek.py 374–390", 1)[1].split("</figure>", 1)[0]
    assert '<span class="nc">DeepseekV3MLP</span>' in card
    assert ">374<" in card and ">390<" in card


def test_cited_range_that_no_longer_holds_its_symbol_fails(tmp_path, small_project_copy):
    project_copy = small_project_copy(*KIMI_AND_FOLLOWED)
    content = load_model_content(ROOT / "content/models/kimi-k2")
    ref = content.checkpoint
    shifted = "\n" + synth_module(ref.source_lines)  # every symbol one line lower
    cache = fake_hf_cache(tmp_path / "hub", ref.repo_id, ref.revision, {ref.modeling_file: shifted})
    record_modeling_hash(project_copy, shifted)  # the file recorded is the shifted one: its ranges are checked
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    result = run_build("--content", str(project_copy), "--out", str(tmp_path / "site"), env=env)
    assert result.returncode == 1
    model_toml = project_copy / KIMI
    assert (f"{model_toml}: key 'checkpoint.source_lines.DeepseekV3MLP': [374, 390] does not hold "
            "'DeepseekV3MLP' in modeling_deepseek.py at fd1984e (found: lines 375–391)") in result.stderr
    assert not (tmp_path / "site").exists()


def test_deepseek_v3_config_values_reproduce_the_published_file():
    """The recorded values, printed as config.json is (sorted, indented), hash to the published sha256."""
    content = load_model_content(ROOT / "content/models/deepseek-v3")
    text = json.dumps(content.config, indent=2, sort_keys=True) + "\n"
    assert hashlib.sha256(text.encode()).hexdigest() == content.checkpoint.config_sha256


def test_config_citation_lines_hold_in_the_published_layout():
    from explorer.content.json_lines import key_lines

    content = load_model_content(ROOT / "content/models/deepseek-v3")
    text = json.dumps(content.config, indent=2, sort_keys=True)
    assert key_lines(text, "quantization_config") == content.checkpoint.config_lines["quantization_config"]


# ------------------------------------------------------------------------ issue 13: content is data

def test_raw_html_in_prose_is_sanitised():
    """Issue 13, reproduction 5: <script> and on* attributes in prose used to run in the browser."""
    from explorer.content.model_content import render_markdown

    html = render_markdown('Intro <script>alert(1)</script> <b onclick="steal()">bold</b>\n\n'
                           '<img src="x.png" onerror="steal()"> [link](javascript:steal()) [ok](https://x.org)\n\n'
                           '<iframe src="https://evil"></iframe><style>body{display:none}</style>\n\n'
                           "| a | b |\n|:--|--:|\n| 1 | 2 |\n\n```\ncode <kbd>\n```\n")
    for bad in ("<script", "alert(1)", "onclick", "onerror", "javascript:", "<iframe", "<style", "display:none"):
        assert bad not in html, bad
    assert '<a href="https://x.org">ok</a>' in html and '<img src="x.png">' in html and "bold" in html
    assert '<th style="text-align:left">a</th>' in html and "<pre><code>code &lt;kbd&gt;" in html


def test_prose_symlinked_out_of_content_is_refused(project_copy):
    """Issue 13, reproduction 5: a prose file symlinked to a system file used to be published."""
    link = project_copy / "content/models/kimi-k2/prose/blocks.md"
    link.symlink_to("/etc/passwd")
    with pytest.raises(ContentError) as info:
        load_model_content(project_copy / "content/models/kimi-k2")
    assert info.value.problems == (f"{link}: resolves to /etc/passwd, outside {project_copy}/content/models/kimi-k2; "
                                   "content files may not link out of their folder",)


def test_model_folder_symlinked_out_of_content_is_refused(project_copy, tmp_path_factory):
    from explorer.content.model_content import load_all_models

    elsewhere = tmp_path_factory.mktemp("elsewhere") / "llama"
    (project_copy / "content/models/kimi-k2").rename(elsewhere)
    (project_copy / "content/models/llama").symlink_to(elsewhere)
    with pytest.raises(ContentError, match="llama: resolves to .*, outside .*; model folders may not link out"):
        load_all_models(project_copy / "content")


def test_model_folder_name_must_be_a_slug(project_copy):
    from explorer.content.model_content import load_all_models

    (project_copy / "content/models/gpt2").rename(project_copy / "content/models/GPT 2")  # no model follows it
    with pytest.raises(ContentError) as info:
        load_all_models(project_copy / "content")
    assert info.value.problems == (f"{project_copy}/content/models/GPT 2: not a model name (lowercase letters, "
                                   "digits, '-' and '.'); rename the folder",)


@pytest.mark.parametrize("rel", [KIMI, "content/models/kimi-k2/prose/index.md", "content/models/kimi-k2/checkpoint.toml"])
def test_non_utf8_content_names_file_and_byte_offset(project_copy, rel):
    """Issue 13, reproduction 7: non-UTF-8 bytes in a content file used to raise UnicodeDecodeError."""
    from explorer.checkpoint.manifest import read_manifest

    path = project_copy / rel
    data = path.read_bytes()
    path.write_bytes(data[:40] + b"\xff" + data[40:])
    with pytest.raises(ContentError) as info:
        load_model_content(project_copy / "content/models/kimi-k2")
        read_manifest(path)
    assert info.value.problems == (f"{path}: not UTF-8 at byte 40: invalid start byte",)


def test_missing_how_to_read_is_one_line(project_copy, tmp_path):
    """Issue 13, reproduction 7: a missing how-to-read.md used to end in a traceback."""
    (project_copy / "content/how-to-read.md").unlink()
    result = build_main("--content", str(project_copy), "--out", str(tmp_path / "site"))
    assert (result.returncode, result.stderr) == (1, f"error: {project_copy}/content/how-to-read.md: file is missing\n")


def test_missing_content_folder_is_one_line(tmp_path):
    """Issue 13, reproduction 7: a --content that does not exist used to end in a traceback."""
    result = build_main("--content", str(tmp_path / "nowhere"), "--out", str(tmp_path / "site"))
    assert (result.returncode, result.stderr) == (
        1, f"error: {tmp_path}/nowhere/content: no content folder (--content names the folder that holds content/)\n")


def test_release_month_is_checked(project_copy):
    """Issue 13, reproduction 7: `released = "July 2025"` used to fail while rendering, with a traceback."""
    path = edit(project_copy, KIMI, r'^released = "2025-07"', 'released = "July 2025"')
    with pytest.raises(ContentError) as info:
        load_model_content(project_copy / "content/models/kimi-k2")
    assert info.value.problems == (f"{path}: key 'model.released': expected a month as \"YYYY-MM\" (or \"\" if "
                                   "not recorded), got 'July 2025'",)


def test_prose_for_a_misspelled_component_names_the_file(project_copy):
    """Issue 13, reproduction 9: a prose file for a misspelled component was silently ignored."""
    from explorer.pipeline import build_model

    prose = project_copy / "content/models/kimi-k2/prose/blocks.dense.mpl.md"
    prose.write_text("The MLP.")
    with pytest.raises(ContentError) as info:
        build_model(load_model_content(project_copy / "content/models/kimi-k2"), progress=lambda _: None)
    assert info.value.problems == (f"{prose}: no component 'blocks.dense.mpl' in kimi-k2; did you mean 'blocks.dense.mlp'?",)


def test_sitemap_is_escaped_xml():
    """Issue 13, reproduction 9: sitemap.xml was not XML-escaped."""
    from xml.etree import ElementTree

    from explorer.render.site_writer import sitemap

    path = "models/a&b/<c>.html"
    root = ElementTree.fromstring(sitemap([path], "https://example.org/x?a=1&b=2/"))
    assert [loc.text for loc in root.iter("{http://www.sitemaps.org/schemas/sitemap/0.9}loc")] == [
        "https://example.org/x?a=1&b=2/models/a%26b/%3Cc%3E.html"]


def test_sitemap_urls_are_absolute():
    """Issue 25: the sitemap protocol wants absolute URLs; the address is the publisher's (--site-url)."""
    from explorer.render.site_writer import sitemap

    assert "<loc>https://example.org/explorer/models/kimi-k2/index.html</loc>" in sitemap(
        ["models/kimi-k2/index.html"], "https://example.org/explorer")


def test_terminal_escapes_in_tensor_names_are_printed_escaped(project_copy, tmp_path):
    """Issue 13, reproduction 9: escape codes in tensor names were printed raw to the terminal."""
    import struct

    folder = tmp_path / "ckpt"
    folder.mkdir()
    raw = json.dumps({"\x1b[2J\x1b[31mevil\u202e": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(4))
    result = build_main("--content", str(project_copy), "--record-checkpoint", "kimi-k2", "--from-folder", str(folder))
    assert result.returncode == 1 and "\x1b" not in result.stderr and "\u202e" not in result.stderr
    assert result.stderr == (f"error: {folder}/model.safetensors: tensor '\\x1b[2J\\x1b[31mevil\\u202e': "
                             "unknown dtype 'F33'\n")


# ------------------------------------------------------------- issue 13: config values checked by every family

HOSTILE_VALUES = [
    (r"^num_key_value_heads = 64$", "num_key_value_heads = -64",
     "key 'num_key_value_heads': must be an integer in 1..10,000, got -64"),
    (r"^num_key_value_heads = 64$", "num_key_value_heads = 0",
     "key 'num_key_value_heads': must be an integer in 1..10,000, got 0"),
    (r"^rope_theta = 50000.0$", "rope_theta = inf", "key 'rope_theta': must be a finite number, got inf"),
    (r"^rms_norm_eps = 1e-06$", "rms_norm_eps = nan", "key 'rms_norm_eps': must be a finite number, got nan"),
    (r"^rms_norm_eps = 1e-06$", "rms_norm_eps = -1e-06", "key 'rms_norm_eps': must be > 0, got -1e-06"),
    (r"^hidden_size = 7168$", "hidden_size = 1000000000000000000000000000000",
     "key 'hidden_size': must be an integer in 1..1,000,000, got 1000000000000000000000000000000"),
    (r"^n_routed_experts = 384$", "n_routed_experts = 10000000",
     "key 'n_routed_experts': must be an integer in 1..4,096, got 10000000"),
    (r"^num_hidden_layers = 61$", "num_hidden_layers = 100000",
     "key 'num_hidden_layers': must be an integer in 1..1,000, got 100000"),
    (r"^routed_scaling_factor = 2.827$", "routed_scaling_factor = nan",
     "key 'routed_scaling_factor': must be a finite number, got nan"),
    (r"^factor = 32.0$", "factor = 0.0", "key 'rope_scaling.factor': must be > 0, got 0.0"),
    (r"^weight_block_size = \[128, 128\]$", "weight_block_size = [0, 128]",
     "key 'quantization_config.weight_block_size': must be positive integers"),
]


@pytest.mark.parametrize(("old", "new", "message"), HOSTILE_VALUES, ids=[h[1] for h in HOSTILE_VALUES])
def test_out_of_range_and_non_finite_config_values_are_one_line_each(project_copy, old, new, message):
    """Issue 13, items 4 and 7: checked before anything is built, with the valid range in the message."""
    path = edit(project_copy, KIMI, old, new)
    problems = problems_for(project_copy)
    assert problems == (f"{path}: table 'config': {message}",), problems


def _mlp_lines() -> tuple[int, int, list[str]]:
    from explorer.checkpoint.sources import locate_symbol
    from explorer.model.transformers_files import transformers_file

    text = transformers_file(TRANSFORMERS_FILE).read_text()
    first, last = locate_symbol(text, "DeepseekV3MLP")
    return first, last, text.splitlines()


def test_citation_names_a_part_of_its_symbol():
    """Issue 12: a citation may name the lines that make the point, as the seed cites 1152-1166 of a method."""
    from explorer.checkpoint.sources import _Resolver

    first, last, lines = _mlp_lines()
    forward = next(i for i in range(first, last + 1) if lines[i - 1].strip().startswith("def forward"))
    resolver = _Resolver(load_model_content(ROOT / "content/models/kimi-k2"), fetch=False)
    found = resolver.resolve(Citation("claim", "transformers", "DeepseekV3MLP", TRANSFORMERS_FILE,
                                      lines=(forward, last)), "test")
    assert resolver.problems == []
    assert (found.first, found.last, found.symbol_lines) == (forward, last, (first, last))
    assert found.lines == tuple(lines[forward - 1:last]) and found.url.endswith(f"#L{forward}-L{last}")


@pytest.mark.parametrize("shift, reason", [(1, "do not lie inside the symbol's lines"),
                                           (-1, "start or end on a blank line")])
def test_citation_part_outside_its_symbol_or_on_a_blank_line_fails(shift, reason):
    from explorer.checkpoint.sources import _Resolver

    first, last, lines = _mlp_lines()
    blank = next(i for i in range(first, last + 1) if not lines[i - 1].strip())
    cited = (first, last + 1) if shift == 1 else (first, blank)
    resolver = _Resolver(load_model_content(ROOT / "content/models/kimi-k2"), fetch=False)
    assert resolver.resolve(Citation("claim", "transformers", "DeepseekV3MLP", TRANSFORMERS_FILE,
                                     lines=cited), "deepseek_v3 family, component 'blocks.dense.mlp'") is None
    (msg,) = resolver.problems
    assert msg.startswith("deepseek_v3 family, component 'blocks.dense.mlp': citation of 'DeepseekV3MLP'")
    assert f"lines [{cited[0]}, {cited[1]}] {reason}" in msg


def test_range_ends_at_the_last_line_of_code():
    from explorer.checkpoint.sources import trim_blank_end

    assert trim_blank_end("a\nb\n\n   \nc\n", 1, 4) == (1, 2)
    assert trim_blank_end("a\nb\n", 1, 2) == (1, 2)


@pytest.mark.parametrize("slug", ["kimi-k2", "deepseek-v3"])
def test_config_json_is_regenerated_only_when_its_hash_matches(slug, tmp_path):
    """The recorded values reproduce the published bytes (Kimi K2 in its own key order, DeepSeek-V3 sorted);
    a changed value no longer does, and nothing is quoted."""
    import dataclasses

    from explorer.checkpoint.sources import regenerate_config
    from explorer.content.json_lines import key_lines

    content = load_model_content(ROOT / f"content/models/{slug}")
    text = regenerate_config(content)
    assert text is not None and hashlib.sha256(text.encode()).hexdigest() == content.checkpoint.config_sha256
    assert key_lines(text, "quantization_config") == content.checkpoint.config_lines["quantization_config"]
    changed = dataclasses.replace(content, config={**content.config, "routed_scaling_factor": 2.8})
    assert regenerate_config(changed) is None


def test_part_of_a_pinned_checkpoint_symbol_is_cited_offline_by_its_own_lines():
    """The seed's MoE block cites modeling_deepseek.py 1152-1166 of DeepseekV3DecoderLayer.__init__ (1144-1166):
    offline the part is checked against the recorded range and linked at the pinned revision."""
    from explorer.checkpoint.sources import _Resolver

    resolver = _Resolver(load_model_content(ROOT / "content/models/kimi-k2"), fetch=False)
    cit = Citation("claim", "checkpoint", "DeepseekV3DecoderLayer.__init__", lines=(1152, 1166))
    found = resolver.resolve(cit, "test")
    assert (found.first, found.last, found.symbol_lines, found.origin) == (1152, 1166, (1144, 1166), "absent")
    assert found.url.endswith("/modeling_deepseek.py#L1152-L1166") and found.lines is None
    assert resolver.resolve(Citation("claim", "checkpoint", "DeepseekV3DecoderLayer.__init__", lines=(1140, 1166)),
                            "test") is None
    assert "lines [1140, 1166] do not lie inside the symbol's lines 1144–1166" in resolver.problems[0]


def test_a_stale_config_order_means_no_regenerated_file(project_copy):
    """The order is a hint checked by the hash: with vocab_size missing from it, Kimi K2's sorted serialisation
    does not hash to the recorded sha256, so nothing is quoted as the published file."""
    from explorer.checkpoint.sources import regenerate_config

    edit(project_copy, KIMI, r', "vocab_size"\]', "]")
    content = load_model_content(project_copy / "content/models/kimi-k2")
    assert regenerate_config(content) is None


@pytest.mark.parametrize("follows", ["deepseek-v4", "kimi-k2"])
def test_follows_names_another_model_of_the_site(project_copy, follows):
    """Issue 26: a static comparison is kept for model.follows; an unknown model (or the model itself) is one line
    naming the file and key, with the closest slug."""
    from explorer.content.model_content import load_all_models

    toml = project_copy / "content/models/kimi-k2/model.toml"
    toml.write_text(toml.read_text().replace('follows = "deepseek-v3"', f'follows = "{follows}"'))
    with pytest.raises(ContentError) as info:
        load_all_models(project_copy / "content")
    assert info.value.problems == ((f"{toml}: key 'model.follows': no model 'deepseek-v4' in content/models; did you "
                                    "mean 'deepseek-v3'?") if follows == "deepseek-v4" else
                                   f"{toml}: key 'model.follows': names the model itself; name the model it follows, "
                                   "or leave the key out",)
