"""Mixtral, Qwen3-MoE and gpt-oss (issue 10): totals equal transformers' parameter counts on the meta device; the
executed checks at tiny configs that route (top-k below the experts) and window (window below T) pass; each
deliberately wrong router or attention fails its check; gpt-oss's MXFP4 layout is predicted from the config."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import ROOT

from explorer.checkpoint.formats.mxfp4 import mxfp4_storage
from explorer.checkpoint.reconcile import predicted_index, reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import FREE_SIZES, check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.model.account import account
from explorer.model.components import attention, moe, rope
from explorer.model.families import FAMILIES, load_model_spec
from explorer.spec.types import ModelSpec

SLUGS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b")
ROUTERS = {"mixtral-8x7b": "blocks.moe.moe.router", "qwen3-30b-a3b": "blocks.moe.moe.router",
           "gpt-oss-20b": "blocks.sliding.moe.router"}


def spec_of(slug: str) -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def tiny_checks() -> dict[str, tuple[ModelSpec, ModelSpec]]:
    """One model per family, with its tiny spec."""
    return {slug: (spec_of(slug), tiny_spec(spec_of(slug))) for slug in ROUTERS}


# ------------------------------------------------------------------------------------------------- totals

@pytest.mark.parametrize("slug", SLUGS)
def test_totals_equal_transformers_parameter_counts_on_meta(slug):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_a_wrong_expert_width_does_not_balance():
    spec = spec_of("mixtral-8x7b")
    bad = replace(spec, values={**spec.values, "intermediate_size": 4096})
    rec = reconcile(bad, reference_index(spec).index, reference=True)
    assert not rec.balanced and any(".block_sparse_moe.experts.0.w1.weight" in m.name for m in rec.shape_mismatch)


# ------------------------------------------------------------------------------------------ executed checks

@pytest.mark.parametrize("slug", list(ROUTERS))
def test_tiny_configs_route_and_window(tiny_checks, slug):
    spec, tiny = tiny_checks[slug]
    family = FAMILIES[spec.family]
    experts = tiny.values[family.experts_key]  # type: ignore[attr-defined]
    assert 1 < tiny.values["num_experts_per_tok"] < experts
    if slug.startswith("gpt-oss"):
        assert tiny.config.sliding_window < FREE_SIZES["T"]
        assert [b.key for b in tiny.root.child("blocks").children] == ["sliding", "full"]
    checks = check_equations(spec, tiny)
    example = checks[ROUTERS[slug]].example
    assert example is not None and len(example.selected) == tiny.values["num_experts_per_tok"]
    gates = dict(example.rows)[next(label for label, _ in example.rows if label.startswith("gate"))]
    assert sum(gates) == pytest.approx(1.0, abs=1e-6)  # all three families' gates sum to one
    assert all((g != 0) == (i in example.selected) for i, g in enumerate(gates))


def fails(spec: ModelSpec, tiny: ModelSpec, where: str) -> None:
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny)
    assert where in str(info.value), str(info.value)


def with_router(monkeypatch, **changes) -> None:
    real = moe.route
    monkeypatch.setattr(moe, "route", lambda run, o, x: real(run, replace(o, **changes), x))


@pytest.mark.parametrize("slug", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_no_renormalisation_fails(tiny_checks, monkeypatch, slug):
    with_router(monkeypatch, norm_topk_prob=False)
    fails(*tiny_checks[slug], "moe.router: max |Δ|")


def test_softmax_after_top_k_fails_where_the_softmax_comes_first(tiny_checks, monkeypatch):
    """Qwen3-MoE with norm_topk_prob false keeps the full softmax's probabilities: a softmax over the k logits
    differs. (With renormalisation the two are the same function, which the Mixtral paper uses.)"""
    spec, _ = tiny_checks["qwen3-30b-a3b"]
    family = FAMILIES["qwen3_moe"]
    raw = family.tiny_config(spec.config)
    unnormalised = family.build_spec("qwen3-un", {**raw, "norm_topk_prob": False}, "test")
    check_equations(unnormalised, unnormalised)
    with_router(monkeypatch, softmax_after_topk=True)
    check_equations(*tiny_checks["qwen3-30b-a3b"])  # renormalised: the same gates
    fails(unnormalised, unnormalised, "moe.router: max |Δ|")


def test_gpt_oss_softmax_before_top_k_fails(tiny_checks, monkeypatch):
    with_router(monkeypatch, softmax_after_topk=False)
    fails(*tiny_checks["gpt-oss-20b"], "moe.router: max |Δ|")


def test_gpt_oss_bias_added_to_the_gates_fails(tiny_checks, monkeypatch):
    real = moe.route

    def bias_on_gates(run, o, x):
        G, picked = real(run, replace(o, router_bias=False), x)
        selected = torch.zeros_like(G).scatter(-1, picked, 1.0)
        return run.rec("gates", G + run.w("bias") * selected), picked

    monkeypatch.setattr(moe, "route", bias_on_gates)
    fails(*tiny_checks["gpt-oss-20b"], "moe.router")


def test_gpt_oss_without_sinks_fails(tiny_checks, monkeypatch):
    real = attention.attend
    monkeypatch.setattr(attention, "attend", lambda run, o, *a: real(run, replace(o, sinks=False), *a))
    fails(*tiny_checks["gpt-oss-20b"], "blocks.sliding.attn: max |Δ|")


def test_gpt_oss_without_the_sliding_window_fails(tiny_checks, monkeypatch):
    real = attention.attend
    monkeypatch.setattr(attention, "attend", lambda run, o, *a: real(run, replace(o, window=None), *a))
    fails(*tiny_checks["gpt-oss-20b"], "blocks.sliding: max |Δ|")


def test_gpt_oss_yarn_with_truncated_bounds_fails(tiny_checks, monkeypatch):
    """truncate: false keeps the ramp's fractional bounds; rounding them (the default) changes the angles."""
    spec, tiny = tiny_checks["gpt-oss-20b"]
    ro = tiny.root.child("blocks").child("full").child("attn").child("rope").options
    assert ro.truncate is False and rope.yarn_bounds(ro) != rope.yarn_bounds(replace(ro, truncate=True))
    real = rope.yarn_bounds
    monkeypatch.setattr(rope, "yarn_bounds", lambda o: real(replace(o, truncate=True)))
    fails(spec, tiny, "attn.rope: max |Δ|")


def test_gpt_oss_unclamped_experts_fail(tiny_checks, monkeypatch):
    """Without the clamp the experts differ once a gate value exceeds the limit (here a limit of 0.05)."""
    spec, _ = tiny_checks["gpt-oss-20b"]
    family = FAMILIES["gpt_oss"]
    low = family.build_spec("gpt-oss-low", {**family.tiny_config(spec.config), "swiglu_limit": 0.05}, "test")
    check_equations(low, low)
    from explorer.model.components import fused_experts

    real = fused_experts.expert_outputs
    monkeypatch.setattr(fused_experts, "expert_outputs", lambda run, o, x: real(run, replace(o, limit=1e9), x))
    fails(low, low, "moe.experts: max |Δ|")


# ------------------------------------------------------------------------------------------------ MXFP4

def test_gpt_oss_storage_is_predicted_from_the_config():
    spec = spec_of("gpt-oss-20b")
    stored = predicted_index(spec).tensors
    for name, logical in (("gate_up_proj", (32, 5760, 2880)), ("down_proj", (32, 2880, 2880))):
        want = mxfp4_storage(f"model.layers.0.mlp.experts.{name}", logical)
        for t in (want.blocks, want.scales):
            assert (stored[t.name].shape, stored[t.name].dtype) == (t.shape, "U8")
        assert f"model.layers.0.mlp.experts.{name}" not in stored
        assert stored[f"model.layers.0.mlp.experts.{name}_bias"].dtype == "BF16"
    # modules_to_not_convert keeps attention, the router, the embedding and the head dense
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.sinks",
                 "model.layers.0.mlp.router.weight", "model.embed_tokens.weight", "lm_head.weight"):
        assert stored[name].dtype == "BF16"
    rec = reconcile(spec, predicted_index(spec))
    by = {(t.role, t.dtype): t for t in rec.totals}
    blocks, scales = by[("parameter", "U8")], by[("quant_scale", "U8")]
    assert blocks.parameters == 2 * blocks.elements == 2 * blocks.bytes
    assert scales.parameters == 0 and scales.elements * 32 == blocks.parameters
    assert sum(t.parameters for t in rec.totals) == account(spec).total


def test_experts_named_in_modules_to_not_convert_stay_dense():
    spec = spec_of("gpt-oss-20b")
    raw = load_model_content(ROOT / "content/models/gpt-oss-20b").config
    quant = {**raw["quantization_config"], "modules_to_not_convert": ["model.layers.*.mlp"]}
    dense = FAMILIES["gpt_oss"].build_spec("dense", {**raw, "quantization_config": quant}, "test")
    stored = predicted_index(dense).tensors
    assert stored["model.layers.0.mlp.experts.gate_up_proj"].dtype == "BF16"
    assert "model.layers.0.mlp.experts.gate_up_proj_blocks" in predicted_index(spec).tensors


def test_gpt_oss_ledger_labels_parameters_fp4_values_and_bytes(builds):
    from explorer.views.model_page import ledger_view, routing_view

    mb = builds["gpt-oss-20b"]
    ledger = ledger_view(mb)
    assert "predicted from the config" in ledger.source and "not read from the checkpoint" in ledger.source
    rows = {r.role: r for r in ledger.rows}
    packed = rows["MXFP4 blocks: packed FP4 values, two per byte"]
    assert (packed.parameters, packed.elements, packed.bytes) == ("19,110,297,600", "9,555,148,800", "9,555,148,800")
    assert rows["MXFP4 scales: one E8M0 exponent per 32 values"].parameters == "—"
    assert ledger.total_parameters == "20,914,757,184" and ledger.total_bytes == "13,761,264,768"
    from explorer.views.api import model_api

    api = model_api(mb)["predicted_storage"]
    assert {(r["role"], r["dtype"]): r["parameters"] for r in api["by_role_and_dtype"]}[("parameter", "U8")] == \
        19_110_297_600
    view = routing_view(mb, ROUTERS["gpt-oss-20b"])
    assert view is not None and [label for label, _ in view.rows][0].startswith("router bias")
    assert sum(c.selected for c in view.experts) == 2


# ---------------------------------------------------------------------------------------------- figures

def test_fused_experts_count_k_of_n_as_active(builds):
    mb = builds["gpt-oss-20b"]
    per_expert = 3 * 2880 * 2880 + 3 * 2880  # gate_up [2·I, d] + its bias, down [d, I] + its bias
    assert mb.figures.get("active_parameters").value == mb.ledger.total - 24 * (32 - 4) * per_expert


@pytest.mark.parametrize("slug", SLUGS)
def test_published_active_claims_are_reproduced(builds, slug):
    from explorer.content.published_claims import PublishedClaim
    from explorer.figures.published_claims import parse, reconcile_claims

    mb = builds[slug]
    row = next(r for r in mb.claims if r.claim.figure == "active")
    if slug == "qwen3-30b-a3b":
        # 3,353,032,704 with the embedding, 3,041,867,776 without: neither rounds to the card's "3.3B", which
        # looks truncated; the claim says where the difference lies
        assert not row.reproduced_by and row.claim.difference
        return
    assert row.reproduced_by, row
    _, unit = parse(row.claim.claim)
    both = [mb.figures.get(k).value for k in ("active_parameters", "active_parameters_no_embedding")]
    for wrong in (max(both) + 2 * unit, min(both) - 2 * unit):  # beyond both conventions: matches neither
        claim = f"{round(wrong / unit) * unit / 1e9:g}B"
        rows, _ = reconcile_claims((PublishedClaim("active", claim, "test"),), mb.spec, mb.ledger, mb.figures, "t")
        assert not rows[0].reproduced_by, claim
