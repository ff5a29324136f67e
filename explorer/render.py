"""Render view models to files with Jinja2, into a temporary folder swapped in whole: a failed build leaves
the previous site untouched."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from .views import CompareIndexPage, ComparePage, ComponentPage, IndexPage, PageBase, ProsePage

TEMPLATES = {IndexPage: "index.html", ProsePage: "prose.html", ComponentPage: "component.html",
             ComparePage: "compare.html", CompareIndexPage: "compare_index.html"}


def environment(template_dir: Path) -> Environment:
    return Environment(loader=FileSystemLoader(template_dir), undefined=StrictUndefined, autoescape=True,
                       keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def render_page(env: Environment, page: PageBase) -> str:
    return env.get_template(TEMPLATES[type(page)]).render(page=page)


def write_site(pages: list[PageBase], data_files: dict[str, Any], out_dir: Path, template_dir: Path,
               static_dir: Path, progress: Callable[[str], None] = lambda _: None,
               text_files: dict[str, str] | None = None) -> None:
    """Render every page and data file into a temporary sibling of out_dir, then swap it in."""
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    env = environment(template_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        for i, page in enumerate(pages, 1):
            _write(tmp / page.path, render_page(env, page))
            if i % 25 == 0 or i == len(pages):
                progress(f"rendered {i}/{len(pages)} pages")
        for rel, data in sorted(data_files.items()):
            _write(tmp / rel, json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        for rel, text in sorted((text_files or {}).items()):
            _write(tmp / rel, text)
        shutil.copytree(static_dir, tmp / "static")
        _write(tmp / "sitemap.xml", sitemap(pages))
        _swap(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _swap(new: Path, out_dir: Path) -> None:
    """Replace out_dir by new with two renames, so readers never see a half-written site."""
    old = out_dir.with_name(f".{out_dir.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if out_dir.exists():
        os.rename(out_dir, old)
    os.rename(new, out_dir)
    if old.exists():
        shutil.rmtree(old)


def sitemap(pages: list[PageBase]) -> str:
    """Relative URLs, since the site may be served under any path."""
    urls = "".join(f"  <url><loc>{p.path}</loc></url>\n" for p in pages)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n' + urls + "</urlset>\n")
