"""Sets of tensor names held as boxes, so 139,644 names are compared as a few hundred groups.

A name splits at its dots into segments. A segment that is a decimal index with no leading zero is a slot, any
other segment a literal. The split is one-to-one: two names are equal exactly when their skeletons (the literals,
with None at each slot) and their slot values are. A box is a skeleton and a set of values for each slot, and
stands for every combination: "layers.1-60.experts.0-383.w" is one box of 23,040 names. Two boxes share a name
only if they share a skeleton and every slot's values intersect, so sets of names can be matched box against box,
and names are listed only to report one that differs.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from explorer.spec.types import compress_indices

INDEX = r"(?:0|[1-9][0-9]{0,17})"
"""A name segment that is an index: decimal, no leading zero (so "01" stays a literal), at most 18 digits."""
_IS_INDEX = re.compile(INDEX)
_RANGES = re.compile(rf"{INDEX}(?:-{INDEX})?(?:,{INDEX}(?:-{INDEX})?)*")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
LITERAL = "\\"
"""Prefix of a grouped-name segment to be taken literally: a tensor named "a.0-1.w" is written "a.\\0-1.w"."""
PAIRWISE_LIMIT = 64
"""Boxes of one skeleton past which overlaps are found by listing names (linear) rather than pair by pair
(quadratic): a hostile listing of a million one-name groups costs a million names, not 10^12 pairs."""

Skeleton = tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class NameBox:
    """Every name with this skeleton whose slots take values from `slots` (one set per None in the skeleton)."""

    skeleton: Skeleton
    slots: tuple[frozenset[int], ...]

    @property
    def size(self) -> int:
        return math.prod(len(values) for values in self.slots)

    def names(self) -> list[str]:
        """Every name, in index order."""
        parts = [[s] if s is not None else [] for s in self.skeleton]
        values = iter(self.slots)
        choices = [p if p else [str(v) for v in sorted(next(values))] for p in parts]
        return [".".join(combo) for combo in itertools.product(*choices)]

    @property
    def first_name(self) -> str:
        values = iter(self.slots)
        return ".".join(s if s is not None else str(min(next(values))) for s in self.skeleton)

    @property
    def pattern(self) -> str:
        """The grouped name, as a manifest writes it: slots as runs ("0-2,5"), a literal that would read as runs
        escaped."""
        values = iter(self.slots)
        return ".".join(compress_indices(tuple(sorted(next(values)))) if s is None else _escape(s)
                        for s in self.skeleton)

    def meets(self, other: NameBox) -> bool:
        """Whether the two boxes share a name."""
        return self.skeleton == other.skeleton and all(not a.isdisjoint(b) for a, b in zip(self.slots, other.slots))

    def within(self, other: NameBox) -> bool:
        """Whether every name of this box is one of `other`'s."""
        return self.skeleton == other.skeleton and all(a <= b for a, b in zip(self.slots, other.slots))

    def overlap(self, other: NameBox) -> NameBox:
        return NameBox(self.skeleton, tuple(a & b for a, b in zip(self.slots, other.slots)))

    def __contains__(self, name: str) -> bool:
        box = name_box(name)
        return box.within(self)


def _escape(segment: str) -> str:
    return LITERAL + segment if _RANGES.fullmatch(segment) or segment.startswith(LITERAL) else segment


def split_name(name: str) -> tuple[Skeleton, tuple[int, ...]]:
    """A name's skeleton and the value of each slot: "layers.3.w" -> (("layers", None, "w"), (3,)).
    (Written out rather than matched against INDEX: a build splits every name of a reference model.)"""
    skeleton: list[str | None] = []
    values: list[int] = []
    for p in name.split("."):
        if p.isdigit() and p.isascii() and len(p) <= 18 and (p[0] != "0" or len(p) == 1):
            skeleton.append(None)
            values.append(int(p))
        else:
            skeleton.append(p)
    return tuple(skeleton), tuple(values)


def name_box(name: str) -> NameBox:
    """The box holding exactly one name."""
    skeleton, values = split_name(name)
    return NameBox(skeleton, tuple(frozenset((v,)) for v in values))


def pattern_runs(pattern: str) -> list[str | list[tuple[int, int]]]:
    """A grouped name's segments: literal text, or the index runs [(lo, hi), ...] a segment like "0,3-5" stands
    for; ValueError for a run that goes backwards or an index listed twice."""
    out: list[str | list[tuple[int, int]]] = []
    for segment in pattern.split("."):
        if segment.startswith(LITERAL):
            out.append(segment[len(LITERAL):])
        elif not _RANGES.fullmatch(segment):
            out.append(segment)
        else:
            pairs = []
            for run in segment.split(","):
                lo, _, hi = run.partition("-")
                if int(hi or lo) < int(lo):
                    raise ValueError(f"range {run} runs backwards")
                pairs.append((int(lo), int(hi or lo)))
            ordered = sorted(pairs)
            for (_, end), (start, _) in zip(ordered, ordered[1:]):
                if start <= end:
                    raise ValueError(f"segment {segment} lists index {start} twice")
            out.append(pairs)
    return out


def pattern_size(pattern: str) -> int:
    """How many names a grouped name stands for, counted from its runs (no name or value is listed)."""
    if _is_one_name(pattern):
        return 1
    return math.prod(sum(hi - lo + 1 for lo, hi in part) for part in pattern_runs(pattern) if isinstance(part, list))


def pattern_box(pattern: str, limit: int) -> NameBox:
    """The box of a grouped name; ValueError past `limit` names, raised before any set of values is built."""
    if _is_one_name(pattern) and LITERAL not in pattern and limit >= 1:  # a million plain names: no runs to parse
        return name_box(pattern)
    size = pattern_size(pattern)
    if size > limit:
        raise ValueError(f"'{pattern}' stands for {size:,} tensors, over the limit of {limit:,}")
    skeleton: list[str | None] = []
    slots: list[frozenset[int]] = []
    for part in pattern_runs(pattern):
        if isinstance(part, list):
            skeleton.append(None)
            slots.append(frozenset(v for lo, hi in part for v in range(lo, hi + 1)))
        elif _IS_INDEX.fullmatch(part):  # an escaped "\5" names the same tensor as "5"
            skeleton.append(None)
            slots.append(frozenset((int(part),)))
        else:
            skeleton.append(part)
    return NameBox(tuple(skeleton), tuple(slots))


def _is_one_name(pattern: str) -> bool:
    """Whether a grouped name has no runs: without "-" and "," every segment stands for one value."""
    return "-" not in pattern and "," not in pattern


def template_boxes(template: str, ranges: Mapping[str, Sequence[int]]) -> list[NameBox]:
    """The names `template.format(**values)` takes over every combination of `ranges`: one box when each
    placeholder is a whole segment used once, else one box per name (listed, as formatting gives them)."""
    parts = template.split(".")
    used = [m.group(1) for p in parts if (m := _PLACEHOLDER.fullmatch(p))]
    whole = (len(used) == len(set(used)) == len(ranges) and set(used) == set(ranges)
             and all("{" not in p and "}" not in p for p in parts if not _PLACEHOLDER.fullmatch(p))
             and all(_IS_INDEX.fullmatch(str(v)) for values in ranges.values() for v in values))
    if not whole:
        keys = list(ranges)
        return [name_box(template.format(**dict(zip(keys, combo))))
                for combo in itertools.product(*(ranges[k] for k in keys))]
    skeleton: list[str | None] = []
    slots: list[frozenset[int]] = []
    for p in parts:
        m = _PLACEHOLDER.fullmatch(p)
        if m or _IS_INDEX.fullmatch(p):
            skeleton.append(None)
            slots.append(frozenset(ranges[m.group(1)]) if m else frozenset((int(p),)))
        else:
            skeleton.append(p)
    return [NameBox(tuple(skeleton), tuple(slots))]


def shared_name(boxes: Iterable[NameBox]) -> str | None:
    """A name two of the boxes share (the first in sort order), or None when they are disjoint."""
    by_skeleton: dict[Skeleton, list[NameBox]] = defaultdict(list)
    for box in boxes:
        by_skeleton[box.skeleton].append(box)
    shared = []
    for group in by_skeleton.values():
        if len(group) > PAIRWISE_LIMIT:
            seen: set[str] = set()
            for name in (n for box in group for n in box.names()):
                if name in seen:
                    shared.append(name)
                    break
                seen.add(name)
        else:
            shared += [min(a.overlap(b).names()) for a, b in itertools.combinations(group, 2) if a.meets(b)][:1]
    return min(shared) if shared else None
