"""Accessibility as a suite test: axe-core, installed by scripts/setup.sh from the npm registry into .axe/ (never
fetched from a CDN), run by Playwright in Debian's Chromium on one page of every kind, in both colour schemes, at a
desktop and a phone width, must report no violations."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT
from test_browser import CHROMIUM

pytestmark = pytest.mark.slow  # Chromium and axe-core over every kind of page, four times

AXE = ROOT / ".axe" / "node_modules" / "axe-core" / "axe.min.js"
PAGES = {  # one of every kind
    "index": "index.html",
    "model": "models/kimi-k2/index.html",
    "component with equations and diagram": "models/kimi-k2/blocks.moe.attn.html",
    "block": "models/kimi-k2/blocks.moe.html",
    "projection with its config excerpt": "models/kimi-k2/blocks.dense.attn.kv_b_proj.html",
    "compare": "compare/deepseek-v3-vs-kimi-k2.html",
    "compare picker": "compare/index.html",
    "library part": "parts/attention.attn.html",
    "library parts index": "parts/index.html",
    "multimodal model (its flow's merge)": "models/gemma-3-27b/index.html",
    "how to read": "how-to-read.html",
    "glossary": "glossary.html",
}
WIDTHS = {"desktop": 1280, "phone": 390}
SCHEMES = ("light", "dark")
RUN_AXE = """async () => {
  const result = await axe.run(document, {resultTypes: ['violations']});
  return result.violations.map(v => ({id: v.id, help: v.help,
    nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ': ' + n.failureSummary.split('\\n').slice(1, 2).join('')),
    count: v.nodes.length}));
}"""


@pytest.fixture(scope="module")
def chromium():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is required: run scripts/setup.sh"
    assert AXE.exists(), f"{AXE} is missing: run scripts/setup.sh (it installs axe-core with npm)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


def violations(browser, site: Path, width: int, scheme: str) -> dict[str, list[dict]]:
    """axe-core's violations on every page kind, in one browser context for this width and scheme."""
    context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
    try:
        page = context.new_page()
        found = {}
        for name, rel in PAGES.items():
            page.goto((site / rel).as_uri())
            page.wait_for_load_state("load")
            page.add_script_tag(path=str(AXE))
            found[name] = page.evaluate(RUN_AXE)
        return {name: v for name, v in found.items() if v}
    finally:
        context.close()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("width_name", WIDTHS)
def test_axe_finds_no_violations(chromium, built_site, width_name, scheme):
    assert violations(chromium, built_site, WIDTHS[width_name], scheme) == {}
