"""The whole-model picture on each model page, drawn as SVG at build time: every layer as a numbered cell, coloured
by its attention kind (full or global, sliding window, chunked, NoPE, latent, sparse, compressed, Gated DeltaNet,
Mamba-2), with a bar for its feed-forward (MoE or dense); the vision tower that feeds the token sequence, the
multi-token prediction module, and one MoE layer's experts with those lit that the model's router program selected
for an example token (explorer/execute/picture_routing.py), beside the shared expert.

Layer kinds are read from the spec's block kinds, which each family builds from its config's layer pattern
(layer_types, hybrid_override_pattern, no_rope_layers, compress_ratios, the sliding-window interval): each block
kind stands for the layers its tensors' {layer} range names, so the picture draws exactly the layers the family
built, and a wrong pattern shows as a wrong cell. `describe` says what to show; `draw` only lays it out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from html import escape
from typing import Any

from explorer.execute.picture_routing import PictureRouting, is_router
from explorer.model.components.base import COMPARISON_ROLES, tensor_prefix
from explorer.model.components.blocks import block_layers
from explorer.model.components.layer_pattern import runs
from explorer.model.components.part_facts import BlockView, facts
from explorer.spec.types import Component, ModelSpec, walk
from explorer.views.diagrams import wrap

WIDTH = 360
LABEL_W = 46
"""Left column holding each row's layer numbers."""
ROW_H, GAP = 26.0, 2.0
VISION_WORDS = ("vision", "visual", "projector")


@dataclass(frozen=True, slots=True)
class Kind:
    """What a layer does, as the legend names it."""

    css: str
    """Colour class: "full", "global", "sliding", "chunked", "nope", "mla", "dsa", "csa", "hca", "linear", "mamba",
    "none" (attention); "moe", "moe hashed", "dense", "none" (feed-forward)."""
    label: str


@dataclass(frozen=True, slots=True)
class BlockKind:
    """One block kind of the spec and the layers it stands for."""

    title: str
    mixer: Kind
    ffn: Kind
    layers: tuple[int, ...]
    """0-based."""


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
    vision: tuple[str, ...]
    """The parts that turn an image into tokens (tower, projector), in order; () for a text-only model."""
    mtp: str
    """The multi-token prediction module's title ("" where there is none)."""
    routing: PictureRouting | None
    caption: str
    first_layer: str = "model.layers.0"
    """The first layer's module as the tensor names spell it (backbone.layers.0 for Nemotron-H, h.0 for GPT-2)."""

    def layer_kinds(self) -> list[BlockKind]:
        """The block kind of every layer, in depth order."""
        by_layer = {i: k for k in self.kinds for i in k.layers}
        return [by_layer[i] for i in sorted(by_layer)]


def describe(spec: ModelSpec, name: str, routing: PictureRouting | None = None) -> ModelPicture:
    """What the picture shows, from the spec (and the routing run for it, where the model has experts)."""
    blocks = spec.root.child("blocks").children
    local = any(_window(b) or _chunk(b) for b in blocks)
    kinds = tuple(BlockKind(b.title, mixer_kind(b, local), ffn_kind(b), block_layers(b)) for b in blocks)
    routers = [r for b in blocks if (r := _router(b)) is not None]
    first: Any = routers[0].options if routers else None  # RouterOptions or a library router's own (experts, k)
    experts, active = (first.experts, first.k) if first is not None else (0, 0)
    shared = any("shared" in c.key for b in blocks for _, c in walk(b))
    vision = tuple(c.title for c in spec.root.children if any(w in c.key or w in c.program for w in VISION_WORDS))
    mtp = next((c.title for c in spec.root.children if facts(c.program).mtp), "")
    layers = sum(len(k.layers) for k in kinds)
    picture = ModelPicture(name, layers, kinds, experts, active, shared, vision, mtp, routing, "",
                           first_layer_module(blocks))
    return replace(picture, caption=caption(picture))  # the caption says in words what the rest of it holds


def first_layer_module(blocks: tuple[Component, ...]) -> str:
    """The module of layer 0 as the checkpoint names it: the common prefix of its block's tensor names."""
    first = min(blocks, key=lambda b: min(block_layers(b), default=0))
    return tensor_prefix(first).format(layer=min(block_layers(first), default=0)).rstrip(".")


def _programs(block: Component) -> dict[str, Component]:
    """The first component of each program inside a block."""
    found: dict[str, Component] = {}
    for _, c in walk(block):
        found.setdefault(c.program, c)
    return found


def _option(block: Component, field: str) -> Any:
    """The first non-empty value of an options field inside the block (a window, a chunk, a ratio)."""
    for _, c in walk(block):
        value = getattr(c.options, field, None)
        if value:
            return value
    return None


def _window(block: Component) -> int | None:
    return _option(block, "window")


def _chunk(block: Component) -> int | None:
    return _option(block, "chunk") if _declares(block, "reads_chunk") else None


def _declares(block: Component, fact: str) -> bool:
    """Whether a part inside the block declares the fact (part_facts.PartFacts)."""
    return any(getattr(facts(program), fact) for program in _programs(block))


def mixer_kind(block: Component, local: bool) -> Kind:
    """The layer's token mixer; `local`: whether the model also has windowed or chunked layers (so that its full
    layers are its global ones)."""
    progs = _programs(block)
    # a part that draws its own cell declares it (`picture`, part_facts.py); the lowest picture_rank wins
    ranked = sorted((facts(p).picture_rank, p) for p in progs if facts(p).picture is not None)
    if ranked:
        drawn = facts(ranked[0][1]).picture_kind(BlockView(frozenset(progs), lambda name: _option(block, name)))
        if drawn is not None:
            return Kind(*drawn)
    # attention programs are those registered in the compare pages' Attention row (any other mixer is a
    # recurrent state: Gated DeltaNet, Mamba-2), so a new attention program needs no second list here
    if not any(COMPARISON_ROLES.get(program) == "Attention" for program in progs):
        return Kind("none", "no attention (feed-forward only)")
    window, chunk = _window(block), _chunk(block)
    if window:
        return Kind("sliding", f"sliding window {window:,}")
    if chunk:
        return Kind("chunked", f"chunked ({chunk:,}-token chunks), RoPE")
    gated = " (gated)" if _declares(block, "gated_output") else ""
    if not _declares(block, "rotary") and _declares(block, "positions_from_child"):
        return Kind("nope", f"{'global' if local else 'full'}{gated}, no position encoding (NoPE)")
    return Kind("global", f"global (full){gated}") if local else Kind("full", f"full attention{gated}")


def _router(block: Component) -> Component | None:
    """The block's router (the first, as the picture_routing stage tells one)."""
    return next((c for _, c in walk(block) if is_router(c)), None)


def ffn_kind(block: Component) -> Kind:
    router = _router(block)
    if router is not None:
        o: Any = router.options
        hashed = " (hash-routed)" if facts(router.program).hashed_router else ""
        shared = " + shared expert" if any("shared" in c.key for _, c in walk(block)) else ""
        beside = " beside a dense MLP" if _declares(block, "beside_dense_mlp") else ""
        return Kind("moe hashed" if hashed else "moe", f"MoE: {o.k} of {o.experts} experts{hashed}{shared}{beside}")
    if _declares(block, "dense_mlp"):
        return Kind("dense", "dense MLP")
    return Kind("none", "no feed-forward")


def caption(p: ModelPicture) -> str:
    """The picture in words: every kind with its layer numbers, the vision tower, MTP and the routing shown."""
    parts = [f"{p.layers} layers, numbered 0–{p.layers - 1} from the embedding up, as the tensor names count them "
             f"({p.first_layer} is the first)."]
    for side in ("mixer", "ffn"):
        for kind, layers in _by_label(p, side).items():
            if kind.css != "none" or side == "mixer":
                parts.append(f"{_sentence_case(kind.label)}: {layer_list(layers, p.layers)}.")
    if p.vision:
        parts.append(f"Images enter through: {' → '.join(p.vision)}; its outputs join the token sequence.")
    if p.mtp:
        parts.append(f"{p.mtp}: predicts one more token from the last layer's output.")
    if p.routing is not None:
        r = p.routing
        parts.append(f"Lit experts: the {len(r.selected)} of {r.experts} that this model's router program selected "
                     f"in layer {r.layer} for one example token, run at full size on the CPU with a seeded random "
                     "hidden state and seeded random router weights, as the checkpoint's weights are not loaded: the "
                     "rule and the count are the model's, which experts is an example."
                     + (" The shared expert runs for every token." if p.shared else ""))
    return " ".join(parts)


def layer_list(layers: tuple[int, ...], total: int) -> str:
    """Layer numbers counted from 0 as the tensor names count them, compressed where they repeat: "layers 5, 11, …,
    59 (every 6th)", "every layer except 3, 7, …, 47 (every 4th)", else runs ("layers 0–2, 6")."""
    every = _progression(layers)
    if every:
        return f"layers {every}"
    rest = tuple(i for i in range(total) if i not in set(layers))
    every = _progression(rest)
    if every and len(layers) > 1:
        return f"every layer except {every}"
    return ("layer " if len(layers) == 1 else "layers ") + runs(layers)


def _progression(layers: tuple[int, ...]) -> str:
    """"6, 12, …, 60 (every 6th)" for evenly spaced layers (four or more, a step of two or more), else ""."""
    if len(layers) < 4 or len({b - a for a, b in zip(layers, layers[1:])}) != 1 or layers[1] - layers[0] < 2:
        return ""
    step = layers[1] - layers[0]
    return f"{layers[0]}, {layers[1]}, …, {layers[-1]} (every {_ordinal(step)})"


def _ordinal(n: int) -> str:
    """2nd, 6th, 11th, 21st, 112th."""
    return f"{n}{'th' if 11 <= n % 100 <= 13 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _sentence_case(label: str) -> str:
    return label[0].upper() + label[1:]


def _by_label(p: ModelPicture, side: str) -> dict[Kind, tuple[int, ...]]:
    out: dict[Kind, list[int]] = {}
    for k in p.kinds:
        out.setdefault(getattr(k, side), []).extend(k.layers)
    return {kind: tuple(sorted(layers)) for kind, layers in out.items()}


# ------------------------------------------------------------------------------------------------------ drawing

def per_row(kinds: list[BlockKind]) -> int:
    """Cells per row: a whole number of the layer pattern's periods where it repeats (6 for Gemma 3's five sliding
    and one global), so each row reads as the same pattern; else ten, so rows start at 1, 11, 21."""
    n = len(kinds)
    if len({(k.mixer, k.ffn) for k in kinds}) > 1:
        for period in range(2, 13):
            if n > period and all((kinds[i].mixer, kinds[i].ffn) == (kinds[i + period].mixer, kinds[i + period].ffn)
                                  for i in range(n - period)):
                return period * (12 // period)
    return 10


def draw(p: ModelPicture) -> str:
    """A vertical SVG that fits a 360 px column: vision tower, embedding, numbered layers, legend, experts, head."""
    parts: list[str] = []
    y = 6.0
    if p.vision:
        parts.append(_box(20, y, 320, 26, "Image → " + " → ".join(p.vision), "node vision"))
        parts.append(_arrow(180, y + 26, y + 36))
        y += 36
    parts.append(_box(20, y, 320, 26, "Token embedding" + (" (text and image tokens)" if p.vision else ""), "node"))
    y += 34
    y = _layers(parts, p, y)
    y = _legend(parts, p, y)
    if p.experts:
        y = _experts(parts, p, y)
    if p.mtp:
        parts.append(_box(20, y, 320, 26, f"{p.mtp}: one more token", "node mtp"))
        y += 32
    parts.append(_box(20, y, 320, 26, "Final norm · LM head", "node"))
    y += 32
    return (f'<svg viewBox="0 0 {WIDTH} {y:.0f}" class="model-picture" role="img" '
            f'aria-label="{escape(p.caption)}">' + "".join(parts) + "</svg>")


def _layers(parts: list[str], p: ModelPicture, y: float) -> float:
    order = p.layer_kinds()
    n = per_row(order)
    cell = (WIDTH - LABEL_W - 4) / n
    parts.append(f'<text x="4" y="{y + 9:.1f}" class="legend">Layers (numbered from 0 as the tensor names; colour: '
                 'attention; bar: feed-forward)</text>')
    y += 16
    for row in range(-(-len(order) // n)):
        first, last = row * n, min(len(order), row * n + n) - 1
        parts.append(f'<text x="{LABEL_W - 6}" y="{y + 16:.1f}" class="rowlabel">'
                     f'{first}{"–" + str(last) if last > first else ""}</text>')
        for i in range(first, last + 1):
            parts.append(_cell(LABEL_W + (i - first) * cell, y, cell - GAP, i, order[i]))
        y += ROW_H + GAP
    return y + 6


def _cell(x: float, y: float, w: float, i: int, k: BlockKind) -> str:
    bar = (f'<rect x="{x:.1f}" y="{y + ROW_H - 6:.1f}" width="{w:.1f}" height="6" class="ffn {k.ffn.css}"/>'
           if k.ffn.css != "none" else "")
    return (f'<g class="layer {k.mixer.css}"><title>layer {i}: {escape(k.mixer.label)}; {escape(k.ffn.label)}'
            f'</title><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{ROW_H}" rx="3" class="cell"/>{bar}'
            f'<text x="{x + w / 2:.1f}" y="{y + 13:.1f}" class="num">{i}</text></g>')


def _legend(parts: list[str], p: ModelPicture, y: float) -> float:
    for side in ("mixer", "ffn"):
        for kind, layers in _by_label(p, side).items():
            if side == "ffn" and kind.css == "none":
                continue
            swatch = (f'<g class="layer {kind.css}"><rect x="4" y="{y:.1f}" width="18" height="12" rx="2" '
                      'class="cell"/></g>' if side == "mixer" else
                      f'<rect x="4" y="{y + 6:.1f}" width="18" height="6" class="ffn {kind.css}"/>')
            lines = wrap(f"{kind.label} ({len(layers)})", WIDTH - 34, 5.9)
            parts.append(swatch + "".join(f'<text x="28" y="{y + 10 + 13 * j:.1f}" class="legend">{escape(t)}</text>'
                                          for j, t in enumerate(lines)))
            y += 13 * len(lines) + 5
    return y + 6


def _experts(parts: list[str], p: ModelPicture, y: float) -> float:
    r = p.routing
    n = r.experts if r is not None else p.experts
    lit = set(r.selected) if r is not None else set()
    where = f"layer {r.layer}, " if r is not None else ""
    head = (f"Routed experts ({where}one example token): {len(lit)} of {n} lit" if r is not None else
            f"Routed experts: {p.active} of {n} run per token (none lit: no routing was run)")
    lines = wrap(head, WIDTH - 8, 5.9)
    for j, line in enumerate(lines):
        parts.append(f'<text x="4" y="{y + 10 + 13 * j:.1f}" class="legend">{escape(line)}</text>')
    y += 13 * len(lines) + 4
    cols = 32 if n > 64 else 16
    cell = (WIDTH - 8) / cols
    for e in range(n):
        row, col = divmod(e, cols)
        parts.append(f'<rect x="{4 + col * cell:.1f}" y="{y + row * cell:.1f}" width="{cell - 1:.1f}" '
                     f'height="{cell - 1:.1f}" class="expert{" lit" if e in lit else ""}"/>')
    y += -(-n // cols) * cell + 6
    if p.shared:
        parts.append(f'<rect x="4" y="{y:.1f}" width="{cell * 2 - 1:.1f}" height="{cell - 1:.1f}" '
                     f'class="expert lit shared"/><text x="{8 + cell * 2:.1f}" y="{y + cell - 2:.1f}" '
                     'class="legend">shared expert: every token</text>')
        y += max(cell, 12) + 6
    return y + 4


def _arrow(x: float, y1: float, y2: float) -> str:
    return f'<line x1="{x}" y1="{y1:.1f}" x2="{x}" y2="{y2:.1f}" class="residual"/>'


def _box(x: float, y: float, w: float, h: float, label: str, cls: str) -> str:
    return (f'<rect x="{x}" y="{y:.1f}" width="{w}" height="{h}" rx="5" class="{cls}"/>'
            f'<text x="{x + w / 2}" y="{y + h / 2 + 4:.1f}" class="t">{escape(label)}</text>')
