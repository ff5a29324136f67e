"""The code stays lint-clean and its annotations consistent (ruff and mypy as configured in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

MYPY_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "explorer" / "mypy"
"""Outside the checkout, so a fresh clone (CI) reuses the analysis of torch and transformers (30 s cold)."""


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "explorer", "tests", "benchmarks", "build.py"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.slow  # mypy over the package and what it imports: half a minute on a busy machine
def test_mypy_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(MYPY_CACHE)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout
