"""Highlighted excerpts kept between builds (explorer/views/highlight_cache.py): a second build highlights nothing, and an
entry that is not Pygments' spans around exactly the cited lines is highlighted again, never shown."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from explorer.views import evidence as views
from explorer.views import highlight_cache
from explorer.views.highlight_cache import holds, prime

EXCERPTS = [(("class A:", "    x = '<b>' & 1", "    y = 2"), 12, "modeling_a.py"), (('{', '  "a": 1', '}'), 3, "config.json")]


def _builds():
    cit = [SimpleNamespace(lines=lines, first=first, file=file) for lines, first, file in EXCERPTS]
    return [SimpleNamespace(citations={"a": tuple(cit)}), SimpleNamespace(citations={"b": (cit[0],)})]


@pytest.fixture
def fresh(monkeypatch):
    """An empty in-process memo, and a count of the excerpts Pygments highlights."""
    monkeypatch.setattr(views, "_highlighted", {})
    calls = []
    real = views._highlight
    monkeypatch.setattr(views, "_highlight", lambda *ex: calls.append(ex) or real(*ex))
    return calls


def test_what_views_writes_holds_and_edits_do_not():
    for ex in EXCERPTS:
        markup = views._highlight(*ex)
        assert holds(ex, markup)
        assert not holds(ex, markup.replace("</code>", "<script>x()</script></code>"))
        assert not holds(ex, markup.replace('<span class="line">', '<span class="line" onclick="x()">', 1))
        assert not holds(ex, markup.replace(f">{ex[1]}<", f">{ex[1] + 1}<", 1))  # a line number moved
        assert not holds((ex[0][:-1] + ("changed",), ex[1], ex[2]), markup)  # another quoted line


def test_a_second_build_highlights_nothing(tmp_path, fresh):
    prime(tmp_path, _builds())
    assert sorted(fresh) == sorted(EXCERPTS)
    [file] = tmp_path.glob("highlight-*.json")
    assert len(json.loads(file.read_text())) == 2
    expected = {ex: views._highlighted[ex] for ex in EXCERPTS}
    views._highlighted.clear()
    fresh.clear()
    prime(tmp_path, _builds())
    assert fresh == [] and {ex: views.highlight_lines(*ex) for ex in EXCERPTS} == expected


def test_an_edited_entry_is_highlighted_again(tmp_path, fresh):
    prime(tmp_path, _builds())
    [file] = tmp_path.glob("highlight-*.json")
    entries = json.loads(file.read_text())
    key = highlight_cache._key(EXCERPTS[0])
    good = entries[key]
    entries[key] = good.replace("</code>", "<img src=x onerror=alert(1)></code>")
    file.write_text(json.dumps(entries))
    views._highlighted.clear()
    fresh.clear()
    prime(tmp_path, _builds())
    assert fresh == [EXCERPTS[0]] and views.highlight_lines(*EXCERPTS[0]) == good
    assert json.loads(file.read_text())[key] == good  # and the cache is mended


def test_no_cache_folder_writes_nothing(tmp_path, fresh):
    prime(None, _builds())
    assert sorted(fresh) == sorted(EXCERPTS) and list(tmp_path.iterdir()) == []


def test_a_damaged_file_is_highlighted_again(tmp_path, fresh):
    prime(tmp_path, _builds())
    [file] = tmp_path.glob("highlight-*.json")
    file.write_text("[1, 2")
    views._highlighted.clear()
    fresh.clear()
    prime(tmp_path, _builds())
    assert sorted(fresh) == sorted(EXCERPTS)
