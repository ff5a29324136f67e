"""Formulas converted to MathML kept between builds (.cache/mathml/): latex2mathml was a tenth of a warm build's
page writing, paid again by every page-writing process for the same few thousand formulas.

The page writers start with the entries of the last build; each hands back what it converted with its pages, and
the build rewrites the file with exactly the formulas it used. The file is named by a hash of the package's modules
and latex2mathml's version, so a change to either starts a new one. The cache is not trusted: an entry is used only
if it is what mathml.to_mathml writes around exactly its formula (its TeX annotation and alttext) and holds nothing
but MathML elements without event or link attributes; anything else is converted again. So an edited cache can put
no script, link or other formula on a page; what it cannot be checked for without converting again is an edit
inside a formula's own MathML, as the execution cache's measured numbers cannot: `--no-cache` converts everything."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from explorer.execute.cache import read_strings, strings_file, write_strings
from explorer.views import mathml

FORMAT = 1
_NS = "{http://www.w3.org/1998/Math/MathML}"
_ELEMENTS = frozenset({
    "math", "semantics", "annotation", "mrow", "mi", "mn", "mo", "mtext", "mspace", "ms", "msub", "msup",
    "msubsup", "munder", "mover", "munderover", "mfrac", "msqrt", "mroot", "mstyle", "mpadded", "mphantom",
    "menclose", "mtable", "mtr", "mtd", "mlabeledtr", "merror", "mfenced"})
_ATTRIBUTES = re.compile(r"[a-z][a-z-]*")


def load(folder: Path | None) -> None:
    """Hand the last build's entries to mathml.to_mathml, before the page writers fork (None: no cache)."""
    if folder is not None:
        mathml.remember(read_strings(cache_file(folder)), holds)


def save(folder: Path | None, converted: dict[tuple[str, bool], str]) -> None:
    """Rewrite the cache with `converted`, every formula this build's pages used (None: no cache)."""
    if folder is None:
        return
    path = cache_file(folder)
    entries = {_key(latex, display): markup for (latex, display), markup in converted.items()}
    if entries != read_strings(path):
        write_strings(path, entries)


def holds(latex: str, display: bool, markup: str) -> bool:
    """Whether `markup` is what to_mathml writes around exactly this formula, MathML elements only."""
    source = html.escape(latex, quote=True)
    head = (f'<math xmlns="http://www.w3.org/1998/Math/MathML" display="{"block" if display else "inline"}" '
            f'alttext="{source}"><semantics>')
    tail = f'<annotation encoding="application/x-tex">{source}</annotation></semantics></math>'
    if not (markup.startswith(head) and markup.endswith(tail)):
        return False
    try:
        root = ET.fromstring(markup)
    except ET.ParseError:
        return False
    return all(el.tag.startswith(_NS) and el.tag[len(_NS):] in _ELEMENTS
               and all(_ATTRIBUTES.fullmatch(a) and not a.startswith("on") and a != "href" for a in el.attrib)
               for el in root.iter())


def _key(latex: str, display: bool) -> str:
    return ("block:" if display else "inline:") + latex


def cache_file(folder: Path) -> Path:
    return strings_file(folder, "mathml", FORMAT, "latex2mathml")
