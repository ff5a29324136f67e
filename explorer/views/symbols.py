"""A formula as diagram text (explorer/views/diagrams.py draws it): the same MathML the equations show, flattened to
characters, with subscripts and superscripts marked _{…} and ^{…} for the diagram to set small and shifted."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from explorer.views.mathml import to_mathml

NS = "http://www.w3.org/1998/Math/MathML"
ET.register_namespace("", NS)
_MROW = f"{{{NS}}}mrow"


def body(mathml: str) -> ET.Element:
    """The row of tokens inside a <math> element made by explorer/mathml.to_mathml."""
    row = ET.fromstring(mathml)[0][0]
    return row[0] if row.tag == _MROW and len(row) == 1 and row[0].tag == _MROW else row


def symbol_text(latex: str) -> str:
    """A symbol or equation as diagram text: Δ_{ffn}, q̃, m = a ⊙ u."""
    text = "".join(_text(c) for c in body(to_mathml(latex)))
    return _SCRIPT.sub(lambda m: m.group(0).replace(" ", ""), text).strip()


_SCRIPT = re.compile(r"[_^]\{[^{}]*\}")


SPACED = {"=", "+", "−", "⊙", "·", "×"}
"""Operators written with spaces, so a long label wraps between its terms."""


def _sup(text: str) -> str:
    return text if text in ("′", "″") else f"^{{{text}}}"


COMBINING = {"^": "\u0302", "~": "\u0303", "˜": "\u0303", "¯": "\u0304", "‾": "\u0305", "→": "\u20d7", "˙": "\u0307"}


def _text(el: ET.Element) -> str:
    tag = el.tag.split("}")[1]
    kids = list(el)
    if tag in ("msub", "munder") and len(kids) == 2:
        return f"{_text(kids[0])}_{{{_text(kids[1])}}}"
    if tag in ("msup",) and len(kids) == 2:
        return _text(kids[0]) + _sup(_text(kids[1]))
    if tag == "msubsup" and len(kids) == 3:
        return _text(kids[0]) + _sup(_text(kids[2])) + f"_{{{_text(kids[1])}}}"
    if tag == "mo" and (el.text or "").strip() in SPACED:
        return f" {(el.text or '').strip()} "
    if tag == "mover" and len(kids) == 2:
        mark = _text(kids[1])
        return _text(kids[0]) + COMBINING.get(mark, "") if mark in COMBINING else f"{_text(kids[0])}^{{{mark}}}"
    return (el.text or "").strip() + "".join(_text(c) for c in kids)
