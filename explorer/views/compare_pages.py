"""Comparison pages: one picker page that sets any two models side by side in the reader's browser, from per-model
data files it loads as scripts (so it works from file://), and static pages only for the pairs a model's content
links (model.follows: a predecessor, or the smaller sibling a model scales up), which readers without JavaScript
can open. The site grows by one data file and at most one static page per model, never by a page per pair.

The numbers are the build's: a data file holds the model's parameters by role (explorer/figures/compare_roles.py), derived
figures and config values, and the browser only subtracts them, as the static pages do here (compare_rows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from explorer.figures.calculator import size
from explorer.figures.compare_facts import ArchFact, architecture_facts, changes, facts_data
from explorer.figures.compare_roles import NAMED_ROLES, ROLES, RoleTotals, config_differences, role_totals
from explorer.figures.model_build import ModelBuild
from explorer.figures.stored import STORED_DEFINITION
from explorer.views.basics import Link, PageBase, fmt, page_href
from explorer.views.block_figure import BlockColumnView, compared_columns


@dataclass(frozen=True, slots=True)
class CompareRowView:
    label: str
    left: str
    right: str
    delta: str


@dataclass(frozen=True, slots=True)
class ConfigRowView:
    key: str
    left: str
    right: str
    differs: bool


@dataclass(frozen=True, slots=True)
class ChangeRowView:
    """One architectural difference: its heading and each model's value, linked to the page it is read from."""

    label: str
    left: Link
    right: Link
    """href "" where the model has no such part (the text says "none")."""


@dataclass(frozen=True, slots=True)
class ComparePage(PageBase):
    left: Link
    right: Link
    summary: str
    """What changed, in words: "128 → 64 query heads; 256 → 384 routed experts; no expert groups; no MTP"."""
    changes: tuple[ChangeRowView, ...]
    rows: tuple[CompareRowView, ...]
    total: CompareRowView
    figures: tuple[CompareRowView, ...]
    config: tuple[ConfigRowView, ...]
    note: str
    blocks: tuple[BlockColumnView, ...] = ()
    """Each model's block figures side by side, the parts that differ marked."""


@dataclass(frozen=True, slots=True)
class PickerOption:
    slug: str
    name: str


@dataclass(frozen=True, slots=True)
class CompareIndexPage(PageBase):
    models: tuple[PickerOption, ...]
    """Every model, in site order, for the two pickers."""
    pairs: tuple[tuple[Link, Link, Link], ...]
    """The static comparisons: (followed model, model, comparison page)."""
    stored: str = STORED_DEFINITION
    """What the totals count, in the words every page with the figure uses."""


def compare_path(a: str, b: str) -> str:
    """The static page of a pair, whichever order it is named in: sorted slugs."""
    first, second = sorted((a, b))
    return f"compare/{first}-vs-{second}.html"


def static_pairs(builds: list[ModelBuild]) -> list[tuple[ModelBuild, ModelBuild]]:
    """(followed, follower) for every model whose content names the model it follows."""
    by_slug = {mb.slug: mb for mb in builds}
    return [(by_slug[mb.content.meta.follows], mb) for mb in builds if mb.content.meta.follows in by_slug]


def related_links(builds: list[ModelBuild]) -> dict[str, tuple[Link, ...]]:
    """Per model page: its static comparisons (hrefs from a model page)."""
    out: dict[str, list[Link]] = {mb.slug: [] for mb in builds}
    for a, b in static_pairs(builds):
        href = f"../../{compare_path(a.slug, b.slug)}"
        out[a.slug].append(Link(b.content.meta.name, href))
        out[b.slug].append(Link(a.content.meta.name, href))
    return {slug: tuple(links) for slug, links in out.items()}


# ------------------------------------------------------------------------------------------------ data

def compare_data(mb: ModelBuild, totals: RoleTotals) -> dict[str, Any]:
    """What the picker needs of one model: parameters by role, derived figures, published config values."""
    return {
        "slug": mb.slug, "name": mb.content.meta.name, "href": f"../models/{mb.slug}/index.html",
        "roles": [[role, totals.values[role]] for role in ROLES], "total": totals.total,
        "mechanisms": {role: list(totals.mechanisms.get(role, ())) for role in NAMED_ROLES},
        "figures": [[f.key, f.label, f.value, f.unit] for f in mb.figures.figures],
        "config": [[key, left] for key, left, _, _ in config_differences(mb.content.config, {})],
        "facts": [{**f, "href": f"../models/{mb.slug}/{page_href(f['path'])}"}
                  for f in facts_data(architecture_facts(mb.spec, mb.ledger, mb.figures))],
    }


def compare_data_file(mb: ModelBuild) -> dict[str, str]:
    """compare/data/<slug>.js: the model's comparison data, loaded by the picker with a script tag. Counts are
    written as decimal strings, which the page subtracts as BigInts: a FLOP count can pass 2^53, where a
    JavaScript number stops being exact."""
    data = compare_data(mb, role_totals(mb.spec, mb.ledger))
    data.update(roles=[[role, str(value)] for role, value in data["roles"]], total=str(data["total"]),
                figures=[[key, label, str(value), unit] for key, label, value, unit in data["figures"]])
    text = json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return {f"compare/data/{mb.slug}.js":
            f"(window.EXPLORER_COMPARE=window.EXPLORER_COMPARE||{{}})[{json.dumps(mb.slug)}]={text};\n"}


def compare_rows(left: dict[str, Any], right: dict[str, Any]) -> tuple[list[tuple[str, int, int]],
                                                                      list[tuple[str, int, int, bool]]]:
    """(role rows, figure rows) of two models' data: each (label, left, right), a figure's label ending in its unit
    and with whether it counts bytes (its cells then also read in kB, MB, GB); static/compare.js does the same.
    Role rows are the roles either model has, named with each side's mechanisms where they differ ("Attention:
    Grouped-query attention → Chunked attention"); their deltas add up to the totals' difference."""
    lr, rr = dict(left["roles"]), dict(right["roles"])
    roles = [(_role_label(role, left, right), lr[role], rr[role]) for role in ROLES if lr[role] or rr[role]]
    rf = {key: value for key, _, value, _ in right["figures"]}
    figures = [(f"{label}, in {unit}", int(value), int(rf[key]), unit.startswith("bytes"))
               for key, label, value, unit in left["figures"] if key in rf]
    return roles, figures


def what_changed(left: dict[str, Any], right: dict[str, Any]) -> tuple[str, tuple[ChangeRowView, ...]]:
    """The summary and the rows of two models' data (as the picker composes them in static/compare.js): each
    differing fact, its value in each model linked to that model's component page."""
    found = changes(_facts(left), _facts(right))
    summary = "; ".join(c.phrase for c in found) if found else NOTHING_CHANGED
    lhref, rhref = ({f["key"]: f["href"] for f in m["facts"]} for m in (left, right))
    return summary, tuple(ChangeRowView(c.label, _fact_link(c.left, lhref[c.key]), _fact_link(c.right, rhref[c.key]))
                          for c in found)


def _facts(model: dict[str, Any]) -> tuple[ArchFact, ...]:
    return tuple(ArchFact(**{k: v for k, v in f.items() if k != "href"}) for f in model["facts"])


NOTHING_CHANGED = "No difference in heads, experts, layers, attention, context, vocabulary, MTP, vision or storage."


def _fact_link(fact: ArchFact, href: str) -> Link:
    return Link("none", "") if fact.value is None else Link(fact.value, href)


def _role_label(role: str, left: dict[str, Any], right: dict[str, Any]) -> str:
    a, b = left["mechanisms"].get(role, []), right["mechanisms"].get(role, [])
    if a == b or role not in NAMED_ROLES:
        return role
    return f"{role}: {', '.join(a) or '—'} → {', '.join(b) or '—'}"


# ----------------------------------------------------------------------------------------------- pages

def compare_page(a: ModelBuild, b: ModelBuild) -> ComparePage:
    """The static comparison of a model (right) with the model it follows (left)."""
    left, right = compare_data(a, role_totals(a.spec, a.ledger)), compare_data(b, role_totals(b.spec, b.ledger))
    roles, figures = compare_rows(left, right)
    summary, changed = what_changed(left, right)
    lname, rname = a.content.meta.name, b.content.meta.name
    return ComparePage(
        f"{lname} vs {rname}", f"{lname} and {rname} side by side: what changed, parameters by role, derived "
        "figures, configs.", "../", compare_path(a.slug, b.slug), Link(lname, left["href"]), Link(rname, right["href"]),
        summary, changed,
        tuple(_row(*r) for r in roles), _row("Total", left["total"], right["total"]),
        tuple(_row(*r) for r in figures),  # bytes also in decimal units
        tuple(ConfigRowView(*row) for row in config_differences(a.content.config, b.content.config)),
        note=f"Each row is a role's parameters in each model; Δ is {rname} minus {lname}, and the rows' Δ add up to "
             "the totals' Δ exactly (every stored parameter belongs to one role). " + STORED_DEFINITION,
        blocks=compared_columns((lname, a.spec, a.block_figures), (rname, b.spec, b.block_figures)))


def _row(label: str, left: int, right: int, is_bytes: bool = False) -> CompareRowView:
    if is_bytes:
        return CompareRowView(label, sized(left), sized(right), sized(right - left, signed=True))
    return CompareRowView(label, fmt(left), fmt(right), _signed(right - left))


def sized(n: int, signed: bool = False) -> str:
    """An exact byte count with its size in decimal units beside it: "477,184 (477.18 kB)"; a difference signed."""
    exact = _signed(n) if signed else fmt(n)
    return f"{exact} ({'+' if signed and n > 0 else ''}{size(n)})" if n else exact


def _signed(n: int) -> str:
    return f"+{fmt(n)}" if n > 0 else ("0" if n == 0 else f"−{fmt(-n)}")


def compare_index(builds: list[ModelBuild]) -> CompareIndexPage:
    """The picker page, with the static comparisons listed for readers without JavaScript."""
    pairs = tuple((Link(a.content.meta.name, f"../models/{a.slug}/index.html"),
                   Link(b.content.meta.name, f"../models/{b.slug}/index.html"),
                   Link(f"{a.content.meta.name} vs {b.content.meta.name}", f"../{compare_path(a.slug, b.slug)}"))
                  for a, b in static_pairs(builds))
    return CompareIndexPage("Compare models", "Any two models side by side: what changed, parameters by role with "
                            "exact deltas, derived figures and configs.", "../", "compare/index.html",
                            tuple(PickerOption(mb.slug, mb.content.meta.name) for mb in builds), pairs)
