"""Nemotron 3 Nano (issue 21): totals equal transformers' on the meta device, the router's correction biases named as
persistent buffers; the Mamba-2 mixer equals the reference over a sequence that crosses several chunks, its
recurrent form equals its chunked form (and the reference's own one-token decoding); each deliberately wrong
mixer (gate dropped, state not decayed, convolution window shifted) and a misread pattern letter fails; an unseen
config of the family added from its config alone agrees with transformers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.checkpoint.reconcile import reconcile
from explorer.commands.add_model import add_model
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import FREE_SIZES, check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index, reference_state, tiny_reference_model
from explorer.model.account import account
from explorer.model.components import PROGRAMS, Run, mamba2
from explorer.model.components.layer_pattern import NEMOTRON_H_LETTERS, pattern_problems, read_pattern, runs
from explorer.model.families import FAMILIES, load_model_spec, nemotron_h
from explorer.spec.types import ModelSpec

SLUG = "nemotron-3-nano-30b-a3b"
FAMILY = FAMILIES["nemotron_h"]


def spec_of(slug: str = SLUG) -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def nano() -> tuple[ModelSpec, ModelSpec]:
    spec = spec_of()
    return spec, tiny_spec(spec)


@pytest.fixture(scope="module")
def tiny_reference(nano):
    """The tiny reference model and its weights under our names."""
    _, tiny = nano
    model = tiny_reference_model(tiny)
    return model, reference_state(tiny, model)


def mixer_of(spec: ModelSpec):
    return spec.root.child("blocks").child("mamba").child("mamba")


# ------------------------------------------------------------------------------------------------- totals

def test_total_equals_transformers_on_meta_and_buffers_are_named():
    spec = spec_of()
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == 31_577_937_344
    buffers = dict((n, b.numel()) for n, b in model.named_buffers())
    assert sum(buffers.values()) == 2_944 and all(n.endswith("gate.e_score_correction_bias") for n in buffers)
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)
    by_role = {t.role: (t.tensors, t.elements) for t in rec.totals}
    assert by_role == {"parameter": (6_220, 31_577_937_344), "buffer": (23, 2_944)}
    router = spec.root.child("blocks").child("moe").child("moe").child("router")
    (bias,) = [t for t in router.tensors if t.role == "buffer"]
    assert bias.template == "backbone.layers.{layer}.mixer.gate.e_score_correction_bias"


def test_pattern_is_read_once_into_layer_kinds():
    spec = spec_of()
    pattern = read_pattern(spec.config.hybrid_override_pattern, NEMOTRON_H_LETTERS)
    assert (pattern.count("mamba"), pattern.count("moe"), pattern.count("attention")) == (23, 23, 6)
    blocks = {b.key: b for b in spec.root.child("blocks").children}
    assert {k: b.repeat for k, b in blocks.items()} == {"mamba": 23, "moe": 23, "attention": 6}
    assert runs(pattern.indices("attention")) == "5, 12, 19, 26, 33, 42"  # counted from 0, as backbone.layers.N
    assert pattern_problems("MEX*", NEMOTRON_H_LETTERS, "hybrid_override_pattern", 5) == [
        "key 'hybrid_override_pattern': symbol 'X' at layer 2 is not one of 'M', '*', 'E', '-'",
        "key 'hybrid_override_pattern': has 4 layers but num_hidden_layers is 5"]


def test_a_bad_pattern_is_refused_naming_the_key():
    raw = {**load_model_content(ROOT / "content/models" / SLUG).config, "hybrid_override_pattern": "ME?"}
    with pytest.raises(ContentError) as info:
        FAMILY.build_spec("bad", raw, "model.toml: table 'config'")
    assert "key 'hybrid_override_pattern': symbol '?' at layer 2" in str(info.value)


# ------------------------------------------------------------------------------------------ executed checks

def test_tiny_config_keeps_the_structure_and_every_check_passes(nano):
    spec, tiny = nano
    assert tiny.config.hybrid_override_pattern == "ME*M"
    assert FREE_SIZES["T"] > 2 * tiny.config.chunk_size  # the scan crosses at least two chunk boundaries
    assert 1 < tiny.values["num_experts_per_tok"] < tiny.values["n_routed_experts"]
    checks = check_equations(spec, tiny)
    for path in ("", "blocks.mamba", "blocks.mamba.mamba", "blocks.mamba.mamba.conv1d", "blocks.mamba.mamba.norm",
                 "blocks.attention.attn", "blocks.moe.moe", "blocks.moe.moe.router", "blocks.moe.moe.shared"):
        assert checks[path].status == "checked", path
    assert checks["blocks.mamba.mamba.ssm"].status == "part"


def test_mixer_equals_the_reference_over_several_chunks(nano, tiny_reference):
    """37 positions in chunks of 2: 19 chunks, the last one partial."""
    _, tiny = nano
    model, weights = tiny_reference
    x = torch.randn(2, 37, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        (ours,) = PROGRAMS["mamba2"](mixer_of(tiny), Run(weights, module="backbone.layers.0.mixer."), x)
        theirs = model.model.layers[0].mixer(x)
    assert theirs.abs().max() > 1e-2  # a signal large enough for the tolerance to mean something
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def mixer_weights(weights: dict, layer: int = 0) -> dict:
    prefix = f"backbone.layers.{layer}.mixer."
    return {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}


def test_recurrent_form_equals_chunked_form_and_the_reference_decoding(nano, tiny_reference):
    """Token by token (conv window and state carried) against the chunked program and against transformers'
    own one-token path (causal_conv1d_update, mamba2_selective_state_update) fed through its cache."""
    from transformers import DynamicCache

    _, tiny = nano
    model, weights = tiny_reference
    comp = mixer_of(tiny)
    o = comp.options
    x = torch.randn(2, 11, 64, generator=torch.Generator().manual_seed(6))
    run = Run(weights, module="backbone.layers.0.mixer.")
    with torch.no_grad():
        (chunked,) = PROGRAMS["mamba2"](comp, run, x)
        recurrent, conv_state, S = mamba2.mamba2_recurrent(o, mixer_weights(weights), x)
        mixer, cache = model.model.layers[0].mixer, DynamicCache(config=model.config)
        decoded = torch.cat([mixer(x[:, t:t + 1], cache_params=cache) for t in range(x.shape[1])], dim=1)
    torch.testing.assert_close(recurrent, chunked, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(recurrent, decoded, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(S, run.recorded["state"], atol=1e-5, rtol=1e-4)  # the chunked scan's final state
    torch.testing.assert_close(S, cache.layers[0].recurrent_states[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(conv_state, cache.layers[0].conv_states[0], atol=1e-6, rtol=1e-5)
    assert tuple(S.shape) == (2, o.heads, o.head_dim, o.state_size)


def test_scan_forms_agree_step_by_step():
    """ssd_recurrent and ssd_chunked on the same inputs: every position's output, and the state at the end."""
    g = torch.Generator().manual_seed(7)
    b, T, H, P, N = 2, 13, 3, 4, 5
    x, Bh, Ch = torch.randn(b, T, H, P, generator=g), torch.randn(b, T, H, N, generator=g), torch.randn(b, T, H, N,
                                                                                                         generator=g)
    dt = torch.rand(b, T, H, generator=g) + 0.1
    a_log = -dt * torch.rand(H, generator=g)
    y_rec, S_rec = mamba2.ssd_recurrent(x, dt, a_log, Bh, Ch)
    for Q in (1, 4, 13, 16):
        y, S = mamba2.ssd_chunked(x, dt, a_log, Bh, Ch, Q)
        torch.testing.assert_close(y, y_rec, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(S, S_rec, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------------------------- mutations

def fails(spec: ModelSpec, tiny: ModelSpec, where: str) -> None:
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny)
    assert where in str(info.value), str(info.value)


def test_gate_dropped_fails(nano, monkeypatch):
    monkeypatch.setattr(mamba2, "gate", lambda z: torch.ones_like(z))
    fails(*nano, "blocks.mamba.mamba: max |Δ|")


def test_state_not_decayed_fails(nano, monkeypatch):
    monkeypatch.setattr(mamba2, "decay_log", lambda dt, A_log: torch.zeros_like(dt))
    fails(*nano, "blocks.mamba.mamba: max |Δ|")


def test_conv_window_shifted_fails(nano, monkeypatch):
    """The chunked path's convolution reading one position late (x_{t−K+2..t+1}) no longer matches nn.Conv1d."""
    def late(x, w, b):
        K = w.shape[-1]
        out = torch.nn.functional.conv1d(x.transpose(1, 2), w, b, padding=K - 1, groups=x.shape[-1])
        return torch.nn.functional.silu(out[..., 1:x.shape[1] + 1]).transpose(1, 2)

    monkeypatch.setattr(mamba2, "conv_full", late)
    fails(*nano, "blocks.mamba.mamba.conv1d: max |Δ|")


def test_conv_state_shifted_wrongly_breaks_recurrent_against_chunked(nano, tiny_reference, monkeypatch):
    """Decoding's conv state must drop its oldest column; dropping the newest instead loses the window."""
    _, tiny = nano
    _, weights = tiny_reference
    monkeypatch.setattr(mamba2, "shift_conv_state",
                        lambda state, x_t: torch.cat([state[..., :-1], x_t[..., None]], dim=-1))
    x = torch.randn(1, 6, 64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        (chunked,) = PROGRAMS["mamba2"](mixer_of(tiny), Run(weights, module="backbone.layers.0.mixer."), x)
        recurrent, _, _ = mamba2.mamba2_recurrent(mixer_of(tiny).options, mixer_weights(weights), x)
    assert not torch.allclose(recurrent, chunked, atol=1e-4)


def test_wrong_pattern_letter_fails(nano, monkeypatch):
    """Reading "*" as a Mamba layer: the layers no longer match transformers' tensors, nor its outputs."""
    monkeypatch.setattr(nemotron_h, "NEMOTRON_H_LETTERS", {**NEMOTRON_H_LETTERS, "*": "mamba"})
    spec = spec_of()
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert not rec.balanced and "backbone.layers.5.mixer.q_proj.weight" in rec.unowned
    with pytest.raises(ExecutionError):
        check_equations(spec, tiny_spec(spec))


# ------------------------------------------------------------------------------------------ other configs

@st.composite
def nemotron_configs(draw) -> dict:
    """Small configs of the family that transformers accepts: any pattern over M, *, E and -, with latent experts
    (moe_latent_size) or without."""
    pattern = "".join(draw(st.lists(st.sampled_from("M*E-"), min_size=1, max_size=5)))
    heads = draw(st.sampled_from([2, 4]))
    n_group = draw(st.sampled_from([1, 2]))
    experts = n_group * draw(st.integers(2, 4))
    return {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 61,
            "hidden_size": 32, "num_hidden_layers": len(pattern), "hybrid_override_pattern": pattern,
            "num_attention_heads": 4, "num_key_value_heads": draw(st.sampled_from([1, 2, 4])), "head_dim": 8,
            "mamba_num_heads": heads, "mamba_head_dim": draw(st.sampled_from([4, 8])),
            "n_groups": draw(st.sampled_from([1, heads])), "ssm_state_size": draw(st.sampled_from([4, 16])),
            "conv_kernel": draw(st.integers(2, 4)), "chunk_size": draw(st.sampled_from([2, 3])),
            "use_conv_bias": draw(st.booleans()), "use_bias": draw(st.booleans()),
            "intermediate_size": 40, "moe_intermediate_size": 16, "moe_shared_expert_intermediate_size": 24,
            "n_routed_experts": experts, "num_experts_per_tok": draw(st.integers(1, experts // n_group)),
            "n_group": n_group, "topk_group": 1, "routed_scaling_factor": 1.5,
            "moe_latent_size": draw(st.sampled_from([None, 8, 24]))}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nemotron_configs())
def test_generated_configs_agree_with_transformers_on_meta(config):
    spec = FAMILY.build_spec("generated", config, "generated")
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_add_model_alone_adds_another_config_that_agrees(tmp_path):
    """A Nemotron-H-style dense config (MLP layers, no experts' pattern letter twice) from its config.json only."""
    raw = {**load_model_content(ROOT / "content/models" / SLUG).config, "hybrid_override_pattern": "M-M*-",
           "num_hidden_layers": 5, "hidden_size": 64, "intermediate_size": 96, "mamba_num_heads": 4,
           "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "vocab_size": 101}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    toml = add_model(tmp_path / "content", "nemotron-h-small", path, "org/nemotron-h-small",
                     "0123456789abcdef0123456789abcdef01234567")
    spec = load_model_spec(load_model_content(toml.parent))
    assert [b.key for b in spec.root.child("blocks").children] == ["mamba", "mlp", "attention"]
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)
    assert account(spec).total == sum(p.numel() for p in build_reference_model(spec).parameters())
    check_equations(spec, tiny_spec(spec))


def test_tiny_config_keeps_groups_when_the_router_groups(nano):
    spec, _ = nano
    grouped = replace(spec.config, n_group=4, topk_group=2)
    raw = FAMILY.tiny_config(grouped)
    assert raw["n_group"] == 4 and raw["n_routed_experts"] % 4 == 0


def test_memory_of_a_context_by_layer_kind():
    """Mamba-2 layers keep a fixed state (float32 S, BF16 conv window); only the 6 attention layers grow."""
    from explorer.figures.model_figures import derive

    spec = spec_of()
    c = spec.config
    figures = derive(spec, account(spec), None)
    got = {f.key: f.value for f in figures.figures}
    state = c.mamba_num_heads * c.mamba_head_dim * c.ssm_state_size
    conv = (c.mamba_num_heads * c.mamba_head_dim + 2 * c.n_groups * c.ssm_state_size) * c.conv_kernel
    assert (got["ssm_state_per_layer"], got["conv_state_per_layer"]) == (64 * 64 * 128, 6144 * 4) == (state, conv)
    fixed = 23 * (state * 4 + conv * 2)  # mamba_ssm_cache_dtype float32; conv window in bfloat16
    assert got["recurrent_state_bytes"] == fixed == 49_364_992
    per_token = 6 * 2 * c.num_key_value_heads * c.head_dim * 2  # K and V of 2 KV heads of 128, BF16, 6 layers
    for n in (4_096, 131_072, 262_144):
        assert got[f"context_memory_bytes_{n}"] == fixed + per_token * n
    assert got["context_memory_bytes_262144"] == 1_659_977_728
    assert got["scan_flops_per_token"] == 2 * 23 * (conv + 3 * state + 2 * 64 * 64)
    assert got["active_parameters"] == 31_577_937_344 - 23 * (128 - 6) * 2 * 1856 * 2688


def test_whole_model_picture_colours_layers_by_kind():
    from explorer.views.model_picture import describe, draw

    picture = describe(spec_of(), "Nemotron 3 Nano")
    kinds = {(k.mixer.css, k.ffn.css): len(k.layers) for k in picture.kinds}
    assert kinds == {("mamba", "none"): 23, ("none", "moe"): 23, ("nope", "none"): 6}
    assert "Full, no position encoding (NoPE): layers 5, 12, 19, 26, 33, 42." in picture.caption
    assert draw(picture).count('<g class="layer nope"><title>') == 6


def test_a_config_saved_by_transformers_5_spells_layers_by_name():
    """NemotronHConfig.to_dict() writes layers_block_type (and no pattern or depth): read into the same kinds."""
    from transformers import NemotronHConfig

    saved = NemotronHConfig(hybrid_override_pattern="M*EM-", num_hidden_layers=5, hidden_size=32, vocab_size=61,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_num_heads=4,
                            mamba_head_dim=8, n_groups=2, ssm_state_size=8, n_routed_experts=4,
                            num_experts_per_tok=2, moe_intermediate_size=16, moe_shared_expert_intermediate_size=24,
                            intermediate_size=40).to_dict()
    assert "hybrid_override_pattern" not in saved and saved["layers_block_type"][1] == "full_attention"
    from transformers import PretrainedConfig

    keys = set(FAMILY.config_class.__dataclass_fields__)
    assert set(saved) - keys <= set(PretrainedConfig().to_dict())  # only keys every transformers config writes
    raw = {k: v for k, v in saved.items() if k in keys and v is not None}
    spec = FAMILY.build_spec("saved", raw, "saved")
    assert [b.key for b in spec.root.child("blocks").children] == ["mamba", "attention", "moe", "mlp"]
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)
    assert account(spec).total == sum(p.numel() for p in build_reference_model(spec).parameters())


# ----------------------------------------------------------------------------------- the checkpoint's names

def loaded_names(names: list[str]) -> dict[str, list[str]]:
    """transformers' own loading rules for nemotron_h (conversion_mapping.py: WeightRenaming backbone. -> model.,
    then MergeModulelist over mixer.experts.*.up_proj.weight and down_proj.weight), applied name by name: each
    model key -> the checkpoint names that load into it."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    rules = get_checkpoint_conversion_mapping("nemotron_h")
    renamings = [r for r in rules if isinstance(r, WeightRenaming)]
    converters = [r for r in rules if isinstance(r, WeightConverter)]
    out: dict[str, list[str]] = {}
    for name in names:
        key, _ = rename_source_key(name, renamings, converters)
        out.setdefault(key, []).append(name)
    return out


@pytest.mark.parametrize("slug", [SLUG, "nemotron-3-super-120b-a12b"])  # Super: latent projections too
def test_predicted_names_load_into_the_reference_by_its_own_rules(slug):
    """Issue 35 item 3: the predicted layout names tensors as the published files do (backbone.*, one tensor per
    routed expert). Fed through transformers' loading rules (not the family's renames), they land on exactly the
    reference model's state dict, each routed-expert tensor from one checkpoint tensor per expert."""
    from explorer.checkpoint.reconcile import predicted_index

    tiny = tiny_spec(spec_of(slug))
    names = [n for g in predicted_index(tiny).groups for n in g.box.names()]
    assert all(n.startswith(("backbone.", "lm_head.")) for n in names)
    loaded = loaded_names(names)
    model = tiny_reference_model(tiny)
    assert set(loaded) == set(model.state_dict())
    experts = tiny.values["n_routed_experts"]
    stacked = {k: v for k, v in loaded.items() if k.endswith((".experts.up_proj", ".experts.down_proj"))}
    assert stacked and all(len(v) == experts for v in stacked.values())
    assert all(len(v) == 1 for k, v in loaded.items() if k not in stacked)


def test_the_published_module_lists_name_predicted_modules():
    """The published NVFP4 export's exclude list (recorded from its hf_quant_config.json) names backbone.* modules;
    every one that is not a glob is a module of the predicted layout, as named there."""
    from explorer.checkpoint.reconcile import predicted_index
    from explorer.checkpoint.variants import load_variants

    spec = spec_of()
    (variant,) = load_variants(ROOT / "content/models" / SLUG)
    modules = {n.rsplit(".", 1)[0] for g in predicted_index(spec).groups for n in g.box.names()}
    named = [m for m in variant.modelopt.exclude_modules if "*" not in m]
    assert len(named) > 20 and all(m in modules for m in named), [m for m in named if m not in modules][:3]


def test_the_reference_layout_does_not_load_as_a_checkpoint_by_its_rules(nano):
    """The mutation: tensors laid out as transformers holds them (model.*, each layer's routed experts in one
    stacked tensor) are not a checkpoint its loader reads: the stacked experts match no loading rule."""
    _, tiny = nano
    model = tiny_reference_model(tiny)
    as_held = [n + ".weight" if n.endswith((".experts.up_proj", ".experts.down_proj")) else n
               for n in model.state_dict()]
    assert set(loaded_names(as_held)) != set(model.state_dict())
