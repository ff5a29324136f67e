"""Attention whose shape each layer kind sets: the query and key/value head counts and the query/key and value head
widths are each a formula in the config's sizes, so one model's layer kinds may differ in all four (MiMo-V2-Flash's
sliding layers keep twice the key/value heads of its global layers, and its value heads are narrower than its
query/key heads). Options: QK-norm per head, or across all heads (MiniMax-M2 normalises the whole query and the
whole key projection with one RMSNorm each, before the split into heads); partial rotary (the rotary part's
head_dim); a constant scale on the values; the scores' window and sink logits (attention.py).

References: "Attention Is All You Need" (arXiv:1706.03762); GQA (arXiv:2305.13245); transformers'
models/minimax_m2/modeling_minimax_m2.py (QK-norm across heads, partial rotary) and
models/mimo_v2_flash/modeling_mimo_v2_flash.py (per-layer head counts, narrow value heads, value scale, sinks on
the sliding layers) for how the reference computes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import sympy

if TYPE_CHECKING:
    import torch

from ..spec.types import Citation, Component, Dim, IndexRange, Port, Step
from .attention import ScoresOptions, attend, call_with_rotary, scores
from .base import Ctx, Run, ctx_colour, fmt_num, k, options, program, q, reference_call, run_child, v
from .linear import linear
from .norms import NormOptions, apply_norm, rmsnorm
from .rope import RopeOptions, rope, rotate
from .serving import LayerKind, layer_memory, scores_child

QKNorm = Literal["none", "per_head", "across_heads"]


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """One layer kind's attention sizes, each a formula in config symbols (so the ledger shows it)."""

    heads: sympy.Expr
    kv_heads: sympy.Expr
    qk_head_dim: sympy.Expr
    v_head_dim: sympy.Expr


@dataclass(frozen=True, slots=True)
class ShapedAttentionOptions:
    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    qk_norm: QKNorm = "none"
    norm: NormOptions | None = None
    value_scale: float = 1.0
    """Values are multiplied by this constant before the weighted sum (MiMo-V2-Flash's attention_value_scale)."""
    cache_formula: str = ""
    """Elements one layer caches per token, as a formula in config keys (for the memory figures)."""

    @property
    def cache_per_token(self) -> int:
        """Keys and values of every key/value head: kv_heads × (qk_head_dim + v_head_dim)."""
        return self.kv_heads * (self.qk_head_dim + self.v_head_dim)


def cache_formula(shape: AttentionShape) -> str:
    """"2 × num_key_value_heads × head_dim", or with value heads of their own width "… × (head_dim + v_head_dim)"."""
    kv = str(shape.kv_heads).replace("*", " × ")
    if shape.qk_head_dim == shape.v_head_dim:
        return f"2 × {kv} × {shape.qk_head_dim}"
    return f"{kv} × ({shape.qk_head_dim} + {shape.v_head_dim})"


def shaped_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, shape: AttentionShape,
                     rope_options: RopeOptions, scores_options: ScoresOptions, citations: tuple[Citation, ...],
                     qk_norm: QKNorm = "none", norm_eps: float = 1e-6, value_scale: float = 1.0,
                     title: str = "") -> Component:
    """Attention with separate q, k, v projections whose head counts and widths are `shape`'s formulas."""
    so = scores_options
    n, kvh, dqk, dv = (ctx.size(e) for e in (shape.heads, shape.kv_heads, shape.qk_head_dim, shape.v_head_dim))
    heads, kv_heads = Dim("heads", n), Dim("kv_heads", kvh)
    d_qk, d_v = Dim("d_head", dqk), Dim("d_v", dv)
    d = ctx.size("hidden_size")
    widths = {"q": (shape.heads * shape.qk_head_dim, Dim("heads·d_head", n * dqk)),
              "k": (shape.kv_heads * shape.qk_head_dim, Dim("kv_heads·d_head", kvh * dqk)),
              "v": (shape.kv_heads * shape.v_head_dim, Dim("kv_heads·d_v", kvh * dv))}
    what = {"q": f"{n} query heads of {dqk} ({n * dqk:,} outputs)", "k": f"{kvh} key heads of {dqk} ({kvh * dqk:,} "
            "outputs)", "v": f"{kvh} value heads of {dv} ({kvh * dv:,} outputs)"}
    colour = {"q": q, "k": k, "v": v}
    children = [linear(ctx, f"{s}_proj", f"{name} projection", weight=f"{prefix}{s}_proj.weight", ranges=ranges,
                       d_in="hidden_size", d_out=widths[s][0], out_dim=widths[s][1], x=x,
                       y=Port(colour[s](s), ctx.tokens(widths[s][1]), s),
                       equation=rf"{colour[s](s)}={x.latex}W_{{{s.upper()}}}", code=f"self.{s}_proj(hidden_states)",
                       description=f"Project {d:,} features to {what[s]}.")
                for s, name in (("q", "Query"), ("k", "Key"), ("v", "Value"))]
    if qk_norm != "none":
        children += [_qk_norm(ctx, s, prefix, ranges, qk_norm, widths[s], heads if s == "q" else kv_heads, d_qk,
                              norm_eps) for s in ("q", "k")]
    children.append(rope(ctx, rope_options, code=f"{ctx.reference.prefix}RotaryEmbedding(config)"))
    groups = f"; each key/value head serves {so.groups} query heads" if so.groups > 1 else ""
    children.append(scores(ctx, so, d_qk=dqk, d_v=dv, scale_latex=rf"\tau=1/\sqrt{{{dqk}}}={so.scale:.6f}"
                           if abs(so.scale - dqk ** -0.5) < 1e-12 else rf"\tau={so.scale:.6f}",
                           description=f"Causal softmax attention of {n} query heads over {dqk}-dimensional dot "
                                       f"products, weighting {dv}-dimensional values{groups}.",
                           citations=citations[:1], weight_prefix=prefix, ranges=ranges, q_in="Q^{R}", k_in="K^{R}"))
    o_in = Port(ctx_colour("O"), ctx.tokens(Dim("heads·d_v", n * dv)), "O")
    children.append(linear(ctx, "o_proj", "Output projection", weight=prefix + "o_proj.weight", ranges=ranges,
                           d_in=shape.heads * shape.v_head_dim, d_out="hidden_size", out_dim=ctx.dim("hidden_size"),
                           x=o_in, y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                           equation=rf"\Delta_{{\mathrm{{attn}}}}=[{ctx_colour('O_1')};\dots;"
                                    rf"{ctx_colour(f'O_{{{n}}}')}]W_{{O}}",
                           description=f"Mix the {n} heads' outputs ({n * dv:,} features) back to {d:,} features.",
                           code="self.o_proj(attn_output)"))
    norm_opts = options(children[3], NormOptions) if qk_norm != "none" else None
    o = ShapedAttentionOptions(n, kvh, dqk, dv, qk_norm, norm_opts, value_scale, cache_formula(shape))
    kind = "multi-query" if kvh == 1 else ("grouped-query" if kvh < n else "multi-head")
    return Component(
        key="attn", title=title or f"{kind.capitalize()} attention", kind="learned",
        code=f"{ctx.reference.prefix}Attention(config, layer_idx)", description=_describe(o, so, rope_options),
        inputs=(x, Port(ctx_colour("R"), children[-3].outputs[0].shape, "R"), children[-2].inputs[3]),
        outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=(Step(r"\Delta_{\mathrm{attn}}=\operatorname{Attention}(x_{\mathrm{attn}})", x.shape, "attention"),),
        steps=_steps(ctx, children, o, heads, kv_heads, d_qk, d_v), children=tuple(children), citations=citations,
        program="shaped_attention", options=o,
        extras=(("query / key head width", f"{dqk}"), ("value head width", f"{dv}")),
    )


def _qk_norm(ctx: Ctx, s: str, prefix: str, ranges: tuple[IndexRange, ...], scope: QKNorm,
             width: tuple[sympy.Expr, Dim], h: Dim, d_qk: Dim, eps: float) -> Component:
    """The query's or key's RMSNorm: over each head's features, or over the whole projection (all heads at once)."""
    colour, letter = (q, "Q") if s == "q" else (k, "K")
    whole = scope == "across_heads"
    shape = ctx.tokens(width[1]) if whole else ctx.tokens(h, d_qk)
    name = "Query" if s == "q" else "Key"
    src = s if whole else letter
    norm = rmsnorm(ctx, f"{s}_norm", f"{name} RMSNorm ({'across all heads' if whole else 'per head'})",
                   weight=f"{prefix}{s}_norm.weight", ranges=ranges, size="hidden_size",
                   x=Port(colour(src), shape, src), y=Port(colour(rf"\hat {src}"), shape, src + "_hat"),
                   code=f"self.{s}_norm(self.{s}_proj(hidden_states))" if whole else f"self.{s}_norm(...view(hidden_shape))",
                   eps=eps)
    size = width[0] if whole else ctx.sym("head_dim")
    features = width[1].size if whole else d_qk.size
    what = (f"the whole {features:,}-feature {name.lower()} projection (all {h.size} heads together, before the "
            "split into heads)" if whole else f"each {features}-feature {name.lower()} head")
    return replace(norm, tensors=(ctx.tensor(f"{prefix}{s}_norm.weight", ranges, (size,)),),
                   description=f"Scale {what} to unit root mean square, then by a learned gain of {features:,} features.")


def _describe(o: ShapedAttentionOptions, so: ScoresOptions, ro: RopeOptions) -> str:
    parts = [f"{o.heads} query heads of {o.qk_head_dim} features attend over {o.kv_heads} key/value "
             f"head{'s' if o.kv_heads > 1 else ''}"]
    if o.v_head_dim != o.qk_head_dim:
        parts.append(f"whose values are {o.v_head_dim} wide")
    if so.window:
        parts.append(f"within a sliding window of {so.window:,} positions")
    text = ", ".join(parts)
    if so.sinks:
        text += ", with a learned sink logit per head"
    if o.qk_norm != "none":
        text += "; queries and keys are RMS-normalised " + ("across all heads, before the split into heads"
                                                          if o.qk_norm == "across_heads" else "per head")
    if ro.head_dim > ro.dim:
        text += f"; RoPE rotates the first {ro.dim} of {ro.head_dim} query/key features"
    if o.value_scale != 1.0:
        text += f"; values are scaled by {fmt_num(o.value_scale)}"
    return text + "."


def _steps(ctx: Ctx, children: list[Component], o: ShapedAttentionOptions, heads: Dim, kv_heads: Dim, d_qk: Dim,
           d_v: Dim) -> tuple[Step, ...]:
    by_key = {c.key: c for c in children}
    steps = [by_key["q_proj"].steps[0], by_key["k_proj"].steps[0], by_key["v_proj"].steps[0]]
    q_hat, k_hat, Q_hat, K_hat = q(r"\hat q"), k(r"\hat k"), q(r"\hat Q"), k(r"\hat K")
    src_q, src_k = q("q"), k("k")
    if o.qk_norm == "across_heads":  # one norm over each whole projection, before the split into heads
        steps += [Step(rf"{q_hat}=\operatorname{{RMSNorm}}({src_q})", by_key["q_norm"].outputs[0].shape, "q_norm"),
                  Step(rf"{k_hat}=\operatorname{{RMSNorm}}({src_k})", by_key["k_norm"].outputs[0].shape, "k_norm")]
        src_q, src_k = q_hat, k_hat
    steps.append(Step(rf"{q('Q')}=\operatorname{{reshape}}({src_q}),\ {k('K')}=\operatorname{{reshape}}({src_k}),\ "
                      rf"{v('V')}=\operatorname{{reshape}}({v('v')})", ctx.tokens(heads, d_qk), "heads"))
    Qn, Kn = q("Q"), k("K")
    if o.qk_norm == "per_head":
        steps += [Step(rf"{Q_hat}=\operatorname{{RMSNorm}}({Qn})", ctx.tokens(heads, d_qk), "q_norm"),
                  Step(rf"{K_hat}=\operatorname{{RMSNorm}}({Kn})", ctx.tokens(kv_heads, d_qk), "k_norm")]
        Qn, Kn = Q_hat, K_hat
    if o.value_scale != 1.0:
        steps.append(Step(rf"{v('V')}\leftarrow {fmt_num(o.value_scale)}\,{v('V')}", ctx.tokens(kv_heads, d_v),
                          "v-scale"))
    steps += [Step(rf"{q('Q^{R}_t')}=\operatorname{{RoPE}}({Qn}_t,{ctx_colour('R_t')})", ctx.tokens(heads, d_qk),
                   "q-rotate"),
              Step(rf"{k('K^{R}_t')}=\operatorname{{RoPE}}({Kn}_t,{ctx_colour('R_t')})", ctx.tokens(kv_heads, d_qk),
                   "k-rotate")]
    return tuple(steps + list(by_key["scores"].steps[1:]) + list(by_key["o_proj"].steps))


@program("shaped_attention", role="Attention")
def run_shaped_attention(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor,
                         M: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, ShapedAttentionOptions)
    B_, T_, _ = x.shape
    q_, k_, v_ = (run_child(comp, f"{s}_proj", run, x) for s in "qkv")
    if o.qk_norm == "across_heads" and o.norm is not None:
        q_ = apply_norm(run, "q_norm", q_, o.norm, "q_norm.")                       # [B, T, heads·d_head]
        k_ = apply_norm(run, "k_norm", k_, o.norm, "k_norm.")                       # [B, T, kv_heads·d_head]
    Q = run.rec("heads", q_.view(B_, T_, o.heads, o.qk_head_dim))                  # [B, T, heads, d_head]
    K = k_.view(B_, T_, o.kv_heads, o.qk_head_dim)                                 # [B, T, kv_heads, d_head]
    V = v_.view(B_, T_, o.kv_heads, o.v_head_dim)                                  # [B, T, kv_heads, d_v]
    if o.qk_norm == "per_head" and o.norm is not None:
        Q = apply_norm(run, "q_norm", Q, o.norm, "q_norm.")
        K = apply_norm(run, "k_norm", K, o.norm, "k_norm.")
    if o.value_scale != 1.0:
        V = run.rec("v-scale", V * o.value_scale)
    ro = options(comp.child("rope"), RopeOptions)
    Q = run.rec("q-rotate", rotate(Q, angles, ro))
    K = run.rec("k-rotate", rotate(K, angles, ro))
    O = attend(run, options(comp.child("scores"), ScoresOptions), Q, K, V, M)      # [B, T, heads, d_v]
    delta = run_child(comp, "o_proj", run, O.reshape(B_, T_, o.heads * o.v_head_dim))
    return [run.rec("attention", delta)]


reference_call("shaped_attention")(call_with_rotary)  # the reference layer takes cos/sin and its model's mask


# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("shaped_attention")
def shaped_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """K and V of each key/value head at this layer kind's own widths, with its own window."""
    a = comp.options
    assert isinstance(a, ShapedAttentionOptions)
    full = a.heads * (a.qk_head_dim + a.v_head_dim)
    return (LayerKind(a.cache_per_token, a.cache_formula, flops_per_key=2 * full, mha_per_token=full,
                      window=scores_child(comp).window, by_kind=True),)
