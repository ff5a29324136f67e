"""A loopback HTTP server standing in for the Hugging Face Hub: serves files at /{repo}/resolve/{rev}/{file}
with HEAD, Range requests and the Hub's error headers, and counts the bytes it sends. It can also act as a
hostile server: an endless body, or one byte every few seconds."""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_PATH = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class FakeHub:
    """Files by (repo_id, revision, filename); `delay` seconds before answering simulates a stalled Hub.

    `endless`: GET answers with the file's bytes followed by spaces that never end, whatever range was asked.
    `drip`: GET answers one byte every `drip` seconds, forever.
    `drip_headers`: GET and HEAD answer with a status line and headers that never end, one byte every
    `drip_headers` seconds (issue 18).
    `redirects`: GET answers that many redirects to itself before the file, each after `delay` seconds.
    """

    def __init__(self) -> None:
        self.files: dict[tuple[str, str, str], bytes] = {}
        self.bytes_sent = 0
        self.requests: list[tuple[str, str]] = []
        self.delay = 0.0
        self.endless = False
        self.drip = 0.0
        self.drip_headers = 0.0
        self.redirects = 0
        self._stopped = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.handle_error = lambda request, address: None  # a client that gave up (timeout test)
        # serve_forever notices shutdown() only between polls: at its default of 0.5 s, every `with` waited that long
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()  # ends the endless answers of a client that was abandoned rather than hung up
        self._server.shutdown()
        self._server.server_close()

    def _lookup(self, path: str) -> tuple[int, dict[str, str], bytes | None]:
        match = _PATH.match(path)
        if not match:
            return 404, {"X-Error-Code": "RepoNotFound"}, None
        repo, rev, name = match["repo"], match["rev"], match["file"]
        if not any(r == repo for r, _, _ in self.files):
            return 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, None
        if not any(r == repo and v == rev for r, v, _ in self.files):
            return 404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"}, None
        data = self.files.get((repo, rev, name))
        if data is None:
            return 404, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"}, None
        etag = hashlib.sha256(data).hexdigest()
        return 200, {"X-Repo-Commit": rev, "ETag": f'"{etag}"'}, data

    def _handler(hub):  # noqa: N805 (the closure's self is the hub)
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, head: bool) -> None:
                hub.requests.append((self.command, self.path))
                if hub.delay:
                    time.sleep(hub.delay)
                if hub.drip_headers:
                    return self._drip_headers()
                path, _, query = self.path.partition("?")
                hop = int(query.removeprefix("hop=") or 0)
                if hop < hub.redirects:
                    self.send_response(302)
                    self.send_header("Location", f"{path}?hop={hop + 1}")
                    self.send_header("Content-Length", "0")
                    return self.end_headers()
                status, headers, data = hub._lookup(path)
                if data is not None and not head and (hub.endless or hub.drip):
                    return self._hostile(data)
                body = b""
                if data is not None:
                    body, status, headers = _ranged(data, self.headers.get("range"), headers)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) if head and data is not None else len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)
                    hub.bytes_sent += len(body)

            def _hostile(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(10**15))
                self.end_headers()
                chunk = data if hub.endless else data[:1]
                while not hub._stopped.is_set():  # or the client hangs up (BrokenPipeError, silenced)
                    self.wfile.write(chunk)
                    hub.bytes_sent += len(chunk)
                    chunk = b" " * 65536 if hub.endless else b" "
                    if hub.drip:
                        time.sleep(hub.drip)

            def _drip_headers(self) -> None:
                for byte in itertools.chain(b"HTTP/1.1 200 OK\r\nX-Padding: ", itertools.repeat(ord("a"))):
                    if hub._stopped.is_set():
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(hub.drip_headers)

            def do_HEAD(self) -> None:
                self._answer(head=True)

            def do_GET(self) -> None:
                self._answer(head=False)

        return Handler


def _ranged(data: bytes, range_header: str | None, headers: dict[str, str]) -> tuple[bytes, int, dict[str, str]]:
    match = re.match(r"bytes=(\d+)-(\d*)", range_header or "")
    if not match:
        return data, 200, headers
    start = int(match[1])
    end = min(int(match[2]) if match[2] else len(data) - 1, len(data) - 1)
    return data[start:end + 1], 206, {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
