"""Qwen3-VL (issue 33): totals equal transformers' parameter counts on the meta device, the vision tower and its
DeepStack mergers counted apart; interleaved multimodal RoPE and DeepStack are checked against the reference on a
prompt holding an image; deliberately wrong programs (the rotary sections in blocks rather than interleaved,
DeepStack added after the wrong layers, DeepStack features read from the wrong vision blocks) fail."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.execute.executor import _check_one, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index, reference_state, tiny_reference_model
from explorer.model.account import account
from explorer.model.components import deepstack as deepstack_module
from explorer.model.components import mrope as mrope_module
from explorer.model.components.deepstack import DeepStackOptions
from explorer.model.components.mrope import MRopeOptions
from explorer.model.families import FAMILIES, load_model_spec
from explorer.spec.results import within_tolerance
from explorer.spec.types import walk

TOTALS = {
    # slug: (every parameter, the vision tower with its mergers, the DeepStack mergers alone), as transformers 5.23.0
    # counts them on the meta device (Qwen3VLForConditionalGeneration, its model.visual, model.visual.deepstack_merger_list)
    "qwen3-vl-8b": (8_767_123_696, 576_388_336, 120_377_856),
    "qwen3-vl-2b": (2_127_532_032, 406_957_056, 75_540_480),
    "qwen3-vl-4b": (4_437_815_808, 415_347_712, 81_833_472),
    "qwen3-vl-32b": (33_357_390_064, 595_266_800, 134_536_704),
    "qwen3-vl-32b-thinking": (33_357_390_064, 595_266_800, 134_536_704),
    "qwen3-vl-30b-a3b": (31_070_754_032, 538_631_408, 92_060_160),
    "qwen3-vl-235b-a22b": (235_670_022_896, 576_388_336, 120_377_856),
}


def spec_of(slug: str):
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def tiny_dense():
    tiny = tiny_spec(spec_of("qwen3-vl-8b"))
    model = tiny_reference_model(tiny)
    return tiny, model, reference_state(tiny, model)


@pytest.fixture(scope="module")
def tiny_moe():
    tiny = tiny_spec(spec_of("qwen3-vl-30b-a3b"))
    model = tiny_reference_model(tiny)
    return tiny, model, reference_state(tiny, model)


def component_error(tiny_run, path: str) -> float:
    tiny, model, weights = tiny_run
    for ancestors, comp in walk(tiny.root):
        if ".".join([a.key for a in ancestors[1:]] + [comp.key]) == path:
            return _check_one(tiny, model, weights, ancestors, comp)[0]
    raise KeyError(path)


# ------------------------------------------------------------------------------------------------- totals

@pytest.mark.parametrize("slug", list(TOTALS))
def test_totals_vision_and_deepstack_equal_transformers_on_meta(slug):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    total, vision, stacked = TOTALS[slug]
    ledger = account(spec)
    assert ledger.total == sum(p.numel() for p in model.parameters()) == total
    assert sum(r.value for r in ledger.accounts["visual"].rows) == sum(
        p.numel() for n, p in model.named_parameters() if n.startswith("model.visual.")) == vision
    assert ledger.accounts["visual.deepstack_merger_list"].total == sum(
        p.numel() for n, p in model.named_parameters() if ".deepstack_merger_list." in n) == stacked
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_8b_text_model_is_qwen3_8b_in_size():
    """The text side counts what Qwen3-8B counts (same sizes, untied head): the difference is all vision."""
    vl, text = account(spec_of("qwen3-vl-8b")), account(spec_of("qwen3-8b"))
    assert vl.total - sum(r.value for r in vl.accounts["visual"].rows) == text.total == 8_190_735_360


def test_small_models_tie_the_head_by_the_top_level_key():
    """The 2B and 4B files tie the head (top-level tie_word_embeddings, the key transformers ties by): the head holds
    no tensor of its own; the 8B's does."""
    for slug, tied in (("qwen3-vl-2b", True), ("qwen3-vl-4b", True), ("qwen3-vl-8b", False)):
        head = spec_of(slug).root.child("lm_head")
        assert bool(head.tensors[0].tied_to) is tied, slug


def test_the_full_32b_file_gives_the_sections_the_trimmed_ones_default_to():
    recorded = load_model_content(ROOT / "content/models/qwen3-vl-32b").config["text_config"]["rope_scaling"]
    assert recorded["mrope_section"] == [24, 20, 20]
    assert "text_config.rope_scaling" not in load_model_content(
        ROOT / "content/models/qwen3-vl-32b").checkpoint.config_defaulted


def test_trimmed_config_lists_every_defaulted_key_with_the_rotary_default():
    content = load_model_content(ROOT / "content/models/qwen3-vl-8b")
    family = FAMILIES["qwen3_vl"]
    recorded = content.checkpoint.config_defaulted
    assert recorded == family.defaulted_keys(content.config)
    assert {"text_config.rope_scaling", "vision_start_token_id", "vision_end_token_id"} <= set(recorded)
    spec = spec_of("qwen3-vl-8b")
    assert family.defaulted_value(spec.config, "text_config.rope_scaling")["mrope_section"] == [24, 20, 20]
    assert family.default_source("text_config.rope_scaling") == "Qwen3VLTextRotaryEmbedding"
    assert family.default_source("vision_config.depth") == "Qwen3VLVisionConfig"
    rope = spec.root.child("blocks").child("block").child("attn").child("rope")
    assert rope.options.sections == (24, 20, 20) and rope.options.theta == 5_000_000


# ------------------------------------------------------------------------------ interleaved multimodal RoPE

def test_pairs_are_dealt_out_in_turn_within_the_sections():
    """Written out by hand for 12 pairs sectioned (6, 3, 3): height takes j ≡ 1 (mod 3) below 9, width j ≡ 2 below 9."""
    o = MRopeOptions("default", 10_000.0, 24, sections=(6, 3, 3))
    assert mrope_module.pair_axes(o).tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 0, 0]


def test_image_positions_follow_get_rope_index(tiny_dense):
    """Our layout of one image's positions equals the reference's get_rope_index for the same prompt, and a small
    case written out by hand."""
    assert mrope_module.image_positions(1, 2, 3, 1).tolist() == [[0, 1, 1, 1, 1, 1, 1, 4], [0, 1, 1, 1, 2, 2, 2, 4],
                                                                [0, 1, 2, 3, 1, 2, 3, 4]]
    tiny, model, _ = tiny_dense
    before, rows, cols, after = mrope_module.EXAMPLE
    kinds = torch.tensor([[0] * before + [1] * (rows * cols) + [0] * after])
    ids = torch.where(kinds == 1, tiny.config.image_token_id, 5)
    merge = tiny.config.vision_config.spatial_merge_size
    theirs, _ = model.model.get_rope_index(ids, mm_token_type_ids=kinds,
                                           image_grid_thw=torch.tensor([[1, rows * merge, cols * merge]]))
    assert torch.equal(theirs[:, 0], mrope_module.image_positions(*mrope_module.EXAMPLE))


def _blocked(o, device=None):
    """Qwen2-VL's layout: time's section first, then height's, then width's."""
    t, h, w = o.sections
    return torch.tensor([0] * t + [1] * h + [2] * w, device=device)


def test_multimodal_rope_matches_the_reference_on_an_image_prompt(tiny_dense):
    assert within_tolerance(component_error(tiny_dense, "blocks.block.attn.rope"))


def test_sections_in_blocks_not_interleaved_fail(tiny_dense, monkeypatch):
    monkeypatch.setattr(mrope_module, "pair_axes", _blocked)
    assert not within_tolerance(component_error(tiny_dense, "blocks.block.attn.rope"))
    assert not within_tolerance(component_error(tiny_dense, "blocks"))


def test_text_positions_give_the_plain_rotary_angles():
    """A text token's three positions are one, so whatever the layout its angles are the plain ones."""
    o = MRopeOptions("default", 10_000.0, 24, sections=(6, 3, 3))
    from explorer.model.components.base import Run
    from explorer.model.components.rope import rotary_angles

    t = torch.arange(7)
    assert torch.equal(mrope_module.multimodal_angles(Run({}), o, t), rotary_angles(Run({}), o, t))


# ------------------------------------------------------------------------------------------------ DeepStack

def test_deepstack_stack_matches_the_reference_text_model_on_an_image_prompt(tiny_dense):
    assert within_tolerance(component_error(tiny_dense, "blocks"))


def test_deepstack_added_after_the_wrong_layers_fails(tiny_dense, monkeypatch):
    monkeypatch.setattr(deepstack_module, "injection_layers", lambda o: tuple(range(1, o.levels + 1)))
    assert not within_tolerance(component_error(tiny_dense, "blocks"))


def test_deepstack_features_and_merged_tokens_match_the_reference_tower(tiny_dense):
    assert within_tolerance(component_error(tiny_dense, "visual"))
    assert within_tolerance(component_error(tiny_dense, "visual.deepstack_merger_list"))


def test_deepstack_features_from_the_wrong_vision_blocks_fail(tiny_dense):
    tiny, model, weights = tiny_dense
    tower = tiny.root.child("visual")
    mergers = tower.child("deepstack_merger_list")
    taps = options_of(mergers).vision_layers
    shifted = dataclasses.replace(mergers, options=DeepStackOptions(tuple(i + 1 for i in taps)))
    wrong = dataclasses.replace(tower, children=tuple(shifted if c is mergers else c for c in tower.children))
    assert not within_tolerance(_check_one(tiny, model, weights, (tiny.root,), wrong)[0])


def options_of(comp) -> DeepStackOptions:
    assert isinstance(comp.options, DeepStackOptions)
    return comp.options


# ----------------------------------------------------------------------------------------- the MoE family

def test_moe_text_models_are_qwen3_moe_in_size():
    """The MoE models' text sides count what Qwen3-30B-A3B and Qwen3-235B-A22B count: the difference is all vision."""
    for vl, text in (("qwen3-vl-30b-a3b", "qwen3-30b-a3b"), ("qwen3-vl-235b-a22b", "qwen3-235b-a22b")):
        ledger = account(spec_of(vl))
        assert ledger.total - sum(r.value for r in ledger.accounts["visual"].rows) == account(spec_of(text)).total


def test_moe_stack_rope_and_experts_match_the_reference_on_an_image_prompt(tiny_moe):
    for path in ("blocks", "blocks.moe.attn.rope", "blocks.moe.moe", "visual"):
        assert within_tolerance(component_error(tiny_moe, path)), path


def test_moe_deepstack_after_the_wrong_layers_and_blocked_sections_fail(tiny_moe, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(deepstack_module, "injection_layers", lambda o: tuple(range(1, o.levels + 1)))
        assert not within_tolerance(component_error(tiny_moe, "blocks"))
    monkeypatch.setattr(mrope_module, "pair_axes", _blocked)
    assert not within_tolerance(component_error(tiny_moe, "blocks.moe.attn.rope"))


def test_moe_family_requires_the_renormalised_router():
    """transformers 5.23 always renormalises the selected experts' probabilities: a file that says otherwise is
    refused, naming the key."""
    from explorer.errors import ContentError

    content = load_model_content(ROOT / "content/models/qwen3-vl-30b-a3b")
    config = {**content.config, "text_config": {**content.config["text_config"], "norm_topk_prob": False}}
    with pytest.raises(ContentError, match="key 'text_config.norm_topk_prob': must be true"):
        FAMILIES["qwen3_vl_moe"].validate(config, "test")


# ------------------------------------------------------------------ the MoE experts as the checkpoint stores them

def test_moe_experts_are_stored_fused_input_axis_first():
    """Issue 35 item 3: the ledger and the predicted layout name each layer's experts as the published checkpoint
    and transformers do, two fused tensors, gate_up_proj [E, d, 2·I] and down_proj [E, I, d] (30B-A3B: 128 experts,
    d 2048, I 768), with the per-expert counts' total."""
    from explorer.checkpoint.reconcile import predicted_index

    spec = spec_of("qwen3-vl-30b-a3b")
    stored = predicted_index(spec).tensors
    p = "model.language_model.layers.0.mlp."
    assert {n.removeprefix(p) for n in stored if n.startswith(p)} == {
        "gate.weight", "experts.gate_up_proj", "experts.down_proj"}
    assert tuple(stored[p + "experts.gate_up_proj"].shape) == (128, 2048, 2 * 768)
    assert tuple(stored[p + "experts.down_proj"].shape) == (128, 768, 2048)
    assert account(spec).accounts["blocks.moe.moe.experts"].per_instance == 128 * 3 * 2048 * 768


def test_the_predicted_layout_loads_into_the_reference_by_its_own_loader(tmp_path):
    """A tiny checkpoint written with the predicted names, shapes and dtypes loads through transformers'
    from_pretrained (its conversion mapping for qwen3_vl_moe transposes the fused experts) with no key missing,
    unexpected or mismatched; every tensor arrives as written, the experts transposed, and the family's renames
    turn the loaded state back into the file."""
    from safetensors.torch import save_file
    from transformers import Qwen3VLMoeForConditionalGeneration

    from explorer.checkpoint.reconcile import predicted_index
    from explorer.model.families.renames import transpose_fused_experts

    tiny = tiny_spec(spec_of("qwen3-vl-30b-a3b"))
    generator = torch.Generator().manual_seed(3)
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16}  # the tiny spec's is F32, the published BF16
    written = {name: torch.randn(tuple(t.shape), generator=generator).to(dtypes[t.dtype])
               for name, t in predicted_index(tiny).tensors.items()}
    tiny_reference_model(tiny).config.save_pretrained(tmp_path)
    save_file(written, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model, info = Qwen3VLMoeForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True,
                                                                    dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    loaded = model.state_dict()
    gate_up = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    assert torch.equal(loaded[gate_up], written[gate_up].transpose(1, 2))
    back = transpose_fused_experts({n: loaded[n] for n in written})
    assert all(torch.equal(back[n], written[n]) for n in written)


def test_moe_experts_match_the_reference_experts_module(tiny_moe):
    """Our fused experts, reading the stored [E, d, 2·I] and [E, I, d] tensors, equal Qwen3VLMoeTextExperts on every
    expert."""
    assert within_tolerance(component_error(tiny_moe, "blocks.moe.moe.experts"))


def test_moe_experts_with_gate_and_up_swapped_or_a_transpose_missed_fail(tiny_moe, monkeypatch):
    """The gate and up halves swapped fail on values; the stored gate_up read as transformers holds it ([E, 2·I, d],
    the transpose missed) cannot run on the tiny sizes (d 64, 2·I 96)."""
    from explorer.errors import ExecutionError
    from explorer.model.components import parallel_moe

    halves = parallel_moe.gate_up_halves
    with monkeypatch.context() as m:
        m.setattr(parallel_moe, "gate_up_halves", lambda o, x, w: halves(o, x, w)[::-1])
        assert not within_tolerance(component_error(tiny_moe, "blocks.moe.moe.experts"))
        assert not within_tolerance(component_error(tiny_moe, "blocks.moe.moe"))
    out_in = dataclasses.replace(parallel_moe.HalvesExpertsOptions(4, "silu"), in_out=False)
    monkeypatch.setattr(parallel_moe, "gate_up_halves", lambda o, x, w: halves(out_in, x, w))
    with pytest.raises(ExecutionError, match="experts › step 'gate-up'"):
        component_error(tiny_moe, "blocks.moe.moe.experts")
