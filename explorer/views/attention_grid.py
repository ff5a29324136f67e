"""The attention-pattern picture of an attention page: the figures stage's grid (explorer/figures/attention_patterns.py)
drawn as inline SVG, query rows × key columns, with a sink column on the left where the layer has sinks and the
compressed entries on the right where it has a compressor; its caption names the sizes drawn and the model's own.

Colours come from classes the stylesheet maps to its theme variables, so the picture reads in light and dark; the
viewBox and `width: 100%` let it shrink to a phone's width. Only layout and words here: every cell is the stage's.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from explorer.figures.attention_patterns import DROPPED, READS, AttentionPattern
from explorer.model.components.part_facts import MaskSpec

CELL = 14.0
"""Side of one cell, in the viewBox's units."""
LEFT, TOP = 30.0, 30.0
"""Room for the query numbers and for the column headings."""
GAP = 6.0
"""Between the sink column, the token columns and the entry columns."""


@dataclass(frozen=True, slots=True)
class AttentionGridView:
    svg: str
    caption: str
    """What the grid shows in words, the sizes drawn and the model's own (also the SVG's accessible name)."""


def attention_grid_view(pattern: AttentionPattern) -> AttentionGridView:
    """The picture of one attention's grid and its caption."""
    words = caption(pattern)
    return AttentionGridView(draw(pattern, words), words)


def kind_words(m: MaskSpec) -> str:
    """The mask's kind, as a heading says it ("sliding window with sinks")."""
    if m.entry_ratio:
        base = ("sliding window and compressed entries selected by an indexer" if m.selected_entries
                else "sliding window and compressed entries")
    elif m.selected_tokens:
        base = "causal, narrowed to the indexer's selection (DeepSeek Sparse Attention)"
    elif m.chunk:
        base = "chunked causal"
    elif m.window:
        base = "sliding window"
    else:
        base = "causal"
    return base + (", with a sink per head" if m.sinks else "")


def caption(p: AttentionPattern) -> str:
    """Every kind in the mask, each with the size drawn beside this layer's."""
    d, m = p.drawn, p.model
    parts = [f"Attention pattern: {kind_words(m)}. Rows are query positions 0–{p.positions - 1}, columns key "
             "positions; a filled cell is a key the query reads."]
    if not (m.window or m.chunk or m.selected_tokens or m.entry_ratio):
        parts.append("Each query reads itself and every earlier position.")
    if m.window:
        parts.append(f"Sliding window: each query reads the {d.window} most recent positions, itself included "
                     f"(drawn with a window of {d.window}; this layer's window is {m.window:,} positions).")
    if m.chunk:
        parts.append(f"Chunked: each query reads the earlier positions of its own chunk (drawn with chunks of "
                     f"{d.chunk}; this layer's chunks are {m.chunk:,} positions).")
    if m.selected_tokens:
        parts.append(f"The lightning indexer keeps the {d.selected_tokens} highest-scoring causal keys per query (all "
                     f"of them while fewer exist; this layer keeps {m.selected_tokens:,}); hollow cells are causal keys "
                     "it drops. Which keys depends on learned scores: the picture ranks them by a fixed illustrative "
                     "score, so it shows how many and where, not which.")
    if m.entry_ratio:
        parts.append(f"The columns after the gap are compressed entries, one per {d.entry_ratio} positions (this "
                     f"layer: one per {m.entry_ratio:,}); a query reads entry w once its window has closed, "
                     f"w < ⌊(t+1)/{d.entry_ratio}⌋.")
    if m.selected_entries:
        parts.append(f"An indexer keeps {d.selected_entries} of the closed entries per query (this layer keeps "
                     f"{m.selected_entries:,}); hollow cells are closed entries it drops, ranked here by a fixed "
                     "illustrative score.")
    if m.sinks:
        parts.append("The column on the left is the sink: one learned logit per head joins every row of the softmax, "
                     "takes probability and gives no value.")
    parts.append(f"Drawn over {p.positions} positions by the model's own mask functions; the real layer runs them at "
                 "its own sizes.")
    return " ".join(parts)


# ------------------------------------------------------------------------------------------------------ drawing

def _columns(p: AttentionPattern) -> list[tuple[float, str]]:
    """(x, kind) of every drawn column: the sink, the tokens, the entries."""
    cols: list[tuple[float, str]] = []
    x = LEFT
    if p.model.sinks:
        cols.append((x, "sink"))
        x += CELL + GAP
    cols += [(x + i * CELL, "token") for i in range(p.positions)]
    x += p.positions * CELL + GAP
    cols += [(x + i * CELL, "entry") for i in range(p.entries)]
    return cols


def draw(p: AttentionPattern, label: str) -> str:
    """The grid as SVG: headings, query numbers, cells, and a legend below."""
    cols = _columns(p)
    width = cols[-1][0] + CELL + 4
    body = [_headings(p, cols)]
    for t, row in enumerate(p.rows):
        y = TOP + t * CELL
        body.append(f'<text x="{LEFT - 4}" y="{y + CELL - 3.5:.1f}" class="qnum">{t}</text>')
        cells = iter(row)
        for x, kind in cols:
            state = "reads" if kind == "sink" else _state(next(cells))
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{CELL - 1.5}" height="{CELL - 1.5}" rx="2" '
                        f'class="{kind} {state}"/>')
    y = TOP + p.positions * CELL + 10
    legend, y = _legend(p, y)
    return (f'<svg viewBox="0 0 {width:.0f} {y:.0f}" class="attention-grid" role="img" '
            f'aria-label="{escape(label)}"><title>{escape(kind_words(p.model))}</title>'
            + "".join(body) + legend + "</svg>")


def _state(cell: str) -> str:
    return "reads" if cell == READS else "dropped" if cell == DROPPED else "hidden"


def _headings(p: AttentionPattern, cols: list[tuple[float, str]]) -> str:
    """"keys →" over the tokens, "sink" and "entries" over theirs, and each fourth key's position."""
    tokens = [x for x, k in cols if k == "token"]
    out = [f'<text x="{tokens[0]:.1f}" y="10" class="axis">keys (positions) →</text>',
           f'<text x="2" y="{TOP - 4}" class="axis">q ↓</text>']
    out += [f'<text x="{tokens[i] + CELL / 2 - 0.75:.1f}" y="{TOP - 4}" class="knum">{i}</text>'
            for i in range(0, p.positions, 4)]
    if p.model.sinks:
        out.append(f'<text x="{cols[0][0] + CELL / 2:.1f}" y="{TOP - 4}" class="knum">κ</text>')
    entries = [x for x, k in cols if k == "entry"]
    if entries:
        out.append(f'<text x="{entries[0]:.1f}" y="10" class="axis">entries</text>')
        out += [f'<text x="{x + CELL / 2 - 0.75:.1f}" y="{TOP - 4}" class="knum">{w}</text>'
                for w, x in enumerate(entries)]
    return "".join(out)


def _legend(p: AttentionPattern, y: float) -> tuple[str, float]:
    items = [("token reads", "read"), ("token hidden", "hidden by the mask")]
    if any(DROPPED in r for r in p.rows):
        items.append(("token dropped", "allowed, dropped by the selection"))
    if p.model.sinks:
        items.append(("sink reads", "sink logit (κ)"))
    if p.entries:
        items.append(("entry reads", "compressed entry read"))
    out = []
    for css, words in items:
        out.append(f'<rect x="{LEFT}" y="{y:.1f}" width="{CELL - 1.5}" height="{CELL - 1.5}" rx="2" class="{css}"/>'
                   f'<text x="{LEFT + CELL + 4}" y="{y + CELL - 3.5:.1f}" class="axis">{escape(words)}</text>')
        y += CELL + 3
    return "".join(out), y + 2
