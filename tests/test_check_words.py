"""Check lines say what each side computed and what the reference was handed (issue 35): the mask our program built
(and whose window it carries), rotary angles each side computed for itself or ours handed to the reference, gates
drawn by our program where an experts check does not route. The words follow what the reference call passed: a
reference layer without its window is handed an unwindowed mask and its line no longer names one."""

from __future__ import annotations

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.execute.executor import _check_one, first_layer, module_prefix, tiny_spec
from explorer.execute.reference import reference_state, tiny_reference_model
from explorer.model.families import load_model_spec
from explorer.spec.results import within_tolerance
from explorer.spec.types import walk

OWN = "rotary angles computed by each side: ours by our rope program, the reference's by its own rotary module"
MASK = "the causal mask our program built, handed to the reference"
TINY: dict[str, tuple] = {}


def tiny(slug: str):
    if slug not in TINY:
        t = tiny_spec(load_model_spec(load_model_content(ROOT / "content/models" / slug)))
        model = tiny_reference_model(t)
        TINY[slug] = t, model, reference_state(t, model)
    return TINY[slug]


def check(slug: str, path: str) -> tuple[float, str]:
    t, model, weights = tiny(slug)
    for ancestors, comp in walk(t.root):
        if ".".join([*(a.key for a in ancestors[1:]), comp.key]) == path:
            error, detail, _, _ = _check_one(t, model, weights, ancestors, comp)
            return error, detail
    raise KeyError(path)


@pytest.mark.parametrize(("slug", "path", "words"), [
    ("gemma-3-270m", "blocks.local.attn", f"{MASK} (windowed by the reference layer's own sliding_window, 3); {OWN}"),
    ("gemma-3-270m", "blocks.global.attn", f"{MASK}; {OWN}"),
    ("llama-4-scout-17b-16e", "blocks.chunked.attn",
     f"{MASK} (chunked by the reference config's attention_chunk_size, 3); {OWN}"),
    ("llama-4-scout-17b-16e", "blocks.nope.attn", f"{MASK}; no rotation: the layer uses no rotary angles"),
    ("llama-4-scout-17b-16e", "blocks.nope.moe.experts",
     "all 4 experts on inputs scaled by the same random gates (routing not used: the gates our program drew, handed "
     "to the reference)"),
])
def test_check_line_names_what_the_reference_was_handed(slug, path, words):
    error, detail = check(slug, path)
    assert within_tolerance(error)
    assert detail == words


def test_angles_handed_to_the_reference_are_said_unchecked():
    error, detail = check("qwen3.5-27b", "visual.blocks.attn")
    assert within_tolerance(error)
    assert detail.endswith("rotary angles computed by our program and handed to the reference (its own rotary module "
                           "is not run, so these angles are not checked here)")


def test_words_follow_the_mask_the_reference_received(monkeypatch):
    """Without its sliding_window the reference layer is handed the plain causal mask: the line names no window
    and the check, whose program windows, fails."""
    t, model, _ = tiny("gemma-3-270m")
    _, comp = next((a, c) for a, c in walk(t.root) if c.key == "attn" and a[-1].key == "local")
    attn = model.get_submodule(module_prefix(comp, first_layer(comp)).rstrip("."))
    monkeypatch.setattr(attn, "sliding_window", None)
    error, detail = check("gemma-3-270m", "blocks.local.attn")
    assert detail == f"{MASK}; {OWN}"
    assert not within_tolerance(error)
