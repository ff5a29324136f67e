"""Block figures (issue 36, item 1): each block kind's parts in order, grouped into the residual branches the block's
own equations add back, every number the ledger's, drawn as SVG with an accessible name."""

from __future__ import annotations

import html
import re
from functools import cache

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.figures.block_figures import block_figures
from explorer.model.account import account
from explorer.model.families import load_model_spec
from explorer.views.basics import fmt
from explorer.views.block_figure import block_figure_view

SAMPLE = ("llama-3.1-8b", "gemma-3-270m", "olmo-2-7b", "deepseek-v4-flash", "nemotron-3-nano-30b-a3b", "kimi-k2",
          "qwen3-next-80b-a3b", "gpt2", "gpt-oss-20b", "llama-4-scout-17b-16e")


@cache
def model(slug: str):
    spec = load_model_spec(load_model_content(ROOT / "content/models" / slug))
    return spec, account(spec)


def keys(slug: str, block: str) -> list[list[str]]:
    spec, ledger = model(slug)
    figure = next(f for f in block_figures(spec, ledger) if f.path == block)
    return [[p.path.rsplit(".", 1)[1] for p in b.parts] for b in figure.branches]


def test_branches_follow_each_block_layout():
    """Hand-read from each reference's decoder layer: what each residual add (or stream mix) adds back."""
    assert keys("llama-3.1-8b", "blocks.block") == [["attn_norm", "attn"], ["ffn_norm", "mlp"]]
    assert keys("gemma-3-270m", "blocks.local") == [["attn_norm", "attn", "post_attn_norm"],
                                                    ["ffn_norm", "mlp", "post_ffn_norm"]]
    assert keys("olmo-2-7b", "blocks.block") == [["attn", "post_attn_norm"], ["mlp", "post_ffn_norm"]]
    assert keys("nemotron-3-nano-30b-a3b", "blocks.mamba") == [["norm", "mamba"]]
    assert keys("deepseek-v4-flash", "blocks.csa") == [["attn_hc", "attn_norm", "attn"], ["ffn_hc", "ffn_norm", "moe"]]
    spec, ledger = model("deepseek-v4-flash")
    assert all(b.mixes_streams for f in block_figures(spec, ledger) for b in f.branches)
    spec, ledger = model("llama-3.1-8b")
    assert not any(b.mixes_streams for f in block_figures(spec, ledger) for b in f.branches)


@pytest.mark.parametrize("slug", SAMPLE)
def test_every_number_is_the_ledgers_and_the_parts_add_up(slug):
    spec, ledger = model(slug)
    figures = block_figures(spec, ledger)
    assert {f.path for f in figures} == {f"blocks.{b.key}" for b in spec.root.child("blocks").children}
    for f in figures:
        acc = ledger.accounts[f.path]
        assert (f.params, f.total) == (acc.per_instance, acc.total)
        parts = [p for b in f.branches for p in b.parts]
        assert [p.path for p in parts] == [f"{f.path}.{c}" for c in ledger_children(spec, f.path)]
        assert all(p.params == ledger.accounts[p.path].per_instance for p in parts)
        assert sum(p.params for p in parts) + f.own_params == f.params and f.own_params == 0
        assert len(f.layers) * f.params == f.total


def ledger_children(spec, path: str) -> list[str]:
    return [c.key for c in spec.root.child("blocks").child(path.split(".", 1)[1]).children]


PARAMS = re.compile(r'class="params">([\d,]+)</text>')


def drawn_numbers(slug: str, ledger=None) -> list[tuple[str, list[str]]]:
    spec, real = model(slug)
    return [(f.path, PARAMS.findall(block_figure_view(spec, f).svg)) for f in block_figures(spec, ledger or real)]


@pytest.mark.parametrize("slug", ("kimi-k2", "gemma-3-270m", "deepseek-v4-flash"))
def test_the_svg_shows_the_ledgers_numbers_and_has_an_accessible_name(slug):
    spec, ledger = model(slug)
    for f in block_figures(spec, ledger):
        view = block_figure_view(spec, f)
        parts = [p for b in f.branches for p in b.parts]
        assert PARAMS.findall(view.svg) == [fmt(ledger.accounts[p.path].per_instance) for p in parts]
        assert 'role="img"' in view.svg and f'aria-label="{html.escape(view.caption)}"' in view.svg
        assert "viewBox" in view.svg and "fill=" not in view.svg and "<title>" in view.svg
        assert fmt(ledger.accounts[f.path].per_instance) in view.caption


def test_kimi_k2s_moe_block_reads_as_the_style_guide_counts_it():
    """17,059,365,248 per MoE block × 60 = 1,023,561,914,880 (docs: STYLE.md's worked example)."""
    spec, ledger = model("kimi-k2")
    view = block_figure_view(spec, next(f for f in block_figures(spec, ledger) if f.path == "blocks.moe"))
    assert "17,059,365,248 parameters per block, 1,023,561,914,880 over its 60 layers" in view.caption
    assert "MoE: 8 of 384 experts + shared expert" in view.svg


def test_a_wrong_count_in_the_ledger_shows_in_the_figure():
    """A ledger whose attention row is off by one: the figure draws that number, so the comparison with a fresh
    ledger fails (the figure reads the ledger rather than recomputing it)."""
    from dataclasses import replace

    spec, ledger = model("llama-3.1-8b")
    path = "blocks.block.attn"
    wrong = replace(ledger, accounts={**ledger.accounts, path: replace(ledger.accounts[path],
                                                                       per_instance=ledger.accounts[path].per_instance + 1)})
    assert drawn_numbers("llama-3.1-8b", wrong) != drawn_numbers("llama-3.1-8b")


MARKED = re.compile(r'<g class="part \w+( differs)?"><title>([^<:]+):')


def marked(column) -> list[tuple[str, bool]]:
    return [(title, bool(d)) for f in column.figures for d, title in MARKED.findall(f.svg)]


def test_compare_marks_the_parts_whose_kind_differs():
    """Kimi K2 follows DeepSeek-V3: the same blocks but 384 routed experts, not 256 (8 run per token in both), and
    64 attention heads, not 128; the norms and the dense MLP match."""
    from explorer.views.block_figure import compared_columns

    sides = [(slug, *model(slug)) for slug in ("deepseek-v3", "kimi-k2")]
    left, right = compared_columns(*((slug, spec, block_figures(spec, ledger)) for slug, spec, ledger in sides))
    for column in (left, right):
        flags = marked(column)
        changed = {"Mixture of experts", "Multi-head latent attention"}
        assert {title for title, d in flags if d} == changed, flags
        assert all(not d for title, d in flags if title not in changed), flags
    assert "href" not in right.figures[-1].svg  # one image: nothing inside it to reach

def test_compare_matches_norms_by_kind_and_place_not_by_name():
    """Kimi Linear's pre-norms are named "Pre-mixer RMSNorm", Kimi K2's "Attention RMSNorm": both RMSNorms before
    their branch's body, so neither is marked; the attention (MLA against Kimi Delta Attention) is."""
    from explorer.views.block_figure import compared_columns

    sides = [(slug, *model(slug)) for slug in ("kimi-k2", "kimi-linear-48b-a3b")]
    left, right = compared_columns(*((slug, spec, block_figures(spec, ledger)) for slug, spec, ledger in sides))
    for column in (left, right):
        assert not any(d for title, d in marked(column) if "RMSNorm" in title)
    assert ("Kimi Delta Attention", True) in marked(right)
    gemma, llama = (model(slug) for slug in ("gemma-3-270m", "llama-3.1-8b"))
    g, _ = compared_columns(("Gemma", gemma[0], block_figures(*gemma)), ("Llama", llama[0], block_figures(*llama)))
    assert {title for title, d in marked(g) if d and "RMSNorm" in title} == {"Post-attention RMSNorm",
                                                                              "Post-MLP RMSNorm"}


def test_compare_marks_nothing_between_a_model_and_itself():
    from explorer.views.block_figure import compared_columns

    spec, ledger = model("gemma-3-270m")
    side = ("Gemma", spec, block_figures(spec, ledger))
    assert not any(d for column in compared_columns(side, side) for _, d in marked(column))


@pytest.mark.parametrize("slug, block, heads", [
    ("llama-3.1-8b", "blocks.block", "num_attention_heads/num_key_value_heads"),
    ("qwen3-next-80b-a3b", "blocks.full", "num_attention_heads/num_key_value_heads"),
    ("gemma-3-270m", "blocks.local", "num_attention_heads/num_key_value_heads"),
    ("gpt2", "blocks.block", "n_head/n_head"),
    ("deepseek-v3", "blocks.moe", "num_attention_heads/num_attention_heads")])
def test_attention_heads_are_the_configs(slug, block, heads):
    import tomllib

    cfg = tomllib.loads((ROOT / "content/models" / slug / "model.toml").read_text())["config"]
    cfg = cfg.get("text_config", cfg)
    q, kv = (cfg[k] for k in heads.split("/"))
    spec, ledger = model(slug)
    figure = next(f for f in block_figures(spec, ledger) if f.path == block)
    (attn,) = [p for b in figure.branches for p in b.parts if p.heads is not None]
    assert attn.heads == (q, kv)
