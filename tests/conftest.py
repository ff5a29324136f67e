"""Shared builders: safetensors files written byte by byte, project copies, and one built site."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DTYPE_BYTES = {"BF16": 2, "F32": 4, "F16": 2, "F8_E4M3": 1, "I64": 8}


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None) -> bytes:
    """A valid safetensors file (zero-filled data) for {name: (dtype, shape)}."""
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = DTYPE_BYTES[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> Path:
    path.write_bytes(safetensors_bytes(tensors))
    return path


def run_build(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run build.py in a separate process, as a user would."""
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A copy of content/, templates/ and static/ that a test may break."""
    for name in ("content", "templates", "static"):
        shutil.copytree(ROOT / name, tmp_path / name)
    return tmp_path


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real site, built once by the real command."""
    out = tmp_path_factory.mktemp("site") / "site"
    result = run_build("--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="session")
def builds():
    """The computed models (spec, accounts, checks) of the real content, once."""
    from explorer.pipeline import Project, build_all

    return {mb.slug: mb for mb in build_all(Project(ROOT), progress=lambda _: None)}
