"""Gated full attention (Qwen3.5's attention layers): grouped-query softmax attention with QK-norm, rotary position
on the first part of each head only (partial rotary), and an output gate: the query projection also produces one
gate per output feature, and the heads' outputs are multiplied by its sigmoid before the output projection.

The projections, norms, rotary angles and scores are the library's (linear.py, norms.py, rope.py, attention.py);
this module composes them with the two things that differ: the query projection's interleaved [query; gate] halves
per head, and the rotation of only rope.dim of head_dim features.

References: "Gated Attention for Large Language Models: Non-linearity, Sparsity, and Attention-Sink-Free"
(Qiu et al., arXiv:2505.06708) for the sigmoid output gate; RoFormer (arXiv:2104.09864); transformers'
models/qwen3_5/modeling_qwen3_5.py (Qwen3_5Attention, apply_rotary_pos_emb) for how the reference computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.attention import (
    ScoresOptions,
    attend,
    call_with_rotary,
    headline_steps,
    per_head_qk_norms,
    plain_memory,
    scores,
    scores_mask,
)
from explorer.model.components.base import REFERENCE_CALLS, Ctx, Run, ctx_colour, k, options, program, q, run_child, v
from explorer.model.components.linear import linear
from explorer.model.components.norms import GAIN_SUBSCRIPT, Gain, NormOptions, apply_norm
from explorer.model.components.rope import RopeOptions, rope, rotate
from explorer.model.components.serving import layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step


@dataclass(frozen=True, slots=True)
class GatedAttentionOptions:
    heads: int
    kv_heads: int
    head_dim: int
    qk_norm: NormOptions


def output_gate(O: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """O ⊙ σ(G): each head output feature scaled by its own gate in (0, 1)."""
    return O * torch.sigmoid(G)


def gated_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, rope_options: RopeOptions,
                    scores_options: ScoresOptions, eps: float, gain: Gain, citations: tuple[Citation, ...],
                    rope_reference: str, notes: tuple[str, ...] = (),
                    rope_class: str = "TextRotaryEmbedding") -> Component:
    """Grouped-query attention with QK-norm, partial rotary and a sigmoid output gate from the query projection;
    `rope_class`: the reference's rotary module after its prefix (a multimodal model's text one by default)."""
    so, ro = scores_options, rope_options
    n, kvh, hd = so.heads, so.kv_heads, ctx.size("head_dim")
    heads, kv_heads, d_head = Dim("heads", n), Dim("kv_heads", kvh), Dim("d_head", hd)
    H, Hkv, D = ctx.sym("num_attention_heads"), ctx.sym("num_key_value_heads"), ctx.sym("head_dim")
    d = ctx.size("hidden_size")

    def proj(key: str, title: str, d_out, out_dim: Dim, latex: str, what: str) -> Component:
        return linear(ctx, key, title, weight=prefix + key + ".weight", ranges=ranges, d_in="hidden_size",
                      d_out=d_out, out_dim=out_dim, x=x, y=Port(latex, ctx.tokens(out_dim), key[0]),
                      equation=rf"{latex}={x.latex}W_{{{key[0].upper()}}}", description=f"Project {d:,} features to {what}.",
                      code=f"self.{key}(hidden_states)")

    children = [
        proj("q_proj", "Query and gate projection", 2 * H * D, Dim("heads·2·d_head", 2 * n * hd), q("q"),
             f"{n} heads of {2 * hd} ({2 * n * hd:,} outputs): each head's {hd} query features, then its {hd} gates"),
        proj("k_proj", "Key projection", Hkv * D, Dim("kv_heads·d_head", kvh * hd), k("k"),
             f"{kvh} key heads of {hd} ({kvh * hd:,} outputs)"),
        proj("v_proj", "Value projection", Hkv * D, Dim("kv_heads·d_head", kvh * hd), v("v"),
             f"{kvh} value heads of {hd} ({kvh * hd:,} outputs)"),
    ]
    children += per_head_qk_norms(ctx, prefix=prefix, ranges=ranges, heads=heads, kv_heads=kv_heads, d_head=d_head,
                                  eps=eps, gain=gain)
    # a multimodal reference's text rotary module is {prefix}TextRotaryEmbedding (the vision tower has its own)
    rope_c = rope(ctx, ro, code=f"{ctx.reference.prefix}{rope_class}(config)")
    rope_cite = ctx.reference.cite(f"The text rotary module computes the default inverse frequencies over "
                                   f"head_dim × partial_rotary_factor = {ro.dim} features.",
                                   f"{rope_class}.compute_default_rope_parameters")
    children.append(replace(rope_c, reference=rope_reference, citations=(rope_cite,)))
    children.append(scores(ctx, so, d_qk=hd, d_v=hd, scale_latex=rf"\tau=1/\sqrt{{{hd}}}={so.scale:.6f}",
                           description=f"Causal softmax attention of {n} query heads over {hd}-dimensional dot "
                                       f"products; each key/value head serves {so.groups} query heads.",
                           citations=citations[:1], weight_prefix=prefix, ranges=ranges, q_in="Q^{R}", k_in="K^{R}"))
    gated_O = ctx_colour(r"\tilde O")
    o_in = Port(gated_O, ctx.tokens(Dim("heads·d_head", n * hd)), "O_gated")
    children.append(linear(ctx, "o_proj", "Output projection", weight=prefix + "o_proj.weight", ranges=ranges,
                           d_in=H * D, d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=o_in,
                           y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                           equation=rf"\Delta_{{\mathrm{{attn}}}}={gated_O}W_{{O}}",
                           description=f"Mix the {n} gated heads ({n * hd:,} features) back to {d:,} features.",
                           code="self.o_proj(attn_output)"))
    by = {c.key: c for c in children}
    g = GAIN_SUBSCRIPT[gain]
    qh, kh_ = q(r"\hat Q"), k(r"\hat K")
    rot = rf"_{{t,\,:{ro.dim}}}"
    steps = (
        by["q_proj"].steps[0], by["k_proj"].steps[0], by["v_proj"].steps[0],
        Step(rf"[{q('Q_h')};G_h]={q('q')}_{{h,\,1:{hd}}},\ {q('q')}_{{h,\,{hd}+1:{2 * hd}}},\quad {k('K')},{v('V')}="
             rf"\operatorname{{reshape}}({k('k')}),\operatorname{{reshape}}({v('v')})", ctx.tokens(heads, d_head), "heads"),
        Step(rf"{qh}=\operatorname{{RMSNorm}}{g}({q('Q')})", ctx.tokens(heads, d_head), "q_norm"),
        Step(rf"{kh_}=\operatorname{{RMSNorm}}{g}({k('K')})", ctx.tokens(kv_heads, d_head), "k_norm"),
        Step(rf"{q('Q^{R}_t')}=[\operatorname{{RoPE}}({qh}{rot},{ctx_colour('R_t')});\ {qh}_{{t,\,{ro.dim}:}}]",
             ctx.tokens(heads, d_head), "q-rotate"),
        Step(rf"{k('K^{R}_t')}=[\operatorname{{RoPE}}({kh_}{rot},{ctx_colour('R_t')});\ {kh_}_{{t,\,{ro.dim}:}}]",
             ctx.tokens(kv_heads, d_head), "k-rotate"),
        *by["scores"].steps,
        # the heads' outputs O_h are laid side by side as the gates G_h are, then gated feature by feature
        Step(rf"{gated_O}=[{ctx_colour('O_1')};\dots;{ctx_colour(f'O_{{{n}}}')}]\odot\sigma([G_1;\dots;G_{{{n}}}])",
             ctx.tokens(Dim("heads·d_head", n * hd)), "gate"),
        by["o_proj"].steps[0],
    )
    return Component(
        key="attn", title="Gated grouped-query attention", kind="learned",
        code=f"{ctx.reference.prefix}Attention(config, layer_idx)",
        description=f"{n} query heads of {hd} features attend over {kvh} key/value heads; queries and keys are "
                    f"RMS-normalised per head, only the first {ro.dim} of {hd} features rotate, and each head's output "
                    "is multiplied by a sigmoid gate computed from the token.",
        inputs=(x, Port(ctx_colour("R"), by["rope"].outputs[0].shape, "R"), by["scores"].inputs[3]),
        outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=headline_steps(steps, ("q-rotate", "gate", "o_proj")), steps=steps, children=tuple(children), citations=citations,
        program="gated_attention", options=GatedAttentionOptions(n, kvh, hd, options(by["q_norm"], NormOptions)),
        extras=(("rotary features per head", f"{ro.dim} of {hd}"),),
        notes=("The query projection's output is laid out per head: the head's query features, then its gates.",
               *notes),
    )


@program("gated_attention", role="Attention", token_mixer=True, gated_output=True, mask_pattern=scores_mask)
def run_gated_attention(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor,
                        M: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, GatedAttentionOptions)
    B_, T_, _ = x.shape
    qg = run_child(comp, "q_proj", run, x).view(B_, T_, o.heads, 2 * o.head_dim)      # [B, T, H, 2·d_head]
    Q, G = qg[..., :o.head_dim], qg[..., o.head_dim:]
    run.rec("heads", Q)
    K = run_child(comp, "k_proj", run, x).view(B_, T_, o.kv_heads, o.head_dim)       # [B, T, H_kv, d_head]
    V = run_child(comp, "v_proj", run, x).view(B_, T_, o.kv_heads, o.head_dim)
    Q = apply_norm(run, "q_norm", Q, o.qk_norm, "q_norm.")
    K = apply_norm(run, "k_norm", K, o.qk_norm, "k_norm.")
    ro = options(comp.child("rope"), RopeOptions)
    Q = run.rec("q-rotate", rotate(Q, angles, ro))  # partial rotary: the features after the first ro.dim pass
    K = run.rec("k-rotate", rotate(K, angles, ro))
    O = attend(run, options(comp.child("scores"), ScoresOptions), Q, K, V, M)        # [B, T, H, d_head]
    gated = run.rec("gate", output_gate(O.reshape(B_, T_, -1), G.reshape(B_, T_, -1)))
    return [run_child(comp, "o_proj", run, gated)]


REFERENCE_CALLS["gated_attention"] = call_with_rotary
"""The reference layer takes the rotary cos/sin and the mask as the plain attention's does."""

__all__ = ["gated_attention", "GatedAttentionOptions", "output_gate"]


layer_memory("gated_attention")(plain_memory)  # K and V of each key/value head, as plain attention caches them
