"""Published quantization configs and which weights they quantize.

compressed-tensors (quant_method "compressed-tensors") names the modules each scheme targets ("Linear": every
nn.Linear) and an ignore list, each entry a module name or, prefixed "re:", a regular expression matched from the
start of the module name (compressed_tensors.utils.match: `re.match`). ModelOpt's hf_quant_config.json names
excluded modules by fnmatch-style globs (exclude_modules). Both are applied here to the tensors of a component tree:
a projection (a component whose program is "linear") is quantized unless its module is excluded, at every layer it
spans; everything else (embeddings, norms, routers, the head built as a head) keeps its dense storage.

The module names matched are the names the quantizer saw, which are not always the reference's: a family gives a
`module_name` function from its tensor templates to those names (Kimi K2.5's text model was quantized on its own,
so "model.language_model.layers.3.mlp" is matched as "model.layers.3.mlp").
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ContentError
from .spec.storage import Storage
from .spec.types import Citation, Component


@dataclass(frozen=True, slots=True)
class QuantizationArgs:
    """compressed-tensors QuantizationArgs as published (config_groups.*.weights)."""

    num_bits: int
    type: str
    symmetric: bool
    strategy: str
    group_size: int | None = None
    dynamic: bool = False
    observer: str | None = None
    observer_kwargs: dict[str, Any] = field(default_factory=dict)
    actorder: str | None = None
    block_structure: Any = None


@dataclass(frozen=True, slots=True)
class ConfigGroup:
    """One scheme of a compressed-tensors config: the module types or names it targets and its weight arguments."""

    targets: tuple[str, ...]
    weights: QuantizationArgs | None = None
    input_activations: Any = None
    output_activations: Any = None


@dataclass(frozen=True, slots=True)
class CompressedTensorsConfig:
    """config.json "quantization_config" with quant_method "compressed-tensors"."""

    quant_method: str
    format: str
    config_groups: dict[str, ConfigGroup]
    ignore: tuple[str, ...] = ()
    kv_cache_scheme: Any = None
    quantization_status: str = ""


def compressed_tensors_problems(q: CompressedTensorsConfig | None, where: str) -> list[str]:
    """What the library can predict: one group of integer weights, pack-quantized, symmetric, grouped, on Linear."""
    if q is None:
        return []
    groups = list(q.config_groups.values())
    w = groups[0].weights if len(groups) == 1 else None
    rules = [
        (q.quant_method == "compressed-tensors", "quant_method", "must be 'compressed-tensors'"),
        (q.format == "pack-quantized", "format", f"must be 'pack-quantized', got {q.format!r}"),
        (len(groups) == 1 and w is not None, "config_groups", "must hold one group with weights"),
        (w is None or (w.type == "int" and w.symmetric and w.strategy == "group" and w.group_size),
         "config_groups.weights", "must be symmetric int weights with strategy 'group' and a group_size"),
        (w is None or w.num_bits in (2, 4, 8), "config_groups.weights.num_bits", "must be 2, 4 or 8"),
        (len(groups) != 1 or groups[0].targets == ("Linear",), "config_groups.targets", "must be ['Linear']"),
    ]
    return [f"key '{where}.{key}': {msg}" for ok, key, msg in rules if not ok]


def ignored(name: str, patterns: tuple[str, ...]) -> bool:
    """compressed-tensors' rule: an entry matches a module by exact name, or "re:<regex>" by re.match."""
    return any(re.match(p[3:], name) if p.startswith("re:") else p == name for p in patterns)


def excluded(name: str, globs: tuple[str, ...]) -> bool:
    """ModelOpt's rule: exclude_modules are fnmatch globs over module names."""
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def quantize_linears(comp: Component, storage: Storage, skip: Callable[[str], bool], citation: Citation,
                     module_name: Callable[[str], str] = lambda n: n) -> Component:
    """The tree with every projection's weight stored as `storage` unless `skip(module name)` holds; a projection
    skipped at some layers and not others is an error (the tree has one storage per tensor template)."""
    if comp.program == "linear":
        tensors = tuple(_quantized(t, storage, skip, module_name) for t in comp.tensors)
        if tensors != comp.tensors:
            return dataclasses.replace(comp, tensors=tensors, citations=comp.citations + (citation,))
        return comp
    children = tuple(quantize_linears(c, storage, skip, citation, module_name) for c in comp.children)
    return dataclasses.replace(comp, children=children) if children != comp.children else comp


def _quantized(t, storage: Storage, skip: Callable[[str], bool], module_name: Callable[[str], str]):
    if not t.template.endswith(".weight") or len(t.shape) != 2:
        return t
    names = [module_name(n.removesuffix(".weight")) for n in _instances(t)]
    skipped = {skip(n) for n in names}
    if len(skipped) > 1:
        raise ContentError([f"{t.template}: the quantization config excludes it at some layers and not at others; "
                            "the library stores one format per tensor template"])
    return t if skipped == {True} else dataclasses.replace(t, storage=storage)


def _instances(t) -> list[str]:
    """Each concrete name of a template ({layer} and {expert} filled from its ranges; the first expert stands for
    all, as patterns do not name experts by index)."""
    layers = next((r.values for r in t.ranges if r.var == "layer"), (None,))
    return [t.template.replace("{expert}", "0").format(layer=layer) if layer is not None
            else t.template.replace("{expert}", "0") for layer in layers]
