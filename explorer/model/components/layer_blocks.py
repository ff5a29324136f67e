"""Decoder blocks whose attention is set per layer kind (layer_attention.py): the pre-norm block of blocks.py, with
an FFN that may also read the residual stream (a MoE beside a dense MLP, whose router and second pre-norm take the
stream), and an optional stored per-layer scalar that multiplies the block's output (Gemma 4's layer_scalar, a
persistent buffer the checkpoint stores beside the parameters).

References: transformers' models/llama4/modeling_llama4.py (Llama4TextDecoderLayer) and
models/gemma4/modeling_gemma4.py (Gemma4TextDecoderLayer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import Ctx, Run, options, program, relative_module, run_child
from explorer.model.components.blocks import decoder_block
from explorer.model.components.norms import NormOptions, apply_norm
from explorer.spec.storage import Dense
from explorer.spec.types import Component, IndexRange, Step, TensorSpec


@dataclass(frozen=True, slots=True)
class LayerBlockOptions:
    post_attn_norm: bool = False
    post_ffn_norm: bool = False
    ffn_reads_stream: bool = False
    """The FFN takes the stream x'_n as well as its normalised input (a MoE beside a dense MLP)."""
    layer_scalar: bool = False


def layer_block(ctx: Ctx, key: str, title: str, *, ranges: tuple[IndexRange, ...], scalar_name: str = "",
                **kw) -> Component:
    """decoder_block's spec with the layer_block program; scalar_name: the stored per-layer scalar's template."""
    block = decoder_block(ctx, key, title, **kw)
    ffn = kw["ffn"]
    o = LayerBlockOptions(kw.get("post_attn_norm") is not None, kw.get("post_ffn_norm") is not None,
                          len(ffn.inputs) > 1, bool(scalar_name))
    steps, tensors = block.steps, block.tensors
    if scalar_name:
        x = block.outputs[0]
        steps = steps + (Step(r"x_{n+1}\leftarrow s_{\mathrm{layer}}\,x_{n+1}\quad(s_{\mathrm{layer}}\text{: the stored layer scalar})",
                              x.shape, "layer-scalar"),)
        tensors = tensors + (TensorSpec(scalar_name, (1,), ranges, role="buffer", storage=Dense(ctx.dtype)),)
    return replace(block, steps=steps, tensors=tensors, program="layer_block", options=o)


def _norm(comp: Component, key: str, run: Run, x: torch.Tensor) -> torch.Tensor:
    child = comp.child(key)
    return apply_norm(run, key, x, options(child, NormOptions), relative_module(comp, child))


@program("layer_block")
def run_layer_block(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """rest: what the attention takes besides x (the rotary angles and the mask; the mask alone in a NoPE layer)."""
    o = options(comp, LayerBlockOptions)
    delta_attn = run_child(comp, "attn", run, _norm(comp, "attn_norm", run, x), *rest)
    if o.post_attn_norm:
        delta_attn = _norm(comp, "post_attn_norm", run, delta_attn)
    x_mid = run.rec("residual-attn", x + delta_attn)
    x_ffn = _norm(comp, "ffn_norm", run, x_mid)
    ffn = comp.children[comp.children.index(comp.child("ffn_norm")) + 1]
    delta_ffn = run_child(comp, ffn.key, run, *((x_ffn, x_mid) if o.ffn_reads_stream else (x_ffn,)))
    if o.post_ffn_norm:
        delta_ffn = _norm(comp, "post_ffn_norm", run, delta_ffn)
    out = run.rec("residual-ffn", x_mid + delta_ffn)
    if o.layer_scalar:
        scalar = run.w("layer_scalar") if run.has("layer_scalar") else torch.ones(1, device=x.device)
        out = run.rec("layer-scalar", out * scalar.to(out.dtype))
    return [out]
