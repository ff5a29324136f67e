"""The token mixers' step terms (explorer/components/step_terms_mixers.py): each factor a mixer's program applies
is named by its steps, so a step that drops or changes one fails. test_truth checks every model's components pass;
these change one step (or one child) of a real component and expect the factor reported."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT

from explorer.components.step_terms import unshown_terms
from explorer.components.step_terms_mixers import nested_norm_mismatches
from explorer.content import load_model_content
from explorer.families import load_model_spec
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
    from explorer.content import load_all_models

    problems = []
    for content in load_all_models(ROOT / "content"):
        spec = load_model_spec(content)
        problems += [f"{spec.slug} › {c.key}: {m}" for _, c in walk(spec.root) for m in nested_norm_mismatches(c)]
    assert problems == []


@pytest.mark.parametrize("slug,path", [("kimi-k2", "blocks.dense.attn"), ("qwen3-8b", "blocks.block.attn"),
                                       ("qwen3.5-27b", "blocks.full.attn"), ("minimax-m2.5", "blocks.moe.attn")])
def test_a_child_norm_that_shows_another_eps_than_the_program_applies_fails(slug, path):
    attn = comp_of(slug, path)
    assert nested_norm_mismatches(attn) == []
    norm = next(c for c in attn.children if c.program == "norm")
    other = dataclasses.replace(norm, options=dataclasses.replace(norm.options, eps=norm.options.eps * 10))
    broken = dataclasses.replace(attn, children=tuple(other if c is norm else c for c in attn.children))
    assert [m for m in nested_norm_mismatches(broken) if m.startswith(norm.key)]
