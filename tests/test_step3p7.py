"""Step-3.7-Flash (issue 33): the flat, trimmed published config balances against transformers 5.23.0's
Step3p7TextModel plus an untied lm_head on the meta device; the executed checks at a tiny config that switches on
what the published file leaves off (a head count of their own on the sliding layers, SwiGLU clamps after the
activation) pass, and each deliberately wrong program fails (head gate dropped, clamp dropped or moved before the
activation, routed sum unscaled, the global head count on the sliding layers); per-layer limits and head counts at
full size balance too; the published keys transformers does not read are refused where they disagree with what it
builds; the KV cache of each layer kind is exact."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import FREE_SIZES, check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.figures.model_figures import CONTEXT, derive
from explorer.model.account import account
from explorer.model.components import activated_clamp, head_gated_attention, mlp, scaled_routed_moe
from explorer.model.families import FAMILIES, load_model_spec
from explorer.model.families import step3p7 as family_module
from explorer.spec.types import ModelSpec

SLUG = "step-3.7-flash"
PARAMETERS, WITHOUT_HEAD, BUFFERS = 195_844_496_640, 195_316_538_624, 12_096
"""Step3p7TextModel of the published flat config on meta, with and without the untied head, and the routers'
e_score_correction_bias values (42 MoE layers × 288), as issue 33's measurement states them."""
FAMILY = FAMILIES["step3p7"]


def spec_of() -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / SLUG))


def published() -> dict:
    return dict(load_model_content(ROOT / "content/models" / SLUG).config)


@pytest.fixture(scope="module")
def tiny() -> tuple[ModelSpec, ModelSpec]:
    spec = spec_of()
    return spec, tiny_spec(spec)


def fails(spec: ModelSpec, tiny_: ModelSpec, *where: str) -> str:
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny_)
    assert all(w in str(info.value) for w in where), str(info.value)
    return str(info.value)


# ------------------------------------------------------------------------------------------------- totals

def test_totals_equal_transformers_on_meta_with_the_bindings_head():
    spec = spec_of()
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == PARAMETERS
    assert sum(p.numel() for p in model.model.parameters()) == WITHOUT_HEAD
    assert type(model.model).__name__ == "Step3p7TextModel" and model.lm_head.bias is None
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # untied
    state = model.state_dict()
    persistent = {n: b.numel() for n, b in model.named_buffers() if n in state}
    assert sum(persistent.values()) == BUFFERS and all(n.endswith("e_score_correction_bias") for n in persistent)
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_the_published_file_builds_the_layout_the_reference_derives():
    """33 sliding (window 512) and 12 global layers, dense layers 0-2 of width 11,264, 288 experts; sliding layers
    keep 64 heads and nothing is clamped, since the file sets neither; the MTP layers are counted apart (declared_mtp), not in the tree."""
    spec = spec_of()
    model = build_reference_model(spec)
    windows = [layer.self_attn.sliding_window for layer in model.model.layers]
    assert windows.count(512) == 33 and windows.count(None) == 12
    blocks = {b.key: b for b in spec.root.child("blocks").children}
    assert {k: b.repeat for k, b in blocks.items()} == {"full_dense": 1, "sliding_dense": 2, "sliding": 31, "full": 11}
    assert [layer.mlp.down_proj.in_features for layer in model.model.layers[:3]] == [11264] * 3
    assert blocks["sliding"].child("attn").options.heads == 64 == model.model.layers[1].self_attn.num_heads
    assert all(c.program not in ("activated_clamp_mlp", "activated_clamp_experts") for b in blocks.values()
               for c in _walk(b))
    assert not any("multi-token" in n for n in spec.root.notes) and spec.declared_mtp is not None
    recorded = load_model_content(ROOT / "content/models" / SLUG).checkpoint.config_defaulted
    assert {"num_sliding_attention_heads", "attention_other_setting", "swiglu_limits",
            "swiglu_limits_shared"} <= set(recorded)


def _walk(comp):
    yield comp
    for c in comp.children:
        yield from _walk(c)


@pytest.mark.parametrize("extra", [{"num_sliding_attention_heads": 32},
                                   {"attention_other_setting": {"num_attention_heads": 32}}])
def test_a_head_count_of_the_sliding_layers_own_balances(extra):
    spec = FAMILY.build_spec("heads", {**published(), **extra}, "test")
    sliding = spec.root.child("blocks").child("sliding").child("attn")
    assert sliding.options.heads == 32 and spec.root.child("blocks").child("full").child("attn").options.heads == 64
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)
    assert account(spec).total == PARAMETERS - 33 * 32 * 128 * (4096 + 4096) - 33 * 32 * 4096  # q, o and g_proj


def test_per_layer_clamps_split_the_blocks_and_still_balance():
    """Limits on the last two layers, as transformers' source says the published checkpoint sets them: layer 43
    (sliding) and 44 (global) become blocks of their own."""
    limits = [0.0] * 43 + [7.0, 7.0]
    shared = [0.0] * 43 + [16.0, 16.0]
    spec = FAMILY.build_spec("clamped", {**published(), "swiglu_limits": limits, "swiglu_limits_shared": shared},
                             "test")
    blocks = {b.key: b for b in spec.root.child("blocks").children}
    assert blocks["sliding_2"].repeat == 1 and blocks["full_2"].repeat == 1 and blocks["sliding"].repeat == 30
    assert blocks["sliding_2"].child("moe").child("experts").options.limit == 7.0
    assert blocks["full_2"].child("moe").child("shared").options.limit == 16.0
    assert account(spec).total == PARAMETERS
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced


# ------------------------------------------------------------------------------------------ executed checks

def test_tiny_config_switches_on_what_the_file_leaves_off(tiny):
    _, small = tiny
    blocks = {b.key: b for b in small.root.child("blocks").children}
    assert list(blocks) == ["full_dense", "sliding_dense", "sliding", "full"]
    heads = {k: b.child("attn").options.heads for k, b in blocks.items()}
    assert heads == {"full_dense": 4, "sliding_dense": 2, "sliding": 2, "full": 4}
    assert blocks["sliding"].child("attn").child("scores").options.window < FREE_SIZES["T"]
    assert blocks["full_dense"].child("mlp").program == "activated_clamp_mlp"
    moe = blocks["sliding"].child("moe")
    assert moe.child("experts").program == "activated_clamp_experts" and moe.child("shared").options.limit == 0.4
    assert blocks["full"].child("moe").child("experts").program == "halves_experts"
    assert moe.options.scale == 3.0


def test_tiny_checks_pass(tiny):
    checks = check_equations(*tiny)
    for suffix in (".attn", ".attn.g_proj", ".moe", ".moe.router", ".moe.experts", ".moe.shared", ".mlp"):
        hit = [p for p in checks if p.endswith(suffix)]
        assert hit and all(checks[p].status == "checked" for p in hit), suffix
    assert checks[""].status == "checked"  # the whole model's logits, through the binding's head


def test_the_clamps_bind_at_the_tiny_config(tiny):
    """Dropping the clamp changes the clamped layers' outputs (so the limits are reached), and only theirs."""
    spec, small = tiny
    real = activated_clamp.clamp_after_activation
    with pytest.MonkeyPatch.context() as m:
        m.setattr(activated_clamp, "clamp_after_activation", lambda g, u, limit: real(g, u, float("inf")))
        text = fails(spec, small, "blocks.sliding.moe.experts: max |Δ|", "blocks.sliding.moe.shared: max |Δ|",
                     "blocks.full_dense.mlp: max |Δ|")
    assert "blocks.sliding_dense.mlp:" not in text and "blocks.full.moe.experts:" not in text


def test_clamping_before_the_activation_fails(tiny, monkeypatch):
    """gpt-oss's order, SiLU(min(g, L)) instead of min(SiLU(g), L): a different function where g > L."""
    def before(g, u, limit):
        a = mlp.activation(g, "silu")
        return a, mlp.activation(g.clamp(max=limit), "silu"), u.clamp(-limit, limit)

    monkeypatch.setattr(activated_clamp, "clamp_after_activation", before)
    fails(*tiny, "blocks.sliding.moe.experts: max |Δ|", "blocks.full_dense.mlp: max |Δ|")


def test_without_the_head_gate_fails(tiny, monkeypatch):
    monkeypatch.setattr(head_gated_attention, "head_gate", lambda O, G: O)
    fails(*tiny, "blocks.sliding.attn: max |Δ|", "blocks.full.attn: max |Δ|")


def test_a_gate_shared_by_all_heads_fails(tiny, monkeypatch):
    """One gate for every head (the first head's) instead of one per head."""
    real = head_gated_attention.head_gate
    monkeypatch.setattr(head_gated_attention, "head_gate", lambda O, G: real(O, G[..., :1].expand_as(G)))
    fails(*tiny, "blocks.sliding.attn: max |Δ|")


def test_the_routed_sum_unscaled_fails(tiny, monkeypatch):
    monkeypatch.setattr(scaled_routed_moe, "combine", lambda routed, shared, scale: routed + shared)
    fails(*tiny, "blocks.sliding.moe: max |Δ|", "blocks.full.moe: max |Δ|")


def test_the_global_head_count_on_the_sliding_layers_fails(tiny, monkeypatch):
    """A family reading num_attention_heads on every layer: the sliding layers' projections no longer fit the
    reference's weights at the tiny config, nor its shapes at full size."""
    spec, small = tiny
    monkeypatch.setattr(family_module, "sliding_heads", lambda c: c.num_attention_heads)
    bad = FAMILY.build_spec("bad", FAMILY.tiny_config(spec.config), "test")
    with pytest.raises((ExecutionError, RuntimeError)) as info:
        check_equations(spec, bad)
    assert "invalid for input of size" in str(info.value) or "max |Δ|" in str(info.value)
    full = FAMILY.build_spec("bad-full", {**published(), "num_sliding_attention_heads": 32}, "test")
    monkeypatch.undo()
    good = FAMILY.build_spec("good-full", {**published(), "num_sliding_attention_heads": 32}, "test")
    rec = reconcile(full, reference_index(good).index, reference=True)
    assert any(".self_attn.q_proj.weight" in m.name for m in rec.shape_mismatch)


# ---------------------------------------------------------------------------------------- unread keys

@pytest.mark.parametrize("key,value,says", [
    ("first_k_dense_replace", 1, "3 dense layers first"),
    ("num_experts", 128, "n_routed_experts (288) experts instead"),
    ("n_shared_experts", 2, "one shared expert instead"),
    ("scoring_func", "softmax", "sigmoid scores instead"),
    ("use_moe_router_bias", False, "a selection-only correction bias instead"),
])
def test_published_keys_the_reference_does_not_read_must_agree(key, value, says):
    with pytest.raises(ContentError) as info:
        FAMILY.validate({**published(), key: value}, "test")
    assert f"key '{key}'" in str(info.value) and says in str(info.value)


def test_what_the_reference_does_with_the_unread_keys():
    """transformers keeps them as attributes and reads none: changing them changes nothing it builds."""
    from transformers import Step3p7TextConfig

    raw = {k: v for k, v in published().items() if k not in ("model_type", "architectures")}
    base = Step3p7TextConfig(**raw)
    other = Step3p7TextConfig(**{**raw, "first_k_dense_replace": 1, "num_experts": 7, "n_shared_experts": 4,
                                 "scoring_func": "softmax", "use_moe_router_bias": False})
    for attr in ("mlp_layer_types", "n_routed_experts", "num_sliding_attention_heads", "swiglu_limits"):
        assert getattr(base, attr) == getattr(other, attr)


# ---------------------------------------------------------------------------------------------- memory

def test_kv_cache_per_layer_kind_is_exact():
    """Independently of the spec: each reference layer caches k_proj and v_proj outputs per token, a sliding layer
    only for its window."""
    spec = spec_of()
    model = build_reference_model(spec)
    figures = derive(spec, account(spec), None)
    context = min(CONTEXT, model.config.max_position_embeddings)  # the figure's context: the model's own maximum
    want = 0
    for layer in model.model.layers:
        a = layer.self_attn
        want += (a.k_proj.out_features + a.v_proj.out_features) * min(context, a.sliding_window or context) * 2
    assert figures.get("kv_cache_bytes_bf16").value == want == 12 * 2048 * 65536 * 2 + 33 * 2048 * 512 * 2


def test_add_model_reads_the_flat_file_alone(tmp_path):
    """--add-model with the published file and nothing else gives the same spec (the family found by model_type)."""
    from explorer.commands.add_model import add_model

    config = tmp_path / "config.json"
    config.write_text(json.dumps(published()))
    (tmp_path / "content" / "models").mkdir(parents=True)
    add_model(tmp_path / "content", "step-copy", config, "stepfun-ai/Step-3.7-Flash", "unpinned")
    copy = load_model_spec(load_model_content(tmp_path / "content" / "models" / "step-copy"))
    assert account(copy).total == PARAMETERS and replace(copy, slug=SLUG).family == "step3p7"


def test_the_tiny_configs_clamped_steps_name_their_limits(tiny):
    """The published file switches no clamp on, so the site's models never show one: the tiny config's steps are
    checked here instead (each limit named where its program applies it), and a clamp step without its limit is
    reported."""
    from explorer.model.components.step_term_checks import unshown_terms
    from explorer.spec.types import walk

    _, small = tiny
    clamped = [c for _, c in walk(small.root) if c.program in ("activated_clamp_mlp", "activated_clamp_experts")]
    assert len(clamped) == 3 and all(unshown_terms(c) == [] for c in clamped)
    bad = replace(clamped[0], steps=tuple(replace(s, latex=s.latex.replace("0.4", "L")) for s in clamped[0].steps))
    assert unshown_terms(bad)


# ---------------------------------------------------------------------------------------------- the FP8 variant

def test_the_fp8_sibling_is_a_variant_laid_out_by_the_family():
    """Step-3.7-Flash-FP8's config.json is the base file plus a block-wise FP8 quantization_config: recorded as a
    variant, its layout is the one the family predicts from that config (checked against transformers' FP8
    quantizer in tests/test_fp8_every_family.py), the same logical parameters in fewer bytes."""
    from explorer.checkpoint.variants import load_variants, stored_as, variant_spec

    base = spec_of()
    (variant,) = load_variants(ROOT / "content/models" / SLUG)
    assert variant.block_fp8 is not None and tuple(variant.block_fp8.weight_block_size) == (128, 128)
    direct = FAMILY.build_spec("fp8", {**published(), "quantization_config": {
        "activation_scheme": "dynamic", "quant_method": "fp8", "weight_block_size": [128, 128]}}, "test")
    assert variant_spec(base, variant).root == direct.root
    layout = stored_as(base, variant, FAMILY.variant_module_name)
    assert layout.parameters == PARAMETERS and layout.scheme == "BlockFP8"
    assert PARAMETERS < layout.bytes < 1.01 * PARAMETERS  # about a byte a parameter (BF16 would be two), scales and all
    dtypes = {name: dtype for name, dtype, _, _ in layout.tensors}
    assert dtypes["model.layers.4,8,12,16,20,24,28,32,36,40,44.mlp.experts.gate_up_proj"] == "F8_E4M3"
    assert dtypes["lm_head.weight"] == "BF16" and dtypes["model.embed_tokens.weight"] == "BF16"


def test_a_family_that_reads_no_fp8_block_refuses_such_a_variant(tmp_path):
    from explorer.checkpoint.variants import PublishedVariant, VariantMeta, variant_spec
    from explorer.model.families.block_fp8 import FP8QuantizationConfig

    gpt2 = load_model_spec(load_model_content(ROOT / "content/models/gpt2"))
    v = PublishedVariant("gpt2-fp8", VariantMeta("gpt2-fp8", "org/gpt2-fp8", "unpinned", "test"),
                         block_fp8=FP8QuantizationConfig("fp8"))
    with pytest.raises(ContentError, match=r"variant gpt2-fp8: key 'quantization_config': .*Conv1D"):
        variant_spec(gpt2, v)
    llama4 = load_model_spec(load_model_content(ROOT / "content/models/llama-4-scout-17b-16e"))
    assert variant_spec(llama4, replace(v, slug="scout-fp8")).root != llama4.root  # a family that reads it


def _mtp_reference_layers(layer_types: list[str]) -> int:
    """Parameters of the MTP layers transformers' generic MtpModel builds from Step3p7TextConfig on meta (the shared
    embedding and head left out), with the published layer_types padded by the MTP layers' entries given."""
    import torch
    from transformers import Step3p7TextConfig
    from transformers.modeling_layers import MtpModel
    from transformers.models.step3p7.modeling_step3p7 import Step3p7TextModel

    raw = {k: v for k, v in published().items() if k not in ("architectures", "model_type", "quantization_config")}
    config = Step3p7TextConfig(**{**raw, "layer_types": layer_types})
    with torch.device("meta"):
        main = Step3p7TextModel(config)
        main.get_decoder = lambda: main  # MtpModel asks a causal LM for its decoder and head
        main.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        mtp = MtpModel(main, config.num_nextn_predict_layers)
    assert list(config.mtp_mlp_layer_types) == [k[1] for k in family_module.mtp_kinds(spec_of().config)]
    return sum(p.numel() for n, p in mtp.named_parameters() if n.startswith("layers."))


def _mtp_counted(spec: ModelSpec) -> int:
    return account(spec).declared_mtp


def test_the_mtp_layers_equal_transformers_mtp_model_on_meta():
    """The three declared MTP layers (enorm, hnorm, eh_proj, a sliding dense decoder layer, a post-norm each) hold
    what transformers' MtpModel builds for them: 3 × 247,746,816."""
    spec = spec_of()
    kinds = family_module.mtp_kinds(spec.config)
    assert [k[:2] for k in kinds] == [(family_module.SLIDING, family_module.DENSE)] * 3
    reference = _mtp_reference_layers([*published()["layer_types"], *(k[0] for k in kinds)])
    assert reference == 3 * 247_746_816 == _mtp_counted(spec)
    assert spec.declared_mtp is not None and spec.declared_mtp.count == 3


def test_mtp_layers_of_the_wrong_kind_fail(monkeypatch):
    """A module built with a mixture of experts (the main layers' kind) instead of the dense MLP the config derives
    does not hold what MtpModel builds."""
    spec = spec_of()
    wrong = tuple((family_module.SLIDING, family_module.SPARSE, None, None) for _ in range(3))
    monkeypatch.setattr(family_module, "mtp_kinds", lambda c: wrong)
    mtp = FAMILY.declared_mtp(spec.config, FAMILY.values(spec.config))
    assert mtp is not None
    assert _mtp_counted(replace(spec, declared_mtp=mtp)) != 3 * 247_746_816
