"""Bad input: each problem gives one message naming the file and the key, the build exits 1 and the
previous site stays as it was. Also: recorded content reproduces what it was recorded from."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from conftest import ROOT, run_build

from explorer.content import load_model_content
from explorer.errors import ContentError
from explorer.families import load_model_spec
from explorer.families.deepseek_v3 import TRANSFORMERS_FILE
from explorer.spec.types import Citation

KIMI = "content/models/kimi-k2/model.toml"


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
    path = edit(project_copy, KIMI, r"^hidden_size = 7168\n", "")
    (msg,) = problems_for(project_copy)
    assert msg == f"{path}: table 'config': key 'hidden_size': missing (expected an integer)"


def test_misspelled_key_suggests_the_right_one(project_copy):
    path = edit(project_copy, KIMI, r"^n_routed_experts = ", "n_routed_expert = ")
    msgs = problems_for(project_copy)
    assert f"{path}: table 'config': key 'n_routed_expert': unknown; did you mean 'n_routed_experts'?" in msgs
    assert f"{path}: table 'config': key 'n_routed_experts': missing (expected an integer)" in msgs
    assert len(msgs) == 2


def test_mistyped_value_says_what_was_expected(project_copy):
    path = edit(project_copy, KIMI, r"^hidden_size = 7168", 'hidden_size = "7168"')
    (msg,) = problems_for(project_copy)
    assert msg == f"{path}: table 'config': key 'hidden_size': expected an integer, got a string '7168'"


def test_nested_table_key_is_named(project_copy):
    path = edit(project_copy, KIMI, r"^factor = 32.0", 'factr = 32.0')
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
    path = edit(project_copy, KIMI, r'^family = "deepseek_v3"', 'family = "deepseek_v4"')
    (msg,) = problems_for(project_copy)
    assert msg == f"{path}: key 'model.family': unknown family 'deepseek_v4'; did you mean 'deepseek_v3'?"


def test_line_map_symbol_not_cited_by_the_family(project_copy):
    from explorer.sources import resolve_citations

    path = edit(project_copy, KIMI, r'^"DeepseekV3MLP" = ', '"DeepseekV3MLPP" = ')
    content = load_model_content(project_copy / "content/models/kimi-k2")
    with pytest.raises(ContentError) as info:
        resolve_citations(load_model_spec(content), content)
    msgs = info.value.problems
    assert (f"{path}: key 'checkpoint.source_lines.DeepseekV3MLPP': not cited by the deepseek_v3 family; "
            "did you mean 'DeepseekV3MLP'?") in msgs
    assert any("key 'checkpoint.source_lines.DeepseekV3MLP': missing" in m for m in msgs)


def test_cited_transformers_symbol_missing_from_its_file():
    from explorer.sources import _Resolver, transformers_file

    content = load_model_content(ROOT / "content/models/kimi-k2")
    resolver = _Resolver(content, fetch=False)
    assert resolver.resolve(Citation("claim", "transformers", "DeepseekV3MLPP", TRANSFORMERS_FILE)) is None
    path = transformers_file(TRANSFORMERS_FILE)
    assert resolver.problems == [f"{path}: symbol 'DeepseekV3MLPP': not found; did you mean 'DeepseekV3MLP'?"]


def test_failed_build_exits_1_and_leaves_the_previous_site(project_copy, tmp_path):
    out = tmp_path / "sites" / "out"
    out.mkdir(parents=True)
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


def test_checkpoint_file_in_cache_is_excerpted(tmp_path):
    content = load_model_content(ROOT / "content/models/kimi-k2")
    ref = content.checkpoint
    cache = fake_hf_cache(tmp_path / "hub", ref.repo_id, ref.revision,
                          {ref.modeling_file: synth_module(ref.source_lines)})
    out = tmp_path / "site"
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    result = run_build("--out", str(out), env=env)
    assert result.returncode == 0, result.stderr
    page = (out / "models/kimi-k2/blocks.dense.mlp.html").read_text()
    assert "Excerpt unavailable offline: modeling_deepseek.py" not in page
    # The excerpt of the cached file is shown under its own line numbers, 374-390.
    card = page.split("modeling_deepseek.py 374–390", 1)[1].split("</figure>", 1)[0]
    assert '<span class="nc">DeepseekV3MLP</span>' in card
    assert ">374<" in card and ">390<" in card


def test_cited_range_that_no_longer_holds_its_symbol_fails(tmp_path, project_copy):
    content = load_model_content(ROOT / "content/models/kimi-k2")
    ref = content.checkpoint
    shifted = "\n" + synth_module(ref.source_lines)  # every symbol one line lower
    cache = fake_hf_cache(tmp_path / "hub", ref.repo_id, ref.revision, {ref.modeling_file: shifted})
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
    from explorer.sources import locate_json_key

    content = load_model_content(ROOT / "content/models/deepseek-v3")
    text = json.dumps(content.config, indent=2, sort_keys=True)
    assert locate_json_key(text, "quantization_config") == content.checkpoint.config_lines["quantization_config"]
