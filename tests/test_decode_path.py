"""The decode-path check of every recurrent layer (issue 35): Gated DeltaNet (Qwen3.5, Qwen3-Next), KDA (Kimi Linear)
and Mamba-2 (Nemotron-H) run the reference layer through its own cache (a prefill, then one position at a time, as
generation does) and compare its per-position outputs and final recurrent and conv states with our recurrent form's;
the check line says so. A state update made wrong in the one-token path (the decay not applied, the conv window
shifted the wrong way, the conv state's columns kept in the wrong order) fails the build's check of that layer."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.execute.executor import _check_one, tiny_spec
from explorer.execute.reference import reference_state, tiny_reference_model
from explorer.model.components import gated_deltanet as gdn
from explorer.model.components import kda, mamba2
from explorer.model.components.decode_check import prefill_length
from explorer.model.families import load_model_spec
from explorer.spec.results import within_tolerance
from explorer.spec.types import walk

LAYERS = {"qwen3.5-27b": "blocks.linear.attn", "kimi-linear-48b-a3b": "blocks.kda_dense.attn",
          "nemotron-3-nano-30b-a3b": "blocks.mamba.mamba"}
"""A model of each recurrent kind and the path of its recurrent layer."""


TINY: dict[str, tuple] = {}


def tiny(slug: str):
    """The tiny spec, its reference model and weights (built once per module run)."""
    if slug not in TINY:
        t = tiny_spec(load_model_spec(load_model_content(ROOT / "content/models" / slug)))
        model = tiny_reference_model(t)
        TINY[slug] = t, model, reference_state(t, model)
    return TINY[slug]


def layer_check(slug: str) -> tuple[float, str]:
    """The build's check of the model's recurrent layer, as check_equations runs it: (max |Δ|, detail)."""
    t, model, weights = tiny(slug)
    for ancestors, comp in walk(t.root):
        if ".".join([*(a.key for a in ancestors[1:]), comp.key]) == LAYERS[slug]:
            error, detail, _, _ = _check_one(t, model, weights, ancestors, comp)
            return error, detail
    raise KeyError(LAYERS[slug])


@pytest.mark.parametrize("slug", sorted(LAYERS))
def test_decode_path_runs_against_the_references_cache(slug):
    error, detail = layer_check(slug)
    assert within_tolerance(error)
    assert "decode path run against the reference's own cache (DynamicCache: 2 positions prefilled, then 3 " \
           "decoded one at a time)" in detail
    assert "final recurrent and conv states" in detail


def test_prefill_leaves_a_position_to_decode():
    assert [prefill_length(T) for T in (1, 2, 5, 6)] == [0, 1, 2, 3]


def fails(slug: str) -> None:
    error, _ = layer_check(slug)
    assert not within_tolerance(error), error


def no_decay(step):
    """A one-token state update that forgets to decay the state (log decay taken as 0)."""
    return lambda S, q_t, k_t, v_t, g_t, beta_t: step(S, q_t, k_t, v_t, torch.zeros_like(g_t), beta_t)


def test_deltanet_decay_not_applied_in_the_one_token_path_fails(monkeypatch):
    monkeypatch.setattr(gdn, "recurrent_step", no_decay(gdn.recurrent_step))
    fails("qwen3.5-27b")


def test_deltanet_conv_state_in_the_wrong_order_fails(monkeypatch):
    """The outputs are untouched (each step reads its window correctly); only the conv state handed to the next
    step of generation is reversed, which the comparison without a cache could never see."""
    form = gdn.recurrent_form

    def reversed_state(*args):
        out, S, conv_state = form(*args)
        return out, S, conv_state.flip(-1)

    monkeypatch.setattr(gdn, "recurrent_form", reversed_state)
    fails("qwen3.5-27b")


def test_kda_decay_not_applied_in_the_one_token_path_fails(monkeypatch):
    monkeypatch.setattr(kda, "recurrent_step", no_decay(kda.recurrent_step))
    fails("kimi-linear-48b-a3b")


def test_mamba_conv_state_shifted_wrongly_fails(monkeypatch):
    """Decoding's conv state must drop its oldest column; dropping the newest instead loses the window."""
    monkeypatch.setattr(mamba2, "shift_conv_state",
                        lambda state, x_t: torch.cat([state[..., :-1], x_t[..., None]], dim=-1))
    fails("nemotron-3-nano-30b-a3b")


def test_mamba_decay_not_applied_in_the_one_token_path_fails(monkeypatch):
    step = mamba2.ssm_step
    monkeypatch.setattr(mamba2, "ssm_step", lambda S, x_t, dt_t, a_log_t, B_t, C_t:
                        step(S, x_t, dt_t, torch.zeros_like(a_log_t), B_t, C_t))
    fails("nemotron-3-nano-30b-a3b")
