"""Read from the Hub at a pinned revision: a checkpoint's headers with range requests (a few MB for 1 TB), and
small whole files (a cited modeling file, config.json), every read capped in bytes and all of them in time.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from explorer.checkpoint.index import CheckpointIndex, TensorInfo
from explorer.checkpoint.safetensors_headers import (
    INDEX_FILE,
    MAX_HEADER_BYTES,
    SINGLE_FILE,
    check_index_agrees,
    header_length,
    merge_shard,
    parse_header,
    parse_index,
)
from explorer.errors import CheckpointError

HUB_PREFIX_BYTES = 100_000
"""First request to the Hub: most headers fit, so one range request usually suffices."""

HUB_DEADLINE_S = 25.0
"""Total time for reading one checkpoint's index and headers from the Hub, however the server paces its bytes
(Kimi K2's 61 shards take a few seconds): a per-read timeout alone resets on every byte. The environment
variable EXPLORER_HUB_DEADLINE_S replaces it (tests of a hostile Hub use a second or two)."""

MAX_HUB_FILE_BYTES = 10_000_000
"""Largest whole file fetched from the Hub (a cited modeling file or config.json is well under 1 MB)."""


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

    Uses huggingface_hub's URL building, session, auth headers and HF_ENDPOINT (or `endpoint`), and the
    parser local files use (explorer/checkpoint/safetensors_headers.py). Every response is read as a stream, at most the bytes asked for, and the whole read gives
    up after `deadline` seconds; no request is retried.
    """
    from huggingface_hub.errors import EntryNotFoundError

    budget = _Budget.starting(deadline)
    where = f"{repo_id}@{revision}"
    try:
        try:
            url = _hub_url(repo_id, revision, INDEX_FILE, endpoint)
            weight_map = parse_index(_hub_get(url, None, MAX_HEADER_BYTES, timeout, budget)[0], url)
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
        check_index_agrees(weight_map, tensors, f"{where}/{INDEX_FILE}")
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


UNREACHABLE = ("connection refused or unreachable", "timed out")
"""Reasons that say the Hub itself cannot be reached (not that one file is missing)."""


def hub_unreachable(e: CheckpointError) -> bool:
    """Whether a failed request says the Hub is down or cut off, so that asking again for the next model would
    only wait out the same timeout (--verify-hub took 25 s per model when the Hub was down)."""
    return e.reason in UNREACHABLE or e.reason.startswith("gave up after")


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
