"""The token mixers' step terms (explorer/model/components/step_terms_mixers.py): each factor a mixer's program applies
is named by its steps, so a step that drops or changes one fails. test_truth checks every model's components pass;
these change one step (or one child) of a real component and expect the factor reported."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.model.components.step_term_checks import unshown_terms
from explorer.model.components.step_terms_mixers import nested_mismatches
from explorer.model.families import load_model_spec
from explorer.spec.types import walk


def comp_of(slug: str, path: str):
    """The component at dotted path `path` (as path_key writes it) of model `slug`."""
    spec = load_model_spec(load_model_content(ROOT / "content/models" / slug))
    return next(c for anc, c in walk(spec.root) if ".".join(a.key for a in anc[1:] + (c,)) == path)


def latex(comp, step: str) -> str:
    return next(s.latex for s in comp.steps if s.name == step)


def with_step(comp, step: str, old: str, new: str):
    """comp with `old` replaced by `new` in step `step` (which must contain it)."""
    assert old in latex(comp, step), (step, old)
    return dataclasses.replace(comp, steps=tuple(dataclasses.replace(s, latex=s.latex.replace(old, new))
                                                 if s.name == step else s for s in comp.steps))


def reported(comp, field: str) -> bool:
    """Whether unshown_terms names `field` (and nothing is reported for the component as built)."""
    return any(f"shows {field} = " in p for p in unshown_terms(comp))


def test_nothing_is_reported_for_the_components_as_built():
    for slug, path in (("qwen3-8b", "blocks.block.attn"), ("gpt2", "blocks.block.attn"),
                       ("qwen3.5-27b", "blocks.full.attn"), ("mimo-v2-flash", "blocks.sliding.attn"),
                       ("minimax-m2.5", "blocks.moe.attn"), ("llama-4-scout-17b-16e", "blocks.chunked.attn"),
                       ("llama-4-scout-17b-16e", "blocks.chunked.attn.scores"), ("kimi-k2", "blocks.dense.attn")):
        assert unshown_terms(comp_of(slug, path)) == [], (slug, path)


# ---------------------------------------------------------------------------------------------- attention

def test_attention_whose_qk_norm_step_names_another_norm_fails():
    attn = comp_of("qwen3-8b", "blocks.block.attn")
    assert reported(with_step(attn, "k_norm", r"\operatorname{RMSNorm}", r"\operatorname{LayerNorm}"), "qk_norm")
    gemma = comp_of("gemma-3-27b", "blocks.local.attn")
    assert unshown_terms(gemma) == []
    assert reported(with_step(gemma, "q_norm", r"\operatorname{RMSNorm}_{1+\gamma}", r"\operatorname{RMSNorm}"),
                    "qk_norm")


def test_gated_attention_that_splits_the_gate_elsewhere_fails():
    attn = comp_of("qwen3.5-27b", "blocks.full.attn")
    assert reported(with_step(attn, "heads", "256+1:512", "128+1:256"), "head_dim")
    assert reported(with_step(attn, "k_norm", r"_{1+\gamma}", ""), "qk_norm")


def test_fused_attention_that_splits_qkv_elsewhere_fails():
    attn = comp_of("gpt2", "blocks.block.attn")
    broken = with_step(attn, "split", "768:1536", "512:1024")
    assert reported(broken, "heads") and reported(broken, "head_dim")


def test_shaped_attention_without_its_value_scale_or_with_its_norm_moved_fails():
    attn = comp_of("mimo-v2-flash", "blocks.sliding.attn")
    assert reported(with_step(attn, "v-scale", r"0.707\,", ""), "value_scale")
    minimax = comp_of("minimax-m2.5", "blocks.moe.attn")
    # across_heads: the norm runs on the whole projection q, before the split into heads Q
    assert reported(with_step(minimax, "q_norm", r"{\color{stream-q}{q}})", r"{\color{stream-q}{Q}})"), "qk_norm")
    assert reported(with_step(minimax, "k_norm", r"\operatorname{RMSNorm}(", r"\operatorname{RMSNorm}_{1+\gamma}("),
                    "norm")


def test_layer_attention_without_its_chunk_window_scale_or_temperature_fails():
    chunked = comp_of("llama-4-scout-17b-16e", "blocks.chunked.attn")
    assert reported(with_step(chunked, "chunk", "8,192", "4,096"), "chunk")
    assert reported(with_step(chunked, "q-l2", "10^{-5}", "10^{-6}"), "eps")
    assert reported(with_step(chunked, "repeat", r"\lceil h/5\rceil", r"\lceil h/8\rceil"), "shape")
    scores = comp_of("llama-4-scout-17b-16e", "blocks.chunked.attn.scores")
    assert reported(with_step(scores, "scale", "0.088388", "0.125000"), "scale")
    nope = comp_of("llama-4-scout-17b-16e", "blocks.nope.attn")
    assert unshown_terms(nope) == []
    assert reported(with_step(nope, "temperature", r"0.1\,\ln", r"\ln"), "temperature")
    local = comp_of("gemma-4-26b-a4b", "blocks.local.attn")
    assert unshown_terms(local) == []
    assert reported(with_step(local, "window", "<1,024", "<512"), "window")
    assert reported(with_step(local, "v_norm", "10^{-6}", "10^{-5}"), "eps")
    glob = comp_of("gemma-4-26b-a4b", "blocks.global.attn")
    assert unshown_terms(glob) == []
    assert reported(with_step(glob, "values", r"{\color{stream-k}{K}}", r"{\color{stream-v}{v}}"), "keys_as_values")


def test_layer_scores_ask_only_for_what_their_program_applies():
    """The scores child carries its layer's options; its steps name no norm, rotation or temperature, and it is not
    asked to."""
    scores = comp_of("gemma-4-26b-a4b", "blocks.global.attn.scores")
    assert not any(s.name in ("q_norm", "q-rotate") for s in scores.steps)
    assert unshown_terms(scores) == []


# ---------------------------------------------------------------------------------------------- MLA

def test_mla_whose_latent_norm_or_query_latent_goes_unshown_fails():
    attn = comp_of("kimi-k2", "blocks.dense.attn")
    assert reported(with_step(attn, "kv-norm", r"\operatorname{RMSNorm}", r"\operatorname{LayerNorm}"), "norm")
    assert reported(with_step(attn, "q-down", "W_{DQ}", "W_{Q}"), "q_lora_rank")


# ---------------------------------------------------------------------------------------------- nested norms

def test_every_child_norm_shows_the_norm_its_layer_applies():
    from explorer.content.model_content import load_all_models

    problems = []
    for content in load_all_models(ROOT / "content"):
        spec = load_model_spec(content)
        problems += [f"{spec.slug} › {c.key}: {m}" for _, c in walk(spec.root) for m in nested_mismatches(c)]
    assert problems == []


@pytest.mark.parametrize("slug,path", [("kimi-k2", "blocks.dense.attn"), ("qwen3-8b", "blocks.block.attn"),
                                       ("qwen3.5-27b", "blocks.full.attn"), ("minimax-m2.5", "blocks.moe.attn"),
                                       ("deepseek-v4-flash", "blocks.csa.attn"),
                                       ("deepseek-v3.2", "blocks.dense.attn.indexer"),
                                       ("gemma-4-26b-a4b", "blocks.local.attn")])
def test_a_child_norm_that_shows_another_eps_than_the_program_applies_fails(slug, path):
    attn = comp_of(slug, path)
    assert nested_mismatches(attn) == []
    norm = next(c for c in attn.children if c.program == "norm")
    other = dataclasses.replace(norm, options=dataclasses.replace(norm.options, eps=norm.options.eps * 10))
    broken = dataclasses.replace(attn, children=tuple(other if c is norm else c for c in attn.children))
    assert [m for m in nested_mismatches(broken) if m.startswith(norm.key)]


def test_partial_rotary_whose_unrotated_features_go_unshown_fails():
    """Each layout of partial rotary names what it leaves unrotated: Gemma 4's zero-frequency pairs in θ_j, MiniMax-M2's
    unrotated tail of the head in the rotation."""
    proportional = comp_of("gemma-4-26b-a4b", "blocks.global.attn.rope")
    assert unshown_terms(proportional) == []
    assert reported(with_step(proportional, "theta", r"64\le j", r"0\le j"), "zero_frequency_pairs")
    leading = comp_of("minimax-m2.5", "blocks.moe.attn.rope")
    assert unshown_terms(leading) == []
    assert reported(with_step(leading, "rotate", r"64\le i<128", r"64\le i<96"), "unrotated_tail")


def test_shaped_attention_scores_other_than_its_layers_options_fail():
    """The shaped_attention part's program runs attention.py's scores with the scores child's own options, whose
    terms that child's steps answer for; they must be the ones its layer's options give."""
    attn = comp_of("mimo-v2-flash", "blocks.sliding.attn")
    assert nested_mismatches(attn) == []
    scores = attn.child("scores")
    for change in ({"sinks": False}, {"window": None}, {"scale": 1.0}, {"kv_heads": 1}):
        other = dataclasses.replace(scores, options=dataclasses.replace(scores.options, **change))
        broken = dataclasses.replace(attn, children=tuple(other if c is scores else c for c in attn.children))
        assert [m for m in nested_mismatches(broken) if m.startswith("scores show")], change


# ---------------------------------------------------------------------------------------------- DeepSeek V4

V4 = "deepseek-v4-flash"


def test_v4_attention_without_its_frequencies_eps_window_or_groups_fails():
    attn = comp_of(V4, "blocks.csa.attn")
    assert unshown_terms(attn) == []
    assert r"\omega_j=\phi_j\,\frac{\theta_j}{16}" in latex(attn, "inv-freq")  # the layer's own YaRN frequencies
    assert reported(with_step(attn, "theta", "160000", "10000"), "rope")
    assert reported(with_step(attn, "inv-freq", "{16}", "{40}"), "rope")
    assert reported(with_step(attn, "ramp", "j_{\\mathrm{high}}=25", "j_{\\mathrm{high}}=32"), "rope")
    assert reported(with_step(attn, "q-head-norm", r",\ \ \epsilon=10^{-6}", ""), "eps")
    assert reported(with_step(attn, "mask", "<128", "<4096"), "window")
    assert reported(with_step(attn, "softmax", r"/\sqrt{512}", ""), "head_dim")
    assert reported(with_step(attn, "o-a", r"\dots,8", r"\dots,16"), "o_groups")


def test_v4_children_that_carry_the_layers_options_answer_for_what_they_apply():
    scores = comp_of(V4, "blocks.csa.attn.scores")
    assert unshown_terms(scores) == []
    assert reported(with_step(scores, "mask", "<128", "<64"), "window")
    grouped = comp_of(V4, "blocks.csa.attn.o_a_proj")
    assert unshown_terms(grouped) == []
    assert reported(with_step(grouped, "o-a", r"\dots,8", r"\dots,4"), "o_groups")


def test_compressor_without_its_ratio_overlap_or_eps_fails():
    csa = comp_of(V4, "blocks.csa.attn.compressor")
    assert unshown_terms(csa) == []
    assert reported(with_step(csa, "c-visible", r"/4\rfloor", r"/8\rfloor"), "ratio")
    assert reported(with_step(csa, "c-pool", r"\sum_{j=1}^{8}", r"\sum_{j=1}^{4}"), "overlap")
    assert reported(with_step(csa, "c-entries", "10^{-6}", "10^{-5}"), "eps")
    pool = comp_of(V4, "blocks.hca.attn.compressor.pool")
    assert unshown_terms(pool) == []
    assert reported(with_step(pool, "c-pool", r"\text{ratio }128", r"\text{ratio }64"), "ratio")
    assert reported(with_step(pool, "c-pool", r"j\in\text{window }w", r"j=1,\dots,256"), "overlap")


def test_v4_indexer_without_its_top_k_head_weights_or_key_pooling_fails():
    idx = comp_of(V4, "blocks.csa.attn.compressor.indexer")
    assert unshown_terms(idx) == []
    assert reported(with_step(idx, "iselect", r"\operatorname{top}_{512}", r"\operatorname{top}_{1024}"), "topk")
    assert reported(with_step(idx, "iw", r"/\sqrt{64}", ""), "heads")
    assert reported(with_step(idx, "iscores", r"/\sqrt{128}", ""), "head_dim")
    assert reported(with_step(idx, "i-entries", "_{4w}", "_{w}"), "compressor")


def test_dsa_indexer_that_hides_its_own_pairing_or_top_k_fails():
    idx = comp_of("deepseek-v3.2", "blocks.dense.attn.indexer")
    assert unshown_terms(idx) == []
    assert r"(j,\,j+32)" in latex(idx, "idx-q-rotate")  # V3.2's indexer pairs the halves
    assert reported(with_step(idx, "idx-k-rotate", r"(j,\,j+32)", r"(2j,\,2j+1)"), "rope")
    assert reported(with_step(idx, "idx-select", r"\operatorname{top}_{2048}", r"\operatorname{top}_{1024}"), "topk")
    assert reported(with_step(idx, "idx-weights", r"/\sqrt{64}", ""), "heads")
    glm = comp_of("glm-5", "blocks.dense.attn.indexer")
    assert r"(2j,\,2j+1)" in latex(glm, "idx-q-rotate")  # GLM-5's pairs adjacent features


def test_a_compressor_rotating_otherwise_than_its_layer_shows_fails():
    attn = comp_of(V4, "blocks.csa.attn")
    assert nested_mismatches(attn) == []
    comp = next(c for c in attn.children if c.key == "compressor")
    other = dataclasses.replace(comp, options=dataclasses.replace(comp.options, rope=dataclasses.replace(
        comp.options.rope, theta=10000.0)))
    broken = dataclasses.replace(attn, children=tuple(other if c is comp else c for c in attn.children))
    assert any("compressor rotates" in m for m in nested_mismatches(broken))


# ---------------------------------------------------------------------------------------------- hyper-connections

def test_hyper_connection_without_its_sinkhorn_rounds_or_eps_fails():
    hc = comp_of(V4, "blocks.csa.attn_hc")
    assert unshown_terms(hc) == []
    assert reported(with_step(hc, "hc-sinkhorn", r"\text{then 19}", r"\text{then 20}"), "sinkhorn_iters")
    assert reported(with_step(hc, "hc-comb", "+10^{-6}", ""), "eps")
    assert reported(with_step(hc, "hc-norm", "10^{-6}", "10^{-5}"), "norm_eps")
    head = comp_of(V4, "hc_head")
    assert unshown_terms(head) == []
    assert reported(with_step(head, "hc-collapse", r"\sum_{i=1}^{4}", r"\sum_{i=1}^{2}"), "streams")


def test_hc_block_reads_none_of_the_options_it_carries():
    block = comp_of(V4, "blocks.csa")
    assert block.program == "hc_block"
    assert unshown_terms(block) == []


# ---------------------------------------------------------------------------------------------- blocks

def test_block_whose_residual_hides_or_invents_a_post_norm_fails():
    gemma = comp_of("gemma-3-27b", "blocks.local")
    assert unshown_terms(gemma) == []
    assert reported(with_step(gemma, "residual-attn", r"\bar\Delta", r"\Delta"), "post_attn_norm")
    llama = comp_of("llama-3.1-8b", "blocks.block")
    assert unshown_terms(llama) == []
    assert reported(with_step(llama, "residual-ffn", r"\Delta", r"\bar\Delta"), "post_ffn_norm")


def test_layer_block_without_its_layer_scalar_fails():
    block = comp_of("gemma-4-26b-a4b", "blocks.local")
    assert unshown_terms(block) == []
    assert reported(with_step(block, "layer-scalar", r"s_{\mathrm{layer}}\,", ""), "layer_scalar")
    assert reported(with_step(block, "residual-ffn", r"\bar\Delta", r"\Delta"), "post_ffn_norm")


# ---------------------------------------------------------------------------------------------- Gated DeltaNet

def test_deltanet_without_its_query_scale_chunk_split_or_eps_fails():
    attn = comp_of("qwen3.5-27b", "blocks.linear.attn")
    assert unshown_terms(attn) == []
    assert reported(with_step(attn, "l2norm", r"\sqrt{128}\,", ""), "d_k")
    assert reported(with_step(attn, "chunk-writes", "chunk of }64", "chunk of }32"), "chunk")
    assert reported(with_step(attn, "split", "2048+2048+6144", "2048+2048+4096"), "v_heads")
    assert reported(with_step(attn, "repeat", r"\lceil h/3\rceil", r"\lceil h/2\rceil"), "v_heads")
    norm = comp_of("qwen3.5-27b", "blocks.linear.attn.norm")
    assert unshown_terms(norm) == []
    assert reported(with_step(norm, "gated-norm", "10^{-6}", "10^{-5}"), "eps")


# ---------------------------------------------------------------------------------------------- Mamba-2

NEMOTRON = "nemotron-3-nano-30b-a3b"


def test_mamba2_without_its_step_floor_chunk_groups_or_conv_bias_fails():
    mixer = comp_of(NEMOTRON, "blocks.mamba.mamba")
    assert unshown_terms(mixer) == []
    assert reported(with_step(mixer, "dt", r"0.001\big)", r"0\big)"), "dt_min")
    assert reported(with_step(mixer, "chunks", "chunks of 128", "chunks of 256"), "chunk_size")
    assert reported(with_step(mixer, "heads", r"\lfloor h/8\rfloor", r"\lfloor h/4\rfloor"), "groups")
    assert reported(with_step(mixer, "split", "4096,6144,64", "4096,8192,64"), "state_size")
    ssm = comp_of(NEMOTRON, "blocks.mamba.mamba.ssm")
    assert unshown_terms(ssm) == []
    assert reported(with_step(ssm, "dt", r"0.001\big)", r"0\big)"), "dt_min")
    conv = comp_of(NEMOTRON, "blocks.mamba.mamba.conv1d")
    assert unshown_terms(conv) == []
    assert reported(with_step(conv, "conv", r"+b_{\mathrm{conv}}", ""), "conv_bias")
    norm = comp_of(NEMOTRON, "blocks.mamba.mamba.norm")
    assert unshown_terms(norm) == []
    assert reported(with_step(norm, "gate-norm", r"_{8\times512}", r"_{1\times4096}"), "groups")
    assert reported(with_step(norm, "gate-norm", "10^{-5}", "10^{-6}"), "eps")
