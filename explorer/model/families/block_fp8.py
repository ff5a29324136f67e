"""Block-wise FP8 checkpoints whose quantization_config may name modules it leaves unquantized
(modules_to_not_convert): MiniMax-M2 and MiMo-V2-Flash. Every linear projection is stored in FP8 with one F32
scale per weight_block_size block (`weight_scale_inv`), unless a pattern names its module; embeddings, norms, router
weights, sinks and the head stay in the model's dtype, as DeepSeek-V3's layout does.

How a pattern names a module follows transformers' quantizers/quantizers_utils.should_convert_module, restated: a
pattern matches a module name from its start up to a module boundary, as a regular expression with the same
boundary, or as a suffix of the name.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from explorer.errors import ContentError
from explorer.model.families.rules import rule_problems
from explorer.model.quantization import pattern_problem
from explorer.spec.storage import BlockFP8, Dense, Storage
from explorer.spec.types import Component

FORMATS = {"e4m3": "F8_E4M3", "float8_e4m3fn": "F8_E4M3", "e5m2": "F8_E5M2", "float8_e5m2": "F8_E5M2"}
"""quantization_config.fmt as published -> the safetensors dtype of the values."""


@dataclass(frozen=True, slots=True)
class FP8QuantizationConfig:
    """config.json "quantization_config" of a block-wise FP8 checkpoint."""

    quant_method: str
    fmt: str = "e4m3"
    activation_scheme: str = "dynamic"
    weight_block_size: tuple[int, int] = (128, 128)
    modules_to_not_convert: tuple[str, ...] | None = None
    """Module-name patterns left in the model's dtype (None: none named)."""


def fp8_problems(q: FP8QuantizationConfig | None) -> list[str]:
    if q is None:
        return []
    return rule_problems([
        (q.quant_method == "fp8", "quantization_config.quant_method", f"must be 'fp8', got {q.quant_method!r}"),
        (q.fmt in FORMATS, "quantization_config.fmt", f"must be one of {', '.join(FORMATS)}, got {q.fmt!r}"),
        (len(q.weight_block_size) == 2 and all(b >= 1 for b in q.weight_block_size),
         "quantization_config.weight_block_size", "must be two positive integers"),
    ]) + [f"key 'quantization_config.modules_to_not_convert': {p}"
          for p in map(pattern_problem, q.modules_to_not_convert or ()) if p]


def fp8_block_storage(q: FP8QuantizationConfig | None) -> Storage | None:
    return None if q is None else BlockFP8(FORMATS.get(q.fmt, "F8_E4M3"), tuple(q.weight_block_size))


BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"
"""Where a pattern's match must end: after a dot, or before one or the end of the name."""


def names_module(pattern: str, module: str) -> bool:
    """Whether a modules_to_not_convert pattern names `module` (prefix or regex up to a module boundary, or suffix)."""
    try:
        matched = re.match(rf"(?:{pattern}){BOUNDARY}", module) is not None
    except re.error:
        matched = False
    return matched or module.endswith(pattern)


def naming_any(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """names_module over all `patterns`, each compiled once and each module's answer kept: a list of hundreds of
    patterns (GLM-5.2-FP8 names 541) outgrows the re module's cache of compiled expressions, and the layout asks
    about every layer's every projection."""
    compiled: list[tuple[str, re.Pattern[str] | None]] = []
    for p in patterns:
        try:
            compiled.append((p, re.compile(rf"(?:{p}){BOUNDARY}")))
        except re.error:
            compiled.append((p, None))

    @functools.cache
    def names(module: str) -> bool:
        return any((c is not None and c.match(module) is not None) or module.endswith(p) for p, c in compiled)
    return names


def keep_named_modules_dense(root: Component, q: FP8QuantizationConfig | None, dtype: str,
                             reference_module: Callable[[str], str], where: str,
                             default_kept: tuple[str, ...] = ()) -> Component:
    """The tree with every FP8 weight whose module a modules_to_not_convert pattern names stored in `dtype`.

    `reference_module` maps a checkpoint module name to the reference's (the names transformers matches against);
    a pattern that names a block kind's module at some of its layers but not all is refused (ContentError).
    `default_kept`: the Linear modules transformers' quantizer keeps when modules_to_not_convert is absent
    (get_keys_to_not_convert: the output embedding, tied weights, and the module of the model's last parameter)."""
    patterns = () if q is None else (default_kept if q.modules_to_not_convert is None else q.modules_to_not_convert)
    if not patterns:
        return root

    names = naming_any(tuple(patterns))

    def named(template: str, layers: tuple[int, ...]) -> bool:
        module = template.rsplit(".", 1)[0].replace("{expert}", "0")
        hits = {names(reference_module(module.format(layer=i))) for i in layers or (0,)}
        if len(hits) > 1:
            raise ContentError([f"{where}: key 'quantization_config.modules_to_not_convert': names {module} at some "
                                "of its layers but not all, which this family does not lay out"])
        return hits.pop()

    def walk(comp: Component) -> Component:
        tensors = tuple(dataclasses.replace(t, storage=Dense(dtype))
                        if isinstance(t.storage, BlockFP8) and named(t.template, _layers(t)) else t
                        for t in comp.tensors)
        return dataclasses.replace(comp, tensors=tensors, children=tuple(walk(c) for c in comp.children))

    return walk(root)


def _layers(t) -> tuple[int, ...]:
    return next((r.values for r in t.ranges if r.var == "layer"), ())
