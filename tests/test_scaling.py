"""Issue 26: the site grows linearly with the models it holds. The same project is built with four models and with
eight, and no file (nor the number of files) grows faster than the model count: a page per pair of models, or a
list of every other model on every page, would grow about four- to fivefold from four models to eight."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_build

pytestmark = pytest.mark.slow  # two builds of the site, at two sizes

SMALL = ("gpt2", "mixtral-8x7b", "qwen3-8b", "deepseek-v3")
LARGE = (*SMALL, "kimi-k2", "llama-3.1-8b", "smollm2-135m", "gemma-3-270m")
"""Closed under model.follows (kimi-k2 follows deepseek-v3, smollm2-135m follows llama-3.1-8b)."""
GROWTH = 2.5
"""Largest accepted growth of any file, and of the file count, when the models double (linear: about 2)."""


def _site(project: Path, models: tuple[str, ...], out: Path) -> dict[str, int]:
    for folder in (project / "content/models").iterdir():
        if folder.name not in models:
            shutil.rmtree(folder)
    result = run_build("--content", str(project), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*") if p.is_file()}


def test_no_file_grows_faster_than_the_model_count(project_copy, tmp_path):
    large_project = tmp_path / "large"
    shutil.copytree(project_copy, large_project)
    small = _site(project_copy, SMALL, tmp_path / "small-site")
    large = _site(large_project, LARGE, tmp_path / "large-site")
    assert len(large) <= GROWTH * len(small)
    assert sum(large.values()) <= GROWTH * sum(small.values())
    faster = {name: round(large[name] / size, 2) for name, size in small.items()
              if name in large and large[name] > GROWTH * size}
    assert faster == {}
