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

from explorer.account import account
from explorer.content import load_model_content
from explorer.errors import ContentError
from explorer.figures import derive
from explorer.families import load_model_spec
from explorer.reconcile import predicted_index, reconcile


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
    from explorer.reference import reference_index

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
