"""OLMo 2 7B/13B (olmo2) and Phi-4 / Phi-4-mini (phi3), issue 33: totals equal transformers' on the meta device and
the labs' published sizes; the executed checks at tiny configs of the same structure pass (norms after each branch,
QK-norm across all heads, fused QKV and gate-up projections, partial rotary, a tied head), and each deliberately
wrong program fails: QK-norm per head, the norms moved before the branches, the rotation over every feature of a
head, the gate and up halves swapped, an untied head."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.figures.compare_facts import architecture_facts, changes
from explorer.figures.model_figures import derive
from explorer.model.account import account
from explorer.model.components import PROGRAMS, Run, fused_qkv_attention, layer_attention
from explorer.model.components.base import options, relative_module, run_child
from explorer.model.components.mlp import activation
from explorer.model.components.norms import NormOptions, apply_norm
from explorer.model.components.part_facts import facts
from explorer.model.components.rope import rotary_angles
from explorer.model.components.step_term_checks import unshown_terms
from explorer.model.families import FAMILIES, load_model_spec
from explorer.model.families.base import as_published
from explorer.spec.types import ModelSpec, walk
from explorer.views.flows import LAYOUTS

TOTALS = {"olmo-2-7b": 7_298_617_344, "olmo-2-13b": 13_716_198_400, "phi-4": 14_659_507_200,
          "phi-4-mini": 3_836_021_760}
"""transformers 5.23.0's parameter counts for the configs mapped from litgpt 0.5.13 (meta device)."""
PUBLISHED = {"olmo-2-7b": 7, "olmo-2-13b": 13, "phi-4": 14, "phi-4-mini": 3.8}
"""The labs' sizes in billions: 7B, 13B, 14B (the fraction dropped) and 3.8B."""


def spec_of(slug: str) -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def tiny() -> dict[str, tuple[ModelSpec, ModelSpec]]:
    return {slug: (spec_of(slug), tiny_spec(spec_of(slug))) for slug in ("olmo-2-7b", "phi-4", "phi-4-mini")}


def fails(spec: ModelSpec, tiny_: ModelSpec, where: str) -> None:
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny_)
    assert where in str(info.value), str(info.value)


# ------------------------------------------------------------------------------------------------- totals

@pytest.mark.parametrize("slug", list(TOTALS))
def test_totals_equal_transformers_on_meta_and_the_published_size(slug):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    total = account(spec).total
    assert total == sum(p.numel() for p in model.parameters()) == TOTALS[slug]
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced
    billions = PUBLISHED[slug]
    digits = 1 if billions != int(billions) else 0
    assert round(total / 1e9, digits) == billions or int(total / 1e9) == billions


def test_olmo2_norms_are_the_branch_outputs_and_qk_norm_spans_all_heads():
    spec = spec_of("olmo-2-7b")
    block = spec.root.child("blocks").child("block")
    assert [c.key for c in block.children] == ["attn", "post_attn_norm", "mlp", "post_ffn_norm"]
    names = {t.template for _, c in walk(block) for t in c.tensors}
    assert "model.layers.{layer}.input_layernorm.weight" not in names
    assert {"model.layers.{layer}.post_attention_layernorm.weight",
            "model.layers.{layer}.post_feedforward_layernorm.weight"} <= names
    assert account(spec).accounts["blocks.block.attn.q_norm"].per_instance == 32 * 128  # all heads' features
    steps = [s.name for s in block.steps]
    assert steps.index("post_attn_norm") < steps.index("residual-attn") < steps.index("post_ffn_norm")


def test_phi3_projections_are_fused_and_mini_rotates_96_of_128():
    spec, mini = spec_of("phi-4"), spec_of("phi-4-mini")
    ledger = account(spec).accounts
    assert ledger["blocks.block.attn.qkv_proj"].per_instance == 5120 * (5120 + 2 * 10 * 128)
    assert ledger["blocks.block.mlp.gate_up_proj"].per_instance == 5120 * 2 * 17920
    rope = mini.root.child("blocks").child("block").child("attn").child("rope").options
    assert (rope.dim, rope.head_width) == (96, 128)
    assert any(t.tied_to for t in mini.root.child("lm_head").tensors)
    assert not any(t.tied_to for t in spec.root.child("lm_head").tensors)


@pytest.mark.parametrize("slug", ["olmo-2-7b", "phi-4-mini"])
def test_new_parts_name_what_they_apply_and_have_layouts_and_caches(slug):
    spec = spec_of(slug)
    for _, c in walk(spec.root):
        assert unshown_terms(c) == [], (c.key, unshown_terms(c))
    programs = {c.program for _, c in walk(spec.root)}
    assert programs & {"post_norm_block", "fused_qkv_attention", "fused_gated_mlp"}
    assert all(facts(p).layout in LAYOUTS for p in programs & {"post_norm_block", "fused_qkv_attention", "fused_gated_mlp"})
    (kind,) = derive(spec, account(spec), None).attention
    kv = {"olmo-2-7b": 32, "phi-4-mini": 8}[slug]
    assert kind.cache_per_token == 2 * kv * 128


# ------------------------------------------------------------------------------------------ executed checks

@pytest.mark.parametrize("slug", ["olmo-2-7b", "phi-4", "phi-4-mini"])
def test_tiny_checks_pass(tiny, slug):
    checks = check_equations(*tiny[slug])
    keys = ("blocks.block", "blocks.block.attn", "blocks.block.mlp", "")
    assert all(checks[k].status == "checked" for k in keys), {k: checks[k].status for k in keys}


def test_tiny_configs_keep_the_mechanisms(tiny):
    rope = tiny["phi-4-mini"][1].root.child("blocks").child("block").child("attn").child("rope").options
    assert 0 < rope.dim < rope.head_width and rope.unrotated_tail
    attn = tiny["phi-4"][1].root.child("blocks").child("block").child("attn").options
    assert attn.shape.kv_heads < attn.shape.heads
    assert tiny["olmo-2-7b"][1].root.child("blocks").child("block").child("attn").options.qk_norm == "across_heads"


def test_olmo2_qk_norm_per_head_fails(tiny, monkeypatch):
    """Normalising each 16-feature head instead of the whole projection changes OLMo 2's attention."""
    real = layer_attention.apply_norm

    def per_head(run, name, x, opts, module):
        if x.dim() != 3:
            return real(run, name, x, opts, module)
        heads = x.view(*x.shape[:-1], -1, 16)
        y = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + opts.eps)
        return run.rec(name, y.reshape(x.shape) * run.w(module + "weight"))

    monkeypatch.setattr(layer_attention, "apply_norm", per_head)
    fails(*tiny["olmo-2-7b"], "blocks.block.attn: max |Δ|")


def test_olmo2_norms_before_the_branches_fail(tiny, monkeypatch):
    """The same two norms placed before attention and the MLP (Llama's pre-norm) instead of after them."""
    def pre_norm(comp, run, x, *rest):
        attn, attn_norm, ffn, ffn_norm = comp.children

        def norm(child, t):
            return apply_norm(run, child.key, t, options(child, NormOptions), relative_module(comp, child))

        x_mid = x + run_child(comp, attn.key, run, norm(attn_norm, x), *rest)
        return [run.rec("residual-ffn", x_mid + run_child(comp, ffn.key, run, norm(ffn_norm, x_mid)))]

    monkeypatch.setitem(PROGRAMS, "post_norm_block", pre_norm)
    fails(*tiny["olmo-2-7b"], "blocks.block: max |Δ|")


def _rotate_every_feature(monkeypatch):
    real = fused_qkv_attention.rotate

    def every_feature(x, angles, o):
        full = replace(o, dim=o.head_width, unrotated_tail=0)
        return real(x, rotary_angles(Run({}), full, torch.arange(x.shape[1])), full)

    monkeypatch.setattr(fused_qkv_attention, "rotate", every_feature)


def test_phi4_mini_rotary_over_every_feature_fails(tiny, monkeypatch):
    _rotate_every_feature(monkeypatch)
    fails(*tiny["phi-4-mini"], "blocks.block.attn: max |Δ|")


def test_rotary_over_every_feature_is_phi4s_own(tiny, monkeypatch):
    """The same mutation leaves Phi-4, whose whole head rotates, unchanged: it targets the partial slice."""
    _rotate_every_feature(monkeypatch)
    assert check_equations(*tiny["phi-4"])["blocks.block.attn"].status == "checked"


def test_phi3_gate_and_up_halves_swapped_fail(tiny, monkeypatch):
    def swapped(comp, run, x):
        gate_up, down = comp.children
        u, g = run_child(comp, gate_up.key, run, x).chunk(2, dim=-1)
        return [run.rec("swiglu", run_child(comp, down.key, run, activation(g, "silu") * u))]

    monkeypatch.setitem(PROGRAMS, "fused_gated_mlp", swapped)
    fails(*tiny["phi-4"], "blocks.block.mlp: max |Δ|")


def test_phi4_mini_untied_head_fails_the_total_and_the_tensor_check():
    spec = spec_of("phi-4-mini")
    config = {k: as_published(v) for k, v in _fields(spec.config).items()}
    untied = FAMILIES["phi3"].build_spec("phi-4-mini", {**config, "tie_word_embeddings": False}, "test")
    assert account(untied).total == TOTALS["phi-4-mini"] + 200064 * 3072
    assert not reconcile(untied, reference_index(spec).index, reference=True).balanced


def test_a_sliding_window_shorter_than_the_context_is_refused():
    config = {k: as_published(v) for k, v in _fields(spec_of("phi-4-mini").config).items()}
    with pytest.raises(ContentError) as info:
        FAMILIES["phi3"].build_spec("x", {**config, "sliding_window": 2048}, "model.toml")
    assert "key 'sliding_window'" in str(info.value.problems)


def _fields(config) -> dict:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}


# ------------------------------------------------------------------------------------------------- the site

@pytest.mark.parametrize("slug", list(TOTALS))
def test_api_and_page_carry_the_reference_total_and_the_derivation(built_site, slug):
    data = json.loads((built_site / f"api/{slug}.json").read_text())
    assert data["total_parameters"] == TOTALS[slug] and data["reference_check"]["balanced"] is True
    page = (built_site / f"models/{slug}/index.html").read_text()
    assert f"{TOTALS[slug]:,}" in page and "litgpt 0.5.13" in page and "litgpt/config.py" in page


def _facts(slug: str):
    spec = spec_of(slug)
    return architecture_facts(spec, account(spec), derive(spec, account(spec), None))


def test_compare_facts_name_the_norm_placement_and_the_qk_norm():
    """Llama 3.1 8B → OLMo 2 7B: the norms move to the branch ends and QK-norm across all heads is added; Phi-4
    changes neither (its difference from Llama is in the stored layout, not in what the facts list)."""
    said = [c.phrase for c in changes(_facts("llama-3.1-8b"), _facts("olmo-2-7b"))]
    assert "norm placement: pre-norm → after each branch" in said
    assert "adds QK-norm (across all heads, before the split into heads)" in said
    qwen = {f.key: f.value for f in _facts("qwen3-8b")}
    assert qwen["qk_norm"] == "per head" and qwen["norms"] == "before each branch (pre-norm)"
    assert not {c.key for c in changes(_facts("llama-3.1-8b"), _facts("phi-4"))} & {"qk_norm", "norms"}
