"""The feed-forward, head and vision options classed in step_terms_ffn: for each, a step that drops or changes a
factor its program applies is reported by unshown_terms (tests/test_truth.py checks that no real step does)."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.model.components.step_term_checks import unshown_terms
from explorer.model.families import load_model_spec
from explorer.spec.types import walk


@cache
def _spec(slug: str):
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


def _component(slug: str, program: str):
    return next(c for _, c in walk(_spec(slug).root) if c.program == program)


def _with_step(comp, name: str, old: str, new: str):
    step = next(s for s in comp.steps if s.name == name)
    assert old in step.latex, f"{old!r} is not in step {name!r}: {step.latex!r}"  # the mutation changes something
    return dataclasses.replace(comp, steps=tuple(dataclasses.replace(s, latex=s.latex.replace(old, new))
                                                 if s.name == name else s for s in comp.steps))


GEMMA4, QWEN, KIMI = "gemma-4-26b-a4b", "qwen3.5-27b", "kimi-k2.5"
CASES = [
    # options class, model, program, step, LaTeX taken out, put in, what must be reported
    ("MLPOptions", "llama-3.1-8b", "gated_mlp", "silu", r"g\,\sigma(g)", r"\operatorname{GELU}(g)", "act = 'silu'"),
    ("MLPOptions", "gpt2", "plain_mlp", "gelu", r"_{\tanh}", "", "act = 'gelu_tanh'"),
    ("MLPOptions", "deepseek-v4-flash", "gated_mlp", "clamp", ",-10,10)", ",-7,7)", "limit = 10.0"),
    ("MLPOptions", "deepseek-v4-flash", "gated_mlp", "clamp", r",10),\quad", r"),\quad", "limit = 10.0"),
    ("MLPOptions", "deepseek-v4-flash", "gated_mlp", "glu", r"\sigma(", r"\tanh(", "act = 'silu'"),
    ("MoEOptions", "qwen3-30b-a3b", "moe", "expert-silu", r"\sigma(", r"\tanh(", "act = 'silu'"),
    ("MoEOptions", "deepseek-v3", "moe", "moe-out", r"+y^{\mathrm{shared}}", "", "shared = True"),
    ("HalvesExpertsOptions", GEMMA4, "halves_experts", "product", r"_{\tanh}", "", "act = 'gelu_tanh'"),
    ("InputGatedExpertsOptions", "llama-4-scout-17b-16e", "input_gated_experts", "product", r"\operatorname{SiLU}",
     r"\operatorname{GELU}", "act = 'silu'"),
    ("ScaledRouterOptions", GEMMA4, "scaled_router", "select", r"\operatorname{top}_{8}", r"\operatorname{top}_{2}",
     "k = 8"),
    ("ScaledRouterOptions", GEMMA4, "scaled_router", "router-norm", "+10^{-6}", "", "eps = 1e-06"),
    ("SigmoidTopKOptions", "llama-4-scout-17b-16e", "sigmoid_topk_router", "select", r"\operatorname{top}_{1}",
     r"\operatorname{top}_{2}", "k = 1"),
    ("LinearOptions", "gpt2", "linear", "c_attn", r"+b_{\mathrm{qkv}}", "", "bias = True"),
    ("LinearOptions", QWEN, "qwen_patch_embed", "patch_embed", r"+b_{\mathrm{patch}}", "", "bias = True"),
    ("HeadOptions", "gpt2", "head", "logits", r"E_{\mathrm{tok}}^{\top}", r"W_{\mathrm{vocab}}", "tied = True"),
    ("HeadOptions", "llama-3.1-8b", "head", "logits", r"W_{\mathrm{vocab}}", r"E_{\mathrm{tok}}^{\top}",
     "tied = False"),
    ("PatchOptions", "gemma-3-27b", "patch_embed", "patches", r"14\times14", r"16\times16", "patch = 14"),
    ("ProjectorOptions", "gemma-3-27b", "projector", "pool", r"\to16^2", r"\to8^2", "tokens_per_side = 16"),
    ("ProjectorOptions", "gemma-3-27b", "projector", "pool", r"4\times4", r"2\times2", "tokens_per_side = 16"),
    ("ProjectorOptions", "gemma-3-27b", "projector", "pool", r"64^2\to", r"32^2\to", "patches_per_side = 64"),
    ("VisionAttentionOptions", "gemma-3-27b", "vision_attention", "attend", r"\sqrt{72}", r"\sqrt{64}",
     "head_dim = 72"),
    ("VisionAttentionOptions", "gemma-3-27b", "vision_block", "attend", r"\dots,16", r"\dots,8", "heads = 16"),
    ("VisionOptions", QWEN, "qwen_positions", "positions", r"[48\,\operatorname{row}", r"[\operatorname{row}", "side = 48"),
    ("VisionOptions", QWEN, "qwen_vision_tower", "positions", r"[48\,\operatorname{row}", r"[\operatorname{row}",
     "side = 48"),
    ("VisionOptions", QWEN, "qwen_merger", "concat", r"\hat \psi_{4i}", r"\hat \psi_{i}", "merge = 2"),
    ("VisionOptions", QWEN, "qwen_vision_attention", "rotate", "10000^", "100^", "theta = 10000.0"),
    ("VisionOptions", QWEN, "qwen_vision_block", "rotate", "-4j/72", "-2j/72", "head_dim = 72"),
    ("VisionOptions", QWEN, "qwen_vision_attention", "attend", r"\sqrt{72}", r"\sqrt{d}", "head_dim = 72"),
    ("VisionOptions", QWEN, "qwen_vision_attention", "attend", r"\dots,16", r"\dots,H", "heads = 16"),
    ("MoonViTOptions", KIMI, "moonvit_patch_embed", "positions", r"\to96\times64", r"\to64\times64", "grid = "),
    ("MoonViTOptions", KIMI, "moonvit_tower", "merge", r"i<2,\,j<2", r"i<1,\,j<1", "grid = "),
    ("MoonViTOptions", KIMI, "moonvit_attention", "rotate", "10000^", "100^", "rope_theta = 10000.0"),
    ("MoonViTOptions", KIMI, "moonvit_attention", "rotate", "j<18", "j<36", "head_dim = 72"),
    ("MoonViTOptions", KIMI, "moonvit_block", "attend", r"\dots,16", r"\dots,8", "heads = 16"),
    ("Gemma4VisionOptions", GEMMA4, "gemma4_vision_embedder", "embedding_pre_projection_norm", "+10^{-6}", "",
     "eps = 1e-06"),
    ("Gemma4VisionOptions", GEMMA4, "gemma4_vision_block", "qkv-norm", "+10^{-6}", "", "eps = 1e-06"),
    ("Gemma4VisionOptions", GEMMA4, "gemma4_vision_block", "attend", r"h=1,\dots,16,", "", "heads = 16"),
    ("Gemma4VisionOptions", GEMMA4, "gemma4_vision_block", "rotate", "-4j/72", "-4j/64", "head_dim = 72"),
    ("Gemma4VisionOptions", GEMMA4, "gemma4_vision_block", "rotate", "100^", "10000^", "theta = 100.0"),
    ("Gemma4VisionOptions", GEMMA4, "gemma4_patch_embed", "positions", r"i\bmod 42", r"i\bmod 40", "grid_width = 42"),
    ("Gemma4VisionOptions", GEMMA4, "gemma4_vision_tower", "positions", r"i\bmod 42", r"i\bmod 40",
     "grid_width = 42"),
    ("Gemma4VisionOptions", GEMMA4, "gemma4_vision_tower", "pool", r"3\times3", r"2\times2", "pool = 3"),
    ("Gemma4VisionOptions", GEMMA4, "gemma4_vision_tower", "standardize", r"b_{\mathrm{std}}", "b",
     "standardize = True"),
]


@pytest.mark.parametrize("cls,slug,program,step,old,new,reported", CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_a_step_without_a_factor_its_program_applies_fails(cls, slug, program, step, old, new, reported):
    comp = _component(slug, program)
    assert type(comp.options).__name__ == cls
    assert unshown_terms(comp) == []
    problems = unshown_terms(_with_step(comp, step, old, new))
    # a linear's one step is named by its key, so its bias may be shown by "no step" (any of the component's)
    assert len(problems) == 1 and problems[0].startswith((f"step '{step}'", "no step")), problems
    assert reported in problems[0], problems


def test_every_options_class_classed_here_has_a_mutation_case():
    """Relu2Options only has a size (its width), which the shapes show: nothing for a step to drop."""
    classed = {"HalvesExpertsOptions", "InputGatedExpertsOptions", "LinearOptions", "MLPOptions", "MoEOptions",
               "ScaledRouterOptions", "SigmoidTopKOptions", "HeadOptions", "Gemma4VisionOptions", "MoonViTOptions",
               "PatchOptions", "ProjectorOptions", "VisionAttentionOptions", "VisionOptions"}
    assert {c[0] for c in CASES} == classed


def test_relu2_width_is_structural_and_its_step_stays_checked_by_the_rest():
    from explorer.model.components.relu2_experts import Relu2Options
    from explorer.model.components.step_term_checks import TERMS

    fn, structural = TERMS[Relu2Options]
    assert structural == {"width"} and fn(Relu2Options(8)) == ()
    assert unshown_terms(_component("nemotron-3-nano-30b-a3b", "relu2_mlp")) == []


def test_a_shared_options_class_asks_each_program_for_its_own_factors():
    """Gemma 4's vision options reach the tower, its blocks, its patch embedding and the embedder: the block shows
    no pooling (its program does not pool), but the same options under the tower's program must show the pool step."""
    block = _component(GEMMA4, "gemma4_vision_block")
    assert unshown_terms(block) == []
    as_tower = unshown_terms(dataclasses.replace(block, program="gemma4_vision_tower"))
    assert any("shows pool = 3" in p for p in as_tower) and any("shows grid_width = 42" in p for p in as_tower)
    embedder = _component(GEMMA4, "gemma4_vision_embedder")
    assert unshown_terms(embedder) == []
    assert any("heads = 0" in p for p in unshown_terms(dataclasses.replace(embedder, program="gemma4_vision_block")))

