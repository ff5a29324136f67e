"""MiniMax-M3's text model (issue 33): totals equal transformers 5.23.0's MiniMaxM3VLForCausalLM on the meta device;
the dense prefix and the sparse layers are where the published lists put them; MiniMax sparse attention and its block
indexer match the reference at the traced length and over 40 positions (20 blocks of 2 keys, 2 kept), and a wrong
block selection, an unforced local block, an ignored selection, a mean in place of the max pool and a dropped routed
scaling each fail; each sparse layer caches its indexer key beside K and V."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
import torch
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import check_equations, first_layer, module_prefix, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index, reference_state, tiny_reference_model
from explorer.model.account import account
from explorer.model.components import PROGRAMS, Run
from explorer.model.components import block_sparse_attention as msa
from explorer.model.components import mlp as mlp_module
from explorer.model.components import moe as moe_module
from explorer.model.components.attention import call_with_rotary
from explorer.model.components.blocks import angles_for, block_layers, causal_mask
from explorer.model.families import load_model_spec
from explorer.spec.results import within_tolerance
from explorer.spec.types import ModelSpec

SLUG = "minimax-m3"
PARAMETERS, BUFFERS = 426_174_565_632, 57 * 128
"""transformers 5.23.0's MiniMaxM3VLForCausalLM on meta: its parameters, and the 57 routers' correction biases."""


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / SLUG))


@pytest.fixture(scope="module")
def tiny(spec):
    t = tiny_spec(spec)
    model = tiny_reference_model(t)
    return t, model, reference_state(t, model)


# ------------------------------------------------------------------------------------------------- totals

def test_total_equals_transformers_on_meta(spec):
    model = build_reference_model(spec)
    names = {n for n, _ in model.named_parameters()}
    buffers = {n: t.numel() for n, t in model.state_dict().items() if n not in names}
    assert sum(p.numel() for p in model.parameters()) == account(spec).total == PARAMETERS
    assert sum(buffers.values()) == BUFFERS and all(n.endswith("mlp.gate.e_score_correction_bias") for n in buffers)
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_dense_prefix_and_sparse_layers_follow_the_published_lists(spec):
    blocks = {b.key: block_layers(b) for b in spec.root.child("blocks").children}
    assert blocks == {"full_dense": (0, 1, 2), "sparse_moe": tuple(range(3, 60))}
    acc = account(spec).accounts
    # index_q_proj 6144 × 4·128, index_k_proj 6144 × 128, two per-head norms of 128
    assert acc["blocks.sparse_moe.attn.indexer"].per_instance == 6144 * 512 + 6144 * 128 + 2 * 128
    assert acc["blocks.sparse_moe.attn.indexer"].instances * acc["blocks.sparse_moe.attn.indexer"].per_instance \
        == 224_147_712
    assert acc["blocks.sparse_moe.moe.shared"].per_instance == 3 * 6144 * 3072
    assert acc["blocks.full_dense.mlp"].per_instance == 3 * 6144 * 12288


def test_checkpoint_names_follow_the_conversion_mapping(spec):
    names = set(reference_index(spec).index.tensors)
    p = "model.layers.3."
    for name in ("self_attn.index_q_proj.weight", "self_attn.index_k_norm.weight", "block_sparse_moe.gate.weight",
                 "block_sparse_moe.e_score_correction_bias", "block_sparse_moe.shared_experts.up_proj.weight"):
        assert p + name in names
    assert "model.layers.0.mlp.gate_proj.weight" in names and "model.layers.0.mlp.gate_up_proj.weight" not in names


QUANTIZED_LAYERS = {r"block_sparse_moe\.experts\.\d+\.w[123]": 21_888, r"self_attn\.[qkvo]_proj": 240,
                    r"self_attn\.index_[qk]_proj": 114, r"block_sparse_moe\.shared_experts\.(gate|up|down)_proj": 171,
                    r"mlp\.(gate|up|down)_proj": 9}
"""The 22,422 Linear modules nvidia/MiniMax-M3-NVFP4's hf_quant_config.json lists as quantized_layers (under
language_model.model.layers.N.), counted by kind from the published file: every Linear but the embedding, the LM
head and the routers' gates, which its exclude_modules name."""


def test_the_predicted_names_are_the_linear_modules_the_published_nvfp4_export_names(spec):
    import re

    modules = {n.removesuffix(".weight") for n in reference_index(spec).index.tensors
               if n.endswith(".weight") and n.startswith("model.layers.") and not n.endswith("norm.weight")
               and not n.endswith("block_sparse_moe.gate.weight")}
    counts = {kind: sum(1 for m in modules if re.fullmatch(rf"model\.layers\.\d+\.{kind}", m))
              for kind in QUANTIZED_LAYERS}
    assert counts == QUANTIZED_LAYERS and sum(counts.values()) == len(modules) == 22_422


def test_a_wrong_indexer_width_does_not_balance(spec):
    bad = replace(spec, values={**spec.values, "index_head_dim": 64})
    rec = reconcile(bad, reference_index(spec).index, reference=True)
    assert not rec.balanced and any("index_k_proj.weight" in m.name for m in rec.shape_mismatch)


# ------------------------------------------------------------------------------------------ executed checks

def test_tiny_config_selects_blocks_and_the_checks_pass(tiny, spec):
    t = tiny[0]
    assert t.config.sparse_attention_config.sparse_block_size == 2  # 3 blocks at the traced 5 positions, 2 kept
    checks = check_equations(spec, t)
    for path in ("blocks.sparse_moe.attn", "blocks.sparse_moe.attn.indexer", "blocks.full_dense.attn",
                 "blocks.sparse_moe.moe", "blocks.full_dense.mlp", ""):
        check = checks[path]
        assert check.status == "checked" and check.max_abs_error <= check.tolerance, path
    assert "same blocks of 2 keys" in checks["blocks.sparse_moe.attn.indexer"].detail


def long_run(tiny, T: int = 40, seed: int = 4):
    """Our sparse attention and the reference layer on one random sequence of T positions (T / 2 blocks, 2 kept):
    our output, the reference's, our selection and the reference indexer's kept blocks."""
    t, model, weights = tiny
    comp = t.root.child("blocks").child("sparse_moe").child("attn")
    prefix = module_prefix(comp, first_layer(comp))
    x = torch.randn(2, T, t.values["hidden_size"], generator=torch.Generator().manual_seed(seed))
    angles, M = angles_for(comp, torch.arange(T)), causal_mask(T, torch.device("cpu"))
    run = Run(weights, module=prefix)
    with torch.no_grad():
        (ours,) = PROGRAMS[comp.program](comp, run, x, angles, M)
        _, theirs, _ = call_with_rotary(comp, model.get_submodule(prefix.rstrip(".")), model, [x, angles, M], run, ours)
        indexer = model.get_submodule(prefix + "indexer")
        cos_sin = model.model.rotary_emb(x, torch.arange(T)[None].expand(2, T))
        their_idx = indexer(x, cos_sin, None, torch.arange(T)[None].expand(2, T))
    return ours, theirs, run.recorded["idx-select"], their_idx


def kept(sel: torch.Tensor) -> torch.Tensor:
    return (sel == 0).float()


def their_kept(idx: torch.Tensor, blocks: int) -> torch.Tensor:
    safe = idx.long().masked_fill(idx < 0, blocks)
    return torch.zeros(*idx.shape[:-1], blocks + 1).scatter(-1, safe, 1.0)[..., :blocks]


def test_sparse_attention_matches_the_reference_over_many_blocks(tiny):
    ours, theirs, sel, their_idx = long_run(tiny)
    assert within_tolerance(float((ours - theirs).abs().max()))
    assert torch.equal(kept(sel), their_kept(their_idx, sel.shape[-1]))
    assert sel.shape[-1] == 20 and int(kept(sel)[..., -1, :].sum(-1).max()) == 2  # the last query keeps 2 of 20
    own = torch.arange(40) // 2
    assert bool(kept(sel)[:, :, torch.arange(40), own].all())  # every query keeps its own block


def long_fails(tiny) -> None:
    ours, theirs, sel, their_idx = long_run(tiny)
    assert not torch.equal(kept(sel), their_kept(their_idx, sel.shape[-1]))
    assert not within_tolerance(float((ours - theirs).abs().max()))


def build_check_fails(spec, tiny, where: str) -> None:
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny[0])
    assert where in str(info.value), str(info.value)


def test_a_wrong_block_selection_fails(tiny, spec, monkeypatch):
    """Keeping the lowest-scoring earlier blocks in place of the highest (the local block still forced)."""
    real = msa.select_blocks
    monkeypatch.setattr(msa, "select_blocks", lambda P, k: real(torch.where(P.isfinite(), -P, P), k))
    long_fails(tiny)
    build_check_fails(spec, tiny, "attn.indexer: step 'idx-select' selects different key blocks")


def test_the_local_block_not_forced_fails(tiny, monkeypatch):
    monkeypatch.setattr(msa, "force_local_blocks", lambda P, o: P)
    long_fails(tiny)


def test_a_mean_in_place_of_the_max_pool_fails(tiny, monkeypatch):
    real = msa.pool_blocks

    def mean_pool(I: torch.Tensor, block: int) -> torch.Tensor:
        n = -(-I.shape[-1] // block)
        padded = torch.nn.functional.pad(I.nan_to_num(neginf=0.0), (0, n * block - I.shape[-1]))
        mean = padded.view(*I.shape[:-1], n, block).mean(-1)
        return mean.masked_fill(real(I, block) == float("-inf"), float("-inf"))  # future blocks stay out

    monkeypatch.setattr(msa, "pool_blocks", mean_pool)
    long_fails(tiny)


def test_ignoring_the_selection_fails(tiny, spec, monkeypatch):
    """Attending to every earlier key (the selection all zeros) is full attention: the layer's output differs."""
    real = msa.select_blocks
    monkeypatch.setattr(msa, "select_blocks", lambda P, k: torch.zeros_like(real(P, k)))
    ours, theirs, _, _ = long_run(tiny)
    assert not within_tolerance(float((ours - theirs).abs().max()))
    build_check_fails(spec, tiny, "attn.indexer: step 'idx-select' selects different key blocks")


def test_dropping_the_routed_scaling_fails(tiny, spec, monkeypatch):
    real = moe_module.run_moe

    def unscaled(comp, run, x):
        return real(replace(comp, options=replace(comp.options, routed_scaling=1.0)), run, x)

    monkeypatch.setitem(PROGRAMS, "moe", unscaled)
    build_check_fails(spec, tiny, "blocks.sparse_moe.moe: max |Δ|")


@pytest.mark.parametrize("wrong", ["no up shift", "no sigmoid gain"])
def test_plain_clamped_swiglu_in_place_of_swiglu_oai_fails(tiny, spec, monkeypatch, wrong):
    """The dense MLP and the shared expert without SwiGLU-OAI's +1 on the up value, or without its 1.702 gain (the
    tiny config's limit, 0.3, makes the clamps bite too)."""
    real = mlp_module.clamped_glu

    def plain(g, u, limit, alpha=1.0, shift=0.0, rec=None):
        return real(g, u, limit, alpha if wrong == "no up shift" else 1.0, 0.0 if wrong == "no up shift" else shift,
                    rec)

    monkeypatch.setattr(mlp_module, "clamped_glu", plain)
    build_check_fails(spec, tiny, "blocks.full_dense.mlp: max |Δ|")


# ------------------------------------------------------------------------------------------- memory per token

def test_each_sparse_layer_caches_its_indexer_key_beside_k_and_v(spec):
    from explorer.figures.model_figures import derive

    figures = derive(spec, account(spec), None)
    sparse, full = figures.get("kv_cache_per_layer_sparse_moe"), figures.get("kv_cache_per_layer_full_dense")
    assert (sparse.value, full.value) == (2 * 4 * 128 + 128, 2 * 4 * 128)
    assert sparse.formula == "2 × num_key_value_heads × head_dim + index_head_dim"
    assert figures.get("kv_cache_per_token").value == 3 * 1024 + 57 * 1152
    assert "at most 2,048 of them read by attention" in figures.get("flops_decode").formula


# ------------------------------------------------------------------------------------------------ bad input

def refused(**changes) -> str:
    """The lines a mutated MiniMax-M3 config is refused with, each naming the file and a key."""
    content = load_model_content(ROOT / "content/models" / SLUG)
    with pytest.raises(ContentError) as raised:
        load_model_spec(dataclasses.replace(content, config={**content.config, **changes}))
    lines = raised.value.problems
    assert lines and all(f"{content.folder / 'model.toml'}: table 'config': key" in line for line in lines)
    return "\n".join(lines)


def sparse(**changes) -> dict:
    content = load_model_content(ROOT / "content/models" / SLUG)
    return {"sparse_attention_config": {**content.config["sparse_attention_config"], **changes}}


@pytest.mark.parametrize("changes, says", [
    (sparse(sparse_block_size=0), "key 'sparse_attention_config.sparse_block_size': must be an integer in 1..1,000,000, got 0"),
    (sparse(sparse_block_size=10**9), "key 'sparse_attention_config.sparse_block_size': must be an integer in 1..1,000,000"),
    (sparse(sparse_topk_blocks=-1), "key 'sparse_attention_config.sparse_topk_blocks': must be an integer in 1.."),
    (sparse(sparse_num_index_heads=3), "key 'index_n_heads': must divide num_attention_heads (64)"),
    (sparse(sparse_index_dim=32), "key 'index_head_dim': must be >= the rotary width (64)"),
    (sparse(sparse_local_block=17), "key 'index_local_blocks': must be in 0..index_topk_blocks"),
    (sparse(sparse_attention_freq=[1] * 59), "key 'layer_types': must give 60 entries"),
    (sparse(sparse_init_block=1), "key 'sparse_attention_config.sparse_init_block': transformers keeps no leading"),
    (sparse(sparse_score_type="mean"), "key 'sparse_attention_config.sparse_score_type'"),
    ({"moe_layer_freq": [1] * 61}, "key 'mlp_layer_types': must give 60 entries"),
    ({"qk_norm_type": "per_layer"}, "key 'qk_norm_type': transformers always builds QK-norm per head"),
    ({"rotary_dim": 32}, "key 'rotary_dim': the reference rotates int(head_dim × partial_rotary_factor) = 64"),
    ({"dense_intermediate_size": -1}, "key 'dense_intermediate_size': must be an integer in 1.."),
])
def test_a_config_the_family_cannot_describe_is_refused_in_one_line_naming_the_key(changes, says):
    assert says in refused(**changes)
