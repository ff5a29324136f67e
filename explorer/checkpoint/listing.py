"""Read a grouped JSON listing of a checkpoint's tensors ({repo_id, provenance, tensors: [{name, shape, dtype,
shard}]}), e.g. one transcribed from a published report of its headers, into an index, every entry validated as a
header's is.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from explorer.checkpoint.index import (
    MAX_TENSORS,
    CheckpointIndex,
    IndexedTensor,
    TensorGroup,
    check_index,
    group_indexed,
    is_count,
)
from explorer.checkpoint.manifest import ManifestGroup, stored_groups
from explorer.checkpoint.safetensors_headers import MAX_HEADER_BYTES, load_json, read_capped
from explorer.checkpoint.tensor_names import pattern_box, pattern_size, shared_name
from explorer.errors import CheckpointError, did_you_mean
from explorer.spec.storage import known_dtype

_LISTING_KEYS = {"repo_id", "provenance", "tensors"}
_ENTRY_KEYS = {"name", "shape", "dtype", "shard"}


def read_listing(path: Path) -> CheckpointIndex:
    """Read a grouped JSON listing ({repo_id, provenance, tensors: [{name, shape, dtype, shard}]}), e.g. one
    transcribed from a published report of a checkpoint's headers; every entry is validated as a header's is."""
    source = str(path)
    try:
        data = load_json(read_capped(path, MAX_HEADER_BYTES, "listing"), source, "listing")
    except OSError as e:
        raise CheckpointError(source, f"cannot read: {e.strerror or e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("tensors"), list):
        raise CheckpointError(source, "not a tensor listing: expected an object with a 'tensors' array")
    for key in sorted(set(data) - _LISTING_KEYS):
        raise CheckpointError(source, f"key '{key}': unknown{did_you_mean(key, _LISTING_KEYS)}")
    for key in ("repo_id", "provenance"):
        if not isinstance(data.get(key, ""), str):
            raise CheckpointError(source, f"key '{key}': expected a string")
    repo_id, provenance = data.get("repo_id", ""), data.get("provenance", "")
    entries = [_listing_entry(e, i, source) for i, e in enumerate(data.pop("tensors"))]
    del data  # the parsed JSON (most of the memory a million entries take) is not needed past here
    total = sum(pattern_size(g.name) for g in entries)
    if total > MAX_TENSORS:
        raise CheckpointError(source, f"the entries stand for {total:,} tensors, over the limit of {MAX_TENSORS:,}")
    index = CheckpointIndex(_listing_groups(entries, total, source), source=source, repo_id=repo_id,
                            provenance=provenance)
    check_index(index, source)
    return index


def _listing_groups(entries: list[ManifestGroup], total: int, source: str) -> tuple[TensorGroup, ...]:
    """The entries regrouped as a header's tensors are, so that a listing of one entry per tensor records the
    same few hundred groups as the checkpoint's own headers would (a million [[tensor]] tables are a manifest
    no build reads quickly). A name listed twice is an error, named as the entries list it."""
    groups = tuple(group_indexed(_indexed(entries)))
    if sum(g.count for g in groups) != total or shared_name(g.box for g in groups) is not None:
        twice = stored_groups(entries)
        assert isinstance(twice, str), "groups that overlap or lost a tensor come from a name listed twice"
        raise CheckpointError(source, f"tensor '{twice}' is listed twice")
    return groups


def _indexed(entries: list[ManifestGroup]) -> Iterable[IndexedTensor]:
    for g in entries:
        box = pattern_box(g.name, MAX_TENSORS)
        for indices in itertools.product(*(sorted(values) for values in box.slots)):
            yield box.skeleton, indices, g.shape, g.dtype, g.shard


def _listing_entry(entry: Any, i: int, source: str) -> ManifestGroup:
    where = f"tensors[{i}]"
    if not isinstance(entry, dict):
        raise CheckpointError(source, f"{where}: expected an object")
    for key in sorted(set(entry) - _ENTRY_KEYS):
        raise CheckpointError(source, f"{where}: key '{key}': unknown{did_you_mean(key, _ENTRY_KEYS)}")
    name, dtype, shape, shard = entry.get("name"), entry.get("dtype"), entry.get("shape"), entry.get("shard", "")
    if not isinstance(name, str) or not name:
        raise CheckpointError(source, f"{where}: key 'name': expected a non-empty string")
    if not isinstance(dtype, str) or not known_dtype(dtype):
        raise CheckpointError(source, f"{where} '{name}': unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(is_count(s) for s in shape):
        raise CheckpointError(source, f"{where} '{name}': shape must be a list of non-negative integers")
    if not isinstance(shard, str):
        raise CheckpointError(source, f"{where} '{name}': key 'shard': expected a string")
    try:
        pattern_size(name)
    except ValueError as e:
        raise CheckpointError(source, f"{where}: {e}") from None
    return ManifestGroup(name, tuple(shape), dtype, shard)
