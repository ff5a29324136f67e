"""Equation ↔ diagram links (issue 25, item 3): every tagged term names diagram parts that exist on its page, the
diagram writes the equations' symbols, and in Chromium hovering or focusing a term lights its part and back."""

from __future__ import annotations

import re
from pathlib import Path

from test_browser import browser, tabs  # noqa: F401  (the same Chromium fixtures)

from explorer.views.mathml import to_mathml
from explorer.views.term_links import TermLink, tag_terms

TERM = re.compile(r'<mrow class="term" data-light="([^"]+)" tabindex="0"')
PART = re.compile(r'<(?:a|g) [^>]*?data-light="([^"]+)"')
DOWN = "models/kimi-k2/blocks.dense.mlp.down_proj.html"
SWIGLU = "models/kimi-k2/blocks.dense.mlp.html"


def unmatched(page: str) -> set[str]:
    """Ids that a term lights but no diagram part on the page carries."""
    parts = set(PART.findall(page.split('<figure class="flow"', 1)[-1]))
    return {i for ids in TERM.findall(page) for i in ids.split()} - parts


def svg_text(page: str, part: str) -> str:
    """The text of one diagram part, scripts joined to their base as the reader sees them."""
    body = page.split('<figure class="flow"', 1)[1].split(f'data-light="{part}"', 1)[1].split("</g>", 1)[0].split("</a>", 1)[0]
    return " ".join(re.sub(r"<[^>]+>", "", t) for t in re.findall(r"<text[^>]*>(.*?)</text>", body))


def test_a_symbol_is_tagged_as_a_whole_token_only():
    links = (TermLink(r"\Delta_{\mathrm{ffn}}", "flow-out", "output"), TermLink("m", "flow-in", "input"))
    out = tag_terms(to_mathml(r"\Delta_{\mathrm{ffn}}=mW_{2}+m_{i}+\mathrm{max}(u)"), links)
    assert out.count('data-light="flow-out"') == 1 and out.count('data-light="flow-in"') == 1
    assert "<msub><mi>m</mi>" in out, "the base of m_i is another symbol"
    assert tag_terms(to_mathml("u=v"), links) == to_mathml("u=v"), "nothing to tag: the MathML is unchanged"


def test_swiglu_symbols_light_the_parts_that_hold_or_produce_them():
    """Kimi K2's dense SwiGLU, without a built site: x_ffn comes in, g and u are the gate and up projections' outputs,
    a = SiLU(g) and m = a ⊙ u are drawn as ops, and Δ_ffn is both the page's output and the down projection's."""
    from conftest import ROOT

    from explorer.content.model_content import load_model_content
    from explorer.model.families import load_model_spec
    from explorer.spec.types import path_key, walk
    from explorer.views.term_links import page_links

    spec = load_model_spec(load_model_content(ROOT / "content/models/kimi-k2"))
    comp = next(c for a, c in walk(spec.root) if path_key(a, c) == "blocks.dense.mlp")
    assert {link.latex: link.part for link in page_links(comp)} == {
        r"x_{\mathrm{ffn}}": "flow-in", r"\Delta_{\mathrm{ffn}}": "flow-out flow-down_proj",
        "g": "flow-gate_proj", "u": "flow-up_proj", "a": "flow-step-silu", "m": "flow-step-product"}


def test_every_tagged_term_lights_a_part_of_its_pages_diagram(built_site):
    pages = sorted((built_site / "models").glob("*/*.html"))
    tagged = {p: p.read_text() for p in pages}
    tagged = {p: s for p, s in tagged.items() if TERM.search(s)}
    assert len(tagged) > len(pages) // 2, "most component pages link their equations to their diagram"
    assert {str(p.relative_to(built_site)): unmatched(s) for p, s in tagged.items() if unmatched(s)} == {}


def test_a_term_whose_part_is_missing_is_caught(built_site):
    page = (built_site / SWIGLU).read_text()
    assert unmatched(page) == set()
    broken = page.replace('data-light="flow-step-product" tabindex="0"><circle', '><circle')
    assert unmatched(broken) == {"flow-step-product"}


def test_seed_004_one_symbol_for_the_input_in_equation_box_and_diagram(built_site):
    """Issue 25: the page said m in its equation and in/out box but h and delta_ffn in its diagram."""
    page = (built_site / DOWN).read_text()
    assert TERM.findall(page).count("flow-in") >= 2, "m in the equation and in the in/out list"
    assert set(TERM.findall(page)) == {"flow-in", "flow-out"}
    assert svg_text(page, "flow-in").startswith("in m [B batch, T positions, 18432 d_ff]")
    assert svg_text(page, "flow-out").startswith("out Δffn [B batch, T positions, 7168 d]")
    swiglu = (built_site / SWIGLU).read_text()
    assert "m = a ⊙ u" in svg_text(swiglu, "flow-step-product")
    assert "flow-out flow-down_proj" in TERM.findall(swiglu), "Δffn lights the out box and the down projection"


def _lit(page, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, "els => els.filter(e => e.classList.contains('lit')).map("
                                               "e => e.getAttribute('data-light'))")


def test_hover_and_focus_light_both_ways_in_chromium(tabs, built_site: Path):  # noqa: F811 (the fixture)
    with tabs.open(built_site, SWIGLU, 390) as page:
        page.locator("#steps summary").click()  # the product step is among all steps
        page.locator('#steps mrow.term[data-light="flow-step-product"]').first.hover()
        assert _lit(page, ".diagram [data-light]") == ["flow-step-product"]
        page.mouse.move(0, 0)
        assert _lit(page, "[data-light]") == []
        page.locator('.diagram [data-light="flow-out"]').hover()
        assert set(_lit(page, "mrow.term")) >= {"flow-out flow-down_proj"}
        assert "flow-out" in _lit(page, ".diagram [data-light]")
        page.mouse.move(0, 0)
        for _ in range(80):  # the keyboard reaches a term, and focusing it lights its part
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.matches('mrow.term')"):
                break
        lit_by = page.evaluate("document.activeElement.getAttribute('data-light')").split()
        assert lit_by and set(lit_by) <= set(_lit(page, ".diagram [data-light]"))
        page.keyboard.press("Tab")
        page.locator('.diagram [data-light="flow-in"]').focus()
        assert "flow-in" in " ".join(_lit(page, "mrow.term"))
        assert page.errors == []
