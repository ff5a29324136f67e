"""The seeds' in-place "Open inside" panel (issue 36, static/inside.js) in Chromium: a card opens its child's page
over the parent in a modal dialog with a close control and an address of its own (#inside=CHILD), which a reload
reopens and the back button closes; the page in the panel drops the site's navigation; a modified click is the
browser's own. Without JavaScript the cards are plain links (test_browser.py)."""

from __future__ import annotations

from test_browser import PAGES, browser, tabs  # noqa: F401 (fixtures)

MODEL = "models/kimi-k2/index.html"


def panel_src(page) -> str | None:
    return page.locator("dialog.inside-panel iframe").get_attribute("src")


def test_a_card_opens_its_child_over_the_parent_with_its_own_address(tabs, built_site):  # noqa: F811
    with tabs.open(built_site, PAGES["moe-block"], 1280) as page:
        card = page.locator("#inside a.card").nth(1)
        href, title = card.get_attribute("href"), card.locator(".card-title").inner_text()
        card.click()
        page.wait_for_selector("dialog.inside-panel[open]")
        assert panel_src(page) == href
        assert page.url.endswith("blocks.moe.html#inside=" + href)  # the parent's page, with the child named
        assert page.locator("#inside-panel-title").inner_text() == title
        assert page.locator("dialog.inside-panel .inside-own").get_attribute("href") == href
        frame = page.frame_locator("dialog.inside-panel iframe")
        assert frame.locator("html.embedded").count() == 1 and frame.locator(".site-nav").is_hidden()
        assert frame.locator("main h1").inner_text()  # the child's page itself, loaded in the panel
        page.keyboard.press("Escape")
        page.wait_for_selector("dialog.inside-panel", state="hidden")
        assert "#inside=" not in page.url
        assert page.evaluate("document.activeElement.getAttribute('href')") == href  # focus back on the card
        assert page.errors == []


def test_the_address_reopens_the_panel_and_back_closes_it(tabs, built_site):  # noqa: F811
    with tabs.open(built_site, MODEL, 1280) as page:
        href = page.locator("#inside a.card").first.get_attribute("href")
        page.goto(page.url + "#inside=" + href)
        page.reload()
        page.wait_for_selector("dialog.inside-panel[open]")
        assert panel_src(page) == href
        page.click("dialog.inside-panel .inside-close")
        page.wait_for_selector("dialog.inside-panel", state="hidden")
        page.go_back()
        page.wait_for_selector("dialog.inside-panel[open]")  # back to the address that named the child
        page.go_back()
        page.wait_for_selector("dialog.inside-panel", state="hidden")
        assert page.errors == []


def test_an_unknown_child_in_the_address_opens_nothing(tabs, built_site):  # noqa: F811
    """Only a card of this page opens: a crafted #inside= pointing elsewhere leaves the page as it is."""
    with tabs.open(built_site, MODEL, 1280) as page:
        page.goto(page.url + "#inside=https%3A%2F%2Fexample.com%2F")
        page.reload()
        page.wait_for_timeout(200)
        assert page.locator("dialog.inside-panel[open]").count() == 0
        assert page.errors == []


def test_a_modified_click_is_left_to_the_browser(tabs, built_site):  # noqa: F811
    with tabs.open(built_site, PAGES["moe-block"], 1280) as page:
        with page.context.expect_page() as opened:
            page.locator("#inside a.card").first.click(modifiers=["Control"])
        opened.value.close()
        assert page.locator("dialog.inside-panel[open]").count() == 0


def test_the_panel_fits_a_phone(tabs, built_site):  # noqa: F811
    with tabs.open(built_site, MODEL, 390, color_scheme="dark") as page:
        page.locator("#inside a.card").first.click()
        page.wait_for_selector("dialog.inside-panel[open]")
        box = page.locator("dialog.inside-panel").bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
        assert page.evaluate("document.documentElement.scrollWidth") <= 391
