"""Golden pages: the reader-visible text of a few pages, equations as their LaTeX, compared line by line with
tests/golden/. `pytest --update-golden` rewrites them; a person reads the diff against ../shared/seeds before
committing it, so any change to a page's claims shows in the commit that makes it.

Each golden is paired with an invariant it cannot hide: the page's accounting rows add up to its total."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
PAGES = ["kimi-k2/blocks.moe.html", "kimi-k2/blocks.dense.mlp.down_proj.html", "kimi-k2/blocks.moe.moe.router.html",
         "deepseek-v3/mtp.html", "llama-3.1-8b/blocks.block.attn.html", "qwen3-8b/blocks.block.attn.html",
         "gpt2/blocks.block.attn.html", "gpt2/blocks.block.attn.c_attn.html"]


class _Text(HTMLParser):
    """Visible text by block, with each math element as its LaTeX (alttext); scripts, styles, SVG and code excerpts
    left out (excerpts are third-party source: they are checked against the installed files, never stored here)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = [""]
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "pre" and self.skip == 0:
            self.lines.append("[code excerpt]")
        if tag in ("script", "style", "svg", "pre") or (tag == "math" and self.skip == 0):
            self.skip += 1
            if tag == "math":
                self.lines[-1] += " $" + (dict(attrs).get("alttext") or "") + "$ "
        if tag in ("p", "li", "tr", "h1", "h2", "h3", "h4", "div", "br", "summary", "figcaption", "pre"):
            self.lines.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "svg", "math", "pre") and self.skip:
            self.skip -= 1

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.lines[-1] += data


def page_text(path: Path) -> str:
    parser = _Text()
    parser.feed(path.read_text(encoding="utf-8"))
    lines = (re.sub(r"\s+", " ", html.unescape(line)).strip() for line in parser.lines)
    return "\n".join(line for line in lines if line) + "\n"


@pytest.mark.parametrize("page", PAGES)
def test_page_text_matches_its_golden(built_site, page, request):
    text = page_text(built_site / "models" / page)
    golden = GOLDEN / page.replace(".html", ".txt")
    if request.config.getoption("--update-golden"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"{golden} is missing: run pytest --update-golden and read the diff"
    assert text == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", PAGES)
def test_golden_pages_rows_add_up(builds, page):
    """The invariant beside each golden: the page's component's rows sum to its per-instance total."""
    slug, rest = page.split("/", 1)
    path = "" if rest == "index.html" else rest.removesuffix(".html")
    account = builds[slug].ledger.accounts[path]
    assert sum(r.value for r in account.rows) == account.per_instance
