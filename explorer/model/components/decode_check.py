"""The decode-path check of a recurrent layer (Gated DeltaNet, KDA, Mamba-2): the reference layer run with its own
cache object as its model's generate loop runs it (a prefill of the first positions, then one position at a time),
its per-position outputs and its final recurrent and conv states compared with our recurrent form's, which carries
its states from zero one token at a time.

Without this the recurrent form is only compared with the reference called without a cache (its chunked path): a
state our one-token path carries wrongly between steps but whose outputs happen to agree, or a cache layout that
differs from ours, would pass. transformers 5.23.0's models create the cache as `DynamicCache(config=self.config)`
when none is given (Qwen3NextModel.forward, Qwen3_5Model.forward, KimiLinearModel.forward, NemotronHModel.forward);
its linear-attention layers hold one conv state [B, C, K] and one recurrent state per layer
(cache_utils.LinearAttentionCacheLayerMixin), read back with get_conv_state / get_recurrent_state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch


@dataclass(frozen=True, slots=True)
class Decoded:
    """What the reference's cached decode produced: outputs [B, T, d] and its final states."""

    outputs: torch.Tensor
    recurrent_state: torch.Tensor
    conv_state: torch.Tensor
    prefilled: int


def prefill_length(T: int) -> int:
    """Positions the reference prefills before decoding one at a time: half the sequence, leaving at least one
    position to decode (a sequence of one position is decoded from an empty cache)."""
    return max(0, min(T // 2, T - 1))


def reference_decode(ref, model, x: torch.Tensor) -> Decoded:
    """Run the reference layer `ref` (with a layer_idx) through its model's cache: a prefill, then one token at a
    time. `model` gives the config the cache is built from, as the model's own forward builds it."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    P = prefill_length(x.shape[1])
    outs = [ref(x[:, :P], cache_params=cache)] if P else []
    outs += [ref(x[:, t:t + 1], cache_params=cache) for t in range(P, x.shape[1])]
    layer = ref.layer_idx
    state, conv = cache.get_recurrent_state(layer, state_idx=0), cache.get_conv_state(layer, state_idx=0)
    assert state is not None and conv is not None, "the cache holds no state after the tokens it was given"
    return Decoded(torch.cat(outs, dim=1), state, conv, P)


def decode_comparison(ours_outputs: torch.Tensor, ours_state: torch.Tensor, ours_conv: torch.Tensor,
                      theirs: Decoded) -> tuple[torch.Tensor, torch.Tensor]:
    """Our recurrent form's outputs and final states beside the reference's, flattened into one pair of vectors so
    one max |Δ| covers them all. Our conv state may hold the last K − 1 inputs where the cache holds the whole
    kernel window K: the cache's newest columns are the ones compared (the oldest is never read again)."""
    conv_theirs = theirs.conv_state[..., -ours_conv.shape[-1]:]
    if ours_state.shape != theirs.recurrent_state.shape or ours_conv.shape != conv_theirs.shape:
        raise ValueError(f"decode check: our states {tuple(ours_state.shape)}, {tuple(ours_conv.shape)} against the "
                         f"cache's {tuple(theirs.recurrent_state.shape)}, {tuple(conv_theirs.shape)}")
    ours = torch.cat([ours_outputs.float().flatten(), ours_state.float().flatten(), ours_conv.float().flatten()])
    ref = torch.cat([theirs.outputs.float().flatten(), theirs.recurrent_state.float().flatten(),
                     conv_theirs.float().flatten()])
    return ours, ref


def decode_detail(theirs: Decoded, T: int) -> str:
    """The check line's words for the decode path, saying exactly what ran."""
    return (f"decode path run against the reference's own cache (DynamicCache: {theirs.prefilled} positions "
            f"prefilled, then {T - theirs.prefilled} decoded one at a time): our recurrent form's per-position outputs "
            "and its final recurrent and conv states equal the cache's")


__all__ = ["Decoded", "reference_decode", "decode_comparison", "decode_detail", "prefill_length"]
