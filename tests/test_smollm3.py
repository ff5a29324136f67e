"""SmolLM3-3B (smollm3, issue 33 point 5): the total from SmolLM3Config's defaults equals transformers' on the meta
device and the published 3.08B; the NoPE layers are the ones the reference config derives (every fourth); the
executed checks at a tiny config with a RoPE layer and a NoPE layer pass, the NoPE attention matching the reference's
SmolLM3Attention without rotating anything. Deliberately wrong models fail: rotary applied on the NoPE layer, and
every layer rotating."""

from __future__ import annotations

import pytest
from conftest import ROOT
from transformers import SmolLM3Config

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.model.account import account
from explorer.model.components.attention import ScoresOptions, attention
from explorer.model.components.blocks import block_layers
from explorer.model.families import load_model_spec
from explorer.model.families import smollm3 as family_module
from explorer.model.families.base import rope_options
from explorer.spec.types import walk

SLUG = "smollm3-3b"
TOTAL = 3_075_098_624
"""transformers 5.23.0's count of SmolLM3ForCausalLM(SmolLM3Config()) on the meta device (the tied head once)."""


@pytest.fixture(scope="module")
def spec():
    return load_model_spec(load_model_content(ROOT / "content/models" / SLUG))


@pytest.fixture(scope="module")
def tiny(spec):
    return tiny_spec(spec)


def test_total_equals_transformers_on_meta_and_the_published_figure(spec):
    model = build_reference_model(spec)
    total = account(spec).total
    assert total == sum(p.numel() for p in model.parameters()) == TOTAL
    assert round(total / 1e9, 2) == 3.08
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_nope_layers_are_the_reference_configs(spec):
    """SmolLM3Config derives no_rope_layers itself: a 0 at each layer that does not rotate."""
    derived = SmolLM3Config().no_rope_layers
    blocks = {b.key: block_layers(b) for b in spec.root.child("blocks").children}
    assert blocks == {"rope_block": tuple(i for i, r in enumerate(derived) if r),
                      "nope_block": tuple(i for i, r in enumerate(derived) if not r)}
    assert blocks["nope_block"] == (3, 7, 11, 15, 19, 23, 27, 31, 35)
    nope = spec.root.child("blocks").child("nope_block").child("attn")
    assert "rope" not in {c.program for _, c in walk(nope)}
    assert len(nope.inputs) == 2  # x and the mask: no rotary angles
    assert any(t.tied_to for t in spec.root.child("lm_head").tensors)
    recorded = load_model_content(ROOT / "content/models" / SLUG).checkpoint.config_defaulted
    assert {"no_rope_layers", "no_rope_layer_interval", "num_hidden_layers", "rope_theta"} <= set(recorded)


def test_an_explicit_pattern_is_read_as_published():
    config = {"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "num_hidden_layers": 4,
              "no_rope_layers": [0, 1, 1, 0]}
    s = family_module.FAMILY.build_spec("x", config, "config.json")
    assert {b.key: block_layers(b) for b in s.root.child("blocks").children} == {"nope_block": (0, 3),
                                                                                "rope_block": (1, 2)}


def test_tiny_checks_pass_with_both_kinds(spec, tiny):
    assert [b.key for b in tiny.root.child("blocks").children] == ["rope_block", "nope_block"]
    checks = check_equations(spec, tiny)
    keys = ("blocks.rope_block", "blocks.rope_block.attn", "blocks.nope_block", "blocks.nope_block.attn", "")
    assert all(checks[k].status == "checked" for k in keys), {k: checks[k].status for k in keys}


def _rotating(self, ctx, c, prefix, ranges, x, v):
    """A NoPE layer's attention built with Llama's rotation, as if the layer were a RoPE layer."""
    return attention(ctx, prefix=prefix, ranges=ranges, x=x,
                     rope_options=rope_options(c.rope_theta, int(v["head_dim"]), None, "half",
                                               c.max_position_embeddings),
                     scores_options=ScoresOptions(int(v["num_attention_heads"]), int(v["num_key_value_heads"]),
                                                  int(v["head_dim"]) ** -0.5))


def test_rotary_applied_on_the_nope_layer_fails(spec, monkeypatch):
    monkeypatch.setattr(family_module.SmolLM3, "nope_attention", _rotating)
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny_spec(spec))
    assert "blocks.nope_block" in str(info.value), str(info.value)


def test_every_layer_rotating_fails(spec, monkeypatch):
    """The tiny config keeps its NoPE layer (the reference's layer 1 does not rotate); the spec rotates it."""
    raw = family_module.FAMILY.tiny_config(spec.config)
    assert raw["no_rope_layers"] == [1, 0]
    monkeypatch.setattr(family_module.SmolLM3, "tiny_config", lambda self, c: raw)
    monkeypatch.setattr(family_module, "rotates", lambda c: (True,) * c.num_hidden_layers)
    t = tiny_spec(spec)
    assert [b.key for b in t.root.child("blocks").children] == ["rope_block"]
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, t)
    assert "max |Δ|" in str(info.value), str(info.value)
