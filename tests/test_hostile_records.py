"""Issue 37: what the build takes on trust from its own records. An empty config hash turned the edited-config check
off; a cache entry edited on disk was published as computed. Each test fails on the code before the fix.

Everything runs on a scratch copy of one or two models; the cache test runs the torch stages of one small model."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.pipeline import prepare_model


def _copy(tmp_path: Path, slug: str) -> Path:
    return shutil.copytree(ROOT / "content/models" / slug, tmp_path / slug)


def _edit(folder: Path, pattern: str, replacement: str) -> None:
    toml = folder / "model.toml"
    text, n = re.subn(pattern, replacement, toml.read_text(), count=1, flags=re.M)
    assert n == 1, pattern
    toml.write_text(text)


# ------------------------------------------------------------------------- an empty config hash is an error

@pytest.mark.parametrize("blank", ['config_sha256 = ""', 'config_sha256 = "  "'])
def test_an_empty_config_hash_is_refused_naming_file_and_key(tmp_path, blank):
    """Blanking config_sha256 used to switch the edited-config check off: an edited value was then built and
    published. Now it is one line naming model.toml and the key, before anything is computed."""
    folder = _copy(tmp_path, "llama-3.1-8b")
    _edit(folder, r"^config_sha256 = .*$", blank)
    _edit(folder, r"^intermediate_size = 14336$", "intermediate_size = 14337")
    with pytest.raises(ContentError) as raised:
        prepare_model(load_model_content(folder), progress=lambda _: None)
    (line,) = raised.value.problems
    assert line.startswith(f"{folder / 'model.toml'}: key 'checkpoint.config_sha256': empty, ")
    assert "config_values_sha256" in line and "checkpoint.toml states the config values" in line


def test_an_empty_config_hash_with_a_values_digest_still_checks_the_values(tmp_path):
    """With config_sha256 empty, a config_values_sha256 that the values no longer match used to pass silently."""
    folder = _copy(tmp_path, "qwen3.5-27b")  # records both hashes
    _edit(folder, r"^config_sha256 = .*$", 'config_sha256 = ""')
    prepare_model(load_model_content(folder), progress=lambda _: None)  # the values digest alone suffices
    _edit(folder, r"^max_position_embeddings = 262144$", "max_position_embeddings = 262145")
    with pytest.raises(ContentError) as raised:
        prepare_model(load_model_content(folder), progress=lambda _: None)
    assert raised.value.problems == (
        f"{folder / 'model.toml'}: key 'config': the recorded values no longer hash to "
        "checkpoint.config_values_sha256 (" + load_model_content(folder).checkpoint.config_values_sha256[:12]
        + "…), so a value was changed after it was recorded (or a key added or removed); restore the published "
        "value, or record the config again with build.py --add-model",)


@pytest.mark.parametrize("slug", ["gemma-3-270m", "smollm2-135m"])
def test_a_gguf_model_may_leave_the_hash_empty_only_while_its_checkpoint_states_the_values(tmp_path, slug):
    """The GGUF models have no config.json to hash: their checkpoint.toml states the values from the GGUF header,
    and every build compares them with [config], so an edited value is still caught. Without that table the
    empty hash is refused like any other."""
    folder = _copy(tmp_path, slug)
    prepared = prepare_model(load_model_content(folder), progress=lambda _: None)
    assert prepared.config_differences == ()
    _edit(folder, r"^max_position_embeddings = (\d+)$", r"max_position_embeddings = 1\1")  # 32768 -> 132768
    edited = prepare_model(load_model_content(folder), progress=lambda _: None)
    assert len(edited.config_differences) == 1
    assert edited.config_differences[0].startswith("key 'max_position_embeddings': ")
    manifest = folder / "checkpoint.toml"
    text = manifest.read_text()
    manifest.write_text(text[:text.index("\n[config]\n")] + text[text.index("\n[[tensor]]\n"):])
    with pytest.raises(ContentError, match=r"model\.toml: key 'checkpoint\.config_sha256': empty, "):
        prepare_model(load_model_content(folder), progress=lambda _: None)


# -------------------------------------------------------------- a cache entry edited on disk is recomputed

def test_a_cache_entry_edited_on_disk_is_recomputed_not_published(tmp_path):
    """The torch stages' cache published whatever an entry said that its checks on reading accepted: an equation
    check's max |Δ| edited to 0, a router's worked example with other scores, another set of lit experts in the
    picture. Each entry is now sealed as written, so the edited ones are recomputed and the build publishes the
    computed values."""
    from explorer.pipeline import build_model

    slug = "qwen3-30b-a3b"
    content = load_model_content(ROOT / "content/models" / slug)
    cache_dir = tmp_path / "cache"
    messages: list[str] = []
    computed = build_model(content, cache_dir=cache_dir, progress=messages.append)
    (entry,) = (p for p in cache_dir.glob(f"{slug}-*.json") if "-picture-" not in p.name and "-patterns-" not in p.name)
    (picture,) = cache_dir.glob(f"{slug}-picture-*.json")
    errors = [c.max_abs_error for c in computed.checks.values() if c.status == "checked"]
    examples = [c.example for c in computed.checks.values() if c.example is not None]
    assert errors and max(errors) > 0 and examples and computed.picture_routing is not None
    text = entry.read_text()
    edited = re.sub(r'"max_abs_error": [-+0-9.e]+', '"max_abs_error": 0.0', text)
    label, values = examples[0].rows[0]
    edited = edited.replace(json.dumps([label, list(values)]), json.dumps([label, [0.5] * len(values)]), 1)
    assert edited.count('"max_abs_error": 0.0') >= len(errors) and "0.5, 0.5" in edited
    entry.write_text(edited)
    selected = computed.picture_routing.selected
    other = [i + 1 for i in selected] if selected[-1] + 1 < computed.picture_routing.experts else [0, *selected[1:]]
    picture.write_text(picture.read_text().replace(json.dumps(list(selected)), json.dumps(other)))
    assert json.dumps(other) in picture.read_text()
    messages.clear()
    rebuilt = build_model(content, cache_dir=cache_dir, progress=messages.append)
    assert f"{slug}: building the reference on meta, tracing at full size, checking equations" in messages
    assert rebuilt.checks == computed.checks and rebuilt.trace == computed.trace
    assert rebuilt.picture_routing == computed.picture_routing
    messages.clear()
    assert build_model(content, cache_dir=cache_dir, progress=messages.append).checks == computed.checks
    assert f"{slug}: reference tensors, shape trace and equation checks from cache" in messages  # rewritten
