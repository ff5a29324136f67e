"""DeepSeek-V4-Flash (issue 20): totals and persistent buffers equal transformers on the meta device and the reference
reconciliation balances; the executed checks at a tiny config with both compressors, 3 streams, a hash layer and a
scored layer pass; each deliberately wrong mechanism (Sinkhorn skipped, streams not mixed, a wrong compress ratio,
a wrong top-k, sigmoid for √softplus, the table ignored, no clamp) fails its check; the stored layout and the
per-token memory are predicted from the config."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.checkpoint.reconcile import predicted_index, reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import FREE_SIZES, check_equations, tiny_spec, trace
from explorer.execute.reference import build_reference_model, reference_index
from explorer.model.account import account
from explorer.model.components import (
    compressed_attention,
    fused_experts,
    hash_routing,
    hc_blocks,
    hyper_connections,
    moe,
)
from explorer.model.families import FAMILIES, load_model_spec
from explorer.spec.types import ModelSpec, walk

torch.set_num_threads(1)  # the tiny checks are single-threaded in the build too (pipeline._one_torch_thread)
SLUG = "deepseek-v4-flash"
TOTAL = 284_332_230_231
BUFFERS = 2_337_280


def spec_of(slug: str = SLUG) -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def specs() -> tuple[ModelSpec, ModelSpec]:
    spec = spec_of()
    return spec, tiny_spec(spec)


def buffers_of(spec: ModelSpec) -> dict[str, int]:
    """Every persistent buffer the spec lists, by concrete name, with its element count."""
    out = {}
    for _, comp in walk(spec.root):
        for t in comp.tensors:
            if t.role == "buffer" and t.shape is not None:
                n = 1
                for s in t.shape:
                    n *= int(s.subs({sym: spec.values[sym.name] for sym in s.free_symbols}))
                out.update({name: n for name in t.names()})
    return out


# ------------------------------------------------------------------------------------------------- totals

def test_totals_and_buffers_equal_transformers_on_meta(specs):
    spec, _ = specs
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == TOTAL
    params = {n for n, _ in model.named_parameters()}
    theirs = {n: t.numel() for n, t in model.state_dict().items() if n not in params}
    assert buffers_of(spec) == theirs
    assert sum(theirs.values()) == BUFFERS
    assert theirs["model.layers.0.mlp.gate.tid2eid"] == 129_280 * 6
    assert theirs["model.layers.3.mlp.gate.e_score_correction_bias"] == 256
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_block_kinds_follow_compress_ratios_and_hash_layers(specs):
    spec, tiny = specs
    blocks = {b.key: b for b in spec.root.child("blocks").children}
    assert list(blocks) == ["sliding_hash", "csa_hash", "hca", "csa"]
    assert [blocks[k].repeat for k in blocks] == [2, 1, 20, 20]
    assert "indexer" in [c.key for c in blocks["csa"].child("attn").child("compressor").children]
    assert [c.key for c in blocks["hca"].child("attn").child("compressor").children] == ["pool"]  # no indexer
    assert blocks["sliding_hash"].child("moe").child("router").program == "hash_router"
    assert [b.key for b in tiny.root.child("blocks").children] == list(blocks)


def test_a_wrong_output_rank_does_not_balance(specs):
    spec, _ = specs
    bad = replace(spec, values={**spec.values, "o_lora_rank": 512})
    rec = reconcile(bad, reference_index(spec).index, reference=True)
    assert not rec.balanced and any("o_a_proj" in m.name for m in rec.shape_mismatch)


def test_full_size_shapes_trace_on_meta(specs):
    spec, _ = specs
    shapes = trace(spec).components
    assert shapes["blocks.csa.attn.compressor"].outputs == ((2, FREE_SIZES["T"] // 4, 512),)
    assert shapes["blocks.hca.attn.compressor"].outputs == ((2, 0, 512),)  # no window of 128 closes at T = 5


# ------------------------------------------------------------------------------------------ executed checks

def test_tiny_config_has_the_structure_the_checks_need(specs):
    _, tiny = specs
    c = tiny.config
    assert c.hc_mult > 1 and c.num_hash_layers >= 1 and c.num_hidden_layers > c.num_hash_layers
    assert {0, 4, 128} <= set(c.compress_ratios)
    assert c.sliding_window < FREE_SIZES["T"]
    assert all(FREE_SIZES["T"] // r >= 1 for r in c.compress_rates.values())  # both compressors close a window
    assert c.index_topk < FREE_SIZES["T"] // c.compress_rates["compressed_sparse_attention"]  # top-k selects
    assert c.index_n_heads > 1 and 1 < c.num_experts_per_tok < c.n_routed_experts


def test_tiny_checks_pass(specs):
    checks = check_equations(*specs)
    for path in ("", "blocks.csa_hash", "blocks.csa.attn.compressor.indexer", "blocks.hca.attn.compressor",
                 "blocks.sliding_hash.moe.router", "blocks.csa.moe.router", "blocks.hca.attn_hc", "hc_head",
                 "blocks.csa.attn.o_a_proj", "blocks.hca.moe.shared", "blocks.csa.moe.experts"):
        assert checks[path].status == "checked", path
    example = checks["blocks.sliding_hash.moe.router"].example
    assert example is not None and len(example.selected) == 2


def fails(specs, where: str) -> None:
    with pytest.raises(ExecutionError) as info:
        check_equations(*specs)
    assert where in str(info.value), str(info.value)


def test_sinkhorn_skipped_fails(specs, monkeypatch):
    monkeypatch.setattr(hyper_connections, "sinkhorn", lambda P, iters, eps: P)
    fails(specs, "attn_hc: max |Δ|")


def test_streams_not_mixed_fails(specs, monkeypatch):
    monkeypatch.setattr(hc_blocks, "expand", lambda post, comb, delta, X: post.unsqueeze(-1) * delta.unsqueeze(-2) + X)
    fails(specs, "blocks.csa: max |Δ|")


def test_wrong_compress_ratio_fails(specs, monkeypatch):
    """Entries opened as if each window were twice as long: the compressors' visibility differs."""
    real = compressed_attention.visible
    monkeypatch.setattr(compressed_attention, "visible", lambda ratio, T_, n, device: real(2 * ratio, T_, n, device))
    fails(specs, "blocks.hca.attn.compressor: max |Δ|")


def test_entries_rotated_for_a_wrong_compress_ratio_fail(specs, monkeypatch):
    """Entries rotated at w·2m instead of w·m: the ratio-4 stream's second entry differs."""
    real = compressed_attention.entry_positions
    monkeypatch.setattr(compressed_attention, "entry_positions", lambda n, ratio, device: real(n, 2 * ratio, device))
    fails(specs, "blocks.csa.attn.compressor: max |Δ|")


def test_wrong_top_k_fails(specs, monkeypatch):
    real = compressed_attention.select
    monkeypatch.setattr(compressed_attention, "select", lambda run, o, x, c_q: real(run, replace(o, topk=o.topk + 1), x, c_q))
    fails(specs, "attn.compressor.indexer: max |Δ|")


def test_indexer_heads_not_weighted_fail(specs, monkeypatch):
    """The indexer's scores are dsa.py's weighted ReLU over its compressed keys: summing the heads unweighted picks
    other entries."""
    monkeypatch.setattr(compressed_attention, "weigh_heads", lambda w, S: S.sum(dim=2))
    fails(specs, "attn.compressor.indexer: max |Δ|")


def test_sigmoid_scores_fail(specs, monkeypatch):
    monkeypatch.setattr(moe, "scores", lambda z, scoring: torch.sigmoid(z))
    fails(specs, "blocks.csa.moe.router: max |Δ|")


def test_hash_table_ignored_fails(specs, monkeypatch):
    """Choosing the hash layers' experts by score instead of by the token-id table selects other experts."""
    def by_score(run, o, x, ids):
        z = run.rec("logits", torch.nn.functional.linear(x.float(), run.w("weight").float()))
        s = run.rec("scores", moe.scores(z, o.scoring))
        picked = s.topk(o.k, dim=-1).indices
        selected = run.rec("select", torch.zeros_like(s).scatter(-1, picked, 1.0))
        return run.rec("gates", o.scaling * s * selected / (s * selected).sum(-1, keepdim=True)), picked

    monkeypatch.setattr(hash_routing, "hash_route", by_score)
    fails(specs, "blocks.sliding_hash.moe.router: step 'select' looks up different experts")


def test_unclamped_swiglu_fails(specs, monkeypatch):
    real = fused_experts.clamped_glu
    monkeypatch.setattr(fused_experts, "clamped_glu", lambda g, u, limit, *a: real(g, u, 1e9, *a))
    fails(specs, "moe.experts: max |Δ|")


def test_value_rotation_not_undone_fails(specs, monkeypatch):
    real = compressed_attention.rotate_tail
    monkeypatch.setattr(compressed_attention, "rotate_tail",
                        lambda x, theta: x if bool((theta <= 0).all()) and bool((theta < 0).any()) else real(x, theta))
    fails(specs, "blocks.sliding_hash.attn: max |Δ|")


# ----------------------------------------------------------------------------------------- stored layout

def test_stored_layout_is_predicted_from_the_config(specs):
    spec, _ = specs
    stored = predicted_index(spec).tensors
    q = stored["model.layers.0.self_attn.q_b_proj.weight"]
    assert (q.dtype, q.shape) == ("F8_E4M3", (32768, 1024))
    scale = stored["model.layers.0.self_attn.q_b_proj.weight_scale_inv"]
    assert (scale.dtype, scale.shape) == ("F8_E8M0", (256, 8))  # ue8m0: one power-of-two scale per 128 × 128
    # four-bit experts as transformers' FP8 integration holds them (expert_dtype "fp4"): int8, two values a byte,
    # and one E8M0 scale per 32 values of a row (issue 35: not gpt-oss's MXFP4 _blocks and _scales)
    gate_up = stored["model.layers.3.mlp.experts.gate_up_proj"]
    assert (gate_up.dtype, gate_up.shape) == ("I8", (256, 4096, 2048))
    scales = stored["model.layers.3.mlp.experts.gate_up_proj_scale_inv"]
    assert (scales.dtype, scales.shape) == ("F8_E8M0", (256, 4096, 128))
    for dense in ("model.layers.2.self_attn.compressor.kv_proj.weight",
                  "model.layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight", "model.embed_tokens.weight"):
        assert stored[dense].dtype == "BF16", dense
    assert stored["model.layers.0.attn_hc.fn"].dtype == "F32"
    rec = reconcile(spec, predicted_index(spec))
    assert sum(t.parameters for t in rec.totals) == TOTAL


SMALL = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 211, "hidden_size": 64,
         "moe_intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
         "q_lora_rank": 16, "qk_rope_head_dim": 8, "o_lora_rank": 8, "index_n_heads": 2, "index_head_dim": 16,
         "index_topk": 4, "sliding_window": 16, "torch_dtype": "bfloat16", "rope_theta": 10000,
         "compress_rope_theta": 160000}


@st.composite
def v4_configs(draw):
    """Configs DeepseekV4Config accepts, small enough to build and check in a test."""
    layers = draw(st.integers(1, 5))
    config = {**SMALL, "num_hidden_layers": layers,
              "compress_ratios": draw(st.lists(st.sampled_from([0, 4, 128]), min_size=layers, max_size=layers + 1)),
              "num_hash_layers": draw(st.integers(0, layers)), "hc_mult": draw(st.integers(1, 4)),
              "hc_sinkhorn_iters": draw(st.integers(1, 5)), "o_groups": draw(st.sampled_from([1, 2, 4])),
              "n_routed_experts": draw(st.integers(4, 8)), "num_experts_per_tok": draw(st.integers(1, 3)),
              "scoring_func": draw(st.sampled_from(["sqrtsoftplus", "sigmoid"]))}
    if draw(st.booleans()):
        config["rope_scaling"] = {"type": "yarn", "factor": 4, "original_max_position_embeddings": 256,
                                  "beta_fast": 32, "beta_slow": 1}
        config["max_position_embeddings"] = 1024
    if draw(st.booleans()):
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                         "scale_fmt": "ue8m0"}
        config["expert_dtype"] = "fp4"
    return config


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v4_configs())
def test_generated_configs_build_and_agree_with_transformers(config):
    spec = FAMILIES["deepseek_v4"].build_spec("generated", config, "generated")
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)
    check_equations(spec, tiny_spec(spec))


def test_layer_types_and_the_default_schedule_agree_with_transformers():
    """DeepseekV4Config's own keys (layer_types, mlp_layer_types) and, with neither, its default schedule."""
    family = FAMILIES["deepseek_v4"]
    named = {**SMALL, "num_hidden_layers": 4, "o_groups": 2, "n_routed_experts": 4, "num_experts_per_tok": 2,
             "layer_types": ["sliding_attention", "heavily_compressed_attention", "compressed_sparse_attention",
                             "sliding_attention"], "mlp_layer_types": ["moe", "hash_moe", "moe", "hash_moe"]}
    default = {k: v for k, v in named.items() if k not in ("layer_types", "mlp_layer_types")}
    for config in (named, default):
        spec = family.build_spec("v4-named", config, "test")
        model = build_reference_model(spec)
        kinds = [(t, m) for t, m in zip(model.config.layer_types, model.config.mlp_layer_types)]
        ours = [(compressed_attention.KIND_TYPES[a], "hash_moe" if h else "moe") for a, h in family.kinds(spec.config)]
        assert ours == kinds
        assert account(spec).total == sum(p.numel() for p in model.parameters())
        assert reconcile(spec, reference_index(spec).index, reference=True).balanced
    check_equations(family.build_spec("v4-named", named, "test"), tiny_spec(family.build_spec("v4-named", named, "t")))


def test_add_model_alone_adds_another_config(tmp_path):
    import json

    from explorer.commands.add_model import add_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SMALL, "num_hidden_layers": 3, "compress_ratios": [128, 4, 0], "num_hash_layers": 1,
                                "o_groups": 2, "n_routed_experts": 8, "num_experts_per_tok": 2}))
    toml = add_model(tmp_path / "content", "v4-small", path, "org/v4-small", "0123456789abcdef0123456789abcdef01234567")
    spec = load_model_spec(load_model_content(toml.parent))
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced


def test_other_configs_of_the_family_build_with_reference_totals():
    """Another size and other ratios: totals still equal the reference's."""
    spec = spec_of()
    raw = load_model_content(ROOT / "content/models" / SLUG).config
    variant = FAMILIES["deepseek_v4"].build_spec("v4-variant", {
        **raw, "num_hidden_layers": 5, "compress_ratios": [128, 4, 0, 128, 4], "num_hash_layers": 1, "hc_mult": 2,
        "hidden_size": 1024, "o_groups": 4, "n_routed_experts": 16}, "test")
    model = build_reference_model(variant)
    assert account(variant).total == sum(p.numel() for p in model.parameters())
    assert reconcile(variant, reference_index(variant).index, reference=True).balanced
    assert account(variant).total != account(spec).total


# ------------------------------------------------------------------------------------------ memory per token

def test_memory_per_token_of_each_stream(specs):
    """Per layer and token of context: the window's shared vector (head_dim), the ratio-4 stream (head_dim / 4) and
    its indexer keys (index_head_dim / 4), the ratio-128 stream (head_dim / 128)."""
    from explorer.figures.model_figures import CONTEXT, derive

    spec, _ = specs
    figures = derive(spec, account(spec), None)
    per_layer = {f.key.removeprefix("kv_cache_per_layer_"): f.value for f in figures.figures
                 if f.key.startswith("kv_cache_per_layer_")}
    # the two sliding-only layers hold the vector twice (keys and a value copy), as the reference's plain sliding cache
    assert per_layer == {"sliding_hash_window": 1024, "csa_hash_window": 512, "csa_hash_compressed": 128,
                         "csa_hash_indexer": 32, "hca_window": 512, "hca_compressed": 4, "csa_window": 512,
                         "csa_compressed": 128, "csa_indexer": 32}
    # the growth per added token: the compressed streams alone (every window stops at 128 positions)
    assert figures.get("kv_cache_per_token").value == 21 * (128 + 32) + 20 * 4
    # at 128K tokens: 2 sliding-only windows of 128 keys and values, 41 windows of 128 vectors, 21 × 32,768 entries
    # (+ indexer keys), 20 × 1,024 entries, and the ratio-4 streams' carried overlap (4 positions of values and gates
    # of 512 and of 128); 131,072 is a multiple of both ratios, so nothing is pending
    elements = (2 * 1024 * 128 + 41 * 512 * 128 + 21 * (512 + 128) * (CONTEXT // 4) + 20 * 512 * (CONTEXT // 128)
                + 21 * 2 * 4 * (512 + 128))
    assert figures.get("kv_cache_bytes_bf16").value == 2 * elements
    moe_layer = 256 * 3 * 4096 * 2048
    assert figures.get("active_parameters").value == TOTAL - 43 * (256 - 6) * moe_layer // 256
