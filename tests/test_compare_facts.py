"""Issue 25 item 5: every comparison says what changed, in architectural terms with units, each change linking the
matching component pages of both models. Expected phrases are written by hand from the model.toml configs."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.figures.compare_facts import architecture_facts, changes
from explorer.figures.model_figures import derive
from explorer.model.account import account
from explorer.model.families import load_model_spec
from explorer.views.compare_pages import compare_data, what_changed

MODELS = ROOT / "content" / "models"


def facts_of(content):
    spec = load_model_spec(content)
    ledger = account(spec)
    return architecture_facts(spec, ledger, derive(spec, ledger, None))


def summary_of(a: str, b: str) -> list[str]:
    left, right = (facts_of(load_model_content(MODELS / s)) for s in (a, b))
    return [c.phrase for c in changes(left, right)]


def test_deepseek_v3_to_v32_changes_only_the_attention_and_the_scales():
    """config.json differs in the index_* keys (sparse attention) and quantization_config.scale_fmt = "ue8m0";
    heads (128), experts (256, top 8, 8 groups), layers (61), vocabulary (129,280) and MTP (1) are the same."""
    assert summary_of("deepseek-v3", "deepseek-v3.2") == [
        "attention kind: Multi-head latent attention → DeepSeek Sparse Attention",
        "stored as: FP8 (e4m3) with one scale per 128 × 128 block → FP8 (e4m3) with one scale per 128 × 128 block, "
        "each scale a power of two (ue8m0)",
    ]


def test_deepseek_v32_to_v4_flash():
    """From the configs: num_hidden_layers 61 → 43, num_attention_heads 128 → 64, num_key_value_heads 128 → 1,
    head widths qk_nope_head_dim + qk_rope_head_dim = 128 + 64 = 192 and v_head_dim 128 → head_dim 512,
    num_experts_per_tok 8 → 6, n_group 8 → none, max_position_embeddings 163,840 → 1,048,576, sliding_window 128 and
    hc_mult 4 where V3.2 has neither; n_routed_experts
    (256), n_shared_experts (1), vocab_size (129,280) and num_nextn_predict_layers (1) unchanged."""
    phrases = summary_of("deepseek-v3.2", "deepseek-v4-flash")
    for expected in ["61 → 43 layers", "128 → 64 query heads", "128 → 1 key/value heads",
                     "head width: 192 (query/key) and 128 (value) features per head → 512 features per head",
                     "8 → 6 active experts per token", "no expert groups", "163,840 → 1,048,576 tokens of context",
                     "adds 128-position sliding window", "adds 4 residual streams (hyper-connections)"]:
        assert expected in phrases, (expected, phrases)
    joined = "; ".join(phrases)
    assert "routed experts;" not in joined and "vocabulary" not in joined and "MTP" not in joined
    assert "shared expert" not in joined


def test_kimi_k2_to_k25():
    """text_config matches Kimi K2's config except max_position_embeddings 131,072 → 262,144; K2.5 adds a vision
    tower (vision_config, 27 layers) and stores its experts in INT4 (compressed-tensors) instead of FP8."""
    phrases = summary_of("kimi-k2", "kimi-k2.5")
    assert phrases[0] == "131,072 → 262,144 tokens of context"
    assert phrases[1] == "adds vision tower (MoonViT vision tower of 27 vision blocks)"
    assert phrases[2].startswith("stored as: FP8 (e4m3) with one scale per 128 × 128 block → "
                                 "compressed-tensors pack-quantized INT4")
    assert len(phrases) == 3


def test_qwen3_moe_to_qwen35_moe():
    """num_hidden_layers 48 → 40 (30 linear_attention + 10 full_attention in layer_types), num_attention_heads
    32 → 16, num_key_value_heads 4 → 2, head_dim 128 → 256, num_experts 128 → 256 (top 8 in both), a shared expert
    (shared_expert_intermediate_size 512), max_position_embeddings 40,960 → 262,144, vocab_size 151,936 → 248,320,
    and a vision tower."""
    assert summary_of("qwen3-30b-a3b", "qwen3.5-35b-a3b") == [
        "48 → 40 layers",
        "attention kind: Grouped-query attention → Gated DeltaNet, Gated grouped-query attention",
        "32 → 16 query heads", "4 → 2 key/value heads", "128 → 256 features per head",
        "128 → 256 routed experts", "adds 1 gated shared expert",
        "40,960 → 262,144 tokens of context", "151,936 → 248,320 vocabulary entries",
        "adds vision tower (Vision tower and merger of 27 vision blocks)",
    ]


def test_deepseek_v3_to_kimi_k2_reads_as_the_issue_asks():
    """Issue 25's own example: 128 → 64 heads; 256 → 384 experts; no expert groups; no MTP."""
    phrases = summary_of("deepseek-v3", "kimi-k2")
    for expected in ["128 → 64 query heads", "256 → 384 routed experts", "no expert groups", "no MTP",
                     "layers by kind: 3 dense blocks, 58 MoE blocks → 1 dense block, 60 MoE blocks"]:
        assert expected in phrases


@pytest.mark.parametrize("key, value, expected", [
    ("n_routed_experts", 128, ["256 → 128 routed experts"]),
    ("num_experts_per_tok", 6, ["8 → 6 active experts per token"]),
    ("max_position_embeddings", 32768, ["163,840 → 32,768 tokens of context"]),
])
def test_one_changed_config_value_shows_as_its_change(key, value, expected):
    """Mutation: DeepSeek-V3 with one config value changed differs from the published one by that change alone."""
    content = load_model_content(MODELS / "deepseek-v3")
    mutated = dataclasses.replace(content, config={**content.config, key: value})
    assert [c.phrase for c in changes(facts_of(content), facts_of(mutated))] == expected
    assert changes(facts_of(content), facts_of(content)) == ()


def test_every_static_comparison_names_what_changed_and_its_links_resolve(built_site, builds):
    pages = sorted((built_site / "compare").glob("*-vs-*.html"))
    assert pages
    for page in pages:
        text = page.read_text()
        section = text[text.index('<section id="changed"'):text.index('<section id="roles"')]
        summary = re.search(r'<p class="lede what-changed">(.*?)</p>', section, re.S)
        assert summary and summary.group(1).strip(), page.name
        links = re.findall(r'href="([^"]+)"', section)
        same = summary.group(1).strip().startswith("No difference in")  # a later checkpoint (DeepSeek-R1 of V3)
        assert links or same, page.name
        for href in links:
            assert (page.parent / href).resolve().is_file(), (page.name, href)
        # both models' pages, side by side in each row
        for row in re.findall(r"<tr><th scope=\"row\">.*?</tr>", section, re.S):
            slugs = {m for m in re.findall(r'href="\.\./models/([^/]+)/', row)}
            assert len(slugs) == 2 or "none" in row, (page.name, row)


def test_static_page_summary_is_computed_from_the_picker_data(built_site, builds):
    """The static page's summary is what_changed() of the two data files' facts: the data the picker composes from."""
    left, right = (compare_data(builds[s], _totals(builds[s])) for s in ("deepseek-v3", "kimi-k2"))
    summary, rows = what_changed(left, right)
    page = (built_site / "compare/deepseek-v3-vs-kimi-k2.html").read_text()
    assert f'<p class="lede what-changed">{summary}</p>' in page
    assert "128 → 64 query heads; " in summary and summary.endswith("no MTP")
    assert rows[0].left.href == "../models/deepseek-v3/blocks.html"


def _totals(mb):
    from explorer.figures.compare_roles import role_totals

    return role_totals(mb.spec, mb.ledger)


def test_data_files_carry_the_facts(built_site, builds):
    text = (built_site / "compare/data/kimi-k2.5.js").read_text()
    assert '"key":"vision"' in text and '"href":"../models/kimi-k2.5/vision_tower.html"' in text
    assert Path(built_site / "models/kimi-k2.5/vision_tower.html").is_file()
