"""Qwen3.5 (issue 21): totals equal transformers' parameter counts on the meta device (with the vision towers); the
layer pattern is read into kinds; the Gated DeltaNet layer matches the reference module over a sequence that crosses
several chunks, its recurrent form matches its chunked form token by token; deliberately wrong programs (an output
gate dropped, a state not decayed, a write strength dropped, a conv state shifted wrongly, a wrong pattern letter, the
wrong features rotated, an ungated shared expert) fail."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import ROOT, recurrent_layer_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import _check_one, check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index, reference_state, tiny_reference_model
from explorer.model.account import account
from explorer.model.components import gated_attention as gated_attention_module
from explorer.model.components import gated_deltanet as gdn
from explorer.model.components import gated_shared_expert as gse
from explorer.model.components.blocks import block_layers
from explorer.model.families import FAMILIES, load_model_spec
from explorer.model.families import qwen3_5 as qwen3_5_module
from explorer.spec.results import within_tolerance
from explorer.spec.types import walk

TOTALS = {"qwen3.5-27b": (27_356_728_560, 460_730_096), "qwen3.5-35b-a3b": (35_107_181_936, 446_571_248)}


def spec_of(slug: str):
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def tiny_moe():
    """The MoE model's tiny spec (it has every part of both families), its reference model and weights."""
    tiny = tiny_spec(spec_of("qwen3.5-35b-a3b"))
    model = tiny_reference_model(tiny)
    return tiny, model, reference_state(tiny, model)


# ------------------------------------------------------------------------------------------------- totals

@pytest.mark.parametrize("slug", list(TOTALS))
def test_totals_and_vision_equal_transformers_on_meta(slug):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    total, vision = TOTALS[slug]
    ledger = account(spec)
    assert ledger.total == sum(p.numel() for p in model.parameters()) == total
    assert sum(r.value for r in ledger.accounts["visual"].rows) == sum(
        p.numel() for n, p in model.named_parameters() if n.startswith("model.visual.")) == vision
    state = model.state_dict()  # once: inside the comprehension it was rebuilt per buffer
    assert not [n for n, _ in model.named_buffers() if n in state]  # no persistent buffers
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_27b_pattern_is_three_deltanet_layers_per_full_attention_layer():
    spec = spec_of("qwen3.5-27b")
    linear, full = spec.root.child("blocks").children
    assert block_layers(full) == tuple(range(3, 64, 4)) and len(block_layers(linear)) == 48
    o = linear.child("attn").options
    assert (o.k_heads, o.v_heads, o.d_k, o.d_v, o.conv_dim) == (16, 48, 128, 128, 10_240)
    assert full.child("attn").child("rope").options.dim == 64  # a quarter of head_dim 256 rotates


def test_layer_types_absent_take_the_interval():
    t = qwen3_5_module.Qwen3_5TextHyperparameters(num_hidden_layers=8, full_attention_interval=4)
    assert qwen3_5_module.layer_pattern(t).letters(qwen3_5_module.LETTERS) == "LLLFLLLF"


# ------------------------------------------------------------------------------- DeltaNet over several chunks

def deltanet_run(tiny, model, weights, T: int = 150):
    """Our DeltaNet program and the reference module on one random sequence of T positions (T > 2 chunks)."""
    return recurrent_layer_run(tiny, model, weights, "linear", T, seed=3)


def error(a, b) -> float:
    return float((a - b).abs().max())


def test_deltanet_chunked_and_recurrent_match_the_reference_across_chunks(tiny_moe):
    ours, recurrent, theirs = deltanet_run(*tiny_moe)
    assert ours.shape[1] > 2 * gdn.CHUNK
    assert within_tolerance(error(ours, theirs)) and within_tolerance(error(recurrent, theirs))
    per_token = (recurrent - ours).abs().amax(dim=(0, 2))  # token by token
    assert within_tolerance(float(per_token.max()))


def test_recurrent_state_equals_chunked_state_at_every_chunk_boundary():
    g = torch.Generator().manual_seed(0)
    B, H, dk, dv = 2, 3, 8, 12
    q_, k_ = (gdn.l2_normalise(torch.randn(B, 130, H, dk, generator=g)) for _ in range(2))
    v_ = torch.randn(B, 130, H, dv, generator=g)
    lg, beta = -torch.rand(B, 130, H, generator=g), torch.rand(B, 130, H, generator=g)
    S0 = torch.randn(B, H, dk, dv, generator=g)
    for end in (64, 128, 130):
        o_c, S_c = gdn.chunked_delta_rule(q_[:, :end], k_[:, :end], v_[:, :end], lg[:, :end], beta[:, :end], S0, 64)
        o_r, S_r = gdn.recurrent_delta_rule(q_[:, :end], k_[:, :end], v_[:, :end], lg[:, :end], beta[:, :end], S0)
        assert error(o_c, o_r) < 1e-4 and error(S_c, S_r) < 1e-4


def deltanet_fails(tiny_moe, both: bool = True) -> None:
    ours, recurrent, theirs = deltanet_run(*tiny_moe)
    wrong = [not within_tolerance(error(recurrent, theirs))] + ([not within_tolerance(error(ours, theirs))] if both else [])
    assert all(wrong)


def test_output_gate_dropped_fails(tiny_moe, monkeypatch):
    def ungated(o, z, w, eps):
        of = o.float()
        return w * (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps))

    monkeypatch.setattr(gdn, "gated_rmsnorm", ungated)
    deltanet_fails(tiny_moe)


def test_state_not_decayed_fails(tiny_moe, monkeypatch):
    monkeypatch.setattr(gdn, "log_decay", lambda a, A_log, dt_bias: torch.zeros_like(a))
    deltanet_fails(tiny_moe)


def test_write_strength_dropped_fails(tiny_moe, monkeypatch):
    monkeypatch.setattr(gdn, "write_strength", lambda b: torch.ones_like(b))
    deltanet_fails(tiny_moe)


def test_conv_state_shifted_wrongly_fails(tiny_moe, monkeypatch):
    """Keeping the oldest input and dropping the newest: the recurrent form no longer matches (the chunked form,
    which convolves the whole sequence at once, is unaffected)."""
    real = gdn.conv_step

    def stale(state, x_t, w):
        out, _ = real(state, x_t, w)
        return out, torch.cat([state, x_t[..., None]], dim=-1)[..., :-1]

    monkeypatch.setattr(gdn, "conv_step", stale)
    deltanet_fails(tiny_moe, both=False)


def test_decay_dropped_fails_the_build_check(tiny_moe, monkeypatch):
    tiny = tiny_moe[0]
    monkeypatch.setattr(gdn, "log_decay", lambda a, A_log, dt_bias: torch.zeros_like(a))
    with pytest.raises(ExecutionError) as info:
        check_equations(tiny, tiny)
    assert "blocks.linear.attn: max |Δ|" in str(info.value)


# ------------------------------------------------------------------------------------ other parts, mutations

def component_error(tiny_moe, path: str) -> float:
    tiny, model, weights = tiny_moe
    for ancestors, comp in walk(tiny.root):
        if ".".join(a.key for a in ancestors[1:]) + ("." if len(ancestors) > 1 else "") + comp.key == path:
            return _check_one(tiny, model, weights, ancestors, comp)[0]
    raise KeyError(path)


def test_gated_attention_and_shared_expert_check(tiny_moe):
    assert within_tolerance(component_error(tiny_moe, "blocks.full.attn"))
    assert within_tolerance(component_error(tiny_moe, "blocks.full.moe"))


def test_attention_output_gate_dropped_fails(tiny_moe, monkeypatch):
    monkeypatch.setattr(gated_attention_module, "output_gate", lambda O, G: O)
    assert not within_tolerance(component_error(tiny_moe, "blocks.full.attn"))


def test_rotating_the_last_instead_of_the_first_features_fails(tiny_moe, monkeypatch):
    rotate = gated_attention_module.rotate

    def last(x, angles, o):
        return torch.cat([x[..., :-o.dim], rotate(x[..., -o.dim:], angles, o)], dim=-1)

    monkeypatch.setattr(gated_attention_module, "rotate", last)
    assert not within_tolerance(component_error(tiny_moe, "blocks.full.attn"))


def test_ungated_shared_expert_fails(tiny_moe, monkeypatch):
    monkeypatch.setattr(gse, "shared_gate", lambda eta: torch.ones_like(eta))
    assert not within_tolerance(component_error(tiny_moe, "blocks.full.moe"))


def test_wrong_pattern_letter_fails(tiny_moe, monkeypatch):
    """Reading one layer's kind wrong (the full-attention layer as a DeltaNet one) breaks the reconciliation with the
    reference's tensors and the whole-model check."""
    tiny = tiny_moe[0]
    real = qwen3_5_module.layer_pattern
    monkeypatch.setattr(qwen3_5_module, "layer_pattern",
                        lambda t: replace(real(t), kinds=tuple(qwen3_5_module.LINEAR for _ in real(t).kinds)))
    family = FAMILIES["qwen3_5_moe"]
    bad = family.build_spec("bad", family.tiny_config(spec_of("qwen3.5-35b-a3b").config), "test")
    assert [b.key for b in bad.root.child("blocks").children] == ["linear"]
    assert not reconcile(bad, reference_index(tiny).index, reference=True).balanced
    with pytest.raises(ExecutionError):
        check_equations(bad, bad)


# ---------------------------------------------------------------------------------------------- memory figures

def test_memory_counts_kv_only_in_attention_layers_and_a_fixed_state_in_deltanet_layers():
    from explorer.figures.model_figures import derive

    spec = spec_of("qwen3.5-27b")
    figures = derive(spec, account(spec), None)
    assert [c.layers for c in figures.attention] == [16]  # the 48 DeltaNet layers keep no KV cache
    assert figures.get("kv_cache_per_token").value == 16 * 2 * 4 * 256
    assert figures.get("recurrent_state_per_layer").value == 48 * 128 * 128
    # the full kernel of 4, as the reference's LinearAttentionLayer holds it (and Mamba-2's conv state is counted)
    assert figures.get("conv_state_per_layer").value == (2 * 16 * 128 + 48 * 128) * 4
    fixed = 48 * (48 * 128 * 128 * 4 + (2 * 16 * 128 + 48 * 128) * 4 * 2)  # float32 state, bf16 conv state
    assert figures.get("recurrent_state_bytes").value == fixed
    for tokens in (4_096, 131_072, 262_144):
        assert figures.get(f"sequence_memory_{tokens}").value == fixed + 16 * 2 * 4 * 256 * 2 * tokens


# ------------------------------------------------------------------------------------------- --add-model alone

@st.composite
def qwen3_5_configs(draw):
    """Small configs of either family inside the reference's accepted space: other patterns, head counts, state
    sizes, kernels, rotary shares and vision towers."""
    moe = draw(st.booleans())
    layers = draw(st.integers(1, 5))
    k_heads = draw(st.sampled_from([1, 2]))
    text = {"vocab_size": 61, "hidden_size": 32, "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": draw(st.sampled_from([1, 2, 4])), "head_dim": draw(st.sampled_from([8, 16])),
            "linear_num_key_heads": k_heads, "linear_num_value_heads": k_heads * draw(st.integers(1, 3)),
            "linear_key_head_dim": draw(st.sampled_from([4, 8])), "linear_value_head_dim": draw(st.sampled_from([4, 6])),
            "linear_conv_kernel_dim": draw(st.integers(2, 5)), "dtype": "bfloat16",
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": draw(st.sampled_from([0.25, 0.5, 1.0]))}}
    if draw(st.booleans()):
        text["layer_types"] = [draw(st.sampled_from(["linear_attention", "full_attention"])) for _ in range(layers)]
    else:
        text["full_attention_interval"] = draw(st.integers(1, 4))
    if moe:
        text.update(num_experts=draw(st.integers(2, 6)), num_experts_per_tok=2, moe_intermediate_size=16,
                    shared_expert_intermediate_size=draw(st.sampled_from([8, 24])))
    else:
        text["intermediate_size"] = 48
    vision = {"depth": draw(st.integers(1, 2)), "hidden_size": 16, "num_heads": 2, "intermediate_size": 24,
              "patch_size": 2, "temporal_patch_size": draw(st.sampled_from([1, 2])), "spatial_merge_size": 2,
              "num_position_embeddings": draw(st.sampled_from([16, 64])), "out_hidden_size": 32}
    return {"model_type": "qwen3_5_moe" if moe else "qwen3_5", "text_config": text, "vision_config": vision}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(qwen3_5_configs())
def test_generated_configs_build_and_agree_with_transformers(config):
    family = FAMILIES[config["model_type"]]
    spec = family.build_spec("generated", config, "generated")
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_whole_model_picture_names_each_layer_kind():
    from explorer.views.model_picture import describe

    picture = describe(spec_of("qwen3.5-27b"), "Qwen3.5-27B")
    linear, full = picture.kinds
    assert (linear.mixer.css, len(linear.layers), len(full.layers)) == ("linear", 48, 16)
    assert "Gated DeltaNet" in linear.mixer.label and "full attention (gated)" == full.mixer.label
    assert "Full attention (gated): layers 3, 7, …, 63 (every 4th)." in picture.caption


def test_compare_pages_give_gated_deltanet_its_own_role():
    from explorer.figures.compare_roles import role_totals

    spec = spec_of("qwen3.5-27b")
    ledger = account(spec)
    roles = role_totals(spec, ledger).values
    deltanet = ledger.accounts["blocks.linear.attn"]
    assert roles["Linear attention (Gated DeltaNet)"] == deltanet.total
    assert roles["Vision tower and projector"] == 460_730_096 and sum(roles.values()) == ledger.stored_total


def test_vision_tower_checks_and_fails_with_patches_in_row_order(tiny_moe, monkeypatch):
    """The reference lays patches out in merge order (each 2 × 2 neighbourhood consecutive): reading the position
    table and the rotary angles in plain row order gives other tokens."""
    from explorer.model.components import qwen_vision

    assert within_tolerance(component_error(tiny_moe, "visual"))

    def row_order(o, device=None):
        r, c = torch.meshgrid(torch.arange(o.side), torch.arange(o.side), indexing="ij")
        return torch.stack([r.reshape(-1), c.reshape(-1)], dim=-1)

    monkeypatch.setattr(qwen_vision, "patch_positions", row_order)
    assert not within_tolerance(component_error(tiny_moe, "visual"))
