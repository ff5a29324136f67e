"""The README's model list matches the content (issue 32): the count of models and of family modules it states, and
every model named as its page names it."""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT

README = ROOT / "README.md"
NOT_FAMILIES = {"__init__.py", "base.py", "block_fp8.py", "declared_mtp.py", "renames.py", "rules.py", "sparse.py"}
"""Modules of explorer/model/families/ that hold shared pieces, not a family."""


def _names() -> list[str]:
    return sorted(tomllib.loads(p.read_text())["model"]["name"] for p in (ROOT / "content/models").glob("*/model.toml"))


def stated_counts(text: str) -> tuple[int, int]:
    m = re.search(r"Models \((\d+), from (\d+) family modules\)", text)
    assert m, "README has no 'Models (N, from M family modules)' line"
    return int(m[1]), int(m[2])


def unnamed(text: str, names: list[str]) -> list[str]:
    flat = " ".join(text.split())
    return [n for n in names if n not in flat]


def test_readme_counts_and_names_every_model():
    text = README.read_text()
    modules = [p for p in (ROOT / "explorer/model/families").glob("*.py") if p.name not in NOT_FAMILIES]
    assert stated_counts(text) == (len(_names()), len(modules))
    assert unnamed(text, _names()) == []


def test_the_readme_check_finds_a_missing_model():
    assert unnamed("Models (1, from 1 family modules): Kimi K2", ["Kimi K2", "Kimi K2.5 Turbo"]) == ["Kimi K2.5 Turbo"]
    assert stated_counts("Models (47, from 24 family modules):") == (47, 24)
