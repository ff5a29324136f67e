"""IndexShare (issue 32, GLM-5.2 and GLM-5.3): layers whose indexer_types entry is "shared" keep no indexer and attend
to the selection of the layer before them. The tensors are transformers' on meta (an indexer in exactly the "full"
layers); the executed checks at a tiny config with a shared layer between two full ones pass, and a shared layer
that ignores the selection it is handed, a family that gives every layer an indexer, and a cache that counts indexer
keys in shared layers each fail."""

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
from explorer.model.account import account
from explorer.model.components import index_share
from explorer.model.families import FAMILIES, load_model_spec
from explorer.model.families.glm_moe_dsa import indexer_types
from explorer.spec.types import ModelSpec

GLM = FAMILIES["glm_moe_dsa"]
INDEXER = 2048 * 32 * 128 + 6144 * 128 + 2 * 128 + 6144 * 32
"""One GLM-5 indexer: wq_b (q_lora_rank × heads·d_idx), wk (hidden × d_idx), k_norm (weight and bias), weights_proj."""
GLM5_REFERENCE = 743_911_199_232
"""transformers' parameter count of GLM-5 on meta (tests/test_dsa.py), every one of its 78 layers with an indexer."""


def spec_of(slug: str) -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def glm52() -> tuple[ModelSpec, ModelSpec]:
    spec = spec_of("glm-5.2")
    return spec, tiny_spec(spec)


# ------------------------------------------------------------------------------------------ schedule, totals

def test_the_schedule_is_the_published_list_and_the_one_freq_and_offset_derive():
    """GLM-5.2 publishes indexer_types and the freq/offset it came from: they agree, and the full layers are the first
    three and every fourth from 6 (21 of 78)."""
    c = spec_of("glm-5.2").config
    derived = indexer_types(replace(c, indexer_types=None))
    assert c.indexer_types == derived
    assert [i for i, kind in enumerate(derived) if kind == "full"] == [0, 1, 2, *range(6, 78, 4)]


@pytest.mark.parametrize("slug", ["glm-5.2", "glm-5.3"])
def test_indexers_only_in_full_layers_and_totals_equal_transformers_on_meta(slug):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    parameters = sum(p.numel() for p in model.parameters())
    shared = indexer_types(spec.config).count("shared")
    assert shared == 57 and parameters == GLM5_REFERENCE - shared * INDEXER  # GLM-5's sizes, 57 indexers fewer
    with_indexer = {int(n.split(".")[2]) for n, _ in model.named_parameters() if ".indexer." in n}
    assert with_indexer == {i for i, kind in enumerate(spec.config.indexer_types) if kind == "full"}
    ledger = account(spec)
    assert ledger.total - ledger.accounts["mtp"].per_instance == parameters
    assert ledger.accounts["blocks.moe_shared.attn"].instances == 57
    assert not any(k.startswith("blocks.moe_shared.attn.indexer") for k in ledger.accounts)
    rec = reconcile(spec, reference_index(spec).index, reference=True, skip_owners=("mtp",))
    assert rec.balanced, rec.differences(5)


def test_a_family_that_gives_every_layer_an_indexer_does_not_balance():
    """Mutation: indexer_types ignored (every layer full) adds 57 indexers transformers does not build."""
    spec = spec_of("glm-5.2")
    every = replace(spec.config, indexer_types=("full",) * 78)
    ignoring = replace(spec, root=GLM.build(every, spec.values))
    rec = reconcile(ignoring, reference_index(spec).index, reference=True, skip_owners=("mtp",))
    assert not rec.balanced and any(".indexer." in m for m in rec.differences(200))


# ------------------------------------------------------------------------------------------ executed checks

def test_tiny_config_has_a_shared_layer_between_full_ones_and_the_checks_pass(glm52):
    spec, tiny = glm52
    assert tiny.config.indexer_types == ("full", "shared", "full")
    assert tiny.config.index_topk < 5  # fewer keys kept than the traced positions: the selection matters
    checks = check_equations(spec, tiny)
    for path in ("", "blocks.moe_shared", "blocks.moe_shared.attn", "blocks.moe.attn.indexer"):
        check = checks[path]
        assert check.status == "checked" and check.max_abs_error <= check.tolerance, path
    assert "prev_topk_indices" in checks["blocks.moe_shared.attn"].detail


def test_a_shared_layer_matches_the_reference_on_a_narrowed_mask(glm52):
    """Run alone, a shared layer is handed a causal mask; here it is handed a random selection of 2 keys per query,
    which the reference gets as prev_topk_indices: same output. Attending causally instead differs."""
    from explorer.execute.executor import port_tensor, run_component
    from explorer.execute.reference import reference_state, tiny_reference_model

    _, tiny = glm52
    model = tiny_reference_model(tiny)
    weights = reference_state(tiny, model)
    blocks = tiny.root.child("blocks")
    attn = blocks.child("moe_shared").child("attn")
    g = torch.Generator().manual_seed(5)
    x, R, causal = (port_tensor(p, tiny, attn, "cpu", g) for p in attn.inputs)
    scores = torch.rand(5, 5, generator=g) + causal
    kept = scores.topk(2, dim=-1).indices
    narrowed = torch.full((5, 5), float("-inf")).scatter(-1, kept, 0.0) + causal
    ref = model.get_submodule("model.layers.1.self_attn")
    ancestors = (tiny.root, blocks, blocks.child("moe_shared"))
    for mask, same in ((narrowed, True), (causal, False)):
        _, (ours,) = run_component(tiny, ancestors, attn, weights, [x, R, mask])
        kwargs = index_share._reference_kwargs(model, attn, x, narrowed)
        with torch.no_grad():
            theirs = ref(hidden_states=x, **kwargs)[0]
        assert torch.allclose(ours, theirs, atol=1e-5) is same


def test_a_shared_layer_that_ignores_the_selection_it_is_handed_fails(glm52, monkeypatch):
    """Mutation: shared layers attend causally (as if handed no selection). Each component run alone still matches
    (alone it is handed the causal mask); the whole model's logits do not."""
    def causal_only(run, M, batch):
        T_ = M.shape[-1]
        return run.rec("handed-mask", torch.full((T_, T_), float("-inf")).triu(1).expand(batch, T_, T_))

    monkeypatch.setattr(index_share, "handed_mask", causal_only)
    with pytest.raises(ExecutionError) as info:
        check_equations(*glm52)
    assert "model: max |Δ|" in str(info.value) and "blocks.moe_shared" not in str(info.value)


def test_a_shared_layer_handed_the_first_selection_for_good_fails(glm52, monkeypatch):
    """Mutation: the stack keeps the first full layer's selection instead of the latest one's. In the tiny config the
    shared layer follows layer 0 directly, so move the shared layer after layer 2 to see it."""
    spec, _ = glm52
    tiny_raw = GLM.tiny_config(spec.config)
    tiny_raw.update(num_hidden_layers=4, indexer_types=["full", "full", "full", "shared"],
                    mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
    tiny = GLM.build_spec("glm-5.2", tiny_raw, "glm-5.2: tiny config")
    check_equations(spec, tiny)  # as built, it passes
    first: dict[str, torch.Tensor] = {}
    real = index_share.selection_recorded

    def first_only(run):
        return first.setdefault("mask", real(run))

    monkeypatch.setattr(index_share, "selection_recorded", first_only)
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny)
    assert "model: max |Δ|" in str(info.value)


# ------------------------------------------------------------------------------------------------ serving

def test_a_shared_layer_caches_no_indexer_key():
    from explorer.figures.model_figures import layer_kinds

    spec = spec_of("glm-5.2")
    c = spec.config
    kinds = {k.block: k for k in layer_kinds(spec, account(spec))}
    shared, full = kinds["blocks.moe_shared"], kinds["blocks.moe"]
    assert shared.per_token == c.kv_lora_rank + c.qk_rope_head_dim
    assert full.per_token == shared.per_token + c.index_head_dim
    assert shared.index_flops_per_key == 0 and shared.topk == c.index_topk


def test_indexer_keys_counted_in_shared_layers_differ_from_what_the_reference_holds(monkeypatch):
    """Mutation of the serving rule: the shared layers' cache with an indexer key beside the latent."""
    import test_serving_reference as sr

    from explorer.model.components import serving

    t, kinds = sr.tiny("glm-5.2")
    wrong = tuple(serving.LayerKind(**{**sr._fields(k), "per_token": k.per_token + t.config.index_head_dim})
                  if k.block.endswith("_shared") else k for k in kinds)
    held = sr.decoded("glm-5.2")
    assert all(sr.formula_elements(kinds, c) == h for c, h in held)
    assert any(sr.formula_elements(wrong, c) != h for c, h in held)


# ------------------------------------------------------------------------------------------------ refusals

def raw_glm52() -> dict:
    """The config table as the family reads it (without the published keys nothing reads)."""
    content = load_model_content(ROOT / "content/models/glm-5.2")
    return {k: v for k, v in content.config.items() if k not in content.checkpoint.config_unused}


@pytest.mark.parametrize(("change", "message"), [
    ({"indexer_types": ["shared"] + ["full"] * 77}, "the first layer must run its indexer"),
    ({"indexer_types": ["full", "shared"]}, "must name 'full' or 'shared' for each of the 78 layers"),
    ({"indexer_types": ["full"] * 77 + ["sometimes"]}, "must name 'full' or 'shared'"),
    ({"mlp_layer_types": ["dense"] * 3}, "must name 'dense' or 'sparse' for each of the 78 layers"),
])
def test_a_schedule_the_reference_cannot_run_is_refused_by_name(change, message):
    with pytest.raises(ContentError) as info:
        GLM.validate({**raw_glm52(), **change}, "glm-5.2")
    assert message in str(info.value)


def test_dense_layers_follow_mlp_layer_types_not_first_k_dense_replace():
    """The reference builds each layer's MLP from mlp_layer_types where published: a dense layer in the middle
    becomes a dense block kind of its own (and first_k_dense_replace is not read)."""
    raw = {**raw_glm52(), "first_k_dense_replace": 0,
           "mlp_layer_types": ["dense"] * 3 + ["sparse"] * 3 + ["dense"] + ["sparse"] * 71}
    spec = GLM.build_spec("glm-5.2", raw, "glm-5.2")
    groups = {b.key: b.repeat for b in spec.root.child("blocks").children}
    assert groups == {"dense": 4, "moe": 17, "moe_shared": 57}


def test_the_published_keys_nothing_reads_are_listed():
    toml = load_model_content(ROOT / "content/models/glm-5.2")
    assert set(toml.checkpoint.config_unused) == {"index_share_for_mtp_iteration", "moe_router_dtype"}
    assert json.loads(json.dumps(toml.config["indexer_types"]))[:4] == ["full", "full", "full", "shared"]


# ------------------------------------------------------------------------------------------ the FP8 release

def test_the_block_fp8_release_keeps_what_its_list_and_the_reference_keep():
    """zai-org's GLM-5.2-FP8: every Linear in FP8 blocks but the modules its modules_to_not_convert names (the MTP
    layer's eh_proj, ...) and the indexer's weights_proj, which the reference keeps in full precision
    (_keep_in_fp32_modules) and transformers' FP8 quantizer therefore never converts. Mutation: without that, the
    head weights are predicted in FP8."""
    from explorer.checkpoint.variants import load_variants, variant_spec
    from explorer.spec.types import walk

    spec = spec_of("glm-5.2")
    (fp8,) = [v for v in load_variants(ROOT / "content/models/glm-5.2") if v.block_fp8 is not None]
    assert GLM.fp8_kept_modules == tuple(build_reference_model(spec)._keep_in_fp32_modules)

    def dtypes(kept: tuple[str, ...]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for _, comp in walk(variant_spec(spec, fp8, GLM.variant_module_name, kept).root):
            for t in comp.tensors:
                out.setdefault(t.template.rsplit(".", 2)[-2], set()).add(t.dtype)
        return out
    stored = dtypes(GLM.fp8_kept_modules)
    assert stored["weights_proj"] == {"BF16"} and stored["eh_proj"] == {"BF16"}
    assert stored["wq_b"] == stored["q_a_proj"] == stored["kv_b_proj"] == {"F8_E4M3"}
    assert all(d == {"F8_E4M3"} for k, d in stored.items() if k in ("gate_proj", "up_proj", "down_proj"))
    assert dtypes(())["weights_proj"] == {"F8_E4M3"}
