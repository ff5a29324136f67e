"""Grouped-query attention with one fused query-key-value projection (Phi-3, Phi-4): a single bias-free matrix
yields the queries of all heads, then the keys and the values of the key/value heads, side by side; a split at
heads·d_head and heads·d_head + kv_heads·d_head separates them before the heads. Rotary position embedding, which may
be partial (Phi-4-mini: the first head_dim × partial_rotary_factor features of each head rotate, the rest pass
through), then softmax attention with each key/value head shared by its group of query heads.

GPT-2's fused attention (fused_attention.py) splits three equal thirds and has no rotary and no groups: here the
split is unequal (the key and value blocks are kv_heads wide, the query block heads wide). The options are
layer_attention.py's (its shape, scale and rotary), so the page's KV cache, compare facts and step terms read them as
they read every shaped attention; only the projection and the split differ.

References: "Phi-3 Technical Report" (arXiv:2404.14219); GQA (arXiv:2305.13245); transformers'
models/phi3/modeling_phi3.py (Phi3Attention: qkv_proj, sliced at query_pos and query_pos + kv_heads·head_dim;
apply_rotary_pos_emb rotating the first cos.shape[-1] features).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from explorer.model.components.attention import call_with_rotary, scores_mask
from explorer.model.components.base import Ctx, Run, k, options, program, q, reference_call, run_child, v
from explorer.model.components.layer_attention import (
    LayerAttentionOptions,
    _attend_child,
    layer_attention,
    layer_memory_entry,
)
from explorer.model.components.linear import linear
from explorer.model.components.rope import RopeOptions, rotate
from explorer.model.components.serving import layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step

PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def split_widths(o: LayerAttentionOptions) -> tuple[int, int, int]:
    """The query, key and value blocks of the fused projection's output, in that order."""
    s = o.shape
    return s.heads * s.qk_head_dim, s.kv_heads * s.qk_head_dim, s.kv_heads * s.v_head_dim


def fused_qkv_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: LayerAttentionOptions,
                        rope_options: RopeOptions | None, citations: tuple[Citation, ...],
                        name: str = "qkv_proj") -> Component:
    """x W_qkv → split into q, k, v → heads → RoPE (on the leading features) → grouped softmax attention → output."""
    if o.qk_norm != "none" or o.keys_as_values or o.value_norm or o.temperature is not None:
        raise ValueError("fused_qkv_attention: no QK-norm, value norm, keys-as-values or temperature in this part")
    base = layer_attention(ctx, prefix=prefix, ranges=ranges, x=x, o=o, rope_options=rope_options,
                           citations=citations)
    H, Hkv, Dqk, Dv = o.shape.formulas
    wq, wk, wv = split_widths(o)
    fused = Dim("(heads+2·kv_heads)·d_head", wq + wk + wv)
    qkv = linear(ctx, name, "Fused QKV projection", weight=f"{prefix}{name}.weight", ranges=ranges,
                 d_in="hidden_size", d_out=H * Dqk + Hkv * Dqk + Hkv * Dv, out_dim=fused, x=x,
                 y=Port(r"[q;k;v]", ctx.tokens(fused), "qkv"),
                 equation=rf"[{q('q')};{k('k')};{v('v')}]={x.latex}W_{{\mathrm{{qkv}}}}",
                 description=f"One matrix projects {ctx.size('hidden_size'):,} features to {fused.size:,}: the "
                             f"queries of {o.shape.heads} heads ({wq:,}), then the keys ({wk:,}) and values ({wv:,}) of "
                             f"{o.shape.kv_heads} key/value heads.", code=f"self.{name}(hidden_states)")
    split = Step(rf"{q('q')}=[q;k;v]_{{:,\,0:{wq}}},\ {k('k')}=[q;k;v]_{{:,\,{wq}:{wq + wk}}},\ "
                 rf"{v('v')}=[q;k;v]_{{:,\,{wq + wk}:{wq + wk + wv}}}", ctx.tokens(Dim("heads·d_head", wq)), "qkv-split")
    projections = {c.steps[0].name for c in base.children if c.key in PROJECTIONS}
    steps = (qkv.steps[0], split) + tuple(s for s in base.steps if s.name not in projections)
    children = (qkv,) + tuple(c for c in base.children if c.key not in PROJECTIONS)
    return replace(base, title=base.title + " (fused QKV)", code=f"{ctx.reference.prefix}Attention(config, layer_idx)",
                   description=base.description.rstrip(".") + "; one fused projection yields q, k and v, split "
                               "apart before the heads.",
                   steps=steps, children=children, program="fused_qkv_attention")


@program("fused_qkv_attention", role="Attention", token_mixer=True,
         layout="fused-qkv", mask_pattern=scores_mask)
def run_fused_qkv_attention(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor,
                            M: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, LayerAttentionOptions)
    s = o.shape
    B_, T_, _ = x.shape
    qkv = run_child(comp, comp.children[0].key, run, x)                                  # [B, T, (H + 2 H_kv)·d]
    q_, k_, v_ = qkv.split(split_widths(o), dim=-1)
    run.rec("qkv-split", q_)                                                             # the query block, as shown
    Q = run.rec("heads", q_.view(B_, T_, s.heads, s.qk_head_dim))                        # [B, T, H, d_head]
    K = k_.view(B_, T_, s.kv_heads, s.qk_head_dim)                                       # [B, T, H_kv, d_head]
    V = v_.view(B_, T_, s.kv_heads, s.v_head_dim)
    if o.rope and angles.shape[-1]:
        ro = options(comp.child("rope"), RopeOptions)
        Q = run.rec("q-rotate", rotate(Q, angles, ro))
        K = run.rec("k-rotate", rotate(K, angles, ro))
    O = _attend_child(comp, run, Q, K, V, M)                                             # [B, T, H, d_v]
    return [run.rec("attention", run_child(comp, "o_proj", run, O.reshape(B_, T_, s.heads * s.v_head_dim)))]


reference_call("fused_qkv_attention")(call_with_rotary)  # Phi3Attention takes cos/sin and its model's mask

layer_memory("fused_qkv_attention")(layer_memory_entry)  # K and V of each key/value head, as shaped attention caches
