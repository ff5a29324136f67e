"""The one way anything is written into content/: `--add-model`, `--add-variant` and `--record-checkpoint` all
hand their finished text to `write_content_file`, and all spell TOML with the one writer below.

What the writer guarantees (issue 37):
- every path part is a checked name (a model slug, a file name), never a path ("../../../x" is refused);
- no part of the path below content/ is a link (a symlinked `variants/` or `variants/NAME.toml`, planted to
  make the write land outside content/, is refused): each folder is opened with O_NOFOLLOW and the file is
  created relative to that open folder, so a link swapped in after the check is not followed either;
- the file appears whole or not at all: written to a temporary name in the same folder, flushed, then linked
  (or, with `replace`, renamed) into place;
- an existing file is never replaced unless the caller was asked to (`--replace`): a second variant whose
  repository has the same last name under another owner, or a hand-edited file, is not silently lost.

The callers validate the text completely before they call the writer (it reads back as content the build
accepts), so a refused command leaves nothing behind.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

from explorer.errors import ContentError

FILE_NAME = re.compile(r"^(?=.{1,80}$)[A-Za-z0-9][A-Za-z0-9_.\-]*$")
"""A file or folder name written under content/: no separator, no leading dot, no '..'."""


def write_content_file(content_dir: Path, parts: tuple[str, ...], data: bytes, *, replace: bool = False,
                       create_folders: int = 0, flag: str = "--replace") -> Path:
    """Write `data` to content_dir/parts[0]/.../parts[-1] atomically. The last `create_folders` folders of the
    path may be created (the others must exist); nothing below content_dir may be a link. An existing file is
    replaced only with `replace`; otherwise ContentError says which flag would replace it."""
    target = content_dir.joinpath(*parts)
    bad = [p for p in parts if not FILE_NAME.fullmatch(p) or ".." in p]
    if bad:
        raise ContentError([f"{target}: {bad[0]!r} is not a name (letters, digits, '_', '.' and '-'; no path)"])
    try:
        fd = os.open(content_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise ContentError([f"{content_dir}: cannot open the content folder ({e.strerror or e})"]) from None
    folders = parts[:-1]
    try:
        for i, name in enumerate(folders):
            inner = _open_folder(fd, name, content_dir.joinpath(*folders[:i + 1]),
                                 create=i >= len(folders) - create_folders)
            os.close(fd)
            fd = inner
        _write_at(fd, parts[-1], data, target, replace, flag)
    finally:
        os.close(fd)
    return target


def _open_folder(parent_fd: int, name: str, where: Path, create: bool) -> int:
    """Open folder `name` of an open folder without following a link."""
    if create:
        try:
            os.mkdir(name, 0o777, dir_fd=parent_fd)
        except FileExistsError:
            pass
        except OSError as e:
            raise ContentError([f"{where}: cannot create ({e.strerror or e}); nothing written"]) from None
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except FileNotFoundError:
        raise ContentError([f"{where}: folder is missing"]) from None
    except OSError as e:  # ELOOP: a link; ENOTDIR: a file (or a link to one)
        if os.path.islink(where):
            raise ContentError([f"{where}: is a link; content folders are written only where they are, "
                                "never through a link (nothing written)"]) from None
        raise ContentError([f"{where}: not a folder ({e.strerror or e}); nothing written"]) from None


def _write_at(fd: int, name: str, data: bytes, target: Path, replace: bool, flag: str) -> None:
    try:
        existing = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise ContentError([f"{target}: is a link or not a file; content files are written only where they are, "
                            "never through a link (nothing written)"])
    if existing is not None and not replace:
        raise ContentError([f"{target}: already exists; nothing written (pass {flag} to replace it, which "
                            "discards any edits made to it)"])
    mode = existing.st_mode & 0o777 if existing is not None else 0o666 & ~_umask()
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            os.fsync(out)
        finally:
            os.close(out)
        os.chmod(tmp, mode, dir_fd=fd)  # the umask would have narrowed a replaced file's mode
        if replace:
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        else:  # a link fails where the name exists, so a file created since the check above is not replaced
            os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
    except FileExistsError:
        raise ContentError([f"{target}: already exists; nothing written (pass {flag} to replace it)"]) from None
    except OSError as e:
        raise ContentError([f"{target}: cannot write ({e.strerror or e}); nothing written"]) from None
    finally:
        try:
            os.unlink(tmp, dir_fd=fd)
        except FileNotFoundError:
            pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------------------------------------------ the TOML writer

def toml_key(key: str) -> str:
    """A bare key where TOML allows one, else a quoted key escaped like any string."""
    return key if re.fullmatch(r"[A-Za-z0-9_\-]+", key) else toml_string(key)


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes of quote, backslash and control characters, and of DEL, which TOML
    also forbids raw; everything else (non-BMP characters too) verbatim. A lone surrogate (valid in JSON's
    escapes, not in UTF-8) is refused before anything is written."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ContentError([f"value {text!r}: not valid Unicode (a lone surrogate), so it cannot be recorded"]) from None
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    """A TOML literal that reads back as the same value (floats by their shortest round-trip repr)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        # TOML has no null: a nested key published as null is left out, as in [config.*] tables, and takes the
        # default the config class gives it (quantization_config's actorder, input_activations, ...)
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in sorted(value.items())
                                if v is not None) + " }"
    raise ContentError([f"value {value!r}: cannot be written as TOML"])
