"""Links between a page's equations and its data-flow diagram: a term and the diagram part that produces or holds it
share an id, so hovering or focusing either lights both (static/links.js), as on the seed's down-projection page.

Nothing in a component's LaTeX is tagged by hand: the page's own inputs and outputs are the diagram's "in" and "out"
boxes, and each child's outputs are that child's box. A symbol is found in an equation's MathML as a whole token
sequence (`m` is never the m of \\mathrm, nor the base of m_i, which is another symbol), so renaming a symbol in a
component renames it in the links too. The diagram writes the same symbols, converted from the same LaTeX.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import lru_cache

from explorer.spec.types import Component
from explorer.views.diagrams import FlowNode, drawn_ops, op_id
from explorer.views.flows import layout
from explorer.views.mathml import to_mathml
from explorer.views.symbols import NS, body

_SCRIPTED = {f"{{{NS}}}{t}" for t in ("msub", "msup", "msubsup", "mover", "munder", "munderover")}
"""The base of one of these is part of another symbol (m in m_i, u in û) and is not linked on its own."""
_MROW = f"{{{NS}}}mrow"
IN, OUT = "flow-in", "flow-out"
"""Ids of the diagram's input and output boxes; a child's box is `part_id(child.key)`."""


@dataclass(frozen=True, slots=True)
class TermLink:
    """A symbol of the page's equations and the diagram part it lights."""

    latex: str
    part: str
    """The ids it shares with diagram parts (data-light: one id on a part, space-separated on a term)."""
    label: str
    """What the part is, for the term's accessible description."""


def part_id(key: str) -> str:
    return "flow-" + re.sub(r"[^A-Za-z0-9_-]", "-", key)


def term_links(comp: Component, ops: tuple[str, ...] = ()) -> tuple[TermLink, ...]:
    """The page's linkable symbols, each with every part that holds or produces it: the in and out boxes (the page's
    own ports), the child that outputs it, the op that draws the step it is the result of (`ops`, step names)."""
    owners: dict[str, list[tuple[str, str]]] = {}
    for ports, part, label in ((comp.inputs, IN, "input"), (comp.outputs, OUT, "output")):
        for p in ports:
            owners.setdefault(p.latex, []).append((part, label))
    for child in comp.children:
        for p in child.outputs:
            owners.setdefault(p.latex, []).append((part_id(child.key), child.title))
    steps = {s.name: s for s in comp.steps + comp.equations if s.name and not s.heading}
    for name in ops:
        lhs = steps[name].latex.split("=", 1)[0] if name in steps and "=" in steps[name].latex else ""
        if lhs and "," not in lhs and "\\\\" not in lhs:  # one symbol, not a list of results or lines
            owners.setdefault(lhs, []).append((op_id(name), "the " + name.replace("-", " ") + " step"))
    return tuple(TermLink(latex, " ".join(dict.fromkeys(p for p, _ in found)),
                          ", ".join(dict.fromkeys(label for _, label in found)))
                 for latex, found in owners.items())


def page_links(comp: Component) -> tuple[TermLink, ...]:
    """The links of the component's page, with the ops its diagram draws (explorer/views/flows.py chooses them)."""
    return term_links(comp, tuple(drawn_ops(layout(comp, lambda c: FlowNode(c.title, ())))))


Canon = tuple[object, ...]


def _canon(el: ET.Element) -> Canon:
    """An element's structure without positions or tails, for comparing a symbol with an equation's tokens."""
    return (el.tag, tuple(sorted(el.attrib.items())), (el.text or "").strip(), tuple(_canon(c) for c in el))


@lru_cache(maxsize=None)
def _symbol(latex: str) -> tuple[Canon, ...]:
    """The token sequence a symbol's LaTeX converts to (one element for most symbols)."""
    return tuple(_canon(c) for c in body(to_mathml(latex)))


@lru_cache(maxsize=8192)
def tag_terms(mathml: str, links: tuple[TermLink, ...]) -> str:
    """The MathML with each linked symbol wrapped in a focusable <mrow data-light=...>; unchanged when none occurs.
    Cached: a block's page repeats its children's steps with the same links, page after page of a model."""
    by_first: dict[tuple[str, str], list[tuple[tuple[Canon, ...], TermLink]]] = {}
    text = html.unescape(mathml)  # latex2mathml writes ℓ as &#x02113;
    for seq, link in sorted(((_symbol(t.latex), t) for t in links), key=lambda s: -len(repr(s[0]))):
        # a symbol whose first token's text is absent cannot occur (latex2mathml writes a token's text unpadded)
        if seq and f">{seq[0][2]}<" in text:
            by_first.setdefault((str(seq[0][0]), str(seq[0][2])), []).append((seq, link))
    if not by_first:
        return mathml
    math = ET.fromstring(mathml)
    if not _tag(math[0][0], by_first):
        return mathml
    # only the formula's body is re-serialised: its alttext and TeX annotation stay byte for byte as converted
    out = ET.tostring(math, encoding="unicode", short_empty_elements=False)
    start, end = "<semantics>", "<annotation"
    return (mathml[:mathml.index(start) + len(start)] + out[out.index(start) + len(start):out.index(end)]
            + mathml[mathml.index(end):])


def _tag(el: ET.Element, by_first: dict[tuple[str, str], list[tuple[tuple[Canon, ...], TermLink]]]) -> int:
    """Wrap each run of el's children that spells a symbol (the longest symbol first where several start at one
    child); look inside the others, in one walk for every symbol. The base of a script is not matched itself (m in
    m_i is another symbol), though an expression inside it is."""
    if el.get("data-light") is not None:
        return 0
    kids, count, i = list(el), 0, 0
    while i < len(kids):
        matched = 0
        if not (el.tag in _SCRIPTED and i == 0):
            for seq, link in by_first.get((kids[i].tag, (kids[i].text or "").strip()), ()):
                run = kids[i:i + len(seq)]
                if tuple(_canon(c) for c in run) == seq:
                    _wrap(el, run, link)
                    matched = len(seq)
                    break
        if matched:
            count, i = count + 1, i + matched
            continue
        count += _tag(kids[i], by_first)
        i += 1
    return count


def _wrap(parent: ET.Element, run: list[ET.Element], link: TermLink) -> None:
    at = list(parent).index(run[0])
    wrapper = ET.Element(_MROW, {"class": "term", "data-light": link.part, "tabindex": "0",
                                 "aria-description": f"{link.label} in the diagram"})
    for c in run:
        parent.remove(c)
        wrapper.append(c)
    wrapper.tail, run[-1].tail = run[-1].tail, None
    parent.insert(at, wrapper)
