"""Published quantization configs and which weights they quantize.

compressed-tensors (quant_method "compressed-tensors") names the modules each scheme targets ("Linear": every
nn.Linear) and an ignore list, each entry a module name or, prefixed "re:", a regular expression matched from the
start of the module name (compressed_tensors.utils.match: `re.match`). ModelOpt's hf_quant_config.json names
excluded modules by fnmatch-style globs (exclude_modules). Both are applied here to the tensors of a component tree:
a projection (a component whose program is "linear") is quantized at each layer where its module is not excluded;
everything else (embeddings, norms, routers, the head built as a head) keeps its dense storage. ModelOpt also
quantizes fused experts (one 3-D tensor for all experts), exporting them as one projection per expert.

The module names matched are the names the quantizer saw, which are not always the reference's: a family gives a
`module_name` function from its tensor templates to those names (Kimi K2.5's text model was quantized on its own,
so "model.language_model.layers.3.mlp" is matched as "model.layers.3.mlp").
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from explorer.errors import ContentError
from explorer.model.components.part_facts import facts
from explorer.spec.storage import Dense, Storage
from explorer.spec.types import Citation, Component, IndexRange, TensorSpec


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
    return ([f"key '{where}.{key}': {msg}" for ok, key, msg in rules if not ok]
            + [f"key '{where}.ignore': {p}" for p in (pattern_problem(e[3:]) for e in q.ignore if e.startswith("re:"))
               if p])


MAX_PATTERN = 300
"""Longest regular expression taken from a config (published ignore entries are under 60 characters)."""
MAX_UNBOUNDED = 3
"""Most unbounded repeats ("*", "+", "{n,}") one pattern may hold: each can make a failed match try every split
of a module name again, so k of them cost up to (name length)^k steps per name."""


def pattern_problem(pattern: str) -> str:
    """Why a regular expression from a config could take unbounded time to match, or cannot be compiled; "" if
    neither. Matching time is bounded by refusing what backtracks exponentially: a repeat inside a repeat
    ("(.*)*X", "(a+)+"), an alternation or a backreference inside a repeat, and more than MAX_UNBOUNDED
    unbounded repeats; module names are at most a few hundred characters, so what is left is polynomial."""
    import re._parser as sre  # the parse `re` compiles from: the pattern's structure, not a guess at its text

    shown = pattern[:60] + ("…" if len(pattern) > 60 else "")
    if len(pattern) > MAX_PATTERN:
        return f"pattern {shown!r}: longer than {MAX_PATTERN} characters"
    try:
        parsed = sre.parse(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        return f"pattern {shown!r}: not a regular expression ({getattr(e, 'msg', e)})"
    unbounded = 0

    def walk(items, in_repeat: bool) -> str:
        nonlocal unbounded
        for op, av in items:
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
                low, high, body = av
                if in_repeat and high > 1:
                    return "a repeat inside a repeat (nested quantifiers backtrack exponentially)"
                unbounded += high == sre.MAXREPEAT
                if found := walk(body, in_repeat or high > 1):
                    return found
            elif op == sre.BRANCH:
                if in_repeat:
                    return "an alternation inside a repeat (it can backtrack exponentially)"
                for branch in av[1]:
                    if found := walk(branch, in_repeat):
                        return found
            elif op in (sre.GROUPREF, sre.GROUPREF_EXISTS):
                return "a backreference (matching one can take exponential time)"
            elif op == sre.SUBPATTERN:
                if found := walk(av[-1], in_repeat):
                    return found
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                if found := walk(av[1], in_repeat):
                    return found
            elif op == sre.ATOMIC_GROUP:
                if found := walk(av, in_repeat):
                    return found
        return ""

    why = walk(parsed, False)
    if not why and unbounded > MAX_UNBOUNDED:
        why = f"{unbounded} unbounded repeats (at most {MAX_UNBOUNDED}, so that matching stays bounded)"
    return f"pattern {shown!r}: {why}; refused, so that matching stays bounded" if why else ""


def ignored(name: str, patterns: tuple[str, ...]) -> bool:
    """compressed-tensors' rule: an entry matches a module by exact name, or "re:<regex>" by re.match. Every
    "re:" entry was checked by pattern_problem (compressed_tensors_problems) before a name is matched."""
    return any(_compiled(p[3:]).match(name) if p.startswith("re:") else p == name for p in patterns)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    if problem := pattern_problem(pattern):  # a caller that skipped the check gets one line, not a hang
        raise ContentError([f"key 'ignore': {problem}"])
    return re.compile(pattern)


def excluded(name: str, globs: tuple[str, ...]) -> bool:
    """ModelOpt's rule: exclude_modules are fnmatch globs over module names."""
    return _any_glob(globs).match(name) is not None


@functools.lru_cache(maxsize=64)
def _any_glob(globs: tuple[str, ...]) -> re.Pattern[str]:
    """The globs as one pattern (fnmatchcase's own translation): a variant asks of every projection of every layer."""
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs) or "(?!)")


def quantize_linears(comp: Component, storage: Storage, skip: Callable[[str], bool], citation: Citation,
                     module_name: Callable[[str], str] = lambda n: n,
                     fused_experts: dict[str, int | float] | None = None) -> Component:
    """The tree with every projection's weight stored as `storage` unless `skip(module name)` holds. A projection
    skipped at some layers and not at others becomes two tensor families, one per set of layers.

    fused_experts: the config values, where the quantizer splits fused experts (one 3-D tensor for all experts,
    `experts.gate_up_proj` [E, 2I, H], `experts.up_proj` [E, I, H], `experts.down_proj` [E, H, I]) into one
    projection per expert on export, as ModelOpt does (export/moe_utils.py `_export_fused_experts`: the per-expert
    `experts.{e}.gate_proj`, `up_proj`, `down_proj`, each quantized like a Linear); None leaves them as they are."""
    tensors = comp.tensors
    if facts(comp.program).quantized_linear:
        tensors = tuple(q for t in tensors for q in _quantized(t, storage, skip, module_name))
    if fused_experts is not None:
        tensors = tuple(q for t in tensors for q in _split_fused(t, storage, skip, module_name, fused_experts))
    children = tuple(quantize_linears(c, storage, skip, citation, module_name, fused_experts) for c in comp.children)
    if tensors == comp.tensors and children == comp.children:
        return comp
    cite = comp.citations + (citation,) if tensors != comp.tensors else comp.citations
    return dataclasses.replace(comp, tensors=tensors, children=children, citations=cite)


def _quantized(t: TensorSpec, storage: Storage, skip: Callable[[str], bool],
               module_name: Callable[[str], str]) -> tuple[TensorSpec, ...]:
    """The tensor with `storage`, left as it is where skipped; split by layer where skipped at some layers only."""
    if not t.template.endswith(".weight") or t.shape is None or len(t.shape) != 2:
        return (t,)
    skipped = {layer: skip(module_name(name.removesuffix(".weight"))) for layer, name in _instances(t)}
    kept = tuple(layer for layer, s in skipped.items() if s)
    if len(kept) == len(skipped):
        return (t,)
    quantized = dataclasses.replace(t, storage=storage)
    if not kept:
        return (quantized,)
    done = tuple(layer for layer, s in skipped.items() if not s)
    return (_at_layers(t, kept), _at_layers(quantized, done))


def _at_layers(t: TensorSpec, layers: tuple[int | None, ...]) -> TensorSpec:
    """The tensor family at some of its layers only (a family without layers is never split: None stands for
    its one instance)."""
    kept = tuple(layer for layer in layers if layer is not None)
    return dataclasses.replace(t, ranges=tuple(IndexRange("layer", kept) if r.var == "layer" else r for r in t.ranges))


FUSED_EXPERTS = {"gate_up_proj": ("gate_proj", "up_proj"), "up_proj": ("up_proj",), "down_proj": ("down_proj",)}
"""A fused experts tensor's name -> the per-expert projections it holds, stacked along its output axis."""


def _split_fused(t: TensorSpec, storage: Storage, skip: Callable[[str], bool], module_name: Callable[[str], str],
                 values: dict[str, int | float]) -> tuple[TensorSpec, ...]:
    """A fused experts tensor [E, out, in] as the quantizer exports it: per expert and projection a weight
    [out / parts, in] with `storage`, at the layers not skipped; the fused tensor where skipped."""
    owner, _, leaf = t.template.rpartition(".experts.")
    if leaf not in FUSED_EXPERTS or t.shape is None or len(t.shape) != 3 or "{expert}" in t.template:
        return (t,)
    if t.layout != "out_in":
        raise ContentError([f"{t.template}: fused experts stored input-major; the library splits [E, out, in] only"])
    from explorer.model.account import evaluate

    experts = IndexRange("expert", tuple(range(evaluate(t.shape[0], values))))
    parts = FUSED_EXPERTS[leaf]
    split = tuple(dataclasses.replace(t, template=f"{owner}.experts.{{expert}}.{p}.weight",
                                      shape=(t.shape[1] / len(parts), t.shape[2]), ranges=t.ranges + (experts,),
                                      storage=storage) for p in parts)
    skipped = {layer: any(skip(module_name(name.removesuffix(".weight"))) for s in split
                          for name in [s.template.replace("{expert}", "0").format(layer=layer)])
               for layer in _layers(t)}
    kept = tuple(layer for layer, s in skipped.items() if s)
    done = tuple(layer for layer, s in skipped.items() if not s)
    if not done:
        return (t,)
    out = split if not kept else tuple(_at_layers(s, done) for s in split)
    return ((_at_layers(t, kept),) if kept else ()) + out


def _layers(t: TensorSpec) -> tuple[int | None, ...]:
    return next((r.values for r in t.ranges if r.var == "layer"), (None,))


def _instances(t: TensorSpec) -> list[tuple[int | None, str]]:
    """(layer, concrete name) of a template at each layer ({expert} filled with 0: the first expert stands for
    all, as patterns do not name experts by index)."""
    template = t.template.replace("{expert}", "0")
    return [(layer, template.format(layer=layer) if layer is not None else template) for layer in _layers(t)]


def dequantized(comp: Component, storage: Storage) -> Component:
    """The tree with every tensor a quantized base stores in another scheme (FP8 blocks) stored as `storage`: a
    variant re-exported from the base's weights keeps what its config leaves out in its own dtype."""
    tensors = tuple(t if isinstance(t.storage, Dense) else dataclasses.replace(t, storage=storage)
                    for t in comp.tensors)
    children = tuple(dequantized(c, storage) for c in comp.children)
    if tensors == comp.tensors and children == comp.children:
        return comp
    return dataclasses.replace(comp, tensors=tensors, children=children)
