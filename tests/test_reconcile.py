"""The reconciliation ledger: Kimi K2 balances exactly against its recorded headers; a changed config
fails the check with the affected tensors named; record and check work end to end on a small model."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from conftest import ROOT, hub_env, run_build, seal_config_values, write_safetensors
from hub_server import FakeHub

from explorer.checkpoint.index import CheckpointIndex, TensorInfo
from explorer.checkpoint.reconcile import expected_groups, reconcile
from explorer.checkpoint.tensor_names import shared_name
from explorer.spec.storage import BlockFP8


def test_kimi_k2_ledger_balances_to_the_published_numbers(builds):
    rec = builds["kimi-k2"].checkpoint
    assert rec is not None and rec.balanced, rec.differences(5)
    assert sum(t.tensors for t in rec.totals) == 139_644
    assert rec.role_total("parameter")[:2] == (69_975, 1_026_408_232_448)
    assert rec.role_total("quant_scale")[:2] == (69_608, 62_495_192)
    assert rec.role_total("buffer")[:2] == (61, 3_416)
    assert sum(t.elements for t in rec.totals) == 1_026_470_731_056  # the listing's reported total
    by_dtype = {(t.role, t.dtype): t.bytes for t in rec.totals}
    assert by_dtype == {("parameter", "BF16"): 5_029_935_104, ("parameter", "F32"): 92_160,
                        ("parameter", "F8_E4M3"): 1_023_893_241_856, ("quant_scale", "F32"): 249_980_768,
                        ("buffer", "BF16"): 6_832}


def test_every_stored_tensor_is_owned_once(builds):
    mb = builds["kimi-k2"]
    owned = [g.box for groups in mb.checkpoint.owned.values() for g in groups]
    assert shared_name(owned) is None
    assert sum(box.size for box in owned) == mb.checkpoint_index.tensor_count == 139_644


def test_scale_shapes_use_ceiling_division():
    fp8 = BlockFP8("F8_E4M3", (128, 128))
    assert fp8.scale_shape((576, 7168)) == (5, 56)
    assert fp8.scale_shape((7168, 18432)) == (56, 144)


def test_reports_unowned_missing_and_mismatches_all_at_once(builds):
    mb = builds["kimi-k2"]
    tensors = dict(mb.checkpoint_index.tensors)
    del tensors["model.norm.weight"]
    tensors["model.layers.0.mlp.extra.weight"] = TensorInfo("model.layers.0.mlp.extra.weight", "BF16", (2,))
    tensors["lm_head.weight"] = TensorInfo("lm_head.weight", "F32", (163840, 7168))
    tensors["model.embed_tokens.weight"] = TensorInfo("model.embed_tokens.weight", "BF16", (163841, 7168))
    rec = reconcile(mb.spec, CheckpointIndex.of(tensors, "edited"))
    assert rec.missing == ("model.norm.weight",)
    assert rec.unowned == ("model.layers.0.mlp.extra.weight",)
    assert [m.name for m in rec.dtype_mismatch] == ["lm_head.weight"]
    assert [(m.name, m.expected, m.stored) for m in rec.shape_mismatch] == [
        ("model.embed_tokens.weight", "[163840, 7168]", "[163841, 7168]")]


def test_no_tensor_is_expected_twice(builds):
    for mb in builds.values():
        assert shared_name(e.box for e in expected_groups(mb.spec)) is None


def test_check_passes_offline(small_project_copy):
    project = small_project_copy("kimi-k2", "deepseek-v3")  # a manifest, and a model checked by the reference only
    result = run_build("--check", "--content", str(project), env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("kimi-k2: 139,644 tensors against the checkpoint manifest; parameters 1,026,408,232,448, "
            "scales 62,495,192, buffers 3,416; balanced") in result.stdout
    assert "deepseek-v3: " in result.stdout and "reference implementation only" in result.stdout


def test_check_fails_when_a_config_value_changes(small_project_copy):
    """Issue 3's mutation test: moe_intermediate_size 2048 -> 1024 breaks every expert tensor's shape. The
    edited values are sealed with their own digest (config_values_sha256), as if published so: unsealed, the edit
    fails earlier, as values that no longer hash to the recorded config (issue 18, tests/test_hostile.py)."""
    project_copy = small_project_copy("kimi-k2", "deepseek-v3")  # the model and the one it follows
    toml = project_copy / "content/models/kimi-k2/model.toml"
    toml.write_text(re.sub(r"^moe_intermediate_size = 2048", "moe_intermediate_size = 1024", toml.read_text(),
                           flags=re.M))
    seal_config_values(toml.parent)
    result = run_build("--check", "--content", str(project_copy))
    assert result.returncode == 1
    out = result.stdout
    assert ("kimi-k2 (checkpoint): shape mismatch: model.layers.1.mlp.experts.0.down_proj.weight "
            "(blocks.moe.moe.expert.down_proj): expected [7168, 1024], stored [7168, 2048]") in out
    assert "model.layers.1.mlp.experts.0.down_proj.weight_scale_inv" in out
    # 60 MoE blocks × (384 routed + 1 shared) experts × 3 projections × (weight + its block scale)
    assert "shape mismatch: … and 138,580 more (138,600 in all)" in out
    assert "kimi-k2: 139,644 tensors against the checkpoint manifest" in out and "NOT balanced" in out


# ---------------------------------------------------------------- record and check a small model end to end

TINY_TOML = """[model]
name = "Tiny"
lab = "Tests"
released = "2026-01"
tagline = "A small member of the family"
family = "deepseek_v3"

[checkpoint]
repo_id = "org/tiny-model"
revision = "0123456789abcdef0123456789abcdef01234567"
config_sha256 = ""
config_provenance = "written by a test, from no published file (its values sealed by config_values_sha256)"

[checkpoint.config_lines]
quantization_config = [1, 2]

"""


def tiny_project(project_copy):
    """Add a small model of the family to a project copy; return its folder and the tensors it expects."""
    from conftest import DEEPSEEK_TINY as TINY_CONFIG

    from explorer.content.model_content import load_model_content
    from explorer.model.families import load_model_spec

    folder = project_copy / "content/models/tiny"
    folder.mkdir()
    config = {**TINY_CONFIG, "quantization_config": {**TINY_CONFIG["quantization_config"],
                                                     "weight_block_size": [8, 8]}}
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in config.items() if not isinstance(v, dict))
    tables = "".join(f"\n[config.{k}]\n" + "\n".join(f"{kk} = {json.dumps(vv)}" for kk, vv in v.items()) + "\n"
                     for k, v in config.items() if isinstance(v, dict))
    (folder / "model.toml").write_text(TINY_TOML + "[config]\n" + body + "\n" + tables)
    seal_config_values(folder)
    spec = load_model_spec(load_model_content(folder))
    return folder, {name: (e.dtype or "BF16", list(e.shape or (3,))) for e in expected_groups(spec)
                    for name in e.box.names()}


def write_shards(folder, tensors):
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, members in shards.items():
        write_safetensors(folder / shard, {n: tensors[n] for n in members})
    weight_map = {n: shard for shard, members in shards.items() for n in members}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.fixture(scope="module")
def tiny_torch_stages(tmp_path_factory):
    """The small model's torch stages (reference, shape trace, equation checks), computed once in this process into
    a cache folder that the record-then-check tests copy: each check then reconciles its recorded manifest
    without running the same torch stages again in a new process (one import of torch and transformers each)."""
    from conftest import _copy_project

    from explorer.content.model_content import load_model_content
    from explorer.pipeline import build_model

    folder, _ = tiny_project(_copy_project(tmp_path_factory.mktemp("tiny") / "project", with_cache=False, models=()))
    cache_dir = tmp_path_factory.mktemp("tiny-cache")
    build_model(load_model_content(folder), cache_dir=cache_dir, progress=lambda _: None)
    return cache_dir


def with_tiny_torch_stages(project_copy, cache_dir):
    shutil.copytree(cache_dir, project_copy / ".cache" / "execute", dirs_exist_ok=True)


def test_record_from_a_local_folder_then_check(small_project_copy, tmp_path, tiny_torch_stages):
    project_copy = small_project_copy()  # the small model alone
    folder, tensors = tiny_project(project_copy)
    with_tiny_torch_stages(project_copy, tiny_torch_stages)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_shards(ckpt, tensors)
    result = run_build("--content", str(project_copy), "--record-checkpoint", "tiny", "--from-folder", str(ckpt))
    assert result.returncode == 0, result.stderr
    manifest = (folder / "checkpoint.toml").read_text()
    assert 'shard = "model-00002-of-00002.safetensors"' in manifest
    assert f"tensor_count = {len(tensors)}" in manifest
    check = run_build("--check", "--content", str(project_copy))
    assert check.returncode == 0, check.stdout
    assert f"tiny: {len(tensors)} tensors against the checkpoint manifest" in check.stdout


def test_record_from_the_hub_through_hf_endpoint(small_project_copy, tmp_path, tiny_torch_stages):
    project_copy = small_project_copy()  # the small model alone
    folder, tensors = tiny_project(project_copy)
    with_tiny_torch_stages(project_copy, tiny_torch_stages)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_shards(ckpt, tensors)
    with FakeHub() as hub:
        for path in ckpt.iterdir():
            hub.files[("org/tiny-model", "0123456789abcdef0123456789abcdef01234567", path.name)] = path.read_bytes()
        result = run_build("--content", str(project_copy), "--record-checkpoint", "tiny", "--from-hub",
                           env=hub_env(tmp_path, hub.url))
    assert result.returncode == 0, result.stderr
    assert "headers read from the Hub with range requests" in (folder / "checkpoint.toml").read_text()
    assert run_build("--check", "--content", str(project_copy)).returncode == 0


def test_manifest_for_another_revision_is_refused(small_project_copy):
    project_copy = small_project_copy("kimi-k2", "deepseek-v3")  # the model and the one it follows
    manifest = project_copy / "content/models/kimi-k2/checkpoint.toml"
    manifest.write_text(manifest.read_text().replace("fd1984e2b7a3350dbf7305fe73a4ede25c14de50", "b" * 40, 1))
    result = run_build("--check", "--content", str(project_copy))
    assert result.returncode == 1
    assert f"{manifest}: key 'manifest.revision'" in result.stderr


@pytest.mark.parametrize("slug", ["kimi-k2", "deepseek-v3"])
def test_api_json_carries_the_ledger(built_site, slug):
    text = (built_site / f"api/{slug}.json").read_text()
    assert str(ROOT) not in text  # the same bytes whatever folder the site was built in
    data = json.loads(text)
    assert data["reference_check"]["balanced"] is True
    if slug == "kimi-k2":
        roles = {(r["role"], r["dtype"]): r["tensors"] for r in data["ledger"]["by_role_and_dtype"]}
        assert roles[("quant_scale", "F32")] == 69_608
        assert data["ledger"]["unowned"] == [] and data["ledger"]["missing"] == []
    else:
        assert data["ledger"] is None


def test_verify_hub_confirms_the_recorded_config(project_copy, tmp_path):
    """--verify-hub fetches config.json at the pinned revision through HF_ENDPOINT and compares it."""
    from explorer.content.model_content import load_model_content

    models = {slug: load_model_content(project_copy / "content/models" / slug) for slug in ("kimi-k2", "deepseek-v3")}
    with FakeHub() as hub:
        for slug, content in models.items():
            text = json.dumps(content.config, indent=2, sort_keys=True) + "\n"  # DeepSeek-V3's published layout
            if slug == "kimi-k2":
                text = text.replace('"n_routed_experts": 384', '"n_routed_experts": 385')
            hub.files[(content.checkpoint.repo_id, content.checkpoint.revision, "config.json")] = text.encode()
        result = run_build("--verify-hub", "--content", str(project_copy), env=hub_env(tmp_path, hub.url))
    assert result.returncode == 1
    out = result.stdout
    assert "deepseek-v3: config.json at deepseek-ai/DeepSeek-V3@e815299: matches the recorded sha256 and values" in out
    assert "kimi-k2: config.json at moonshotai/Kimi-K2-Instruct@fd1984e: 2 differences" in out
    assert "  key 'n_routed_experts': published 385, recorded 384" in out


def test_verify_hub_unreachable_names_the_file(project_copy, tmp_path):
    result = run_build("--verify-hub", "--content", str(project_copy), env=hub_env(tmp_path, "http://127.0.0.1:9"))
    assert result.returncode == 1
    assert "error: moonshotai/Kimi-K2-Instruct@fd1984e2b7a3350dbf7305fe73a4ede25c14de50/config.json:" in result.stderr
    assert "Traceback" not in result.stderr
