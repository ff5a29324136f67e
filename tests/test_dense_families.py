"""Dense families beside Llama: Qwen3 (QK-norm), GPT-2 (fused c_attn, Conv1D [in, out], learned positions, tied
head), and SmolLM2-135M read from its real GGUF file (manifest, metadata, and one block on its real weights).

Totals are compared with transformers' own parameter counts; each family has a deliberately wrong component that
its check must catch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from explorer.checkpoint.manifest import read_manifest
from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index, tiny_reference_model
from explorer.model.account import account
from explorer.model.components import attention as attention_module
from explorer.model.components import linear as linear_module
from explorer.model.families import FAMILIES, load_model_spec
from explorer.pipeline import stated_config_differences


def spec_of(slug: str):
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def qwen3():
    return spec_of("qwen3-8b")


@pytest.fixture(scope="module")
def gpt2():
    return spec_of("gpt2")


@pytest.mark.parametrize("slug, total", [("qwen3-8b", 8_190_735_360), ("gpt2", 124_439_808),
                                         ("smollm2-135m", 134_515_008)])
def test_totals_are_the_reference_parameter_counts(slug, total):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == total


# ------------------------------------------------------------------------------------------------- Qwen3

def test_qwen3_tiny_config_keeps_an_explicit_head_dim_and_kv_groups(qwen3):
    v = tiny_spec(qwen3).values
    assert v["num_attention_heads"] * v["head_dim"] != v["hidden_size"]  # head_dim is really read, not derived
    assert (v["num_attention_heads"], v["num_key_value_heads"]) == (4, 2)


def test_qwen3_qk_norm_steps_come_between_the_reshape_and_rope(qwen3):
    attn = qwen3.root.child("blocks").child("block").child("attn")
    names = [s.name for s in attn.steps]
    assert names.index("heads") < names.index("q_norm") < names.index("k_norm") < names.index("q-rotate")
    assert any(c.symbol == "Qwen3Attention.forward" for c in attn.child("q_norm").citations)


def test_qk_norm_before_the_reshape_fails_the_check(qwen3, monkeypatch):
    """Deliberately wrong: RMS over the whole projection (all heads at once), the gain tiled over the heads."""
    def whole_projection(run, name, x, opts, module):
        w = run.w(module + "weight").repeat(x.shape[-2])
        flat = x.flatten(-2)
        y = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + opts.eps) * w
        return run.rec(name, y.view_as(x))

    monkeypatch.setattr(attention_module, "apply_norm", whole_projection)
    with pytest.raises(ExecutionError) as info:
        check_equations(qwen3, tiny_spec(qwen3))
    assert "blocks.block.attn: max |Δ|" in str(info.value) and "Qwen3Attention" in str(info.value)


# ------------------------------------------------------------------------------------------------- GPT-2

def test_gpt2_accounting_shows_conv1d_matrices_input_by_output(gpt2):
    rows = account(gpt2).accounts["blocks.block.attn.c_attn"].rows
    assert rows[0].factors == (768, 2304) and rows[0].formula == "hidden_size × 3 × hidden_size"
    llama_rows = account(spec_of("llama-3.1-8b")).accounts["blocks.block.attn.q_proj"].rows
    assert llama_rows[0].factors == (4096, 4096) and "hidden_size × " in llama_rows[0].formula


def test_gpt2_fused_split_is_its_own_step(gpt2):
    names = [s.name for s in gpt2.root.child("blocks").child("block").child("attn").steps]
    assert names[:3] == ["c_attn", "split", "heads"] and "scale" in names


def test_gpt2_tiny_head_is_really_tied(gpt2):
    model = tiny_reference_model(tiny_spec(gpt2))
    assert model.lm_head.weight is model.transformer.wte.weight


def test_wrong_conv1d_orientation_fails_the_tensor_check(gpt2, monkeypatch):
    monkeypatch.setattr(type(FAMILIES["gpt2"]), "layout", "out_in")
    wrong = spec_of("gpt2")
    rec = reconcile(wrong, reference_index(gpt2).index, reference=True)
    names = {m.name for m in rec.shape_mismatch}
    assert "h.0.attn.c_attn.weight" in names and "h.11.mlp.c_fc.weight" in names


def test_wrong_conv1d_orientation_fails_the_executed_check(gpt2, monkeypatch):
    """Square c_proj [768, 768] passes any shape check: only running it catches xWᵀ in place of xW."""
    def transposed(run, x, module, opts):
        square = run.w(module + "weight").shape[0] == run.w(module + "weight").shape[1]
        return original(run, x, module, dataclasses.replace(opts, layout="out_in") if square else opts)

    original = linear_module.apply_linear
    monkeypatch.setattr(linear_module, "apply_linear", transposed)
    with pytest.raises(ExecutionError) as info:
        check_equations(gpt2, tiny_spec(gpt2))
    assert "blocks.block.attn.c_proj: max |Δ|" in str(info.value) and "Conv1D" in str(info.value)


def test_untied_head_fails_the_tensor_check_and_the_total(gpt2, monkeypatch):
    monkeypatch.setattr(type(FAMILIES["gpt2"]), "tied_head", False)
    untied = spec_of("gpt2")
    rec = reconcile(untied, reference_index(gpt2).index, reference=True)
    assert rec.missing == ("lm_head.weight",)
    assert account(untied).total == 124_439_808 + 50257 * 768


# ----------------------------------------------------------------------------------------- SmolLM2 (GGUF)

SMOLLM2 = ROOT / "content/models/smollm2-135m"


def test_smollm2_reconciles_with_its_gguf_manifest_type_by_type():
    index = read_manifest(SMOLLM2 / "checkpoint.toml")
    rec = reconcile(spec_of("smollm2-135m"), index)
    assert rec.balanced, rec.differences(5)
    assert {(t.dtype, t.tensors) for t in rec.totals} == {("F32", 61), ("Q4_1", 210), ("Q8_0", 1)}
    assert rec.role_total("parameter")[1] == 134_515_008
    assert stated_config_differences(index, load_model_content(SMOLLM2)) == ()


def copy_content(tmp_path: Path, edit) -> Path:
    folder = tmp_path / "smollm2-135m"
    folder.mkdir()
    (folder / "checkpoint.toml").write_text((SMOLLM2 / "checkpoint.toml").read_text())
    (folder / "model.toml").write_text(edit((SMOLLM2 / "model.toml").read_text()))
    return folder


def test_a_changed_config_value_fails_naming_tensors_and_the_key(tmp_path):
    folder = copy_content(tmp_path, lambda t: t.replace("intermediate_size = 1536", "intermediate_size = 1600"))
    content = load_model_content(folder)
    index = read_manifest(folder / "checkpoint.toml")
    rec = reconcile(load_model_spec(content), index)
    assert "model.layers.0.mlp.gate_proj.weight" in {m.name for m in rec.shape_mismatch}
    assert stated_config_differences(index, content) == (
        "key 'intermediate_size': GGUF llama.feed_forward_length gives 1536, the content config 1600",)


def test_a_wrong_storage_type_fails_naming_tensors(tmp_path):
    folder = copy_content(tmp_path, lambda t: t.replace('"*norm.weight" = "F32"', '"*norm.weight" = "BF16"'))
    rec = reconcile(load_model_spec(load_model_content(folder)), read_manifest(folder / "checkpoint.toml"))
    assert len(rec.dtype_mismatch) == 61 and rec.dtype_mismatch[0].expected == "BF16"


def test_an_unpinned_revision_must_say_why(tmp_path):
    folder = copy_content(tmp_path, lambda t: "\n".join(l for l in t.splitlines() if not l.startswith("revision_note")))
    with pytest.raises(ContentError) as info:
        load_model_content(folder)
    assert "key 'checkpoint.revision_note': missing" in info.value.problems[0]


# ------------------------------------------------------------------------------------------ real weights

@pytest.fixture(scope="module")
def smollm2_real():
    from explorer.execute.real_weights import weights_file

    content = load_model_content(SMOLLM2)
    return spec_of("smollm2-135m"), weights_file(content.checkpoint.real_weights, "test")


def test_block_on_real_weights_agrees_with_transformers_reading_the_same_file(smollm2_real):
    from explorer.execute.real_weights import block_check

    check = block_check(*smollm2_real)
    assert check.path == "blocks.block" and check.max_abs_error <= check.tolerance
    assert "max |Δ| 0.0e+00 from transformers' ordering" in check.detail


def test_real_weights_without_undoing_llama_cpp_row_order_fail(smollm2_real, monkeypatch):
    """Deliberately wrong: q_proj and k_proj rows left in llama.cpp's interleaved order."""
    from explorer.checkpoint import gguf
    from explorer.execute.real_weights import block_check

    monkeypatch.setattr(gguf, "unpermute_rotary_rows", lambda weight, heads: weight)
    with pytest.raises(ExecutionError) as info:
        block_check(*smollm2_real)
    assert "smollm2-135m › blocks.block on real weights" in str(info.value)


def test_real_weight_check_is_on_the_block_page(built_site):
    text = (built_site / "models/smollm2-135m/blocks.block.html").read_text(encoding="utf-8")
    assert "Checked on the checkpoint’s real weights: block 0" in text and "SmolLM2-135M-Instruct.Q4_1.gguf" in text
    assert "No pinned revision:" in text
