"""What a reader sees first (issue 36): the model's data flow drawn as computed where images enter (pixels through
the tower and projector beside the token embedding, merged before the first block, never after the LM head), a
tied head labelled as tied, the index grouped by lab and lineage, and the byte unit its cards use."""

from __future__ import annotations

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.model.components.part_facts import facts
from explorer.model.families import load_model_spec
from explorer.views.diagrams import Box, FlowNode, Op, Seq, Split
from explorer.views.flows import drawn_boxes, layout
from explorer.views.index_page import size_bucket

MULTIMODAL = ("gemma-3-27b", "gemma-4-26b-a4b", "kimi-k2.5", "qwen3.5-27b", "qwen3.5-35b-a3b")


def spec_of(slug: str):
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


def node(c) -> FlowNode:
    return FlowNode(c.title, (), c.key)


def top_order(item) -> list[str]:
    """The model's boxes in the order data reaches them (a split's columns in turn, before what follows it)."""
    return drawn_boxes(item)


@pytest.mark.parametrize("slug", MULTIMODAL)
def test_images_enter_before_the_first_block(slug):
    root = spec_of(slug).root
    vision = [c.key for c in root.children if facts(c.program).vision]
    assert vision, "a multimodal model has its tower and projector at the top level"
    flow = layout(root, node)
    assert isinstance(flow, Seq) and isinstance(flow.items[0], Split) and isinstance(flow.items[1], Op)
    (_, text), (label, image) = flow.items[0].columns
    assert drawn_boxes(text) == ["embed"] and drawn_boxes(image) == vision and "pixels" in label
    order = top_order(flow)
    assert order.index("blocks") > max(order.index(k) for k in vision)
    assert order[-1] not in vision  # the logits come from the head, not the projector


def test_a_text_model_draws_no_merge():
    flow = layout(spec_of("qwen3-8b").root, node)
    assert isinstance(flow, Seq) and all(not isinstance(i, (Split, Op)) for i in flow.items)
    assert [i.node.href for i in flow.items if isinstance(i, Box)] == ["embed", "blocks", "norm", "lm_head"]


def test_tied_head_is_labelled_tied(built_site):
    page = (built_site / "models/gemma-3-27b/index.html").read_text()
    assert "tied: reuses model.language_model.embed_tokens.weight" in page
    assert "image pixels, into the vision tower" in page
    untied = (built_site / "models/llama-3.1-8b/index.html").read_text()
    assert "tied: reuses" not in untied


def test_index_cards_read_bytes_in_the_calculators_decimal_units(built_site):
    """The index quotes a cache's growth per token in the unit family every other page uses (kB, MB, GB), never
    KiB (the figure itself: test_browser's index-card test, 70.27 kB for Kimi K2)."""
    index = (built_site / "index.html").read_text()
    assert "KiB" not in index and "MiB" not in index and "GiB" not in index


def test_size_buckets_are_bounded_below_exclusive_above():
    assert size_bucket(8_030_261_248) == "under 10B"
    assert size_bucket(10**10) == "10B to 100B"
    assert size_bucket(499_999_999_999) == "100B to 500B"
    assert size_bucket(1_026_408_232_448) == "500B and more"


def test_index_groups_by_lab_and_lineage_newest_first(builds):
    from explorer.views.index_page import index_groups

    groups = index_groups(list(builds.values()))
    assert sorted(c.name for g in groups for ln in g.lineages for c in ln.cards) == \
        sorted(mb.content.meta.name for mb in builds.values())
    meta = {g.lab: {ln.name: [c.name for c in ln.cards] for ln in g.lineages} for g in groups}
    assert meta["Meta"]["Llama 3.1"] == ["Llama 3.1 8B", "Llama 3.1 70B", "Llama 3.1 405B"]  # one month: content order
    assert list(meta["Meta"]) == ["Llama 4", "Llama 3.3", "Llama 3.1"]  # the newer lineage first
    assert meta["DeepSeek"]["DeepSeek-V3"] == ["DeepSeek-V3.2", "DeepSeek-R1", "DeepSeek-V3"]
    assert list(meta["Qwen"]) == ["Qwen3.5", "Qwen3-VL", "Qwen3-Next", "Qwen3"]
    newest = [max(c.released for ln in g.lineages for c in ln.cards) for g in groups]
    assert newest == sorted(newest, reverse=True)
