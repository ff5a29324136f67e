"""Reconcile a model's spec with stored tensors: every stored tensor owned exactly once, nothing missing.

Each tensor spec's storage scheme (explorer/spec/storage.py) says what a checkpoint stores for it: the weight, its
block scales, its packed values; a tied tensor is stored once, under the name it is tied to.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations

from explorer.checkpoint.index import CheckpointIndex, TensorGroup, TensorInfo
from explorer.checkpoint.tensor_names import PAIRWISE_LIMIT, NameBox, Skeleton, name_box, shared_name, template_boxes
from explorer.model.account import evaluate
from explorer.spec.storage import Dense, Role
from explorer.spec.types import ModelSpec, TensorSpec, path_key, walk


@dataclass(frozen=True, slots=True)
class ExpectedGroup:
    """Tensors the spec says are stored, as a box of names sharing owner, role, shape and dtype."""

    box: NameBox
    owner: str
    """Component path."""
    role: Role
    shape: tuple[int, ...] | None
    dtype: str
    optional: bool = False
    parameters: int = 0
    """Logical parameters each stored tensor carries (MXFP4 blocks: two per byte; scales and buffers: none)."""
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
    owned: dict[str, tuple[TensorGroup, ...]]
    """Stored tensors by owning component path, in groups."""

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


def expected_groups(spec: ModelSpec, logical: bool = False) -> list[ExpectedGroup]:
    """Every tensor the spec expects, in groups; logical=True: each weight as one tensor of its logical shape,
    as a reference implementation holds it (no packed values or scales)."""
    return [group for ancestors, comp in walk(spec.root) for t in comp.tensors
            for group in _expand(t, path_key(ancestors, comp), spec.values, logical)]


def _expand(t: TensorSpec, owner: str, values: dict[str, int | float], logical: bool = False) -> list[ExpectedGroup]:
    """The stored tensors of one tensor family, by its storage scheme; a tied alias is optional (stored once)."""
    role: Role = "buffer" if t.role == "buffer" else "parameter"
    if logical and not t.reference_holds:  # stored by the checkpoint, absent from the reference implementation
        return []
    ranges = {r.var: r.values for r in t.ranges}
    if t.shape is None:
        return [ExpectedGroup(box, owner, role, None, t.dtype, t.optional) for box in template_boxes(t.template, ranges)]
    shape = tuple(evaluate(s, values) for s in t.shape)
    storage = Dense(t.dtype) if logical else t.storage
    # the scheme names what it stores after the weight's name (weight_scale_inv, _blocks), so it expands the
    # template once for all of the family's names
    return [ExpectedGroup(box, owner, stored.role, stored.shape, stored.dtype, t.optional or bool(t.tied_to),
                          stored.parameters, stored.also, bool(t.tied_to))
            for stored in storage.expand(t.template, shape, role) for box in template_boxes(stored.name, ranges)]


def reconcile(spec: ModelSpec, index: CheckpointIndex, reference: bool = False,
              skip_owners: tuple[str, ...] = (), expected: list[ExpectedGroup] | None = None) -> Reconciliation:
    """Match the spec's expected tensors against a checkpoint index, group against group.

    reference=True matches against a reference implementation instead: parameters and the persistent buffers
    whose shape the config fixes are compared (it stores no quantization scales or unloaded buffers), shapes but
    not dtypes, and components under
    skip_owners (which it does not build) are left out. `expected`: the spec's expected_groups where the caller
    has them already (computed with the same `reference`).
    """
    if expected is None:
        expected = expected_groups(spec, logical=reference)
    if reference:
        expected = [e for e in expected if (e.role == "parameter" or _persistent_buffer(e))
                    and not any(e.owner == s or e.owner.startswith(s + ".") for s in skip_owners)]
    by_skeleton: dict[Skeleton, tuple[list[ExpectedGroup], list[TensorGroup]]] = defaultdict(lambda: ([], []))
    for e in expected:
        by_skeleton[e.box.skeleton][0].append(e)
    for g in index.groups:
        by_skeleton[g.box.skeleton][1].append(g)
    tally = _Tally(reference)
    for wanted, stored in by_skeleton.values():
        if not _match_boxes(wanted, stored, tally):
            _match_names(wanted, stored, tally)
    return tally.result(index.source)


def _persistent_buffer(e: ExpectedGroup) -> bool:
    """A stored buffer of known shape that every checkpoint holds (DeepSeek-V4's routing tables)."""
    return e.role == "buffer" and e.shape is not None and not e.optional


def _match_boxes(wanted: list[ExpectedGroup], stored: list[TensorGroup], tally: _Tally) -> bool:
    """Match the groups of one skeleton whole: each stored group inside one expected group, each expected group
    covered by its stored groups entirely or not at all. False, with nothing tallied, where names must decide
    (overlapping expected groups, a stored group across two, a group partly stored)."""
    if len(wanted) > PAIRWISE_LIMIT or len(stored) > PAIRWISE_LIMIT:
        return False
    boxes = ([e.box for e in wanted], [g.box for g in stored])
    if any(a.meets(b) for side in boxes for a, b in combinations(side, 2)):
        return False
    pairs, unowned, covered = [], [], [0] * len(wanted)
    for g in stored:
        hits = [i for i, e in enumerate(wanted) if e.box.meets(g.box)]
        if not hits:
            unowned.append(g.box)
            continue
        # A stored group may span expected groups (the reference groups Qwen3.5's experts of both layer kinds
        # as one): the expected boxes are disjoint, so it is owned piece by piece where the pieces cover it.
        pieces = [wanted[i].box.overlap(g.box) for i in hits]
        if sum(piece.size for piece in pieces) != g.box.size:
            return False
        for i, piece in zip(hits, pieces):
            pairs.append((wanted[i], g, piece))
            covered[i] += piece.size
    if any(0 < n < e.box.size for n, e in zip(covered, wanted)):
        return False
    for e, g, piece in pairs:
        tally.pair(e, g, piece)
    for box in unowned:
        tally.unowned += box.names()
    for n, e in zip(covered, wanted):
        if n == 0 and not e.optional:
            tally.missing += e.box.names()
    return True


def _match_names(wanted: list[ExpectedGroup], stored: list[TensorGroup], tally: _Tally) -> None:
    """Match one skeleton's groups name by name (the groups' sizes were bounded when they were read)."""
    by_name: dict[str, ExpectedGroup] = {}
    for e in wanted:
        for name in e.box.names():
            if name in by_name:
                tally.owned_twice.append(name)
            by_name[name] = e
    stored_names = {name: g for g in stored for name in g.box.names()}
    for name, g in stored_names.items():
        owner = by_name.get(name)
        if owner is None:
            tally.unowned.append(name)
        else:
            tally.pair(owner, g, name_box(name))
    tally.missing += [name for name, e in by_name.items() if name not in stored_names and not e.optional]


class _Tally:
    """What reconcile finds, skeleton by skeleton, summed and listed."""

    def __init__(self, reference: bool) -> None:
        self.reference = reference
        self.unowned: list[str] = []
        self.owned_twice: list[str] = []
        self.missing: list[str] = []
        self.shape_bad: list[Mismatch] = []
        self.dtype_bad: list[Mismatch] = []
        self.owned: dict[str, list[TensorGroup]] = defaultdict(list)
        self.totals: dict[tuple[Role, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])

    def pair(self, e: ExpectedGroup, g: TensorGroup, box: NameBox) -> None:
        """The stored tensors `box` of group g, owned by e."""
        n = box.size
        self.owned[e.owner].append(TensorGroup(box, g.dtype, g.shape, g.shard))
        if not (e.tied and self.reference):  # the reference's state dict lists a tied head beside the tensor it shares
            acc = self.totals[(e.role, g.dtype)]
            acc[0], acc[1], acc[2] = acc[0] + n, acc[1] + n * g.elements, acc[2] + n * g.nbytes
            acc[3] += n * (e.parameters if g.shape == e.shape else g.elements * (e.role == "parameter"))
        if e.shape is not None and g.shape != e.shape:
            self.shape_bad += [Mismatch(name, e.owner, _show(e.shape), _show(g.shape)) for name in box.names()]
        if e.dtype and not self.reference and g.dtype not in (e.dtype, *e.also):
            self.dtype_bad += [Mismatch(name, e.owner, " or ".join((e.dtype, *e.also)), g.dtype) for name in box.names()]

    def result(self, source: str) -> Reconciliation:
        role_order = {"parameter": 0, "quant_scale": 1, "buffer": 2}
        totals = sorted(self.totals.items(), key=lambda kv: (role_order[kv[0][0]], kv[0][1]))
        return Reconciliation(
            source=source, unowned=tuple(sorted(self.unowned)), owned_twice=tuple(sorted(set(self.owned_twice))),
            missing=tuple(sorted(self.missing)),
            shape_mismatch=tuple(sorted(self.shape_bad, key=lambda m: m.name)),
            dtype_mismatch=tuple(sorted(self.dtype_bad, key=lambda m: m.name)),
            totals=tuple(RoleTotal(r, d, *v) for (r, d), v in totals),
            owned={k: tuple(sorted(v, key=lambda g: g.box.first_name)) for k, v in sorted(self.owned.items())})


@dataclass(frozen=True, slots=True)
class HeldAsBuffer:
    """Reference buffers the ledger counts as parameters (a router's e_score_correction_bias, which a listing of
    the checkpoint's tensors lists beside the weights and transformers registers as a buffer)."""

    name: str
    """The group's name, a box of checkpoint names ("model.layers.1-60.mlp.gate.e_score_correction_bias")."""
    tensors: int
    elements: int


@dataclass(frozen=True, slots=True)
class ReferenceCount:
    """The reference implementation's own count, as it classifies its tensors: parameters and persistent
    buffers, and which of its buffers the ledger counts as parameters (the only way the two totals differ
    for a balanced model)."""

    parameter_tensors: int
    parameters: int
    buffer_tensors: int
    buffers: int
    held_as_buffers: tuple[HeldAsBuffer, ...]

    @property
    def ledger_parameters(self) -> int:
        """The parameters the ledger counts for the same tensors: the reference's, and its buffers counted so."""
        return self.parameters + sum(h.elements for h in self.held_as_buffers)


def reference_count(spec: ModelSpec, index: CheckpointIndex, buffer_groups: frozenset[str]) -> ReferenceCount:
    """The reference's parameters and buffers as it counts them (tied aliases once; `buffer_groups`: the names of
    the groups it holds as buffers), beside the ledger's roles for the same tensors."""
    expected = [e for e in expected_groups(spec, logical=True) if e.role == "parameter"]
    params = [g for g in index.groups if g.name not in buffer_groups]
    buffers = [g for g in index.groups if g.name in buffer_groups]
    held = tuple(HeldAsBuffer(g.name, g.box.size, g.box.size * g.elements) for g in buffers
                 if any(e.box.skeleton == g.box.skeleton and e.box.meets(g.box) for e in expected))
    return ReferenceCount(sum(g.box.size for g in params), sum(g.box.size * g.elements for g in params),
                          sum(g.box.size for g in buffers), sum(g.box.size * g.elements for g in buffers), held)


def _show(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def predicted_index(spec: ModelSpec, expected: list[ExpectedGroup] | None = None) -> CheckpointIndex:
    """The tensors the spec's storage schemes predict a checkpoint stores (names, shapes, dtypes), for a model
    with no recorded listing; tied aliases are stored once, under the name they are tied to. `expected`: the
    spec's expected_groups where the caller has them already."""
    groups = [TensorGroup(e.box, e.dtype, e.shape) for e in (expected or expected_groups(spec))
              if e.shape is not None and not e.optional]
    source = "predicted from the config by each weight's storage scheme"
    if shared_name(g.box for g in groups) is not None:  # a name two components claim is stored once
        return CheckpointIndex.of({n: TensorInfo(n, g.dtype, g.shape) for g in groups for n in g.box.names()}, source)
    return CheckpointIndex(tuple(sorted(groups, key=lambda g: g.box.first_name)), source)
