"""Pages that read right: breadcrumbs that do not repeat themselves, a stored buffer whose size is explained."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.model.families import load_model_spec
from explorer.spec.types import path_key, walk
from explorer.views.basics import crumb_texts
from explorer.views.component_page import _unused_rotary_buffer_note


def chain_to(spec, path: str):
    """The ancestors (without the model) and the component at `path`."""
    return next((anc[1:] + (comp,)) for anc, comp in walk(spec.root) if path_key(anc, comp) == path)


@pytest.fixture(scope="module")
def llama_8b():
    return load_model_spec(load_model_content(ROOT / "content/models/llama-3.1-8b"))


@pytest.fixture(scope="module")
def kimi_k2():
    content = load_model_content(ROOT / "content/models/kimi-k2")
    return content, load_model_spec(content)


def test_a_dense_model_breadcrumb_names_the_block_once(llama_8b):
    """Issue 25: "32 transformer blocks › 32 transformer blocks" on every dense model's pages."""
    texts = crumb_texts(chain_to(llama_8b, "blocks.block.attn")[:-1])
    assert texts == ["32 transformer blocks", "Transformer block"]


def test_a_moe_model_breadcrumb_keeps_its_counts(kimi_k2):
    _, spec = kimi_k2
    assert crumb_texts(chain_to(spec, "blocks.moe.attn")[:-1]) == ["61 transformer blocks", "60 MoE blocks"]


def test_kimi_k2_stored_rotary_buffer_says_why_it_has_56_values(kimi_k2):
    content, spec = kimi_k2
    rope = chain_to(spec, "blocks.moe.attn.rope")[-1]
    mb = SimpleNamespace(content=content)
    note = _unused_rotary_buffer_note(mb, rope, (56,))
    assert "7,168 / 64 / 2" in note and "32 frequencies" in note and "unused" in note
    assert _unused_rotary_buffer_note(mb, rope, (32,)) == ""  # a buffer of the computed length needs no word
