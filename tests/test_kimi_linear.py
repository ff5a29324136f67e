"""Kimi Linear (issue 33): the total from KimiLinearConfig's defaults equals transformers' on the meta device; the
layer pattern is the reference's; the KDA layer matches the reference module over a sequence that crosses several
chunks in both its chunked and its recurrent form, and the two forms agree at every chunk boundary from any state;
the MLA layers match the reference without rotating anything. Deliberately wrong programs fail: a decay per head
instead of per key channel, the short convolution left out, the output gate's sigmoid swapped for SiLU, a rotation
applied in the NoPE layers."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, recurrent_layer_run

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import _check_one, check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index, reference_state, tiny_reference_model
from explorer.model.account import account
from explorer.model.components import gated_deltanet as gdn
from explorer.model.components import kda
from explorer.model.components import mla_nope as mla_nope_module
from explorer.model.components.blocks import block_layers
from explorer.model.families import load_model_spec
from explorer.spec.results import within_tolerance
from explorer.spec.types import walk

SLUG = "kimi-linear-48b-a3b"


@pytest.fixture(scope="module")
def spec():
    return load_model_spec(load_model_content(ROOT / "content/models" / SLUG))


@pytest.fixture(scope="module")
def tiny(spec):
    t = tiny_spec(spec)
    model = tiny_reference_model(t)
    return t, model, reference_state(t, model)


def test_total_equals_transformers_on_meta(spec):
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == 49_133_074_464
    assert sum(b.numel() for _, b in model.named_buffers()) == 6_656  # 26 routers' correction biases, 256 each
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


def test_pattern_is_the_reference_default(spec):
    """Full attention at every fourth layer after layer 0 (4, 8, ..., 24), a dense MLP in layer 0 only."""
    blocks = {b.key: block_layers(b) for b in spec.root.child("blocks").children}
    assert blocks == {"kda_dense": (0,), "kda_moe": tuple(i for i in range(1, 27) if i % 4),
                      "mla_moe": (4, 8, 12, 16, 20, 24)}
    assert "rope" not in {c.program for c in spec.root.child("blocks").child("mla_moe").child("attn").children}
    recorded = load_model_content(ROOT / "content/models" / SLUG).checkpoint.config_defaulted
    assert "layer_types" in recorded and "num_hidden_layers" in recorded  # a page built from defaults lists them
    assert "dtype" in recorded and "torch_dtype" not in recorded  # one setting under two names, listed once


def kda_run(tiny, T: int = 150):
    """Our KDA program and the reference layer on one random sequence of T positions (T > 2 chunks)."""
    return recurrent_layer_run(*tiny, "kda_moe", T, seed=5)


def error(a, b) -> float:
    return float((a - b).abs().max())


def test_kda_chunked_and_recurrent_match_the_reference_across_chunks(tiny):
    ours, recurrent, theirs = kda_run(tiny)
    assert ours.shape[1] > 2 * gdn.CHUNK
    assert within_tolerance(error(ours, theirs)) and within_tolerance(error(recurrent, theirs))


def test_chunked_state_equals_recurrent_state_at_every_chunk_boundary():
    """From a nonzero state, with a decay that differs per channel: the state carried across chunks is the state
    the token-by-token recurrence reaches."""
    g = torch.Generator().manual_seed(0)
    B, H, dk, dv = 2, 3, 8, 12
    q_, k_ = (gdn.l2_normalise(torch.randn(B, 130, H, dk, generator=g)) for _ in range(2))
    v_ = torch.randn(B, 130, H, dv, generator=g)
    lg, beta = -torch.rand(B, 130, H, dk, generator=g), torch.rand(B, 130, H, generator=g)
    S0 = torch.randn(B, H, dk, dv, generator=g)
    for end in (64, 128, 130):
        o_c, S_c = kda.chunked_kda(q_[:, :end], k_[:, :end], v_[:, :end], lg[:, :end], beta[:, :end], S0, 64)
        o_r, S_r = kda.recurrent_kda(q_[:, :end], k_[:, :end], v_[:, :end], lg[:, :end], beta[:, :end], S0)
        assert error(o_c, o_r) < 1e-4 and error(S_c, S_r) < 1e-4


def kda_fails(tiny) -> None:
    ours, recurrent, theirs = kda_run(tiny, T=70)
    assert not within_tolerance(error(ours, theirs)) and not within_tolerance(error(recurrent, theirs))


def test_decay_per_head_instead_of_per_channel_fails(tiny, monkeypatch):
    real = kda.channel_log_decay
    monkeypatch.setattr(kda, "channel_log_decay", lambda *a: kda.per_head_decay(real(*a)))
    kda_fails(tiny)


def test_short_convolution_left_out_fails(tiny, monkeypatch):
    monkeypatch.setattr(gdn, "causal_conv", lambda x, w: x)
    monkeypatch.setattr(kda, "conv_step", lambda state, x_t, w: (x_t, state))
    kda_fails(tiny)


def test_silu_gate_instead_of_sigmoid_fails(tiny, monkeypatch):
    def silu_gated(o, gate, w, eps):
        of = o.float()
        return (w * (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)) * torch.nn.functional.silu(gate)).to(o.dtype)

    monkeypatch.setattr(kda, "sigmoid_gated_rmsnorm", silu_gated)
    kda_fails(tiny)


@pytest.mark.slow
def test_per_head_decay_fails_the_build_check(tiny, monkeypatch):
    t = tiny[0]
    real = kda.channel_log_decay
    monkeypatch.setattr(kda, "channel_log_decay", lambda *a: kda.per_head_decay(real(*a)))
    with pytest.raises(ExecutionError) as info:
        check_equations(t, t)
    assert "forget_gate" in str(info.value) or "attn" in str(info.value)


def component_error(tiny, path: str) -> float:
    t, model, weights = tiny
    for ancestors, comp in walk(t.root):
        if ".".join([a.key for a in ancestors[1:]] + [comp.key]) == path:
            return _check_one(t, model, weights, ancestors, comp)[0]
    raise KeyError(path)


def test_nope_mla_matches_and_a_rotation_fails(tiny, monkeypatch):
    """Rotating the shared key part by any position-dependent map (here: its features reversed after position 0)
    breaks the match with the reference, which rotates nothing."""
    assert within_tolerance(component_error(tiny, "blocks.mla_moe.attn"))
    real = mla_nope_module.mla_forward

    def rotated(comp, run, x, M, rotate_q, rotate_k):
        def turn(z):
            return torch.cat([z[:, :1], z[:, 1:].flip(-1)], dim=1)
        return real(comp, run, x, M, rotate_q=turn, rotate_k=turn)

    monkeypatch.setattr(mla_nope_module, "mla_forward", rotated)
    assert not within_tolerance(component_error(tiny, "blocks.mla_moe.attn"))
