"""Links between a page's equations and its data-flow diagram: a term and the diagram part that produces or holds it
share an id, so hovering or focusing either lights both (static/links.js), as on the seed's down-projection page.

Nothing in a component's LaTeX is tagged by hand: the page's own inputs and outputs are the diagram's "in" and "out"
boxes, and each child's outputs are that child's box. A symbol is found in an equation's MathML as a whole token
sequence (`m` is never the m of \\mathrm, nor the base of m_i, which is another symbol), so renaming a symbol in a
component renames it in the links too. The diagram writes the same symbols, converted from the same LaTeX.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import lru_cache

from .diagrams import FlowNode, drawn_ops, op_id
from .flows import layout
from .mathml import to_mathml
from .spec.types import Component
from .symbols import body

NS = "http://www.w3.org/1998/Math/MathML"
ET.register_namespace("", NS)
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
    """The links of the component's page, with the ops its diagram draws (explorer/flows.py chooses them)."""
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
    if not links:
        return mathml
    math = ET.fromstring(mathml)
    symbols = sorted(((_symbol(t.latex), t) for t in links), key=lambda s: -len(repr(s[0])))
    tagged = sum(_tag(math[0][0], seq, link) for seq, link in symbols if seq)
    if not tagged:
        return mathml
    # only the formula's body is re-serialised: its alttext and TeX annotation stay byte for byte as converted
    out = ET.tostring(math, encoding="unicode", short_empty_elements=False)
    start, end = "<semantics>", "<annotation"
    return (mathml[:mathml.index(start) + len(start)] + out[out.index(start) + len(start):out.index(end)]
            + mathml[mathml.index(end):])


def _tag(el: ET.Element, seq: tuple[Canon, ...], link: TermLink) -> int:
    """Wrap each run of el's children that spells the symbol; look inside the others. The base of a script is not
    matched itself (m in m_i is another symbol), though an expression inside it is."""
    if el.get("data-light") is not None:
        return 0
    kids, count, i = list(el), 0, 0
    while i < len(kids):
        run = kids[i:i + len(seq)]
        if not (el.tag in _SCRIPTED and i == 0) and _may_start(kids[i], seq[0]) \
                and tuple(_canon(c) for c in run) == seq:
            _wrap(el, run, link)
            count, i = count + 1, i + len(seq)
            continue
        count += _tag(kids[i], seq, link)
        i += 1
    return count


def _may_start(el: ET.Element, first: Canon) -> bool:
    """Whether el's tag and text are those of the symbol's first token: a cheap test that spares building the
    structure of every token that cannot match (most of them)."""
    return el.tag == first[0] and (el.text or "").strip() == first[2]


def _wrap(parent: ET.Element, run: list[ET.Element], link: TermLink) -> None:
    at = list(parent).index(run[0])
    wrapper = ET.Element(_MROW, {"class": "term", "data-light": link.part, "tabindex": "0",
                                 "aria-description": f"{link.label} in the diagram"})
    for c in run:
        parent.remove(c)
        wrapper.append(c)
    wrapper.tail, run[-1].tail = run[-1].tail, None
    parent.insert(at, wrapper)
