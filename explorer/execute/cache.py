"""Cache of the torch stages (reference tensors, shape trace, equation checks), keyed by a hash of every
input: the model's config, every module of the package (so no list of "the files that matter" can go
stale), and the library versions. A rebuild with nothing changed does not run torch; a changed config
reruns only that model. Every entry is sealed (explorer/execute/cache_seal.py): one edited on disk is recomputed,
never published."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from explorer.checkpoint.index import MAX_TENSORS, CheckpointIndex, TensorGroup
from explorer.checkpoint.tensor_names import pattern_box, pattern_size, shared_name
from explorer.content.model_content import ModelContent
from explorer.digest import package_digest
from explorer.errors import ContentError
from explorer.execute.cache_seal import sealed, unsealed
from explorer.execute.reference import ReferenceModel
from explorer.model.families import FAMILIES, family_config
from explorer.spec.results import (
    FREE_SIZES,
    TOLERANCE,
    ComponentTrace,
    EquationCheck,
    Execution,
    RealWeightCheck,
    RoutingExample,
    ShapeTrace,
    label,
    within_tolerance,
)
from explorer.spec.types import ModelSpec, path_key, walk

FORMAT = 4
_STATUSES = {"checked", "part", "unchecked"}
_CHECK_TEXT = ("status", "reference", "config", "detail", "part_of")
_KEY = re.compile(r"-[0-9a-f]{32}\.json")
_REAL_KEY = re.compile(r"-real-[0-9a-f]{32}\.json")


def execution_key(spec: ModelSpec) -> str:
    """Hash of everything the torch stages read for this model."""
    return _key(spec.slug, spec.family, spec.config)


def _key(slug: str, family: str, config: Any) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT, slug, family, dataclasses.asdict(config)], sort_keys=True, default=str).encode())
    h.update(package_digest().encode())
    h.update(_library_versions().encode())
    return h.hexdigest()[:32]


@functools.cache
def _transformers_version() -> str:
    return importlib.metadata.version("transformers")


@functools.cache
def _library_versions() -> str:
    return " ".join(importlib.metadata.version(package) for package in ("torch", "transformers"))


def _entry(cache_dir: Path, slug: str, key: str) -> Path:
    return cache_dir / f"{slug}-{key}.json"


def has_entry(cache_dir: Path | None, content: ModelContent) -> bool:
    """Whether the cache holds this model's torch stages for its current inputs, found from its validated
    config alone (before its spec is built: the build decides from this whether to import torch at all)."""
    family = FAMILIES.get(content.meta.family)
    if cache_dir is None or family is None:
        return False
    try:
        config = family.validate(family_config(content), "")
    except ContentError:
        return False  # the model's build reports it
    return _entry(cache_dir, content.slug, _key(content.slug, family.name, config)).exists()


def load(cache_dir: Path | None, spec: ModelSpec) -> tuple[ReferenceModel, Execution] | None:
    if cache_dir is None:
        return None
    text = unsealed(_entry(cache_dir, spec.slug, execution_key(spec)), ENTRY_LIMIT)
    if text is None:
        return None  # absent, or not as the build wrote it: recomputed
    try:
        reference, execution = _decode(json.loads(text))
        _check_against(spec, execution)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError):
        return None  # a damaged, tampered or stale entry is recomputed, never published
    return reference, execution


def _check_against(spec: ModelSpec, execution: Execution) -> None:
    """Raise ValueError unless the entry covers exactly the spec's components, each traced output and step in the
    spec's shape: an edited entry must not publish shapes the executor would have refused, and a missing
    component must mean recomputing, not a crash on the page that shows it (issue 18)."""
    trace = execution.trace
    paths = {path_key(a, c): c for a, c in walk(spec.root)}
    if set(trace.components) != set(paths) or set(execution.checks) != set(paths) or trace.free != FREE_SIZES:
        raise ValueError("the cached components are not the spec's")
    for path, comp in paths.items():
        traced = trace.components[path]
        if len(traced.inputs) != len(comp.inputs) or len(traced.outputs) != len(comp.outputs):
            raise ValueError(f"{path}: cached ports are not the spec's")
        if any(label(shape, port.shape) for shape, port in zip(traced.outputs, comp.outputs)):
            raise ValueError(f"{path}: a cached output shape is not the spec's")
        steps = {s.name: s.shape for s in comp.steps + comp.equations if not s.heading and s.shape is not None}
        if set(traced.steps) != set(steps) or any(label(traced.steps[n], shape) for n, shape in steps.items()):
            raise ValueError(f"{path}: cached step shapes are not the spec's")
        _check_status(path, comp.reference, execution.checks)


def _check_status(path: str, reference: str, checks: dict[str, EquationCheck]) -> None:
    """A check shown as run must be one the executor can run: a component that names no reference module
    ("-") is never checked, a check names the installed transformers, and a part's owner is an enclosing
    component that was checked."""
    check = checks[path]
    transformers = f"transformers {_transformers_version()} "
    if check.status == "checked" and (reference == "-" or not check.reference.startswith(transformers)):
        raise ValueError(f"{path}: cached as checked, which the executor cannot have done")
    if check.status == "part":
        owner = check.part_of
        if owner is None or not (owner == "" or path.startswith(owner + ".")) or checks.get(owner, check).status != "checked":
            raise ValueError(f"{path}: cached as part of {owner!r}, which is not a checked enclosing component")


def save(cache_dir: Path | None, spec: ModelSpec, reference: ReferenceModel, execution: Execution) -> None:
    if cache_dir is None:
        return
    # not another model whose slug extends this one
    write_sealed(_entry(cache_dir, spec.slug, execution_key(spec)),
                 json.dumps(_encode(reference, execution), sort_keys=True),
                 f"{spec.slug}-*.json", lambda name: _KEY.fullmatch(name[len(spec.slug):]) is not None)


ENTRY_LIMIT = 64 * 2**20
"""Bytes past which a torch-stage entry is not read: Kimi K2's, the largest, is well under a megabyte."""
STRINGS_LIMIT = 64 * 2**20
"""Bytes past which a string cache file is not read: the build writes a few megabytes at most (the MathML of 50
models: 0.7 MB), so a larger one was not written by it, and reading it whole could exhaust memory."""


def strings_file(folder: Path, kind: str, fmt: int, library: str) -> Path:
    """The file of a string cache (kind "highlight", "mathml"), named by a hash of its format, the version of the
    library that makes its entries and every module of the package: a change to any of them starts a new file."""
    versions = f"{fmt} {importlib.metadata.version(library)} {package_digest()}"
    return folder / f"{kind}-{hashlib.sha256(versions.encode()).hexdigest()[:32]}.json"


def write_strings(path: Path, entries: dict[str, str]) -> None:
    """Replace a string cache file (strings_file) and the stale files of its kind."""
    kind = path.name.rsplit("-", 1)[0]
    stale = re.compile(rf"{re.escape(kind)}-[0-9a-f]{{32}}\.json")
    write_replacing(path, json.dumps(entries, sort_keys=True), f"{kind}-*.json",
                    lambda name: stale.fullmatch(name) is not None)


def read_strings(path: Path) -> dict[str, str]:
    """A cache file that maps strings to strings (highlighted excerpts, MathML): its well-typed entries, or none
    where it is absent, unreadable, damaged or past STRINGS_LIMIT (the caller computes them again)."""
    try:
        if path.stat().st_size > STRINGS_LIMIT:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def write_sealed(path: Path, text: str, stale: str, is_stale: Callable[[str], bool]) -> None:
    """write_replacing with the entry sealed (cache_seal.sealed), for what only torch recomputes; read back with
    cache_seal.unsealed. Where no seal key can be made nothing is written: the next build recomputes."""
    text_sealed = sealed(path.parent, path.name, text)
    if text_sealed is None:
        print(f"  warning: {path.parent}: cannot write the cache's seal key; the next build recomputes",
              file=sys.stderr)
        return
    write_replacing(path, text_sealed, stale, is_stale)


def write_replacing(path: Path, text: str, stale: str, is_stale: Callable[[str], bool]) -> None:
    """Replace the entries matching `stale` with this one, written through a temporary file of this process's
    own (concurrent builds write the same entries), or not at all: a read-only or full cache costs the next
    build the recomputation, not this build's result (issue 18).

    The entry is renamed over its old self and only then are the other stale entries deleted: deleting first
    left a moment without the entry, in which a concurrent build found none and recomputed (issue 18)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        for old in path.parent.glob(stale):
            if old.name != path.name and is_stale(old.name):
                old.unlink(missing_ok=True)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        print(f"  warning: {path.parent}: cannot write the cache ({e.strerror or e}); the next build recomputes",
              file=sys.stderr)


def _encode(reference: ReferenceModel, execution: Execution) -> dict[str, Any]:
    return {
        "reference": {"label": reference.label,
                      "groups": [[g.name, list(g.shape)] for g in reference.index.groups],
                      "buffers": sorted(reference.buffers)},
        "trace": {"device": execution.trace.device, "free": execution.trace.free,
                  "components": {p: dataclasses.asdict(c) for p, c in execution.trace.components.items()}},
        "checks": {p: dataclasses.asdict(c) for p, c in execution.checks.items()},
    }


def _decode(data: dict[str, Any]) -> tuple[ReferenceModel, Execution]:
    """Rebuild the cached results, checking every field's type and every check against the tolerance again:
    the cache is an input like any other, and a check is published only if it passes as read."""
    ref = data["reference"]
    entries = [(_text(name), _shape(shape)) for name, shape in ref["groups"]]
    if sum(pattern_size(name) for name, _ in entries) > MAX_TENSORS:  # counted before any box is built
        raise ValueError("cached reference tensors are too many")
    groups = tuple(TensorGroup(pattern_box(name, MAX_TENSORS), "F32", shape) for name, shape in entries)
    if shared_name(g.box for g in groups) is not None:
        raise ValueError("cached reference tensors overlap")
    buffers = frozenset(_text(name) for name in ref["buffers"])
    if not buffers <= {g.name for g in groups}:
        raise ValueError("cached reference buffers name no cached group")
    reference = ReferenceModel(_text(ref["label"]), CheckpointIndex(groups, source=ref["label"]), buffers)
    tr = data["trace"]
    components = {_text(p): ComponentTrace(tuple(map(_shape, c["inputs"])), tuple(map(_shape, c["outputs"])),
                                           {_text(k): _shape(v) for k, v in c["steps"].items()})
                  for p, c in tr["components"].items()}
    free = {_text(k): _count(v) for k, v in tr["free"].items()}
    checks = {_text(p): _check(c) for p, c in data["checks"].items()}
    return reference, Execution(ShapeTrace(_text(tr["device"]), free, components), checks)


def _check(fields: dict[str, Any]) -> EquationCheck:
    check = EquationCheck(**{**fields, "example": _example(fields.get("example"))})
    if check.status not in _STATUSES or not all(isinstance(getattr(check, f), str) for f in _CHECK_TEXT):
        raise ValueError(f"not an equation check: {fields!r}")
    error, tolerance = check.max_abs_error, check.tolerance
    if not (isinstance(error, float | int) and tolerance == TOLERANCE):
        raise ValueError(f"check measured against {tolerance!r}, not the current tolerance {TOLERANCE}")
    if check.status == "checked" and not within_tolerance(error):
        raise ValueError(f"cached check with max |Δ| {error} does not pass the tolerance {TOLERANCE}")
    return check


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TypeError(f"shape must be a list, got {value!r}")
    return tuple(_count(v) for v in value)


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"expected a non-negative integer, got {value!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _example(value: Any) -> RoutingExample | None:
    """A router's worked example as cached: the token, rows of (label, one number per expert), the selection."""
    if value is None:
        return None
    rows = tuple((_text(label), tuple(_number(v) for v in values)) for label, values in value["rows"])
    return RoutingExample(_text(value["token"]), rows, tuple(_count(i) for i in value["selected"]))


def _number(value: Any) -> float:
    if not isinstance(value, float | int) or isinstance(value, bool):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------------ real-weight checks

def _real_path(cache_dir: Path, spec: ModelSpec, weights: Path) -> Path:
    """Keyed by the model's torch-stage key and the sha256 of the weights file's bytes: a file of the same name
    and size with other weights (NaNs) must not keep the old file's pass (issue 18)."""
    key = hashlib.sha256(f"{execution_key(spec)}:{_file_sha256(weights)}".encode()).hexdigest()[:32]
    return cache_dir / f"{spec.slug}-real-{key}.json"


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def load_real(cache_dir: Path | None, spec: ModelSpec, weights: Path) -> tuple[RealWeightCheck, ...] | None:
    if cache_dir is None:
        return None
    text = unsealed(_real_path(cache_dir, spec, weights), ENTRY_LIMIT)
    if text is None:
        return None
    try:
        return tuple(_real_check(c) for c in json.loads(text))
    except (ValueError, TypeError, KeyError, RecursionError):
        return None  # a damaged or failing entry is recomputed


def _real_check(fields: dict[str, Any]) -> RealWeightCheck:
    """As _check: typed fields, the current tolerance, and a passing error, or the entry is not used."""
    from explorer.execute.real_weights import REAL_TOLERANCE

    check = RealWeightCheck(**fields)
    if not all(isinstance(getattr(check, f), str) for f in ("path", "source", "reference", "detail")):
        raise TypeError(f"not a real-weight check: {fields!r}")
    _count(check.layer)
    error = check.max_abs_error
    if check.tolerance != REAL_TOLERANCE or not isinstance(error, float | int) or not error <= REAL_TOLERANCE:
        raise ValueError(f"cached real-weight check with max |Δ| {error!r} does not pass {REAL_TOLERANCE}")
    return check


def save_real(cache_dir: Path | None, spec: ModelSpec, weights: Path, checks: tuple[RealWeightCheck, ...]) -> None:
    if cache_dir is None:
        return
    write_sealed(_real_path(cache_dir, spec, weights),
                 json.dumps([dataclasses.asdict(c) for c in checks], sort_keys=True),
                 f"{spec.slug}-real-*.json", lambda name: _REAL_KEY.fullmatch(name[len(spec.slug):]) is not None)
