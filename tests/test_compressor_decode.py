"""DeepSeek-V4's compressors on the decode path (issue 35): the reference compressor run through a cache layer of
its own kind (a prefill of 2 positions, then 3 fed one at a time, as generation does) against our token-by-token
pooling: the same entries (and, for compressed sparse attention, the same indexer keys), the same pending
projections, and with overlapping windows the same first series of the last closed window. At the tiny config's
ratios (2 with overlap, 4 without) and T = 5, the ratio-2 compressor closes one window in the prefill and one across
the single-token steps, whose entry needs the overlap state carried out of the prefill; the ratio-4 one closes its
window on a single-token step after two pending positions came from the prefill. A state update made wrong
(the overlap taken from the second series, the entry rotated at the closing position, the pending positions
dropped) fails the build's check of that compressor."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.execute.executor import _check_one, first_layer, module_prefix, tiny_spec
from explorer.execute.reference import reference_state, tiny_reference_model
from explorer.model.components import compressor_decode as decode
from explorer.model.components.base import Run
from explorer.model.components.compressed_attention import compress
from explorer.model.families import load_model_spec
from explorer.spec.results import within_tolerance
from explorer.spec.types import walk

TINY: list = []


def tiny():
    if not TINY:
        t = tiny_spec(load_model_spec(load_model_content(ROOT / "content/models/deepseek-v4-flash")))
        model = tiny_reference_model(t)
        TINY.append((t, model, reference_state(t, model)))
    return TINY[0]


def compressor_checks() -> dict[str, tuple[float, str]]:
    """The build's check of each compressor of the tiny model, by its layer's path: (max |Δ|, detail)."""
    t, model, weights = tiny()
    out = {}
    for ancestors, comp in walk(t.root):
        if comp.key == "compressor" and comp.children:
            error, detail, _, _ = _check_one(t, model, weights, ancestors, comp)
            out[".".join(a.key for a in ancestors[1:])] = (error, detail)
    return out


def test_both_compressors_decode_as_the_references_cache():
    checks = compressor_checks()
    assert sorted(checks) == ["blocks.csa.attn", "blocks.csa_hash.attn", "blocks.hca.attn"], sorted(checks)
    for path, (error, detail) in checks.items():
        assert within_tolerance(error), (path, error)
        assert "2 positions prefilled, then 3 fed one at a time" in detail
        assert "the pending projections" in detail
    details = " ".join(d for _, d in checks.values())
    assert "DeepseekV4CSACache" in details and "DeepseekV4HCACache" in details
    assert "same entries and indexer keys" in details


def test_token_by_token_pooling_equals_the_batched_form():
    """The two forms of our own pooling agree on every closed window of a longer sequence (11 positions)."""
    t, _, weights = tiny()
    for _, comp in walk(t.root):
        if comp.key == "compressor" and comp.children:
            run = Run({k: v.float() for k, v in weights.items()}, module=module_prefix(comp, first_layer(comp)))
            for _name, series_run, o in decode.pooled_series(comp, run):
                x = torch.randn(2, 11, t.values["hidden_size"], generator=torch.Generator().manual_seed(0))
                batched = compress(series_run.child(prefix="c-"), o, x)
                state = decode.pool_token_by_token(series_run, o, x)
                assert state.entries.shape[1] == 11 // o.ratio > 1
                assert state.pending_kv.shape[1] == 11 % o.ratio
                torch.testing.assert_close(state.entries, batched, rtol=0, atol=1e-5)


def fails() -> None:
    errors = [error for error, _ in compressor_checks().values()]
    assert not all(within_tolerance(e) for e in errors), errors


def test_overlap_taken_from_the_second_series_fails(monkeypatch):
    """Only a window closing after the prefill reads the carried series: the batched form never sees this."""
    monkeypatch.setattr(decode, "first_series", lambda kv, gate, width: (kv[..., width:], gate[..., width:]))
    fails()


def test_entry_rotated_at_the_closing_position_fails(monkeypatch):
    close = decode.close_window
    monkeypatch.setattr(decode, "close_window",
                        lambda run, o, kv, gate, prior, index: close(run, o, kv, gate, prior, index + 1))
    fails()


def test_pending_positions_dropped_fails(monkeypatch):
    """A pooling that keeps no pending positions between calls closes no window on the single-token steps."""
    pool = decode.pool_token_by_token

    def forgetful(run, o, x):
        state = pool(run, o, x)
        return decode.PoolState(state.entries, state.pending_kv[:, :0], state.pending_gate[:, :0],
                                state.overlap_kv, state.overlap_gate)

    monkeypatch.setattr(decode, "pool_token_by_token", forgetful)
    with pytest.raises(Exception, match="decode check"):
        compressor_checks()
