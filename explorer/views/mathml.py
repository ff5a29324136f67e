"""LaTeX to MathML at build time: math renders with no network and no client-side JavaScript.

Each formula keeps its LaTeX source (a TeX annotation and alttext) for copying and screen readers. Stream
colours are written in LaTeX as \\color{stream-q} and become CSS classes, so themes can restyle them.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from functools import lru_cache

from latex2mathml.converter import convert

from explorer.errors import ContentError

_STREAM = re.compile(r'mathcolor="(stream-[a-z]+)"')
_ROOT = re.compile(r'^<math xmlns="http://www.w3.org/1998/Math/MathML" display="(inline|block)">(.*)</math>$', re.S)
STREAMS = (("stream-q", "query"), ("stream-k", "key"), ("stream-v", "value"), ("stream-context", "context"))


_remembered: dict[str, str] = {}
"""The last build's conversions (explorer/views/mathml_cache.py), keyed "inline:<latex>" or "block:<latex>"."""
_trusted: Callable[[str, bool, str], bool] = lambda latex, display, markup: False  # noqa: E731
_used: dict[tuple[str, bool], str] = {}
"""The formulas this process has used since the last take_used."""


def remember(entries: dict[str, str], holds: Callable[[str, bool, str], bool]) -> None:
    """Use these conversions from the last build where `holds` accepts them (checked on first use, in whichever
    process uses them)."""
    global _trusted
    _remembered.update(entries)
    _trusted = holds


def take_used() -> dict[tuple[str, bool], str]:
    """The formulas used in this process since the last call, for the build to keep (mathml_cache.save)."""
    used = dict(_used)
    _used.clear()
    return used


def to_mathml(latex: str, display: bool = False) -> str:
    """Return a <math> element for a LaTeX formula, with the source as annotation."""
    markup = _cached(latex, display)
    _used[(latex, display)] = markup  # on every use: each build keeps exactly the formulas it used
    return markup


@lru_cache(maxsize=None)
def _cached(latex: str, display: bool) -> str:
    markup = _remembered.get(("block:" if display else "inline:") + latex)
    if markup is None or not _trusted(latex, display, markup):
        markup = _convert(latex, display)
    return markup


def _convert(latex: str, display: bool) -> str:
    try:
        converted = convert(latex, display="block" if display else "inline")
    except Exception as e:  # latex2mathml raises many types; name the formula
        raise ContentError([f"equation {latex!r}: cannot be converted to MathML ({type(e).__name__})"]) from e
    match = _ROOT.match(converted)
    if match is None:
        raise ValueError(f"unexpected MathML for {latex!r}")
    body = _STREAM.sub(r'class="\1"', match.group(2))
    source = html.escape(latex, quote=True)
    return (f'<math xmlns="http://www.w3.org/1998/Math/MathML" display="{match.group(1)}" alttext="{source}">'
            f'<semantics>{body}<annotation encoding="application/x-tex">{source}</annotation></semantics></math>')


def numbers_mathml(numbers: tuple[int, ...], ops: tuple[str, ...]) -> str:
    """MathML for "a × b = c" with thousands separators inside each number (no TeX comma spacing)."""
    latex = "".join(number_latex(n) + (f" {_TEX_OPS[o]} " if o else "") for n, o in zip(numbers, ops + ("",)))
    parts = "".join(f"<mn>{n:,}</mn>" + (f"<mo>{o}</mo>" if o else "") for n, o in zip(numbers, ops + ("",)))
    source = html.escape(latex, quote=True)
    return (f'<math xmlns="http://www.w3.org/1998/Math/MathML" display="inline" alttext="{source}"><semantics>'
            f'<mrow>{parts}</mrow><annotation encoding="application/x-tex">{source}</annotation></semantics></math>')


_TEX_OPS = {"×": r"\times", "=": "="}


def number_latex(n: int) -> str:
    """17059365248 -> 17{,}059{,}365{,}248 (thousands separators that TeX does not space as commas)."""
    return f"{n:,}".replace(",", "{,}")


def product_mathml(factors: tuple[int, ...]) -> str:
    return numbers_mathml(factors, ("×",) * (len(factors) - 1))
