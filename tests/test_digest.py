"""The up-to-date check (issue 14): an unchanged build stops before importing torch, and a change to any
input (content, templates, static files, the package, a library version, a pinned file in the Hugging Face
cache, the output folder itself) makes the next build run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_build

from explorer import digest
from explorer.digest import MARKER, input_digest, up_to_date, write_marker
from explorer.project import Project


def test_unchanged_build_stops_before_importing_torch(built_site, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(built_site, site)  # a copy, so a check that wrongly rebuilds cannot disturb other tests
    probe = ("import sys, build\n"
             f"code = build.main(['--out', {str(site)!r}])\n"
             "print(code, sorted(m for m in ('torch', 'transformers', 'explorer.pipeline') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"{site} is up to date" in result.stdout
    assert result.stdout.splitlines()[-1] == "0 []"


def test_changed_input_rebuilds_end_to_end(small_project_copy, tmp_path):
    project = small_project_copy("gpt2")  # one model shows it; the whole site would be rebuilt for the change
    first = tmp_path / "first"
    assert run_build("--content", str(project), "--out", str(first)).returncode == 0
    moved, out = tmp_path / "moved", tmp_path / "out"
    shutil.copytree(project, moved)  # copies hold the same inputs and outputs: the digest names no folder
    shutil.copytree(first, out)
    args = ("--content", str(moved), "--out", str(out))
    assert "is up to date" in run_build(*args).stdout
    css = moved / "static/style.css"
    css.write_text(css.read_text() + "\n/* changed */\n")
    again = run_build(*args)
    assert again.returncode == 0 and again.stdout.startswith("built"), again.stdout + again.stderr
    assert (out / "static/style.css").read_text().endswith("/* changed */\n")
    assert "is up to date" in run_build(*args).stdout


@pytest.fixture
def inputs(bare_project_copy, tmp_path, monkeypatch):
    """A project copy, a copy of the package, an empty Hugging Face cache and a folder marked as built."""
    package = tmp_path / "package"
    shutil.copytree(digest.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(digest, "PACKAGE", package)
    monkeypatch.setattr(digest, "_hub_cache", lambda: tmp_path / "hf-cache")
    out = tmp_path / "out"
    (out / "models").mkdir(parents=True)
    (out / "index.html").write_text("<p>index</p>")
    (out / "models/page.html").write_text("<p>page</p>")
    project = Project(bare_project_copy)
    write_marker(out, input_digest(project))
    assert up_to_date(out, input_digest(project))
    return project, package, out, tmp_path


def _append(path: Path) -> None:
    path.write_text(path.read_text() + "\n# changed\n")


def _kimi_modeling_file_cached(project: Project, hf_cache: Path) -> None:
    import tomllib

    ref = tomllib.loads((project.content / "models/kimi-k2/model.toml").read_text())["checkpoint"]
    snapshot = hf_cache / f"models--{ref['repo_id'].replace('/', '--')}" / "snapshots" / ref["revision"]
    snapshot.mkdir(parents=True)
    (snapshot / ref["modeling_file"]).write_text("class DeepseekV3MLP:\n    pass\n")


CHANGES = {
    "content value": lambda p, pkg, out, tmp: _append(p.content / "models/kimi-k2/model.toml"),
    "new prose file": lambda p, pkg, out, tmp: (p.content / "models/kimi-k2/prose/new.md").write_text("x"),
    "renamed content file": lambda p, pkg, out, tmp: (p.content / "how-to-read.md").rename(p.content / "how.md"),
    "template": lambda p, pkg, out, tmp: _append(p.templates / "component.html"),
    "static file": lambda p, pkg, out, tmp: _append(p.static / "style.css"),
    "package module": lambda p, pkg, out, tmp: _append(pkg / "pipeline.py"),
    "package subpackage": lambda p, pkg, out, tmp: _append(pkg / "spec/types.py"),
    "checkpoint file in the HF cache": lambda p, pkg, out, tmp: _kimi_modeling_file_cached(p, tmp / "hf-cache"),
    "edited page": lambda p, pkg, out, tmp: (out / "models/page.html").write_text("<p>edited</p>"),
    "deleted page": lambda p, pkg, out, tmp: (out / "index.html").unlink(),
    "extra file": lambda p, pkg, out, tmp: (out / "stray.html").write_text(""),
    "no marker": lambda p, pkg, out, tmp: (out / MARKER).unlink(),
    "damaged marker": lambda p, pkg, out, tmp: (out / MARKER).write_text("{"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_any_changed_input_makes_the_build_stale(inputs, change):
    project, package, out, tmp_path = inputs
    CHANGES[change](project, package, out, tmp_path)
    assert not up_to_date(out, input_digest(project))


def test_a_library_version_change_makes_the_build_stale(inputs, monkeypatch):
    project, _, out, _ = inputs
    real = digest.importlib.metadata.version
    monkeypatch.setattr(digest.importlib.metadata, "version",
                        lambda name: "2.14.0" if name == "torch" else real(name))
    assert not up_to_date(out, input_digest(project))


def test_marker_records_inputs_and_outputs(inputs):
    project, _, out, _ = inputs
    marker = json.loads((out / MARKER).read_text())
    assert marker == {"inputs": input_digest(project), "outputs": digest.output_digest(out)}
