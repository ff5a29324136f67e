"""Stored layouts and formulas as the checkpoints and the reference have them (issue 19).

DeepSeek-V3's multi-token-prediction eh_proj is stored in BF16 with no scale, an exception to its FP8 scheme that
content states with its evidence; GPT-2's published file stores twelve causal-mask buffers and names its tensors
without the "transformer." prefix. The expected numbers are the published checkpoints' (tensor counts and elements
per dtype), not ones this code produced; the bytes follow from them at each dtype's width.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import ROOT

from explorer.checkpoint.reconcile import predicted_index, reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.figures.model_figures import derive
from explorer.model.account import account
from explorer.model.families import load_model_spec


def content_of(slug: str):
    return load_model_content(ROOT / "content/models" / slug)


def spec_of(slug: str):
    return load_model_spec(content_of(slug))


def by_dtype(spec) -> dict[tuple[str, str], tuple[int, int]]:
    """(role, dtype) -> (tensors, elements) of the predicted stored layout."""
    return {(t.role, t.dtype): (t.tensors, t.elements) for t in reconcile(spec, predicted_index(spec)).totals}


# ------------------------------------------------------------------------------------------ DeepSeek-V3

DEEPSEEK_V3_PUBLISHED = {
    ("parameter", "F8_E4M3"): (45_808, 680_571_043_840),
    ("quant_scale", "F32"): (45_808, 41_540_496),
    ("parameter", "BF16"): (316, 3_918_786_560),
    ("parameter", "F32"): (59, 15_104),
}
"""The published checkpoint's tensors and elements per dtype (91,991 tensors): every FP8 weight with its
weight_scale_inv, BF16 embeddings, norms, router weights, heads and the MTP module's eh_proj, F32 correction biases."""


def test_deepseek_v3_predicted_layout_is_the_published_one():
    spec = spec_of("deepseek-v3")
    totals = by_dtype(spec)
    assert totals == DEEPSEEK_V3_PUBLISHED
    assert sum(n for n, _ in totals.values()) == 91_991
    stored = predicted_index(spec).tensors
    assert stored["model.layers.61.eh_proj.weight"].dtype == "BF16"
    assert "model.layers.61.eh_proj.weight_scale_inv" not in stored
    assert "model.layers.60.self_attn.q_b_proj.weight_scale_inv" in stored
    byte_total = sum(t.bytes for t in reconcile(spec, predicted_index(spec)).totals)
    assert byte_total == 680_571_043_840 + 4 * 41_540_496 + 2 * 3_918_786_560 + 4 * 15_104


def test_the_exception_is_stated_with_its_evidence_on_the_projection():
    eh = spec_of("deepseek-v3").root.child("mtp").child("eh_proj")
    assert any("stored in BF16" in n and "vLLM" in n for n in eh.notes)
    assert not any(c.symbol == "quantization_config" for c in eh.citations)  # no "stored in FP8" claim left on it


def test_without_the_exception_the_fp8_scheme_would_quantize_eh_proj():
    content = content_of("deepseek-v3")
    bare = dataclasses.replace(content, checkpoint=dataclasses.replace(content.checkpoint, storage={},
                                                                       storage_evidence={}))
    assert by_dtype(load_model_spec(bare)) != DEEPSEEK_V3_PUBLISHED


def test_a_storage_exception_without_evidence_is_refused(tmp_path: Path):
    folder = tmp_path / "deepseek-v3"
    folder.mkdir()
    text = (ROOT / "content/models/deepseek-v3/model.toml").read_text()
    start = text.index("[checkpoint.storage_evidence]")
    (folder / "model.toml").write_text(text[:start] + text[text.index("\n\n", start):])
    with pytest.raises(ContentError) as info:
        load_model_content(folder)
    assert "checkpoint.storage_evidence" in str(info.value) and "model.layers.*.eh_proj.weight" in str(info.value)


# ------------------------------------------------------------------------------------------------ GPT-2

def test_gpt2_predicted_layout_is_the_published_file():
    spec = spec_of("gpt2")
    stored = predicted_index(spec).tensors
    assert len(stored) == 160
    assert sum(t.elements for t in reconcile(spec, predicted_index(spec)).totals) == 137_022_720
    masks = [n for n in stored if n.endswith(".attn.bias")]
    assert sorted(masks) == sorted(f"h.{i}.attn.bias" for i in range(12))
    assert stored["h.0.attn.bias"].shape == (1, 1, 1024, 1024)
    assert {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "h.11.mlp.c_proj.bias"} <= set(stored)
    assert not any(n.startswith("transformer.") for n in stored)
    assert "lm_head.weight" not in stored  # tied: stored once, as wte.weight
    assert account(spec).total == 124_439_808  # the masks are buffers, not parameters


def test_gpt2_masks_are_left_out_of_the_reference_comparison():
    from explorer.execute.reference import reference_index

    spec = spec_of("gpt2")
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert not rec.missing and not rec.unowned and not rec.shape_mismatch


def test_gpt2_active_without_embedding_says_it_subtracts_the_position_table():
    spec = spec_of("gpt2")
    f = derive(spec, account(spec), None).get("active_parameters_no_embedding")
    v = spec.values
    assert f.formula == "active − (vocab_size + max_position_embeddings) × hidden_size"
    assert f.value == 124_439_808 - (v["vocab_size"] + v["max_position_embeddings"]) * v["hidden_size"]
    assert "position" in f.label and "tied" in f.definition


# ------------------------------------------------------------------------- steps name what the programs apply

UNCLASSED: set[str] = set()
"""Options classes whose factors step_terms does not class (none: a new options class must be classed before its
components pass)."""


@pytest.fixture(scope="module")
def all_specs():
    from explorer.content.model_content import load_all_models

    return [load_model_spec(m) for m in load_all_models(ROOT / "content")]


def test_every_step_names_every_factor_its_program_applies(all_specs):
    from explorer.model.components.step_term_checks import TERMS, unshown_terms
    from explorer.spec.types import path_key, walk

    problems, unclassed = [], set()
    for spec in all_specs:
        for ancestors, comp in walk(spec.root):
            problems += [f"{spec.slug} › {path_key(ancestors, comp)}: {p}" for p in unshown_terms(comp)]
            if comp.options is not None and type(comp.options) not in TERMS:
                unclassed.add(type(comp.options).__name__)
    assert problems == []
    assert unclassed == UNCLASSED


def _with_step(comp, name: str, latex: str):
    return dataclasses.replace(comp, steps=tuple(dataclasses.replace(s, latex=latex) if s.name == name else s
                                                 for s in comp.steps))


def test_a_step_that_drops_a_factor_fails():
    from explorer.model.components.step_term_checks import unshown_terms
    from explorer.spec.types import walk

    ds = spec_of("deepseek-v3")
    gate = next(c for _, c in walk(ds.root) if c.key == "router")
    gates = next(s.latex for s in gate.steps if s.name == "gates")
    assert unshown_terms(gate) == []
    dropped = unshown_terms(_with_step(gate, "gates", gates.replace(r"2.5\,", "")))
    assert len(dropped) == 1 and "scaling = 2.5" in dropped[0]
    select = next(s.latex for s in gate.steps if s.name == "select")
    assert "n_group" in unshown_terms(_with_step(gate, "select", select.replace(r"-\infty", "0")))[0]


def test_gpt_oss_rotary_step_without_yarns_attention_factor_fails(monkeypatch):
    from explorer.model.components import rope as rope_module
    from explorer.model.components.step_term_checks import unshown_terms
    from explorer.spec.types import walk

    rotary = next(c for _, c in walk(spec_of("gpt-oss-20b").root) if c.program == "rope")
    assert r"a_{\mathrm{YaRN}}=0.1\ln 32+1=1.346574" in next(s.latex for s in rotary.steps if s.name == "rotate")
    assert unshown_terms(rotary) == []
    monkeypatch.setattr(rope_module, "_attention_factor_latex", lambda o: "")
    dropped = next(c for _, c in walk(spec_of("gpt-oss-20b").root) if c.program == "rope")
    assert any("mscale" in p for p in unshown_terms(dropped))


def test_gemma_qk_norm_cites_one_plus_weight_as_its_step_shows():
    from explorer.spec.types import walk

    q_norm = next(c for _, c in walk(spec_of("gemma-3-27b").root) if c.key == "q_norm")
    assert r"(1+\gamma)" in q_norm.steps[0].latex
    assert all("1 + weight" in c.claim for c in q_norm.citations)


def test_router_and_routed_sum_formulas_are_held_by_their_programs_modules():
    from explorer.model.components import fused_experts, moe

    for module in (moe, fused_experts):
        assert {k: moe.fingerprint(v) for k, v in module.canonical_steps().items()} == module.STEP_FINGERPRINTS


def test_a_routed_sum_edited_alone_fails_its_fingerprint(monkeypatch):
    from explorer.model.components import fused_experts, moe

    original = fused_experts.clamped_steps

    def edited(*args):
        steps = original(*args)
        return (*steps[:-1], dataclasses.replace(steps[-1], latex=steps[-1].latex.replace(r"G_e\,", "")))

    monkeypatch.setattr(fused_experts, "clamped_steps", edited)
    fresh = {k: moe.fingerprint(v) for k, v in fused_experts.canonical_steps().items()}
    assert [k for k in fresh if fresh[k] != fused_experts.STEP_FINGERPRINTS[k]] == ["gpt-oss.routed-sum",
                                                                                   "halves.routed-sum"]
    monkeypatch.setitem(moe.SCORE_LATEX, "sigmoid", r"s=z")
    fresh = {k: moe.fingerprint(v) for k, v in moe.canonical_steps().items()}
    assert [k for k in fresh if fresh[k] != moe.STEP_FINGERPRINTS[k]] == ["grouped.scores"]


def test_mla_decode_costs_in_both_forms():
    from explorer.model.components.mla import MLAOptions, decode_costs
    from explorer.model.components.norms import NormOptions

    absorbed, expanded = decode_costs(MLAOptions(128, 1536, 512, 128, 64, 128, NormOptions("rms", 1e-6)))
    assert absorbed.per_key == 128 * (512 + 64 + 512)  # scores over latent + rotary key, values in the latent
    assert expanded.per_key == 512 * 128 * (128 + 128) + 128 * (128 + 64 + 128)


# ------------------------------------------------------------------------------ published "active" claims

def _claim(slug: str, claim: str):
    """The model's [[published]] active claim `claim`, reconciled (no torch stage needed), and its figures."""
    from explorer.figures.published_claims import reconcile_claims

    content = content_of(slug)
    spec = load_model_spec(content)
    ledger = account(spec)
    figures = derive(spec, ledger, None)
    rows, _ = reconcile_claims(content.published, spec, ledger, figures, "test")
    return next(r for r in rows if (r.claim.figure, r.claim.claim) == ("active", claim)), figures


@pytest.mark.parametrize("slug, claim, lab_total", [("deepseek-v3", "37B", (671e9, 1e9)),
                                                    ("kimi-k2", "32B", (1e12, 1e12))])
def test_deepseek_and_kimi_claims_are_matched_without_the_embedding(slug, claim, lab_total):
    """Issue 35: DeepSeek's README_WEIGHTS counts the main model's 36.6B active without the input embedding (the
    output head included): 36,625,618,432 here; rounded to the billion that is the lab's 37B (Kimi K2: 32B)."""
    row, figures = _claim(slug, claim)
    assert row.reproduced_by == ("without the input embedding",)
    assert row.claim.rounding == "nearest"
    value, unit = lab_total  # "671B total parameters", "1 trillion total parameters": the main model's
    assert abs(figures.get("total_parameters").value - (13_463_426_304 if slug == "deepseek-v3" else 0) - value) <= unit / 2
    if slug == "deepseek-v3":
        assert figures.get("active_parameters_no_embedding").value == 36_625_618_432  # README_WEIGHTS: 36.6B


def test_deepseek_v3_claim_with_the_embedding_is_not_reproduced_rounded_to_nearest():
    from explorer.figures.published_claims import states

    row, figures = _claim("deepseek-v3", "37B")
    with_embedding = figures.get("active_parameters").value
    assert row.conventions[0].value == with_embedding and not row.conventions[0].reproduces
    assert not states(with_embedding, "37B", "nearest")  # 37,552,297,472 rounds to 38B; without the embedding 37B


@pytest.mark.parametrize("key", ["active_claim", "active_claim_evidence"])
def test_the_retired_active_claim_is_refused_with_what_to_write_instead(tmp_path: Path, key: str):
    """Issue 35: one mechanism for a lab's figures; the older [model] active_claim keys are refused in one line."""
    folder = tmp_path / "kimi-k2"
    folder.mkdir()
    text = (ROOT / "content/models/kimi-k2/model.toml").read_text()
    (folder / "model.toml").write_text(text.replace("[checkpoint]\n", f'{key} = "32B"\n\n[checkpoint]\n', 1))
    with pytest.raises(ContentError) as info:
        load_model_content(folder)
    assert info.value.problems == (
        f"{folder / 'model.toml'}: key 'model.{key}': retired; write the figure as a [[published]] table instead: "
        'figure = "active", claim, source (lab_counts, rounding and difference where they apply)',)


def test_gpt2_components_are_still_checked_one_by_one_under_the_published_names():
    from explorer.execute.executor import check_equations, tiny_spec

    spec = spec_of("gpt2")
    checks = check_equations(spec, tiny_spec(spec))
    for path in ("blocks.block.attn.c_attn", "blocks.block.attn.c_proj", "blocks.block.mlp", "norm"):
        assert checks[path].status == "checked", path
