"""Keys that later published configs of covered families carry (issue 32, the sweep of the reference configs):
NVIDIA's GLM-5.2/5.3 repacks publish layer_types, mlp_bias and num_experts, its MiniMax-M2.5/M2.7 repacks
partial_rotary_factor and sliding_window (null). Each is modelled as the reference config class reads it, or shown
on the reference to change nothing, and a value the family cannot model is refused naming the key."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import check_equations
from explorer.execute.reference import reference_index, tiny_reference_model, transformers_config
from explorer.model.account import account
from explorer.model.families import FAMILIES, family_config
from explorer.model.published_keys import classify
from explorer.spec.types import ModelSpec


@cache
def site_raw(slug: str) -> dict:
    """A site model's config as its family reads it (keys recorded as unused left out)."""
    return family_config(load_model_content(ROOT / "content/models" / slug))


def tiny_raw(family: str, slug: str) -> dict:
    fam = FAMILIES[family]
    return fam.tiny_config(fam.build_spec(slug, site_raw(slug), "test").config)


def rope_dim(spec: ModelSpec) -> int:
    return spec.root.child("blocks").child("moe").child("attn").child("rope").options.dim


# ------------------------------------------------------------------------------------------------- GLM-MoE-DSA

NOT_BUILT = FAMILIES["glm_moe_dsa"].reference.not_built
"""The MTP layer, which transformers does not build."""


def test_num_experts_is_read_as_n_routed_experts_as_the_reference_reroutes_it():
    """GlmMoeDsaConfig sets n_routed_experts to a published num_experts: the family builds that many experts and
    balances against the reference built from the config as published; a family ignoring num_experts does not."""
    family = FAMILIES["glm_moe_dsa"]
    raw = tiny_raw("glm_moe_dsa", "glm-5.2")
    experts = raw["n_routed_experts"]
    spec = family.build_spec("rerouted", {**raw, "num_experts": 2 * experts}, "test")
    assert spec.config.n_routed_experts == 2 * experts
    ignoring = family.build_spec("ignoring", raw, "test")
    published = dataclasses.replace(ignoring, config=dataclasses.replace(ignoring.config, num_experts=2 * experts))
    assert transformers_config(published)["n_routed_experts"] == experts  # the reference is handed both keys
    index = reference_index(published).index
    assert reconcile(spec, index, reference=True, skip_owners=NOT_BUILT).balanced
    assert not reconcile(ignoring, index, reference=True, skip_owners=NOT_BUILT).balanced


def test_glm_5_2_with_the_repack_keys_keeps_its_total():
    family = FAMILIES["glm_moe_dsa"]
    raw = site_raw("glm-5.2")
    newer = {**raw, "layer_types": ["deepseek_sparse_attention"] * raw["num_hidden_layers"], "mlp_bias": False,
             "num_experts": raw["n_routed_experts"]}
    assert account(family.build_spec("newer", newer, "test")).total == 755_233_086_464  # GLM-5.2's page


def tiny_glm_outputs(extra: dict):
    """The tiny GLM-5.2 reference's parameter shapes and logits with `extra` set on its config."""
    import torch

    family = FAMILIES["glm_moe_dsa"]
    tiny = family.build_spec("tiny", tiny_raw("glm_moe_dsa", "glm-5.2"), "tiny")
    tiny = dataclasses.replace(tiny, config=dataclasses.replace(tiny.config, **extra))
    model = tiny_reference_model(tiny)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3, 4, 5]])).logits
    return {n: tuple(t.shape) for n, t in model.state_dict().items()}, logits


def test_mlp_bias_and_layer_types_change_no_tensor_and_no_output():
    """mlp_bias true and layer_types in its old spelling: the tiny reference has the same tensors and logits; a key
    that does change the model (the expert count) changes its tensors."""
    import torch

    layers = tiny_raw("glm_moe_dsa", "glm-5.2")["num_hidden_layers"]
    shapes, logits = tiny_glm_outputs({})
    varied_shapes, varied = tiny_glm_outputs({"mlp_bias": True,
                                              "layer_types": ("deepseek_sparse_attention",) * layers})
    assert varied_shapes == shapes
    assert torch.equal(varied, logits)
    experts = tiny_raw("glm_moe_dsa", "glm-5.2")["n_routed_experts"]
    assert tiny_glm_outputs({"n_routed_experts": 2 * experts})[0] != shapes


def test_layer_types_the_family_cannot_build_are_refused():
    import transformers

    family = FAMILIES["glm_moe_dsa"]
    raw = site_raw("glm-5.2")
    n = raw["num_hidden_layers"]
    legacy = transformers.GlmMoeDsaConfig(num_hidden_layers=2, layer_types=["deepseek_sparse_attention"] * 2)
    assert legacy.layer_types == ["indexed_attention"] * 2  # the old spelling, as the base class renames it
    for bad in (["full_attention"] * n, ["indexed_attention"] * (n - 1)):
        with pytest.raises(ContentError, match="key 'layer_types': must name 'indexed_attention'"):
            family.validate({**raw, "layer_types": bad}, "test")


# ------------------------------------------------------------------------------------------------- MiniMax-M2

def test_a_published_partial_rotary_factor_wins_over_rotary_dim():
    """MiniMaxM2Config derives the factor from rotary_dim only where none is published: at full size the reference
    rotates head_dim × partial_rotary_factor features, and so does the family."""
    import transformers

    family = FAMILIES["minimax_m2"]
    raw = site_raw("minimax-m2.5")
    assert rope_dim(family.build_spec("m", raw, "test")) == raw["rotary_dim"] == 64
    spec = family.build_spec("quarter", {**raw, "partial_rotary_factor": 0.25, "sliding_window": None}, "test")
    config = transformers.MiniMaxM2Config(**transformers_config(spec))
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    assert rope_dim(spec) == 32 == int(config.head_dim * 0.25)


def test_the_tiny_check_rotates_by_the_published_factor_and_fails_without_it():
    family = FAMILIES["minimax_m2"]
    raw = tiny_raw("minimax_m2", "minimax-m2.5")  # rotary_dim 8 of head_dim 16
    base = family.build_spec("m", site_raw("minimax-m2.5"), "test")
    tiny = family.build_spec("tiny", {**raw, "partial_rotary_factor": 0.25}, "tiny")
    assert rope_dim(tiny) == 4
    checks = check_equations(base, tiny)
    assert all(checks[p].status == "checked" for p in checks if p.endswith(".attn"))
    ignoring = family.build_spec("tiny", raw, "tiny")  # rotates rotary_dim's 8: the reference rotates 4
    with pytest.raises(ExecutionError, match=r"blocks.moe.attn: max \|Δ\|"):
        check_equations(base, dataclasses.replace(ignoring, config=tiny.config))


def test_a_set_sliding_window_or_a_bad_factor_is_refused():
    family = FAMILIES["minimax_m2"]
    raw = site_raw("minimax-m2.5")
    with pytest.raises(ContentError, match="key 'sliding_window': must be null"):
        family.validate({**raw, "sliding_window": 4096}, "test")
    with pytest.raises(ContentError, match="key 'partial_rotary_factor': must be in"):
        family.validate({**raw, "partial_rotary_factor": 1.5}, "test")


def test_an_unset_factor_is_not_handed_to_the_reference():
    """MiniMaxM2Config reads a partial_rotary_factor handed as None as "no factor" (whole heads rotate, rotary_dim
    ignored): the family hands the key only where published, so the reference derives it from rotary_dim."""
    import transformers

    spec = FAMILIES["minimax_m2"].build_spec("m", site_raw("minimax-m2.5"), "test")
    handed = transformers_config(spec)
    assert "partial_rotary_factor" not in handed
    assert transformers.MiniMaxM2Config(**handed).rope_parameters["partial_rotary_factor"] == 0.5
    as_none = transformers.MiniMaxM2Config(**handed, partial_rotary_factor=None)
    assert "partial_rotary_factor" not in as_none.rope_parameters


# ------------------------------------------------------------------------------------------------- NVFP4 repacks

NVFP4_BLOCK = {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": {"name": "modelopt"},
               "config_groups": {"group_0": {"targets": ["Linear"]}}, "ignore": ["lm_head"],
               "kv_cache_scheme": {"num_bits": 8}, "group_size": 16}
"""The shape of a ModelOpt NVFP4 repack's quantization_config (as NVIDIA's Qwen3.6 and GLM-5.x repacks publish it)."""


def test_a_quantization_block_is_refused_in_one_line_that_points_at_add_variant():
    """Every key of a block the family cannot lay out is one problem: the block named with its keys, and where such
    a config goes; a single key is still named by its dotted path."""
    raw = {**site_raw("qwen3-8b"), "quantization_config": NVFP4_BLOCK}
    with pytest.raises(ContentError) as info:
        classify(FAMILIES["qwen3"], raw, "test")
    assert len(info.value.problems) == 1
    line = info.value.problems[0]
    assert "\n" not in line and "key 'quantization_config' (config_groups, group_size, ignore, kv_cache_scheme, …)" in line
    assert "--add-model" in line and "--add-variant BASE --quant-config FILE" in line
    with pytest.raises(ContentError, match=r"key 'quantization_config\.producer': .* --add-variant"):
        classify(FAMILIES["qwen3"], {**raw, "quantization_config": {"quant_method": "fp8", "producer": {}}}, "test")
