"""ERNIE-4.5-21B-A3B (ernie4_5_moe, issue 33 point 5): the total from Ernie4_5_MoeConfig's defaults equals
transformers' on the meta device, and the active count the published 3B; the layer kinds are the reference's (a
dense first layer, then experts); the executed checks at a tiny config with a dense and a MoE layer pass. Deliberately
wrong models fail: the rotation in halves instead of adjacent pairs, and the shared experts left out."""

from __future__ import annotations

import pytest
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.model.account import account
from explorer.model.components.blocks import block_layers
from explorer.model.families import ernie4_5_moe as family_module
from explorer.model.families import load_model_spec

SLUG = "ernie-4.5-21b-a3b"
TOTAL = 21_825_437_888
"""transformers 5.23.0's count of Ernie4_5_MoeForCausalLM(Ernie4_5_MoeConfig()) on the meta device."""


@pytest.fixture(scope="module")
def spec():
    return load_model_spec(load_model_content(ROOT / "content/models" / SLUG))


def test_total_equals_transformers_on_meta(spec):
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == TOTAL
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_layer_kinds_are_the_reference_layers(spec):
    model = build_reference_model(spec)
    sparse = tuple(i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts"))
    blocks = {b.key: block_layers(b) for b in spec.root.child("blocks").children}
    assert blocks == {"dense": (0,), "moe": sparse} and sparse == tuple(range(1, 28))
    bias = next(t for t in spec.root.child("blocks").child("moe").child("moe").child("router").tensors
                if t.template.endswith("e_score_correction_bias"))
    assert [str(s) for s in bias.shape] == ["1", "moe_num_experts"] and bias.role == "parameter"
    assert spec.values["moe_num_experts"] == 64


def test_tiny_checks_pass(spec):
    t = tiny_spec(spec)
    assert [b.key for b in t.root.child("blocks").children] == ["dense", "moe"]
    checks = check_equations(spec, t)
    keys = ("blocks.dense", "blocks.moe", "blocks.moe.attn", "blocks.moe.moe", "blocks.moe.moe.router", "")
    assert all(checks[k].status == "checked" for k in keys), {k: checks[k].status for k in keys}


def test_rotation_in_halves_fails(spec, monkeypatch):
    monkeypatch.setattr(family_module.Ernie45Moe, "rope_pairing", "half")
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny_spec(spec))
    assert "attn" in str(info.value), str(info.value)


def test_shared_experts_left_out_fail(spec, monkeypatch):
    monkeypatch.setattr(family_module, "shared_expert", lambda *a, **kw: None)
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny_spec(spec))
    assert "blocks.moe" in str(info.value), str(info.value)
