"""The whole-model picture on each model page, drawn as SVG at build time: the residual stream running down
through every layer (one strip per layer, coloured by block kind: dense or MoE, sliding-window or global), and
the sparsity of a token's path made visible (k of N routed experts lit in each MoE layer).

Input is a small plain description (ModelPicture) built from the spec by `describe`; `draw` only lays it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from .components.blocks import block_layers
from .components.moe import RouterOptions
from .spec.types import Component, ModelSpec

WIDTH = 360


@dataclass(frozen=True, slots=True)
class BlockKind:
    title: str
    css: str
    """"moe", "dense", "sliding", "global" or "linear" (a Gated DeltaNet layer) (colours in style.css)."""
    layers: tuple[int, ...]
    label: str
    """e.g. "MoE · 8 of 384 experts" or "sliding window 1,024"."""


@dataclass(frozen=True, slots=True)
class ModelPicture:
    name: str
    layers: int
    kinds: tuple[BlockKind, ...]
    experts: int
    """Routed experts per MoE layer (0 for a dense model)."""
    active: int
    """Routed experts a token runs per MoE layer."""
    shared: bool
    caption: str


def describe(spec: ModelSpec, name: str) -> ModelPicture:
    """What the picture shows, from the spec alone."""
    stack = spec.root.child("blocks")
    kinds, experts, active, shared = [], 0, 0, False
    if any(b.program == "mixer_block" for b in stack.children):
        return _describe_hybrid(spec, name)
    for block in stack.children:
        router = _first(block, "router") or _first(block, "hash_router") or _keyed(block, "router")  # any library router
        scores = _first(block, "scores") or _first(block, "layer_scores")
        window = getattr(scores.options, "window", None) if scores is not None else None
        chunk = getattr(scores.options, "chunk", None) if scores is not None else None
        if window is None:  # DeepSeek-V4's attention holds its window itself
            window = getattr(getattr(_first(block, "v4_attention"), "options", None), "window", None)
        if router is not None and (isinstance(router.options, RouterOptions) or hasattr(router.options, "experts")):
            o: Any = router.options  # RouterOptions or a library router's own options (experts, k)
            experts, active = o.experts, o.k
            shared = shared or _first(block, "gated_mlp", "shared") is not None
            hashed = " (hash-routed)" if router.program == "hash_router" else ""
            css, label = "moe", f"MoE: {active} of {experts} experts{hashed}"
        else:
            css, label = "dense", "dense feed-forward"
        if window:
            css, label = "sliding", f"{label}, sliding window {window:,}"
        if chunk:
            css, label = "sliding", f"{label}, chunks of {chunk:,}"
        if _first(block, "gated_deltanet") is not None:  # a linear-attention layer: a fixed state, no KV cache
            css, label = "linear", f"Gated DeltaNet (fixed state), {label}"
        elif _first(block, "gated_attention") is not None:
            label = f"gated attention (KV cache), {label}"
        kinds.append(BlockKind(block.title, css, block_layers(block), label))
    layers = sum(len(k.layers) for k in kinds)
    counts = ", ".join(f"{len(k.layers)} {k.label}" for k in kinds)
    mixer = ("a token mixer (Gated DeltaNet or attention)" if any(k.css == "linear" for k in kinds) else "attention")
    caption = f"{layers} blocks ({counts}), each adding {mixer} and a feed-forward network to the residual stream."
    if experts:
        caption += (f" In every MoE block a token runs {active} of {experts} routed experts "
                    f"({100 * active / experts:.1f}%){' plus the shared expert' if shared else ''}; which ones "
                    "depends on the token (the lit squares are one example).")
    return ModelPicture(name, layers, tuple(kinds), experts, active, shared, caption)


def _keyed(comp: Component, key: str) -> Component | None:
    if comp.key == key:
        return comp
    return next((found for c in comp.children if (found := _keyed(c, key)) is not None), None)


HYBRID_KINDS = {"mamba2": ("ssm", "Mamba-2: fixed-size state"), "nope_attention": ("attention", "attention: KV cache"),
                "attention": ("attention", "attention: KV cache"), "relu2_mlp": ("dense", "MLP")}
"""A hybrid layer's mixer program -> (css class, legend label); MoE layers are labelled by their router."""


def _describe_hybrid(spec: ModelSpec, name: str) -> ModelPicture:
    """One-branch layers of several kinds (Nemotron-H's pattern): coloured by what the layer's mixer is."""
    kinds, experts, active, shared = [], 0, 0, False
    for block in spec.root.child("blocks").children:
        mixer = block.children[-1]
        router = _first(block, "router")
        if router is not None and isinstance(router.options, RouterOptions):
            experts, active = router.options.experts, router.options.k
            shared = shared or any(c.key == "shared" for c in mixer.children)
            css, label = "moe", f"MoE: {active} of {experts} experts"
        else:
            css, label = HYBRID_KINDS.get(mixer.program, ("dense", mixer.title))
        kinds.append(BlockKind(block.title, css, block_layers(block), label))
    layers = sum(len(k.layers) for k in kinds)
    counts = ", ".join(f"{len(k.layers)} {k.label}" for k in kinds)
    caption = (f"{layers} layers ({counts}), each one normalised residual branch of the kind its letter in the layer "
               "pattern names; only the attention layers keep a cache that grows with the context.")
    if experts:
        caption += (f" In every MoE layer a token runs {active} of {experts} routed experts "
                    f"({100 * active / experts:.1f}%){' plus the shared expert' if shared else ''}.")
    return ModelPicture(name, layers, tuple(kinds), experts, active, shared, caption)


def _first(comp: Component, program: str, key: str = "") -> Component | None:
    if comp.program == program and (not key or comp.key == key):
        return comp
    for c in comp.children:
        found = _first(c, program, key)
        if found is not None:
            return found
    return None


def draw(p: ModelPicture) -> str:
    """A vertical SVG that fits a 360 px column: embedding, one strip per layer, experts, norm and head."""
    parts: list[str] = []
    y = 8.0
    parts.append(_box(60, y, 240, 28, "Token embedding", "node"))
    y += 40
    strip = max(2.0, min(7.0, 280 / max(p.layers, 1)))
    order = sorted((i, k) for k in p.kinds for i in k.layers)
    top = y
    for i, kind in order:
        parts.append(f'<rect x="60" y="{y:.1f}" width="240" height="{max(strip - 0.8, 1.2):.1f}" '
                     f'class="layer {kind.css}"><title>block {i + 1}: {escape(kind.title)}</title></rect>')
        y += strip
    parts.append(f'<text x="24" y="{(top + y) / 2:.1f}" class="vlabel" transform="rotate(-90 24 {(top + y) / 2:.1f})">'
                 'residual stream</text>')
    y += 10
    legend_y = y
    for kind in p.kinds:
        parts.append(f'<rect x="60" y="{legend_y:.1f}" width="12" height="12" class="layer {kind.css}"/>'
                     f'<text x="78" y="{legend_y + 10:.1f}" class="legend">{len(kind.layers)} × {escape(kind.label)}'
                     '</text>')
        legend_y += 18
    y = legend_y + 4
    if p.experts:
        y = _experts(parts, p, y)
    parts.append(_box(60, y, 240, 28, "Final norm · LM head", "node"))
    parts.insert(0, f'<line x1="30" y1="22" x2="30" y2="{y + 14:.1f}" class="residual"/>')
    y += 36
    return (f'<svg viewBox="0 0 {WIDTH} {y:.0f}" class="model-picture" role="img" '
            f'aria-label="{escape(p.caption)}">' + "".join(parts) + "</svg>")


def _experts(parts: list[str], p: ModelPicture, y: float) -> float:
    per_row = 32 if p.experts > 64 else 16
    cell = 240 / per_row
    lit = {round(j * p.experts / p.active) for j in range(p.active)}  # spread evenly: one example token
    parts.append(f'<text x="60" y="{y + 10:.1f}" class="legend">Routed experts of one MoE block: {p.active} of '
                 f'{p.experts} lit</text>')
    y += 16
    for e in range(p.experts):
        r, c = divmod(e, per_row)
        parts.append(f'<rect x="{60 + c * cell:.1f}" y="{y + r * cell:.1f}" width="{cell - 1:.1f}" '
                     f'height="{cell - 1:.1f}" class="expert{" lit" if e in lit else ""}"/>')
    return y + (-(-p.experts // per_row)) * cell + 10


def _box(x: float, y: float, w: float, h: float, label: str, cls: str) -> str:
    return (f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="5" class="{cls}"/>'
            f'<text x="{x + w / 2}" y="{y + h / 2 + 4}" class="t">{escape(label)}</text>')
