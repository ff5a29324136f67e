"""Read safetensors headers: the one parser, parse_header(), that every byte source uses (local files here, the Hub
in explorer/checkpoint/hub.py), strict JSON with limits, and local checkpoint folders, sharded or not.

safetensors layout: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data buffer the offsets index.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from explorer.checkpoint.index import MAX_TENSORS, CheckpointIndex, TensorInfo, check_name, check_spans, is_count
from explorer.errors import CheckpointError
from explorer.spec.storage import DTYPE_BYTES

MAX_HEADER_BYTES = 100_000_000
"""Larger headers are refused (the safetensors library's own limit), so a bad length cannot exhaust memory."""

MAX_INT_DIGITS = 20
"""Integers in a header are sizes and offsets, u64 at most; longer ones are refused before conversion."""

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def header_length(prefix: bytes, source: str, file_size: int | None) -> int:
    """Decode and bound-check the 8-byte header length."""
    if len(prefix) < 8:
        raise CheckpointError(source, f"truncated: {len(prefix)} bytes, need at least 8 for the header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise CheckpointError(source, f"header length {n:,} exceeds the {MAX_HEADER_BYTES:,}-byte cap")
    if file_size is not None and n > file_size - 8:
        raise CheckpointError(source, f"header length {n:,} is larger than the file ({file_size:,} bytes)")
    return n


def parse_header(data: bytes, source: str, data_size: int | None = None, shard: str = "") -> dict[str, TensorInfo]:
    """Parse a header's JSON bytes into TensorInfo by name, validating every entry.

    data_size, when known, is the size of the data buffer after the header; offsets must lie inside it.
    """
    header = load_json(data, source, "header")
    if not isinstance(header, dict):
        raise CheckpointError(source, f"header is not a JSON object but {type(header).__name__}")
    if len(header) > MAX_TENSORS + 1:
        raise CheckpointError(source, f"header lists {len(header):,} tensors, over the limit of {MAX_TENSORS:,}")
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            _check_metadata(entry, source)
            continue
        info, span = _parse_entry(name, entry, source, shard)
        tensors[name] = info
        spans.append((*span, name))
    check_spans(spans, source, data_size)
    return tensors


class _JsonLimit(ValueError):
    """A JSON document broke one of our limits (duplicate key, huge integer, NaN)."""


def load_json(data: bytes, source: str, what: str) -> Any:
    """Parse strict UTF-8 JSON: duplicate keys, integers over MAX_INT_DIGITS digits, NaN and nesting beyond
    Python's recursion limit are CheckpointErrors naming the source, not tracebacks."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(source, f"{what} is not UTF-8 at byte {e.start}: {e.reason}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_bounded_int,
                          parse_constant=_no_constant)
    except _JsonLimit as e:
        raise CheckpointError(source, f"{what}: {e}") from None
    except RecursionError:
        raise CheckpointError(source, f"{what} is nested too deeply to be a tensor listing") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(source, f"{what} is not JSON: {e}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonLimit(f"key {key!r} appears twice (JSON readers disagree on which one wins)")
        out[key] = value
    return out


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _JsonLimit(f"integer of {len(digits):,} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _no_constant(name: str) -> Any:
    raise _JsonLimit(f"{name} is not a JSON value")


def _check_metadata(entry: Any, source: str) -> None:
    if not isinstance(entry, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entry.items()):
        raise CheckpointError(source, "__metadata__ must map strings to strings")


def _parse_entry(name: str, entry: Any, source: str, shard: str) -> tuple[TensorInfo, tuple[int, int]]:
    check_name(name, source)
    where = f"tensor '{name}'"
    if not isinstance(entry, dict):
        raise CheckpointError(source, f"{where}: entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise CheckpointError(source, f"{where}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(is_count(s) for s in shape):
        raise CheckpointError(source, f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise CheckpointError(source, f"{where}: data_offsets must be [begin, end] with begin <= end, got {offsets!r}")
    info = TensorInfo(name, dtype, tuple(shape), shard)
    if offsets[1] - offsets[0] != info.nbytes:
        raise CheckpointError(source, f"{where}: shape {shape} of {dtype} needs {info.nbytes:,} bytes, "
                                      f"data_offsets span {offsets[1] - offsets[0]:,}")
    return info, (offsets[0], offsets[1])


def read_safetensors_file(path: Path) -> dict[str, TensorInfo]:
    """Read only the header of one local .safetensors file."""
    source = str(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            n = header_length(f.read(8), source, size)
            data = f.read(n)
    except OSError as e:
        raise CheckpointError(source, f"cannot read: {e.strerror or e}") from e
    if len(data) < n:
        raise CheckpointError(source, f"truncated: header says {n:,} bytes, file has {len(data):,}")
    return parse_header(data, source, size - 8 - n, shard=path.name)


def read_local_checkpoint(folder: Path) -> CheckpointIndex:
    """Read a checkpoint folder: sharded through its index file, or every .safetensors file in it."""
    index_path = folder / INDEX_FILE
    if index_path.exists():
        weight_map = _read_index(index_path)
        tensors: dict[str, TensorInfo] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = folder / shard
            if not shard_path.exists():
                raise CheckpointError(str(index_path), f"names shard '{shard}', which is missing")
            merge_shard(tensors, read_safetensors_file(shard_path), str(shard_path))
        check_index_agrees(weight_map, tensors, str(index_path))
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(str(folder), f"no {INDEX_FILE} and no .safetensors files")
        tensors = {}
        for path in files:
            merge_shard(tensors, read_safetensors_file(path), str(path))
    return CheckpointIndex.of(tensors, source=str(folder))


def merge_shard(tensors: dict[str, TensorInfo], shard: dict[str, TensorInfo], source: str) -> None:
    """Add one shard's tensors; a name stored in two shards (a stale copy left beside new ones) is an error,
    never a silent last-one-wins."""
    for name, info in shard.items():
        if name in tensors:
            raise CheckpointError(source, f"tensor '{name}' is also stored in '{tensors[name].shard}'; remove the "
                                          "stale shard")
        tensors[name] = info
    if len(tensors) > MAX_TENSORS:
        raise CheckpointError(source, f"the checkpoint holds over {MAX_TENSORS:,} tensors, the limit")


def read_capped(path: Path, cap: int, what: str) -> bytes:
    """A file's bytes, refused past `cap`: counted as read, since a device or pipe (/dev/zero, a FIFO) has no
    size to look at first (issue 18). OSError is the caller's to name."""
    with path.open("rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise CheckpointError(str(path), f"{what} is over the {cap:,}-byte cap")
    return data


def _read_index(path: Path) -> dict[str, str]:
    try:
        data = read_capped(path, MAX_HEADER_BYTES, "index")
    except OSError as e:
        raise CheckpointError(str(path), f"cannot read index: {e.strerror or e}") from e
    return parse_index(data, str(path))


def parse_index(data: bytes, source: str) -> dict[str, str]:
    index = load_json(data, source, "index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(source, "index has no weight_map of tensor name -> shard file")
    if len(weight_map) > MAX_TENSORS:
        raise CheckpointError(source, f"index lists {len(weight_map):,} tensors, over the limit of {MAX_TENSORS:,}")
    for shard in set(weight_map.values()):
        if not shard or "/" in shard or "\\" in shard or shard in (".", ".."):
            raise CheckpointError(source, f"shard {shard!r} is not a file name in the checkpoint's folder")
    return weight_map


def check_index_agrees(weight_map: dict[str, str], tensors: dict[str, TensorInfo], source: str) -> None:
    for name, shard in sorted(weight_map.items()):
        info = tensors.get(name)
        if info is None or info.shard != shard:
            raise CheckpointError(source, f"index puts '{name}' in '{shard}', but that shard's header "
                                          + ("does not list it" if info is None else f"is '{info.shard}'"))
