"""Keys as values: a layer with a key projection and no value projection, whose values are its keys before the
key norm and rotation, scaled to unit root mean square (Gemma 4's global layers, attention_k_eq_v). One projection
per key/value head instead of two; the cache still holds two tensors per token (the keys normalised and
rotated, the values normalised differently), as the reference's cache does.

References: Gemma 4 model card (Google DeepMind, 2026); transformers' models/gemma4/modeling_gemma4.py
(Gemma4TextAttention: v_proj is None and value_states = key_states when use_alternative_attention).
"""

from __future__ import annotations

from explorer.model.components.base import k, v
from explorer.spec.types import Citation, Shape, Step

CITATION = Citation("With attention_k_eq_v, global layers build no v_proj: the values are the projected keys (before "
                    "k_norm and the rotation), normalised by v_norm, an RMSNorm without a gain.", "transformers",
                    "Gemma4TextAttention", "models/gemma4/modeling_gemma4.py")


def values_step(shape: Shape) -> Step:
    """V is the raw key projection, reshaped into heads."""
    return Step(rf"{v('V')}={k('K')}\quad\text{{(no value projection: the keys before their norm and rotation)}}",
                shape, "values")


def values_from_keys(K):  # K: torch.Tensor [B, T, H_kv, d_head], the projected keys
    """The values of a keys-as-values layer: the key projection itself, before k_norm and the rotation."""
    return K
