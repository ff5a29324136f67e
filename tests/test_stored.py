"""One meaning of "Parameters stored" (issue 35): every learned parameter the release's checkpoint holds, tied tensors
once, the multi-token-prediction layers included wherever the config declares them, counted apart, and from the
config with the family's own formula where transformers does not build them. Every model follows it; leaving an MTP
module out fails."""

from __future__ import annotations

import dataclasses
import html
import json
from functools import cache
from pathlib import Path

import pytest
import sympy
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.figures.model_figures import derive
from explorer.figures.stored import STORED_DEFINITION
from explorer.model.account import account
from explorer.model.components.part_facts import facts
from explorer.model.families import load_model_spec
from explorer.spec.types import ModelSpec, walk

SLUGS = sorted(p.name for p in (ROOT / "content/models").iterdir())
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")
"""The config keys that declare multi-token-prediction layers, in any family here."""


def declared_in_config(config: dict) -> int:
    """MTP layers the published config declares, read from its own keys (not from the family's parse)."""
    tables = [config, config.get("text_config") or {}]
    if config.get("use_mtp") is False:
        return 0
    return max((int(t.get(k) or 0) for t in tables for k in MTP_KEYS), default=0)


@cache
def model(slug: str) -> tuple[dict, ModelSpec]:
    """The published config (with any MTP key it omits at the reference config class's default, as the model page
    lists it: GLM-4.7's num_nextn_predict_layers) and the spec."""
    content = load_model_content(ROOT / "content/models" / slug)
    spec = load_model_spec(content)
    defaults = {k: getattr(spec.config, k) for k in MTP_KEYS if k in content.checkpoint.config_defaulted}
    return {**content.config, **defaults}, spec


def parameter_elements(spec: ModelSpec) -> tuple[int, int]:
    """(main model, MTP) parameters summed tensor by tensor from the spec's shapes (each tensor family's own count of
    tensors × its shape), not from the ledger's rows: the tree's MTP module, plus the declared module × its count."""
    values = spec.values
    main = mtp = 0

    def elements(comp, times: int = 1) -> int:
        out = 0
        for t in comp.tensors:
            if t.is_parameter and t.shape is not None:
                size = 1
                for dim in map(sympy.sympify, t.shape):
                    size *= int(dim.xreplace({sym: values[sym.name] for sym in dim.free_symbols}))
                out += size * times
        return out

    for ancestors, comp in walk(spec.root):
        inside_mtp = any(facts(c.program).mtp for c in (*ancestors, comp))
        n = 1
        for c in (*ancestors[1:], comp):
            n *= c.repeat
        if inside_mtp:
            mtp += elements(comp, n)
        else:
            main += elements(comp, n)
    if spec.declared_mtp is not None:
        d = spec.declared_mtp
        for ancestors, comp in walk(d.module):
            n = d.count
            for c in (*ancestors[1:], comp):
                n *= c.repeat
            mtp += elements(comp, n)
    return main, mtp


def stored_problems(config: dict, spec: ModelSpec, figures) -> list[str]:
    """Where a model's stated stored figure breaks the definition: not the sum of its parts, an MTP part the config
    declares missing, or the definition not stated."""
    main, mtp = parameter_elements(spec)
    total = figures.get("total_parameters")
    shown = next((f.value for f in figures.figures if f.key == "mtp_parameters"), 0)
    out = []
    if total.value != main + mtp:
        out.append(f"stored {total.value:,} is not main model {main:,} + MTP {mtp:,}")
    if shown != mtp:
        out.append(f"MTP shown apart as {shown:,}, its tensors hold {mtp:,}")
    if declared_in_config(config) and not mtp:
        out.append(f"the config declares {declared_in_config(config)} MTP layer(s) and none is counted")
    if total.definition != STORED_DEFINITION:
        out.append("the figure does not state the one definition")
    return out


@pytest.mark.parametrize("slug", SLUGS)
def test_every_models_stored_figure_is_main_model_plus_its_mtp_layers(slug: str):
    config, spec = model(slug)
    assert stored_problems(config, spec, derive(spec, account(spec), None)) == []


@pytest.mark.parametrize("slug", ["deepseek-v4-flash", "qwen3.5-35b-a3b", "minimax-m2.5", "glm-4.7"])
def test_an_mtp_module_left_out_fails(slug: str):
    config, spec = model(slug)
    assert spec.declared_mtp is not None
    without = dataclasses.replace(spec, declared_mtp=None)  # the figures of a spec that leaves the module out
    problems = stored_problems(config, spec, derive(without, account(without), None))
    assert any("is not main model" in p for p in problems), problems
    assert any("none is counted" in p for p in stored_problems(config, without, derive(without, account(without), None)))


def test_deepseek_v3s_built_module_left_out_fails():
    config, spec = model("deepseek-v3")
    root = dataclasses.replace(spec.root, children=tuple(c for c in spec.root.children if c.key != "mtp"))
    without = dataclasses.replace(spec, root=root)
    problems = stored_problems(config, without, derive(without, account(without), None))
    assert problems == ["the config declares 1 MTP layer(s) and none is counted"]


def _by_hand(slug: str) -> tuple[dict, dict, dict]:
    config, spec = model(slug)
    ledger = account(spec)
    f = {x.key: x.value for x in derive(spec, ledger, None).figures}
    return config, f, {p: a.per_instance for p, a in ledger.accounts.items()}


def test_deepseek_v4_flash_counts_its_6_6b_mtp_layer():
    """The audit's "about 6.6B": one sliding-attention layer (compress_ratios[43] = 0) routed by score, e_proj and
    h_proj (d × d each), three RMSNorms and the hyper-connection head (hc × hc·d + hc + 1). The main model's sliding
    layers are hash-routed; the two routers hold the same gate [E, d] parameters (the token table and the correction
    bias are buffers), so the layer counts as one of them."""
    config, f, per = _by_hand("deepseek-v4-flash")
    d, hc = config["hidden_size"], config["hc_mult"]
    assert config["compress_ratios"][config["num_hidden_layers"]] == 0
    layer = per["blocks.sliding_hash"]
    assert f["mtp_parameters"] == layer + 2 * d * d + 3 * d + hc * hc * d + hc + 1 == 6_610_048_635
    assert 6.5e9 < f["mtp_parameters"] < 6.7e9
    assert f["total_parameters"] == 284_332_230_231 + 6_610_048_635


@pytest.mark.parametrize("slug, block", [("qwen3.5-35b-a3b", "blocks.full"), ("qwen3.5-27b", "blocks.full"),
                                         ("qwen3.5-397b-a17b", "blocks.full")])
def test_qwen35_counts_its_mtp_layer(slug: str, block: str):
    """mtp.fc [d, 2d], two RMSNorms before it, one after, and one full-attention layer of the main model's kind."""
    config, f, per = _by_hand(slug)
    d = config["text_config"]["hidden_size"]
    assert f["mtp_parameters"] == per[block] + 2 * d * d + 3 * d


def test_minimax_counts_three_modules_on_the_assumed_layout():
    config, f, per = _by_hand("minimax-m2.5")
    d = config["hidden_size"]
    assert config["num_mtp_modules"] == 3 and config["mtp_transformer_layers"] == 1
    assert f["mtp_parameters"] == 3 * (per["blocks.moe"] + 2 * d * d + 3 * d)


def test_mimo_declares_none_and_says_so():
    config, spec = model("mimo-v2-flash")
    assert declared_in_config(config) == 0 and spec.declared_mtp is None
    assert any("the stored figure is the main model's" in n for n in spec.root.notes)


@pytest.mark.parametrize("slug", ["deepseek-v4-flash", "kimi-k2", "deepseek-v3"])
def test_the_definition_is_stated_where_the_figure_appears(built_site: Path, slug: str):
    page = html.unescape((built_site / "models" / slug / "index.html").read_text(encoding="utf-8"))
    assert page.count(STORED_DEFINITION) == 1
    data = json.loads((built_site / "api" / f"{slug}.json").read_text(encoding="utf-8"))
    assert data["stored_definition"] == STORED_DEFINITION
    assert data["total_parameters"] == next(f["value"] for f in data["figures"] if f["key"] == "total_parameters")
    index = html.unescape((built_site / "index.html").read_text(encoding="utf-8"))
    assert index.count(STORED_DEFINITION) == 1


def test_glm5s_embedding_and_head_copies_are_given_both_ways():
    """The audit's "about 1.9B" of copies GLM-5's release may lack: the MTP figure says how much they are and what
    the module holds without them, and that no listing settles it."""
    config, f, _ = _by_hand("glm-5")
    copies = 2 * config["vocab_size"] * config["hidden_size"]
    _, spec = model("glm-5")
    definition = next(x.definition for x in derive(spec, account(spec), None).figures if x.key == "mtp_parameters")
    assert f"({copies:,} together)" in definition and copies == 1_903_165_440
    assert f"without the copies they hold {f['mtp_parameters'] - copies:,}" in definition
    assert "no tensor listing recorded here settles whether this release stores them" in definition


def test_the_compare_pages_state_the_definition(built_site: Path):
    picker = html.unescape((built_site / "compare" / "index.html").read_text(encoding="utf-8"))
    assert picker.count(STORED_DEFINITION) == 1
    pair = next((built_site / "compare").glob("*-vs-*.html"))
    assert html.unescape(pair.read_text(encoding="utf-8")).count(STORED_DEFINITION) == 1
