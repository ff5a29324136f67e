"""The family contract: any config the reference accepts builds and agrees with transformers; --add-model writes
content from a config.json and refuses bad input with one line per problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DEEPSEEK_TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.checkpoint.reconcile import reconcile
from explorer.commands.add_model import add_model
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.execute.executor import check_equations, tiny_spec
from explorer.execute.reference import reference_index
from explorer.model.families import FAMILIES, load_model_spec

REVISION = "0123456789abcdef0123456789abcdef01234567"
DEEPSEEK = FAMILIES["deepseek_v3"]


def agrees_with_reference(spec) -> None:
    """Tensor by tensor on the meta device, then the executed equations at the family's tiny config."""
    rec = reconcile(spec, reference_index(spec).index, reference=True, skip_owners=DEEPSEEK.reference.not_built)
    assert rec.balanced, rec.differences(5)
    check_equations(spec, tiny_spec(spec), DEEPSEEK.reference.not_built)


def write_config(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def lite_config() -> dict:
    """A DeepSeek-V2-Lite-style config: queries projected directly (q_lora_rank null), no rope scaling."""
    config = {**DEEPSEEK_TINY, "model_type": "deepseek_v3", "q_lora_rank": None}
    del config["rope_scaling"], config["quantization_config"]
    return config


def test_q_lora_rank_null_added_with_add_model_builds_and_agrees(tmp_path):
    content = tmp_path / "content"
    toml = add_model(content, "lite", write_config(tmp_path, lite_config()), "org/lite", REVISION)
    text = toml.read_text()
    assert 'config_nulls = ["q_lora_rank"]' in text
    assert "rope_scaling" not in text.split("[config]", 1)[1]  # omitted: not recorded, only listed as defaulted
    assert "rope_scaling" in load_model_content(toml.parent).checkpoint.config_defaulted
    spec = load_model_spec(load_model_content(toml.parent))
    attn = spec.root.child("blocks").child("moe").child("attn")
    assert [c.key for c in attn.children][:1] == ["q_proj"] and "q_a_proj" not in [c.key for c in attn.children]
    agrees_with_reference(spec)


def test_a_wrong_library_component_fails_the_reference_check(tmp_path):
    """Deliberately wrong: a spec that gives q_proj the latent's width must not balance against transformers."""
    import dataclasses

    spec = DEEPSEEK.build_spec("lite", {**lite_config(), "q_lora_rank": None}, "test")
    bad = dataclasses.replace(spec, values={**spec.values, "num_attention_heads": 2})
    rec = reconcile(bad, reference_index(spec).index, reference=True, skip_owners=DEEPSEEK.reference.not_built)
    assert not rec.balanced and any("q_proj.weight" in m.name for m in rec.shape_mismatch)


@st.composite
def deepseek_configs(draw):
    """Configs inside the reference's accepted space, small enough to build in a test."""
    n_group = draw(st.sampled_from([1, 2, 4]))
    per_group = draw(st.integers(2, 4))
    topk_group = draw(st.integers(1, n_group))
    k = draw(st.integers(1, topk_group * per_group))
    layers = draw(st.integers(1, 4))
    rope = draw(st.sampled_from([None, "yarn", "linear"]))
    config = {**DEEPSEEK_TINY, "num_hidden_layers": layers, "first_k_dense_replace": draw(st.integers(0, layers)),
              "moe_layer_freq": draw(st.integers(1, 2)), "n_group": n_group, "topk_group": topk_group,
              "n_routed_experts": n_group * per_group, "num_experts_per_tok": k,
              "n_shared_experts": draw(st.integers(1, 2)), "q_lora_rank": draw(st.sampled_from([None, 24])),
              "num_nextn_predict_layers": draw(st.integers(0, 1)), "norm_topk_prob": draw(st.booleans())}
    if rope is None:
        del config["rope_scaling"]
    elif rope == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    if draw(st.booleans()):
        del config["quantization_config"]
    return config


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deepseek_configs())
def test_generated_configs_build_and_agree_with_transformers(config):
    spec = DEEPSEEK.build_spec("generated", config, "generated")
    agrees_with_reference(spec)


# ------------------------------------------------------------------------------------------ bad --add-model

def test_add_model_unknown_model_type_names_the_key(tmp_path):
    path = write_config(tmp_path, {**lite_config(), "model_type": "deepseek_v9", "architectures": ["X"]})
    with pytest.raises(ContentError) as info:
        add_model(tmp_path / "content", "m", path, "org/m", REVISION)
    assert info.value.problems[0].startswith(f"{path}: key 'model_type': unknown model type 'deepseek_v9'")
    assert not (tmp_path / "content").exists()


def test_add_model_wrong_type_gets_one_line_and_an_unknown_key_none(tmp_path):
    """An unknown key is taken, as the reference config class takes it (issue 19; recorded as unused, and
    `--add-model` names the nearest key the family reads: tests/test_add_model_families.py)."""
    path = write_config(tmp_path, {**lite_config(), "hidden_sise": 3, "num_hidden_layers": "four"})
    with pytest.raises(ContentError) as info:
        add_model(tmp_path / "content", "m", path, "org/m", REVISION)
    assert list(info.value.problems) == [f"{path}: key 'num_hidden_layers': expected an integer, got a string 'four'"]
    assert not (tmp_path / "content").exists()


def test_add_model_refuses_an_existing_slug_and_a_path_as_slug(tmp_path):
    path = write_config(tmp_path, lite_config())
    add_model(tmp_path / "content", "m", path, "org/m", REVISION)
    with pytest.raises(ContentError) as info:
        add_model(tmp_path / "content", "m", path, "org/m", REVISION)
    assert list(info.value.problems) == [f"{tmp_path / 'content/models/m'}: already exists (choose another slug or remove it)"]
    with pytest.raises(ContentError) as info:
        add_model(tmp_path / "content", "../x", path, "org/m", "abc")
    assert len(info.value.problems) == 2 and "a name, not a path" in info.value.problems[0]


def test_add_model_refuses_non_finite_and_out_of_range_values(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**lite_config(), "num_key_value_heads": -64}).replace('"rope_theta": 10000.0',
                                                                                       '"rope_theta": Infinity'))
    with pytest.raises(ContentError) as info:
        add_model(tmp_path / "content", "m", path, "org/m", REVISION)
    assert f"{path}: key 'num_key_value_heads': must be an integer in 1..10,000, got -64" in info.value.problems
    assert f"{path}: key 'rope_theta': must be a finite number, got inf" in info.value.problems


# ------------------------------------------------------------------------------------------------- Llama

@pytest.fixture(scope="module")
def llama_8b():
    from conftest import ROOT

    return load_model_spec(load_model_content(ROOT / "content/models/llama-3.1-8b"))


def test_llama_totals_are_the_reference_parameter_counts(llama_8b):
    from explorer.execute.reference import build_reference_model
    from explorer.model.account import account

    model = build_reference_model(llama_8b)
    assert account(llama_8b).total == sum(p.numel() for p in model.parameters()) == 8_030_261_248


def test_llama_tiny_check_has_several_kv_groups(llama_8b):
    tiny = tiny_spec(llama_8b)
    assert (tiny.values["num_attention_heads"], tiny.values["num_key_value_heads"]) == (4, 2)


def test_kv_heads_tiled_instead_of_repeated_per_group_fails(llama_8b, monkeypatch):
    """Deliberately wrong GQA: query head h must read KV head ⌊h / groups⌋; tiling reads h mod kv_heads."""
    from explorer.errors import ExecutionError
    from explorer.model.components import attention as attention_module

    def tiled(K, groups, dim):
        return K.repeat(1, 1, groups, 1)

    original = attention_module.repeat_kv_heads
    monkeypatch.setattr(attention_module, "repeat_kv_heads", tiled)
    with pytest.raises(ExecutionError) as info:
        check_equations(llama_8b, tiny_spec(llama_8b))
    assert "blocks.block.attn: max |Δ|" in str(info.value) and "LlamaAttention" in str(info.value)
    assert original is not tiled
