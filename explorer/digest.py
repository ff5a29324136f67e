"""Digests of a build's inputs, and the marker that lets an unchanged build stop before importing torch.

Inputs: every file of content/, templates/ and static/, every module of this package, the versions of the
libraries whose behaviour reaches the pages, and the pinned checkpoint files the citations may excerpt from
the Hugging Face cache. The marker, written last into the output folder, holds the input digest and a
digest of the files written beside it, so an edited or half-deleted site is rebuilt too. Standard library
only (plus huggingface_hub's constants, for where its cache lives), so the check runs in milliseconds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from explorer.project import Project

PACKAGE = Path(__file__).resolve().parent
MARKER = ".explorer-build.json"
"""Written into the output folder after everything else; its absence means the folder must be rebuilt."""
LIBRARIES = ("jinja2", "markdown", "pygments", "sympy", "latex2mathml", "safetensors", "huggingface_hub",
             "torch", "transformers", "gguf")
"""The pinned dependencies whose output reaches the site (pyproject.toml's dependencies)."""
FORMAT = 1


def _hash_files(h: hashlib._Hash, root: Path, files: Iterable[Path]) -> None:
    """Feed each file's path (relative to root) and bytes, in sorted order, so a rename also counts."""
    for path in sorted(files):
        data = path.read_bytes()
        h.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)


def _tree(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts] if root.is_dir() else []


def package_digest(package: Path | None = None) -> str:
    """Hash of every .py module of the package: any code change may change what the build computes."""
    package = package or PACKAGE
    modules = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    # Every model's cache key needs it, twice: read and hash the modules again only when one of them changed
    # (a stat costs a third of a read and hash; a test edits a copy of the package and must see a new digest).
    signature = tuple((p, s.st_size, s.st_mtime_ns) for p in modules for s in (p.stat(),))
    if _package_digests.get(package, (None, ""))[0] != signature:
        h = hashlib.sha256()
        _hash_files(h, package, modules)
        _package_digests[package] = signature, h.hexdigest()
    return _package_digests[package][1]


_package_digests: dict[Path, tuple[tuple[tuple[Path, int, int], ...], str]] = {}


def library_versions(libraries: Iterable[str] = LIBRARIES) -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in libraries} | {"python": sys.version}


def _hub_cache() -> Path:
    from huggingface_hub import constants  # a constants module: no network code is imported

    return Path(constants.HF_HUB_CACHE)


def pinned_hub_files(content_dir: Path) -> list[Path]:
    """Where each model's pinned modeling file and config.json would lie in the Hugging Face cache.

    A model.toml that does not parse contributes nothing here: its own bytes are already in the digest,
    and the build reports the problem."""
    out = []
    for toml in sorted((content_dir / "models").glob("*/model.toml")):
        try:
            ref = tomllib.loads(toml.read_text(encoding="utf-8"))["checkpoint"]
            snapshot = (_hub_cache() / f"models--{ref['repo_id'].replace('/', '--')}" / "snapshots"
                        / ref["revision"])
            out += [snapshot / name for name in (ref.get("modeling_file", ""), "config.json") if name]
        except (tomllib.TOMLDecodeError, KeyError, TypeError, AttributeError):
            continue
    return out


def input_digest(project: Project, package: Path | None = None, libraries: Iterable[str] = LIBRARIES) -> str:
    """Hash of everything a build of `project` reads."""
    h = hashlib.sha256(f"explorer build inputs {FORMAT}\0".encode())
    for name, root in (("content", project.content), ("templates", project.templates), ("static", project.static)):
        h.update(f"\0{name}\0".encode())
        _hash_files(h, root, _tree(root))
    h.update(package_digest(package).encode())
    h.update(json.dumps(library_versions(libraries), sort_keys=True).encode())
    for path in pinned_hub_files(project.content):
        h.update(f"\0{path}\0".encode() + (hashlib.sha256(path.read_bytes()).digest() if path.is_file() else b"-"))
    return h.hexdigest()


def output_digest(out_dir: Path) -> str:
    """Hash of every file in the output folder except the marker."""
    h = hashlib.sha256()
    _hash_files(h, out_dir, (p for p in _tree(out_dir) if p.relative_to(out_dir).as_posix() != MARKER))
    return h.hexdigest()


def write_marker(out_dir: Path, inputs: str) -> None:
    """Record, last, which inputs produced the folder's files and what those files were."""
    marker = {"inputs": inputs, "outputs": output_digest(out_dir)}
    (out_dir / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def up_to_date(out_dir: Path, inputs: str) -> bool:
    """True when the folder's marker names these inputs and its files are the ones that build wrote."""
    try:
        marker = json.loads((out_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("inputs") == inputs and marker.get("outputs") == output_digest(out_dir)
