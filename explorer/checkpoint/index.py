"""The checkpoint index, what every source of a checkpoint's tensor listing is read into: stored tensors grouped by
dtype, shape and shard (Kimi K2's 139,644 tensors are 38 groups), and the limits and checks every source is held to.

Sources: safetensors headers, local or on the Hub (explorer/checkpoint/safetensors_headers.py, explorer/checkpoint/hub.py), GGUF headers
(explorer/checkpoint/gguf.py), a grouped JSON listing (explorer/checkpoint/listing.py), and the recorded manifest, checkpoint.toml
(explorer/checkpoint/manifest.py). Names are held as boxes (explorer/checkpoint/tensor_names.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from explorer.checkpoint.tensor_names import NameBox, Skeleton, name_box, pattern_box, split_name
from explorer.errors import CheckpointError
from explorer.spec.storage import known_dtype, storage_block

MAX_TENSORS = 5_000_000
"""Most tensors a header, checkpoint, manifest or listing may name (Kimi K2 has 139,644), checked before any
list of names is built."""


class _Sized:
    """Elements and bytes of a stored tensor, from its dtype and shape."""

    __slots__ = ()
    dtype: str
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Whole blocks of its dtype."""
        block, block_bytes = storage_block(self.dtype)
        return self.elements // block * block_bytes


@dataclass(frozen=True, slots=True)
class TensorInfo(_Sized):
    """One stored tensor as its header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: str = ""
    """File that stores it, where known."""


@dataclass(frozen=True, slots=True)
class TensorGroup(_Sized):
    """Stored tensors that share dtype, shape and shard: a box of names ("layers.1-60.experts.0-383.w");
    elements and nbytes are each tensor's."""

    box: NameBox
    dtype: str
    shape: tuple[int, ...]
    shard: str = ""

    @property
    def name(self) -> str:
        """The grouped name, as a manifest writes it."""
        return self.box.pattern

    @property
    def count(self) -> int:
        return self.box.size


@dataclass(frozen=True)
class CheckpointIndex:
    """Every tensor of a checkpoint, in groups of one dtype, shape and shard, and where the listing came from.

    Groups, not names, are what the build compares (explorer/checkpoint/tensor_names.py): Kimi K2's 139,644 tensors are a
    few hundred groups. `tensors` lists the names for the commands that record or show them one by one."""

    groups: tuple[TensorGroup, ...]
    source: str
    """What was read: a folder, a Hub repo@revision, or a manifest file."""
    repo_id: str = ""
    revision: str = ""
    provenance: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    """Hyper-parameters the checkpoint's own files state (a GGUF file's metadata), config.json key -> value."""
    config_provenance: dict[str, str] = field(default_factory=dict)
    """Where each of them was read (the GGUF key, or how it was derived)."""

    @classmethod
    def of(cls, tensors: dict[str, TensorInfo], source: str, repo_id: str = "", revision: str = "",
           provenance: str = "", config: dict[str, Any] | None = None,
           config_provenance: dict[str, str] | None = None) -> CheckpointIndex:
        """The index of tensors read one by one (a header, a reference state dict), grouped."""
        return cls(tuple(group_tensors(tensors.values())), source, repo_id, revision, provenance, config or {},
                   config_provenance or {})

    @property
    def tensor_count(self) -> int:
        return sum(g.count for g in self.groups)

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor by name, in name order (listed on first use)."""
        listed = {n: TensorInfo(n, g.dtype, g.shape, g.shard) for g in self.groups for n in g.box.names()}
        return dict(sorted(listed.items()))

    def group_of(self, name: str) -> TensorGroup | None:
        """The group that stores `name`, found without listing names."""
        box = name_box(name)
        return next((g for g in self._by_skeleton.get(box.skeleton, ()) if box.within(g.box)), None)

    @cached_property
    def _by_skeleton(self) -> dict[Skeleton, list[TensorGroup]]:
        out: dict[Skeleton, list[TensorGroup]] = {}
        for g in self.groups:
            out.setdefault(g.box.skeleton, []).append(g)
        return out

    def __getstate__(self) -> dict[str, Any]:
        # what a pool worker sends back: the fields, not names listed or lookups built on the way
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def expand_name(pattern: str, limit: int = MAX_TENSORS) -> list[str]:
    """All names a grouped pattern stands for; numeric segments may be runs like "1-60" or "0,3-5", and a
    segment starting with a backslash is literal. Raises ValueError past `limit` names, before building them."""
    return pattern_box(pattern, limit).names()


def group_tensors(tensors: Iterable[TensorInfo]) -> list[TensorGroup]:
    """Compress tensors into groups of one dtype, shape and shard whose names form boxes, deterministically."""
    return group_indexed((*split_name(t.name), t.shape, t.dtype, t.shard) for t in tensors)


IndexedTensor = tuple[Skeleton, tuple[int, ...], tuple[int, ...], str, str]
"""A tensor named by a skeleton and its slots' values, with its shape, dtype and shard."""


def group_indexed(tensors: Iterable[IndexedTensor]) -> list[TensorGroup]:
    """group_tensors for tensors already split into skeleton and slot values (no name is formatted)."""
    buckets: dict[tuple[Skeleton, tuple[int, ...], str, str], list[tuple[int, ...]]] = {}
    for skeleton, indices, shape, dtype, shard in tensors:
        buckets.setdefault((skeleton, shape, dtype, shard), []).append(indices)
    groups = [TensorGroup(NameBox(skeleton, combo), dtype, shape, shard)
              for (skeleton, shape, dtype, shard), indices in buckets.items()
              for combo in _factor(sorted(set(indices)))]
    return sorted(groups, key=lambda g: (g.name, g.shard))


def _factor(indices: list[tuple[int, ...]]) -> list[tuple[frozenset[int], ...]]:
    """Cover index tuples with products of sets: [(1,0),(1,1),(2,0),(2,1)] -> [({1, 2}, {0, 1})]."""
    if not indices or not indices[0]:
        return [()]
    rest_by_first: dict[int, list[tuple[int, ...]]] = {}
    for idx in indices:
        rest_by_first.setdefault(idx[0], []).append(idx[1:])
    by_rest: dict[tuple[tuple[int, ...], ...], list[int]] = {}
    for first, rests in rest_by_first.items():
        by_rest.setdefault(tuple(rests), []).append(first)
    out = []
    for rest, firsts in sorted(by_rest.items(), key=lambda kv: min(kv[1])):
        out += [(frozenset(firsts), *tail) for tail in _factor(list(rest))]
    return out


def check_index(index: CheckpointIndex, source: str) -> None:
    """Validate an index from any source before it is recorded: names, dtypes, shapes and count, group by group
    (a group's names are its literal segments and decimal indices, so checking the literals checks every name:
    a million tensors are not listed to be checked)."""
    if index.tensor_count > MAX_TENSORS:
        raise CheckpointError(source, f"{index.tensor_count:,} tensors, over the limit of {MAX_TENSORS:,}")
    for g in index.groups:
        if g.count == 0:
            continue
        name = g.box.first_name
        check_name(name, source)
        if not known_dtype(g.dtype) or not all(is_count(s) for s in g.shape):
            raise CheckpointError(source, f"tensor '{name}': not a valid entry ({g.dtype} {list(g.shape)})")
        if g.shard:
            check_name(g.shard, source)


def check_name(name: str, source: str) -> None:
    """A tensor name must be non-empty text that UTF-8 (and so TOML and HTML) can carry."""
    if not name:
        raise CheckpointError(source, "a tensor has an empty name")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointError(source, f"tensor {name!r}: name holds a lone surrogate, not text") from None


def is_count(x: Any) -> bool:
    """A size or offset: a non-negative integer, and not a boolean (JSON's true is no size)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def check_spans(spans: Iterable[tuple[int, int, str]], source: str, data_size: int | None, *, of: str = "",
                buffer: str = "the data buffer ({size:,} bytes)") -> None:
    """Tensor byte spans (begin, end, name) may not overlap, nor, when data_size is known, end past it.

    Each format words its errors: `of` follows every byte position ("of the data") and `buffer` names what a
    span ran past, formatted with size (data_size, at least 0).
    """
    ordered = sorted(spans)
    for (_, e0, n0), (b1, _, n1) in zip(ordered, ordered[1:]):
        if b1 < e0:
            raise CheckpointError(source, f"tensors '{n0}' and '{n1}' overlap (bytes {b1:,}–{e0:,}{of})")
    if data_size is not None and ordered and ordered[-1][1] > data_size:
        raise CheckpointError(source, f"tensor '{ordered[-1][2]}' ends at byte {ordered[-1][1]:,}{of}, past "
                                      + buffer.format(size=max(data_size, 0)))
