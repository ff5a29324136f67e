"""Small SVG diagrams generated at build time (no JavaScript): a component's data flow, drawn top to bottom
(every child a box with its parameters, streams side by side, residual additions as a skip line into ⊕), and
a model's parameter budget for the index preview.

The flow is laid out in a fixed 360-unit width, so it is legible on a 390 px phone without sideways scrolling
and scales up on wider screens. Which shape a component's flow takes is declared in explorer/views/flows.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape

WIDTH = 360
GAP = 22
"""Vertical space between two items, holding the arrow."""
COL_GAP = 10
SKIP = 22
"""Left gutter a residual's skip line runs in."""
TITLE_CHAR, DETAIL_CHAR = 7.0, 6.4
"""Approximate advance of one character of a box's title (12 px sans) and detail (10.5 px mono)."""


@dataclass(frozen=True, slots=True)
class FlowNode:
    """A box: a title, detail lines (parameters, repeat) and the page it opens."""

    title: str
    detail: tuple[str, ...]
    href: str = ""
    params: int | None = None
    """Parameters the box stands for within one instance of the diagram's component (None for inputs)."""
    light: str = ""
    """Id shared with the equation terms this box produces or holds (explorer/views/term_links.py)."""


@dataclass(frozen=True, slots=True)
class Box:
    node: FlowNode


@dataclass(frozen=True, slots=True)
class Op:
    """A step without parameters: an addition, a product, a concatenation."""

    symbol: str
    label: str
    step: str = ""
    """The step the op draws (its name): its result's symbol in the equations lights the op."""


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Item, ...]


@dataclass(frozen=True, slots=True)
class Split:
    """Parallel streams from one input, side by side, each under its name; they rejoin below."""

    columns: tuple[tuple[str, Item], ...]


@dataclass(frozen=True, slots=True)
class Residual:
    """A body whose output is added back to its input: a skip line runs beside it into ⊕."""

    body: Item
    label: str
    step: str = ""


Item = Box | Op | Seq | Split | Residual


@dataclass(frozen=True, slots=True)
class _Drawn:
    height: float
    parts: tuple[str, ...]
    entry: float
    """x where the arrow into the item arrives (at its top)."""
    exit: float
    """x where the arrow out of the item leaves (at its bottom)."""


def wrap(text: str, width: float, char: float) -> list[str]:
    """Break text at spaces into lines that fit width; a word longer than a line stands alone."""
    limit = max(4, int(width / char))
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= limit:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


_SCRIPT = re.compile(r"([_^])\{([^{}]*)\}")
SHIFT = {"_": 3.0, "^": -4.0}


def _rich(text: str) -> str:
    """Escaped SVG text with the symbols' _{sub} and ^{sup} (explorer/symbols.symbol_text) set small and shifted."""
    out, at, shift = [], 0, 0.0
    for m in _SCRIPT.finditer(text):
        if m.start() > at:
            out.append(f'<tspan dy="{-shift:g}">{escape(text[at:m.start()])}</tspan>' if shift else
                       escape(text[at:m.start()]))
            shift = 0.0
        dy = SHIFT[m.group(1)] - shift
        out.append(f'<tspan dy="{dy:g}" class="script">{escape(m.group(2))}</tspan>')
        shift, at = SHIFT[m.group(1)], m.end()
    rest = text[at:]
    if rest:
        out.append(f'<tspan dy="{-shift:g}">{escape(rest)}</tspan>' if shift else escape(rest))
    return "".join(out)


def _text(x: float, y: float, text: str, cls: str, anchor: str = "middle") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" class="{cls}" text-anchor="{anchor}">{_rich(text)}</text>'


def _light(part: str, focusable: bool) -> str:
    """The attributes that link a diagram part with its equation terms (a part that is no link takes focus itself)."""
    if not part:
        return ""
    return f' data-light="{part}"' + (' tabindex="0"' if focusable else "")


def _box(node: FlowNode, x: float, y: float, w: float, cls: str = "mid") -> _Drawn:
    titles = wrap(node.title, w - 12, TITLE_CHAR)
    details = [line for d in node.detail for line in wrap(d, w - 10, DETAIL_CHAR)]
    h = 10 + 15 * len(titles) + 13 * len(details) + 4
    cx = x + w / 2
    parts = [f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" rx="6" class="{cls}"/>']
    parts += [_text(cx, y + 20 + 15 * i, t, "t") for i, t in enumerate(titles)]
    top = y + 20 + 15 * (len(titles) - 1) + 14
    parts += [_text(cx, top + 13 * i, d, "d") for i, d in enumerate(details)]
    body = "".join(parts)
    data = f' data-params="{node.params}"' if node.params is not None else ""
    if node.href:
        body = f'<a href="{escape(node.href)}" class="box"{data}{_light(node.light, False)}>{body}</a>'
    else:
        body = f'<g class="box"{data}{_light(node.light, True)}>{body}</g>'
    return _Drawn(h, (body,), cx, cx)


def _op(op: Op, x: float, y: float, w: float) -> _Drawn:
    cx = x + w / 2
    lines = wrap(op.label, w / 2 - 18, DETAIL_CHAR)
    h = max(24, 13 * len(lines) + 8)
    cy = y + 12
    parts = [f'<g class="op"{_light(op_id(op.step) if op.step else "", True)}><circle cx="{cx:.1f}" cy="{cy:.1f}" r="11"/>{_text(cx, cy + 4.5, op.symbol, "o")}']
    parts += [_text(cx + 18, cy + 4 + 13 * i, line, "d", "start") for i, line in enumerate(lines)]
    if h > 24:  # a label taller than the circle: carry the line on to the item's bottom
        parts.append(f'<path d="M{cx:.1f},{cy + 11:.1f} V{y + h:.1f}" class="a"/>')
    parts.append("</g>")
    return _Drawn(h, ("".join(parts),), cx, cx)


def _arrow(x1: float, y1: float, x2: float, y2: float) -> str:
    """A connector from (x1, y1) down to (x2, y2), with an elbow when the two differ in x."""
    if abs(x1 - x2) < 0.5:
        d = f"M{x1:.1f},{y1:.1f} V{y2:.1f}"
    else:
        mid = (y1 + y2) / 2
        d = f"M{x1:.1f},{y1:.1f} V{mid:.1f} H{x2:.1f} V{y2:.1f}"
    return f'<path d="{d}" class="a" marker-end="url(#arrow)"/>'


def _seq(seq: Seq, x: float, y: float, w: float) -> _Drawn:
    parts: list[str] = []
    top = y
    first: _Drawn | None = None
    prev: _Drawn | None = None
    for item in seq.items:
        drawn = draw(item, x, top, w)
        if prev is not None:
            parts.append(_arrow(prev.exit, top - GAP, drawn.entry, top - 1))
        parts += drawn.parts
        first = first or drawn
        prev = drawn
        top += drawn.height + GAP
    if first is None or prev is None:
        return _Drawn(0, (), x + w / 2, x + w / 2)
    return _Drawn(top - GAP - y, tuple(parts), first.entry, prev.exit)


def _split(split: Split, x: float, y: float, w: float) -> _Drawn:
    n = len(split.columns)
    col_w = (w - COL_GAP * (n - 1)) / n
    cx = x + w / 2
    heads = [wrap(name, col_w, DETAIL_CHAR) for name, _ in split.columns]
    head_h = 13 * max(len(h) for h in heads) + 14
    drawn = [draw(item, x + i * (col_w + COL_GAP), y + head_h + GAP, col_w) for i, (_, item) in
             enumerate(split.columns)]
    body_h = max(d.height for d in drawn)
    join_y = y + head_h + GAP + body_h + 14
    parts: list[str] = [f'<circle cx="{cx:.1f}" cy="{y + 3:.1f}" r="3" class="dot"/>']
    for i, (head, d) in enumerate(zip(heads, drawn)):
        col_x = x + i * (col_w + COL_GAP) + col_w / 2
        parts += [_text(col_x, y + 24 + 13 * j, line, "s") for j, line in enumerate(head)]
        parts.append(f'<path d="M{cx:.1f},{y + 3:.1f} H{col_x:.1f} V{y + 12:.1f}" class="a"/>')
        parts.append(_arrow(col_x, y + head_h, d.entry, y + head_h + GAP - 1))
        parts += d.parts
        bottom = y + head_h + GAP + d.height
        parts.append(f'<path d="M{d.exit:.1f},{bottom:.1f} V{join_y:.1f} H{cx:.1f}" class="a"/>')
    parts.append(f'<circle cx="{cx:.1f}" cy="{join_y:.1f}" r="3" class="dot"/>')
    return _Drawn(join_y - y + 3, tuple(parts), cx, cx)


def _residual(res: Residual, x: float, y: float, w: float) -> _Drawn:
    body = draw(res.body, x + SKIP, y + 14, w - SKIP)
    op = _op(Op("+", res.label, res.step), x + SKIP, y + 14 + body.height + GAP, w - SKIP)
    op_y = y + 14 + body.height + GAP + 12
    fork = body.entry
    skip = (f'<circle cx="{fork:.1f}" cy="{y + 3:.1f}" r="3" class="dot"/>'
            f'<path d="M{fork:.1f},{y + 3:.1f} H{x + 8:.1f} V{op_y:.1f} H{op.entry - 12:.1f}" class="a skip" '
            'marker-end="url(#arrow)"/>')
    parts = (_arrow(fork, y + 3, body.entry, y + 13), *body.parts,
             _arrow(body.exit, y + 14 + body.height, op.entry, y + 14 + body.height + GAP - 1), *op.parts, skip)
    return _Drawn(14 + body.height + GAP + op.height, parts, fork, op.exit)


def draw(item: Item, x: float, y: float, w: float) -> _Drawn:
    """Lay out one item in the column [x, x + w] from y down."""
    if isinstance(item, Box):
        return _box(item.node, x, y, w)
    if isinstance(item, Op):
        return _op(item, x, y, w)
    if isinstance(item, Seq):
        return _seq(item, x, y, w)
    if isinstance(item, Split):
        return _split(item, x, y, w)
    return _residual(item, x, y, w)


def flow_svg(title: str, inputs: FlowNode, body: Item, outputs: FlowNode) -> str:
    """Inputs on top, the component's flow in the middle, outputs at the bottom."""
    x, w = 4.0, WIDTH - 8.0
    top = _box(inputs, x + 30, 4, w - 60, "in")
    mid = draw(body, x, 4 + top.height + GAP, w)
    out_y = 4 + top.height + GAP + mid.height + GAP
    bottom = _box(outputs, x + 30, out_y, w - 60, "out")
    parts = (*top.parts, _arrow(top.exit, 4 + top.height, mid.entry, 4 + top.height + GAP - 1), *mid.parts,
             _arrow(mid.exit, out_y - GAP, bottom.entry, out_y - 1), *bottom.parts)
    return _svg(WIDTH, out_y + bottom.height + 4, ARROW_DEFS + "".join(parts), f"Data flow of {title}")


def op_id(step: str) -> str:
    """The id of the op that draws a step (shared with the step's result in the equations)."""
    return "flow-step-" + re.sub(r"[^A-Za-z0-9_-]", "-", step)


def drawn_ops(item: Item) -> list[str]:
    """The steps drawn as ops, in drawing order."""
    if isinstance(item, Op):
        return [item.step] if item.step else []
    if isinstance(item, Residual):
        return [*drawn_ops(item.body), *([item.step] if item.step else [])]
    if isinstance(item, Seq):
        return [s for i in item.items for s in drawn_ops(i)]
    if isinstance(item, Split):
        return [s for _, i in item.columns for s in drawn_ops(i)]
    return []


def box_params(item: Item) -> list[int]:
    """The parameters of every box drawn, in drawing order (for checking that they add up)."""
    if isinstance(item, Box):
        return [item.node.params] if item.node.params is not None else []
    if isinstance(item, Op):
        return []
    if isinstance(item, Seq):
        return [p for i in item.items for p in box_params(i)]
    if isinstance(item, Split):
        return [p for _, i in item.columns for p in box_params(i)]
    return box_params(item.body)


def budget_svg(name: str, segments: list[tuple[str, int]]) -> str:
    """A horizontal bar of parameter shares, one segment per top-level component (index preview)."""
    total = sum(v for _, v in segments) or 1
    width, bar_y, bar_h = 320, 8, 22
    x = 0.0
    parts = []
    legend_y = bar_y + bar_h + 16
    for i, (label, value) in enumerate(segments):
        w = width * value / total
        parts.append(f'<rect x="{x:.1f}" y="{bar_y}" width="{max(w, 1.5):.1f}" height="{bar_h}" class="s{i % 5}"/>')
        share = 100 * value / total
        shown = f"{share:.1f}%" if share >= 0.1 else "< 0.1%"
        parts.append(f'<rect x="0" y="{legend_y + i * 16 - 9}" width="10" height="10" class="s{i % 5}"/>'
                     f'<text x="16" y="{legend_y + i * 16}" class="l">{escape(label)}: {shown}</text>')
        x += w
    height = legend_y + len(segments) * 16
    return _svg(width, height, "".join(parts), f"Parameter budget of {name}")


ARROW_DEFS = ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
              'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="ah"/></marker></defs>')


def _svg(width: float, height: float, body: str, label: str) -> str:
    # An image's children are presentational, so links inside one would be unreachable: a diagram with links is a
    # labelled group instead (axe: nested-interactive).
    role = "group" if "<a " in body or "tabindex" in body else "img"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
            f'height="{height:.0f}" role="{role}" aria-label="{escape(label)}" class="diagram">{body}</svg>')
