"""Read checkpoint tensor headers: local safetensors files, the Hub (header-only range requests), or a
recorded manifest in content/. One parser, parse_header(), serves every byte source.

safetensors layout: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data buffer the offsets index.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .errors import CheckpointError, ContentError
from .spec.storage import DTYPE_BYTES
from .spec.types import compress_indices

MAX_HEADER_BYTES = 100_000_000
"""Larger headers are refused (the safetensors library's own limit), so a bad length cannot exhaust memory."""
HUB_PREFIX_BYTES = 100_000
"""First request to the Hub: most headers fit, so one range request usually suffices."""
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@cache
def ggml_blocks() -> dict[str, tuple[int, int]]:
    """GGUF (llama.cpp) types by name: (elements per block, bytes per block), from the gguf package's table."""
    from gguf import GGML_QUANT_SIZES

    return {t.name: sizes for t, sizes in GGML_QUANT_SIZES.items()}


def storage_block(dtype: str) -> tuple[int, int]:
    """Elements per block and bytes per block of a stored dtype: (1, size) for safetensors dtypes; quantized
    GGUF types store whole blocks (Q4_1: 32 values in 20 bytes)."""
    return (1, DTYPE_BYTES[dtype]) if dtype in DTYPE_BYTES else ggml_blocks()[dtype]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One stored tensor as its header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: str = ""
    """File that stores it, where known."""

    @property
    def elements(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        block, block_bytes = storage_block(self.dtype)
        return self.elements // block * block_bytes


@dataclass(frozen=True, slots=True)
class CheckpointIndex:
    """Every tensor of a checkpoint, by name, and where the listing came from."""

    tensors: dict[str, TensorInfo]
    source: str
    """What was read: a folder, a Hub repo@revision, or a manifest file."""
    repo_id: str = ""
    revision: str = ""
    provenance: str = ""


# ------------------------------------------------------------------------------------------ the parser

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
    try:
        header = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(source, f"header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise CheckpointError(source, f"header is not a JSON object but {type(header).__name__}")
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            _check_metadata(entry, source)
            continue
        info, span = _parse_entry(name, entry, source, shard)
        tensors[name] = info
        spans.append((*span, name))
    _check_spans(spans, source, data_size)
    return tensors


def _check_metadata(entry: Any, source: str) -> None:
    if not isinstance(entry, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entry.items()):
        raise CheckpointError(source, "__metadata__ must map strings to strings")


def _parse_entry(name: str, entry: Any, source: str, shard: str) -> tuple[TensorInfo, tuple[int, int]]:
    where = f"tensor '{name}'"
    if not isinstance(entry, dict):
        raise CheckpointError(source, f"{where}: entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise CheckpointError(source, f"{where}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(s) for s in shape):
        raise CheckpointError(source, f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise CheckpointError(source, f"{where}: data_offsets must be [begin, end] with begin <= end, got {offsets!r}")
    info = TensorInfo(name, dtype, tuple(shape), shard)
    if offsets[1] - offsets[0] != info.nbytes:
        raise CheckpointError(source, f"{where}: shape {shape} of {dtype} needs {info.nbytes:,} bytes, "
                                      f"data_offsets span {offsets[1] - offsets[0]:,}")
    return info, (offsets[0], offsets[1])


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_spans(spans: list[tuple[int, int, str]], source: str, data_size: int | None) -> None:
    """Offsets may not overlap, nor run past the data buffer."""
    spans.sort()
    for (_, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CheckpointError(source, f"tensors '{n0}' and '{n1}' overlap (bytes {b1:,}–{e0:,})")
    if data_size is not None and spans and spans[-1][1] > data_size:
        raise CheckpointError(source, f"tensor '{spans[-1][2]}' ends at byte {spans[-1][1]:,}, past the data "
                                      f"buffer ({data_size:,} bytes)")


# ---------------------------------------------------------------------------------------- local files

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
            tensors.update(read_safetensors_file(shard_path))
        _check_index_agrees(weight_map, tensors, str(index_path))
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(str(folder), f"no {INDEX_FILE} and no .safetensors files")
        tensors = {}
        for path in files:
            tensors.update(read_safetensors_file(path))
    return CheckpointIndex(dict(sorted(tensors.items())), source=str(folder))


def _read_index(path: Path) -> dict[str, str]:
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(str(path), f"cannot read index: {e}") from e
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(str(path), "index has no weight_map of tensor name -> shard file")
    return weight_map


def _check_index_agrees(weight_map: dict[str, str], tensors: dict[str, TensorInfo], source: str) -> None:
    for name, shard in sorted(weight_map.items()):
        info = tensors.get(name)
        if info is None or info.shard != shard:
            raise CheckpointError(source, f"index puts '{name}' in '{shard}', but that shard's header "
                                          + ("does not list it" if info is None else f"is '{info.shard}'"))


# ----------------------------------------------------------------------------------------------- Hub

def read_hub_checkpoint(repo_id: str, revision: str, timeout: float = 10.0,
                        endpoint: str | None = None) -> CheckpointIndex:
    """Read every header of a Hub checkpoint at a pinned revision with range requests (a few MB for 1 TB).

    Uses huggingface_hub's URL building, session, auth headers and HF_ENDPOINT (or `endpoint`), and this
    module's parser.
    """
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint)
    where = f"{repo_id}@{revision}"
    try:
        if api.file_exists(repo_id, INDEX_FILE, revision=revision):
            from huggingface_hub import hf_hub_download

            weight_map = _read_index(Path(hf_hub_download(repo_id, INDEX_FILE, revision=revision,
                                                          endpoint=endpoint)))
            shards = sorted(set(weight_map.values()))
        else:
            weight_map, shards = {}, [SINGLE_FILE]
        tensors: dict[str, TensorInfo] = {}
        for shard in shards:
            tensors.update(read_hub_header(repo_id, revision, shard, timeout, endpoint))
    except CheckpointError:
        raise
    except Exception as e:  # huggingface_hub and httpx raise many types; name the repo and the reason
        raise CheckpointError(where, _hub_reason(e)) from e
    if weight_map:
        _check_index_agrees(weight_map, tensors, f"{where}/{INDEX_FILE}")
    return CheckpointIndex(dict(sorted(tensors.items())), source=f"{repo_id}@{revision}", repo_id=repo_id,
                           revision=revision)


def read_hub_header(repo_id: str, revision: str, filename: str, timeout: float = 10.0,
                    endpoint: str | None = None) -> dict[str, TensorInfo]:
    """Fetch and parse one file's header with at most two range requests."""
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    headers = build_hf_headers()
    try:
        response = get_session().get(url, headers={**headers, "range": f"bytes=0-{HUB_PREFIX_BYTES - 1}"},
                                     timeout=timeout)
        hf_raise_for_status(response)
        body, total = response.content, _content_total(response.headers.get("content-range", ""))
        n = header_length(body[:8], url, total)
        if n > len(body) - 8:
            response = get_session().get(url, headers={**headers, "range": f"bytes=8-{n + 7}"}, timeout=timeout)
            hf_raise_for_status(response)
            data = response.content
        else:
            data = body[8:8 + n]
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(url, _hub_reason(e)) from e
    if len(data) < n:
        raise CheckpointError(url, f"truncated: header says {n:,} bytes, got {len(data):,}")
    return parse_header(data[:n], url, None if total is None else total - 8 - n, shard=filename)


def _content_total(content_range: str) -> int | None:
    match = re.search(r"/(\d+)$", content_range)
    return int(match.group(1)) if match else None


def _hub_reason(e: Exception) -> str:
    name = type(e).__name__
    if "RevisionNotFound" in name:
        return "unknown revision"
    if "RepositoryNotFound" in name:
        return "repository not found"
    if "EntryNotFound" in name:
        return "file not found (404)"
    if "Timeout" in name:
        return "timed out"
    if "Connect" in name:
        return "connection refused or unreachable"
    return f"{name}: {str(e).splitlines()[0] if str(e) else ''}"


# ------------------------------------------------------------------------------------------ manifests

MANIFEST_FILE = "checkpoint.toml"
_RANGE_SEGMENT = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


@dataclass(frozen=True, slots=True)
class ManifestGroup:
    """Tensors that share shape, dtype and shard, named with index ranges ("layers.1-60.experts.0-383")."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    shard: str = ""


def expand_name(pattern: str) -> list[str]:
    """All names a grouped pattern stands for; numeric segments may be runs like "1-60" or "0,3-5"."""
    names = [""]
    for i, segment in enumerate(pattern.split(".")):
        values = _expand_segment(segment) if _RANGE_SEGMENT.match(segment) else [segment]
        sep = "." if i else ""
        names = [f"{n}{sep}{v}" for n in names for v in values]
    return names


def _expand_segment(segment: str) -> list[str]:
    out: list[str] = []
    for run in segment.split(","):
        lo, _, hi = run.partition("-")
        out += [str(i) for i in range(int(lo), int(hi or lo) + 1)]
    return out


def group_tensors(tensors: Iterable[TensorInfo]) -> list[ManifestGroup]:
    """Compress tensor names into grouped patterns (the inverse of expand_name), deterministically."""
    buckets: dict[tuple[str, tuple[int, ...], str, str], list[tuple[int, ...]]] = {}
    for t in tensors:
        parts = t.name.split(".")
        slots = tuple(int(p) for p in parts if p.isdigit())
        template = ".".join("{}" if p.isdigit() else p for p in parts)
        buckets.setdefault((template, t.shape, t.dtype, t.shard), []).append(slots)
    groups = []
    for (template, shape, dtype, shard), indices in sorted(buckets.items()):
        for combo in _factor(sorted(set(indices))):
            groups.append(ManifestGroup(template.format(*combo), shape, dtype, shard))
    return sorted(groups, key=lambda g: (g.name, g.shard))


def _factor(indices: list[tuple[int, ...]]) -> list[tuple[str, ...]]:
    """Cover index tuples with products of runs: [(1,0),(1,1),(2,0),(2,1)] -> [("1-2", "0-1")]."""
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
        head = compress_indices(tuple(sorted(firsts)))
        out += [(head, *tail) for tail in _factor(list(rest))]
    return out


def write_manifest(index: CheckpointIndex, path: Path) -> None:
    """Record an index as content/models/<slug>/checkpoint.toml (grouped names, with its provenance)."""
    groups = group_tensors(index.tensors.values())
    lines = [
        "# Stored tensors of the checkpoint, written by `python build.py --record-checkpoint`.",
        "# A name like model.layers.1-60.mlp.experts.0-383.down_proj.weight stands for one tensor per index.",
        "",
        "[manifest]",
        f"repo_id = {json.dumps(index.repo_id)}",
        f"revision = {json.dumps(index.revision)}",
        f"provenance = {json.dumps(index.provenance)}",
        f"tensor_count = {len(index.tensors)}",
        "",
    ]
    for g in groups:
        lines += ["[[tensor]]", f"name = {json.dumps(g.name)}", f"shape = {list(g.shape)}",
                  f"dtype = {json.dumps(g.dtype)}"]
        if g.shard:
            lines.append(f"shard = {json.dumps(g.shard)}")
        lines.append("")
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    tmp.replace(path)


@dataclass(frozen=True, slots=True)
class _ManifestHead:
    repo_id: str
    revision: str
    provenance: str
    tensor_count: int


def read_manifest(path: Path) -> CheckpointIndex:
    """Read a recorded manifest back into a full index; ContentError names the file and key."""
    from .content import load_toml, parse_table

    data = load_toml(path)
    problems: list[str] = []
    head = parse_table(data.get("manifest", {}), _ManifestHead, f"{path}: table 'manifest'", problems)
    groups = [parse_table(t, ManifestGroup, f"{path}: tensor {i + 1}", problems)
              for i, t in enumerate(data.get("tensor", []))]
    for g in groups:
        if g is not None and g.dtype not in DTYPE_BYTES and g.dtype not in ggml_blocks():
            problems.append(f"{path}: tensor '{g.name}': key 'dtype': unknown dtype {g.dtype!r}")
        elif g is not None and g.shape and g.shape[-1] % storage_block(g.dtype)[0]:
            problems.append(f"{path}: tensor '{g.name}': key 'shape': last dimension {g.shape[-1]} is not a "
                            f"multiple of {g.dtype}'s block of {storage_block(g.dtype)[0]}")
    if problems:
        raise ContentError(problems)
    tensors: dict[str, TensorInfo] = {}
    for g in groups:
        for name in expand_name(g.name):
            if name in tensors:
                raise ContentError([f"{path}: tensor '{name}' is listed twice"])
            tensors[name] = TensorInfo(name, g.dtype, g.shape, g.shard)
    if len(tensors) != head.tensor_count:
        raise ContentError([f"{path}: key 'manifest.tensor_count': {head.tensor_count:,} but the groups expand "
                            f"to {len(tensors):,} tensors"])
    return CheckpointIndex(dict(sorted(tensors.items())), source=str(path), repo_id=head.repo_id,
                           revision=head.revision, provenance=head.provenance)


def read_listing(path: Path) -> CheckpointIndex:
    """Read a grouped JSON listing ({repo_id, provenance, tensors: [{name, shape, dtype}]}), e.g. one
    transcribed from a published report of a checkpoint's headers."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        tensors = {}
        for entry in data["tensors"]:
            for name in expand_name(entry["name"]):
                tensors[name] = TensorInfo(name, entry["dtype"], tuple(entry["shape"]), entry.get("shard", ""))
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise CheckpointError(str(path), f"not a tensor listing: {e}") from e
    return CheckpointIndex(dict(sorted(tensors.items())), source=str(path), repo_id=data.get("repo_id", ""),
                           provenance=data.get("provenance", ""))
