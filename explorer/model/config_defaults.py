"""The reference config class as the contract for keys a published config omits or spells another way.

A published config.json may omit a key its config class defaults (Nemotron-H-56B's file has no head_dim): transformers
takes the class's default, and so does every family here, read from the class's own source in the installed
transformers (`class_defaults`), so no torch is imported to build. A family's typed config keeps its own defaults
for the keys it gives one; a key it requires (no default of its own) takes the reference class's where the class
has a literal one, and is refused as missing where it has none.

A config saved by current transformers spells the storage dtype `dtype`, an older one `torch_dtype`; the base config
class takes either (`dtype` wins where both are given). A family's typed config names one of them: the other
spelling is read as that one (`aliased_dtype`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import types
import typing
from pathlib import Path
from typing import Any

DTYPE_SPELLINGS = ("dtype", "torch_dtype")
"""The base config class's two names of the weights' dtype."""
BASE_CONFIG = ("PreTrainedConfig", "configuration_utils.py")
"""The base class of every transformers config class, and its file."""


def aliased_dtype(cls: type, table: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """`table` with the dtype spelling the dataclass `cls` lacks renamed to the one it has (nested tables read as
    dataclasses likewise); where both are published and `cls` names only one, they must agree."""
    if not dataclasses.is_dataclass(cls):
        return table
    fields = {f.name for f in dataclasses.fields(cls)}
    out = dict(table)
    own = [s for s in DTYPE_SPELLINGS if s in fields]
    if len(own) == 1:
        other = DTYPE_SPELLINGS[1 - DTYPE_SPELLINGS.index(own[0])]
        if other in out:
            value = out.pop(other)
            if own[0] in out and out[own[0]] != value:
                problems.append(f"{where}: key '{other}': {value!r} differs from {own[0]} {out[own[0]]!r} (the same "
                                "setting under its two names)")
            out.setdefault(own[0], value)
    hints = typing.get_type_hints(cls)
    for key, value in table.items():
        nested = nested_dataclass(hints.get(key)) if key in fields else None
        if nested is not None and isinstance(value, dict):
            out[key] = aliased_dtype(nested, value, f"{where}: table '{key}'", problems)
    return out


def known_spelling(fields: set[str], key: str) -> bool:
    """Whether `key` is a dtype spelling read as the other one a dataclass with `fields` has."""
    return key in DTYPE_SPELLINGS and any(s in fields for s in DTYPE_SPELLINGS)


def nested_dataclass(hint: Any) -> type | None:
    """The dataclass a field's type hint reads a table as (alone or in a union with None), or None."""
    alternatives = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for candidate in alternatives:
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def with_class_defaults(cls: type, table: dict[str, Any], source: Any, prefix: str = "") -> dict[str, Any]:
    """`table` with each field `cls` requires (no default of its own) and the table omits taken from the reference
    config class `source(dotted key)` names, where that class gives a literal default; the tables of sub-configs
    (whose keys another config class defaults: text_config) likewise, not a storage block such as
    quantization_config, whose keys no config class defaults."""
    if not dataclasses.is_dataclass(cls):
        return table
    out = dict(table)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if f.name not in table:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            defaults = class_defaults(source(key)) if required else {}
            if f.name in defaults:
                out[f.name] = defaults[f.name]
        elif isinstance(table[f.name], dict) and (nested := nested_dataclass(hints[f.name])) is not None \
                and source(key + ".") != source(key):  # a sub-config (text_config), not a storage block
            out[f.name] = with_class_defaults(nested, table[f.name], source, key + ".")
    return out


@functools.cache
def class_defaults(class_name: str) -> dict[str, Any]:
    """The literal defaults of a transformers config class's fields (its own and its bases', as a dataclass
    inherits them), read from the class statements in the installed package; a default that is no literal (a
    call, a name) is left out, so the key stays required."""
    defaults: dict[str, Any] = {}
    for node in reversed(_class_chain(class_name)):  # the base first, so a subclass's default wins
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                    and statement.value is not None and "ClassVar" not in ast.unparse(statement.annotation):
                try:
                    defaults[statement.target.id] = _published(ast.literal_eval(_default_node(statement.value)))
                except ValueError:
                    defaults.pop(statement.target.id, None)
    return defaults


def _default_node(value: ast.expr) -> ast.expr:
    """The expression that gives a field's default: the value itself, or the `default=` of a validator call
    (`interval(min=0.0, max=1.0)(default=0.02)`, `field(default=...)`)."""
    if isinstance(value, ast.Call):
        return next((k.value for k in value.keywords if k.arg == "default"), value)
    return value


def _published(value: Any) -> Any:
    """A literal default as config.json would hold it (tuples as lists)."""
    return [_published(v) for v in value] if isinstance(value, (tuple, list)) else value


def _class_chain(class_name: str) -> list[ast.ClassDef]:
    """The class statement of `class_name` and of each base it names, up to the base config class."""
    chain: list[ast.ClassDef] = []
    name: str | None = class_name
    while name is not None and len(chain) < 16:
        node = _class_node(name)
        if node is None:
            break
        chain.append(node)
        name = next((b.id for b in node.bases if isinstance(b, ast.Name) and b.id.endswith("Config")), None)
    return chain


def _class_node(name: str) -> ast.ClassDef | None:
    path = _class_index().get(name)
    if path is None:
        return None
    return next((n for n in ast.parse(path.read_text(encoding="utf-8")).body
                 if isinstance(n, ast.ClassDef) and n.name == name), None)


@functools.cache
def _class_index() -> dict[str, Path]:
    """Config class name -> the installed transformers file that defines it (each file read once, not kept)."""
    from explorer.model.transformers_files import transformers_file

    paths = (transformers_file(BASE_CONFIG[1]), *sorted(transformers_file("models").glob("*/configuration_*.py")))
    return {m: path for path in paths
            for m in re.findall(r"^class (\w+Config)\(", path.read_text(encoding="utf-8"), re.M)}
