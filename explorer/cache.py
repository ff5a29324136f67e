"""Cache of the torch stages (reference tensors, shape trace, equation checks), keyed by a hash of every
input: the model's config, the source of the modules that compute them, and the library versions. A
rebuild with nothing changed does not run torch; a changed config reruns only that model."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

from .checkpoint import CheckpointIndex, TensorInfo
from .execution import ComponentTrace, EquationCheck, Execution, ShapeTrace
from .reference import ReferenceModel
from .spec.types import ModelSpec

_PACKAGE = Path(__file__).resolve().parent
FORMAT = 2


def execution_key(spec: ModelSpec) -> str:
    """Hash of everything the torch stages read for this model."""
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT, spec.slug, spec.family, dataclasses.asdict(spec.config)],  # type: ignore[call-overload]
                        sort_keys=True, default=str).encode())
    for path in sorted(_PACKAGE.rglob("*.py")):  # any module can change a result: hash the whole package
        h.update(path.relative_to(_PACKAGE).as_posix().encode())
        h.update(path.read_bytes())
    for package in ("torch", "transformers"):
        h.update(importlib.metadata.version(package).encode())
    return h.hexdigest()[:32]


def load(cache_dir: Path | None, spec: ModelSpec) -> tuple[ReferenceModel, Execution] | None:
    if cache_dir is None:
        return None
    path = cache_dir / f"{spec.slug}-{execution_key(spec)}.json"
    if not path.exists():
        return None
    try:
        return _decode(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError):
        return None  # a damaged entry is recomputed


def save(cache_dir: Path | None, spec: ModelSpec, reference: ReferenceModel, execution: Execution) -> None:
    if cache_dir is None:
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    for old in cache_dir.glob(f"{spec.slug}-*.json"):
        old.unlink()
    path = cache_dir / f"{spec.slug}-{execution_key(spec)}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_encode(reference, execution), sort_keys=True), encoding="utf-8")
    tmp.replace(path)


def _encode(reference: ReferenceModel, execution: Execution) -> dict[str, Any]:
    return {
        "reference": {"label": reference.label,
                      "tensors": {n: list(t.shape) for n, t in reference.index.tensors.items()}},
        "trace": {"device": execution.trace.device, "free": execution.trace.free,
                  "components": {p: dataclasses.asdict(c) for p, c in execution.trace.components.items()}},
        "checks": {p: dataclasses.asdict(c) for p, c in execution.checks.items()},
    }


def _decode(data: dict[str, Any]) -> tuple[ReferenceModel, Execution]:
    ref = data["reference"]
    tensors = {n: TensorInfo(n, "F32", tuple(s)) for n, s in ref["tensors"].items()}
    reference = ReferenceModel(ref["label"], CheckpointIndex(tensors, source=ref["label"]))
    tr = data["trace"]
    components = {p: ComponentTrace(tuple(map(tuple, c["inputs"])), tuple(map(tuple, c["outputs"])),
                                    {k: tuple(v) for k, v in c["steps"].items()})
                  for p, c in tr["components"].items()}
    checks = {p: EquationCheck(**c) for p, c in data["checks"].items()}
    return reference, Execution(ShapeTrace(tr["device"], tr["free"], components), checks)
