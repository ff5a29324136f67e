"""Grouped-query attention with a sigmoid gate per head (Step-3.7-Flash): a projection of its own, g_proj, gives
each token one gate logit per query head, and every head's output is multiplied by the sigmoid of its gate before
the output projection. Queries and keys are RMS-normalised per head before the rotation; the head count is set per
layer kind (the sliding layers may have their own, num_sliding_attention_heads), so every size here comes from the
layer kind's LayerShape, each a formula in the config's own keys.

Unlike Qwen3.5's gated attention (gated_attention.py), whose query projection also yields one gate per output
feature, the gate here is one scalar per head and token, from a separate bias-free projection of hidden_size to
heads outputs.

References: "Gated Attention for Large Language Models: Non-linearity, Sparsity, and Attention-Sink-Free"
(Qiu et al., arXiv:2505.06708), which compares head-wise and element-wise sigmoid gates after the attention;
transformers' models/step3p7/modeling_step3p7.py (Step3p7Attention), the reference this is checked against.
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
    attention_title,
    call_with_rotary,
    headline_steps,
    per_head_qk_norms,
    plain_memory,
    scores,
)
from explorer.model.components.base import REFERENCE_CALLS, Ctx, Run, ctx_colour, k, options, program, q, run_child, v
from explorer.model.components.layer_attention import LayerShape
from explorer.model.components.linear import linear
from explorer.model.components.norms import GAIN_SUBSCRIPT, NormOptions, apply_norm
from explorer.model.components.rope import RopeOptions, rope, rotate
from explorer.model.components.serving import layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step

GATE = r"g^{\mathrm{head}}"
"""The head gates' logits (g^head_h for head h): named apart from a SwiGLU's gate g, which the same block shows."""


@dataclass(frozen=True, slots=True)
class HeadGatedAttentionOptions:
    heads: int
    kv_heads: int
    head_dim: int
    qk_norm: NormOptions


def head_gate(O: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Õ_h = σ(g_h) O_h: each head's whole output [B, T, H, d_head] scaled by its own gate G [B, T, H] in (0, 1)."""
    return O * torch.sigmoid(G)[..., None]


def head_gated_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, shape: LayerShape,
                         rope_options: RopeOptions, scale: float, window: int | None, norm: NormOptions,
                         citations: tuple[Citation, ...], scale_latex: str, rope_reference: str = "model.rotary_emb",
                         title: str = "") -> Component:
    """q, k, v and the head gate g from the token; per-head QK-norm, rotation, masked softmax attention over the
    layer kind's heads; each head's output times σ(g_h); the output projection."""
    H, Hkv, D, _ = shape.formulas
    n, kvh, hd = shape.heads, shape.kv_heads, shape.qk_head_dim
    heads, kv_heads, d_head = Dim("heads", n), Dim("kv_heads", kvh), Dim("d_head", hd)
    d = ctx.size("hidden_size")

    def proj(key: str, title_: str, d_out, out_dim: Dim, latex: str, what: str) -> Component:
        return linear(ctx, key, title_, weight=prefix + key + ".weight", ranges=ranges, d_in="hidden_size",
                      d_out=d_out, out_dim=out_dim, x=x, y=Port(latex, ctx.tokens(out_dim), key[0]),
                      equation=rf"{latex}={x.latex}W_{{{key[0].upper()}}}", description=f"Project {d:,} features to "
                      f"{what}.", code=f"self.{key}(hidden_states)")

    children = [
        proj("q_proj", "Query projection", H * D, Dim("heads·d_head", n * hd), q("q"),
             f"{n} query heads of {hd} ({n * hd:,} outputs)"),
        proj("k_proj", "Key projection", Hkv * D, Dim("kv_heads·d_head", kvh * hd), k("k"),
             f"{kvh} key heads of {hd} ({kvh * hd:,} outputs)"),
        proj("v_proj", "Value projection", Hkv * D, Dim("kv_heads·d_head", kvh * hd), v("v"),
             f"{kvh} value heads of {hd} ({kvh * hd:,} outputs)"),
        proj("g_proj", "Head-gate projection", H, heads, GATE, f"one gate logit for each of the {n} query heads"),
    ]
    children += per_head_qk_norms(ctx, prefix=prefix, ranges=ranges, heads=heads, kv_heads=kv_heads, d_head=d_head,
                                  eps=norm.eps, gain=norm.gain, size=str(D))
    children.append(replace(rope(ctx, rope_options, code=f"{ctx.reference.prefix}RotaryEmbedding(config)"),
                            reference=rope_reference))
    so = ScoresOptions(n, kvh, scale, window)
    groups = f"; each key/value head serves {so.groups} query heads" if so.groups > 1 else ""
    children.append(scores(ctx, so, d_qk=hd, d_v=hd, scale_latex=scale_latex,
                           description=f"Causal softmax attention of {n} query heads over {hd}-dimensional dot "
                                       f"products{groups}.", citations=citations[:1], weight_prefix=prefix,
                           ranges=ranges, q_in="Q^{R}", k_in="K^{R}"))
    gated_O = ctx_colour(r"\tilde O")
    children.append(linear(ctx, "o_proj", "Output projection", weight=prefix + "o_proj.weight", ranges=ranges,
                           d_in=H * D, d_out="hidden_size", out_dim=ctx.dim("hidden_size"),
                           x=Port(gated_O, ctx.tokens(Dim("heads·d_head", n * hd)), "O_gated"),
                           y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                           equation=rf"\Delta_{{\mathrm{{attn}}}}=[{gated_O}_1;\dots;{gated_O}_{{{n}}}]W_{{O}}",
                           description=f"Mix the {n} gated heads ({n * hd:,} features) back to {d:,} features.",
                           code="self.o_proj(attn_output)"))
    steps = _steps(ctx, children, heads, kv_heads, d_head, norm)
    what = f"within a sliding window of {window:,} positions" if window else "over every earlier position"
    return Component(
        key="attn", title=title or attention_title(n, kvh) + " with head gates", kind="learned",
        code=f"{ctx.reference.prefix}Attention(config, layer_idx)",
        description=f"{n} query heads of {hd} features attend over {kvh} key/value heads {what}; queries and keys "
                    "are RMS-normalised per head before the rotation, and each head's output is multiplied by a "
                    "sigmoid gate that g_proj computes from the token, one per head.",
        inputs=(x, Port(ctx_colour("R"), children[-3].outputs[0].shape, "R"), children[-2].inputs[3]),
        outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=headline_steps(steps, ("head-gate", "o_proj")), steps=steps, children=tuple(children),
        citations=citations, program="head_gated_attention",
        options=HeadGatedAttentionOptions(n, kvh, hd, norm),
        extras=(("query heads in this layer kind", f"{n}"), ("head gates", f"{n} (one per query head)")),
        notes=("The gate is one scalar per head and token (σ of a g_proj output), not one per feature: it scales the "
               "head's whole output.",),
    )


def _steps(ctx: Ctx, children: list[Component], heads: Dim, kv_heads: Dim, d_head: Dim,
           norm: NormOptions) -> tuple[Step, ...]:
    by = {c.key: c for c in children}
    g = GAIN_SUBSCRIPT[norm.gain]
    qh, kh = q(r"\hat Q"), k(r"\hat K")
    gated_O = ctx_colour(r"\tilde O")
    n = heads.size
    return (
        by["q_proj"].steps[0], by["k_proj"].steps[0], by["v_proj"].steps[0], by["g_proj"].steps[0],
        Step(rf"{q('Q')},{k('K')},{v('V')}=\operatorname{{reshape}}({q('q')}),\operatorname{{reshape}}({k('k')}),"
             rf"\operatorname{{reshape}}({v('v')})", ctx.tokens(heads, d_head), "heads"),
        Step(rf"{qh}=\operatorname{{RMSNorm}}{g}({q('Q')})", ctx.tokens(heads, d_head), "q_norm"),
        Step(rf"{kh}=\operatorname{{RMSNorm}}{g}({k('K')})", ctx.tokens(kv_heads, d_head), "k_norm"),
        Step(rf"{q('Q^{R}_t')}=\operatorname{{RoPE}}({qh}_t,{ctx_colour('R_t')})", ctx.tokens(heads, d_head),
             "q-rotate"),
        Step(rf"{k('K^{R}_t')}=\operatorname{{RoPE}}({kh}_t,{ctx_colour('R_t')})", ctx.tokens(kv_heads, d_head),
             "k-rotate"),
        *by["scores"].steps,
        Step(rf"{gated_O}_h=\sigma({GATE}_h)\,{ctx_colour('O_h')}\quad(h=1,\dots,{n})", ctx.tokens(heads, d_head),
             "head-gate"),
        by["o_proj"].steps[0],
    )


@program("head_gated_attention", role="Attention", token_mixer=True, gated_output=True, layout="rotary-attention")
def run_head_gated_attention(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor,
                             M: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, HeadGatedAttentionOptions)
    B_, T_, _ = x.shape
    Q = run_child(comp, "q_proj", run, x).view(B_, T_, o.heads, o.head_dim)          # [B, T, H, d_head]
    K = run_child(comp, "k_proj", run, x).view(B_, T_, o.kv_heads, o.head_dim)       # [B, T, H_kv, d_head]
    V = run_child(comp, "v_proj", run, x).view(B_, T_, o.kv_heads, o.head_dim)
    G = run_child(comp, "g_proj", run, x)                                              # [B, T, H]
    run.rec("heads", Q)
    Q = apply_norm(run, "q_norm", Q, o.qk_norm, "q_norm.")
    K = apply_norm(run, "k_norm", K, o.qk_norm, "k_norm.")
    ro = options(comp.child("rope"), RopeOptions)
    Q = run.rec("q-rotate", rotate(Q, angles, ro))
    K = run.rec("k-rotate", rotate(K, angles, ro))
    O = attend(run, options(comp.child("scores"), ScoresOptions), Q, K, V, M)        # [B, T, H, d_head]
    gated = run.rec("head-gate", head_gate(O, G))
    return [run_child(comp, "o_proj", run, gated.reshape(B_, T_, o.heads * o.head_dim))]


REFERENCE_CALLS["head_gated_attention"] = call_with_rotary
"""The reference layer takes the rotary cos/sin of its layer type and the mask, as plain attention does."""

layer_memory("head_gated_attention")(plain_memory)
"""K and V of each key/value head at head_dim (the gate is recomputed from the token: nothing of it is cached), the
window's positions on a sliding layer; the FLOPs per key count this layer kind's own query heads."""

__all__ = ["HeadGatedAttentionOptions", "head_gate", "head_gated_attention"]
