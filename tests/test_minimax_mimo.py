"""MiniMax-M2.5 and MiMo-V2-Flash (issue 22): totals equal transformers' on the meta device, with the persistent
router biases listed by name; the executed checks at tiny configs of the same structure (partial rotary, QK-norm
across heads, sink logits on sliding layers, key/value head counts that differ by layer kind, value heads narrower
than query/key heads) pass, and each deliberately wrong program fails; the FP8 layout is predicted from the config
with modules_to_not_convert applied; the KV cache of each layer kind is exact; --add-model adds other configs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.checkpoint.reconcile import predicted_index, reconcile
from explorer.commands.add_model import add_model
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import FREE_SIZES, check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.figures.model_figures import CONTEXT, derive
from explorer.model.account import account
from explorer.model.components import attention, layer_attention, moe
from explorer.model.families import FAMILIES, load_model_spec
from explorer.model.families.block_fp8 import names_module
from explorer.model.families.mimo_v2_flash import MiMoV2Flash
from explorer.spec.types import ModelSpec

TOTALS = {"minimax-m2.5": (228_689_748_992, 15_872), "mimo-v2-flash": (308_778_768_832, 12_032)}
"""Parameters, and persistent buffers (e_score_correction_bias of every MoE layer), as issue 22 states them."""
BIAS = {"minimax-m2.5": "model.layers.{}.block_sparse_moe.e_score_correction_bias",
        "mimo-v2-flash": "model.layers.{}.mlp.gate.e_score_correction_bias"}


def spec_of(slug: str) -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def tiny() -> dict[str, tuple[ModelSpec, ModelSpec]]:
    return {slug: (spec_of(slug), tiny_spec(spec_of(slug))) for slug in TOTALS}


def fails(spec: ModelSpec, tiny_: ModelSpec, where: str) -> None:
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny_)
    assert where in str(info.value), str(info.value)


# ------------------------------------------------------------------------------------------------- totals

@pytest.mark.parametrize("slug", list(TOTALS))
def test_totals_equal_transformers_on_meta_and_buffers_are_named(slug):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    params, buffers = TOTALS[slug]
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == params
    state = model.state_dict()  # once: inside the comprehension it was rebuilt per buffer
    persistent = {n: b.numel() for n, b in model.named_buffers() if n in state}
    assert sum(persistent.values()) == buffers and all(n.endswith("e_score_correction_bias") for n in persistent)
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)
    stored = predicted_index(spec).tensors
    named = {n: t for n, t in stored.items() if n.endswith("e_score_correction_bias")}
    assert sum(t.shape[0] for t in named.values()) == buffers and BIAS[slug].format(1) in named
    by_role = {t.role: t for t in reconcile(spec, predicted_index(spec)).totals}
    assert by_role["buffer"].elements == buffers and by_role["buffer"].parameters == 0


def test_a_per_head_qk_norm_does_not_balance():
    """MiniMax-M2's q_norm spans all heads (48 × 128 features); a per-head norm's gain would be 128 wide."""
    spec = spec_of("minimax-m2.5")
    assert account(spec).accounts["blocks.moe.attn.q_norm"].per_instance == 48 * 128
    bad = replace(spec, values={**spec.values, "num_attention_heads": 1})  # q_norm as wide as one head
    rec = reconcile(bad, reference_index(spec).index, reference=True)
    assert any(m.name.endswith("self_attn.q_norm.weight") for m in rec.shape_mismatch)


# ------------------------------------------------------------------------------------------ executed checks

def test_tiny_configs_keep_the_mechanisms(tiny):
    _, mm = tiny["minimax-m2.5"]
    rope = mm.root.child("blocks").child("moe").child("attn").child("rope").options
    assert 0 < rope.dim < rope.head_width and rope.unrotated_tail  # partial rotary, leading layout
    _, mimo = tiny["mimo-v2-flash"]
    blocks = {b.key: b for b in mimo.root.child("blocks").children}
    assert list(blocks) == ["dense", "sliding", "full"]
    sliding, full = (blocks[k].child("attn").options for k in ("sliding", "full"))
    assert sliding.shape.kv_heads == 2 * full.shape.kv_heads
    assert sliding.shape.v_head_dim < sliding.shape.qk_head_dim
    scores = {k: blocks[k].child("attn").child("scores").options for k in blocks}
    assert scores["sliding"].sinks and not scores["full"].sinks
    assert scores["sliding"].window < FREE_SIZES["T"] and scores["full"].window is None
    assert sliding.value_scale != 1.0


@pytest.mark.parametrize("slug", list(TOTALS))
def test_tiny_checks_pass(tiny, slug):
    checks = check_equations(*tiny[slug])
    attn = [p for p in checks if p.endswith(".attn")]
    assert attn and all(checks[p].status == "checked" for p in attn)
    assert all(checks[p].status == "checked" for p in checks if p.endswith(".router"))


def test_qk_norm_per_head_fails(tiny, monkeypatch):
    """Normalising each 16-feature head instead of the whole projection changes MiniMax-M2's attention."""
    real = layer_attention.apply_norm

    def per_head(run, name, x, opts, module):
        if x.dim() != 3:
            return real(run, name, x, opts, module)
        heads = x.view(*x.shape[:-1], -1, 16)
        y = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + opts.eps)
        return run.rec(name, y.reshape(x.shape) * run.w(module + "weight"))

    monkeypatch.setattr(layer_attention, "apply_norm", per_head)
    fails(*tiny["minimax-m2.5"], "blocks.moe.attn: max |Δ|")


@pytest.mark.parametrize("slug", list(TOTALS))
def test_rotating_the_wrong_features_fails(tiny, monkeypatch, slug):
    """Partial rotary turns the first rotary features of each head; turning the last ones instead fails."""
    real = layer_attention.rotate
    monkeypatch.setattr(layer_attention, "rotate", lambda x, a, o: torch.cat(
        [x[..., :-o.dim], real(x[..., -o.dim:], a, o)], dim=-1))
    fails(*tiny[slug], ".attn: max |Δ|")


def test_mimo_without_sinks_fails(tiny, monkeypatch):
    real = attention.attend
    monkeypatch.setattr(attention, "attend", lambda run, o, *a: real(run, replace(o, sinks=False), *a))
    fails(*tiny["mimo-v2-flash"], "blocks.sliding.attn: max |Δ|")


def test_mimo_without_the_window_fails(tiny, monkeypatch):
    real = attention.attend
    monkeypatch.setattr(attention, "attend", lambda run, o, *a: real(run, replace(o, window=None), *a))
    with pytest.raises(ExecutionError) as info:
        check_equations(*tiny["mimo-v2-flash"])
    assert "blocks.sliding.attn: max |Δ|" in str(info.value) and "blocks.full.attn:" not in str(info.value)


def test_mimo_without_the_value_scale_fails(tiny, monkeypatch):
    spec, small = tiny["mimo-v2-flash"]
    blocks = tuple(replace(b, children=tuple(replace(c, options=replace(c.options, value_scale=1.0))
                                             if c.key == "attn" else c for c in b.children))
                   for b in small.root.child("blocks").children)
    stack = replace(small.root.child("blocks"), children=blocks)
    unscaled = replace(small, root=replace(small.root, children=tuple(stack if c.key == "blocks" else c
                                                                      for c in small.root.children)))
    fails(spec, unscaled, "blocks.sliding.attn: max |Δ|")


def test_mimo_with_the_same_kv_heads_in_every_layer_kind_fails(tiny, monkeypatch):
    """Giving the sliding layers the global layers' key/value head count fails both checks."""
    spec, _ = tiny["mimo-v2-flash"]
    family = FAMILIES["mimo_v2_flash"]
    real = MiMoV2Flash.attention

    def same_heads(self, ctx, c, layer_type, prefix, ranges, x):
        comp = real(self, ctx, c, "full_attention", prefix, ranges, x)
        return comp if layer_type == "full_attention" else replace(
            comp, children=tuple(replace(ch, options=replace(ch.options, window=3, sinks=True))
                                 if ch.key == "scores" else ch for ch in comp.children))

    monkeypatch.setattr(MiMoV2Flash, "attention", same_heads)
    bad_full = family.build_spec("bad", load_model_content(ROOT / "content/models/mimo-v2-flash").config, "test")
    rec = reconcile(bad_full, reference_index(spec).index, reference=True)
    assert any(".self_attn.k_proj.weight" in m.name for m in rec.shape_mismatch)
    bad_tiny = family.build_spec("bad", family.tiny_config(spec.config), "test")
    fails(spec, bad_tiny, "is invalid for input of size")  # the sliding k_proj holds two heads, not one


def test_minimax_router_ignoring_the_correction_bias_fails(tiny, monkeypatch):
    """The bias the MoE block hands its router steers the selection: without it other experts win."""
    spec, small = tiny["minimax-m2.5"]
    real = moe.route
    monkeypatch.setattr(moe, "route", lambda run, o, x: real(run, replace(o, correction_bias=False), x))
    fails(spec, small, "moe.router")


# ------------------------------------------------------------------------------------------ stored layout

def test_fp8_layout_is_predicted_with_modules_to_not_convert():
    spec = spec_of("minimax-m2.5")
    stored = predicted_index(spec).tensors
    q = stored["model.layers.0.self_attn.q_proj.weight"]
    assert (q.dtype, q.shape) == ("F8_E4M3", (6144, 3072))
    assert stored["model.layers.0.self_attn.q_proj.weight_scale_inv"].shape == (48, 24)
    assert stored["model.layers.0.block_sparse_moe.experts.7.w2.weight_scale_inv"].shape == (24, 12)
    for name in ("model.layers.0.block_sparse_moe.gate.weight", "lm_head.weight", "model.embed_tokens.weight",
                 "model.layers.0.self_attn.q_norm.weight"):
        assert stored[name].dtype == "BF16" and name + "_scale_inv" not in stored
    assert stored[BIAS["minimax-m2.5"].format(0)].dtype == "F32"
    mimo = predicted_index(spec_of("mimo-v2-flash")).tensors
    assert mimo["model.layers.1.self_attn.attention_sink_bias"].dtype == "BF16"
    assert "model.layers.0.self_attn.attention_sink_bias" not in mimo  # layer 0 is global: no sinks
    assert mimo["model.layers.1.self_attn.v_proj.weight_scale_inv"].shape == (8, 32)  # 8 heads × 128 / 128


def test_modules_named_in_modules_to_not_convert_stay_dense():
    raw = load_model_content(ROOT / "content/models/minimax-m2.5").config
    quant = {**raw["quantization_config"], "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    spec = FAMILIES["minimax_m2"].build_spec("dense-attn", {**raw, "quantization_config": quant}, "test")
    stored = predicted_index(spec).tensors
    assert stored["model.layers.3.self_attn.o_proj.weight"].dtype == "BF16"
    assert stored["model.layers.3.block_sparse_moe.experts.0.w1.weight"].dtype == "F8_E4M3"
    with pytest.raises(ContentError, match="some of its layers"):
        FAMILIES["minimax_m2"].build_spec("one-layer", {**raw, "quantization_config": {
            **quant, "modules_to_not_convert": ["model.layers.1.self_attn"]}}, "test")


@pytest.mark.parametrize("pattern,module", [
    ("gate", "model.layers.0.mlp.gate"), ("gate", "model.layers.0.mlp.gate_proj"), ("lm_head", "lm_head"),
    ("model.layers.1", "model.layers.11.self_attn"), ("model.layers.1", "model.layers.1.self_attn"),
    ("model.layers.*.self_attn", "model.layers.7.self_attn.q_proj"), ("mlp.gate", "model.layers.2.mlp.gate_proj"),
    ("e_score_correction_bias", "model.layers.0.mlp.experts")])
def test_pattern_matching_agrees_with_transformers(pattern, module):
    from transformers.quantizers.quantizers_utils import should_convert_module

    assert names_module(pattern, module) == (not should_convert_module(module, [pattern]))


# ---------------------------------------------------------------------------------------------- memory

@pytest.mark.parametrize("slug", list(TOTALS))
def test_kv_cache_per_layer_kind_is_exact(slug):
    """Independently of the spec: each reference layer caches k_proj and v_proj outputs per token, a sliding layer
    only for its window (transformers' sliding_window)."""
    spec = spec_of(slug)
    model = build_reference_model(spec)
    want = 0
    for layer in model.model.layers:
        a = layer.self_attn
        window = getattr(a, "sliding_window", None)
        want += (a.k_proj.out_features + a.v_proj.out_features) * min(CONTEXT, window or CONTEXT) * 2
    figures = derive(spec, account(spec), None)
    by_kind = [f for f in figures.figures if f.key.startswith("kv_cache_bytes_bf16_")]
    assert sum(f.value for f in by_kind) == want == figures.get("kv_cache_bytes_bf16").value
    if slug == "mimo-v2-flash":
        sliding = figures.get("kv_cache_bytes_bf16_sliding")
        assert sliding.value == 39 * 8 * (192 + 128) * 129 * 2
        assert sliding.formula == "39 × (2 × num_key_value_heads × (head_dim + v_head_dim)) × min(131,072, 129) × 2 bytes"
        assert figures.get("kv_cache_per_layer_full").value == 4 * (192 + 128)


# ---------------------------------------------------------------------------------------------- add-model

@st.composite
def minimax_configs(draw):
    kv = draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([8, 16]))
    experts = draw(st.integers(2, 6))
    return {"model_type": "minimax_m2", "vocab_size": draw(st.integers(50, 120)), "hidden_size": 32,
            "intermediate_size": draw(st.sampled_from([16, 24])), "num_hidden_layers": draw(st.integers(1, 3)),
            "num_attention_heads": kv * draw(st.integers(1, 3)), "num_key_value_heads": kv, "head_dim": head_dim,
            "rotary_dim": draw(st.sampled_from([None, head_dim // 2, head_dim])), "num_local_experts": experts,
            "num_experts_per_tok": draw(st.integers(1, experts)), "rope_theta": 10000.0}


@st.composite
def mimo_configs(draw):
    layers = draw(st.integers(1, 7))
    kv = draw(st.sampled_from([1, 2]))
    experts = draw(st.integers(2, 6))
    config = {"model_type": "mimo_v2_flash", "vocab_size": draw(st.integers(50, 120)), "hidden_size": 32,
              "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": layers,
              "num_attention_heads": 2 * kv * draw(st.integers(1, 2)), "num_key_value_heads": kv,
              "head_dim": draw(st.sampled_from([12, 24])), "v_head_dim": draw(st.sampled_from([8, 16])),
              "n_routed_experts": experts, "num_experts_per_tok": draw(st.integers(1, experts)),
              "sliding_window_size": draw(st.integers(1, 8)), "routed_scaling_factor": None}
    if draw(st.booleans()):
        config["layer_types"] = [draw(st.sampled_from(["full_attention", "sliding_attention"])) for _ in range(layers)]
        config["mlp_layer_types"] = [draw(st.sampled_from(["dense", "sparse"])) for _ in range(layers)]
    return config


def adds_and_agrees(tmp_path, config: dict) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    folder = tmp_path / "content" / "models" / "added"
    if folder.exists():  # hypothesis reuses tmp_path across examples
        import shutil
        shutil.rmtree(folder)
    toml = add_model(tmp_path / "content", "added", path, "org/added", "unpinned")  # writes a revision_note
    spec = load_model_spec(load_model_content(toml.parent))
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(minimax_configs())
def test_added_minimax_configs_agree_with_transformers(tmp_path, config):
    adds_and_agrees(tmp_path, config)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(mimo_configs())
def test_added_mimo_configs_agree_with_transformers(tmp_path, config):
    adds_and_agrees(tmp_path, config)


def test_a_published_key_transformers_ignores_must_agree(tmp_path):
    raw = json.loads(json.dumps(load_model_content(ROOT / "content/models/mimo-v2-flash").config))
    raw["hybrid_layer_pattern"] = [1] + raw["hybrid_layer_pattern"][1:]
    raw["swa_rope_theta"] = 20000
    with pytest.raises(ContentError) as info:
        FAMILIES["mimo_v2_flash"].build_spec("bad", raw, "config.json")
    text = str(info.value)
    assert "key 'hybrid_layer_pattern'" in text and "key 'swa_rope_theta'" in text


# ------------------------------------------------------------------------------------------ partial rotary layouts

def _unchanged_features(o) -> list[int]:
    """The head features a rotation by o's angles at positions 1..4 leaves as they were."""
    from explorer.model.components.base import Run
    from explorer.model.components.rope import rotary_angles, rotate

    x = torch.randn(4, 8, dtype=torch.float64)
    angles = rotary_angles(Run({}), o, torch.arange(1, 5))
    y = rotate(x, angles.double(), o)
    return [i for i in range(8) if torch.equal(x[:, i], y[:, i])]


def test_the_two_partial_rotary_layouts_leave_different_features_unrotated():
    """MiniMax-M2 and MiMo-V2-Flash rotate the leading features of a head and pass the tail through (their
    apply_rotary_pos_emb slices q[..., :rotary_dim]); Gemma 4's proportional RoPE pairs the whole head as rotate_half
    does and gives the last pairs frequency 0, so with half pairing the tail of each half passes through."""
    from explorer.model.components.rope import RopeOptions

    leading = RopeOptions("default", 10000.0, 4, "half", unrotated_tail=4)
    proportional = RopeOptions("default", 10000.0, 8, "half", zero_frequency_pairs=2)
    assert _unchanged_features(leading) == [4, 5, 6, 7]
    assert _unchanged_features(proportional) == [2, 3, 6, 7]
    assert _unchanged_features(RopeOptions("default", 10000.0, 8, "half")) == []  # deliberately full: none pass


def test_a_rotary_that_is_both_partial_layouts_is_refused():
    from explorer.model.components.rope import RopeOptions

    with pytest.raises(ValueError, match="not both"):
        RopeOptions("default", 10000.0, 4, "half", unrotated_tail=4, zero_frequency_pairs=1)
