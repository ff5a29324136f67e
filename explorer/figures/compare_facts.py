"""What changed between two models, in architectural terms: each model's facts (heads, head widths, experts, layers
by kind, attention kind, context, vocabulary, MTP, vision tower, storage) read once from its component tree, with
their units and the component page each is read from; and the changes between two models, as short phrases
("128 → 64 query heads; no expert groups; no MTP") and as rows linking both models' matching pages.

The facts are computed here, once per model, and shipped in the picker's data files (explorer/views/compare_pages.py);
static/compare.js composes a pair's changes from them with the same rules as `changes` below, so a static page and
the picker say the same thing. Facts are read from the spec's components and their options, not from config keys,
whose names differ from family to family (n_routed_experts, num_local_experts, num_experts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from explorer.figures.model_figures import DerivedFigures
from explorer.model.account import Ledger
from explorer.model.components.base import COMPARISON_ROLES
from explorer.model.components.hyper_connections import HyperOptions
from explorer.model.components.layer_attention import LayerAttentionOptions
from explorer.model.components.mla import MLAOptions
from explorer.model.components.part_facts import facts
from explorer.spec.types import Component, ModelSpec, path_key, walk

VISION_ROLE = "Vision tower and projector"


@dataclass(frozen=True, slots=True)
class ArchFact:
    """One architectural fact of one model, in words with its unit; `value` is None where the model has none."""

    key: str
    label: str
    """Row heading: "Query heads"."""
    value: str | None
    """In words with units: "128 query heads"; None: the model has no such part."""
    count: int | None
    """The number the summary compares ("128 → 64 query heads"); None where the fact is not one number."""
    unit: str
    """The count's unit, plural: "query heads"."""
    noun: str
    """What is gone when the other model lacks it: "no expert groups"."""
    path: str
    """The component page the fact is read from ("" for the model page)."""
    brief: str | None = None
    """The value as the summary names it where no count stands for it ("FP8 (e4m3) with one scale per 128 × 128
    block" of a longer value that gives the share of parameters too)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One fact that differs between two models: the summary's phrase and the row's two sides."""

    key: str
    label: str
    phrase: str
    left: ArchFact
    right: ArchFact


# ---------------------------------------------------------------------------------------------- facts

def architecture_facts(spec: ModelSpec, ledger: Ledger, figures: DerivedFigures) -> tuple[ArchFact, ...]:
    """Every fact of one model, always the same keys in the same order (absent parts have value None)."""
    main = _main_block(spec)
    attn = _first(spec.root, lambda c: COMPARISON_ROLES.get(c.program) == "Attention", main) or \
        _first(spec.root, lambda c: facts(c.program).token_mixer, main)
    moe = _first(spec.root, lambda c: bool(facts(c.program).routed_experts), main)
    return (_layers(spec), _attention_kinds(spec, attn), *_heads(spec, attn), _qk_norm(attn), _norm_placement(main),
            _window(figures), *_experts(spec, moe),
            _streams(spec), _context(figures), _vocabulary(spec), _mtp(spec), _vision(spec), _storage(ledger))


def _fact(key: str, label: str, value: str | None, path: str, count: int | None = None, unit: str = "",
          noun: str = "", brief: str | None = None) -> ArchFact:
    return ArchFact(key, label, value, count, unit, noun or label.lower(), path, brief or value)


def _main_block(spec: ModelSpec) -> tuple[tuple[Component, ...], Component] | None:
    """The kind of block most layers are (ties: the first), whose parts stand for the model's."""
    stack = next((c for c in spec.root.children if c.key == "blocks"), None)
    if stack is None or not stack.children:
        return None
    block = max(stack.children, key=lambda c: c.repeat)  # max keeps the first of equal repeats
    return (spec.root, stack), block


def _first(root: Component, test: Callable[[Component], bool],
           prefer: tuple[tuple[Component, ...], Component] | None = None) -> tuple[str, Component] | None:
    """The first component satisfying `test` in `prefer` (the main block, with its ancestors), else anywhere in the
    model, as (path, component)."""
    for anc, top in ([prefer] if prefer else []) + [((), root)]:
        for a, c in walk(top, anc):
            if test(c):
                return path_key(a, c), c
    return None


def _layers(spec: ModelSpec) -> ArchFact:
    stack = next((c for c in spec.root.children if c.key == "blocks"), None)
    kinds = [c for c in stack.children if c.repeat_label] if stack else []
    total = sum(c.repeat for c in kinds)
    if not kinds:
        return _fact("layers", "Layers by kind", None, "")
    by_kind = ", ".join(f"{c.repeat:,} {c.repeat_label}" for c in kinds)
    text = f"{total:,} layers" + ("" if len(kinds) == 1 else f": {by_kind}")
    return _fact("layers", "Layers by kind", text, "blocks", total, "layers", brief=by_kind)


def _attention_kinds(spec: ModelSpec, attn: tuple[str, Component] | None) -> ArchFact:
    """The token mixers of the main forward pass, in model order: outermost ones only, so neither the MTP
    module's (a classified role) nor a vision tower's attention is counted."""
    titles: dict[str, None] = {}
    for anc, c in walk(spec.root):
        if facts(c.program).token_mixer and not any(COMPARISON_ROLES.get(a.program) for a in anc):
            titles[c.title] = None
    return _fact("attention", "Attention kind", ", ".join(titles) or None, attn[0] if attn else "")


def _option(comp: Component, name: str) -> int | None:
    """A size from the component's options, its LayerShape, or its scores step's options."""
    for c in (comp, *(ch for ch in comp.children if ch.key == "scores")):
        for o in (c.options, getattr(c.options, "shape", None)):
            value = getattr(o, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _heads(spec: ModelSpec, attn: tuple[str, Component] | None) -> tuple[ArchFact, ...]:
    path, comp = attn if attn else ("", None)
    heads = _option(comp, "heads") if comp else None
    kv = _option(comp, "kv_heads") if comp else None
    qk, v, rope = _head_widths(spec, comp) if comp else (None, None, None)
    if qk is None:
        width = brief = None
    elif qk == v:
        width = brief = f"{qk:,} features per head"
    else:
        split = f" ({qk - rope:,} + {rope:,} rotary)" if rope else ""
        width = f"{qk:,} features per query/key head{split}, {v:,} per value head"
        brief = f"{qk:,} (query/key) and {v:,} (value) features per head"
    return (
        _fact("heads", "Query heads", _counted(heads, "query head"), path, heads, "query heads"),
        _fact("kv_heads", "Key/value heads", _counted(kv, "key/value head"), path, kv, "key/value heads"),
        _fact("head_dim", "Head width", width, path, qk if qk == v else None, "features per head", brief=brief),
    )


def _counted(n: int | None, noun: str) -> str | None:
    """"1 key/value head", "8 key/value heads"; None stays None (the model has none)."""
    return None if n is None else f"{n:,} {noun}{'' if n == 1 else 's'}"


def _head_widths(spec: ModelSpec, comp: Component) -> tuple[int | None, int | None, int | None]:
    """(query/key width, value width, rotary part of the query/key width where it is stated apart)."""
    o = comp.options
    if isinstance(o, MLAOptions):  # MLA (and DSA): a query/key head is the unrotated part and the rotary part
        return o.nope + o.rope, o.v, o.rope
    if isinstance(o, LayerAttentionOptions):  # its LayerShape has both widths (MiMo's value heads are narrower)
        return o.shape.qk_head_dim, o.shape.v_head_dim, None
    width = _option(comp, "head_dim")
    if width is None and isinstance(spec.values.get("head_dim"), int):
        width = int(spec.values["head_dim"])  # NoPE attention (Nemotron-H) keeps its width in the config only
    return width, width, None


QK_NORMS = {"per_head": "per head", "across_heads": "across all heads, before the split into heads",
            "l2": "per head, weightless (L2), after the rotation"}
"""LayerAttentionOptions.qk_norm -> how the compare pages say it."""


def _qk_norm(attn: tuple[str, Component] | None) -> ArchFact:
    """Where queries and keys are normalised before their dot product: per head (Qwen3), across all heads (OLMo 2,
    MiniMax-M2), or not at all; read from the attention's options, whichever attention part it is."""
    path, comp = attn if attn else ("", None)
    o = comp.options if comp else None
    if isinstance(o, LayerAttentionOptions):
        text = QK_NORMS.get(o.qk_norm)
    else:  # attention.py's and gated attention's options carry the per-head norm's options, or None
        text = "per head" if getattr(o, "qk_norm", None) is not None else None
    return _fact("qk_norm", "QK-norm", text, path, noun="QK-norm")


def _norm_placement(main: tuple[tuple[Component, ...], Component] | None) -> ArchFact:
    """Where the main block's norms sit on each branch: before it (pre-norm), at both ends (sandwich), or only at
    its end, inside the branch (OLMo 2's post-norm)."""
    if main is None:
        return _fact("norms", "Norm placement", None, "")
    anc, block = main
    keys = {c.key for c in block.children}
    before, after = bool(keys & {"attn_norm", "norm"}), "post_attn_norm" in keys
    if not (before or after):
        return _fact("norms", "Norm placement", None, "")
    text, brief = (("before and after each branch (sandwich)", "sandwich") if before and after else
                   ("before each branch (pre-norm)", "pre-norm") if before else
                   ("after each branch, inside it (no norm before a branch)", "after each branch"))
    return _fact("norms", "Norm placement", text, path_key(anc, block), noun="norm placement", brief=brief)


def _window(figures: DerivedFigures) -> ArchFact:
    """The sliding windows of the layer kinds that have one (as the figures stage derived them), in positions."""
    kinds = [k for k in figures.serving.kinds if k.window]
    windows = sorted({k.window for k in kinds if k.window})
    if not windows:
        return _fact("window", "Sliding window", None, "")
    text = " and ".join(f"{w:,}" for w in windows) + f"-position sliding window{'s' if len(windows) > 1 else ''}"
    return _fact("window", "Sliding window", text, kinds[0].block, windows[0] if len(windows) == 1 else None,
                 "positions of sliding window")


def _streams(spec: ModelSpec) -> ArchFact:
    """Hyper-connections (DeepSeek-V4): parallel residual streams in place of the one residual."""
    hc = _first(spec.root, lambda c: isinstance(c.options, HyperOptions))
    n = hc[1].options.streams if hc and isinstance(hc[1].options, HyperOptions) else None
    return _fact("streams", "Residual streams", None if n is None else f"{n:,} residual streams (hyper-connections)",
                 hc[0] if hc else "", n, "residual streams", "hyper-connections")


def _experts(spec: ModelSpec, moe: tuple[str, Component] | None) -> tuple[ArchFact, ...]:
    path, comp = moe if moe else ("", None)
    router = next((c for c in comp.children if c.key == "router"), None) if comp else None
    o = router.options if router else None
    experts, k = getattr(o, "experts", None), getattr(o, "k", None)
    groups, top_groups = getattr(o, "n_group", 1), getattr(o, "topk_group", 1)
    shared = next((c for c in comp.children if "shared" in c.key), None) if comp else None
    n_shared = int(spec.values.get("n_shared_experts", 1)) if shared else 0
    rpath = f"{path}.router" if router else path
    return (
        _fact("experts", "Routed experts", _counted(experts, "routed expert"), path, experts, "routed experts"),
        _fact("active", "Active experts", None if k is None else f"{_counted(k, 'routed expert')} per token", rpath, k,
              "active experts per token"),
        _fact("shared", "Shared experts", _counted(n_shared, shared.title.lower()) if shared else None,
              f"{path}.{shared.key}" if shared else path, n_shared or None, "shared experts", "shared expert"),
        _fact("groups", "Expert groups", f"{groups:,} expert groups, a token's experts from its top {top_groups:,}"
              if groups > 1 else None, rpath, groups if groups > 1 else None, "expert groups"),
    )


def _context(figures: DerivedFigures) -> ArchFact:
    n = figures.serving.max_context
    return _fact("context", "Maximum context", f"{n:,} tokens", "", n, "tokens of context", "context")


def _vocabulary(spec: ModelSpec) -> ArchFact:
    embed = _first(spec.root, lambda c: COMPARISON_ROLES.get(c.program) == "Token embedding")
    n = int(spec.values["vocab_size"]) if "vocab_size" in spec.values else None
    return _fact("vocab", "Vocabulary", None if n is None else f"{n:,} tokens", embed[0] if embed else "", n,
                 "vocabulary entries")


def _mtp(spec: ModelSpec) -> ArchFact:
    """Multi-token prediction modules: the spec's, or where the spec does not build them (DeepSeek-V4, whose
    reference leaves its MTP layer out) the count the config publishes, shown on the model page."""
    mtp = _first(spec.root, lambda c: COMPARISON_ROLES.get(c.program) == "Multi-token prediction")
    config = getattr(spec.config, "text_config", None) or spec.config
    n, path = (mtp[1].repeat, mtp[0]) if mtp else (int(getattr(config, "num_nextn_predict_layers", 0) or 0), "")
    return _fact("mtp", "Multi-token prediction", _counted(n or None, "MTP module"), path, n or None,
                 "MTP modules", "MTP")


def _vision(spec: ModelSpec) -> ArchFact:
    tower = next((c for c in spec.root.children if COMPARISON_ROLES.get(c.program) == VISION_ROLE), None)
    if tower is None:
        return _fact("vision", "Vision tower", None, "")
    blocks = next((c for c in tower.children if c.repeat > 1), None)
    text = tower.title + (f" of {blocks.repeat:,} {blocks.repeat_label}" if blocks else "")
    return _fact("vision", "Vision tower", text, tower.key)


def _storage(ledger: Ledger) -> ArchFact:
    """How the checkpoint stores the parameters: the format most of them are in, then the others. No shares: a
    share moves with every size (more experts, more FP8), and this fact is about the formats."""
    by_format: dict[str, int] = {}
    for account in ledger.accounts.values():
        for ta in account.tensors:
            if ta.spec.is_parameter and ta.elements:
                s = ta.spec.storage
                name = getattr(s, "stored_as", "") or f"in {s.label}"
                by_format[name] = by_format.get(name, 0) + ta.elements
    ranked = [name for name, _ in sorted(by_format.items(), key=lambda kv: (-kv[1], kv[0]))]
    main = ranked[0].removeprefix("in ").removeprefix("as ")
    rest = ranked[1:]
    text = f"all parameters {ranked[0]}" if not rest else f"most parameters {ranked[0]}, the rest " + \
        (rest[0] if len(rest) == 1 else ", ".join(rest[:-1]) + " and " + rest[-1])
    return _fact("storage", "Stored as", text, "", noun="storage", brief=main)


# -------------------------------------------------------------------------------------------- changes

def changes(left: tuple[ArchFact, ...], right: tuple[ArchFact, ...]) -> tuple[Change, ...]:
    """The facts that differ, in fact order, each with its phrase; static/compare.js applies the same rules."""
    out = []
    for a, b in zip(left, right):
        if a.value != b.value:
            out.append(Change(a.key, a.label, phrase(a, b), a, b))
    return tuple(out)


def phrase(a: ArchFact, b: ArchFact) -> str:
    """"128 → 64 query heads", "no MTP", "adds 1 MTP module", or "attention kind: X → Y"."""
    if b.value is None:
        return f"no {a.noun}"
    if a.value is None:
        return f"adds {b.value}" if b.count is not None else f"adds {b.noun} ({b.value})"
    if a.count is not None and b.count is not None and a.count != b.count:
        return f"{a.count:,} → {b.count:,} {a.unit}"
    if a.brief == b.brief:  # the short forms agree (the same format, another share): say the whole of each
        return f"{a.label.lower()}: {a.value} → {b.value}"
    return f"{a.label.lower()}: {a.brief} → {b.brief}"


def facts_data(facts: tuple[ArchFact, ...]) -> list[dict[str, Any]]:
    """The facts as the picker's data file holds them."""
    return [{"key": f.key, "label": f.label, "value": f.value, "count": f.count, "unit": f.unit, "noun": f.noun,
             "path": f.path, "brief": f.brief} for f in facts]
