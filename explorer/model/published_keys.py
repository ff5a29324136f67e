"""Published config keys a family does not read: which may be recorded as unused, and which never.

Published configs routinely carry keys their config class does not define (GPT-2 medium's n_special and
predict_special_tokens, a tool's own notes). transformers' config classes take any such key and keep it as an
attribute, so `--add-model` takes it too: it is recorded in [config] as published (the config's sha256 still
holds) and listed in checkpoint.config_unused; the family reads the config without it, the reference config class
is built without it, and the model page lists it as published and not read.

A key is taken for unused only where nothing could read it: it is no field of the family's config, it is no
storage key (a quantization_config the family cannot lay out would leave every stored tensor in the wrong
dtype), and no file of the reference implementation names it: the family's configuration and modeling modules in
the installed transformers, and the base config class's (a key the base class consumes, such as rope_scaling, or
one modeling code reads with getattr). Found by reading those files as text, so no torch is imported to build.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import ContentError, did_you_mean
from explorer.model.config_defaults import known_spelling

if TYPE_CHECKING:
    from explorer.model.families.base import Family

STORAGE_KEYS = ("quantization_config",)
"""Top-level keys that change how the checkpoint stores its tensors: never recorded as unused."""
GENERIC_KEYS = ("transformers_version", "_name_or_path", "_commit_hash", "architectures", "output_hidden_states",
                "output_attentions", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
                "num_labels", "problem_type", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
                "decoder_start_token_id", "use_cache", "dtype", "torch_dtype")
"""Keys the base config class takes for every model (its own fields and the keys it consumes, the dtype's two
spellings) and the token ids every model's config class defines, that change no tensor, stored layout or
computation of a model built for a forward pass: recorded as published where the family's config has no field for
them, at any depth (each nested config is a config too), though the base class's file names them. The dtype is
recorded so only where the family reads its storage dtype from another key (a wrapper config's text_config.dtype);
where the family names one spelling, the other is read as it (explorer/model/config_defaults.py). return_dict is not
among them: set false, the reference's forward fails (its models read their inner outputs by attribute).
tests/test_config_defaults.py sets each on tiny models: the parameter tree and the logits stay the same."""
BASE_FILES = ("configuration_utils.py", "modeling_rope_utils.py", "modeling_utils.py")
"""The transformers files every config class and model reads keys through."""


def unknown_keys(cls: type, config: dict[str, Any], prefix: str = "") -> list[str]:
    """The keys of `config` that the config dataclass `cls` has no field for, dotted below nested tables it reads
    as dataclasses ("text_config.some_key"); a free-form table (dict[str, Any]) has none."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    out = []
    for key, value in config.items():
        if key not in fields and not known_spelling(fields, key):
            out.append(prefix + key)
        elif isinstance(value, dict):
            out += _unknown_below(hints[key], value, f"{prefix}{key}.")
    return sorted(out)


def _unknown_below(hint: Any, value: dict[str, Any], prefix: str) -> list[str]:
    """Unknown keys inside a table read as a dataclass (alone or in a union with None), or as a table of them
    (a compressed-tensors config's config_groups)."""
    if typing.get_origin(hint) is dict:
        inner = typing.get_args(hint)[1]
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            return [k for name, v in value.items() if isinstance(v, dict)
                    for k in unknown_keys(inner, v, f"{prefix}{name}.")]
        return []
    alternatives = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for candidate in alternatives:
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return unknown_keys(candidate, value, prefix)
    return []


def classify(family: Family, config: dict[str, Any], where: str) -> tuple[str, ...]:
    """The config's keys to record as unused (sorted, dotted below nested tables); ContentError lists every key
    that cannot be."""
    unknown = unknown_keys(family.config_class, config)
    problems = [p for key in unknown if _storage_block(key) is None and (p := _why_read(family, key))]
    problems += storage_problems(family, [key for key in unknown if _storage_block(key) is not None])
    if problems:
        raise ContentError([f"{where}: {p}" for p in problems])
    return tuple(unknown)


def unused_problems(family: Family, unused: tuple[str, ...], config: dict[str, Any], where: str) -> list[str]:
    """A recorded config_unused list names only keys nothing reads (an edited list could hide a key the family
    reads, which would then take its default)."""
    unknown = set(unknown_keys(family.config_class, config))
    out = []
    for key in unused:
        if key not in unknown:
            out.append(f"{where}: key 'checkpoint.config_unused': '{key}' is read by the {family.name} family; "
                       "remove it from the list")
        elif why := _why_read(family, key):
            out.append(f"{where}: key 'checkpoint.config_unused': {why}")
    return out


def without_unused(config: dict[str, Any], unused: tuple[str, ...]) -> dict[str, Any]:
    """The config the family reads: the recorded one less the keys recorded as unused (at any depth)."""
    here = {k for k in unused if "." not in k}
    below: dict[str, list[str]] = {}
    for key in unused:
        head, dot, rest = key.partition(".")
        if dot:
            below.setdefault(head, []).append(rest)
    return {k: without_unused(v, tuple(below[k])) if k in below and isinstance(v, dict) else v
            for k, v in config.items() if k not in here}


def _storage_block(key: str) -> str | None:
    """The storage table a dotted key lies in ("text_config.quantization_config"), None where it lies in none."""
    parts = key.split(".")
    at = next((i for i, part in enumerate(parts) if part in STORAGE_KEYS), None)
    return None if at is None else ".".join(parts[:at + 1])


def storage_problems(family: Family, keys: list[str]) -> list[str]:
    """One line per storage table holding keys the family cannot lay out, naming the table (or its one key) and
    where such a config goes: an NVFP4 repack's block is a variant's, not a model's."""
    blocks: dict[str, list[str]] = {}
    for key in keys:
        blocks.setdefault(_storage_block(key) or key, []).append(key)
    out = []
    for block, inside in blocks.items():
        named = inside[0] if len(inside) == 1 else block
        below = sorted(k[len(block) + 1:] for k in inside if k != block)
        listed = f" ({', '.join(below[:4])}{', …' if len(below) > 4 else ''})" if len(inside) > 1 else ""
        out.append(_storage_reason(family, named, listed))
    return out


def _storage_reason(family: Family, named: str, listed: str = "") -> str:
    return (f"key '{named}'{listed}: the {family.name} family predicts no such quantized stored layout, and it "
            "changes how weights are stored, so it is not recorded as unused; add the model from its unquantized "
            "config (this one without the block) with --add-model, and this block with --add-variant BASE "
            "--quant-config FILE where the variant reader takes it")


def _why_read(family: Family, key: str) -> str:
    """Why `key` cannot be recorded as unused ("" where it can)."""
    parts = key.split(".")
    if _storage_block(key) is not None:
        return _storage_reason(family, key)
    if parts[-1] in GENERIC_KEYS:
        return ""
    for path in reference_files(family):
        if _names(path, parts[-1]):
            return (f"key '{key}': transformers reads it ({path.parent.name}/{path.name} names it), but the "
                    f"{family.name} family does not model it, so the model would be built and checked without it")
    return ""


@functools.cache
def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _names(path: Path, key: str) -> bool:
    """Whether the file names `key` as a whole word. A set lookup per key: a regex search of every reference file
    per key cost some 8 ms, so a config of 20,000 unknown keys took minutes (issue 37). A key that is not one word
    (it holds '-' or '.') is searched for only where each of its words is in the file."""
    words = _words(path)
    if _WORD.fullmatch(key):
        return key in words
    if not all(w in words for w in _WORD.findall(key)):
        return False
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(key)}(?![A-Za-z0-9_])", _text(path)) is not None


_WORD = re.compile(r"[A-Za-z0-9_]+")


@functools.cache
def _words(path: Path) -> frozenset[str]:
    return frozenset(_WORD.findall(_text(path)))


@functools.cache
def reference_files(family: Family) -> tuple[Path, ...]:
    """The installed transformers files that define or read the family's reference config: the configuration and
    modeling modules beside its config class, the family's cited modeling file, and the base classes' files."""
    from explorer.model.transformers_files import transformers_file

    root = transformers_file("models")
    defines = f"class {family.reference.config_class}("
    folders = {p.parent for p in root.glob("*/configuration_*.py")  # read once each, not kept (some 550 files)
               if defines in p.read_text(encoding="utf-8")}
    ref = getattr(family, "ref", None)
    if ref is not None:
        folders.add(transformers_file(ref.file).parent)
    own = sorted(p for folder in folders for p in folder.glob("*.py")
                 if p.name.startswith(("configuration_", "modeling_")))
    return tuple(own) + tuple(transformers_file(name) for name in BASE_FILES)


def unused_report(family: Family, unused: tuple[str, ...]) -> list[str]:
    """One line per key recorded as unused, for `--add-model` to print: a misspelled key the family reads would
    be recorded so (as transformers takes it silently), so the nearest key the family reads is named."""
    fields = family_keys(family)
    return [f"{key}: recorded as published and not read (checkpoint.config_unused){did_you_mean(key, fields)}"
            for key in unused]


def family_keys(family: Family) -> frozenset[str]:
    """The top-level keys the family's config reads."""
    return frozenset(f.name for f in dataclasses.fields(family.config_class))
