#!/usr/bin/env python3
"""Build-time benchmark: the whole site and each stage, per model and per page.

Prints ratios against a reference measured in the same run: rendering one trivial Jinja page, so numbers
compare across machines of different speed.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(fn, *args, repeat: int = 1):
    best = float("inf")
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn(*args)
        best = min(best, time.perf_counter() - start)
    return best, result


def reference_render() -> None:
    """The unit: one small page through Jinja2 with autoescape, written to disk."""
    from jinja2 import Environment

    env = Environment(autoescape=True)
    template = env.from_string("<html><body>{% for i in items %}<p>{{ i }}</p>{% endfor %}</body></html>")
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(100):
            (Path(tmp) / "page.html").write_text(template.render(items=range(50)))


def main() -> None:
    from explorer.pipeline import Project, build_site

    project = Project(ROOT)
    unit, _ = timed(reference_render, repeat=5)
    unit /= 100
    with tempfile.TemporaryDirectory() as tmp:
        total, builds = timed(build_site, project, Path(tmp) / "site", lambda _: None)
        pages = sum(1 for _ in (Path(tmp) / "site").rglob("*.html"))
    print(f"reference: one trivial page rendered in {unit * 1e3:.3f} ms")
    print(f"whole site: {pages} pages in {total:.2f} s = {total / unit:,.0f} reference pages")
    print(f"per page: {total / pages * 1e3:.1f} ms = {total / pages / unit:,.0f}× a trivial page")
    for mb in builds:
        print(f"  {mb.slug}: {mb.ledger.total:,} parameters")


if __name__ == "__main__":
    main()
