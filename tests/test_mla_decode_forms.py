"""Issue 19 item 3 (MLA): the decode FLOPs have two conventions, and the model page's figures and the calculator show
both, with their formulas, and say which one the headline figure counts. Expected values are written out from the
config values of content/models/deepseek-v3/model.toml."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.figures.calculator import calculator_view, evaluate
from explorer.figures.model_figures import derive
from explorer.model.account import account
from explorer.model.families import load_model_spec

# DeepSeek-V3's config: num_attention_heads = 128, qk_nope_head_dim = 128, qk_rope_head_dim = 64, v_head_dim = 128,
# kv_lora_rank = 512, num_hidden_layers = 61 (every one MLA; the MTP layer is not part of decode).
HEADS, NOPE, ROPE, V, RANK, LAYERS = 128, 128, 64, 128, 512, 61
UNABSORBED = 2 * HEADS * (NOPE + ROPE + V)  # per-head keys and values: 81,920
ABSORBED = 2 * HEADS * (2 * RANK + ROPE)  # scores against the 512 latent + 64 rotary key, values summed in the latent


def figures_of(**config_changes):
    content = load_model_content(ROOT / "content/models/deepseek-v3")
    if config_changes:
        content = dataclasses.replace(content, config={**content.config, **config_changes})
    spec = load_model_spec(content)
    ledger = account(spec)
    return derive(spec, ledger, None)


def test_hand_computed_per_position_costs():
    assert (UNABSORBED, ABSORBED) == (81_920, 278_528)
    f = figures_of()
    assert f.get("mla_flops_per_key_unabsorbed").value == UNABSORBED
    assert f.get("mla_flops_per_key_absorbed").value == ABSORBED
    assert f.get("mla_flops_per_key_unabsorbed").formula.endswith("= 2 × 128 × (128 + 64 + 128)")
    assert f.get("mla_flops_per_key_absorbed").formula.endswith("= 2 × 128 × (2 × 512 + 64)")


def test_both_decode_figures_at_4096_and_which_one_the_headline_counts():
    f = figures_of()
    projections = 2 * f.get("active_parameters_no_embedding").value  # untied head: every matrix a token multiplies
    assert f.get("flops_decode").value == projections + LAYERS * UNABSORBED * 4_096
    assert f.get("flops_decode_absorbed").value == projections + LAYERS * ABSORBED * 4_096
    assert f.get("flops_decode_absorbed").value - f.get("flops_decode").value == 61 * (278_528 - 81_920) * 4_096
    assert "MLA layers are counted unabsorbed" in f.get("flops_decode").definition
    assert "(counted)" in f.get("mla_flops_per_key_unabsorbed").label


@pytest.mark.parametrize("context", [1, 1_000, 163_840])
def test_calculator_shows_both_decode_lines(context):
    f = figures_of()
    e = evaluate(f.serving, context)
    projections = 2 * f.serving.matmul
    assert e.get("decode").value == projections + LAYERS * UNABSORBED * context
    assert e.get("decode-absorbed").value == projections + LAYERS * ABSORBED * context
    assert "MLA unabsorbed" in e.get("decode").label and "MLA absorbed" in e.get("decode-absorbed").label
    view = calculator_view(f.serving, "max_position_embeddings")
    assert [v for _, v, _ in view.decode_forms] == ["81,920", "278,528"]


def test_a_model_without_mla_has_one_decode_line():
    content = load_model_content(ROOT / "content/models/qwen3-8b")
    spec = load_model_spec(content)
    f = derive(spec, account(spec), None)
    assert [line.key for line in evaluate(f.serving, 100).lines if line.key.startswith("decode")] == ["decode"]
    assert "flops_decode_absorbed" not in {x.key for x in f.figures}
    assert calculator_view(f.serving, "max_position_embeddings").decode_forms == ()


def test_mutation_a_narrower_latent_changes_only_the_absorbed_cost():
    """kv_lora_rank 512 → 256: the absorbed form reads the latent, the unabsorbed form per-head keys and values."""
    f = figures_of(kv_lora_rank=256)
    assert f.get("mla_flops_per_key_absorbed").value == 2 * 128 * (2 * 256 + 64) != ABSORBED
    assert f.get("mla_flops_per_key_unabsorbed").value == UNABSORBED


def test_mutation_a_wrong_absorbed_cost_is_caught(monkeypatch):
    """A deliberately wrong absorbed form (the rotary key left out) makes the hand-computed check fail."""
    from explorer.model.components import mla

    real = mla.decode_costs

    def wrong(o):
        absorbed, expanded = real(o)
        return dataclasses.replace(absorbed, per_key=o.heads * 2 * o.kv_lora_rank), expanded

    monkeypatch.setattr(mla, "decode_costs", wrong)
    with pytest.raises(AssertionError):
        test_hand_computed_per_position_costs()


@pytest.mark.parametrize("slug", ["deepseek-v3", "deepseek-v3.2", "kimi-k2", "kimi-k2.5", "glm-5"])
def test_every_mla_model_states_both(slug):
    content = load_model_content(ROOT / f"content/models/{slug}")
    spec = load_model_spec(content)
    f = derive(spec, account(spec), None)
    keys = {x.key for x in f.figures}
    assert {"flops_decode", "flops_decode_absorbed", "mla_flops_per_key_unabsorbed",
            "mla_flops_per_key_absorbed"} <= keys
    assert len(calculator_view(f.serving, "max_position_embeddings").decode_forms) == 2


def test_the_mla_page_names_both_costs_and_which_one_the_figure_counts():
    from explorer.spec.types import walk

    def mla_notes(**config_changes):
        content = load_model_content(ROOT / "content/models/deepseek-v3")
        content = dataclasses.replace(content, config={**content.config, **config_changes})
        return " ".join(next(c for _, c in walk(load_model_spec(content).root) if c.program == "mla").notes)

    notes = mla_notes()
    assert f"= {UNABSORBED:,} (the model page's decode figure counts this form" in notes
    assert f"= {ABSORBED:,}" in notes and "576-element cache" in notes
    assert f"= {ABSORBED:,}" not in mla_notes(kv_lora_rank=256)  # the note follows the config
