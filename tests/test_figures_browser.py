"""The generated figures in Chromium (issue 36, item 1): the attention-pattern grids and the block figures fit a
390 px phone and the 1280 px column without scrolling sideways, and their cells and words stand out from the page
in light and dark (colours from the theme's variables, not fixed ones)."""

from __future__ import annotations

import pytest
from test_browser import SCHEMES, WIDTHS, browser, tabs  # noqa: F401 (fixtures)

FIGURES = {
    "models/gpt-oss-20b/blocks.sliding.attn.html": "figure.attention-pattern",
    "models/deepseek-v4-flash/blocks.csa.attn.html": "figure.attention-pattern",
    "models/deepseek-v3.2/blocks.moe.attn.html": "figure.attention-pattern",
    "models/deepseek-v4-flash/blocks.csa.html": "figure.block-structure",
    "models/gemma-3-27b/blocks.local.html": "figure.block-structure",
    "compare/deepseek-v3-vs-kimi-k2.html": "#blocks figure.block-structure",
}
MEASURE = """sel => {
  const fig = document.querySelector(sel), svg = fig.querySelector('svg'), box = svg.getBoundingClientRect();
  const reads = svg.querySelector('.reads'), mixer = svg.querySelector('.part.mixer rect');
  const hidden = svg.querySelector('.hidden');
  return {left: box.left, right: box.right, width: box.width, height: box.height,
          page: document.documentElement.scrollWidth, background: getComputedStyle(document.body).backgroundColor,
          read: reads ? getComputedStyle(reads).fill : getComputedStyle(mixer).stroke,
          hidden: hidden ? getComputedStyle(hidden).fill : null, text: getComputedStyle(svg.querySelector('text')).fill};
}"""


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("width", WIDTHS.values())
@pytest.mark.parametrize("page_path", FIGURES)
def test_each_figure_fits_and_reads_in_both_themes(tabs, built_site, page_path, width, scheme):  # noqa: F811
    with tabs.open(built_site, page_path, width, scheme) as page:
        m = page.evaluate(MEASURE, FIGURES[page_path])
        assert m["page"] <= width, m  # nothing scrolls sideways
        assert m["left"] >= 0 and m["right"] <= width and m["width"] > 200 and m["height"] > 200, m
        assert m["text"] != m["background"] and m["read"] not in (None, m["background"]), m
        if m["hidden"] is not None:
            assert m["hidden"] != m["read"], m
        assert page.errors == []


def test_the_colours_follow_the_theme(tabs, built_site):  # noqa: F811
    """The same cell is drawn in another colour in dark mode: read from the stylesheet's variables."""
    fills = {}
    for scheme in SCHEMES:
        with tabs.open(built_site, "models/gpt-oss-20b/blocks.sliding.attn.html", 1280, scheme) as page:
            fills[scheme] = page.evaluate("getComputedStyle(document.querySelector('.attention-grid .reads')).fill")
    assert fills["light"] != fills["dark"]
