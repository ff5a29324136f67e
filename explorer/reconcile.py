"""Reconcile a model's spec with stored tensors: every stored tensor owned exactly once, nothing missing.

Each tensor spec's storage scheme (explorer/spec/storage.py) says what a checkpoint stores for it: the weight, its
block scales, its packed values; a tied tensor is stored once, under the name it is tied to.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .account import evaluate
from .checkpoint import CheckpointIndex, TensorInfo
from .spec.storage import Dense, Role
from .spec.types import ModelSpec, TensorSpec, path_key, walk


@dataclass(frozen=True, slots=True)
class ExpectedTensor:
    """A tensor the spec says is stored, with its owner and role."""

    name: str
    owner: str
    """Component path."""
    role: Role
    shape: tuple[int, ...] | None
    dtype: str
    optional: bool = False
    parameters: int = 0
    """Logical parameters the stored tensor carries (MXFP4 blocks: two per byte; scales and buffers: none)."""
    also: tuple[str, ...] = ()
    """Other dtypes the storage scheme accepts (a mixed GGUF file type)."""
    tied: bool = False
    """An alias of another tensor (a tied head): where a listing carries it too, it is not counted again."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    name: str
    owner: str
    expected: str
    stored: str


@dataclass(frozen=True, slots=True)
class RoleTotal:
    """Stored tensors of one role and dtype."""

    role: Role
    dtype: str
    tensors: int
    elements: int
    bytes: int
    parameters: int = 0
    """Logical parameters these tensors carry, which differs from the elements where values are packed."""


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The result of matching expected against stored tensors, all problems at once, sorted."""

    source: str
    unowned: tuple[str, ...]
    owned_twice: tuple[str, ...]
    missing: tuple[str, ...]
    shape_mismatch: tuple[Mismatch, ...]
    dtype_mismatch: tuple[Mismatch, ...]
    totals: tuple[RoleTotal, ...]
    owned: dict[str, tuple[TensorInfo, ...]]
    """Stored tensors by owning component path."""

    @property
    def balanced(self) -> bool:
        return not (self.unowned or self.owned_twice or self.missing or self.shape_mismatch or self.dtype_mismatch)

    def role_total(self, role: Role) -> tuple[int, int, int]:
        """(tensors, elements, bytes) of one role over all dtypes."""
        rows = [t for t in self.totals if t.role == role]
        return sum(r.tensors for r in rows), sum(r.elements for r in rows), sum(r.bytes for r in rows)

    def differences(self, limit: int | None = None) -> list[str]:
        """One line per problem, for the terminal; with limit, at most that many per kind and a count."""
        kinds = [
            ("unowned", [n for n in self.unowned]),
            ("owned twice", [n for n in self.owned_twice]),
            ("missing", [n for n in self.missing]),
            ("shape mismatch", [f"{m.name} ({m.owner}): expected {m.expected}, stored {m.stored}"
                                for m in self.shape_mismatch]),
            ("dtype mismatch", [f"{m.name} ({m.owner}): expected {m.expected}, stored {m.stored}"
                                for m in self.dtype_mismatch]),
        ]
        out = []
        for kind, items in kinds:
            shown = items if limit is None else items[:limit]
            out += [f"{kind}: {item}" for item in shown]
            if len(items) > len(shown):
                out.append(f"{kind}: … and {len(items) - len(shown):,} more ({len(items):,} in all)")
        return out


def expected_tensors(spec: ModelSpec, logical: bool = False) -> tuple[list[ExpectedTensor], list[str]]:
    """Every tensor the spec expects, and names claimed by two components; logical=True: each weight as one
    tensor of its logical shape, as a reference implementation holds it (no packed values or scales)."""
    out: list[ExpectedTensor] = []
    for ancestors, comp in walk(spec.root):
        owner = path_key(ancestors, comp)
        for t in comp.tensors:
            out += _expand(t, owner, spec.values, logical)
    counts: dict[str, int] = defaultdict(int)
    for e in out:
        counts[e.name] += 1
    return out, sorted(n for n, c in counts.items() if c > 1)


def _expand(t: TensorSpec, owner: str, values: dict[str, int | float], logical: bool = False) -> list[ExpectedTensor]:
    """The stored tensors of one tensor family, by its storage scheme; a tied alias is optional (stored once)."""
    role: Role = "buffer" if t.role == "buffer" else "parameter"
    if t.shape is None:
        return [ExpectedTensor(name, owner, role, None, t.dtype, t.optional) for name in t.names()]
    shape = tuple(evaluate(s, values) for s in t.shape)
    out = []
    storage = Dense(t.dtype) if logical else t.storage
    for name in t.names():
        for stored in storage.expand(name, shape, role):
            out.append(ExpectedTensor(stored.name, owner, stored.role, stored.shape, stored.dtype,
                                      t.optional or bool(t.tied_to), stored.parameters,
                                      stored.also, bool(t.tied_to)))
    return out


def reconcile(spec: ModelSpec, index: CheckpointIndex, reference: bool = False,
              skip_owners: tuple[str, ...] = ()) -> Reconciliation:
    """Match the spec's expected tensors against a checkpoint index.

    reference=True matches against a reference implementation instead: only parameters are compared (it
    stores no quantization scales or unloaded buffers), shapes but not dtypes, and components under
    skip_owners (which it does not build) are left out.
    """
    expected, owned_twice = expected_tensors(spec, logical=reference)
    if reference:
        skipped = {e.owner for e in expected if any(e.owner == s or e.owner.startswith(s + ".") for s in skip_owners)}
        expected = [e for e in expected if e.role == "parameter" and e.owner not in skipped]
    by_name = {e.name: e for e in expected}
    stored = index.tensors
    missing = sorted(e.name for e in expected if e.name not in stored and not e.optional)
    unowned = sorted(n for n in stored if n not in by_name)
    shape_bad, dtype_bad = [], []
    owned: dict[str, list[TensorInfo]] = defaultdict(list)
    totals: dict[tuple[Role, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for name, info in stored.items():
        e = by_name.get(name)
        if e is None:
            continue
        owned[e.owner].append(info)
        if not (e.tied and reference):  # the reference's state dict lists a tied head beside the tensor it shares
            acc = totals[(e.role, info.dtype)]
            acc[0], acc[1], acc[2] = acc[0] + 1, acc[1] + info.elements, acc[2] + info.nbytes
            acc[3] += e.parameters if tuple(info.shape) == e.shape else info.elements * (e.role == "parameter")
        if e.shape is not None and tuple(info.shape) != e.shape:
            shape_bad.append(Mismatch(name, e.owner, _show(e.shape), _show(info.shape)))
        if e.dtype and not reference and info.dtype not in (e.dtype, *e.also):
            dtype_bad.append(Mismatch(name, e.owner, " or ".join((e.dtype, *e.also)), info.dtype))
    role_order = {"parameter": 0, "quant_scale": 1, "buffer": 2}
    return Reconciliation(
        source=index.source, unowned=tuple(unowned), owned_twice=tuple(owned_twice), missing=tuple(missing),
        shape_mismatch=tuple(sorted(shape_bad, key=lambda m: m.name)),
        dtype_mismatch=tuple(sorted(dtype_bad, key=lambda m: m.name)),
        totals=tuple(RoleTotal(r, d, *v) for (r, d), v in sorted(totals.items(), key=lambda kv: (role_order[kv[0][0]], kv[0][1]))),
        owned={k: tuple(v) for k, v in sorted(owned.items())},
    )


def _show(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def predicted_index(spec: ModelSpec) -> CheckpointIndex:
    """The tensors the spec's storage schemes predict a checkpoint stores (names, shapes, dtypes), for a model
    with no recorded listing; tied aliases are stored once, under the name they are tied to."""
    expected, _ = expected_tensors(spec)
    tensors = {e.name: TensorInfo(e.name, e.dtype, e.shape) for e in expected
               if e.shape is not None and not e.optional}
    return CheckpointIndex(dict(sorted(tensors.items())), source="predicted from the config by each weight's "
                                                                   "storage scheme")
