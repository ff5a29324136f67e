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
    left out (excerpts are third-party source: they are checked against the installed files, never stored here).
    A value measured on the building machine (class "measured": a max |Δ|, a worked example's float32 digits)
    reads as [measured]: its last digits depend on the CPU's kernels, so no golden may hold them (issue 18)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = [""]
        self.skip = 0
        self.measured: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.measured is None and "measured" in (dict(attrs).get("class") or "").split():
            self.measured = tag
            self.lines[-1] += "[measured]"
        if tag == "pre" and self.skip == 0:
            self.lines.append("[code excerpt]")
        if tag in ("script", "style", "svg", "pre") or (tag == "math" and self.skip == 0):
            self.skip += 1
            if tag == "math":
                self.lines[-1] += " $" + (dict(attrs).get("alttext") or "") + "$ "
        if tag in ("p", "li", "tr", "h1", "h2", "h3", "h4", "div", "br", "summary", "figcaption", "pre"):
            self.lines.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == self.measured:
            self.measured = None
        if tag in ("script", "style", "svg", "math", "pre") and self.skip:
            self.skip -= 1

    def handle_data(self, data: str) -> None:
        if not self.skip and self.measured is None:
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


def _perturbed(mb, error: float, nudge: float):
    """The same model with every measured number changed as another CPU's kernels could change it."""
    from dataclasses import replace

    from explorer.spec.results import RoutingExample

    def example(e: RoutingExample | None) -> RoutingExample | None:
        if e is None:
            return None
        return replace(e, rows=tuple((label, tuple(v + nudge for v in values)) for label, values in e.rows))

    checks = {p: replace(c, max_abs_error=error if c.status == "checked" else c.max_abs_error, example=example(c.example))
              for p, c in mb.checks.items()}
    return replace(mb, checks=checks, real_checks=tuple(replace(c, max_abs_error=error) for c in mb.real_checks))


@pytest.mark.parametrize("page", PAGES)
def test_golden_text_does_not_depend_on_measured_round_off(builds, page):
    """Issue 18: on another CPU (or with another torch thread count) every measured max |Δ| and a worked example's
    float32 digits come out different; a golden text that held them failed there every time. The page text the
    golden compares must be the same whatever was measured, within the tolerance."""
    from explorer.render.site_writer import environment, render_page
    from explorer.spec.types import path_key, walk
    from explorer.views.component_page import component_page
    from explorer.views.site import library_parts

    slug, rest = page.split("/", 1)
    env = environment(Path(__file__).resolve().parent.parent / "templates")
    parts = frozenset(library_parts(list(builds.values())))
    texts = set()
    for error, nudge in ((0.0, 0.0), (9.9e-5, 3e-5), (1.234e-7, -4.9e-5)):
        mb = _perturbed(builds[slug], error, nudge)
        anc, comp = next((a, c) for a, c in walk(mb.spec.root) if f"{path_key(a, c) or 'index'}.html" == rest)
        html_text = render_page(env, component_page(mb, anc, comp, (), parts))
        parser = _Text()
        parser.feed(html_text)
        texts.add("\n".join(re.sub(r"\s+", " ", html.unescape(line)).strip() for line in parser.lines))
    assert len(texts) == 1
