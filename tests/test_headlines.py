"""Issue 36 item 5: the equations an attention page shows before "All N steps" are the steps that set that attention
apart (Gemma 4's keys as values, Llama 4's chunks and NoPE temperature, MiMo's sinks, MiniMax's all-head QK-norm),
never one opaque line such as Δ_attn = Attention(x_attn)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import ROOT

from explorer.content.model_content import load_all_models
from explorer.model.families import load_model_spec
from explorer.spec.types import Component, ModelSpec, Step, path_key, walk

# One line that names the whole component as an operator on its input: it says nothing a reader can compute.
OPAQUE = re.compile(r"^\\Delta_\{\\mathrm\{\w+\}\}=\\operatorname\{[A-Za-z]+\}(_\{[^{}]*\})?\(x_\{\\mathrm\{\w+\}\}[^=]*\)$")


@pytest.fixture(scope="module")
def specs() -> dict[str, ModelSpec]:
    return {m.slug: load_model_spec(m) for m in load_all_models(ROOT / "content")}


def attentions(spec: ModelSpec) -> list[tuple[str, Component]]:
    """Each attention of a model (a component whose own steps include the softmax over keys), by its path."""
    return [(path_key(a, c), c) for a, c in walk(spec.root)
            if c.children and any(s.name == "softmax" for s in c.steps) and c.key == "attn"]


def headline_problems(where: str, comp: Component) -> list[str]:
    """What is wrong with an attention's headline: a line no step computes, an opaque one, or no softmax."""
    own = {s.latex for s in comp.steps}
    out = [f"{where}: headline line {s.latex!r} is no step of the component" for s in comp.equations
           if s.latex not in own]
    out += [f"{where}: headline line {s.latex!r} only names the component" for s in comp.equations
            if OPAQUE.match(s.latex)]
    if not any(s.name == "softmax" for s in comp.equations):
        out.append(f"{where}: the headline shows no softmax")
    return out


def test_every_attention_headline_is_made_of_its_own_steps(specs):
    problems, seen = [], 0
    for slug, spec in sorted(specs.items()):
        for where, comp in attentions(spec):
            seen += 1
            problems += headline_problems(f"{slug} › {where}", comp)
    assert seen >= 70, seen
    assert problems == [], "\n".join(problems)


def test_an_opaque_headline_is_named(specs):
    where, comp = next(a for a in attentions(specs["llama-3.1-8b"]))
    opaque = Step(r"\Delta_{\mathrm{attn}}=\operatorname{Attention}(x_{\mathrm{attn}})", None, "attention")
    problems = headline_problems(where, dataclasses.replace(comp, equations=(opaque,)))
    assert any("only names the component" in p for p in problems)
    assert any("no softmax" in p for p in problems)


@pytest.mark.parametrize(("slug", "path", "names"), [
    ("gemma-4-26b-a4b", "blocks.global.attn", {"values", "v_norm", "softmax"}),
    ("llama-4-scout-17b-16e", "blocks.chunked.attn", {"chunk", "q-l2", "softmax"}),
    ("llama-4-scout-17b-16e", "blocks.nope.attn", {"temperature", "softmax"}),
    ("mimo-v2-flash", "blocks.sliding.attn", {"v-scale", "window", "softmax"}),
    ("minimax-m2.5", "blocks.moe.attn", {"q_norm", "k_norm", "softmax"}),
    ("llama-3.1-8b", "blocks.block.attn", {"repeat", "softmax", "o_proj"}),
    ("deepseek-v3", "blocks.moe.attn", {"kv-down", "k-concat", "softmax"}),
    ("deepseek-v3.2", "blocks.moe.attn", {"idx-select", "dsa-mask", "softmax"}),
])
def test_the_headline_shows_what_sets_the_attention_apart(specs, slug, path, names):
    comp = dict(attentions(specs[slug]))[path]
    assert names <= {s.name for s in comp.equations}
    if "window" in names:  # MiMo's sliding layers: the softmax shown is the one with the sink logits κ_h
        assert r"\kappa_h" in next(s.latex for s in comp.equations if s.name == "softmax")


def unbalanced_steps(spec: ModelSpec) -> list[str]:
    """Each step whose LaTeX opens and closes a different number of groups (a stray "}" shows on the page)."""
    out = []
    for ancestors, comp in walk(spec.root):
        for s in comp.steps + comp.equations:
            bare = s.latex.replace(r"\{", "").replace(r"\}", "")
            depth, low = 0, 0
            for ch in bare:
                depth += {"{": 1, "}": -1}.get(ch, 0)
                low = min(low, depth)
            if depth or low:
                out.append(f"{spec.slug} › {path_key(ancestors, comp)} › {s.name}")
    return out


def test_every_step_balances_its_braces(specs):
    """Issue 36: the hash router's selection step ended "(6 experts per token id}})" on 8 pages."""
    assert [p for spec in specs.values() for p in unbalanced_steps(spec)] == []


def test_a_stray_brace_is_named(specs):
    spec = specs["deepseek-v4-flash"]
    router = next(c for _, c in walk(spec.root) if c.program == "hash_router")
    bad = tuple(dataclasses.replace(s, latex=s.latex + "}") if s.name == "select" else s for s in router.steps)
    planted = dataclasses.replace(spec, root=dataclasses.replace(router, steps=bad, children=()))
    assert unbalanced_steps(spec) == []
    assert [p.rsplit(" › ", 1)[-1] for p in unbalanced_steps(planted)] == ["select"]


def test_partial_rotary_says_how_many_features_turn(specs):
    comp = dict(attentions(specs["minimax-m2.5"]))["blocks.moe.attn"]
    rotate = next(s for s in comp.steps if s.name == "q-rotate")
    assert r"\text{(64 of 128 features rotate)}" in rotate.latex and rotate in comp.equations
