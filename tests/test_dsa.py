"""DeepSeek Sparse Attention (issue 20): DeepSeek-V3.2 and GLM-5. Totals equal transformers' counts on the meta device
(parameters once; the routers' correction biases as the persistent buffers the reference registers); the executed
checks at a tiny config whose indexer keeps fewer tokens than the sequence pass; a wrong top-k, a dropped ReLU, an
ignored selection and the wrong rotary pairing each fail them; V3.2's FP8 layout is predicted from its config."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import DEEPSEEK_TINY, ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.checkpoint.reconcile import predicted_index, reconcile
from explorer.commands.add_model import add_model
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import FREE_SIZES, check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.model.account import account
from explorer.model.components import PROGRAMS, dsa
from explorer.model.families import load_model_spec
from explorer.spec.types import ModelSpec

TOTALS = {"deepseek-v3.2": (671_877_929_216, 14_848), "glm-5": (743_911_199_232, 19_200)}
"""(parameters, persistent buffers) of transformers 5.23.0's model on meta, as the issue states them."""


def spec_of(slug: str) -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def tiny_checks() -> dict[str, tuple[ModelSpec, ModelSpec]]:
    return {slug: (spec_of(slug), tiny_spec(spec_of(slug))) for slug in TOTALS}


# ------------------------------------------------------------------------------------------------- totals

@pytest.mark.parametrize("slug", list(TOTALS))
def test_totals_equal_transformers_on_meta(slug):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    parameters = sum(p.numel() for p in model.parameters())
    names = {n for n, _ in model.named_parameters()}
    buffers = {n: t.numel() for n, t in model.state_dict().items() if n not in names}
    assert (parameters, sum(buffers.values())) == TOTALS[slug]
    assert all(n.endswith("mlp.gate.e_score_correction_bias") for n in buffers)
    ledger = account(spec)
    assert ledger.total - ledger.accounts["mtp"].per_instance == parameters  # MTP: stored, not built by transformers
    rec = reconcile(spec, reference_index(spec).index, reference=True, skip_owners=("mtp",))
    assert rec.balanced, rec.differences(5)
    assert rec.role_total("parameter")[1] == parameters and rec.role_total("buffer")[1] == sum(buffers.values())


def test_every_layer_has_an_indexer_of_the_configs_sizes():
    spec = spec_of("deepseek-v3.2")
    acc = account(spec).accounts
    idx = acc["blocks.moe.attn.indexer"]
    # wq_b: q_lora_rank × heads·d_idx; wk: hidden × d_idx; k_norm: weight and bias; weights_proj: hidden × heads
    assert idx.per_instance == 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert acc["blocks.dense.attn.indexer"].instances + idx.instances == 61
    glm = account(spec_of("glm-5")).accounts["blocks.moe.attn.indexer"]
    assert glm.per_instance == 2048 * 32 * 128 + 6144 * 128 + 2 * 128 + 6144 * 32 and glm.instances == 75


def test_a_wrong_indexer_width_does_not_balance():
    spec = spec_of("glm-5")
    bad = replace(spec, values={**spec.values, "index_head_dim": 64})
    rec = reconcile(bad, reference_index(spec).index, reference=True, skip_owners=("mtp",))
    assert not rec.balanced and any("indexer.wk.weight" in m.name for m in rec.shape_mismatch)


# ------------------------------------------------------------------------------------------ executed checks

@pytest.mark.parametrize("slug", list(TOTALS))
def test_tiny_config_selects_and_the_checks_pass(tiny_checks, slug):
    spec, tiny = tiny_checks[slug]
    c = tiny.config
    assert c.index_n_heads > 1 and c.index_topk < FREE_SIZES["T"]  # several heads; selection matters
    checks = check_equations(spec, tiny)
    for block in ("dense", "moe"):
        for part in ("attn", "attn.indexer"):
            check = checks[f"blocks.{block}.{part}"]
            assert check.status == "checked" and check.max_abs_error <= check.tolerance, (block, part)
    assert "same 2 of 5 keys" in checks["blocks.moe.attn.indexer"].detail


def fails(spec: ModelSpec, tiny: ModelSpec, where: str) -> None:
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny)
    assert where in str(info.value), str(info.value)


@pytest.mark.parametrize("slug", list(TOTALS))
def test_a_wrong_top_k_fails(tiny_checks, monkeypatch, slug):
    real = dsa.select
    monkeypatch.setattr(dsa, "select", lambda run, o, I: real(run, replace(o, topk=o.topk + 1), I))
    fails(*tiny_checks[slug], "blocks.moe.attn.indexer: step 'idx-select' selects different keys")


def test_dropping_the_relu_fails(tiny_checks, monkeypatch):
    monkeypatch.setattr(dsa, "relu", lambda x: x)
    fails(*tiny_checks["deepseek-v3.2"], "attn.indexer: step 'idx-select' selects different keys")


def test_ignoring_the_selection_fails(tiny_checks, monkeypatch):
    """Attending to every earlier token (the selection's mask all zeros) is dense MLA: the attention differs."""
    real = dsa.select
    monkeypatch.setattr(dsa, "select", lambda run, o, I: torch.zeros_like(real(run, o, I)))
    fails(*tiny_checks["deepseek-v3.2"], "blocks.moe.attn: max |Δ|")


@pytest.mark.parametrize(("slug", "wrong"), [("deepseek-v3.2", "interleaved"), ("glm-5", "half")])
def test_the_other_rotary_pairing_in_the_indexer_fails(tiny_checks, monkeypatch, slug, wrong):
    """DeepSeek-V3.2's indexer rotates the two halves, GLM-5's adjacent pairs: swapping them changes the selection."""
    real = dsa.run_indexer

    def swapped(comp, run, *inputs):
        o = comp.options
        return real(replace(comp, options=replace(o, rope=replace(o.rope, pairing=wrong))), run, *inputs)

    monkeypatch.setitem(PROGRAMS, "indexer", swapped)
    fails(*tiny_checks[slug], "attn.indexer: step 'idx-select' selects different keys")


# ------------------------------------------------------------------------------------------------ storage

def test_deepseek_v32_fp8_layout_is_predicted_from_the_config():
    spec = spec_of("deepseek-v3.2")
    stored = predicted_index(spec).tensors
    p = "model.layers.3.self_attn.indexer."
    assert (stored[p + "wq_b.weight"].dtype, stored[p + "wq_b.weight"].shape) == ("F8_E4M3", (8192, 1536))
    assert (stored[p + "wq_b.weight_scale_inv"].dtype, stored[p + "wq_b.weight_scale_inv"].shape) == ("F32", (64, 12))
    assert stored[p + "wk.weight_scale_inv"].shape == (1, 56)
    for dense in ("weights_proj.weight", "k_norm.weight", "k_norm.bias"):  # kept out of FP8
        assert stored[p + dense].dtype == "BF16" and p + dense + "_scale_inv" not in stored
    assert stored["model.layers.3.mlp.gate.e_score_correction_bias"].dtype == "F32"
    storage = spec.root.child("blocks").child("moe").child("attn").child("indexer").child("wq_b").tensors[0].storage
    assert storage.block == (128, 128) and "each scale a power of two (ue8m0)" in storage.stored_as
    rec = reconcile(spec, predicted_index(spec))
    assert rec.role_total("parameter")[1] == account(spec).total
    assert rec.role_total("buffer")[1] == 14_848 + 256  # the MTP layer's router has one too


def test_glm5_is_stored_in_bf16_without_scales():
    stored = predicted_index(spec_of("glm-5")).tensors
    assert not any(n.endswith("_scale_inv") for n in stored)
    assert stored["model.layers.3.self_attn.indexer.wq_b.weight"].dtype == "BF16"


# ------------------------------------------------------------------------------------------- memory per token

@pytest.mark.parametrize("slug", list(TOTALS))
def test_each_layer_caches_the_latent_the_rotary_key_and_the_indexer_key(slug):
    from explorer.figures.model_figures import derive

    spec = spec_of(slug)
    figures = derive(spec, account(spec), None)
    c = spec.config
    per_layer = c.kv_lora_rank + c.qk_rope_head_dim + c.index_head_dim
    assert per_layer == 704
    for kind in ("dense", "moe"):
        figure = figures.get(f"kv_cache_per_layer_{kind}")
        assert figure.value == per_layer and figure.formula == "kv_lora_rank + qk_rope_head_dim + index_head_dim"
        assert "indexer's key, 128" in figure.definition
    assert figures.get("kv_cache_per_token").value == c.num_hidden_layers * per_layer


# ------------------------------------------------------------------------------------- configs never seen

@st.composite
def dsa_configs(draw):
    """Small configs of either family inside the space the reference accepts."""
    glm = draw(st.booleans())
    layers = draw(st.integers(1, 3))
    n_group = 1 if glm else draw(st.sampled_from([1, 2]))
    per_group = draw(st.integers(2, 3))
    config = {**DEEPSEEK_TINY, "model_type": "glm_moe_dsa" if glm else "deepseek_v32",
              "num_hidden_layers": layers, "first_k_dense_replace": draw(st.integers(0, layers)),
              "n_group": n_group, "topk_group": 1, "n_routed_experts": n_group * per_group,
              "num_experts_per_tok": draw(st.integers(1, per_group)),
              "index_n_heads": draw(st.integers(1, 6)), "index_head_dim": draw(st.sampled_from([8, 16, 24])),
              "index_topk": draw(st.integers(1, 64)), "num_nextn_predict_layers": draw(st.integers(0, 1))}
    if glm:
        del config["rope_scaling"], config["rope_theta"], config["quantization_config"]
        config["rope_parameters"] = {"rope_theta": draw(st.sampled_from([10000.0, 1000000.0])), "rope_type": "default"}
    return config


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(config=dsa_configs())
def test_add_model_alone_builds_other_configs_with_transformers_totals(tmp_path_factory, config):
    folder = tmp_path_factory.mktemp("dsa")
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    toml = add_model(folder / "content", "generated", path, "org/generated", "unpinned")  # writes a revision_note
    spec = load_model_spec(load_model_content(toml.parent))
    model = build_reference_model(spec)
    mtp = account(spec).accounts["mtp"].per_instance if config["num_nextn_predict_layers"] else 0
    assert account(spec).total - mtp == sum(p.numel() for p in model.parameters())
    rec = reconcile(spec, reference_index(spec).index, reference=True, skip_owners=("mtp",))
    assert rec.balanced, rec.differences(5)


def test_a_token_id_key_takes_an_integer_or_a_list():
    """GLM-5 publishes eos_token_id as a list; a union type takes the first member the value fits."""
    from explorer.model.families import FAMILIES

    raw = load_model_content(ROOT / "content/models/glm-5").config
    family = FAMILIES["glm_moe_dsa"]
    assert family.validate(raw, "glm-5").eos_token_id == (154820, 154827, 154829)
    assert family.validate({**raw, "eos_token_id": 7}, "glm-5").eos_token_id == 7


def test_the_softmax_reads_the_mask_the_indexer_narrowed():
    """Each step consumes what an earlier one produced: the indexer's selection, then M + M^sel, then the softmax."""
    attn = spec_of("deepseek-v3.2").root.child("blocks").child("moe").child("attn")
    names = [s.name for s in attn.steps]
    assert names.index("q-norm") < names.index("idx-q") < names.index("idx-select") < names.index("dsa-mask") \
        < names.index("softmax")
    softmax = attn.steps[names.index("softmax")]
    assert r"M^{\mathrm{DSA}}" in softmax.latex and "+M\\right" not in softmax.latex


def test_decode_flops_read_index_topk_keys_and_the_indexer_scores_all():
    from explorer.figures.model_figures import FLOP_CONTEXT, derive

    spec = spec_of("deepseek-v3.2")
    figures = derive(spec, account(spec), None)
    c = spec.config
    mla = 2 * c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)  # scores and values
    indexer = 2 * c.index_n_heads * (c.index_head_dim + 1)  # dot products and the head weighting
    attention = c.num_hidden_layers * (mla * min(c.index_topk, FLOP_CONTEXT) + indexer * FLOP_CONTEXT)
    matmul = figures.get("active_parameters_no_embedding").value
    assert figures.get("flops_decode").value == 2 * matmul + attention
