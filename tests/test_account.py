"""Exact accounting: the seed pages' numbers, rows that sum, and agreement with transformers on meta."""

from __future__ import annotations

import pytest

from explorer.spec.types import walk


def test_kimi_k2_reproduces_the_seed_numbers(builds):
    acc = builds["kimi-k2"].ledger.accounts
    assert acc["blocks.moe.attn"].per_instance == 101_124_096
    assert acc["blocks.moe.moe"].per_instance == 16_958_226_816
    assert acc["blocks.moe"].per_instance == 17_059_365_248
    assert acc["blocks.moe"].instances == 60
    assert acc["blocks.moe"].total == 1_023_561_914_880
    assert acc["blocks.dense.mlp.down_proj"].per_instance == 132_120_576
    assert acc["blocks.dense.mlp.down_proj"].instances == 1
    assert builds["kimi-k2"].ledger.total == 1_026_408_232_448


def test_moe_block_rows_are_the_seed_rows(builds):
    rows = builds["kimi-k2"].ledger.accounts["blocks.moe"].rows
    assert [(r.label, r.value) for r in rows] == [
        ("Attention RMSNorm", 7_168), ("Multi-head latent attention", 101_124_096),
        ("MoE RMSNorm", 7_168), ("Mixture of experts", 16_958_226_816)]


def test_down_projection_row_reads_input_by_output(builds):
    (row,) = builds["kimi-k2"].ledger.accounts["blocks.dense.mlp.down_proj"].rows
    assert row.label == "Weight matrix"
    assert row.factors == (18_432, 7_168)
    assert row.formula == "intermediate_size × hidden_size"


@pytest.mark.parametrize("slug", ["kimi-k2", "deepseek-v3"])
def test_every_total_is_the_sum_of_its_rows(builds, slug):
    for path, acc in builds[slug].ledger.accounts.items():
        assert acc.per_instance == sum(r.value for r in acc.rows), path
        for r in acc.rows:
            product = 1
            for f in r.factors:
                product *= f
            assert product == r.value, (path, r.label)


@pytest.mark.parametrize("slug", ["kimi-k2", "deepseek-v3"])
def test_child_rows_equal_the_childs_own_total(builds, slug):
    """A parent's row for a child is the child's per-instance total times its repeat."""
    mb = builds[slug]
    for path, acc in mb.ledger.accounts.items():
        for r in acc.rows:
            if r.child:
                child = mb.ledger.accounts[r.child]
                repeat = r.factors[0] if len(r.factors) == 2 else 1
                assert r.value == repeat * child.per_instance, (path, r.child)


def test_deepseek_v3_differs_where_the_family_must_not_break(builds):
    mb = builds["deepseek-v3"]
    acc = mb.ledger.accounts
    assert acc["blocks.dense"].instances == 3
    assert acc["blocks.moe"].instances == 58
    assert acc["blocks.moe.moe.expert"].instances == 58 * 256
    assert "mtp" in acc and acc["mtp"].instances == 1
    main_model = mb.ledger.total - acc["mtp"].per_instance
    assert main_model == 671_026_419_200  # the model card's "671B main model"
    assert acc["mtp"].per_instance == 13_463_426_304


@pytest.mark.parametrize("slug", ["kimi-k2", "deepseek-v3"])
def test_spec_agrees_tensor_by_tensor_with_transformers_on_meta(builds, slug):
    """The oracle: transformers' DeepseekV3ForCausalLM, built from the same config on the meta device."""
    from explorer.execute.reference import build_reference_model

    mb = builds[slug]
    assert mb.reference.balanced, mb.reference.differences()[:20]
    tensors, elements, _ = mb.reference.role_total("parameter")
    mtp = mb.ledger.accounts["mtp"].per_instance if "mtp" in mb.ledger.accounts else 0
    assert elements == mb.ledger.total - mtp  # every parameter the reference holds, matched under its name
    state = build_reference_model(mb.spec).state_dict()
    fused = sum(1 for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj")))
    experts = mb.spec.values["n_routed_experts"]
    # the reference's own tensor count, with each fused gate_up [E, 2I, d] counted as 2·E checkpoint tensors
    # and each fused down [E, d, I] as E
    assert tensors == len(state) - fused + fused // 2 * 3 * experts


@pytest.mark.parametrize("slug", ["kimi-k2", "deepseek-v3"])
def test_total_equals_the_reference_models_own_count(builds, slug):
    """Count the reference's parameters and buffers ourselves, independently of the name mapping."""
    from explorer.execute.reference import build_reference_model

    mb = builds[slug]
    model = build_reference_model(mb.spec)
    count = sum(t.numel() for t in model.state_dict().values())
    mtp = mb.ledger.accounts["mtp"].per_instance if "mtp" in mb.ledger.accounts else 0
    assert count == mb.ledger.total - mtp


def test_reference_mismatch_is_reported_per_tensor(builds):
    """A spec that disagrees with the reference names the tensors."""
    import dataclasses

    from explorer.checkpoint.reconcile import reconcile
    from explorer.execute.reference import reference_index
    from explorer.model.families import load_model_spec

    mb = builds["kimi-k2"]
    config = dict(mb.content.config, moe_intermediate_size=1024)
    content = dataclasses.replace(mb.content, config=config)
    changed = load_model_spec(content)
    ref = reference_index(mb.spec)  # the reference still built from the published config
    rec = reconcile(changed, ref.index, reference=True, skip_owners=("mtp",))
    names = {m.name for m in rec.shape_mismatch}
    assert "model.layers.1.mlp.experts.0.down_proj.weight" in names
    assert "model.layers.60.mlp.shared_experts.gate_proj.weight" in names
    assert not rec.balanced


def test_component_tree_is_complete(builds):
    """Every component carries the fields a page needs, and cites its own source: only plain torch modules (a
    Linear, an Embedding) may lean on the citation of the module that builds them, their parent."""
    for mb in builds.values():
        for ancestors, comp in walk(mb.spec.root):
            assert comp.title and comp.description and comp.code, comp.key
            assert comp.outputs, comp.key
            if ancestors:
                plain = comp.program in ("linear", "embedding", "head") and ancestors[-1].citations
                assert comp.key and (comp.citations or plain), (mb.slug, comp.key)
