"""The output folder: which folders a build may replace, one build at a time, and an atomic swap.

A build renders into a temporary sibling of the output folder and swaps it in whole. The folder it replaces
must be empty or carry explorer's marker file, and may not be, hold or lie inside the project's own inputs,
so `--out` pointed at someone's data fails instead of deleting it. A lock file beside the output folder lets
one build at a time write it; a second fails at once with one line. On Linux the swap is one
renameat2(RENAME_EXCHANGE) call, so a reader sees the old or the new site at every instant, never neither.

References: renameat2(2) and flock(2) man pages; the "current" symlink / atomic-exchange deploy pattern.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from explorer.errors import OutputError
from explorer.project import Protected

MARKER = ".explorer-site"
"""File in every site explorer writes: only a folder holding it (or an empty one) is ever replaced."""
MARKER_TEXT = "Written by explorer's build.py, which replaces this whole folder on every build.\n"
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def check_output(out: Path, protected: tuple[Protected, ...] = ()) -> Path:
    """Return the resolved output folder, or raise OutputError saying why it must not be replaced."""
    try:
        out = out.expanduser().resolve()
    except (OSError, RuntimeError) as e:
        raise OutputError(f"{out}: cannot resolve the output folder: {e}") from e
    if out == Path(out.anchor):
        raise OutputError(f"{out}: the output folder cannot be a filesystem root")
    for p in protected:
        folder = p.path.resolve()
        if folder == out or folder.is_relative_to(out):
            raise OutputError(f"{out}: the output folder would replace {p.label} ({folder}); choose another --out")
        if out.is_relative_to(folder) and not p.may_hold_output:
            raise OutputError(f"{out}: the output folder lies inside {p.label} ({folder}); choose another --out")
    try:
        _check_replaceable(out)
    except OSError as e:  # a name too long, a parent that is a file, a folder we may not list
        raise OutputError(f"{out}: cannot use as the output folder: {e.strerror or e}") from e
    return out


def _check_replaceable(out: Path) -> None:
    existing = next(p for p in out.parents if p.exists())
    if not existing.is_dir():
        raise OutputError(f"{out}: {existing} is a file, so the output folder cannot be made there")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: the output folder is a file, not a folder; choose another --out")
    if out.is_dir() and not (out / MARKER).is_file() and any(out.iterdir()):
        raise OutputError(f"{out}: the output folder is not empty and was not written by explorer (no {MARKER} "
                          "file); empty it or choose another --out")


@contextmanager
def claim_output(out: Path, protected: tuple[Protected, ...] = ()) -> Iterator[Path]:
    """Check the output folder, hold its lock and clear leftovers of killed builds; yield the resolved path."""
    out = check_output(out, protected)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{out}: cannot create the output folder's parent: {e.strerror or e}") from e
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise OutputError(f"{out}: cannot write the output folder's parent {out.parent}; choose another --out")
    fd = _lock(out)
    try:
        try:
            _clear_leftovers(out)
        except OSError as e:
            raise OutputError(f"{out}: cannot remove a killed build's leftovers: {e.strerror or e}") from e
        yield out
    finally:
        _unlock(out, fd)


def lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def _lock(out: Path) -> int:
    """Take the lock file beside `out` without waiting; it is removed on release, so re-check it is still ours."""
    path = lock_path(out)
    while True:
        fd = _open_lock_file(out, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OutputError(f"{out}: another build (pid {holder}) is writing this folder; wait for it to finish "
                              "or choose another --out") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False  # the previous holder removed it between our open and our lock
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


def _open_lock_file(out: Path, path: Path) -> int:
    """Open the lock file without following a symbolic link or blocking on a FIFO, and refuse anything but a
    plain file of its own: the lock is truncated and written, so a link planted at its name would have the
    build overwrite the link's target (issue 18)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        reason = "it is a symbolic link; remove it" if e.errno == errno.ELOOP else e.strerror or str(e)
        raise OutputError(f"{out}: cannot use the lock file {path}: {reason}") from e
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise OutputError(f"{out}: cannot use the lock file {path}: it is not a plain file of its own (a link, "
                          "FIFO or device); remove it")
    return fd


def _unlock(out: Path, fd: int) -> None:
    try:
        lock_path(out).unlink(missing_ok=True)  # while still held, so no one locks a file about to vanish
    finally:
        os.close(fd)


def _clear_leftovers(out: Path) -> None:
    """Remove temporary folders of builds that were killed (ours only: empty or marked). Call under the lock."""
    for tmp in sorted(out.parent.glob(f".{out.name}.tmp-*")) + [out.with_name(f".{out.name}.old")]:
        if tmp.is_dir() and not tmp.is_symlink() and ((tmp / MARKER).is_file() or not any(tmp.iterdir())):
            shutil.rmtree(tmp, ignore_errors=True)  # what cannot be removed now is retried by the next build


def _umask() -> int:
    """The process's umask (os.umask can only read it by setting it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def stage(out: Path) -> Path:
    """Create the marked temporary sibling a build renders into."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        # mkdtemp makes the folder private (0700), and it becomes the site: give it the mode any new folder gets,
        # so a web server running as another user can read it
        tmp.chmod(0o777 & ~_umask())
        (tmp / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
    except OSError as e:
        raise OutputError(f"{out}: cannot create a folder beside it: {e.strerror or e}") from e
    return tmp


def publish(staged: Path, out: Path) -> None:
    """Put `staged` in place of `out` in one step, then delete the previous site.

    What lies at `out` is checked again first: a folder someone made or filled there during the build is
    refused, not replaced (issue 18)."""
    if not out.exists() and _rename_new(staged, out):
        return
    _check_replaceable(out)
    if _exchange(staged, out):
        _remove_previous(staged)  # now holds the previous site
        return
    # No atomic exchange on this system: two renames, with a moment between them with no site.
    old = out.with_name(f".{out.name}.old")
    os.rename(out, old)
    os.rename(staged, out)
    _remove_previous(old)


def _remove_previous(folder: Path) -> None:
    """Delete the replaced site; the new one is published already, so a failure here (a file someone made
    read-only inside it) is left for a later build to retry, not reported as a failed build (issue 18).
    The marker goes last: a build killed while deleting leaves a folder the next build knows as its own and
    removes (a plain rmtree could take the marker first and leave an unmarked remnant for good)."""
    try:
        entries = [e for e in folder.iterdir() if e.name != MARKER]
    except OSError:
        entries = []
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():  # issue 37: say what is left and where, instead of leaving it silently
        print(f"warning: the previous site could not be removed completely: {folder} is left beside the new one "
              "(the next build retries; remove it by hand if it stays)", file=sys.stderr)


def _rename_new(staged: Path, out: Path) -> bool:
    """Rename `staged` to `out` unless something appeared there since it was checked; False if it has (or,
    without renameat2, if it exists now)."""
    done = _renameat2(staged, out, _RENAME_NOREPLACE)
    if done is not None:
        return done
    if out.exists():
        return False
    os.rename(staged, out)
    return True


def _renameat2(a: Path, b: Path, flags: int) -> bool | None:
    """renameat2(a, b, flags): True if done, False if `b` exists (EEXIST), None where the system cannot."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        return False
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return None
    raise OSError(err, os.strerror(err), str(b))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system or filesystem cannot."""
    return bool(_renameat2(a, b, _RENAME_EXCHANGE))
