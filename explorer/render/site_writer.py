"""Render view models to files with Jinja2, into a temporary folder swapped in whole (explorer/render/publish.py):
a failed build leaves the previous site untouched."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from urllib.parse import quote
from xml.etree import ElementTree

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from explorer.errors import OutputError
from explorer.parallel import run_in_order
from explorer.render.publish import check_output, publish, stage
from explorer.views.basics import PageBase
from explorer.views.compare_pages import CompareIndexPage, ComparePage
from explorer.views.component_page import ComponentPage, IndexPage, PageGroup, PartPage, PartsIndexPage, ProsePage
from explorer.views.mathml import take_used
from explorer.views.notation_page import NotationPage

TEMPLATES = {IndexPage: "index.html", ProsePage: "prose.html", ComponentPage: "component.html",
             ComparePage: "compare.html", CompareIndexPage: "compare_index.html",
             PartPage: "part.html", PartsIndexPage: "parts_index.html", NotationPage: "notation.html"}


def environment(template_dir: Path) -> Environment:
    return Environment(loader=FileSystemLoader(template_dir), undefined=StrictUndefined, autoescape=True,
                       keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def render_page(env: Environment, page: PageBase) -> str:
    return env.get_template(TEMPLATES[type(page)]).render(page=page)


FileGroup = Callable[[], dict[str, str]]
"""Files other than pages, made on demand: path -> text."""


def write_site(pages: Sequence[PageGroup], files: Sequence[FileGroup], out_dir: Path, template_dir: Path, static_dir: Path,
               progress: Callable[[str], None] = lambda _: None, jobs: int = 1, site_url: str = "",
               file_costs: Sequence[int] = ()) -> dict[tuple[str, bool], str]:
    """Make and write every group of pages and files (`jobs` groups at a time) into a temporary sibling of
    out_dir, then swap it in whole; sitemap.xml only when `site_url` gives the address its URLs start with.
    file_costs: each file group's work in pages (PageGroup.cost), where known; 1 otherwise.
    Returns every formula the pages used, as converted (explorer/views/mathml_cache.py keeps them for the next build).

    out_dir must have passed publish.check_output, and the caller holds its lock (publish.claim_output).
    """
    out_dir = check_output(out_dir)
    env = environment(template_dir)
    for name in sorted(set(TEMPLATES.values())):  # compiled once here, not again in each page writer
        env.get_template(name)
    tmp = stage(out_dir)
    try:
        paths: list[str] = []
        formulas = take_used()  # any this process converted before the writers fork
        tasks = [partial(_write_pages, env, group, tmp) for group in pages]
        tasks += [partial(_write_files, group, tmp) for group in files]
        costs = [group.cost for group in pages] + [*file_costs, *[1] * (len(files) - len(file_costs))]
        for written, used in run_in_order(tasks, jobs, costs=costs):
            paths += written
            formulas.update(used)
            if written:
                progress(f"rendered {len(paths)} pages")
        shutil.copytree(static_dir, tmp / "static")
        if site_url:
            _write(tmp / "sitemap.xml", sitemap(paths, site_url))
        publish(tmp, out_dir)
        return formulas
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"{out_dir}: cannot write the site: {e.strerror or e} ({e.filename or tmp})") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


Written = tuple[list[str], dict[tuple[str, bool], str]]
"""A task's page paths, in order, and the formulas its process converted for them (mathml.take_used)."""


def _write_pages(env: Environment, group: PageGroup, folder: Path) -> Written:
    """Make a group's pages, write each under `folder`."""
    pages = group.make()
    for page in pages:
        _write(folder / page.path, render_page(env, page))
    return [page.path for page in pages], take_used()


def _write_files(group: FileGroup, folder: Path) -> Written:
    """Write a group's files under `folder`; no page paths (they are not in the sitemap)."""
    for rel, text in group().items():
        _write(folder / rel, text)
    return [], take_used()


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def sitemap(paths: list[str], site_url: str) -> str:
    """The sitemap, written with an XML library so any page path is escaped. The protocol wants absolute URLs,
    and the site may be served under any path, so the address comes from whoever publishes it."""
    base = site_url.rstrip("/") + "/"
    urlset = ElementTree.Element("urlset", xmlns="http://www.sitemaps.org/schemas/sitemap/0.9")
    for path in paths:
        ElementTree.SubElement(ElementTree.SubElement(urlset, "url"), "loc").text = base + quote(path)
    ElementTree.indent(urlset)
    return ElementTree.tostring(urlset, encoding="unicode", xml_declaration=True) + "\n"
