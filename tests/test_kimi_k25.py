"""Kimi K2.5 (issue 20): the DeepSeek-V3 text model composed under model.language_model, a MoonViT vision tower and
a patch-merger projector. Totals equal transformers 5.23 on the meta device; the vision parts' executed checks pass
and fail when the program is made wrong; the stored layout applies the INT4 config's ignore list; any small config
of the family that transformers accepts builds with transformers' totals."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.checkpoint.reconcile import expected_groups, predicted_index, reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.model.account import account
from explorer.model.components import moonvit
from explorer.model.families import FAMILIES, load_model_spec
from explorer.spec.storage import PackQuantized
from explorer.spec.types import walk

KIMI = ROOT / "content/models/kimi-k2.5"
SLUGS = itertools.count()
PARAMETERS = 1_026_879_353_328
TOWER, PROJECTOR = 416_866_032, 54_277_888
BIASES = 60 * 384  # model.language_model.layers.{1..60}.mlp.gate.e_score_correction_bias, persistent buffers


@pytest.fixture(scope="module")
def spec():
    return load_model_spec(load_model_content(KIMI))


@pytest.fixture(scope="module")
def reference(spec):
    return build_reference_model(spec)


@pytest.fixture(scope="module")
def tiny(spec):
    return tiny_spec(spec)


def test_totals_equal_transformers_on_meta(spec, reference):
    params = sum(p.numel() for p in reference.parameters())
    stored = sum(t.numel() for t in reference.state_dict().values())
    assert params == PARAMETERS and stored - params == BIASES
    parameters = dict(reference.named_parameters())  # once: inside the comprehension it was rebuilt per tensor
    buffers = {n: t.numel() for n, t in reference.state_dict().items() if n not in parameters}
    assert len(buffers) == 60 and all(n.endswith(".mlp.gate.e_score_correction_bias") and v == 384
                                      for n, v in buffers.items())
    ledger = account(spec)
    assert ledger.total == params + BIASES  # the ledger counts the correction biases the checkpoint stores
    assert sum(r.value for r in ledger.accounts["vision_tower"].rows) == TOWER == sum(
        p.numel() for p in reference.model.vision_tower.parameters())
    assert sum(r.value for r in ledger.accounts["projector"].rows) == PROJECTOR == sum(
        p.numel() for p in reference.model.mm_projector.parameters())


def test_reference_reconciliation_balances(spec):
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)
    assert rec.role_total("parameter")[1] == PARAMETERS + BIASES


def test_text_model_is_the_deepseek_v3_family_under_language_model(spec):
    names = {t.template for _, c in walk(spec.root) for t in c.tensors}
    assert "model.language_model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" in names
    assert "model.vision_tower.patch_embed.pos_emb.position_embeddings" in names
    assert "model.mm_projector.in_proj.weight" in names
    assert not any(n.startswith("model.layers.") for n in names)
    kimi_k2 = load_model_spec(load_model_content(ROOT / "content/models/kimi-k2"))
    # the same text model as Kimi K2: same totals once the vision parts are set aside
    assert account(spec).total - TOWER - PROJECTOR == account(kimi_k2).total


def test_vision_parts_are_checked(spec, tiny):
    checks = check_equations(spec, tiny)
    for path in ("vision_tower", "vision_tower.patch_embed", "vision_tower.encoder", "vision_tower.encoder.attn",
                 "vision_tower.encoder.mlp", "projector", "", "blocks.moe"):
        assert checks[path].status == "checked", path
    assert checks["vision_tower"].reference.endswith("Kimi_K25VisionModel")
    assert tiny.root.child("vision_tower").options.grid.patches == 24  # a 6 × 4 image on a 4 × 4 table


def _fails(spec, tiny, where: str) -> None:
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny)
    assert where in str(info.value), str(info.value)


def test_rows_and_columns_exchanged_fails(spec, tiny, monkeypatch):
    """Deliberately wrong: the 2-D rotary angles taken from a transposed grid."""
    real = moonvit.axial_angles
    monkeypatch.setattr(moonvit, "axial_angles", lambda g, hd, theta: real(
        moonvit.ImageGrid(g.w, g.h, g.merge_w, g.merge_h), hd, theta))
    _fails(spec, tiny, "vision_tower.encoder.attn: max |Δ|")


def test_position_table_not_resampled_bicubically_fails(spec, tiny, monkeypatch):
    """Deliberately wrong: the learned position grid resampled bilinearly."""
    def bilinear(table, g):
        image = moonvit.F.interpolate(table.permute(2, 0, 1)[None], size=(g.h, g.w), mode="bilinear")
        return image[0].flatten(1).transpose(0, 1)

    monkeypatch.setattr(moonvit, "resample", bilinear)
    _fails(spec, tiny, "vision_tower.patch_embed: max |Δ|")


def test_patches_grouped_in_raster_runs_fails(spec, tiny, monkeypatch):
    """Deliberately wrong: four consecutive patches of a row merged instead of a 2 × 2 neighbourhood."""
    monkeypatch.setattr(moonvit, "merge_groups", lambda v, g: v.reshape(g.tokens, g.merge_h * g.merge_w, -1))
    _fails(spec, tiny, "vision_tower: max |Δ|")


def test_published_tower_keys_must_agree_with_the_ones_transformers_reads():
    raw = load_model_content(KIMI).config
    bad = {**raw, "vision_config": {**raw["vision_config"], "vt_hidden_size": 1024}}
    with pytest.raises(ContentError, match="vision_config.vt_hidden_size.*must equal vision_config.hidden_size"):
        FAMILIES["kimi_k25"].build_spec("k", bad, "test")


def test_defaulted_tower_sizes_are_named(spec):
    assert {"vision_config.hidden_size", "vision_config.num_hidden_layers"} <= set(spec.defaulted)
    assert "vision_config.patch_size" not in spec.defaulted
    assert FAMILIES["kimi_k25"].default_source("vision_config.hidden_size") == "Kimi_K25VisionConfig"


# ------------------------------------------------------------------------------------------- stored layout

def test_int4_reaches_the_routed_experts_only(spec):
    storages = {t.template: t.storage for _, c in walk(spec.root) for t in c.tensors}
    expert = storages["model.language_model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"]
    assert expert == PackQuantized(4, 32, "BF16")
    for name in ("model.language_model.layers.{layer}.self_attn.q_a_proj.weight",
                 "model.language_model.layers.{layer}.mlp.shared_experts.up_proj.weight",
                 "model.language_model.layers.{layer}.mlp.gate_proj.weight", "lm_head.weight",
                 "model.language_model.layers.{layer}.mlp.gate.weight", "model.vision_tower.layers.{layer}.attn.q_proj.weight",
                 "model.mm_projector.in_proj.weight"):
        assert not isinstance(storages[name], PackQuantized), name


def test_stored_layout_keeps_the_parameters_and_explains_the_naive_count(spec):
    expected = expected_groups(spec)
    rec = reconcile(spec, predicted_index(spec, expected), expected=expected)
    assert rec.balanced
    assert sum(t.parameters for t in rec.totals) == PARAMETERS + BIASES
    routed = 60 * 384 * 3 * 7168 * 2048
    by = {(t.role, t.dtype): t for t in rec.totals}
    assert by["parameter", "I32"].parameters == routed and by["parameter", "I32"].elements == routed // 8
    assert by["quant_scale", "BF16"].elements == routed // 32
    assert by["quant_scale", "I64"].elements == 60 * 384 * 3 * 2
    naive = sum(t.elements for t in rec.totals)
    assert naive == PARAMETERS + BIASES - routed + routed // 8 + routed // 32 + 60 * 384 * 3 * 2
    assert 170e9 < naive < 171e9  # what a count of header elements reports: about 170B, not 1.03T


# ------------------------------------------------------------------------------------------- other configs

@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layers=st.integers(1, 3), dense=st.integers(0, 1), heads=st.sampled_from([2, 4]),
       vision_layers=st.integers(1, 2), vision_heads=st.sampled_from([1, 2]), merge=st.sampled_from([1, 2]),
       experts=st.sampled_from([4, 8]), patch=st.sampled_from([2, 14]))
def test_add_model_builds_any_small_config_with_transformers_totals(tmp_path, layers, dense, heads, vision_layers,
                                                                   vision_heads, merge, experts, patch):
    from explorer.commands.add_model import add_model

    raw = json.loads(json.dumps(load_model_content(KIMI).config))
    t, v = raw["text_config"], raw["vision_config"]
    t.update(vocab_size=101, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=layers,
             first_k_dense_replace=min(dense, layers), num_attention_heads=heads, num_key_value_heads=heads,
             q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
             n_routed_experts=experts, num_experts_per_tok=2, pad_token_id=None)
    v.update(vt_hidden_size=32 * vision_heads, vt_intermediate_size=40, vt_num_hidden_layers=vision_layers,
             vt_num_attention_heads=vision_heads, init_pos_emb_height=4, init_pos_emb_width=6, text_hidden_size=64,
             mm_hidden_size=32 * vision_heads, patch_size=patch, merge_kernel_size=[merge, merge],
             hidden_size=32 * vision_heads, intermediate_size=40, num_hidden_layers=vision_layers,
             num_attention_heads=vision_heads, pos_emb_height=4, pos_emb_width=6)
    raw.update(projection_hidden_size=32 * vision_heads, pad_token_id=None)
    config = tmp_path / f"kimi-{next(SLUGS)}.json"
    config.write_text(json.dumps(raw))
    folder = tmp_path / "content"
    toml = add_model(folder, config.stem, config, "owner/name", "0" * 40)
    spec = load_model_spec(load_model_content(toml.parent))
    model = build_reference_model(spec)
    assert account(spec).total == sum(x.numel() for x in model.state_dict().values())


# ------------------------------------------------------------------------------------- a synthetic INT4 checkpoint

def _write_int4_checkpoint(tiny, folder, mutate=None):
    """The tiny reference model's weights saved as Kimi K2.5's layout: routed experts packed by int4_pack (the bit
    layout compressed-tensors writes), everything else BF16."""
    import torch
    from safetensors.torch import save_file

    from explorer.checkpoint.formats import int4_pack
    from explorer.execute.reference import reference_state, tiny_reference_model

    tensors = {}
    for name, value in reference_state(tiny, tiny_reference_model(tiny), stored_once=True).items():
        prefix, _, leaf = name.partition(".experts.")
        if leaf and value.dim() == 3:  # routed experts, stacked: one packed weight per expert
            for e in range(value.shape[0]):
                module = f"{prefix}.experts.{e}.{leaf.removesuffix('weight')}"
                tensors |= {module + k: v for k, v in int4_pack.pack_weight(value[e].to(torch.bfloat16)).items()}
        else:
            tensors[name] = value.to(torch.float32 if name.endswith("e_score_correction_bias") else torch.bfloat16)
    if mutate:
        mutate(tensors)
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def test_synthetic_int4_checkpoint_reconciles_and_a_broken_one_names_the_tensor(tiny, tmp_path):
    import torch

    from explorer.checkpoint.safetensors_headers import read_local_checkpoint

    tiny_bf16 = FAMILIES["kimi_k25"].build_spec("k", {**_tiny_raw(tiny), "dtype": "bfloat16"}, "test")
    rec = reconcile(tiny_bf16, read_local_checkpoint(_write_int4_checkpoint(tiny, tmp_path / "good")))
    assert rec.balanced, rec.differences(5)
    assert {t.dtype for t in rec.totals if t.role == "quant_scale"} == {"BF16", "I64"}
    scale = "model.language_model.layers.1.mlp.experts.2.down_proj.weight_scale"
    packed = "model.language_model.layers.1.mlp.experts.0.up_proj.weight_packed"

    def break_it(tensors):
        del tensors[scale]
        tensors[packed] = torch.zeros(tensors[packed].shape[0], tensors[packed].shape[1] + 1, dtype=torch.int32)

    bad = reconcile(tiny_bf16, read_local_checkpoint(_write_int4_checkpoint(tiny, tmp_path / "bad", break_it)))
    assert not bad.balanced
    assert scale in str(bad.differences(20)) and packed in str(bad.differences(20))


def _tiny_raw(tiny):
    from explorer.model.families.kimi_k25 import _as_dict

    raw = _as_dict(tiny.config)
    raw["text_config"] = {**raw["text_config"], "dtype": "bfloat16", "torch_dtype": "bfloat16"}
    return raw


def test_compare_with_kimi_k2_names_the_vision_parts_as_the_change(spec):
    from explorer.figures.compare_roles import compare_roles, role_totals

    kimi_k2 = load_model_spec(load_model_content(ROOT / "content/models/kimi-k2"))
    rows = {r.role: r.delta for r in compare_roles(role_totals(kimi_k2, account(kimi_k2)),
                                                   role_totals(spec, account(spec)))}
    assert rows["Vision tower and projector"] == TOWER + PROJECTOR
    assert all(delta == 0 for role, delta in rows.items() if role != "Vision tower and projector")


def test_active_parameters_per_text_token_leave_the_vision_parts_out(spec):
    from explorer.figures.model_figures import derive

    kimi_k2 = load_model_spec(load_model_content(ROOT / "content/models/kimi-k2"))
    ours, theirs = derive(spec, account(spec), None), derive(kimi_k2, account(kimi_k2), None)
    assert ours.get("active_parameters").value == theirs.get("active_parameters").value
    assert "vision tower and projector" in ours.get("active_parameters").formula
    assert ours.get("kv_cache_per_token").value == 61 * (512 + 64)  # MLA's latent and shared rotary key per layer
