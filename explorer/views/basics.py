"""Small pieces every view module shares: a link, the fields every page has, and how numbers, release months,
breadcrumbs and page file names are written."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from explorer.spec.types import Component


@dataclass(frozen=True, slots=True)
class Link:
    text: str
    href: str


@dataclass(frozen=True, slots=True)
class PageBase:
    """Fields every page has."""

    title: str
    description: str
    root: str
    """Relative prefix to the site root ("" or "../../")."""
    path: str
    """Output path relative to the site root."""


def crumb_texts(chain: Sequence[Component]) -> list[str]:
    """Breadcrumb words for a chain of components: a dense model's one block kind is counted like the whole stack
    ("32 transformer blocks"), so a crumb that would repeat the one before it names the component by its title."""
    texts: list[str] = []
    for comp in chain:
        text = comp.crumb or comp.title
        texts.append(comp.title if texts and text == texts[-1] else text)
    return texts


def page_href(path: str) -> str:
    """File name of a component page inside its model folder."""
    return "index.html" if path == "" else f"{path}.html"


def month(released: str) -> str:
    """"2025-07" -> "Jul 2025"; an unrecorded release month is said so."""
    if not released:
        return "release month not recorded"
    return datetime.date.fromisoformat(released + "-01").strftime("%b %Y")


def fmt(n: int) -> str:
    return f"{n:,}"
