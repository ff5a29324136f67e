"""The Gemma 3 family: totals equal transformers' parameter counts (27B with its vision tower, 270M from a GGUF
header), the executed checks fail on a deliberately wrong gain or a missing sliding window, the tiny config keeps
the structure, the 270M manifest reconciles tensor by tensor, and defaulted keys reach the model page."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT

from explorer.checkpoint.index import CheckpointIndex, TensorInfo
from explorer.checkpoint.manifest import MANIFEST_FILE, read_manifest
from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, tiny_reference_model
from explorer.model.account import account
from explorer.model.families import FAMILIES, load_model_spec
from explorer.model.families import gemma3 as gemma3_module

GEMMA_27B = ROOT / "content/models/gemma-3-27b"
GEMMA_270M = ROOT / "content/models/gemma-3-270m"


@pytest.fixture(scope="module")
def gemma_27b():
    return load_model_spec(load_model_content(GEMMA_27B))


@pytest.fixture(scope="module")
def gemma_270m():
    return load_model_spec(load_model_content(GEMMA_270M))


def reference_parameters(spec) -> int:
    return sum(p.numel() for p in build_reference_model(spec).parameters())


def test_27b_total_with_vision_tower_is_the_reference_count(gemma_27b):
    total = account(gemma_27b).total
    assert total == reference_parameters(gemma_27b) == 27_432_406_640
    tower = sum(r.value for r in account(gemma_27b).accounts["vision_tower"].rows)
    assert 0 < tower < total  # the vision tower's tensors are counted in the checkpoint's total


def test_270m_total_is_the_reference_count(gemma_270m):
    assert account(gemma_270m).total == reference_parameters(gemma_270m) == 268_098_176


def test_27b_interleaves_52_sliding_and_10_global_layers(gemma_27b):
    from explorer.model.components.blocks import block_layers

    local, glob = gemma_27b.root.child("blocks").children
    assert (len(block_layers(local)), block_layers(glob)) == (52, tuple(range(5, 62, 6)))
    scores = local.child("attn").child("scores")
    assert scores.options.window == 1024 and glob.child("attn").child("scores").options.window is None
    assert local.child("attn").child("rope").options.theta == 10_000.0
    assert glob.child("attn").child("rope").options.kind == "linear"


def test_tiny_config_keeps_window_groups_and_tied_head(gemma_270m):
    tiny = tiny_spec(gemma_270m)
    local, glob = tiny.root.child("blocks").children
    from explorer.model.components.blocks import block_layers

    assert block_layers(local) == (0, 2) and block_layers(glob) == (1,)  # non-contiguous sliding layers
    assert local.child("attn").child("scores").options.window == 3 < 5
    assert (tiny.values["num_attention_heads"], tiny.values["num_key_value_heads"]) == (4, 2)
    model = tiny_reference_model(tiny)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tiny.root.child("lm_head").tensors[0].tied_to == "model.embed_tokens.weight"


def test_gain_w_instead_of_one_plus_w_fails(gemma_270m, monkeypatch):
    """Deliberately wrong: Gemma's RMSNorm multiplies by 1 + w; a gain of w must fail the executed check."""
    original = gemma3_module.rmsnorm

    def plain_gain(*args, **kwargs):
        return original(*args, **{**kwargs, "gain": "w"})

    monkeypatch.setattr(gemma3_module, "rmsnorm", plain_gain)
    with pytest.raises(ExecutionError) as info:
        check_equations(gemma_270m, tiny_spec(gemma_270m))
    assert "blocks.local.attn_norm: max |Δ|" in str(info.value) and "Gemma3RMSNorm" in str(info.value)


def test_sliding_window_left_out_fails(gemma_270m, monkeypatch):
    """Deliberately wrong: sliding layers attending to every earlier position (window 3 < T = 5)."""
    original = gemma3_module.ScoresOptions

    def no_window(*args, **kwargs):
        return original(*args, **{**kwargs, "window": None})

    monkeypatch.setattr(gemma3_module, "ScoresOptions", no_window)
    with pytest.raises(ExecutionError) as info:
        check_equations(gemma_270m, tiny_spec(gemma_270m))
    message = str(info.value)
    assert "blocks.local: max |Δ|" in message and "blocks.local.attn: max |Δ|" in message
    assert "blocks.global" not in message


def test_270m_reconciles_with_its_gguf_header(gemma_270m):
    index = read_manifest(GEMMA_270M / MANIFEST_FILE)
    rec = reconcile(gemma_270m, index)
    assert rec.balanced, rec.differences(5)
    assert {t.dtype for t in rec.totals} == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    assert sum(t.elements for t in rec.totals) == 268_098_176


def test_270m_changed_config_or_gguf_type_fails_naming_tensors(gemma_270m):
    index = read_manifest(GEMMA_270M / MANIFEST_FILE)
    family = FAMILIES["gemma3_text"]
    raw = {**load_model_content(GEMMA_270M).config, "intermediate_size": 2304}
    wider = family.build_spec("gemma-3-270m", raw, "test")
    rec = reconcile(wider, index)
    assert any(m.name == "model.layers.0.mlp.up_proj.weight" for m in rec.shape_mismatch)
    name = "model.layers.3.self_attn.q_proj.weight"
    f16 = CheckpointIndex.of({**index.tensors, name: TensorInfo(name, "F16", index.tensors[name].shape)}, "test")
    bad = reconcile(gemma_270m, f16)
    assert [(m.name, m.stored) for m in bad.dtype_mismatch] == [(name, "F16")]
    assert "Q4_K or Q5_0 or Q6_K or Q8_0" in bad.dtype_mismatch[0].expected


def test_defaulted_keys_are_named_with_their_source(gemma_27b, gemma_270m):
    assert {"text_config.vocab_size", "text_config.rope_theta", "text_config.rope_local_base_freq",
            "text_config.sliding_window_pattern", "vision_config.layer_norm_eps"} <= set(gemma_27b.defaulted)
    assert "text_config.hidden_size" not in gemma_27b.defaulted
    assert FAMILIES["gemma3"].default_source("text_config.vocab_size") == "Gemma3TextConfig"
    assert FAMILIES["gemma3"].default_source("vision_config.layer_norm_eps") == "SiglipVisionConfig"
    assert {"query_pre_attn_scalar", "rope_local_base_freq"} <= set(gemma_270m.defaulted)
    assert "hidden_size" not in gemma_270m.defaulted


def test_defaults_view_shows_value_used(gemma_27b):
    from types import SimpleNamespace

    from explorer.views.model_page import config_display, defaults_view

    class Build:  # the fields defaults_view reads; no config_defaulted recorded: the formula keys it defaults
        spec = gemma_27b
        content = SimpleNamespace(checkpoint=SimpleNamespace(config_defaulted=()))

    rows = {d.key: d for d in defaults_view(Build())}  # type: ignore[arg-type]
    assert (rows["text_config.vocab_size"].value, rows["text_config.vocab_size"].source) == ("262208",
                                                                                             "Gemma3TextConfig")
    assert rows["text_config.attn_logit_softcapping"].value == "null (unset)"
    assert config_display(False) == "false"


def test_unpinned_revision_is_said_plainly(tmp_path):
    import json

    from explorer.commands.add_model import add_model
    from explorer.errors import ContentError

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2}))
    toml = add_model(tmp_path / "content", "g", config, "google/x", "unpinned")
    assert 'revision = "unpinned"' in toml.read_text()
    with pytest.raises(ContentError, match="or 'unpinned'"):
        add_model(tmp_path / "content", "h", config, "google/x", "main")
    ref = load_model_content(GEMMA_27B).checkpoint
    assert not ref.pinned and ref.revision_short == "revision not pinned"
    assert ref.repo_url == "https://huggingface.co/google/gemma-3-27b-it"


def test_vision_tower_and_projector_are_checked(gemma_27b):
    checks = check_equations(gemma_27b, tiny_spec(gemma_27b))
    for path in ("vision_tower", "vision_tower.encoder", "vision_tower.embeddings", "projector", "", "blocks.local",
                 "blocks.global"):
        assert checks[path].status == "checked", path
    assert dataclasses.asdict(checks["projector.mm_input_projection"])["status"] == "part"


def test_reference_ledger_counts_the_tied_head_once(gemma_270m):
    from explorer.execute.reference import reference_index

    rec = reconcile(gemma_270m, reference_index(gemma_270m).index, reference=True)
    assert rec.balanced and rec.role_total("parameter")[1] == 268_098_176
    # the reference lists the tied matrix once, as a checkpoint stores it: under the embedding, not the head
    assert "lm_head" not in rec.owned and rec.owned["embed"][0].name == "model.embed_tokens.weight"


def test_published_names_map_to_the_page_names(gemma_27b):
    """The page uses transformers 5.23's module names; its conversion mapping renames the published (4.50) names
    to exactly those, so the claim on the model page holds."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import rename_source_key

    from explorer.checkpoint.reconcile import expected_groups

    tiny = tiny_spec(gemma_27b)
    model = tiny_reference_model(tiny)
    renames = [c for c in get_model_conversion_mapping(model) if not hasattr(c, "operations")]
    ours = {name for e in expected_groups(tiny) for name in e.box.names()}
    published = {"language_model.model.layers.1.self_attn.q_norm.weight": "model.language_model.layers.1.self_attn."
                 "q_norm.weight",
                 "vision_tower.vision_model.encoder.layers.0.mlp.fc1.bias": "model.vision_tower.encoder.layers.0.mlp."
                 "fc1.bias",
                 "multi_modal_projector.mm_input_projection_weight": "model.multi_modal_projector."
                 "mm_input_projection_weight"}
    for name, page_name in published.items():
        assert rename_source_key(name, renames, [], model.base_model_prefix, model.state_dict())[0] == page_name
        assert page_name in ours


def test_270m_content_config_is_the_gguf_metadata():
    """Every value the GGUF header gives is in the content config as recorded; a changed one is named with its key."""
    from test_gguf import GEMMA3

    from explorer.checkpoint.gguf import config_differences, gguf_config

    config, provenance = gguf_config(GEMMA3)
    published = load_model_content(GEMMA_270M).config
    assert config_differences(config, provenance, published) == []
    assert config_differences(config, provenance, {**published, "sliding_window": 1024}) == [
        "key 'sliding_window': GGUF gemma3.attention.sliding_window gives 512, the content config 1024"]


def test_figures_leave_out_the_vision_tower_and_store_the_tied_head_once(gemma_27b):
    from explorer.figures.model_figures import derive

    ledger = account(gemma_27b)
    figures = derive(gemma_27b, ledger, None)
    vision = ledger.accounts["vision_tower"].total + ledger.accounts["projector"].total
    assert figures.get("active_parameters").value == ledger.total - vision
    assert "vision tower and projector" in figures.get("active_parameters").formula
    assert figures.get("weight_bytes_stored").value == 2 * ledger.total  # BF16, the tied head counted once


def test_compare_roles_put_the_vision_tower_in_its_own_row(gemma_27b):
    from explorer.figures.compare_roles import role_totals

    ledger = account(gemma_27b)
    roles = role_totals(gemma_27b, ledger).values
    assert roles["Vision tower and projector"] == ledger.accounts["vision_tower"].total + \
        ledger.accounts["projector"].total
    assert roles["Other"] == 0 and sum(roles.values()) == ledger.total


def test_the_embedding_scale_rounds_to_bfloat16_as_torch_does():
    """Gemma's √d in BF16 is worked without torch (a cached build never imports it); torch is the oracle."""
    import math
    import random

    import torch

    from explorer.model.components.embedding import bfloat16_round, sqrt_width_scale

    rng = random.Random(0)
    values = [math.sqrt(d) for d in range(1, 20_000)] + [rng.uniform(-1e6, 1e6) for _ in range(20_000)]
    assert [bfloat16_round(v) for v in values] == [float(torch.tensor(v, dtype=torch.bfloat16)) for v in values]
    assert sqrt_width_scale(5376, "BF16") == 73.5 and sqrt_width_scale(5376, "F32") == math.sqrt(5376)
