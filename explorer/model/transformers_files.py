"""Where the installed reference implementation lies: transformers' version and the path of a file inside it, for the
stages that read its source (the published-keys check, citations)."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from pathlib import Path


@functools.cache
def transformers_version() -> str:
    return importlib.metadata.version("transformers")  # scans the installed distributions: read it once


def transformers_file(rel: str) -> Path:
    """Path of a file inside the installed transformers package."""
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / rel
