"""The published sibling checkpoints of issue 32 (item 3) that needed a family to read a key it did not: Qwen3.6's
top-level partial_rotary_factor, Kimi K2.7's text_config.rope_parameters, Kimi K2.6's and K2.7's NVFP4 repacks
matched by the checkpoint's own module names, and a config whose unused nested key is null. Each sibling's totals
are transformers' on meta; each key, read wrongly, fails."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.checkpoint.variants import load_variants, stored_as
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.execute.reference import build_reference_model, reference_index
from explorer.model.account import account
from explorer.model.families import FAMILIES, load_model_spec
from explorer.spec.types import ModelSpec, walk


def content_of(slug: str):
    return load_model_content(ROOT / "content/models" / slug)


def spec_of(slug: str) -> ModelSpec:
    return load_model_spec(content_of(slug))


def read_table(slug: str) -> dict:
    """The config table as the family reads it (without the published keys nothing reads)."""
    c = content_of(slug)
    unused = set(c.checkpoint.config_unused)

    def drop(table: dict, prefix: str = "") -> dict:
        return {k: drop(v, f"{prefix}{k}.") if isinstance(v, dict) else v for k, v in table.items()
                if f"{prefix}{k}" not in unused}
    return drop(c.config)


# ----------------------------------------------------------------------------------------- the same sizes

@pytest.mark.parametrize(("slug", "sibling"), [("qwen3.6-27b", "qwen3.5-27b"), ("qwen3.6-35b-a3b", "qwen3.5-35b-a3b"),
                                               ("kimi-k2.6", "kimi-k2.5"), ("kimi-k2.7-code", "kimi-k2.5")])
def test_a_sibling_of_the_same_architecture_has_its_parameters_and_transformers_agrees(slug, sibling):
    """Kimi's routers' correction biases are persistent buffers in the reference, parameters in this family's
    ledger (as Kimi K2's checkpoint lists them): the state dict holds both, and no tensor is tied here."""
    spec = spec_of(slug)
    model = build_reference_model(spec)
    assert sum(t.numel() for t in model.state_dict().values()) == account(spec_of(sibling)).total == account(spec).total
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced


def test_dense_gemma4_has_no_experts_and_balances():
    spec = spec_of("gemma-4-31b-it")
    c = spec.config.text_config
    assert not c.enable_moe_block
    assert not any("experts" in t.template for _, comp in walk(spec.root) for t in comp.tensors)
    model = build_reference_model(spec)
    assert sum(p.numel() for p in model.parameters()) == account(spec).total
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced


# ------------------------------------------------------------------------------ Qwen3.6: partial_rotary_factor

def test_the_top_level_partial_rotary_factor_must_agree_with_rope_parameters():
    raw = read_table("qwen3.6-27b")
    family = FAMILIES["qwen3_5"]
    assert raw["text_config"]["partial_rotary_factor"] == raw["text_config"]["rope_parameters"]["partial_rotary_factor"]
    family.validate(raw, "qwen3.6-27b")  # as published: the same 0.25 twice
    wrong = json.loads(json.dumps(raw))
    wrong["text_config"]["partial_rotary_factor"] = 0.5
    with pytest.raises(ContentError, match=r"key 'text_config.partial_rotary_factor': must equal rope_parameters"):
        family.validate(wrong, "qwen3.6-27b")


# ---------------------------------------------------------------------------------- Kimi K2.7: rope_parameters

def test_rope_parameters_are_read_as_rope_scaling_and_rope_theta():
    from explorer.model.components.rope import RopeOptions
    from explorer.model.families.kimi_k25 import with_rope_parameters

    k27, k25 = spec_of("kimi-k2.7-code"), spec_of("kimi-k2.5")
    assert k27.config.text_config.rope_scaling is None and k27.config.text_config.rope_parameters is not None
    read = with_rope_parameters(k27.config.text_config)
    assert read.rope_scaling.kind == "yarn" and read.rope_scaling.factor == k25.config.text_config.rope_scaling.factor

    def rotary(spec: ModelSpec) -> RopeOptions:
        return next(c.options for _, c in walk(spec.root) if c.program == "rope")
    assert rotary(k27) == rotary(k25)  # the same YaRN as K2.5's rope_scaling gives
    ignoring = replace(k27.config, text_config=replace(k27.config.text_config, rope_parameters=None))
    built = FAMILIES["kimi_k25"].build(ignoring, k27.values)
    assert next(c.options for _, c in walk(built) if c.program == "rope") != rotary(k27)  # mutation: plain RoPE


@pytest.mark.parametrize(("change", "key"), [
    ({"rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}},
     "text_config.rope_parameters"),
    ({"rope_theta": 10000.0}, "text_config.rope_parameters.rope_theta"),
])
def test_rope_parameters_disagreeing_with_the_older_keys_are_refused(change, key):
    raw = read_table("kimi-k2.7-code")
    raw["text_config"].update(change)
    with pytest.raises(ContentError, match=f"key '{key}': must"):
        FAMILIES["kimi_k25"].validate(raw, "kimi-k2.7-code")


def test_the_tiny_config_shrinks_the_yarn_of_rope_parameters_as_of_rope_scaling():
    family = FAMILIES["kimi_k25"]
    k27 = family.tiny_config(spec_of("kimi-k2.7-code").config)["text_config"]
    k25 = family.tiny_config(spec_of("kimi-k2.5").config)["text_config"]
    assert k27["rope_scaling"]["original_max_position_embeddings"] == k25["rope_scaling"][
        "original_max_position_embeddings"] < k27["max_position_embeddings"]


# ------------------------------------------------------------------------- Kimi's repacks: the checkpoint's names

@pytest.mark.parametrize("slug", ["kimi-k2.6", "kimi-k2.7-code"])
def test_the_nvfp4_repack_quantizes_only_the_routed_experts_the_exclude_list_leaves(slug):
    spec = spec_of(slug)
    t = spec.config.text_config
    (variant,) = load_variants(ROOT / "content/models" / slug)
    family = FAMILIES["kimi_k25"]
    stored = stored_as(spec, variant, family.variant_module_name)
    routed = (t.num_hidden_layers - t.first_k_dense_replace) * t.n_routed_experts * 3 * t.hidden_size \
        * t.moe_intermediate_size
    nvfp4 = sum(r.parameters for r in stored.rows if r.dtype == "U8")
    assert nvfp4 == routed  # attention, shared experts, layer 0, the tower and the projector stay BF16
    assert all(name.startswith(("language_model.", "vision_tower.", "mm_projector.")) or name == "lm_head"
               for name in (family.variant_module_name(n) for n in ("model.language_model.layers.3.mlp",
                                                                    "lm_head", "model.vision_tower.layers.0",
                                                                    "model.mm_projector.in_proj")))
    # mutation: the text-only names of K2.5's own INT4 ignore list miss every exclude entry
    wrong = stored_as(spec, variant, family.text_module_name)
    assert sum(r.parameters for r in wrong.rows if r.dtype == "U8") > routed


# ---------------------------------------------------------------------------------------- --add-model, nulls

def test_an_unused_nested_key_published_as_null_is_not_listed(tmp_path):
    """Gemma-4-31B-IT's text_config.expert_intermediate_size is null and read by nothing: content records no nested
    null, so --add-model must not list it as an unused key recorded in [config] (it refused the file)."""
    from explorer.commands.add_model import add_model

    source = ROOT / "content/models/gemma-4-31b-it/model.toml"
    assert "expert_intermediate_size" not in source.read_text()
    config = read_table("gemma-4-31b-it")
    config["text_config"]["expert_intermediate_size"] = None
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    toml = add_model(tmp_path / "content", "generated", path, "org/generated", "unpinned")
    written = load_model_content(toml.parent)
    assert "text_config.expert_intermediate_size" not in written.checkpoint.config_unused


def test_a_block_fp8_variant_file_is_checked_as_a_models_fp8_config(tmp_path):
    from explorer.checkpoint.variants import variant_from_toml
    from explorer.content.model_content import load_toml

    path = ROOT / "content/models/glm-5.2/variants/glm-5.2-fp8.toml"
    raw = load_toml(path, path.parent.parent)
    assert variant_from_toml(raw, path).block_fp8.weight_block_size == (128, 128)
    bad = {**raw, "quantization_config": {**raw["quantization_config"], "fmt": "e3m4"}}
    with pytest.raises(ContentError, match=r"key 'quantization_config.fmt': must be one of"):
        variant_from_toml(bad, tmp_path / "glm-5.2-fp8.toml")
    both = {**raw, "quantization": {"quant_algo": "NVFP4"}}
    with pytest.raises(ContentError, match="expected one of table"):
        variant_from_toml(both, tmp_path / "glm-5.2-fp8.toml")
