"""Attention whose shape and mechanisms are set per layer kind: head counts and head widths that differ between
layer kinds, each a formula in the config's sizes (Gemma 4's global layers: 2 key heads of 512 beside sliding
layers' 8 of 256; MiMo-V2-Flash's sliding layers keep twice the key/value heads of its global layers, and its value
heads are narrower than its query/key heads), keys that double as values, NoPE layers (no rotation, optionally a
query temperature), QK-norm as an RMSNorm with a gain per head or across all heads before the rotation (MiniMax-M2
normalises the whole query and the whole key projection, before the split into heads) or as a weightless L2 norm
after it, values scaled to unit RMS or by a constant, sink logits, and a mask that is causal, a sliding window or a
chunk.

One options class and one program serve every family; `part` names the library part a layer is listed under
("shaped_attention": MiniMax-M2, MiMo-V2-Flash; "layer_attention": Gemma 4, Llama 4). The parts differ in their
scores child (attention.py's scores, with sink logits, against this module's, with a chunk and the normed q and k
named) and in their pages' wording, not in what the program computes.

References: "Attention Is All You Need" (arXiv:1706.03762); GQA (arXiv:2305.13245); transformers'
models/llama4/modeling_llama4.py, models/gemma4/modeling_gemma4.py, models/minimax_m2/modeling_minimax_m2.py and
models/mimo_v2_flash/modeling_mimo_v2_flash.py (the reference modules this is checked against); the mechanism
modules chunked.py, nope.py, l2_qk_norm.py and keys_as_values.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Literal

import sympy

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components import attention, chunked, keys_as_values, l2_qk_norm, nope
from explorer.model.components.attention import (
    ScoresOptions,
    attention_title,
    headline_steps,
    per_head_qk_norms,
    repeat_kv_heads,
    window_mask,
)
from explorer.model.components.base import (
    B,
    Ctx,
    Run,
    ctx_colour,
    fmt_num,
    k,
    options,
    program,
    q,
    run_child,
    v,
)
from explorer.model.components.linear import linear
from explorer.model.components.norms import GAIN_SUBSCRIPT, NormOptions, apply_norm, rmsnorm
from explorer.model.components.rope import RopeOptions, rope, rotate
from explorer.model.components.serving import LayerKind, layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step

QUERIES, KEYS = Dim("queries", symbol="T"), Dim("keys", symbol="T")
QKNorm = Literal["none", "per_head", "across_heads", "l2"]
Part = Literal["layer_attention", "shaped_attention"]
SHAPED_ATTENTION: Final[Part] = "shaped_attention"
"""The part a family asks for when its attention's heads are shaped on their own (`part=SHAPED_ATTENTION`)."""


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One layer kind's attention sizes, and the formulas in config symbols they come from (so the ledger and the
    memory figures read in that kind's own keys: global_head_dim, num_global_key_value_heads)."""

    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    formulas: tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]
    """heads, kv_heads, qk_head_dim, v_head_dim as formulas."""

    @classmethod
    def of(cls, ctx: Ctx, heads: sympy.Expr, kv_heads: sympy.Expr, qk_head_dim: sympy.Expr,
           v_head_dim: sympy.Expr | None = None) -> LayerShape:
        """The sizes of these formulas under ctx's config; values as wide as queries and keys unless v_head_dim."""
        formulas = (heads, kv_heads, qk_head_dim, qk_head_dim if v_head_dim is None else v_head_dim)
        n, kvh, dqk, dv = (ctx.size(f) for f in formulas)
        return cls(n, kvh, dqk, dv, formulas)

    @property
    def groups(self) -> int:
        return self.heads // self.kv_heads


@dataclass(frozen=True, slots=True)
class LayerAttentionOptions:
    shape: LayerShape
    scale: float
    """The softmax scale τ (1/√d_head, or 1 where the QK-norm already fixes the scores' scale)."""
    rope: bool = True
    """False: a NoPE layer (no rotation)."""
    qk_norm: QKNorm = "none"
    """per_head: an RMSNorm with a gain over each head, before the rotation; across_heads: one over each whole
    projection, before the split into heads; l2: weightless, per head, after the rotation."""
    norm: NormOptions | None = None
    """The RMS QK-norm's options (its q_norm child's; the program applies them to the keys as well)."""
    eps: float = 1e-6
    """The weightless norms' eps (the value norm's and the L2 QK-norm's)."""
    keys_as_values: bool = False
    value_norm: bool = False
    """Scale values to unit RMS, no gain (Gemma 4's v_norm)."""
    value_scale: float = 1.0
    """Values are multiplied by this constant before the weighted sum (MiMo-V2-Flash's attention_value_scale)."""
    window: int | None = None
    """Sliding window: a query attends to the `window` most recent keys (itself included)."""
    chunk: int | None = None
    temperature: nope.Temperature | None = None
    sinks: str = ""
    """The learned sink logits' tensor name ("" for none): one per head joins each softmax row as an extra column."""
    part: Part = "layer_attention"
    """The library part the layer is listed under: its scores child and its page's wording (see the module doc)."""

    @property
    def cache_formula(self) -> str:
        """"2 × num_key_value_heads × head_dim"; "… × (head_dim + v_head_dim)" with value heads of their own
        width. Keys that double as values are still cached twice: normalised and rotated as keys, normalised
        differently as values (keys_as_values.py), as the reference's cache holds them."""
        _, kv, dqk, dv = self.shape.formulas
        kv_text = str(kv).replace("*", " × ")
        if dqk == dv:
            return f"2 × {kv_text} × {dqk}"
        return f"{kv_text} × ({dqk} + {dv})"


@dataclass(frozen=True, slots=True)
class MaskOptions:
    window: int | None = None
    chunk: int | None = None


def mask(M: torch.Tensor, o: LayerAttentionOptions | MaskOptions) -> torch.Tensor:
    return chunked.chunk_mask(window_mask(M, o.window), o.chunk)


def _mask_step(o: LayerAttentionOptions) -> Step | None:
    if o.chunk:
        return chunked.chunk_step(o.chunk)
    if o.window:
        return Step(rf"M_{{ts}}=\begin{{cases}}0 & 0\le t-s<{o.window:,}\\ -\infty & \text{{otherwise}}\end{{cases}}",
                    Shape((QUERIES, KEYS)), "window")
    return None


# ------------------------------------------------------------------------------------------------ spec

@dataclass(frozen=True, slots=True)
class _Dims:
    heads: Dim
    kv_heads: Dim
    d_qk: Dim
    d_v: Dim


def layer_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: LayerAttentionOptions,
                    rope_options: RopeOptions | None, citations: tuple[Citation, ...], code: str = "",
                    rope_reference: str = "model.rotary_emb", title: str = "") -> Component:
    """q, k (and v) projections of this layer kind's shape, the norms and rotation it asks for, masked softmax
    attention, and the output projection. code: the reference module's constructor (default: the reference's
    Attention)."""
    s, shaped = o.shape, o.part == "shaped_attention"
    dims = _Dims(Dim("heads", s.heads), Dim("kv_heads", s.kv_heads), Dim("d_head", s.qk_head_dim),
                 Dim("d_v" if shaped else "d_head", s.v_head_dim))
    children = _projections(ctx, o, prefix, ranges, x) + _qk_norms(ctx, o, prefix, ranges, dims)
    if rope_options is not None and o.rope:
        children.append(replace(rope(ctx, rope_options, code=f"{ctx.reference.prefix}RotaryEmbedding(config)"),
                                reference=rope_reference))
    children.append(_library_scores(ctx, o, prefix, ranges, citations[:1]) if shaped else
                    _scores(ctx, o, dims, citations[:1], _final_names(o, rope_options is not None)))
    children.append(_output(ctx, o, prefix, ranges, x))
    rope_c = next((c for c in children if c.program == "rope"), None)
    scores_c = next(c for c in children if c.key == "scores")
    # A layer that rotates nothing (Llama 4's NoPE layers) takes no angles: its page lists only what its steps read.
    inputs = (x, scores_c.inputs[3]) if rope_c is None else (x, rope_c.outputs[0], scores_c.inputs[3])
    steps = _steps(ctx, o, children, dims)
    return Component(
        key="attn", title=title or _title(o), kind="learned", code=code or f"{ctx.reference.prefix}Attention(config, "
        "layer_idx)", description=_describe_shaped(o, rope_options) if shaped else _describe(o),
        inputs=inputs, outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=headline_steps(steps, attention.DISTINCTIVE_STEPS + _partial_rotation(steps)), steps=steps,
        children=tuple(children),
        citations=citations + ((keys_as_values.CITATION,) if o.keys_as_values else ())
        + ((chunked.MASK_CITATION,) if o.chunk else ()),
        program=o.part, options=o, extras=_extras(o),
    )


def _projections(ctx: Ctx, o: LayerAttentionOptions, prefix: str, ranges: tuple[IndexRange, ...],
                 x: Port) -> list[Component]:
    """q_proj, k_proj and (unless the keys double as values) v_proj, each to its heads at their width."""
    s, shaped = o.shape, o.part == "shaped_attention"
    H, Hkv, Dqk, Dv = s.formulas
    d = ctx.size("hidden_size")
    rows = [("q", "Query", q, H * Dqk, "heads·d_head", s.heads, s.qk_head_dim),
            ("k", "Key", k, Hkv * Dqk, "kv_heads·d_head", s.kv_heads, s.qk_head_dim)]
    if not o.keys_as_values:
        rows.append(("v", "Value", v, Hkv * Dv, "kv_heads·d_v" if shaped else "kv_heads·d_head", s.kv_heads,
                     s.v_head_dim))
    out = []
    for key, name, colour, width, label, count, hd in rows:
        out_dim = Dim(label, count * hd)
        latex = colour(key)
        title = f"{name} projection" + (" (keys double as values)" if key == "k" and o.keys_as_values else "")
        out.append(linear(ctx, f"{key}_proj", title, weight=f"{prefix}{key}_proj.weight", ranges=ranges,
                          d_in="hidden_size", d_out=width, out_dim=out_dim, x=x,
                          y=Port(latex, ctx.tokens(out_dim), key if shaped else latex),
                          equation=rf"{latex}={x.latex}W_{{{key.upper()}}}", code=f"self.{key}_proj(hidden_states)",
                          description=f"Project {d:,} features to {count} {name.lower()} heads of {hd} "
                                      f"({count * hd:,} outputs)."))
    return out


def _qk_norms(ctx: Ctx, o: LayerAttentionOptions, prefix: str, ranges: tuple[IndexRange, ...],
              dims: _Dims) -> list[Component]:
    if o.qk_norm not in ("per_head", "across_heads") or o.norm is None:
        return []
    if o.qk_norm == "per_head":
        return per_head_qk_norms(ctx, prefix=prefix, ranges=ranges, heads=dims.heads, kv_heads=dims.kv_heads,
                                 d_head=dims.d_qk, eps=o.norm.eps, gain=o.norm.gain, size=str(o.shape.formulas[2]),
                                 code="self.{key}(...)")
    return [_across_heads_norm(ctx, o, key, prefix, ranges) for key in ("q", "k")]


def _across_heads_norm(ctx: Ctx, o: LayerAttentionOptions, s: str, prefix: str,
                       ranges: tuple[IndexRange, ...]) -> Component:
    """The query's or key's RMSNorm over the whole projection (all heads at once, before the split into heads)."""
    assert o.norm is not None
    colour, name = (q, "Query") if s == "q" else (k, "Key")
    heads_f = o.shape.formulas[0 if s == "q" else 1]
    count = o.shape.heads if s == "q" else o.shape.kv_heads
    width = Dim("heads·d_head" if s == "q" else "kv_heads·d_head", count * o.shape.qk_head_dim)
    shape = ctx.tokens(width)
    norm = rmsnorm(ctx, f"{s}_norm", f"{name} RMSNorm (across all heads)", weight=f"{prefix}{s}_norm.weight",
                   ranges=ranges, size="hidden_size", x=Port(colour(s), shape, s),
                   y=Port(colour(rf"\hat {s}"), shape, s + "_hat"), code=f"self.{s}_norm(self.{s}_proj(hidden_states))",
                   eps=o.norm.eps, gain=o.norm.gain)
    what = (f"the whole {width.size:,}-feature {name.lower()} projection (all {count} heads together, before the "
            "split into heads)")
    return replace(norm, tensors=(ctx.tensor(f"{prefix}{s}_norm.weight", ranges, (heads_f * o.shape.formulas[2],)),),
                   description=f"Scale {what} to unit root mean square, then by a learned gain of {width.size:,} "
                               "features.")


def _output(ctx: Ctx, o: LayerAttentionOptions, prefix: str, ranges: tuple[IndexRange, ...], x: Port) -> Component:
    s = o.shape
    n, width = s.heads, s.heads * s.v_head_dim
    label = "heads·d_v" if o.part == "shaped_attention" else "heads·d_head"
    o_in = Port(ctx_colour("O"), ctx.tokens(Dim(label, width)), "O")
    return linear(ctx, "o_proj", "Output projection", weight=prefix + "o_proj.weight", ranges=ranges,
                  d_in=s.formulas[0] * s.formulas[3], d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=o_in,
                  y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                  equation=rf"\Delta_{{\mathrm{{attn}}}}=[{ctx_colour('O_1')};\dots;"
                           rf"{ctx_colour(f'O_{{{n}}}')}]W_{{O}}",
                  description=f"Mix the {n} heads' outputs ({width:,} features) back to {ctx.size('hidden_size'):,} "
                              "features.",
                  code="self.o_proj(attn_output)")


def _extras(o: LayerAttentionOptions) -> tuple[tuple[str, str], ...]:
    s = o.shape
    if o.part == "shaped_attention":
        return (("query / key head width", f"{s.qk_head_dim}"), ("value head width", f"{s.v_head_dim}"))
    return ((("heads / key-value heads / head width", f"{s.heads} / {s.kv_heads} / {s.qk_head_dim}"),)
            + ((("positions", "none (NoPE layer)"),) if not o.rope else ()))


def _title(o: LayerAttentionOptions) -> str:
    s = o.shape
    if o.part == "shaped_attention":
        return attention_title(s.heads, s.kv_heads)
    if o.keys_as_values:
        return "Attention with keys as values"
    if not o.rope:
        return "NoPE attention"
    if o.chunk:
        return "Chunked attention"
    if o.window:
        return "Sliding-window attention"
    return "Grouped-query attention"


def _describe(o: LayerAttentionOptions) -> str:
    s = o.shape
    parts = [f"{s.heads} query heads of {s.qk_head_dim} features over {s.kv_heads} key/value head"
             f"{'s' if s.kv_heads > 1 else ''}"]
    if o.keys_as_values:
        parts.append("no value projection: each key head also serves as its value head")
    if not o.rope:
        parts.append("no positional encoding (NoPE): order comes from the causal mask alone")
    if o.temperature is not None:
        parts.append("queries scaled by a temperature that grows with the position")
    if o.qk_norm == "l2":
        parts.append("queries and keys scaled to unit RMS (no gain) after the rotation")
    if o.chunk:
        parts.append(f"each query sees only its own chunk of {o.chunk:,} positions")
    if o.window:
        parts.append(f"a sliding window of {o.window:,} positions")
    return "; ".join(parts) + "."


def _describe_shaped(o: LayerAttentionOptions, ro: RopeOptions | None) -> str:
    s = o.shape
    parts = [f"{s.heads} query heads of {s.qk_head_dim} features attend over {s.kv_heads} key/value "
             f"head{'s' if s.kv_heads > 1 else ''}"]
    if s.v_head_dim != s.qk_head_dim:
        parts.append(f"whose values are {s.v_head_dim} wide")
    if o.window:
        parts.append(f"within a sliding window of {o.window:,} positions")
    text = ", ".join(parts)
    if o.sinks:
        text += ", with a learned sink logit per head"
    if o.qk_norm in ("per_head", "across_heads"):
        text += "; queries and keys are RMS-normalised " + ("across all heads, before the split into heads"
                                                          if o.qk_norm == "across_heads" else "per head")
    if ro is not None and ro.unrotated_tail:
        text += f"; RoPE rotates the first {ro.dim} of {ro.head_width} query/key features"
    if o.value_scale != 1.0:
        text += f"; values are scaled by {fmt_num(o.value_scale)}"
    return text + "."


def _final_names(o: LayerAttentionOptions, rotates: bool) -> tuple[str, str, str]:
    """The symbols of q, k and v as the scores read them, after every norm, rotation and scale the layer applies
    (so the scores' steps consume what the steps before them produced)."""
    Q, K = ("Q", "K") if o.qk_norm != "per_head" else (r"\hat Q", r"\hat K")
    if o.rope and rotates:
        Q, K = "Q^{R}", "K^{R}"
    if o.qk_norm == "l2":
        Q, K = r"\bar Q", r"\bar K"
    if o.temperature is not None:
        Q = r"Q^{\tau}"
    return Q, K, (r"\hat V" if o.value_norm else "V")


def scores_options(o: LayerAttentionOptions) -> ScoresOptions:
    """The options of attention.py's scores child (the shaped_attention part's): the KV repeat, scale, window and
    sinks."""
    s = o.shape
    return ScoresOptions(s.heads, s.kv_heads, o.scale, o.window, sinks=bool(o.sinks), sink_name=o.sinks or "sinks")


def _library_scores(ctx: Ctx, o: LayerAttentionOptions, prefix: str, ranges: tuple[IndexRange, ...],
                    citations: tuple[Citation, ...]) -> Component:
    """attention.py's scores, which also know sink logits (a tensor of their own)."""
    s, so = o.shape, scores_options(o)
    dqk = s.qk_head_dim
    groups = f"; each key/value head serves {so.groups} query heads" if so.groups > 1 else ""
    return attention.scores(ctx, so, d_qk=dqk, d_v=s.v_head_dim,
                            scale_latex=rf"\tau=1/\sqrt{{{dqk}}}={so.scale:.6f}" if abs(so.scale - dqk ** -0.5) < 1e-12
                            else rf"\tau={so.scale:.6f}",
                            description=f"Causal softmax attention of {s.heads} query heads over {dqk}-dimensional "
                                        f"dot products, weighting {s.v_head_dim}-dimensional values{groups}.",
                            citations=citations, weight_prefix=prefix, ranges=ranges, q_in="Q^{R}", k_in="K^{R}")


def _scores(ctx: Ctx, o: LayerAttentionOptions, dims: _Dims, citations: tuple[Citation, ...],
            names: tuple[str, str, str]) -> Component:
    """This module's scores: the KV repeat, scale and a window or chunk mask, reading the normed, rotated q and k."""
    hd = o.shape.qk_head_dim
    heads, kv = dims.heads, dims.kv_heads
    Qn, Kn, Vn = names
    shape = Shape((B, heads, QUERIES, KEYS))
    scale = (rf"\tau=1/\sqrt{{{hd}}}={o.scale:.6f}" if abs(o.scale - hd ** -0.5) < 1e-12 else
             rf"\tau={o.scale:g}\quad\text{{(no }}1/\sqrt{{d}}\text{{: the normed q and k fix the scale)}}")
    steps = [Step(scale, None, "scale")]
    if o.shape.groups > 1:
        g = o.shape.groups
        steps.append(Step(rf"{k('K_h')}={k(Kn)}_{{\lceil h/{g}\rceil}},\quad {v('V_h')}={v(Vn)}_{{\lceil h/{g}\rceil}}",
                          ctx.tokens(heads, Dim("d_head", hd)), "repeat"))
    mask_step = _mask_step(o)
    if mask_step is not None:
        steps.append(mask_step)
    K_h, V_h = (k("K_h"), v("V_h")) if o.shape.groups > 1 else (k(Kn + "_h"), v(Vn + "_h"))
    steps += [Step(rf"A_h=\operatorname{{softmax}}\!\left(\tau\,{q(Qn + '_h')}{K_h}^{{\top}}+M\right)", shape, "softmax"),
              Step(rf"{ctx_colour('O_h')}=A_h{V_h}", ctx.tokens(heads, Dim("d_v", hd)), "context")]
    dq = Dim("d_head", hd)
    return Component(
        key="scores", title="Scaled dot-product scores", kind="computed",
        code="softmax(Q @ K.transpose(-1, -2) * scaling + mask) @ V",
        description=f"Causal softmax attention of {heads.size} query heads over {hd}-dimensional dot products"
                    + (f"; each key/value head serves {o.shape.groups} query heads" if o.shape.groups > 1 else "") + ".",
        inputs=(Port(q(Qn), ctx.tokens(heads, dq), "Q"), Port(k(Kn), ctx.tokens(kv, dq), "K"),
                Port(v(Vn), ctx.tokens(kv, dq), "V"), Port("M", Shape((QUERIES, KEYS)), "mask")),
        outputs=(Port(ctx_colour("O"), ctx.tokens(heads, Dim("d_v", hd)), "O"),),
        equations=tuple(steps[-2:]), steps=tuple(steps), citations=citations,
        extras=(("softmax scale", f"{o.scale:.6f}"),) + ((("chunk", f"{o.chunk:,} positions"),) if o.chunk else ())
        + ((("sliding window", f"{o.window:,} positions"),) if o.window else ()),
        row_label="Scores and softmax (computed)", program="layer_scores", options=o, reference="-",
    )


def _partial_rotation(steps: tuple[Step, ...]) -> tuple[str, ...]:
    """The query rotation's name where it turns only part of each head (a headline step then)."""
    return tuple(s.name for s in steps if s.name == "q-rotate" and "features rotate" in s.latex)


def _rotate_step(out: str, src: str, rotated: int, width: int | None, shape: Shape, name: str) -> Step:
    """RoPE of each head's features; where only the first `rotated` of `width` turn (MiniMax: 64 of 128), the
    step says so, the rest passing through."""
    if width is None or rotated >= width:
        return Step(rf"{out}=\operatorname{{RoPE}}({src}_t,{ctx_colour('R_t')})", shape, name)
    return Step(rf"{out}=[\operatorname{{RoPE}}({src}_{{t,\,:{rotated}}},{ctx_colour('R_t')});\ {src}_{{t,\,{rotated}:}}]"
                rf"\ \ \text{{({rotated} of {width} features rotate)}}", shape, name)


def _steps(ctx: Ctx, o: LayerAttentionOptions, children: list[Component], dims: _Dims) -> tuple[Step, ...]:
    by_key = {c.key: c for c in children}
    q_shape, kv_shape = ctx.tokens(dims.heads, dims.d_qk), ctx.tokens(dims.kv_heads, dims.d_qk)
    steps = [by_key[f"{s}_proj"].steps[0] for s in "qkv" if f"{s}_proj" in by_key]
    gain = GAIN_SUBSCRIPT[o.norm.gain] if o.norm is not None else ""
    src_q, src_k = q("q"), k("k")
    if o.qk_norm == "across_heads":  # one norm over each whole projection, before the split into heads
        q_hat, k_hat = q(r"\hat q"), k(r"\hat k")
        steps += [Step(rf"{q_hat}=\operatorname{{RMSNorm}}{gain}({src_q})", by_key["q_norm"].outputs[0].shape, "q_norm"),
                  Step(rf"{k_hat}=\operatorname{{RMSNorm}}{gain}({src_k})", by_key["k_norm"].outputs[0].shape, "k_norm")]
        src_q, src_k = q_hat, k_hat
    if "v_proj" in by_key:
        steps.append(Step(rf"{q('Q')}=\operatorname{{reshape}}({src_q}),\ {k('K')}=\operatorname{{reshape}}({src_k}),"
                          rf"\ {v('V')}=\operatorname{{reshape}}({v('v')})", q_shape, "heads"))
    else:
        steps.append(Step(rf"{q('Q')}=\operatorname{{reshape}}({src_q}),\ {k('K')}=\operatorname{{reshape}}({src_k})",
                          q_shape, "heads"))
        steps.append(keys_as_values.values_step(kv_shape))
    Qn, Kn = q("Q"), k("K")
    if o.qk_norm == "per_head":
        Q_hat, K_hat = q(r"\hat Q"), k(r"\hat K")
        steps += [Step(rf"{Q_hat}=\operatorname{{RMSNorm}}{gain}({Qn})", q_shape, "q_norm"),
                  Step(rf"{K_hat}=\operatorname{{RMSNorm}}{gain}({Kn})", kv_shape, "k_norm")]
        Qn, Kn = Q_hat, K_hat
    if o.value_norm:
        steps.append(l2_qk_norm.unit_rms_step(v(r"\hat V"), v("V"), o.eps, kv_shape, "v_norm"))
    if o.value_scale != 1.0:
        steps.append(Step(rf"{v('V')}\leftarrow {fmt_num(o.value_scale)}\,{v('V')}",
                          ctx.tokens(dims.kv_heads, dims.d_v), "v-scale"))
    if o.rope and "rope" in by_key:
        rotated = options(by_key["rope"], RopeOptions).dim
        steps += [_rotate_step(q('Q^{R}_t'), Qn, rotated, dims.d_qk.size, q_shape, "q-rotate"),
                  _rotate_step(k('K^{R}_t'), Kn, rotated, dims.d_qk.size, kv_shape, "k-rotate")]
        Qn, Kn = q("Q^{R}"), k("K^{R}")
    if o.qk_norm == "l2":
        steps += [l2_qk_norm.unit_rms_step(q(r"\bar Q"), Qn, o.eps, q_shape, "q-l2"),
                  l2_qk_norm.unit_rms_step(k(r"\bar K"), Kn, o.eps, kv_shape, "k-l2")]
    if o.temperature is not None:
        steps.append(nope.temperature_step(o.temperature, q_shape, Qn))
    # the scores open with τ's value, which the softmax step after it uses: kept in every list (issue 35)
    return tuple(steps + list(by_key["scores"].steps) + list(by_key["o_proj"].steps))


# --------------------------------------------------------------------------------------------- programs

def attend(run: Run, o: LayerAttentionOptions, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
           M: torch.Tensor) -> torch.Tensor:
    """softmax(τ Q Kᵀ + M) V per head, heads on axis 2 of [B, T, H, d]; KV heads repeated over their group."""
    if o.shape.groups > 1:
        K = run.rec("repeat", repeat_kv_heads(K, o.shape.groups, 2))                    # [B, T, H, d]
        V = repeat_kv_heads(V, o.shape.groups, 2)
    M = mask(M, o)
    if o.chunk:
        run.rec("chunk", M)
    elif o.window:
        run.rec("window", M)
    logits = torch.matmul(Q.transpose(1, 2), K.transpose(1, 2).transpose(-1, -2)) * o.scale + M  # [B, H, T, T]
    A = run.rec("softmax", F.softmax(logits, dim=-1, dtype=torch.float32).to(Q.dtype))
    return run.rec("context", torch.matmul(A, V.transpose(1, 2)).transpose(1, 2))          # [B, T, H, d]


@program("layer_scores")
def run_layer_scores(comp: Component, run: Run, Q, K, V, M) -> list[torch.Tensor]:
    return [attend(run, options(comp, LayerAttentionOptions), Q, K, V, M)]


def _attend_child(comp: Component, run: Run, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                  M: torch.Tensor) -> torch.Tensor:
    """The scores child's computation, recorded in the layer's own run (the layer's steps include the scores')."""
    scores_c = comp.child("scores")
    if scores_c.program == "scores":
        return attention.attend(run, options(scores_c, ScoresOptions), Q, K, V, M)   # [B, T, heads, d_v]
    return attend(run, options(scores_c, LayerAttentionOptions), Q, K, V, M)


@program("layer_attention", role="Attention", token_mixer=True, positions_from_child=True,
         reads_chunk=True, mask_pattern=attention.scores_mask)
@program("shaped_attention", role="Attention", token_mixer=True, layout="rotary-attention",
         mask_pattern=attention.scores_mask)
def run_layer_attention(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """rest: the rotary angles and the mask, or the mask alone (a layer that rotates nothing declares no angles; its
    block may still pass them)."""
    angles, M = (rest[0], rest[-1]) if len(rest) == 2 else (None, rest[-1])
    o = options(comp, LayerAttentionOptions)
    s = o.shape
    B_, T_, _ = x.shape
    q_, k_ = run_child(comp, "q_proj", run, x), run_child(comp, "k_proj", run, x)        # [B, T, heads·d_head], …
    v_ = None if o.keys_as_values else run_child(comp, "v_proj", run, x)                   # [B, T, kv_heads·d_v]
    if o.qk_norm == "across_heads" and o.norm is not None:
        q_ = apply_norm(run, "q_norm", q_, o.norm, "q_norm.")
        k_ = apply_norm(run, "k_norm", k_, o.norm, "k_norm.")
    Q = q_.view(B_, T_, s.heads, s.qk_head_dim)                                            # [B, T, H, d_head]
    K = k_.view(B_, T_, s.kv_heads, s.qk_head_dim)                                         # [B, T, H_kv, d_head]
    V = keys_as_values.values_from_keys(K) if v_ is None else v_.view(B_, T_, s.kv_heads, s.v_head_dim)
    run.rec("heads", Q)
    if o.keys_as_values:
        run.rec("values", V)
    if o.qk_norm == "per_head" and o.norm is not None:
        Q = apply_norm(run, "q_norm", Q, o.norm, "q_norm.")
        K = apply_norm(run, "k_norm", K, o.norm, "k_norm.")
    if o.value_norm:
        V = run.rec("v_norm", l2_qk_norm.unit_rms(V, o.eps))
    if o.value_scale != 1.0:
        V = run.rec("v-scale", V * o.value_scale)
    if o.rope and angles is not None and angles.shape[-1]:
        ro = options(comp.child("rope"), RopeOptions)
        Q = run.rec("q-rotate", rotate(Q, angles, ro))
        K = run.rec("k-rotate", rotate(K, angles, ro))
    if o.qk_norm == "l2":
        Q = run.rec("q-l2", l2_qk_norm.unit_rms(Q, o.eps))
        K = run.rec("k-l2", l2_qk_norm.unit_rms(K, o.eps))
    if o.temperature is not None:
        factors = nope.temperature_scales(torch.arange(T_, device=x.device), o.temperature)
        Q = run.rec("temperature", (Q * factors[None, :, None, None]).to(Q.dtype))
    O = _attend_child(comp, run, Q, K, V, M)                                               # [B, T, H, d_v]
    return [run.rec("attention", run_child(comp, "o_proj", run, O.reshape(B_, T_, s.heads * s.v_head_dim)))]


# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("layer_attention")
@layer_memory("shaped_attention")
def layer_memory_entry(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """K and V of each key/value head at their own widths, both also where the keys double as values (the reference
    caches the rotated keys and the differently normalised values); capped by the layer's window or chunk."""
    o = comp.options
    assert isinstance(o, LayerAttentionOptions)
    s = o.shape
    full = s.heads * (s.qk_head_dim + s.v_head_dim)
    cached = s.kv_heads * (s.qk_head_dim + s.v_head_dim)
    return (LayerKind(cached, o.cache_formula, values=s.kv_heads * s.v_head_dim, flops_per_key=2 * full,
                      mha_per_token=full, window=o.window, chunk=o.chunk, by_kind=True),)
