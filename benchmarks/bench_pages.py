#!/usr/bin/env python3
"""Page budget: weight (HTML + CSS + JS, gzip) of the largest pages, and their render time in Chromium as a
ratio to a trivial page loaded in the same run. Build the site first (.venv/bin/python build.py)."""

from __future__ import annotations

import gzip
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "site"
BUDGET = 100_000


def gz(path: Path) -> int:
    return len(gzip.compress(path.read_bytes(), 9))


def load_ms(page, url: str, repeat: int = 3) -> float:
    """Best time from navigation start to the load event."""
    best = float("inf")
    for _ in range(repeat):
        page.goto(url)
        best = min(best, page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"))
    return best


def main() -> None:
    from playwright.sync_api import sync_playwright

    if not (SITE / "index.html").exists():
        sys.exit("build the site first: .venv/bin/python build.py")
    assets = gz(SITE / "static/style.css") + gz(SITE / "static/search.js")
    pages = sorted(SITE.rglob("*.html"), key=lambda p: p.stat().st_size, reverse=True)[:6]
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        trivial = Path(tmp) / "trivial.html"
        trivial.write_text("<!doctype html><title>t</title><p>reference page</p>")
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        reference = load_ms(page, trivial.as_uri())
        print(f"reference: a trivial page loads in {reference:.1f} ms; CSS + JS weigh {assets:,} B gzip")
        print(f"search index (loaded on first search only): {gz(SITE / 'search-index.js'):,} B gzip")
        for path in pages:
            weight = gz(path) + assets
            ms = load_ms(page, path.as_uri())
            status = "within" if weight < BUDGET else "OVER"
            print(f"{path.relative_to(SITE)}: {weight:,} B gzip ({status} the {BUDGET:,} B budget), "
                  f"loads in {ms:.1f} ms = {ms / reference:.1f}× the trivial page")
        browser.close()


if __name__ == "__main__":
    main()
