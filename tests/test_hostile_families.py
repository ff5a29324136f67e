"""Issue 37: the newest families' recorded configs mutated as an attacker would (negative, zero, huge, wrong type,
wrong list lengths), through the family's validation and spec, which --add-model, --check and the build all run
before any torch work. Each case gives one line naming the file and the key; nothing runs for long.

Specs only (no torch stage): the whole file runs in a few seconds."""

from __future__ import annotations

import dataclasses
import time

import pytest
from conftest import ROOT, build_main

from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.model.families import load_model_spec
from explorer.model.families.base import MAX_MODEL_TENSORS, tensor_count

NEWEST = ("kimi-linear-48b-a3b", "glm-4.7", "glm-4.7-flash", "olmo-2-7b", "phi-4", "phi-4-mini", "qwen3-next-80b-a3b")


def refused(slug: str, **changes) -> str:
    """The lines a mutated config of `slug` is refused with (one per problem, each naming the file and a key),
    within a second, joined."""
    content = load_model_content(ROOT / "content/models" / slug)
    started = time.monotonic()
    with pytest.raises(ContentError) as raised:
        load_model_spec(dataclasses.replace(content, config={**content.config, **changes}))
    assert time.monotonic() - started < 1.0
    lines = raised.value.problems
    assert lines and all(line.startswith(f"{content.folder / 'model.toml'}: table 'config': key")
                         and "\n" not in line for line in lines)
    return "\n".join(lines)


@pytest.mark.parametrize("key, value", [
    ("linear_num_key_heads", -1), ("linear_num_value_heads", 0), ("linear_num_value_heads", 10**9),
    ("linear_key_head_dim", -1), ("linear_key_head_dim", 0), ("linear_value_head_dim", 10**9),
    ("linear_conv_kernel_dim", 0), ("linear_conv_kernel_dim", 10**9), ("full_attention_interval", -1),
    ("full_attention_interval", 10**9), ("num_experts", 10**6), ("shared_expert_intermediate_size", -1),
])
def test_qwen3_next_sizes_out_of_range_are_refused_naming_the_key(key, value):
    """These were accepted (a negative key head width published negative parameter counts; a 10^9 conv kernel or
    expert count went on to the build)."""
    line = refused("qwen3-next-80b-a3b", **{key: value})
    assert f"key '{key}': must be an integer in " in line and f"got {value!r}" in line


@pytest.mark.parametrize("slug, key", [
    ("kimi-linear-48b-a3b", "linear_num_heads"), ("kimi-linear-48b-a3b", "linear_head_dim"),
    ("kimi-linear-48b-a3b", "num_local_experts"), ("glm-4.7", "n_routed_experts"), ("glm-4.7-flash", "kv_lora_rank"),
    ("olmo-2-7b", "num_hidden_layers"), ("phi-4", "num_attention_heads"), ("phi-4-mini", "intermediate_size"),
])
@pytest.mark.parametrize("value", [-1, 0, 10**12, "many", 2.5, [8]])
def test_a_size_of_the_newest_families_that_no_build_can_take_is_one_line(slug, key, value):
    content = load_model_content(ROOT / "content/models" / slug)
    if key not in content.config:
        content = dataclasses.replace(content, config={**content.config, key: 8})  # a defaulted key, given
    line = refused(slug, **{key: value})
    assert f"'{key}'" in line


@pytest.mark.parametrize("slug, key, kinds", [
    ("kimi-linear-48b-a3b", "layer_types", ("full_attention", "linear_attention")),
    ("kimi-linear-48b-a3b", "mlp_layer_types", ("dense", "sparse")),
    ("qwen3-next-80b-a3b", "layer_types", ("full_attention", "linear_attention")),
])
def test_a_layer_list_of_the_wrong_length_or_kind_is_one_line(slug, key, kinds):
    layers = load_model_spec(load_model_content(ROOT / "content/models" / slug)).config.num_hidden_layers
    for value in ([], [kinds[0]] * (layers - 1), [kinds[0]] * (layers + 1), ["bogus"] * layers, [1] * layers,
                  "x", [[kinds[0]]] * layers):
        assert f"'{key}" in refused(slug, **{key: value})


@pytest.mark.parametrize("slug, changes, keys", [
    ("kimi-linear-48b-a3b", {"num_hidden_layers": 1000, "num_local_experts": 4096},
     "keys 'num_hidden_layers' and 'num_local_experts'"),
    ("qwen3-next-80b-a3b", {"num_hidden_layers": 1000, "num_experts": 4096}, "keys 'num_hidden_layers' and 'num_experts'"),
    ("glm-4.7", {"num_hidden_layers": 1000, "n_routed_experts": 4096}, "keys 'num_hidden_layers' and 'n_routed_experts'"),
])
def test_sizes_each_within_its_limit_that_multiply_past_the_machine_are_refused_before_torch(slug, changes, keys):
    """1,000 layers of 4,096 experts: each within its limit, together 12 million modules, which the reference's
    meta build would have tried to hold (it ran out of memory). Counted from the spec, refused in milliseconds."""
    line = refused(slug, **changes)
    assert f"{keys}: the config describes " in line and f"over the {MAX_MODEL_TENSORS:,} a build can hold" in line


def test_every_recorded_model_is_well_within_the_tensor_budget():
    """The budget is four times the largest model's count, so no real model is near it."""
    from explorer.content.model_content import load_all_models

    counts = {c.slug: tensor_count(load_model_spec(c).root) for c in load_all_models(ROOT / "content")}
    assert max(counts.values()) * 4 <= MAX_MODEL_TENSORS
    assert counts["kimi-k2"] > 60 * 384 * 3  # every expert counted: 60 MoE layers of 384, three projections each


def test_add_model_refuses_a_huge_config_of_a_new_family_in_one_line(tmp_path):
    """Through the command: a Kimi Linear config.json with 10^6 experts per layer, refused naming the file and
    key, and nothing written under content/."""
    import json

    content = load_model_content(ROOT / "content/models/kimi-linear-48b-a3b")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**content.config, "num_local_experts": 10**6}))
    (tmp_path / "project/content/models").mkdir(parents=True)
    result = build_main("--content", str(tmp_path / "project"), "--add-model", "kimi-huge", "--config", str(path),
                        "--repo", "moonshotai/Kimi-Linear-48B-A3B-Instruct", "--revision", "unpinned",
                        "--released", "2025-10")
    assert result.returncode == 1, result.stdout
    assert result.stderr.startswith(f"error: {path}") and "key 'num_local_experts'" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert list((tmp_path / "project/content/models").iterdir()) == []
