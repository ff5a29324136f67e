"""Seals on the torch stages' cache entries: an entry is read back only if it is, byte for byte, what a build wrote.

The entries hold what only torch can recompute (equation checks' max |Δ|, a router's worked example, traced shapes),
so reading one checks what it can (types, tolerance, shapes against the spec) but cannot tell an edited number that
is still plausible (an error of 0.0 instead of 2.4e-7, another set of experts) from a computed one (issue 37). Each
entry is therefore written with an HMAC-SHA256 of its file name and text, under a random key kept in the cache
folder (SEAL_KEY, mode 0600): an entry edited by hand, copied under another model's name, or written by anything
but the build fails its seal and is recomputed. The key lives beside the entries, so a seal shows that the build
wrote the entry, not that someone who can read the key did not forge it: it catches edits, not a determined forger
with the same access as the build.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

SEAL_KEY = ".seal-key"
"""The cache folder's key: 64 hex digits, made on the first write."""
_HEAD = "explorer-seal "
_KEY_CHARS = 64


def sealed(folder: Path, name: str, text: str) -> str | None:
    """`text` with its seal line in front, for the entry `name` of `folder` (None: no key could be made there, so
    the entry is not written and the next build recomputes)."""
    key = _key(folder) or _new_key(folder)
    return None if key is None else f"{_HEAD}{_mac(key, name, text)}\n{text}"


def unsealed(path: Path, limit: int) -> str | None:
    """The text of a sealed entry, or None where it is absent, larger than `limit` bytes, unreadable, unsealed, or
    its seal is not the folder key's for this name and text (recompute)."""
    key = _key(path.parent)
    try:
        if key is None or path.is_symlink() or path.stat().st_size > limit:
            return None
        head, _, text = path.read_text(encoding="utf-8").partition("\n")
    except (OSError, ValueError):
        return None
    if not head.startswith(_HEAD):
        return None
    return text if hmac.compare_digest(head[len(_HEAD):], _mac(key, path.name, text)) else None


def _mac(key: bytes, name: str, text: str) -> str:
    # surrogatepass: a lone surrogate in a cached string is sealed as written, not a traceback
    return hmac.new(key, name.encode() + b"\0" + text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _key(folder: Path) -> bytes | None:
    """The folder's key, or None where there is none, or it is a link, or not 64 hex digits."""
    try:
        fd = os.open(folder / SEAL_KEY, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(_KEY_CHARS + 2).strip()
    except OSError:
        return None
    if len(raw) != _KEY_CHARS or any(c not in b"0123456789abcdef" for c in raw):
        return None
    return raw


def _new_key(folder: Path) -> bytes | None:
    """Make the folder's key (or read the one a concurrent build made first): written to a file of its own and
    linked into place, so no build ever reads a half-written key. A damaged key is replaced, which costs the
    entries sealed under it a recomputation."""
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{SEAL_KEY}.", suffix=".tmp", dir=folder)  # mode 0600
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(_KEY_CHARS // 2) + "\n")
        try:
            os.link(tmp, folder / SEAL_KEY)
        except FileExistsError:
            if _key(folder) is None:  # damaged (or a link): replace it, never follow it
                os.replace(tmp, folder / SEAL_KEY)
                tmp = None
    except OSError:
        return None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return _key(folder)
