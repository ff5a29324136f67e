"""Names held as boxes (explorer/checkpoint/tensor_names.py) and the ledger matched group against group: the same answers as
matching name by name, which this file does independently (TensorSpec.names and each storage scheme, one name at
a time), on Kimi K2's manifest and on edits that split, cut and overlap its groups."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from explorer.checkpoint.index import MAX_TENSORS, CheckpointIndex, TensorGroup, TensorInfo, group_tensors
from explorer.checkpoint.manifest import manifest_index
from explorer.checkpoint.reconcile import predicted_index, reconcile
from explorer.checkpoint.tensor_names import NameBox, name_box, pattern_box, pattern_size, shared_name, template_boxes
from explorer.errors import ContentError
from explorer.model.account import evaluate
from explorer.spec.types import path_key, walk

SEGMENTS = st.sampled_from(["model", "layers", "experts", "w", "0", "1", "2", "7", "12", "01", "a-b"])

NAMES = st.lists(SEGMENTS, min_size=1, max_size=5).map(".".join)


@settings(max_examples=200, deadline=None)
@given(st.sets(NAMES, min_size=1, max_size=40), st.lists(NAMES, max_size=10))
def test_grouped_names_list_exactly_the_names(names, probes):
    groups = group_tensors(TensorInfo(n, "BF16", (2,)) for n in names)
    listed = [n for g in groups for n in g.box.names()]
    assert sorted(listed) == sorted(names)
    assert sorted(n for g in groups for n in pattern_box(g.name, MAX_TENSORS).names()) == sorted(names)
    index = CheckpointIndex(tuple(groups), "test")
    for name in [*names, *probes]:  # a name is found in a group exactly when it was grouped
        assert (index.group_of(name) is not None) == (name in names)
        assert any(name in g.box for g in groups) == (name in names)


def test_a_name_is_one_box_and_digits_with_a_leading_zero_stay_literal():
    assert name_box("a.3.b") == pattern_box("a.\\3.b", 10) == pattern_box("a.3.b", 10)
    assert name_box("a.03.b").skeleton == ("a", "03", "b")
    assert pattern_box("layers.1-60.experts.0-383.w", MAX_TENSORS).size == 60 * 384
    assert pattern_box("x.0,3-5", 10).names() == ["x.0", "x.3", "x.4", "x.5"]


@pytest.mark.parametrize("name, skeleton, slots", [
    ("a.7.b", ("a", None, "b"), ({7},)),
    ("a.0.b.0", ("a", None, "b", None), ({0}, {0})),
    ("a.01.b", ("a", "01", "b"), ()),                                          # a leading zero: a literal
    ("x.123456789012345678", ("x", None), ({123456789012345678},)),            # 18 digits: an index
    ("x.1234567890123456789", ("x", "1234567890123456789"), ()),               # 19: a literal
    ("٣.w", ("٣", "w"), ()),                                                   # a digit, not a decimal index
    ("a..b", ("a", "", "b"), ()),
])
def test_a_plain_name_is_its_own_pattern(name, skeleton, slots):
    """Issue 18: a name without runs is boxed without parsing runs (a listing of a million names); the box is
    the one its segments spell, each as the pattern syntax reads it."""
    expected = NameBox(skeleton, tuple(frozenset(v) for v in slots))
    assert pattern_box(name, MAX_TENSORS) == expected and pattern_size(name) == 1
    with pytest.raises(ValueError, match="over the limit of 0"):
        pattern_box(name, 0)


def test_a_pattern_past_the_limit_is_refused_before_its_values_are_built():
    # 10^15 values: building them would exhaust memory long before the error
    with pytest.raises(ValueError, match="over the limit"):
        pattern_box("a.0-999999999999999.b", MAX_TENSORS)
    with pytest.raises(ValueError, match="twice"):
        pattern_box("a.0-3,2", MAX_TENSORS)


def test_templates_become_boxes_unless_a_placeholder_shares_its_segment():
    [box] = template_boxes("model.layers.{layer}.experts.{e}.w", {"layer": (1, 2), "e": (0, 1, 2)})
    assert box.size == 6 and box.first_name == "model.layers.1.experts.0.w"
    listed = template_boxes("h{layer}.w", {"layer": (0, 1)})
    assert [b.first_name for b in listed] == ["h0.w", "h1.w"]


def test_shared_names_are_found_pairwise_and_past_the_pairwise_limit():
    assert shared_name([pattern_box("a.0-5.b", 99), pattern_box("a.5-9.b", 99)]) == "a.5.b"
    assert shared_name([pattern_box("a.0-5.b", 99), pattern_box("a.6-9.b", 99)]) is None
    many = [name_box(f"a.{i}") for i in range(1000)] + [name_box("a.500")]
    assert shared_name(many) == "a.500"


def test_many_one_name_groups_are_checked_by_names_not_pairs(monkeypatch):
    """Pair by pair, a hostile manifest's 10^6 groups of one skeleton would be 5 * 10^11 comparisons; past
    PAIRWISE_LIMIT boxes the names are listed instead (linear)."""
    rows = [{"name": f"a.{i}.w", "shape": [2], "dtype": "BF16"} for i in range(1_000)]
    data = {"manifest": {"repo_id": "o/m", "revision": "r", "provenance": "p", "tensor_count": 1_000},
            "tensor": rows}
    compared = []
    meets = NameBox.meets
    monkeypatch.setattr(NameBox, "meets", lambda a, b: compared.append(1) or meets(a, b))
    assert manifest_index(data, "m.toml").tensor_count == 1_000
    assert not compared
    data["tensor"] = rows + [{"name": "a.0-3.w", "shape": [2], "dtype": "BF16"}]
    data["manifest"]["tensor_count"] = 1_004
    with pytest.raises(ContentError, match="tensor 'a.0.w' is listed twice"):
        manifest_index(data, "m.toml")


# ------------------------------------------------------------------------------ against an independent oracle

def by_name(spec, index):
    """The ledger computed one name at a time, as a reader would check it by hand."""
    expected = expected_by_name(spec)
    stored = index.tensors
    owned = [(t, expected[n]) for n, t in stored.items() if n in expected]
    return {
        "missing": sorted(n for n in expected.keys() - stored.keys() if not expected[n][3]),
        "unowned": sorted(stored.keys() - expected.keys()),
        "shape": sorted(t.name for t, e in owned if e[1] is not None and t.shape != e[1]),
        "dtype": sorted(t.name for t, e in owned if e[2] and t.dtype != e[2]),
        "tensors": len(owned),
        "elements": sum(t.elements for t, _ in owned),
    }


_EXPECTED: dict[int, tuple[object, dict]] = {}
"""by_name's expected names per spec (by id, the spec held so the id stays its own): the edits change the stored
side only, and Kimi K2's 139,644 names cost seconds to list one at a time."""


def expected_by_name(spec) -> dict:
    if id(spec) in _EXPECTED:
        return _EXPECTED[id(spec)][1]
    expected = {}
    for ancestors, comp in walk(spec.root):
        for t in comp.tensors:
            if t.shape is None:
                expected.update({n: (path_key(ancestors, comp), None, t.dtype, t.optional) for n in t.names()})
                continue
            shape = tuple(evaluate(s, spec.values) for s in t.shape)
            for name in t.names():
                for stored in t.storage.expand(name, shape):
                    expected[stored.name] = (path_key(ancestors, comp), stored.shape, stored.dtype,
                                             t.optional or bool(t.tied_to))
    _EXPECTED[id(spec)] = (spec, expected)
    return expected


def by_group(rec):
    return {"missing": list(rec.missing), "unowned": list(rec.unowned),
            "shape": [m.name for m in rec.shape_mismatch], "dtype": [m.name for m in rec.dtype_mismatch],
            "tensors": sum(t.tensors for t in rec.totals), "elements": sum(t.elements for t in rec.totals)}


def edited(index: CheckpointIndex, edit) -> CheckpointIndex:
    return CheckpointIndex(tuple(g2 for g in index.groups for g2 in edit(g)), "edited")


def split_by_layer(g: TensorGroup):
    """Each layer's tensors as their own group, as a sharded checkpoint lists them."""
    if not g.box.slots:
        return [g]
    first, *rest = g.box.slots
    return [dataclasses.replace(g, box=dataclasses.replace(g.box, slots=(frozenset((v,)), *rest))) for v in first]


def drop_one_expert(g: TensorGroup):
    if "experts" not in g.box.skeleton or g.box.skeleton[-2:] != ("down_proj", "weight"):
        return [g]
    layers, experts = g.box.slots
    return [dataclasses.replace(g, box=dataclasses.replace(g.box, slots=(layers, experts - {7})))]


def one_more_expert(g: TensorGroup):
    """A group reaching past the one expected group it meets."""
    if g.name != "model.layers.1-60.mlp.experts.0-383.up_proj.weight":
        return [g]
    layers, experts = g.box.slots
    return [dataclasses.replace(g, box=dataclasses.replace(g.box, slots=(layers, experts | {384})))]


def widen_one_group(g: TensorGroup):
    if g.name != "model.layers.1-60.mlp.experts.0-383.up_proj.weight":
        return [g]
    return [dataclasses.replace(g, shape=(2048, 7169))]


def rename_layer_norms(g: TensorGroup):
    if "input_layernorm" not in g.box.skeleton:
        return [g]
    return [dataclasses.replace(g, box=dataclasses.replace(g.box, slots=(g.box.slots[0] | {61, 62},)))]


def fp8_norms(g: TensorGroup):
    return [dataclasses.replace(g, dtype="F8_E4M3")] if "post_attention_layernorm" in g.box.skeleton else [g]


@pytest.mark.parametrize("edit", [lambda g: [g], split_by_layer, drop_one_expert, one_more_expert, widen_one_group,
                                  rename_layer_norms, fp8_norms])
def test_group_ledger_equals_the_ledger_name_by_name(builds, edit):
    mb = builds["kimi-k2"]
    index = edited(mb.checkpoint_index, edit)
    assert by_group(reconcile(mb.spec, index)) == by_name(mb.spec, index)


def test_a_stored_group_spanning_disjoint_expected_groups_is_matched_as_boxes(builds, monkeypatch):
    """Kimi K2 stores model.layers.0-60.input_layernorm.weight as one group where the spec expects layer 0 (dense
    block) and layers 1-60 (MoE blocks) apart: owned piece by piece, no name listed (the name-by-name oracle above
    holds the result equal); a group reaching past them (layers 61, 62) still falls back to names."""
    from explorer.checkpoint import reconcile as reconcile_module

    listed = []
    by_names = reconcile_module._match_names
    monkeypatch.setattr(reconcile_module, "_match_names", lambda w, s, t: listed.append(s) or by_names(w, s, t))
    mb = builds["kimi-k2"]
    rec = reconcile(mb.spec, mb.checkpoint_index)
    assert rec.balanced and listed == []
    assert [g.name for g in rec.owned["blocks.dense.attn_norm"]] == ["model.layers.0.input_layernorm.weight"]
    assert [g.name for g in rec.owned["blocks.moe.attn_norm"]] == ["model.layers.1-60.input_layernorm.weight"]
    reconcile(mb.spec, edited(mb.checkpoint_index, rename_layer_norms))
    assert [g.name for stored in listed for g in stored] == ["model.layers.0-62.input_layernorm.weight"]


def test_each_edit_is_reported_where_it_was_made(builds):
    mb = builds["kimi-k2"]
    rec = reconcile(mb.spec, edited(mb.checkpoint_index, drop_one_expert))
    assert rec.missing == tuple(f"model.layers.{i}.mlp.experts.7.down_proj.weight" for i in sorted(range(1, 61), key=str))
    rec = reconcile(mb.spec, edited(mb.checkpoint_index, one_more_expert))
    assert len(rec.unowned) == 60 and rec.unowned[0] == "model.layers.1.mlp.experts.384.up_proj.weight"
    rec = reconcile(mb.spec, edited(mb.checkpoint_index, widen_one_group))
    assert len(rec.shape_mismatch) == 60 * 384 and rec.shape_mismatch[0].stored == "[2048, 7169]"
    rec = reconcile(mb.spec, edited(mb.checkpoint_index, rename_layer_norms))
    assert rec.unowned == ("model.layers.61.input_layernorm.weight", "model.layers.62.input_layernorm.weight")


def test_a_component_claiming_a_stored_group_twice_is_reported(builds):
    mb = builds["deepseek-v3"]
    root = mb.spec.root
    block = root.children[1]
    twice = dataclasses.replace(root, children=(*root.children, dataclasses.replace(block, key="again")))
    rec = reconcile(dataclasses.replace(mb.spec, root=twice), predicted_index(mb.spec))
    assert not rec.balanced and "model.layers.0.input_layernorm.weight" in rec.owned_twice


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["0", "00", "01", "7", "10", "123456789012345678", "1234567890123456789", "²", "٣",
                                 "a1", "-1", "", " 1", "w"]), min_size=1, max_size=5).map(".".join))
def test_a_name_splits_into_slots_exactly_where_a_segment_is_an_index(name):
    import re

    from explorer.checkpoint.tensor_names import INDEX, split_name

    parts = name.split(".")
    assert split_name(name) == (tuple(None if re.fullmatch(INDEX, p) else p for p in parts),
                                tuple(int(p) for p in parts if re.fullmatch(INDEX, p)))
