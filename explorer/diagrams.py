"""Small SVG diagrams generated at build time (no JavaScript): a component's data flow labelled with its
traced shapes, and a model's parameter budget for the index preview."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

BOX_W, BOX_H, GAP = 200, 46, 16
CHAR_W = 6.6
"""Approximate width of one 11 px monospace character, for sizing boxes to their labels."""


@dataclass(frozen=True, slots=True)
class FlowNode:
    """A box: a title and a second line (a shape or a parameter count)."""

    title: str
    detail: str
    href: str = ""


def _box(x: float, y: float, w: float, node: FlowNode, cls: str) -> str:
    rect = (f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{BOX_H}" rx="6" class="{cls}"/>'
            f'<text x="{x + w / 2:.0f}" y="{y + 19:.0f}" class="t">{escape(node.title)}</text>'
            f'<text x="{x + w / 2:.0f}" y="{y + 35:.0f}" class="d">{escape(node.detail)}</text>')
    if node.href:
        return f'<a href="{escape(node.href)}">{rect}</a>'
    return rect


def _width(nodes: list[FlowNode]) -> float:
    longest = max((max(len(n.title), len(n.detail)) for n in nodes), default=10)
    return max(BOX_W * 0.7, longest * CHAR_W + 20)


def _row(nodes: list[FlowNode], y: float, width: float, cls: str) -> tuple[list[str], list[float]]:
    w = _width(nodes)
    total = len(nodes) * w + (len(nodes) - 1) * GAP
    x0 = (width - total) / 2
    xs = [x0 + i * (w + GAP) for i in range(len(nodes))]
    return [_box(x, y, w, n, cls) for x, n in zip(xs, nodes)], [x + w / 2 for x in xs]


def _arrow(x1: float, y1: float, x2: float, y2: float) -> str:
    return f'<path d="M{x1:.0f},{y1:.0f} L{x2:.0f},{y2:.0f}" class="a" marker-end="url(#arrow)"/>'


def flow_svg(title: str, inputs: list[FlowNode], children: list[FlowNode], outputs: list[FlowNode],
             detail: str = "") -> str:
    """Inputs on top, the component (with its children) in the middle, outputs below; arrows between."""
    rows = [inputs, children or [FlowNode(title, detail)], outputs]
    width = max(len(r) * (_width(r) + GAP) for r in rows if r) + 40
    width = max(width, 360)
    y_in, y_mid = 10, 10 + BOX_H + 40
    mid_h = BOX_H + 24 if children else BOX_H
    y_out = y_mid + mid_h + 40
    parts: list[str] = []
    in_boxes, in_x = _row(inputs, y_in, width, "in")
    frame = (f'<rect x="10" y="{y_mid - 12}" width="{width - 20:.0f}" height="{mid_h + 12}" rx="8" class="frame"/>'
             f'<text x="20" y="{y_mid + 2}" class="f">{escape(title)}</text>' if children else "")
    mid_boxes, _ = _row(rows[1], y_mid + (12 if children else 0), width, "mid")
    out_boxes, out_x = _row(outputs, y_out, width, "out")
    parts += in_boxes + [frame] + mid_boxes + out_boxes
    parts += [_arrow(x, y_in + BOX_H, width / 2, y_mid - 14) for x in in_x]
    parts += [_arrow(width / 2, y_mid + mid_h, x, y_out - 2) for x in out_x]
    height = y_out + BOX_H + 10
    return _svg(width, height, ARROW_DEFS + "".join(parts), f"Data flow of {title}")


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
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
            f'height="{height:.0f}" role="img" aria-label="{escape(label)}" class="diagram">{body}</svg>')
