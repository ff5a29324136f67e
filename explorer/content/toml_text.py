"""TOML text written into content/: keys, strings and values that read back as the values given."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from explorer.errors import ContentError


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_\-]+", key) else toml_string(key)


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes of control characters, and of DEL, which TOML also forbids raw; a lone
    surrogate (valid in JSON's escapes, not in UTF-8) is refused before anything is written."""
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
