"""Every page of the site, grouped for the renderer's workers: the front pages, each model's pages, the library
parts across models, and the comparisons. Each group's size grows with one model's pages, never with the number of
pairs of models: a component page links its library part's page (one per part, listing every model built from it)
instead of every other model, and the comparisons are one picker page plus the pairs content names
(explorer/views/compare_pages.py)."""

from __future__ import annotations

from explorer.content.model_content import render_markdown
from explorer.figures.model_build import ModelBuild
from explorer.spec.types import path_key, walk
from explorer.views.basics import Link, PageBase, page_href
from explorer.views.compare_pages import compare_index, compare_page, related_links, static_pairs
from explorer.views.component_page import (
    IndexPage,
    PageGroup,
    PartPage,
    PartsIndexPage,
    ProsePage,
    component_page,
    part_path,
)
from explorer.views.index_page import index_filters, index_groups
from explorer.views.notation_page import notation_page

PartEntries = dict[tuple[str, str], list[tuple[ModelBuild, str, str, str]]]
"""(program, key) -> (model, component path, title, breadcrumb) of every component built from that library part."""


def site_page_groups(builds: list[ModelBuild], how_to_read_md: str, glossary_md: str) -> list[PageGroup]:
    """Every page of the site, in a fixed order."""
    def front() -> list[PageBase]:
        return [
            index_page(builds),
            ProsePage("How to read a page", "A short primer on reading an explorer page.", "", "how-to-read.html",
                      "How to read a page", render_markdown(how_to_read_md)),
            notation_page([mb.spec for mb in builds], render_markdown(glossary_md)),
        ]

    parts = library_parts(builds)
    shared = frozenset(key for key, entries in parts.items() if len({mb.slug for mb, *_ in entries}) > 1)
    related = related_links(builds)

    def model_pages(mb: ModelBuild) -> PageGroup:
        tree = walk(mb.spec.root)
        return PageGroup(lambda: [component_page(mb, anc, comp, related[mb.slug], shared) for anc, comp in tree],
                         len(tree))

    pairs = static_pairs(builds)

    def comparisons() -> list[PageBase]:
        return [*(compare_page(a, b) for a, b in pairs), compare_index(builds)]

    def part_pages() -> list[PageBase]:
        return [*(part_page(key, parts[key]) for key in sorted(shared)), parts_index(parts, shared)]

    # three front pages, but the Notation page reads every step of every model: about a page's work per model
    return [PageGroup(front, 3 + len(builds)), *(model_pages(mb) for mb in builds), PageGroup(part_pages, len(shared) + 1),
            PageGroup(comparisons, len(pairs) + 1)]


def library_parts(builds: list[ModelBuild]) -> PartEntries:
    """Every component below a model's root, by the library part it is built from."""
    out: PartEntries = {}
    for mb in builds:
        for anc, comp in walk(mb.spec.root):
            if anc:
                crumbs = " › ".join(a.crumb or a.title for a in anc[1:])
                out.setdefault((comp.program, comp.key), []).append((mb, path_key(anc, comp), comp.title, crumbs))
    return out


def parts_index(parts: PartEntries, shared: frozenset[tuple[str, str]]) -> PartsIndexPage:
    """Every shared library part, by title, each linked to its page."""
    rows = []
    for key in shared:
        entries = parts[key]
        models = len({mb.slug for mb, *_ in entries})
        rows.append((Link(entries[0][2], part_path(*key).removeprefix("parts/")), f"{key[0]} · {key[1]}",
                     f"in {models} models, {len(entries)} components"))
    rows.sort(key=lambda r: (r[0].text.lower(), r[1]))
    return PartsIndexPage("Library parts", f"The {len(rows)} library parts that two or more models are built from, "
                          "each with every model and component that uses it.", "../", "parts/index.html",
                          tuple(rows))


def part_page(key: tuple[str, str], entries: list[tuple[ModelBuild, str, str, str]]) -> PartPage:
    """One library part across the models built from it, each component linked."""
    program, name = key
    title = entries[0][2]
    models = len({mb.slug for mb, *_ in entries})
    return PartPage(
        f"{title}: one library part in {models} models",
        f"Every component built from the library part '{program}' under the key '{name}', model by model.",
        "../", part_path(program, name), title,
        tuple((Link(mb.content.meta.name, f"../models/{mb.slug}/index.html"),
               Link(comp_title, f"../models/{mb.slug}/{page_href(path)}"), crumbs)
              for mb, path, comp_title, crumbs in entries))


def index_page(builds: list[ModelBuild]) -> IndexPage:
    """The front page: every model, grouped by lab and lineage (explorer/views/index_page.py)."""
    groups = index_groups(builds)
    labs = len(groups)
    return IndexPage("LLM architectures, component by component", "Models explained component by component, with "
                     "exact parameter accounting and pinned sources.", "", "index.html", groups,
                     index_filters(groups),
                     f"{len(builds)} model{'s' if len(builds) != 1 else ''} from {labs} lab{'s' if labs != 1 else ''}")
