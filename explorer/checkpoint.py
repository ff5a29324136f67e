"""Read checkpoint tensor headers: local safetensors files, the Hub (header-only range requests), or a
recorded manifest in content/. One parser, parse_header(), serves every byte source.

safetensors layout: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data buffer the offsets index.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import struct
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from .errors import CheckpointError, ContentError, did_you_mean
from .spec.storage import DTYPE_BYTES
from .tensor_names import NameBox, Skeleton, name_box, pattern_box, pattern_size, shared_name, split_name

MAX_HEADER_BYTES = 100_000_000
"""Larger headers are refused (the safetensors library's own limit), so a bad length cannot exhaust memory."""
HUB_PREFIX_BYTES = 100_000
"""First request to the Hub: most headers fit, so one range request usually suffices."""
HUB_DEADLINE_S = 25.0
"""Total time for reading one checkpoint's index and headers from the Hub, however the server paces its bytes
(Kimi K2's 61 shards take a few seconds): a per-read timeout alone resets on every byte. The environment
variable EXPLORER_HUB_DEADLINE_S replaces it (tests of a hostile Hub use a second or two)."""
MAX_HUB_FILE_BYTES = 10_000_000
"""Largest whole file fetched from the Hub (a cited modeling file or config.json is well under 1 MB)."""
MAX_TENSORS = 5_000_000
"""Most tensors a header, checkpoint, manifest or listing may name (Kimi K2 has 139,644), checked before any
list of names is built."""
MAX_INT_DIGITS = 20
"""Integers in a header are sizes and offsets, u64 at most; longer ones are refused before conversion."""
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@cache
def ggml_blocks() -> dict[str, tuple[int, int]]:
    """GGUF (llama.cpp) types by name: (elements per block, bytes per block), from the gguf package's table."""
    from gguf import GGML_QUANT_SIZES

    return {t.name: sizes for t, sizes in GGML_QUANT_SIZES.items()}


def known_dtype(dtype: str) -> bool:
    """A safetensors dtype or a GGUF (llama.cpp) type name."""
    return dtype in DTYPE_BYTES or dtype in ggml_blocks()


def storage_block(dtype: str) -> tuple[int, int]:
    """Elements per block and bytes per block of a stored dtype: (1, size) for safetensors dtypes; quantized
    GGUF types store whole blocks (Q4_1: 32 values in 20 bytes)."""
    return (1, DTYPE_BYTES[dtype]) if dtype in DTYPE_BYTES else ggml_blocks()[dtype]


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

    Groups, not names, are what the build compares (explorer/tensor_names.py): Kimi K2's 139,644 tensors are a
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
    _check_spans(spans, source, data_size)
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


def _check_name(name: str, source: str) -> None:
    """A tensor name must be non-empty text that UTF-8 (and so TOML and HTML) can carry."""
    if not name:
        raise CheckpointError(source, "a tensor has an empty name")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointError(source, f"tensor {name!r}: name holds a lone surrogate, not text") from None


def _check_metadata(entry: Any, source: str) -> None:
    if not isinstance(entry, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entry.items()):
        raise CheckpointError(source, "__metadata__ must map strings to strings")


def _parse_entry(name: str, entry: Any, source: str, shard: str) -> tuple[TensorInfo, tuple[int, int]]:
    _check_name(name, source)
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
            merge_shard(tensors, read_safetensors_file(shard_path), str(shard_path))
        _check_index_agrees(weight_map, tensors, str(index_path))
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
    return _parse_index(data, str(path))


def _parse_index(data: bytes, source: str) -> dict[str, str]:
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


def _check_index_agrees(weight_map: dict[str, str], tensors: dict[str, TensorInfo], source: str) -> None:
    for name, shard in sorted(weight_map.items()):
        info = tensors.get(name)
        if info is None or info.shard != shard:
            raise CheckpointError(source, f"index puts '{name}' in '{shard}', but that shard's header "
                                          + ("does not list it" if info is None else f"is '{info.shard}'"))


# ----------------------------------------------------------------------------------------------- Hub

def hub_deadline() -> float:
    """HUB_DEADLINE_S, or the positive number of seconds EXPLORER_HUB_DEADLINE_S gives."""
    text = os.environ.get("EXPLORER_HUB_DEADLINE_S", "")
    try:
        value = float(text)
    except ValueError:
        return HUB_DEADLINE_S
    return value if 0 < value < 3600 else HUB_DEADLINE_S


def read_hub_checkpoint(repo_id: str, revision: str, timeout: float = 10.0, endpoint: str | None = None,
                        deadline: float | None = None) -> CheckpointIndex:
    """Read every header of a Hub checkpoint at a pinned revision with range requests (a few MB for 1 TB).

    Uses huggingface_hub's URL building, session, auth headers and HF_ENDPOINT (or `endpoint`), and this
    module's parser. Every response is read as a stream, at most the bytes asked for, and the whole read gives
    up after `deadline` seconds; no request is retried.
    """
    from huggingface_hub.errors import EntryNotFoundError

    budget = _Budget.starting(deadline)
    where = f"{repo_id}@{revision}"
    try:
        try:
            url = _hub_url(repo_id, revision, INDEX_FILE, endpoint)
            weight_map = _parse_index(_hub_get(url, None, MAX_HEADER_BYTES, timeout, budget)[0], url)
            shards = sorted(set(weight_map.values()))
        except EntryNotFoundError:
            weight_map, shards = {}, [SINGLE_FILE]
        tensors: dict[str, TensorInfo] = {}
        for shard in shards:
            merge_shard(tensors, read_hub_header(repo_id, revision, shard, timeout, endpoint, budget), shard)
    except CheckpointError:
        raise
    except Exception as e:  # huggingface_hub and httpx raise many types; name the repo and the reason
        raise CheckpointError(where, _hub_reason(e)) from e
    if weight_map:
        _check_index_agrees(weight_map, tensors, f"{where}/{INDEX_FILE}")
    return CheckpointIndex.of(tensors, source=f"{repo_id}@{revision}", repo_id=repo_id, revision=revision)


@dataclass(frozen=True, slots=True)
class _Budget:
    """The moment a Hub read gives up, shared by all of its requests."""

    until: float
    """time.monotonic() value."""
    total: float

    @classmethod
    def starting(cls, deadline: float | None) -> _Budget:
        total = hub_deadline() if deadline is None else deadline
        return cls(time.monotonic() + total, total)

    def left(self, url: str) -> float:
        remaining = self.until - time.monotonic()
        if remaining <= 0:
            raise self.expired(url)
        return remaining

    def expired(self, url: str) -> CheckpointError:
        return CheckpointError(url, f"gave up after {self.total:g} s, the deadline for reading a checkpoint's "
                                    "headers from the Hub")


def read_hub_header(repo_id: str, revision: str, filename: str, timeout: float = 10.0,
                    endpoint: str | None = None, budget: _Budget | None = None) -> dict[str, TensorInfo]:
    """Fetch and parse one file's header with at most two range requests."""
    budget = budget or _Budget.starting(None)
    url = _hub_url(repo_id, revision, filename, endpoint)
    try:
        body, total = _hub_get(url, (0, HUB_PREFIX_BYTES - 1), HUB_PREFIX_BYTES, timeout, budget)
        n = header_length(body[:8], url, total)
        if n > len(body) - 8:
            data = _hub_get(url, (8, n + 7), n, timeout, budget)[0]
        else:
            data = body[8:8 + n]
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(url, _hub_reason(e)) from e
    if len(data) < n:
        raise CheckpointError(url, f"truncated: header says {n:,} bytes, got {len(data):,}")
    return parse_header(data[:n], url, None if total is None else total - 8 - n, shard=filename)


def fetch_hub_file(repo_id: str, revision: str, filename: str, max_bytes: int = MAX_HUB_FILE_BYTES,
                   timeout: float = 10.0, endpoint: str | None = None, deadline: float | None = None) -> bytes:
    """Download one whole (small) file at a pinned revision, streamed, capped in bytes and time."""
    budget = _Budget.starting(deadline)
    where = f"{repo_id}@{revision}/{filename}"
    try:
        data = _hub_get(_hub_url(repo_id, revision, filename, endpoint), None, max_bytes + 1, timeout, budget)[0]
    except CheckpointError as e:
        raise CheckpointError(where, e.reason) from e
    except Exception as e:
        raise CheckpointError(where, _hub_reason(e)) from e
    if len(data) > max_bytes:
        raise CheckpointError(where, f"larger than the {max_bytes:,}-byte cap for a fetched file")
    return data


def _hub_url(repo_id: str, revision: str, filename: str, endpoint: str | None) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)


def _hub_get(url: str, span: tuple[int, int] | None, max_bytes: int, timeout: float,
             budget: _Budget) -> tuple[bytes, int | None]:
    """GET at most max_bytes of `url` (of bytes span[0]..span[1] if given), streamed, within the budget; return
    the bytes and the file's total size from Content-Range. A server sending more than asked is cut off.

    The request runs on a thread of its own that is abandoned at the deadline: httpx's timeouts are per read,
    so a server that drips its status line and headers, or answers with 20 slow redirects, would otherwise
    hold the request far past the deadline (issue 18). The abandoned thread is a daemon and is dropped when
    the command exits, which it does on this error."""
    outcome: list[Any] = []

    def request() -> None:
        try:
            outcome.append((True, _hub_get_now(url, span, max_bytes, timeout, budget)))
        except BaseException as e:  # noqa: BLE001 (handed to the waiting thread, which raises it)
            outcome.append((False, e))

    thread = threading.Thread(target=request, name=f"Hub request {url}", daemon=True)
    thread.start()
    thread.join(budget.left(url))
    if not outcome:
        raise budget.expired(url)
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value  # type: ignore[no-any-return]


def _hub_get_now(url: str, span: tuple[int, int] | None, max_bytes: int, timeout: float,
                 budget: _Budget) -> tuple[bytes, int | None]:
    import httpx2
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    headers = {**build_hf_headers(), "accept-encoding": "identity"}
    if span is not None:
        headers["range"] = f"bytes={span[0]}-{span[1]}"
    # The per-read timeout is also cut to what is left, so a stalled read cannot outlive the deadline by much.
    with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                              timeout=min(timeout, budget.left(url))) as response:
        limit = max_bytes if response.status_code < 400 else 65_536  # an error page is read only for its message
        body = _read_capped(response, limit, url, budget)
        if response.status_code >= 400:
            hf_raise_for_status(httpx2.Response(response.status_code, headers=response.headers, content=body,
                                                request=response.request))
        return body, _content_total(response.headers.get("content-range", ""))


def _read_capped(response: Any, limit: int, url: str, budget: _Budget) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
        budget.left(url)
    return b"".join(chunks)[:limit]


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
@dataclass(frozen=True, slots=True)
class ManifestGroup:
    """Tensors that share shape, dtype and shard, named with index ranges ("layers.1-60.experts.0-383")."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    shard: str = ""


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
        _check_name(name, source)
        if not known_dtype(g.dtype) or not all(_is_count(s) for s in g.shape):
            raise CheckpointError(source, f"tensor '{name}': not a valid entry ({g.dtype} {list(g.shape)})")
        if g.shard:
            _check_name(g.shard, source)


def manifest_text(index: CheckpointIndex) -> str:
    """The checkpoint.toml text of an index: grouped names, with its provenance."""
    lines = [
        "# Stored tensors of the checkpoint, written by `python build.py --record-checkpoint`.",
        "# A name like model.layers.1-60.mlp.experts.0-383.down_proj.weight stands for one tensor per index;",
        "# a name segment starting with a backslash is taken literally.",
        "",
        "[manifest]",
        f"repo_id = {_toml_string(index.repo_id)}",
        f"revision = {_toml_string(index.revision)}",
        f"provenance = {_toml_string(index.provenance)}",
        f"tensor_count = {index.tensor_count}",
        "",
    ]
    if index.config:  # hyper-parameters the files state, checked against the content config by the build
        lines += ["[config]"] + [f"{k} = {_toml_scalar(v)}" for k, v in sorted(index.config.items())] + [""]
        lines += ["[config_provenance]"] + [f"{k} = {_toml_string(v)}" for k, v in
                                            sorted(index.config_provenance.items())] + [""]
    for g in index.groups:
        lines += ["[[tensor]]", f"name = {_toml_string(g.name)}", f"shape = {list(g.shape)}",
                  f"dtype = {_toml_string(g.dtype)}"]
        if g.shard:
            lines.append(f"shard = {_toml_string(g.shard)}")
        lines.append("")
    return "\n".join(lines)


def _toml_scalar(value: Any) -> str:
    """A config value (string, number or boolean) as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return _toml_string(value) if isinstance(value, str) else json.dumps(value)


_TOML_ESCAPES = {ord(c): "\\" + c for c in '"\\'} | {c: f"\\u{c:04x}" for c in (*range(0x20), 0x7F)}


def _toml_string(text: str) -> str:
    """A TOML basic string: backslash, quote and control characters escaped, all else (non-BMP too) verbatim,
    which is what TOML allows; json.dumps would write surrogate pairs that TOML rejects."""
    return '"' + text.translate(_TOML_ESCAPES) + '"'


def write_manifest(index: CheckpointIndex, path: Path) -> None:
    """Record an index as content/models/<slug>/checkpoint.toml, atomically and only once the text written
    reads back as exactly this index."""
    check_index(index, str(path))
    text = manifest_text(index)
    back = manifest_index(tomllib.loads(text), str(path))
    if (_group_rows(back), back.repo_id, back.revision, back.provenance, back.config) != (
            _group_rows(index), index.repo_id, index.revision, index.provenance, index.config):
        raise CheckpointError(str(path), "the manifest would not read back as the index recorded; nothing written")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise CheckpointError(str(path), f"cannot write: {e.strerror or e}") from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(path))  # mkstemp's 0600 would make the recorded file private (issue 18)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise CheckpointError(str(path), f"cannot write: {e.strerror or e}") from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _group_rows(index: CheckpointIndex) -> list[tuple[str, tuple[int, ...], str, str]]:
    """An index as its manifest states it, group by group: a grouped name stands for exactly one set of names
    (tensor_names.py), so equal rows are equal tensors, compared without listing a million names."""
    return [(g.name, g.shape, g.dtype, g.shard) for g in index.groups]


@dataclass(frozen=True, slots=True)
class _ManifestHead:
    repo_id: str
    revision: str
    provenance: str
    tensor_count: int


def read_manifest(path: Path) -> CheckpointIndex:
    """Read a recorded manifest back into a full index; ContentError names the file and key."""
    from .content import load_toml

    return manifest_index(load_toml(path), str(path))


def manifest_index(data: dict[str, Any], path: str) -> CheckpointIndex:
    """Expand a parsed manifest, checking every count against tensor_count and MAX_TENSORS before expanding."""
    from .content import parse_table

    problems: list[str] = []
    head = parse_table(data.get("manifest", {}), _ManifestHead, f"{path}: table 'manifest'", problems)
    tables = data.get("tensor", [])
    if not isinstance(tables, list):
        problems.append(f"{path}: key 'tensor': expected an array of tables ([[tensor]])")
        tables = []
    groups = [parse_table(t, ManifestGroup, f"{path}: tensor {i + 1}", problems) for i, t in enumerate(tables)]
    sizes = []
    for g in groups:
        if g is None:
            continue
        if not known_dtype(g.dtype):
            problems.append(f"{path}: tensor '{g.name}': key 'dtype': unknown dtype {g.dtype!r}")
        elif g.shape and g.shape[-1] % storage_block(g.dtype)[0]:
            problems.append(f"{path}: tensor '{g.name}': key 'shape': last dimension {g.shape[-1]} is not a "
                            f"multiple of {g.dtype}'s block of {storage_block(g.dtype)[0]}")
        if not all(s >= 0 for s in g.shape):
            problems.append(f"{path}: tensor '{g.name}': key 'shape': sizes must be >= 0, got {list(g.shape)}")
        try:
            sizes.append(pattern_size(g.name))
        except ValueError as e:
            problems.append(f"{path}: tensor '{g.name}': key 'name': {e}")
    problems += _stated_config_problems(data, path)
    if problems:
        raise ContentError(problems)
    _check_counts(head.tensor_count, sum(sizes), path)
    stored = _stored_groups([g for g in groups if g is not None])
    if isinstance(stored, str):
        raise ContentError([f"{path}: tensor '{stored}' is listed twice"])
    return CheckpointIndex(stored, source=path, repo_id=head.repo_id, revision=head.revision,
                           provenance=head.provenance, config=dict(data.get("config", {})),
                           config_provenance=dict(data.get("config_provenance", {})))


def _stated_config_problems(data: dict[str, Any], path: str) -> list[str]:
    """The manifest's [config] (values a GGUF header states) holds numbers, booleans and strings, each with its
    source in [config_provenance]: a key without one used to end in a traceback (issue 18)."""
    config, provenance = data.get("config", {}), data.get("config_provenance", {})
    for name, table in (("config", config), ("config_provenance", provenance)):
        if not isinstance(table, dict):
            return [f"{path}: table '{name}': expected a table"]
    problems = [f"{path}: key 'config.{k}': expected a number, boolean or string, got {type(v).__name__}"
                for k, v in sorted(config.items()) if not isinstance(v, int | float | str)]
    problems += [f"{path}: key 'config_provenance.{k}': missing (the GGUF key or fact that states config.{k})"
                 for k in sorted(set(config) - {k for k, v in provenance.items() if isinstance(v, str)})]
    return problems


def _stored_groups(groups: list[ManifestGroup]) -> tuple[TensorGroup, ...] | str:
    """The groups of a manifest or listing whose sizes were checked against MAX_TENSORS, or the first name two
    of them list."""
    out = tuple(TensorGroup(pattern_box(g.name, MAX_TENSORS), g.dtype, g.shape, g.shard) for g in groups)
    twice = shared_name(g.box for g in out)
    return twice if twice is not None else out


def _check_counts(declared: int, expands_to: int, path: str) -> None:
    if not 0 <= declared <= MAX_TENSORS:
        raise ContentError([f"{path}: key 'manifest.tensor_count': {declared:,} is outside 0..{MAX_TENSORS:,}, "
                            "the limit on tensors in a checkpoint"])
    if expands_to != declared:
        raise ContentError([f"{path}: key 'manifest.tensor_count': {declared:,} but the groups stand for "
                            f"{expands_to:,} tensors"])


_LISTING_KEYS = {"repo_id", "provenance", "tensors"}
_ENTRY_KEYS = {"name", "shape", "dtype", "shard"}


def _file_mode(path: Path) -> int:
    """The mode of the file being replaced, or a new file's usual mode under the umask."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


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
        twice = _stored_groups(entries)
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
    if not isinstance(shape, list) or not all(_is_count(s) for s in shape):
        raise CheckpointError(source, f"{where} '{name}': shape must be a list of non-negative integers")
    if not isinstance(shard, str):
        raise CheckpointError(source, f"{where} '{name}': key 'shard': expected a string")
    try:
        pattern_size(name)
    except ValueError as e:
        raise CheckpointError(source, f"{where}: {e}") from None
    return ManifestGroup(name, tuple(shape), dtype, shard)
