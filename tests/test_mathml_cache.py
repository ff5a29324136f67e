"""Formulas converted to MathML kept between builds (explorer/views/mathml_cache.py): a second build converts nothing, an
entry that is not exactly what to_mathml writes around its formula is converted again, never shown, and the page
writers hand back every formula they used."""

from __future__ import annotations

import json
from functools import partial

import pytest

from explorer.render.site_writer import _write_pages
from explorer.views import mathml, mathml_cache
from explorer.views.component_page import PageGroup
from explorer.views.mathml_cache import holds

FORMULAS = [(r"q_{t,h}=W^{Q}x_t", False), (r"\operatorname{RMSNorm}(x)=\frac{x}{\sqrt{\operatorname{mean}(x^2)+\epsilon}}",
                                          True), (r"a<b \land c>d", False), (r"\ell=x\,E_{\mathrm{tok}}^{\top}", False)]


@pytest.fixture
def fresh(monkeypatch):
    """Empty in-process memos, and a count of the formulas latex2mathml converts."""
    monkeypatch.setattr(mathml, "_remembered", {})
    monkeypatch.setattr(mathml, "_used", {})
    monkeypatch.setattr(mathml, "_trusted", lambda *a: False)
    mathml._cached.cache_clear()
    calls = []
    real = mathml._convert
    monkeypatch.setattr(mathml, "_convert", lambda latex, display: calls.append((latex, display)) or real(latex, display))
    yield calls
    mathml._cached.cache_clear()


def _use_all() -> dict[tuple[str, bool], str]:
    return {(latex, display): mathml.to_mathml(latex, display) for latex, display in FORMULAS}


def test_what_to_mathml_writes_holds_and_edits_do_not(fresh):
    for (latex, display), markup in _use_all().items():
        assert holds(latex, display, markup)
        assert not holds(latex, not display, markup)
        assert not holds(latex + "+1", display, markup)  # another formula's conversion
        assert not holds(latex, display, markup.replace("<semantics>", "<semantics><script>x()</script>", 1))
        assert not holds(latex, display, markup.replace("<mi>", '<mi onclick="x()">', 1))
        assert not holds(latex, display, markup.replace("<mi>", '<mi href="javascript:x()">', 1))
        assert not holds(latex, display, markup.replace("</semantics>", "</semantics><mi>", 1))  # not well-formed


def test_a_second_build_converts_nothing(tmp_path, fresh):
    first = _use_all()
    assert sorted(fresh) == sorted(FORMULAS)
    mathml_cache.save(tmp_path, mathml.take_used())
    [file] = tmp_path.glob("mathml-*.json")
    assert len(json.loads(file.read_text())) == len(FORMULAS)
    mathml._cached.cache_clear()
    fresh.clear()
    mathml_cache.load(tmp_path)
    assert _use_all() == first and fresh == []


def test_an_edited_entry_is_converted_again_and_the_cache_mended(tmp_path, fresh):
    first = _use_all()
    mathml_cache.save(tmp_path, mathml.take_used())
    [file] = tmp_path.glob("mathml-*.json")
    entries = json.loads(file.read_text())
    key = "inline:" + FORMULAS[0][0]
    entries[key] = entries[key].replace("<mi>W</mi>", '<mi onmouseover="x()">W</mi>')
    file.write_text(json.dumps(entries))
    mathml._cached.cache_clear()
    fresh.clear()
    mathml_cache.load(tmp_path)
    assert _use_all() == first and fresh == [FORMULAS[0]]
    mathml_cache.save(tmp_path, mathml.take_used())
    assert json.loads(file.read_text())[key] == first[FORMULAS[0]]


def test_no_cache_folder_writes_nothing_and_a_damaged_file_is_ignored(tmp_path, fresh):
    _use_all()
    mathml_cache.save(None, mathml.take_used())
    assert list(tmp_path.iterdir()) == []
    (tmp_path / mathml_cache.cache_file(tmp_path).name).write_text("[1, 2")
    mathml._cached.cache_clear()
    fresh.clear()
    mathml_cache.load(tmp_path)
    _use_all()
    assert sorted(fresh) == sorted(FORMULAS)


def test_a_page_writer_hands_back_the_formulas_its_pages_used(tmp_path, fresh):
    """What the build keeps is what the writers used: each formula a group's pages used comes back with its paths."""
    used = partial(_use_all)
    group = PageGroup(lambda: (used(), [])[1], 1)
    paths, formulas = _write_pages(None, group, tmp_path)  # type: ignore[arg-type]  # no page: no template
    assert paths == [] and set(formulas) == set(FORMULAS)
    # converted once per process, but handed back with every group that uses it: a second build in the same process
    # (as the tests run several) still keeps every formula it used
    assert set(_write_pages(None, group, tmp_path)[1]) == set(FORMULAS) and len(fresh) == len(FORMULAS)
    assert _write_pages(None, PageGroup(list, 0), tmp_path)[1] == {}


def test_an_oversized_cache_file_is_not_read(tmp_path, fresh, monkeypatch):
    """A file the build cannot have written (past cache.STRINGS_LIMIT) is passed over unread, not loaded whole."""
    from explorer.execute import cache

    _use_all()
    mathml_cache.save(tmp_path, mathml.take_used())
    [file] = tmp_path.glob("mathml-*.json")
    monkeypatch.setattr(cache, "STRINGS_LIMIT", file.stat().st_size - 1)
    mathml._cached.cache_clear()
    fresh.clear()
    mathml_cache.load(tmp_path)
    _use_all()
    assert sorted(fresh) == sorted(FORMULAS)
