"""Attention whose shape and mechanisms are set per layer kind: head counts and head widths that differ between
layer kinds (Gemma 4's global layers: 2 key heads of 512 beside sliding layers' 8 of 256), keys that double as
values, NoPE layers (no rotation, optionally a query temperature), QK-norm as an RMSNorm with a gain before the
rotation or as a weightless L2 norm after it, and a mask that is causal, a sliding window or a chunk.

The sizes come from a `LayerShape` naming the config keys behind them, so the parameter formulas of each layer kind
read in that kind's own keys (global_head_dim, num_global_key_value_heads).

References: "Attention Is All You Need" (arXiv:1706.03762); GQA (arXiv:2305.13245); transformers'
models/llama4/modeling_llama4.py and models/gemma4/modeling_gemma4.py (the reference modules this is checked
against); the mechanism modules chunked.py, nope.py, l2_qk_norm.py and keys_as_values.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from ..torch_on_first_use import F, torch

from ..spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step
from . import chunked, keys_as_values, l2_qk_norm, nope
from .attention import repeat_kv_heads, window_mask
from .base import B, Ctx, Run, ctx_colour, k, options, program, q, reference_call, run_child, v
from .linear import linear
from .norms import GAIN_SUBSCRIPT, Gain, NormOptions, apply_norm, rmsnorm
from .rope import RopeOptions, reference_rotary, rope, rotate
from .serving import LayerKind, layer_memory

QUERIES, KEYS = Dim("queries", symbol="T"), Dim("keys", symbol="T")
QKNorm = Literal["none", "rms", "l2"]


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One layer kind's attention sizes and the config keys they come from."""

    heads: int
    kv_heads: int
    head_dim: int
    heads_key: str = "num_attention_heads"
    kv_heads_key: str = "num_key_value_heads"
    head_dim_key: str = "head_dim"

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
    """rms: per-head RMSNorm with a gain, before the rotation; l2: weightless, after it."""
    qk_gain: Gain = "w"
    eps: float = 1e-6
    keys_as_values: bool = False
    value_norm: bool = False
    """Scale values to unit RMS, no gain (Gemma 4's v_norm)."""
    window: int | None = None
    chunk: int | None = None
    temperature: nope.Temperature | None = None


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

def layer_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: LayerAttentionOptions,
                    rope_options: RopeOptions | None, citations: tuple[Citation, ...], code: str,
                    rope_reference: str = "model.rotary_emb", title: str = "") -> Component:
    """q, k (and v) projections of this layer kind's shape, the norms and rotation it asks for, masked softmax
    attention, and the output projection."""
    s = o.shape
    n, kvh, hd = s.heads, s.kv_heads, s.head_dim
    heads, kv_heads, d_head = Dim("heads", n), Dim("kv_heads", kvh), Dim("d_head", hd)
    H, Hkv, D = ctx.sym(s.heads_key), ctx.sym(s.kv_heads_key), ctx.sym(s.head_dim_key)
    d = ctx.size("hidden_size")

    def proj(key: str, title_: str, out_heads, count: int, latex: str, what: str) -> Component:
        out_dim = Dim("heads·d_head" if key == "q_proj" else "kv_heads·d_head", count * hd)
        return linear(ctx, key, title_, weight=prefix + key + ".weight", ranges=ranges, d_in="hidden_size",
                      d_out=out_heads * D, out_dim=out_dim, x=x, y=Port(latex, ctx.tokens(out_dim), latex),
                      equation=rf"{latex}={x.latex}W_{{{key[0].upper()}}}", code=f"self.{key}(hidden_states)",
                      description=f"Project {d:,} features to {count} {what} heads of {hd} ({count * hd:,} outputs).")

    children = [proj("q_proj", "Query projection", H, n, q("q"), "query"),
                proj("k_proj", "Key projection" + (" (keys double as values)" if o.keys_as_values else ""),
                     Hkv, kvh, k("k"), "key")]
    if not o.keys_as_values:
        children.append(proj("v_proj", "Value projection", Hkv, kvh, v("v"), "value"))
    if o.qk_norm == "rms":
        for key, colour, kh in (("q_norm", q, heads), ("k_norm", k, kv_heads)):
            letter = key[0].upper()
            children.append(rmsnorm(ctx, key, f"{'Query' if letter == 'Q' else 'Key'} RMSNorm (per head)",
                                    weight=prefix + key + ".weight", ranges=ranges, size=s.head_dim_key,
                                    x=Port(colour(letter), ctx.tokens(kh, d_head), letter),
                                    y=Port(colour(rf"\hat {letter}"), ctx.tokens(kh, d_head), letter + "_hat"),
                                    code=f"self.{key}(...)", eps=o.eps, gain=o.qk_gain))
    if rope_options is not None and o.rope:
        children.append(replace(rope(ctx, rope_options, code=f"{ctx.reference.prefix}RotaryEmbedding(config)"),
                                reference=rope_reference))
    children.append(_scores(ctx, o, heads, kv_heads, citations[:1], _final_names(o, rope_options is not None)))
    o_in = Port(ctx_colour("O"), ctx.tokens(Dim("heads·d_head", n * hd)), "O")
    children.append(linear(ctx, "o_proj", "Output projection", weight=prefix + "o_proj.weight", ranges=ranges,
                           d_in=H * D, d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=o_in,
                           y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                           equation=rf"\Delta_{{\mathrm{{attn}}}}=[{ctx_colour('O_1')};\dots;"
                                    rf"{ctx_colour(f'O_{{{n}}}')}]W_{{O}}",
                           description=f"Mix the {n} heads' outputs ({n * hd:,} features) back to {d:,} features.",
                           code="self.o_proj(attn_output)"))
    rope_c = next((c for c in children if c.program == "rope"), None)
    angles = rope_c.outputs[0] if rope_c is not None else Port(ctx_colour("R"), Shape((Dim("positions", symbol="T"),
                                                                                      Dim("pairs", 0))), "R")
    scores_c = next(c for c in children if c.key == "scores")
    return Component(
        key="attn", title=title or _title(o), kind="learned", code=code, description=_describe(o),
        inputs=(x, angles, scores_c.inputs[3]), outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=(Step(r"\Delta_{\mathrm{attn}}=\operatorname{Attention}(x_{\mathrm{attn}})", x.shape, "attention"),),
        steps=_steps(ctx, o, children, heads, kv_heads, d_head), children=tuple(children),
        citations=citations + ((keys_as_values.CITATION,) if o.keys_as_values else ())
        + ((chunked.MASK_CITATION,) if o.chunk else ()),
        program="layer_attention", options=o,
        extras=(("heads / key-value heads / head width", f"{n} / {kvh} / {hd}"),)
        + ((("positions", "none (NoPE layer)"),) if not o.rope else ()),
    )


def _title(o: LayerAttentionOptions) -> str:
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
    parts = [f"{s.heads} query heads of {s.head_dim} features over {s.kv_heads} key/value head"
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


def _final_names(o: LayerAttentionOptions, rotates: bool) -> tuple[str, str, str]:
    """The symbols of q, k and v as the scores read them, after every norm, rotation and scale the layer applies
    (so the scores' steps consume what the steps before them produced)."""
    Q, K = ("Q", "K") if o.qk_norm != "rms" else (r"\hat Q", r"\hat K")
    if o.rope and rotates:
        Q, K = "Q^{R}", "K^{R}"
    if o.qk_norm == "l2":
        Q, K = r"\bar Q", r"\bar K"
    if o.temperature is not None:
        Q = r"Q^{\tau}"
    return Q, K, (r"\hat V" if o.value_norm else "V")


def _scores(ctx: Ctx, o: LayerAttentionOptions, heads: Dim, kv: Dim, citations: tuple[Citation, ...],
            names: tuple[str, str, str]) -> Component:
    hd = o.shape.head_dim
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


def _steps(ctx: Ctx, o: LayerAttentionOptions, children: list[Component], heads: Dim, kv_heads: Dim,
           d_head: Dim) -> tuple[Step, ...]:
    by_key = {c.key: c for c in children}
    q_shape, kv_shape = ctx.tokens(heads, d_head), ctx.tokens(kv_heads, d_head)
    steps = [by_key["q_proj"].steps[0], by_key["k_proj"].steps[0]]
    if "v_proj" in by_key:
        steps.append(by_key["v_proj"].steps[0])
        steps.append(Step(rf"{q('Q')}=\operatorname{{reshape}}({q('q')}),\ {k('K')}=\operatorname{{reshape}}({k('k')}),"
                          rf"\ {v('V')}=\operatorname{{reshape}}({v('v')})", q_shape, "heads"))
    else:
        steps.append(Step(rf"{q('Q')}=\operatorname{{reshape}}({q('q')}),\ {k('K')}=\operatorname{{reshape}}({k('k')})",
                          q_shape, "heads"))
        steps.append(keys_as_values.values_step(kv_shape))
    Qn, Kn = q("Q"), k("K")
    if o.qk_norm == "rms":
        gain = GAIN_SUBSCRIPT[o.qk_gain]
        q_hat, k_hat = q(r"\hat Q"), k(r"\hat K")
        steps += [Step(rf"{q_hat}=\operatorname{{RMSNorm}}{gain}({Qn})", q_shape, "q_norm"),
                  Step(rf"{k_hat}=\operatorname{{RMSNorm}}{gain}({Kn})", kv_shape, "k_norm")]
        Qn, Kn = q(r"\hat Q"), k(r"\hat K")
    if o.value_norm:
        steps.append(l2_qk_norm.unit_rms_step(v(r"\hat V"), v("V"), o.eps, kv_shape, "v_norm"))
    if o.rope and "rope" in by_key:
        steps += [Step(rf"{q('Q^{R}_t')}=\operatorname{{RoPE}}({Qn}_t,{ctx_colour('R_t')})", q_shape, "q-rotate"),
                  Step(rf"{k('K^{R}_t')}=\operatorname{{RoPE}}({Kn}_t,{ctx_colour('R_t')})", kv_shape, "k-rotate")]
        Qn, Kn = q("Q^{R}"), k("K^{R}")
    if o.qk_norm == "l2":
        steps += [l2_qk_norm.unit_rms_step(q(r"\bar Q"), Qn, o.eps, q_shape, "q-l2"),
                  l2_qk_norm.unit_rms_step(k(r"\bar K"), Kn, o.eps, kv_shape, "k-l2")]
    if o.temperature is not None:
        steps.append(nope.temperature_step(o.temperature, q_shape, Qn))
    steps += list(by_key["scores"].steps) + list(by_key["o_proj"].steps)
    return tuple(steps)


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


@program("layer_attention", role="Attention")
def run_layer_attention(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor,
                        M: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, LayerAttentionOptions)
    s = o.shape
    B_, T_, _ = x.shape
    Q = run_child(comp, "q_proj", run, x).view(B_, T_, s.heads, s.head_dim)                # [B, T, H, d_head]
    K = run_child(comp, "k_proj", run, x).view(B_, T_, s.kv_heads, s.head_dim)             # [B, T, H_kv, d_head]
    if o.keys_as_values:
        V = keys_as_values.values_from_keys(K)
        run.rec("heads", Q), run.rec("values", V)
    else:
        V = run_child(comp, "v_proj", run, x).view(B_, T_, s.kv_heads, s.head_dim)
        run.rec("heads", Q)
    if o.qk_norm == "rms":
        norm = options(comp.child("q_norm"), NormOptions)
        Q = apply_norm(run, "q_norm", Q, norm, "q_norm.")
        K = apply_norm(run, "k_norm", K, norm, "k_norm.")
    if o.value_norm:
        V = run.rec("v_norm", l2_qk_norm.unit_rms(V, o.eps))
    if o.rope and angles.shape[-1]:
        ro = options(comp.child("rope"), RopeOptions)
        Q = run.rec("q-rotate", rotate(Q, angles, ro))
        K = run.rec("k-rotate", rotate(K, angles, ro))
    if o.qk_norm == "l2":
        Q = run.rec("q-l2", l2_qk_norm.unit_rms(Q, o.eps))
        K = run.rec("k-l2", l2_qk_norm.unit_rms(K, o.eps))
    if o.temperature is not None:
        factors = nope.temperature_scales(torch.arange(T_, device=x.device), o.temperature)
        Q = run.rec("temperature", (Q * factors[None, :, None, None]).to(Q.dtype))
    O = attend(run, options(comp.child("scores"), LayerAttentionOptions), Q, K, V, M)
    return [run.rec("attention", run_child(comp, "o_proj", run, O.reshape(B_, T_, s.heads * s.head_dim)))]


# ------------------------------------------------------------------------------------ reference calls

def reference_mask(attn, M: torch.Tensor) -> torch.Tensor:
    """The mask the reference model hands this layer, from the reference's own config: a sliding window where the
    layer has one, a chunk where its config names the layer chunked_attention, else causal. So a window or chunk our
    spec leaves out (or adds) shows in the check."""
    config, layer = getattr(attn, "config", None), getattr(attn, "layer_idx", None)
    window = getattr(attn, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    chunk = (getattr(config, "attention_chunk_size", None)
             if types is not None and layer is not None and types[layer] == "chunked_attention" else None)
    return mask(M, MaskOptions(window, chunk))


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
    x, _, M = inputs
    return ours, _call(ref, ref, model, x, M), "rotary angles and mask from the reference model"


@reference_call("layer_block")
def call_layer_block(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference decoder layer with the rotary output and the mask its model would pass it."""
    x, _, M = inputs
    return ours, _call(ref, ref.self_attn, model, x, M), "rotary angles and mask from the reference model"


# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("layer_attention")
def layer_memory_entry(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """K and V of each key/value head at its own width, or K alone where the keys double as values (the values
    follow from the cached keys' projection: one tensor, not two); capped by the layer's window or chunk."""
    o = comp.options
    assert isinstance(o, LayerAttentionOptions)
    s = o.shape
    tensors = keys_as_values.cache_tensors(o.keys_as_values)
    return (LayerKind(tensors * s.kv_heads * s.head_dim,
                      f"{'2 × ' if tensors == 2 else ''}{s.kv_heads_key} × {s.head_dim_key}",
                      flops_per_key=2 * s.heads * 2 * s.head_dim, mha_per_token=2 * s.heads * s.head_dim,
                      window=o.window, chunk=o.chunk, by_kind=True),)
