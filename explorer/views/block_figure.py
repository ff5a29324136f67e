"""The block figure (explorer/figures/block_figures.py) drawn as inline SVG: the residual stream down the left, each
branch's parts stacked on the main line with their parameters per block, the branch added back at a ⊕ (or mixed
back into the hyper-connected streams), and the mixer's and feed-forward's kind in the words of the whole-model
picture (model_picture.mixer_kind, ffn_kind), so that both pictures name a layer alike.

Colours come from classes (the stylesheet's theme variables); the viewBox and `width: 100%` fit a phone. A part
marked as differing (compare pages) gets a heavier dashed outline and a "≠" in its corner, and its title says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from explorer.figures.block_figures import NORMS, STREAM_MIXING, BlockFigure, BlockPart, Branch
from explorer.spec.types import Component, ModelSpec, path_key, walk
from explorer.views.basics import fmt
from explorer.views.diagrams import wrap
from explorer.views.model_picture import ffn_kind, layer_list, mixer_kind

WIDTH = 360
STREAM_X, BOX_X, BOX_W = 14.0, 34.0, 322.0
MID = BOX_X + BOX_W / 2
NORM_H, LINE = 22.0, 13.0
FFN_ROLES = ("Mixture of experts", "Feed-forward (dense)")


@dataclass(frozen=True, slots=True)
class BlockFigureView:
    svg: str
    caption: str


def part_words(spec: ModelSpec, figure: BlockFigure) -> dict[str, str]:
    """Part path -> its kind in the whole-model picture's words (the mixer's and the feed-forward's)."""
    block = _component(spec, figure.path)
    local = any(_has(b, "window") or _has(b, "chunk") for b in spec.root.child("blocks").children)
    words: dict[str, str] = {}
    for branch in figure.branches:
        for p in branch.parts:
            if p.token_mixer:
                words[p.path] = mixer_kind(block, local).label + heads_words(p.heads)
            elif p.role in FFN_ROLES:
                words[p.path] = ffn_kind(block).label
    return words


def heads_words(heads: tuple[int, int] | None) -> str:
    """" · 32 query heads, 8 KV heads"; " · 12 heads" where each query head has its own key and value."""
    if heads is None:
        return ""
    q, kv = heads
    if q == kv:
        return f" · {q:,} heads"
    return f" · {q:,} query heads, {kv:,} KV head{'s' if kv != 1 else ''}"


def _component(spec: ModelSpec, path: str) -> Component:
    return next(c for a, c in walk(spec.root) if path_key(a, c) == path)


def _has(block: Component, field: str) -> bool:
    return any(getattr(c.options, field, None) for _, c in walk(block))


def block_figure_view(spec: ModelSpec, figure: BlockFigure, differs: frozenset[str] = frozenset()) -> BlockFigureView:
    """The figure of one block kind; `differs`: the parts to mark (by path). No part is a link: an SVG with role
    "img" is one image to assistive technology, so links inside it could not be reached (the pages link each part
    in their own lists)."""
    words = caption(figure)
    return BlockFigureView(draw(figure, part_words(spec, figure), words, differs), words)


def caption(f: BlockFigure) -> str:
    """The figure in words: its layers, each branch's parts in order, the parameters per block and over the kind."""
    layers = layer_list(f.layers, f.model_layers)
    branches = "; ".join(" → ".join(p.title for p in b.parts) + (", mixed back into the streams" if b.mixes_streams
                                                                 else ", added back to the residual stream")
                         for b in f.branches)
    own = f" The block's own tensors: {fmt(f.own_params)}." if f.own_params else ""
    return (f"{f.title} ({layers}, numbered from 0 as the tensor names count them): {branches}. "
            f"{fmt(f.params)} parameters per block, {fmt(f.total)} over its {len(f.layers)} "
            f"layer{'s' if len(f.layers) != 1 else ''}, from the ledger.{own}")


# ------------------------------------------------------------------------------------------------------ drawing

def _kind(p: BlockPart) -> str:
    if p.role == NORMS:
        return "norm"
    if p.role == STREAM_MIXING:
        return "hc"
    if p.token_mixer:
        return "mixer"
    return "ffn" if p.role in FFN_ROLES else "other"


def draw(f: BlockFigure, words: dict[str, str], label: str, differs: frozenset[str] = frozenset()) -> str:
    """The block as SVG: the stream's input, each branch with its parts and its add (or mix), the output."""
    out = [f'<text x="{MID}" y="12" class="io">x in (residual stream)</text>']
    y = 20.0
    for branch in f.branches:
        y = _branch(out, branch, words, differs, y)
    out.append(_arrow(y, y + 12))
    out.append(f'<text x="{MID}" y="{y + 24:.1f}" class="io">x out · {fmt(f.params)} params per block</text>')
    return (f'<svg viewBox="0 0 {WIDTH} {y + 30:.0f}" class="block-figure" role="img" aria-label="{escape(label)}">'
            f'<title>{escape(f.title)}</title>' + "".join(out) + "</svg>")


def _branch(out: list[str], b: Branch, words: dict[str, str], differs: frozenset[str], y: float) -> float:
    fork = y + 6
    out.append(_arrow(y, fork + 8))
    out.append(f'<circle cx="{MID}" cy="{fork:.1f}" r="2.5" class="fork"/>')
    y = fork + 8
    for p in b.parts:
        y = _part(out, p, words.get(p.path, ""), p.path in differs, y)
        out.append(_arrow(y, y + 10))
        y += 10
    join = y + 8
    mixes = b.mixes_streams
    out.append(f'<path d="M{MID} {fork:.1f} H{STREAM_X} V{join:.1f} H{MID - 9}" class="residual"/>')
    out.append(f'<circle cx="{MID}" cy="{join:.1f}" r="8" class="add"/><text x="{MID}" y="{join + 4:.1f}" '
               f'class="op">{"⇄" if mixes else "+"}</text>')
    out.append(f'<text x="{MID + 14}" y="{join + 4:.1f}" class="opnote">'
               f'{"mixed back into the streams" if mixes else "added to the residual stream"}</text>')
    return join + 8


def _part(out: list[str], p: BlockPart, detail: str, differs: bool, y: float) -> float:
    kind = _kind(p)
    lines = wrap(detail, BOX_W - 16, 5.6) if detail else []
    h = NORM_H if kind == "norm" else NORM_H + 4 + LINE * len(lines)
    cls = f"part {kind}" + (" differs" if differs else "")
    note = " (differs from the other model)" if differs else ""
    box = (f'<rect x="{BOX_X}" y="{y:.1f}" width="{BOX_W}" height="{h:.1f}" rx="4"/>'
           f'<text x="{BOX_X + 8}" y="{y + 15:.1f}" class="name">{escape(p.title)}{"  ≠" if differs else ""}</text>'
           f'<text x="{BOX_X + BOX_W - 8}" y="{y + 15:.1f}" class="params">{fmt(p.params)}</text>'
           + "".join(f'<text x="{BOX_X + 8}" y="{y + 15 + LINE * (i + 1) + 2:.1f}" class="detail">{escape(t)}</text>'
                     for i, t in enumerate(lines)))
    out.append(f'<g class="{cls}"><title>{escape(p.title)}: {fmt(p.params)} parameters{note}</title>{box}</g>')
    return y + h


def _arrow(y1: float, y2: float) -> str:
    return f'<line x1="{MID}" y1="{y1:.1f}" x2="{MID}" y2="{y2:.1f}" class="main"/>'


# ------------------------------------------------------------------------------------------------ compare pages

@dataclass(frozen=True, slots=True)
class BlockColumnView:
    """One model's block figures on a compare page."""

    name: str
    figures: tuple[BlockFigureView, ...]


def _signatures(spec: ModelSpec, figures: tuple[BlockFigure, ...]) -> dict[str, tuple[str, str, str]]:
    """Part path -> what the comparison matches on: its compare row, its title and its kind in words (a window, a
    ratio, experts run of experts); for a norm, its kind and whether it comes before or after its branch's body (a
    family's name for it, "Pre-mixer RMSNorm" or "Attention RMSNorm", is no difference). Never its parameters,
    which differ between any two sizes of one design."""
    out: dict[str, tuple[str, str, str]] = {}
    for f in figures:
        words = part_words(spec, f)
        for b in f.branches:
            body = next((i for i, p in enumerate(b.parts) if p.role not in (NORMS, STREAM_MIXING)), len(b.parts))
            for i, p in enumerate(b.parts):
                out[p.path] = ((p.role, "pre" if i < body else "post", p.norm) if p.role == NORMS
                               else (p.role, p.title, words.get(p.path, "")))
    return out


def compared_columns(left: tuple[str, ModelSpec, tuple[BlockFigure, ...]],
                     right: tuple[str, ModelSpec, tuple[BlockFigure, ...]]) -> tuple[BlockColumnView, ...]:
    """Both models' block figures, each part marked that no block of the other model has in the same kind; each
    side is (model name, spec, block figures)."""
    sides = (left, right)
    sigs = [_signatures(spec, figures) for _, spec, figures in sides]
    columns = []
    for i, (name, spec, figures) in enumerate(sides):
        other = set(sigs[1 - i].values())
        differs = frozenset(path for path, sig in sigs[i].items() if sig not in other)
        columns.append(BlockColumnView(name, tuple(block_figure_view(spec, f, differs) for f in figures)))
    return tuple(columns)
