"""Attention-pattern pictures (issue 36, item 1): the grids equal hand-worked masks, come from the executor's own
mask functions (a planted wrong mask changes the picture and fails here), every attention component of every
model declares its mask with the sizes its config states, and the page draws an SVG with an accessible name."""

from __future__ import annotations

import html
import re
import tomllib
from functools import cache

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.figures import attention_patterns
from explorer.figures.attention_patterns import DROPPED, READS, declared_masks, pattern_grid
from explorer.model.components import chunked, compressed_attention, dsa, layer_attention
from explorer.model.components.base import COMPARISON_ROLES
from explorer.model.components.part_facts import MaskSpec
from explorer.model.families import load_model_spec
from explorer.spec.types import path_key, walk
from explorer.views.attention_grid import attention_grid_view

V4_CSA = MaskSpec(window=128, sinks=True, entry_ratio=4, selected_entries=512)
V4_HCA = MaskSpec(window=128, sinks=True, entry_ratio=128)


def reads(mask: MaskSpec, positions: int = 8) -> list[tuple[int, ...]]:
    grid = pattern_grid("x", mask, positions)
    return [grid.reads(t) for t in range(positions)]


# ------------------------------------------------------------------------------------------- hand-worked grids

def test_causal_rows_read_themselves_and_every_earlier_key():
    assert reads(MaskSpec()) == [tuple(range(t + 1)) for t in range(8)]


def test_sliding_window_4_row_5_reads_keys_2_to_5():
    rows = reads(MaskSpec(window=128))
    assert rows[5] == (2, 3, 4, 5)
    assert rows[2] == (0, 1, 2) and rows[7] == (4, 5, 6, 7)


def test_chunks_of_4_read_only_their_own_chunk():
    rows = reads(MaskSpec(chunk=8192))
    assert rows[3] == (0, 1, 2, 3) and rows[4] == (4,) and rows[5] == (4, 5) and rows[7] == (4, 5, 6, 7)


def test_dsa_keeps_the_top_3_causal_keys_by_the_illustrative_score():
    """Scores (5s + 3t) mod 17: row 4 scores keys 0..4 as 12, 0, 5, 10, 15, so it keeps 4, 0 and 3 and drops 1, 2."""
    grid = pattern_grid("x", MaskSpec(selected_tokens=2048), 8)
    assert grid.reads(4) == (0, 3, 4)
    assert grid.rows[4] == "#oo##..."
    assert grid.reads(1) == (0, 1)  # fewer than three causal keys: every one is kept
    for t in range(8):
        assert len(grid.reads(t)) == min(3, t + 1) and max(grid.reads(t)) <= t
        assert grid.rows[t].count(DROPPED) == t + 1 - min(3, t + 1)


def test_v4_entries_are_read_once_their_window_has_closed():
    """Ratio 4 over 16 positions: entry w closes at position 4w + 3; the window of 4 beside it."""
    grid = pattern_grid("x", V4_HCA, 16)
    assert grid.entries == 4
    tokens = lambda t: tuple(i for i in grid.reads(t) if i < 16)  # noqa: E731
    entries = lambda t: tuple(i - 16 for i in grid.reads(t) if i >= 16)  # noqa: E731
    assert tokens(15) == (12, 13, 14, 15) and entries(15) == (0, 1, 2, 3)
    assert entries(2) == () and entries(3) == (0,) and entries(6) == (0,) and entries(7) == (0, 1)


def test_v4_indexer_keeps_2_closed_entries():
    grid = pattern_grid("x", V4_CSA, 16)
    for t in range(16):
        closed = (t + 1) // 4
        kept = [c for c in grid.rows[t][16:] if c == READS]
        assert len(kept) == min(2, closed)
        assert grid.rows[t][16:].count(DROPPED) == closed - min(2, closed)
    assert grid.rows[15][16:] == "##oo"  # scores (5w + 3·15) mod 17 = 11, 16, 4, 9: entries 1 and 0 kept


def test_small_sizes_keep_only_the_models_kinds():
    drawn = attention_patterns.small_sizes(MaskSpec(window=1024, sinks=True))
    assert drawn == MaskSpec(window=4, sinks=True)


# ------------------------------------------------------------------------------------- planted wrong masks

def test_a_window_off_by_one_in_the_executor_shows_in_the_picture(monkeypatch):
    def wide(M, window):  # reads window + 1 keys: one too many
        t = __import__("torch").arange(M.shape[-1])
        return M.masked_fill((t[:, None] - t[None, :]) >= (window or 10**9) + 1, float("-inf"))

    monkeypatch.setattr(layer_attention, "window_mask", wide)
    assert reads(MaskSpec(window=128))[5] == (1, 2, 3, 4, 5)


def test_a_chunk_boundary_moved_in_the_executor_shows_in_the_picture(monkeypatch):
    real = chunked.chunk_mask
    monkeypatch.setattr(chunked, "chunk_mask", lambda M, chunk: real(M, chunk + 1 if chunk else chunk))
    assert reads(MaskSpec(chunk=8192))[4] != (4,)


def test_an_entry_read_before_it_closes_shows_in_the_picture(monkeypatch):
    real = compressed_attention.visible
    monkeypatch.setattr(compressed_attention, "visible", lambda m, T_, n, device: real(m, T_ + m, n, device)[m:])
    grid = pattern_grid("x", V4_HCA, 16)
    assert grid.reads(2)[-1] == 16  # entry 0 read at position 2, before its window 0..3 has closed


def test_a_selection_that_keeps_too_many_shows_in_the_picture(monkeypatch):
    real = dsa.selection_mask
    monkeypatch.setattr(dsa, "selection_mask", lambda I, topk: real(I, topk + 1))
    assert len(pattern_grid("x", MaskSpec(selected_tokens=2048), 8).reads(6)) == 4


# --------------------------------------------------------------------------- every attention declares its mask

SAMPLE = ("gpt-oss-20b", "gemma-3-270m", "llama-4-scout-17b-16e", "deepseek-v3.2", "glm-5", "deepseek-v4-flash",
          "mimo-v2-flash", "qwen3-8b", "gpt2", "kimi-k2", "qwen3-next-80b-a3b", "minimax-m2.5", "nemotron-h-56b",
          "kimi-linear-48b-a3b", "phi-4-mini")


@cache
def spec(slug: str):
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


def config(slug: str) -> dict:
    data = tomllib.loads((ROOT / "content/models" / slug / "model.toml").read_text())["config"]
    return data.get("text_config", data)


@pytest.mark.parametrize("slug", SAMPLE)
def test_every_attention_component_declares_a_mask(slug):
    s = spec(slug)
    attention = {path_key(a, c) for a, c in walk(s.root) if COMPARISON_ROLES.get(c.program) == "Attention"}
    assert attention and attention <= {p for p, _ in declared_masks(s)}


def test_the_masks_carry_the_configs_sizes():
    """Read from each model's config, not from the spec the masks come from."""
    masks = {p: m for p, m in declared_masks(spec("gpt-oss-20b"))}
    assert masks["blocks.sliding.attn"] == MaskSpec(window=config("gpt-oss-20b")["sliding_window"], sinks=True)
    assert masks["blocks.full.attn"] == MaskSpec(sinks=True)
    llama = dict(declared_masks(spec("llama-4-scout-17b-16e")))
    assert llama["blocks.chunked.attn"].chunk == config("llama-4-scout-17b-16e")["attention_chunk_size"]
    assert llama["blocks.nope.attn"] == MaskSpec()
    for slug in ("deepseek-v3.2", "glm-5"):
        topks = {m.selected_tokens for _, m in declared_masks(spec(slug))}
        assert topks == {config(slug)["index_topk"]}
    v4, cfg = dict(declared_masks(spec("deepseek-v4-flash"))), config("deepseek-v4-flash")
    assert v4["blocks.csa.attn"] == MaskSpec(window=cfg["sliding_window"], sinks=True, entry_ratio=4,
                                             selected_entries=cfg["index_topk"])
    assert v4["blocks.hca.attn"] == MaskSpec(window=cfg["sliding_window"], sinks=True, entry_ratio=128)
    # MiMo's config counts the previous positions (sliding_window_size); the query itself makes one more
    mimo = {m.window for _, m in declared_masks(spec("mimo-v2-flash")) if m.sinks}
    assert config("mimo-v2-flash")["sliding_window_size"] + 1 in mimo


# ------------------------------------------------------------------------------------------------- the drawing

CELLS = re.compile(r'<rect x="[\d.]+" y="[\d.]+" width="[\d.]+" height="[\d.]+" rx="2" class="(token|entry|sink) '
                   r'(reads|hidden|dropped)"/>')


@pytest.mark.parametrize("mask", [MaskSpec(window=128, sinks=True), MaskSpec(selected_tokens=2048), V4_CSA])
def test_the_svg_draws_every_cell_of_the_grid_and_has_an_accessible_name(mask):
    grid = pattern_grid("blocks.x.attn", mask)
    view = attention_grid_view(grid)
    assert 'role="img"' in view.svg and f'aria-label="{html.escape(view.caption)}"' in view.svg
    assert "<title>" in view.svg and "viewBox" in view.svg and "fill=" not in view.svg  # colours from classes
    drawn = [(kind, state) for kind, state in CELLS.findall(view.svg)]
    sinks = 16 if mask.sinks else 0
    legend = len(drawn) - sinks - 16 * (16 + grid.entries)
    body = [s for k, s in drawn[:len(drawn) - legend] if k != "sink"]
    expected = [{"#": "reads", ".": "hidden", "o": "dropped"}[c] for row in grid.rows for c in row]
    assert body == expected


def test_the_caption_names_the_sizes_drawn_and_the_models():
    words = attention_grid_view(pattern_grid("x", V4_CSA)).caption
    assert "window of 4; this layer's window is 128 positions" in words
    assert "one per 4 positions (this layer: one per 4)" in words and "this layer keeps 512" in words
    assert "illustrative" in words and "sink" in words


# ------------------------------------------------------------------------------------------------- the cache

def test_grids_are_cached_and_a_damaged_entry_is_recomputed(tmp_path, monkeypatch):
    s = spec("gpt-oss-20b")
    first = attention_patterns.attention_patterns(s, tmp_path)
    assert sorted(p.path for p in first) == ["blocks.full.attn", "blocks.sliding.attn"]

    def no_torch(*_):
        raise AssertionError("recomputed although the cache holds the grids")

    with monkeypatch.context() as m:
        m.setattr(attention_patterns, "pattern_grid", no_torch)
        assert attention_patterns.attention_patterns(s, tmp_path) == first
    entry = next(tmp_path.glob("gpt-oss-20b-patterns-*.json"))
    entry.write_text(entry.read_text().replace('"positions": 16', '"positions": 15', 1))
    assert attention_patterns.attention_patterns(s, tmp_path) == first


@pytest.fixture(scope="module")
def sample_builds(builds):
    return {slug: builds[slug] for slug in ("gpt-oss-20b", "llama-4-scout-17b-16e", "deepseek-v3.2",
                                             "deepseek-v4-flash", "mimo-v2-flash", "qwen3-8b")}


def test_every_attention_page_of_a_sample_shows_its_picture(built_site, sample_builds):
    for slug, mb in sample_builds.items():
        for path, _ in declared_masks(mb.spec):
            page = (built_site / "models" / slug / f"{path}.html").read_text(encoding="utf-8")
            svg = re.search(r'<figure class="attention-pattern" id="attention-pattern"><svg [^>]*role="img" '
                            r'aria-label="([^"]+)"', page)
            assert svg is not None, (slug, path)
