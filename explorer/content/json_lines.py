"""Where a key of a JSON file lies, by line: from the line its name is on to the line its value ends on.

A citation of a config key ("quantization_config", or "text_config.quantization_config" inside a nested table)
names these lines. They are found by scanning the text itself, strings and escapes included, so a file of any
indent, or minified on one line, gives the lines it really has; a bracket inside a string counts for nothing.
"""

from __future__ import annotations

import re
from json.decoder import scanstring  # type: ignore[attr-defined]  # in the module, not in its stubs

_SPACE = re.compile(r"[ \t\n\r]*")
_SCALAR = re.compile(r"-?(?:Infinity|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)|true|false|null|NaN")


class _Malformed(ValueError):
    pass


def key_lines(text: str, dotted: str) -> tuple[int, int] | None:
    """(first, last) line, 1-based and inclusive, of the key `dotted` ("a.b": key b of the table at key a), or None
    where the file holds no such key or is not a JSON object."""
    try:
        return _find(text, _skip(text, 0), dotted.split("."))
    except (_Malformed, IndexError, ValueError):
        return None


def _find(text: str, at: int, path: list[str]) -> tuple[int, int] | None:
    """Search the object starting at `at` for path[0]; descend into its value for the rest of the path."""
    if text[at] != "{":
        return None
    at = _skip(text, at + 1)
    while text[at] != "}":
        key_at = at
        key, at = scanstring(text, at + 1)
        at = _skip(text, at)
        if text[at] != ":":
            raise _Malformed(at)
        value_at = _skip(text, at + 1)
        end = _value_end(text, value_at)
        if key == path[0]:
            if len(path) == 1:
                return _line(text, key_at), _line(text, end - 1)
            return _find(text, value_at, path[1:])
        at = _skip(text, end)
        if text[at] == ",":
            at = _skip(text, at + 1)
    return None


def _value_end(text: str, at: int) -> int:
    """The position just past the value starting at `at`."""
    if text[at] == '"':
        return scanstring(text, at + 1)[1]
    if text[at] in "{[":
        close = "}" if text[at] == "{" else "]"
        at = _skip(text, at + 1)
        while text[at] != close:
            if close == "}":
                at = _skip(text, scanstring(text, at + 1)[1])
                at = _skip(text, at + 1)  # the colon
            at = _skip(text, _value_end(text, at))
            if text[at] == ",":
                at = _skip(text, at + 1)
        return at + 1
    match = _SCALAR.match(text, at)
    if match is None or not match.group():
        raise _Malformed(at)
    return match.end()


def _skip(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # matches the empty string at least


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1
