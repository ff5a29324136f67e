"""The reference calls of the per-layer attention (explorer/model/components/layer_attention.py, which had no room
left under 600 lines): the mask and rotary angles the reference is handed, and the words its check line says about
them."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.attention import (
    call_with_rotary,
)
from explorer.model.components.base import (
    Run,
    reference_call,
)
from explorer.model.components.check_words import OWN_ANGLES, covered, given_mask
from explorer.model.components.layer_attention import MaskOptions, mask
from explorer.model.components.rope import RopeOptions, reference_rotary
from explorer.spec.types import Component, Dim

QUERIES, KEYS = Dim("queries", symbol="T"), Dim("keys", symbol="T")
QKNorm = Literal["none", "per_head", "across_heads", "l2"]
Part = Literal["layer_attention", "shaped_attention"]
SHAPED_ATTENTION: Final[Part] = "shaped_attention"
"""The part a family asks for when its attention's heads are shaped on their own (`part=SHAPED_ATTENTION`)."""


# ------------------------------------------------------------------------------------ reference calls

def reference_mask(attn, M: torch.Tensor) -> torch.Tensor:
    """The mask the reference model hands this layer, from the reference's own config: a sliding window where the
    layer has one, a chunk where its config names the layer chunked_attention, else causal. So a window or chunk our
    spec leaves out (or adds) shows in the check."""
    return mask(M, _reference_mask_options(attn))


def _reference_mask_options(attn) -> MaskOptions:
    config, layer = getattr(attn, "config", None), getattr(attn, "layer_idx", None)
    window = getattr(attn, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    chunk = (getattr(config, "attention_chunk_size", None)
             if types is not None and layer is not None and types[layer] == "chunked_attention" else None)
    return MaskOptions(window, chunk)


def layer_words(comp: Component, attn) -> str:
    """The check line's words: our mask as the reference's config windows or chunks it, each side's own angles
    where the layer rotates (a NoPE layer is handed the angles and does not use them)."""
    m = _reference_mask_options(attn)
    how = (f"windowed by the reference layer's own sliding_window, {m.window}" if m.window else
           f"chunked by the reference config's attention_chunk_size, {m.chunk}" if m.chunk else "")
    return covered(given_mask(how), OWN_ANGLES if _rotates(comp) else "no rotation: the layer uses no rotary angles")


def _rotates(comp: Component) -> bool:
    return comp.program == "rope" or any(_rotates(c) for c in comp.children)


def reference_angles(model, attn, x: torch.Tensor):
    """The reference's rotary output for this layer (its layer type where the rotary module serves several)."""
    inner = model.model
    rotary = getattr(inner, "rotary_emb", None) or inner.language_model.rotary_emb
    positions = torch.arange(x.shape[1])[None].expand(x.shape[0], x.shape[1])
    layer_type = getattr(attn, "layer_type", None)
    o = RopeOptions("default", 1.0, 2, layer_type=layer_type or "")
    return reference_rotary(rotary, o, x, positions)


def _call(ref, attn, model, x: torch.Tensor, M: torch.Tensor):
    kwargs = {"attention_mask": reference_mask(attn, M)[None, None],
              "position_embeddings": reference_angles(model, attn, x)}
    if "shared_kv_states" in inspect.signature(ref.forward).parameters:
        kwargs["shared_kv_states"] = {}
    out = ref(hidden_states=x, **kwargs)
    return out[0] if isinstance(out, tuple) else out


@reference_call("layer_attention")
def call_layer_attention(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference attention with the rotary output and the mask its model would pass it."""
    x, M = inputs[0], inputs[-1]
    return ours, _call(ref, ref, model, x, M), layer_words(comp, ref)


@reference_call("layer_block")
def call_layer_block(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference decoder layer with the rotary output and the mask its model would pass it."""
    x, M = inputs[0], inputs[-1]
    return ours, _call(ref, ref.self_attn, model, x, M), layer_words(comp, ref.self_attn)


reference_call("shaped_attention")(call_with_rotary)  # MiniMax-M2 and MiMo-V2-Flash take cos/sin and their model's mask
