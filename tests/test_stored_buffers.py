"""The stored_buffers figure (explorer/figures/model_figures.py) counts the persistent buffers every checkpoint stores. GPT-2's
only buffers are its causal masks, one per layer: 12 × 1 × 1 × 1,024 × 1,024 elements (config: n_layer 12,
n_positions 1024). A buffer a checkpoint may omit (optional) is not counted."""

from __future__ import annotations

import dataclasses

from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.figures.model_figures import derive
from explorer.model.account import account
from explorer.model.families import load_model_spec
from explorer.spec.types import Component

MASKS = 12 * 1024 * 1024


def stored_buffers(spec) -> int:
    return derive(spec, account(spec), None).get("stored_buffers").value


def with_buffers_optional(comp: Component) -> Component:
    tensors = tuple(dataclasses.replace(t, optional=True) if t.role == "buffer" else t for t in comp.tensors)
    return dataclasses.replace(comp, tensors=tensors, children=tuple(with_buffers_optional(c) for c in comp.children))


def test_gpt2_stores_its_causal_masks_as_buffers():
    spec = load_model_spec(load_model_content(ROOT / "content/models/gpt2"))
    assert stored_buffers(spec) == MASKS


def test_mutation_an_optional_buffer_is_not_counted():
    """The same masks marked optional (a checkpoint may omit them) leave the figure at 0."""
    spec = load_model_spec(load_model_content(ROOT / "content/models/gpt2"))
    assert stored_buffers(dataclasses.replace(spec, root=with_buffers_optional(spec.root))) == 0
