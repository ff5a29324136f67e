"""The site as a reader meets it, in Debian's Chromium driven by Playwright: no console errors, no request
leaving the site, math rendered, no layout shift, search by tensor name; screenshots kept as artifacts."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PAGES = {
    "index": "index.html",
    "model": "models/kimi-k2/index.html",
    "moe-block": "models/kimi-k2/blocks.moe.html",
    "down-proj": "models/kimi-k2/blocks.dense.mlp.down_proj.html",
    "compare": "compare/deepseek-v3-vs-kimi-k2.html",
    "compare-picker": "compare/index.html",
    "attention": "models/kimi-k2/blocks.moe.attn.html",
    "how-to-read": "how-to-read.html",
    "sandwich-block": "models/gemma-3-27b/blocks.local.html",
    # one page of each family added since: its widest tables and longest formulas
    "gpt-oss-router": "models/gpt-oss-20b/blocks.sliding.moe.router.html",
    "mixtral-model": "models/mixtral-8x7b/index.html",
    "qwen3-attention": "models/qwen3-8b/blocks.block.attn.html",
    "gpt2-block": "models/gpt2/blocks.block.html",
    "smollm2-block": "models/smollm2-135m/blocks.block.html",
    "qwen3-moe-experts": "models/qwen3-235b-a22b/blocks.moe.moe.html",
}
WIDTHS = {"desktop": 1280, "phone": 390}
SCHEMES = ("light", "dark")
EXCERPT_PAGES = ("down-proj", "moe-block", "models/kimi-k2/blocks.moe.attn.rope.html")
CLS_PROBE = """
window.__cls = 0;
new PerformanceObserver(list => { for (const e of list.getEntries()) if (!e.hadRecentInput) window.__cls += e.value; })
  .observe({type: 'layout-shift', buffered: true});
"""


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is required: run scripts/setup.sh"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        yield b
        b.close()


class Tabs:
    """One page per viewport width, colour scheme and JavaScript setting, kept open for a module's tests. Each test
    navigates it to a new document, with its own record of console errors, page errors and requests, at a third of
    the cost of a new browser context per test (a context starts a renderer process). A new document keeps nothing
    of the last: the site stores nothing (no cookies or storage; the compare picker keeps its choice in the URL's
    fragment), and the browser's cache is off, so every file loads as on a first visit."""

    def __init__(self, browser) -> None:
        self.browser = browser
        self.pages: dict[tuple[int, str, bool], Any] = {}

    @contextmanager
    def open(self, site: Path, rel: str, width: int, color_scheme: str = "light", java_script_enabled: bool = True):
        """The page, showing `rel` as loaded afresh, for the body of a `with`; then a blank one, so that nothing the
        document does as it unloads is reported to the next test."""
        page = self._page(width, color_scheme, java_script_enabled)
        page.errors, page.requests = [], []
        page.emulate_media(media="screen", color_scheme=color_scheme)  # undo a test's print or scheme emulation
        page.goto((site / rel).as_uri())
        page.wait_for_load_state("load")
        try:
            yield page
        finally:
            page.goto("about:blank")

    def _page(self, width: int, color_scheme: str, java_script_enabled: bool):
        key = (width, color_scheme, java_script_enabled)
        if key not in self.pages:
            context = self.browser.new_context(viewport={"width": width, "height": 900}, color_scheme=color_scheme,
                                               java_script_enabled=java_script_enabled)
            page = context.new_page()
            context.new_cdp_session(page).send("Network.setCacheDisabled", {"cacheDisabled": True})
            page.add_init_script(CLS_PROBE)
            page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page.errors.append(str(e)))
            page.on("request", lambda r: page.requests.append(r.url))
            self.pages[key] = page
        return self.pages[key]

    def close(self) -> None:
        for page in self.pages.values():
            page.context.close()


@pytest.fixture(scope="module")
def tabs(browser):
    opened = Tabs(browser)
    yield opened
    opened.close()


def search_ready(page) -> None:
    """Focus the search box and wait until its index has loaded: from then on each query renders its results
    as it is typed (a fixed pause raced the index's loading on a busy machine)."""
    page.focus("#search-input")
    page.wait_for_function("window.EXPLORER_SEARCH !== undefined")


DEFAULT_TIER = {("desktop", "light"), ("phone", "dark")}
"""Every page loads in the default suite at both widths and in both schemes (desktop light, phone dark); the rest
of the 2 × 2 matrix, a screenshot each, is in the slow tier that CI also runs (issue 26: the default suite's time)."""
PAGE_LOADS = [pytest.param(name, width_name, scheme, id=f"{name}-{width_name}-{scheme}",
                           marks=() if (width_name, scheme) in DEFAULT_TIER else pytest.mark.slow)
              for name in PAGES for width_name in WIDTHS for scheme in SCHEMES]


@pytest.mark.parametrize(("name", "width_name", "scheme"), PAGE_LOADS)
def test_page_loads_cleanly_in_chromium(tabs, built_site, name, width_name, scheme):
    with tabs.open(built_site, PAGES[name], WIDTHS[width_name], color_scheme=scheme) as page:
        page.wait_for_timeout(300)
        assert page.errors == []
        site_uri = built_site.as_uri()
        assert [u for u in page.requests if not u.startswith(site_uri)] == []
        assert page.evaluate("window.__cls") < 0.01
        assert page.evaluate("document.documentElement.scrollWidth") <= WIDTHS[width_name] + 1  # no sideways scroll
        if name not in ("index", "compare", "compare-picker", "how-to-read"):  # pages without equations
            _assert_math_rendered(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{name}-{width_name}-{scheme}.png"), full_page=True)


def _assert_math_rendered(page):
    count = page.locator("math").count()
    assert count > 0
    boxes = page.evaluate("""() => Array.from(document.querySelectorAll('math')).slice(0, 12)
        .map(m => m.getBoundingClientRect()).filter(r => r.width > 0).map(r => [r.width, r.height])""")
    assert boxes and all(h >= 8 for _, h in boxes), boxes  # laid out as formulas, not collapsed (a lone m is 8 px)
    text = page.evaluate("document.body.innerText")
    for raw in ("\\operatorname", "\\mathrm", "\\frac", "\\color"):
        assert raw not in text, f"raw LaTeX {raw} visible"
    # the LaTeX source stays available for copying and screen readers
    assert page.locator("math[alttext]").count() == count


def test_search_finds_components_by_tensor_name(tabs, built_site):
    with tabs.open(built_site, "index.html", 1280) as page:
        page.keyboard.press("/")
        assert page.evaluate("document.activeElement.id") == "search-input"
        page.keyboard.type("kv_b_proj")
        first = page.locator(".search-results a").first
        first.wait_for()
        assert first.get_attribute("href").endswith("blocks.dense.attn.kv_b_proj.html")
        page.fill("#search-input", "e_score_correction_bias")
        hrefs = page.locator(".search-results a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
        assert hrefs[0] == "models/kimi-k2/blocks.moe.moe.router.html"
        assert "models/deepseek-v3/blocks.moe.moe.router.html" in hrefs
        with page.expect_navigation():
            page.keyboard.press("Enter")
        assert page.url.endswith("models/kimi-k2/blocks.moe.moe.router.html")
        assert page.errors == []


def test_pages_work_without_javascript(tabs, built_site):
    with tabs.open(built_site, PAGES["moe-block"], 1280, java_script_enabled=False) as page:
        assert page.locator("form.search").is_hidden()
        assert "17,059,365,248" in page.inner_text("main")
        page.click("summary:has-text('All')")
        assert page.locator("#steps .step").nth(5).is_visible()


def test_dark_theme_follows_the_system_setting(tabs, built_site):
    colours = []
    for scheme in ("light", "dark"):
        with tabs.open(built_site, PAGES["down-proj"], 1280, color_scheme=scheme) as page:
            colours.append(page.evaluate("getComputedStyle(document.body).backgroundColor"))
    assert colours[0] != colours[1]


def test_print_hides_navigation(tabs, built_site):
    with tabs.open(built_site, PAGES["moe-block"], 1280) as page:
        page.emulate_media(media="print")
        assert page.locator(".site-nav").is_hidden()
        assert page.locator("#parameters").is_visible()


def test_keyboard_reaches_open_inside_cards(tabs, built_site):
    """Enter on a card opens it in the panel (static/inside.js); without JavaScript it is a link followed."""
    with tabs.open(built_site, PAGES["moe-block"], 1280) as page:
        page.focus(".card")
        page.keyboard.press("Enter")
        page.wait_for_selector("dialog.inside-panel[open]")
        assert page.locator("dialog.inside-panel iframe").get_attribute("src") == "blocks.moe.attn_norm.html"
    with tabs.open(built_site, PAGES["moe-block"], 1280, java_script_enabled=False) as page:
        page.focus(".card")
        with page.expect_navigation():
            page.keyboard.press("Enter")
        assert page.url.endswith("blocks.moe.attn_norm.html")


@pytest.mark.parametrize("width_name", WIDTHS)
def test_whole_model_picture_fits_and_lights_k_experts(tabs, built_site, width_name):
    """The model page's picture: inside the viewport at both widths, one numbered cell per layer, 8 of 384 routed
    experts lit beside the shared expert; screenshots in both schemes kept for a person to read."""
    with tabs.open(built_site, PAGES["model"], WIDTHS[width_name]) as page:
        box = page.locator("figure.whole-model svg").bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= WIDTHS[width_name]
        assert page.locator("figure.whole-model text.num").count() == 61
        assert page.locator("figure.whole-model rect.expert.lit:not(.shared)").count() == 8
        assert page.locator("figure.whole-model rect.expert:not(.shared)").count() == 384
        assert page.locator("figure.whole-model rect.expert.shared").count() == 1
        ARTIFACTS.mkdir(exist_ok=True)
        for scheme in SCHEMES:
            page.emulate_media(color_scheme=scheme)
            page.locator("figure.whole-model").screenshot(path=str(ARTIFACTS / f"whole-model-{width_name}-{scheme}.png"))


GUTTER_OFFSETS = """() => Array.from(document.querySelectorAll('pre.code .line')).flatMap(line => {
  const ln = line.querySelector('.ln');
  if (!ln.nextSibling) return [];  // a blank line has no code to compare with
  const range = document.createRange();
  range.setStartAfter(ln);
  range.setEndAfter(line.lastChild);
  const digits = document.createRange();
  digits.selectNodeContents(ln);  // the number's text box, laid out like the code's text boxes
  const code = range.getBoundingClientRect(), number = digits.getBoundingClientRect();
  return code.height ? [[Number(ln.textContent), Math.abs(code.top - number.top), Math.abs(code.bottom - number.bottom)]] : [];
})"""


@pytest.mark.parametrize("width", WIDTHS.values())
def test_code_line_numbers_stay_beside_their_lines(tabs, built_site, width):
    """Issue 12: the router excerpt's `return` stood beside 153 though it is line 158 (gutter and code were
    laid out separately); every number's box must match its line's box within 1 px."""
    for name in EXCERPT_PAGES:
        with tabs.open(built_site, PAGES.get(name, name), width) as page:
            offsets = page.evaluate(GUTTER_OFFSETS)
            assert len(offsets) > 20, name
            assert [o for o in offsets if o[1] > 1 or o[2] > 1] == [], name


def test_diagrams_fit_a_phone_and_their_boxes_add_up(tabs, built_site):
    for name in ("moe-block", "attention", "models/kimi-k2/blocks.moe.moe.html"):
        with tabs.open(built_site, PAGES.get(name, name), 390, color_scheme="dark") as page:
            svg = page.locator("figure.flow svg").bounding_box()
            assert svg["x"] >= 0 and svg["x"] + svg["width"] <= 390, name
            overflow = page.evaluate("""() => Array.from(document.querySelectorAll('figure.flow .box')).filter(b => {
                const r = b.querySelector('rect').getBBox();
                return Array.from(b.querySelectorAll('text')).some(t => {
                  const x = t.getBBox(); return x.x < r.x || x.x + x.width > r.x + r.width; });
              }).length""")
            assert overflow == 0, name  # every label inside its box
            drawn = page.evaluate("""() => Array.from(document.querySelectorAll('figure.flow [data-params]'))
                .reduce((a, b) => a + Number(b.dataset.params), 0)""")
            total = page.inner_text("#parameters tfoot td.num").replace(",", "")
            assert drawn == int(total), name


def test_search_puts_the_defining_page_first(tabs, built_site):
    """Issue 12: "MLA" found nothing; routed_scaling_factor, 2.827 and silu led to the overview; "KV cache"
    matched use_cache. Searched from Kimi K2's overview, whose pages come first where models tie."""
    with tabs.open(built_site, PAGES["model"], 1280) as page:
        search_ready(page)
        for query, first in [("MLA", "blocks.dense.attn.html"), ("KV cache", "index.html#figures"),
                             ("key-value cache", "index.html#figures"),
                             ("2.827", "blocks.moe.moe.router.html"),
                             ("routed_scaling_factor", "blocks.moe.moe.router.html"),
                             ("silu", "blocks.dense.mlp.html"), ("shared expert", "blocks.moe.moe.shared.html"),
                             ("experts", "blocks.moe.moe.expert.html")]:
            page.fill("#search-input", query)
            hrefs = page.locator(".search-results a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
            assert hrefs and hrefs[0] == f"../../models/kimi-k2/{first}", (query, hrefs[:3])
            if query == "KV cache":  # the figure, then the attention that makes the cache small
                assert hrefs[1] == "../../models/kimi-k2/blocks.dense.attn.html", hrefs[:3]
        page.fill("#search-input", "use_cache")  # a config key: whole words only, so not the KV cache figure
        hrefs = page.locator(".search-results a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
        assert hrefs and not any(h.endswith("#figures") for h in hrefs), hrefs[:3]


def test_search_finds_figures_and_model_pairs(tabs, built_site):
    """Issue 11: the derived figures and the compare pages are found by what readers type."""
    with tabs.open(built_site, "index.html", 1280) as page:
        search_ready(page)
        for query, first in [("active parameters", "models/"), ("Kimi K2 vs DeepSeek-V3", "compare/deepseek-v3-vs-kimi-k2"),
                             ("kimi deepseek", "compare/deepseek-v3-vs-kimi-k2")]:
            page.fill("#search-input", query)
            hrefs = page.locator(".search-results a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
            assert hrefs and hrefs[0].startswith(first), (query, hrefs[:3])
            if query == "active parameters":
                assert hrefs[0].endswith("/index.html"), hrefs[:3]


PICKED = [("deepseek-v3", "kimi-k2"), ("gpt2", "gemma-3-27b"), ("qwen3-235b-a22b", "smollm2-135m"),
          ("gpt-oss-20b", "mixtral-8x7b")]


@pytest.mark.parametrize("width", [1280, 390])
def test_compare_picker_shows_the_python_numbers_for_any_pair(tabs, built_site, builds, width):
    """Issue 26: the picker page (file://, no network) sets any two models side by side; every number it shows
    is the one Python computes for the same pair from the same data, rows and Δ alike."""
    from explorer.figures.calculator import size
    from explorer.figures.compare_roles import role_totals
    from explorer.views.basics import fmt
    from explorer.views.compare_pages import compare_data, compare_rows

    def signed(n: int) -> str:
        return f"+{fmt(n)}" if n > 0 else ("0" if n == 0 else f"−{fmt(-n)}")

    def cells(label: str, lv: int, rv: int, is_bytes: bool = False) -> list[str]:
        if not is_bytes:
            return [label, fmt(lv), fmt(rv), signed(rv - lv)]
        d = rv - lv
        return [label, *(f"{fmt(v)} ({size(v)})" if v else "0" for v in (lv, rv)),
                f"{signed(d)} ({'+' if d > 0 else ''}{size(d)})" if d else "0"]

    with tabs.open(built_site, "compare/index.html", width) as page:
        for a, b in PICKED:
            page.select_option("select[name=a]", a)
            page.select_option("select[name=b]", b)
            title = f"{builds[a].content.meta.name} vs {builds[b].content.meta.name}"
            page.wait_for_function(f"document.querySelector('#compare-result h2')?.textContent === {title!r}")
            shown = page.eval_on_selector_all("#compare-result table.compare:not(.config):not(.changes) tr:has(td)",
                                              "rows => rows.map(r => Array.from(r.cells, c => c.textContent))")
            left, right = (compare_data(builds[s], role_totals(builds[s].spec, builds[s].ledger)) for s in (a, b))
            roles, figures = compare_rows(left, right)
            expected = [cells(*r) for r in [*roles, ("Total", left["total"], right["total"]), *figures]]
            assert shown == expected, (a, b)
            by_label = {r[0]: r for r in shown}
            assert "KV cache growth per added token (all layers), in elements per token" in by_label
            assert all(", in " in label for label, *_ in figures)  # every figure row names its unit
        assert page.errors == [] and all(u.startswith("file://") for u in page.requests)
        assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_compare_picker_says_what_changed_as_the_static_page_does(tabs, built_site):
    """Issue 25: the picker's "what changed" (composed in the browser from the data files' facts) is the static
    page's, word for word and link for link, for a pair that has a static page."""
    with tabs.open(built_site, "compare/deepseek-v3-vs-kimi-k2.html", 1280) as page:
        static = page.eval_on_selector("#changed", "s => [s.querySelector('.what-changed').textContent, "
                                       "Array.from(s.querySelectorAll('tbody tr'), r => Array.from(r.cells, c => "
                                       "[c.textContent, c.querySelector('a')?.getAttribute('href') ?? '']))]")
    with tabs.open(built_site, "compare/index.html", 1280) as page:
        page.select_option("select[name=a]", "deepseek-v3")
        page.select_option("select[name=b]", "kimi-k2")
        page.wait_for_function("document.querySelector('#compare-result h2')?.textContent === 'DeepSeek-V3 vs Kimi K2'")
        picked = page.eval_on_selector("#compare-result .what-changed-section", "s => [s.querySelector("
                                       "'.what-changed').textContent, Array.from(s.querySelectorAll('tbody tr'), "
                                       "r => Array.from(r.cells, c => [c.textContent, c.querySelector('a')?."
                                       "getAttribute('href') ?? '']))]")
        assert "128 → 64 query heads" in static[0] and "no MTP" in static[0]
        assert picked == static
        assert page.errors == []


def test_compare_picker_follows_the_address_and_names_unknown_models(tabs, built_site):
    """A changed URL hash re-picks the pair; a shared link naming a slug the site lacks says so above the comparison
    instead of swapping another model in silently, and leaves the link as given."""
    with tabs.open(built_site, "compare/index.html", 1280) as page:
        page.evaluate("location.hash = '#a=deepseek-v3&b=kimi-k2'")
        page.wait_for_function("document.querySelector('#compare-result h2')?.textContent === 'DeepSeek-V3 vs Kimi K2'")
        assert page.locator(".compare-unknown").count() == 0
        page.evaluate("location.hash = '#a=gpt2&b=qwen3-8b'")
        page.wait_for_function("document.querySelector('#compare-result h2')?.textContent === 'GPT-2 (124M) vs Qwen3 8B'")
        assert page.input_value("select[name=a]") == "gpt2" and page.input_value("select[name=b]") == "qwen3-8b"
        page.goto((built_site / "compare/index.html").as_uri() + "#a=no-such-model&b=kimi-k2")
        page.wait_for_selector(".compare-unknown")
        note = page.text_content(".compare-unknown")
        assert "“no-such-model” for the left model, which is not on this site" in note
        assert page.evaluate("location.hash") == "#a=no-such-model&b=kimi-k2"
        assert page.input_value("select[name=b]") == "kimi-k2"
        page.select_option("select[name=a]", "deepseek-v3")  # the reader's own choice clears the note
        page.wait_for_function("document.querySelector('#compare-result h2')?.textContent === 'DeepSeek-V3 vs Kimi K2'")
        assert page.locator(".compare-unknown").count() == 0
        assert page.errors == []


# ------------------------------------------------------------------------------------------- reading (issue 36)

BOX_SAMPLE = {
    # one page of every kind, and the pages whose equations, pattern strings or links were the widest
    "index": "index.html", "parts-index": "parts/index.html", "part": "parts/mla.attn.html",
    "glossary": "glossary.html", "how-to-read": "how-to-read.html", "compare": "compare/deepseek-v3-vs-kimi-k2.html",
    "model": "models/nemotron-3-nano-30b-a3b/index.html", "hybrid-model": "models/qwen3.5-27b/index.html",
    "block": "models/deepseek-v4-flash/blocks.csa.html", "hyper-connection": "models/deepseek-v4-flash/blocks.csa.attn_hc.html",
    "compressor": "models/deepseek-v4-flash/blocks.csa.attn.compressor.html",
    "deltanet": "models/qwen3.5-27b/blocks.linear.attn.html", "vision-attention": "models/kimi-k2.5/vision_tower.encoder.attn.html",
    "leaf": "models/kimi-k2/blocks.dense.mlp.down_proj.html",
}
BOXES = """() => {
  for (const d of document.querySelectorAll('details')) d.open = true;
  return new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done({
    page: document.documentElement.scrollWidth,
    eqs: Array.from(document.querySelectorAll('.step .eq')).filter(e => e.scrollWidth > e.clientWidth + 1)
      .map(e => [e.closest('.step').id, e.scrollWidth, e.clientWidth, e.hasAttribute('data-scrolls')]),
    cards: Array.from(document.querySelectorAll('.card, .model-card')).filter(c => c.scrollWidth > c.clientWidth + 1)
      .map(c => c.textContent.trim().slice(0, 30)),
  }))));
}"""


def _boxes_problems(page, width: int) -> list[str]:
    """What a reader would trip on: at 1280 px any equation cut by its box; at 390 px one wider than the screen
    that cannot be scrolled from the keyboard (scroll.js marks each scrolling box); a page wider than the screen;
    a card whose content runs past its edge."""
    found = page.evaluate(BOXES)
    problems = [f"page {found['page']} px wide"] if found["page"] > width + 1 else []
    problems += [f"equation {i} {sw} > {cw} px" for i, sw, cw, marked in found["eqs"] if width > 600 or not marked]
    return problems + [f"card overflows: {c}" for c in found["cards"]]


def _box_params(sample: dict[str, str], marks=()):
    return [pytest.param(rel, width, id=f"{name}-{width}", marks=marks) for name, rel in sample.items()
            for width in WIDTHS.values()]


@pytest.mark.parametrize(("rel", "width"), _box_params(BOX_SAMPLE))
def test_no_equation_card_or_page_is_cut(tabs, built_site, rel, width):
    with tabs.open(built_site, rel, width) as page:
        assert _boxes_problems(page, width) == []


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS.values())
def test_no_equation_card_or_page_is_cut_anywhere(tabs, built_site, width):
    pages = sorted(str(p.relative_to(built_site)) for p in built_site.rglob("*.html"))
    assert len(pages) > 1000
    problems = {}
    for rel in pages:
        with tabs.open(built_site, rel, width) as page:
            if found := _boxes_problems(page, width):
                problems[rel] = found
    assert problems == {}


def test_a_planted_wide_equation_or_pattern_string_is_found(tabs, built_site):
    """The measure fails where it should: an equation wider than the column at 1280 px, a card holding an
    unbreakable string and a page pushed wider than a phone are each reported."""
    with tabs.open(built_site, BOX_SAMPLE["hyper-connection"], 1280) as page:
        page.evaluate("""() => { const eq = document.querySelector('.headline .step .eq math');
            eq.appendChild(eq.cloneNode(true)); eq.appendChild(eq.cloneNode(true)); }""")
        assert any(p.startswith("equation ") for p in _boxes_problems(page, 1280))
    with tabs.open(built_site, BOX_SAMPLE["model"], 390) as page:
        page.evaluate("""() => { const d = document.querySelector('.card .card-desc');
            d.style.overflowWrap = 'normal'; d.style.wordBreak = 'keep-all'; d.textContent = 'M'.repeat(120); }""")
        assert any(p.startswith("card overflows") for p in _boxes_problems(page, 390))
    with tabs.open(built_site, BOX_SAMPLE["glossary"], 390) as page:
        page.evaluate("() => { const p = document.createElement('p'); p.style.whiteSpace = 'nowrap'; "
                      "p.textContent = 'x'.repeat(300); document.querySelector('main').appendChild(p); }")
        assert _boxes_problems(page, 390)[0].startswith("page ")


def _visible_cards(page) -> list[str]:
    return page.eval_on_selector_all(".model-card:not([hidden]) h3", "hs => hs.filter(h => h.offsetParent)"
                                     ".map(h => h.textContent.trim())")


def test_index_is_grouped_and_filters_and_sorts(tabs, built_site, builds):
    """The index: grouped by lab, newest first in each lab; the filters keep exactly the cards whose data match,
    the sort orders by the number, and without JavaScript the grouped list is all there is."""
    with tabs.open(built_site, "index.html", 1280) as page:
        labs = page.eval_on_selector_all("section.lab", "ss => ss.map(s => [s.querySelector('h2').firstChild"
                                         ".textContent.trim(), Array.from(s.querySelectorAll('.model-card'), "
                                         "c => c.dataset.released)])")
        assert sum(len(r) for _, r in labs) == len(builds)
        assert len({lab for lab, _ in labs}) == len(labs)  # each lab once
        deepseek = dict(labs)["DeepSeek"]
        assert deepseek == sorted(deepseek, reverse=True)
        assert {mb.content.meta.lab for mb in builds.values()} == {lab for lab, _ in labs}
        page.select_option("select[name=kind]", "hybrid")
        hybrids = {mb.content.meta.name for mb in builds.values()
                   if any(k.state for k in mb.figures.serving.kinds)}
        assert set(_visible_cards(page)) == hybrids  # the filter shows exactly the models with a recurrent state
        assert {"Kimi Linear 48B-A3B", "Qwen3-Next-80B-A3B-Thinking", "Nemotron-H 56B Base 8K"} <= hybrids
        page.select_option("select[name=kind]", "")
        page.select_option("select[name=attention]", "latent (MLA)")
        assert set(_visible_cards(page)) == {"Kimi K2", "Kimi K2.5", "Kimi K2.6", "Kimi K2.7 Code", "DeepSeek-V3",
                                              "DeepSeek-R1", "GLM-4.7-Flash",
                                              "Kimi Linear 48B-A3B"}  # Kimi Linear: one layer in four
        page.select_option("select[name=attention]", "")
        page.select_option("select[name=sort]", "total")
        shown = _visible_cards(page)
        totals = [builds_by_name(builds)[n].figures.get("total_parameters").value for n in shown]  # the card's
        assert len(shown) == len(builds) and totals == sorted(totals, reverse=True)
        page.select_option("select[name=sort]", "")
        assert page.locator(".lab .model-card:visible").count() == len(builds)
        assert page.errors == []
    with tabs.open(built_site, "index.html", 390, java_script_enabled=False) as page:
        assert page.locator("form.index-filters").is_hidden()
        assert page.locator(".lab .model-card:visible").count() == len(builds)


def builds_by_name(builds) -> dict:
    return {mb.content.meta.name: mb for mb in builds.values()}


def test_index_cards_show_active_parameters_and_cache(built_site, builds):
    from explorer.views.basics import fmt

    text = (built_site / "index.html").read_text()
    kimi = builds["kimi-k2"]
    assert fmt(kimi.figures.get("active_parameters").value) in text
    assert "KV cache per token, BF16" in text and "70.27 kB" in text  # 70,272 bytes: 61 × 576 × 2
    assert kimi.figures.get("kv_cache_bytes_per_token_bf16").value == 70_272


def _results(page, query: str) -> list[str]:
    page.fill("#search-input", query)
    return page.locator(".search-results a").evaluate_all("els => els.map(e => e.getAttribute('href'))")


def test_search_ranks_concepts_first_reaches_every_result_and_survives_prototype_names(tabs, built_site):
    with tabs.open(built_site, "index.html", 1280) as page:
        search_ready(page)
        assert _results(page, "hash routing")[0].endswith("moe.router.html")  # the Hash router, not a block
        assert _results(page, "sinkhorn")[0].endswith("attn_hc.html")  # the hyper-connection whose step it is
        assert "kimi-k2.5" in _results(page, "INT4")[0]
        for name in ("constructor", "__proto__", "toString", "hasOwnProperty", "valueOf"):
            _results(page, name)
        assert page.errors == []
        hrefs = _results(page, "KV cache")
        assert len(hrefs) == 12
        more = page.locator(".search-results button.more")
        total = int(more.inner_text().split()[2])
        assert total > 12
        more.click()
        assert len(page.locator(".search-results a").evaluate_all("els => els.map(e => e.href)")) == total
        assert page.evaluate("document.activeElement.getAttribute('href')") is not None  # focus moved to result 13
