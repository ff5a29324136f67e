"""Qwen3-Next (issue 33): the total equals transformers' parameter count on the meta device and reconciles tensor by
tensor; the fused DeltaNet projections (in_proj_qkvz and in_proj_ba, grouped per key head) give exactly the q, k, v,
z, b and a of the reference's fix_query_key_value_ordering, and the whole layer matches the reference module over a
sequence that crosses several chunks, in its chunked and its recurrent form; deliberately wrong regroupings (the
fused rows read in Qwen3.5's order instead of per key head, b and a swapped) fail both checks and the build's."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, recurrent_layer_run

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import _check_one, check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index, reference_state, tiny_reference_model
from explorer.model.account import account
from explorer.model.components import PROGRAMS
from explorer.model.components import fused_deltanet_proj as fused
from explorer.model.components import gated_deltanet as gdn
from explorer.model.families import FAMILIES, load_model_spec
from explorer.spec.results import within_tolerance
from explorer.spec.types import walk

SLUG = "qwen3-next-80b-a3b"
TOTAL = 79_674_391_296
"""transformers 5.23.0's Qwen3NextForCausalLM on the meta device at the published config (this test rebuilds it)."""


def spec_of(slug: str = SLUG):
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def tiny():
    """The tiny spec (2 key heads over 4 value heads: two value heads per group), its reference model and weights."""
    t = tiny_spec(spec_of())
    model = tiny_reference_model(t)
    return t, model, reference_state(t, model)


# ------------------------------------------------------------------------------------------------- totals

def test_total_equals_transformers_on_meta_and_reconciles():
    spec = spec_of()
    model = build_reference_model(spec)
    assert type(model).__name__ == "Qwen3NextForCausalLM"
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == TOTAL
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_published_config_reads_as_the_hybrid_with_512_experts():
    spec = spec_of()
    linear, full = spec.root.child("blocks").children
    assert [c.key for c in spec.root.children] == ["embed", "blocks", "norm", "lm_head"]  # no vision tower
    assert linear.repeat == 36 and full.repeat == 12
    o = linear.child("attn").options
    assert (o.k_heads, o.v_heads, o.d_k, o.d_v, o.state_dtype) == (16, 32, 128, 128, "float32")
    part = linear.child("attn").child("in_proj")
    assert part.options.group_width == 128 + 128 + 2 * 128 + 2 * 128
    assert [c.key for c in part.children] == ["in_proj_qkvz", "in_proj_ba"]
    assert spec.values["num_experts"] == 512 and spec.values["num_experts_per_tok"] == 10
    assert full.child("attn").child("rope").options.dim == 64 and full.child("attn").child("rope").options.theta == 1e7


def test_fused_rows_are_the_four_projections_rows():
    """The two fused matrices hold as many parameters as Qwen3.5's four at the same head counts."""
    ledger = account(spec_of())
    d, Hk, Hv, dk, dv = 2048, 16, 32, 128, 128
    fused_rows = ledger.accounts["blocks.linear.attn.in_proj"].total // 36
    assert fused_rows == d * (2 * Hk * dk + Hv * dv) + d * Hv * dv + d * Hv + d * Hv


def test_family_refuses_what_it_does_not_model():
    family = FAMILIES["qwen3_next"]
    raw = dict(family.tiny_config(spec_of().config))
    for key, value, words in (("decoder_sparse_step", 2, "every layer a mixture"),
                              ("norm_topk_prob", False, "renormalised"),
                              ("linear_num_value_heads", 3, "must divide"),
                              ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, "plain RoPE")):
        with pytest.raises(ContentError) as info:
            family.build_spec("bad", {**raw, key: value}, "test")
        assert words in str(info.value) and key.replace("linear_num_value_heads", "linear_num_key_heads") in str(
            info.value)


# ----------------------------------------------------------------------------------- the fused projections

def component(tiny_spec_, path: str):
    for ancestors, comp in walk(tiny_spec_.root):
        if ".".join([*(a.key for a in ancestors[1:]), comp.key]) == path:
            return ancestors, comp
    raise KeyError(path)


def fused_error(tiny) -> float:
    t, model, weights = tiny
    ancestors, comp = component(t, "blocks.linear.attn.in_proj")
    return _check_one(t, model, weights, ancestors, comp)[0]


def deltanet_run(tiny, T: int = 150):
    """Our whole DeltaNet layer and the reference module on one sequence of T positions (T > 2 chunks of 64)."""
    return recurrent_layer_run(*tiny, "linear", T, seed=3)


def error(a, b) -> float:
    return float((a - b).abs().max())


def test_fused_projections_equal_fix_query_key_value_ordering(tiny):
    t = tiny[0]
    assert t.values["linear_num_value_heads"] // t.values["linear_num_key_heads"] == 2  # a grouping to get wrong
    assert within_tolerance(fused_error(tiny))


def test_layer_matches_the_reference_across_chunks_in_both_forms(tiny):
    ours, recurrent, theirs = deltanet_run(tiny)
    assert ours.shape[1] > 2 * gdn.CHUNK
    assert within_tolerance(error(ours, theirs)) and within_tolerance(error(recurrent, theirs))


def not_per_key_head(o, mixed):
    """Qwen3.5's order, [all q; all k; all v; all z], read from the fused rows: the grouping not per key head."""
    q_, k_, v_, z = torch.split(mixed, [o.k_heads * o.d_k, o.k_heads * o.d_k, o.v_heads * o.d_v, o.v_heads * o.d_v],
                                dim=-1)
    return (q_.reshape(*q_.shape[:-1], o.k_heads, o.d_k), k_.reshape(*k_.shape[:-1], o.k_heads, o.d_k),
            v_.reshape(*v_.shape[:-1], o.k_heads, -1), z.reshape(*z.shape[:-1], o.k_heads, -1))


REAL_SPLIT_BA = fused.split_ba


def b_and_a_swapped(o, mixed):
    b, a = REAL_SPLIT_BA(o, mixed)
    return a, b


@pytest.mark.parametrize("name, wrong", [("split_qkvz", not_per_key_head), ("split_ba", b_and_a_swapped)])
def test_wrong_regrouping_fails_the_part_the_layer_and_the_build(tiny, monkeypatch, name, wrong):
    monkeypatch.setattr(fused, name, wrong)
    assert not within_tolerance(fused_error(tiny))
    ours, recurrent, theirs = deltanet_run(tiny)
    assert not within_tolerance(error(ours, theirs)) and not within_tolerance(error(recurrent, theirs))
    with pytest.raises(ExecutionError) as info:
        check_equations(tiny[0], tiny[0])
    assert "blocks.linear.attn.in_proj: max |Δ|" in str(info.value)


# ----------------------------------------------------------------------------------------------- the site

def test_follows_qwen3_5_35b_a3b_for_its_compare_page():
    from explorer.content.model_content import load_all_models

    meta = load_model_content(ROOT / "content/models" / SLUG).meta
    assert meta.follows == "qwen3.5-35b-a3b"
    assert SLUG in {m.slug for m in load_all_models(ROOT / "content")}


def test_fused_part_is_a_library_part_with_its_program_and_reference_call():
    from explorer.model.components import REFERENCE_CALLS
    from explorer.model.components.step_term_checks import unshown_terms

    assert "fused_deltanet_proj" in PROGRAMS and "fused_deltanet_proj" in REFERENCE_CALLS
    part = spec_of().root.child("blocks").child("linear").child("attn").child("in_proj")
    assert unshown_terms(part) == []
    assert [s.name for s in part.steps] == ["in_proj_qkvz", "in_proj_ba", "key-groups", "ba-groups", "regroup",
                                            "gate-heads", "write-decay"]
