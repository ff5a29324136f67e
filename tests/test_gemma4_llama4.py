"""Gemma 4 26B-A4B and Llama 4 Scout (text), issue 22: totals equal transformers' parameter counts on the meta
device, persistent buffers named with their element counts, the tiny configs keep each mechanism exercised (a chunk
smaller than T, a NoPE layer beside a RoPE layer, head counts and widths differing by layer kind), the executed checks
pass, and each new mechanism made deliberately wrong fails its check; the per-layer-kind cache figures cap chunked
and sliding layers and count keys-as-values layers once."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.checkpoint.reconcile import expected_groups, reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import FREE_SIZES, check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.figures.model_figures import CONTEXT, derive
from explorer.model.account import account
from explorer.model.components import keys_as_values, sigmoid_moe
from explorer.model.components.base import PROGRAMS
from explorer.model.components.blocks import block_layers
from explorer.model.families import FAMILIES, load_model_spec
from explorer.model.families import gemma4 as gemma4_module
from explorer.model.families import llama4 as llama4_module

torch.set_num_threads(1)  # tiny tensors: threads only contend on a shared machine

GEMMA4, LLAMA4 = "gemma-4-26b-a4b", "llama-4-scout-17b-16e"


def spec_of(slug: str):
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def gemma():
    spec = spec_of(GEMMA4)
    return spec, tiny_spec(spec)


@pytest.fixture(scope="module")
def llama():
    spec = spec_of(LLAMA4)
    return spec, tiny_spec(spec)


def reference_parameters(spec) -> int:
    return sum(p.numel() for p in build_reference_model(spec).parameters())


# ------------------------------------------------------------------------------------------------- totals

@pytest.mark.parametrize("slug, total", [(GEMMA4, 25_805_933_872), (LLAMA4, 107_769_861_120)])
def test_totals_equal_transformers_on_meta_and_reconcile(slug, total):
    spec = spec_of(slug)
    assert account(spec).total == reference_parameters(spec) == total
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_gemma4_vision_tower_and_embedder_counts(gemma):
    accounts = account(gemma[0]).accounts
    assert accounts["vision_tower"].total == 569_548_080
    assert accounts["embed_vision"].total == 3_244_032


def test_gemma4_persistent_buffers_are_named_with_their_sizes(gemma):
    spec = gemma[0]
    assert sum(g.shape == (1,) for g in expected_groups(spec) if g.role == "buffer") >= 1
    model = build_reference_model(spec)
    state = model.state_dict()  # once: inside the comprehension it was rebuilt per buffer
    theirs = {n: b.numel() for n, b in model.named_buffers() if n in state}
    assert sum(theirs.values()) == 2_334
    assert theirs["model.vision_tower.std_bias"] == theirs["model.vision_tower.std_scale"] == 1_152
    assert sum(1 for n in theirs if n.endswith(".layer_scalar")) == 30
    ours = [t for _, c in _walk(spec.root) for t in c.tensors if t.role == "buffer" and t.shape is not None]
    assert {t.template for t in ours} == {"model.language_model.layers.{layer}.layer_scalar", "model.vision_tower.std_bias",
                         "model.vision_tower.std_scale"}
    assert sum(t.count for t in ours if "layer_scalar" in t.template) == 30


def _walk(comp, ancestors=()):
    yield ancestors, comp
    for c in comp.children:
        yield from _walk(c, ancestors + (comp,))


def test_llama4_is_the_text_model_and_says_so(llama):
    spec = llama[0]
    assert "vision tower is not described" in spec.root.description
    chunked, nope = spec.root.child("blocks").children
    assert block_layers(nope) == tuple(range(3, 48, 4)) and len(block_layers(chunked)) == 36


# -------------------------------------------------------------------------------------------- tiny configs

def test_tiny_configs_keep_the_mechanisms(gemma, llama):
    T = FREE_SIZES["T"]
    _, tiny = llama
    chunked, nope = tiny.root.child("blocks").children
    ca, na = chunked.child("attn").options, nope.child("attn").options
    assert ca.chunk is not None and ca.chunk < T and ca.rope and ca.qk_norm == "l2"
    assert not na.rope and na.chunk is None and na.temperature is not None
    assert "rope" not in [c.key for c in nope.child("attn").children]
    assert na.temperature.floor_scale < T  # the temperature exceeds 1 within the tiny sequence
    _, tiny = gemma
    local, glob = tiny.root.child("blocks").children
    la, ga = local.child("attn").options, glob.child("attn").options
    assert la.window < T and ga.window is None
    assert (la.shape.kv_heads, la.shape.qk_head_dim) != (ga.shape.kv_heads, ga.shape.qk_head_dim)
    assert ga.keys_as_values and "v_proj" not in [c.key for c in glob.child("attn").children]
    assert glob.child("attn").child("rope").options.zero_frequency_pairs > 0


def test_executed_checks_pass(gemma, llama):
    for spec, tiny in (gemma, llama):
        checks = check_equations(spec, tiny)
        assert all(c.status in ("checked", "part") for c in checks.values()), spec.slug
    assert checks["blocks.nope.attn"].status == checks["blocks.chunked.attn.rope"].status == "checked"


def fails(spec_tiny, where: str, absent: str = "") -> None:
    spec, _ = spec_tiny
    tiny = tiny_spec(spec)  # rebuilt under the monkeypatch
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny)
    assert where in str(info.value), str(info.value)
    if absent:
        assert absent not in str(info.value), str(info.value)


def _patched_options(monkeypatch, module, **changes):
    original = module.LayerAttentionOptions

    def build(*args, **kwargs):
        o = original(*args, **kwargs)
        return dataclasses.replace(o, **{k: f(o) for k, f in changes.items()})

    monkeypatch.setattr(module, "LayerAttentionOptions", build)


# ------------------------------------------------------------------------------- mutations: Llama 4

def test_chunk_left_out_fails(llama, monkeypatch):
    _patched_options(monkeypatch, llama4_module, chunk=lambda o: None)
    fails(llama, "blocks.chunked.attn: max |Δ|", absent="blocks.nope")


def test_nope_layer_rotated_fails(llama, monkeypatch):
    _patched_options(monkeypatch, llama4_module, rope=lambda o: True)
    fails(llama, "blocks.nope.attn: max |Δ|", absent="blocks.chunked")


def test_nope_temperature_left_out_fails(llama, monkeypatch):
    _patched_options(monkeypatch, llama4_module, temperature=lambda o: None)
    fails(llama, "blocks.nope.attn: max |Δ|", absent="blocks.chunked")


def test_l2_qk_norm_left_out_fails(llama, monkeypatch):
    _patched_options(monkeypatch, llama4_module, qk_norm=lambda o: "none")
    fails(llama, "blocks.chunked.attn: max |Δ|", absent="blocks.nope")


def test_gate_on_expert_output_instead_of_input_fails(llama, monkeypatch):
    """Deliberately wrong: G·E(x) instead of E(G·x) (equal only for linear experts)."""
    original = sigmoid_moe.expert_outputs

    def gate_after(run, o, x, G):
        return original(run, o, x, torch.ones_like(G)) * G.to(x.dtype)[..., None]

    monkeypatch.setattr(sigmoid_moe, "expert_outputs", gate_after)
    fails(llama, "blocks.chunked.moe.experts: max |Δ|")


def test_router_normalised_over_experts_fails(llama, monkeypatch):
    """Deliberately wrong: a softmax over all experts instead of the kept expert's own sigmoid."""
    def softmax_route(run, o, x):
        z = run.rec("logits", torch.nn.functional.linear(x, run.w("weight")))
        selected = run.rec("select", torch.zeros_like(z).scatter(-1, z.topk(o.k, dim=-1).indices, 1.0))
        return run.rec("gates", torch.softmax(z, dim=-1) * selected)

    monkeypatch.setattr(sigmoid_moe, "route", softmax_route)
    fails(llama, "blocks.chunked.moe.router: max |Δ|")


def test_shared_expert_left_out_fails(llama, monkeypatch):
    def no_shared(comp, run, x):
        router_c = comp.child("router")
        G = sigmoid_moe.route(run.child("router."), router_c.options, x)
        return [run.rec("moe-out", sigmoid_moe.run_input_gated_experts(comp.child("experts"), run.child("experts."),
                                                                      x, G)[0])]

    monkeypatch.setitem(PROGRAMS, "sigmoid_moe", no_shared)
    fails(llama, "blocks.chunked.moe: max |Δ|")


# ------------------------------------------------------------------------------- mutations: Gemma 4

def test_values_not_from_the_raw_keys_fail(gemma, monkeypatch):
    """Deliberately wrong: values read from the key projection in another feature order."""
    monkeypatch.setattr(keys_as_values, "values_from_keys", lambda K: K.flip(-1))
    fails(gemma, "blocks.global.attn: max |Δ|", absent="blocks.local.attn:")


def test_value_norm_left_out_fails(gemma, monkeypatch):
    _patched_options(monkeypatch, gemma4_module, value_norm=lambda o: False)
    fails(gemma, "blocks.global.attn: max |Δ|")


def test_full_rotary_on_global_layers_fails(gemma, monkeypatch):
    """Deliberately wrong: every pair of the wider global head rotated (partial rotary left out)."""
    original = gemma4_module.RopeOptions
    monkeypatch.setattr(gemma4_module, "RopeOptions", lambda *a, **k: original(*a, **{**k, "zero_frequency_pairs": 0}))
    fails(gemma, "blocks.global.attn.rope: max |Δ|", absent="blocks.local")


def test_softmax_scale_of_one_over_sqrt_d_fails(gemma, monkeypatch):
    _patched_options(monkeypatch, gemma4_module, scale=lambda o: o.shape.qk_head_dim ** -0.5)
    fails(gemma, "blocks.local.attn: max |Δ|")


def test_wrong_soft_cap_fails(gemma, monkeypatch):
    original = gemma4_module.softcapped
    monkeypatch.setattr(gemma4_module, "softcapped", lambda head, cap, c: original(head, cap * 2, c))
    fails(gemma, "lm_head: max |Δ|")


def test_experts_routed_from_the_normed_stream_fail(gemma, monkeypatch):
    """Deliberately wrong: the router reads the MLP's normalised input instead of the residual stream."""
    original = PROGRAMS["moe_beside_mlp"]
    monkeypatch.setitem(PROGRAMS, "moe_beside_mlp", lambda comp, run, x_ffn, x_mid: original(comp, run, x_ffn, x_ffn))
    fails(gemma, "blocks.local: max |Δ|")


# ---------------------------------------------------------------------------------------------- figures

def test_cache_per_layer_kind(gemma, llama):
    figures = derive(gemma[0], account(gemma[0]), None)
    local, glob = figures.attention
    assert (local.window, local.cache_per_token) == (1024, 2 * 8 * 256)
    # keys double as values, yet the reference caches both: the keys normalised and rotated, the values normalised
    assert (glob.window, glob.cache_per_token) == (None, 2 * (512 + 512))
    assert figures.get("kv_cache_bytes_bf16").value == 2 * (25 * 4096 * 1024 + 5 * 2048 * CONTEXT)
    assert figures.get("kv_cache_per_token").value == 5 * 2048  # the sliding layers stop growing at 1,024
    figures = derive(llama[0], account(llama[0]), None)
    chunked, nope = figures.attention
    assert chunked.chunk == 8192 and nope.chunk is None and nope.window is None
    assert figures.get("kv_cache_bytes_bf16").value == 2 * 2048 * (36 * 8192 + 12 * CONTEXT)
    assert figures.get("active_parameters").value == 17_172_894_720


# ------------------------------------------------------------------------------------------- add-model

@st.composite
def llama4_configs(draw):
    layers = draw(st.integers(2, 6))
    heads = draw(st.sampled_from([2, 4, 8]))
    return {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "text_config": {
        "vocab_size": draw(st.integers(50, 300)), "hidden_size": 16 * draw(st.integers(1, 4)),
        "intermediate_size": draw(st.integers(8, 64)), "intermediate_size_mlp": draw(st.integers(8, 64)),
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": draw(st.sampled_from(
            [h for h in (1, 2, heads) if heads % h == 0])), "head_dim": 2 * draw(st.integers(2, 16)),
        "num_local_experts": draw(st.integers(2, 6)), "num_experts_per_tok": 1,
        "interleave_moe_layer_step": draw(st.integers(1, 2)), "no_rope_layer_interval": draw(st.integers(2, 4)),
        "use_qk_norm": draw(st.booleans()), "attention_chunk_size": draw(st.integers(2, 64))}}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=llama4_configs())
def test_any_llama4_config_totals_equal_transformers(raw):
    spec = FAMILIES["llama4"].build_spec("drawn", raw, "drawn config")
    assert account(spec).total == reference_parameters(spec)
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced


@st.composite
def gemma4_configs(draw):
    layers = draw(st.integers(2, 5))
    kv = draw(st.sampled_from([1, 2]))
    moe = draw(st.booleans())
    text = {"vocab_size": draw(st.integers(50, 300)), "hidden_size": 16 * draw(st.integers(1, 3)),
            "intermediate_size": draw(st.integers(8, 48)), "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": kv, "head_dim": 8, "global_head_dim": draw(st.sampled_from([8, 16])),
            "attention_k_eq_v": draw(st.booleans()), "num_global_key_value_heads": draw(st.sampled_from([1, 2])),
            "hidden_size_per_layer_input": 0, "enable_moe_block": moe, "sliding_window": 4,
            "final_logit_softcapping": 30.0}
    if moe:
        text.update(num_experts=draw(st.integers(2, 5)), top_k_experts=1, moe_intermediate_size=draw(st.integers(4, 16)))
    vision = {"hidden_size": 16, "intermediate_size": draw(st.integers(8, 32)), "num_hidden_layers": draw(st.integers(1, 2)),
              "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "patch_size": draw(st.integers(1, 3)),
              "position_embedding_size": draw(st.integers(4, 32)), "standardize": draw(st.booleans())}
    return {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
            "vision_config": vision, "vision_soft_tokens_per_image": 4}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=gemma4_configs())
def test_any_gemma4_config_totals_equal_transformers(raw):
    spec = FAMILIES["gemma4"].build_spec("drawn", raw, "drawn config")
    assert account(spec).total == reference_parameters(spec)
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced


def test_gemma3_style_one_plus_w_gain_fails(gemma, monkeypatch):
    """Deliberately wrong: Gemma 3's (1 + w) RMSNorm gain; Gemma 4's norms multiply by w itself."""
    original = gemma4_module.rmsnorm
    monkeypatch.setattr(gemma4_module, "rmsnorm", lambda *a, **k: original(*a, **{**k, "gain": "1+w"}))
    fails(gemma, "blocks.local.attn_norm: max |Δ|")


def test_compare_rows_name_the_mechanisms(builds):
    from explorer.views.compare_pages import compare_page

    pairs = {("gemma-3-27b", GEMMA4): ("Attention", "Attention with keys as values"),
             ("llama-3.1-70b", LLAMA4): ("Attention", "Chunked attention, NoPE attention")}
    for (a, b), (role, named) in pairs.items():
        labels = [r.label for r in compare_page(builds[a], builds[b]).rows]
        assert any(label.startswith(role + ":") and named in label for label in labels), labels
    labels = [r.label for r in compare_page(builds["llama-3.1-70b"], builds[LLAMA4]).rows]
    assert "Mixture of experts: — → Mixture of experts" in labels


def test_layer_scalar_left_out_fails(gemma, monkeypatch):
    """Deliberately wrong: the stored per-layer scalar (a buffer, randomised in the tiny reference) not applied."""
    from explorer.model.components import layer_blocks

    original = layer_blocks.run_layer_block

    def unscaled(comp, run, x, angles, M):
        o = comp.options
        return original(dataclasses.replace(comp, options=dataclasses.replace(o, layer_scalar=False)), run, x, angles, M)

    monkeypatch.setitem(PROGRAMS, "layer_block", unscaled)
    fails(gemma, "blocks.local: max |Δ|")


def test_vision_standardisation_left_out_fails(gemma, monkeypatch):
    original = gemma4_module.Gemma4VisionOptions
    monkeypatch.setattr(gemma4_module, "Gemma4VisionOptions",
                        lambda *a, **k: dataclasses.replace(original(*a, **k), standardize=False))
    fails(gemma, "vision_tower: max |Δ|")
