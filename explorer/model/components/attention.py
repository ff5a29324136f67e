"""Attention: the scaled dot-product scores (causal mask, sliding window, grouped KV heads, sinks, soft-capping)
and multi-head attention with separate q/k/v projections (MHA, GQA, MQA; biases; QK-norm).

References: "Attention Is All You Need" (arXiv:1706.03762); GQA (arXiv:2305.13245); Qwen3 technical report for
QK-norm; transformers' modeling_llama.py (eager_attention_forward, repeat_kv) for how the reference computes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import sympy

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

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
    reference_call,
    run_child,
    v,
)
from explorer.model.components.check_words import NO_ROTARY, OWN_ANGLES, covered, given_mask
from explorer.model.components.linear import linear
from explorer.model.components.norms import GAIN_SUBSCRIPT, Gain, NormOptions, apply_norm, rmsnorm
from explorer.model.components.part_facts import MaskSpec, facts
from explorer.model.components.rope import RopeOptions, reference_rotary, rope, rotate
from explorer.model.components.serving import LayerKind, kv_heads_formula, layer_memory, scores_child
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step

QUERIES, KEYS = Dim("queries", symbol="T"), Dim("keys", symbol="T")


@dataclass(frozen=True, slots=True)
class ScoresOptions:
    heads: int
    kv_heads: int
    scale: float
    window: int | None = None
    """Sliding window: a query attends to the `window` most recent keys (itself included)."""
    sinks: bool = False
    """A learned logit per head joins each softmax row as an extra column that takes probability but no value."""
    softcap: float | None = None
    sink_name: str = "sinks"
    """The sink logits' tensor name in the checkpoint (MiMo-V2-Flash stores them as attention_sink_bias)."""

    @property
    def groups(self) -> int:
        return self.heads // self.kv_heads


# ---------------------------------------------------------------------------------------------- scores

def scores(ctx: Ctx, o: ScoresOptions, *, d_qk: int, d_v: int, scale_latex: str, description: str,
           citations: tuple[Citation, ...], weight_prefix: str = "", ranges: tuple[IndexRange, ...] = (),
           q_in: str = "Q", k_in: str = "K") -> Component:
    """softmax(τ QKᵀ + M) V per head, with the KV repeat, window, sinks and soft-capping the options ask for.

    q_in and k_in are the symbols of the queries and keys the scores read: the rotated (and normed) ones where the
    attention computes them (issue 25: a step reads what the step before it produced)."""
    heads = Dim("heads", o.heads)
    kv = Dim("kv_heads", o.kv_heads)
    shape = Shape((B, heads, QUERIES, KEYS))
    k_h = "K_h" if o.groups > 1 else k_in + "_h"
    logits = rf"\tau\,{q(q_in + '_h')}{k(k_h)}^{{\top}}"
    if o.softcap:
        logits = rf"{fmt_num(o.softcap)}\tanh\!\left({logits}/{fmt_num(o.softcap)}\right)"
    steps = [Step(scale_latex, None, "scale")]
    if o.groups > 1:
        steps.append(Step(rf"{k('K_h')}={k(k_in)}_{{\lceil h/{o.groups}\rceil}},\quad {v('V_h')}={v('V')}_{{\lceil h/"
                          rf"{o.groups}\rceil}}", ctx.tokens(heads, Dim("d_head", d_qk)), "repeat"))
    if o.window:
        steps.append(Step(rf"M_{{ts}}=\begin{{cases}}0 & 0\le t-s<{o.window:,}\\ -\infty & \text{{otherwise}}"
                          rf"\end{{cases}}", Shape((QUERIES, KEYS)), "window"))
    if o.sinks:
        steps.append(Step(rf"A_h=\operatorname{{softmax}}\!\left([{logits}+M;\ \kappa_h]\right)_{{:T}}", shape, "softmax"))
    else:
        steps.append(Step(rf"A_h=\operatorname{{softmax}}\!\left({logits}+M\right)", shape, "softmax"))
    steps.append(Step(rf"{ctx_colour('O_h')}=A_h{v('V_h')}", ctx.tokens(heads, Dim("d_v", d_v)), "context"))
    tensors = (ctx.tensor(weight_prefix + o.sink_name, ranges, (ctx.sym("num_attention_heads"),)),) if o.sinks else ()
    return Component(
        key="scores", title="Scaled dot-product scores", kind="learned" if o.sinks else "computed",
        code="softmax(Q @ K.transpose(-1, -2) * scaling + mask) @ V", description=description,
        inputs=(Port(q(q_in), ctx.tokens(heads, Dim("d_qk", d_qk)), "Q"), Port(k(k_in), ctx.tokens(kv, Dim("d_qk", d_qk)), "K"),
                Port(v("V"), ctx.tokens(kv, Dim("d_v", d_v)), "V"), Port("M", Shape((QUERIES, KEYS)), "mask")),
        outputs=(Port(ctx_colour("O"), ctx.tokens(heads, Dim("d_v", d_v)), "O"),),
        equations=tuple(steps[-2:]), steps=tuple(steps), tensors=tensors,
        extras=(("softmax scale", f"{o.scale:.6f}"),) + ((("sliding window", f"{o.window:,} positions"),) if o.window else ()),
        citations=citations, row_label="Scores and softmax" + ("" if o.sinks else " (computed)"), program="scores",
        options=o, reference="-",
    )


def window_mask(M: torch.Tensor, window: int | None) -> torch.Tensor:
    """Add -inf where the key lies `window` or more positions before the query."""
    if not window:
        return M
    t = torch.arange(M.shape[-1], device=M.device)
    too_far = (t[:, None] - t[None, :]) >= window
    return M.masked_fill(too_far, float("-inf"))


def scores_mask(comp: Component) -> MaskSpec:
    """The mask an attention's scores child applies (its window, chunk and sinks, as its program reads them)."""
    o = comp.child("scores").options
    return MaskSpec(window=getattr(o, "window", None), chunk=getattr(o, "chunk", None),
                    sinks=bool(getattr(o, "sinks", False)))


def repeat_kv_heads(x: torch.Tensor, groups: int, dim: int) -> torch.Tensor:
    """Each key/value head serves `groups` consecutive query heads: head h reads KV head ⌊h / groups⌋."""
    return x.repeat_interleave(groups, dim=dim)


def attend(run: Run, o: ScoresOptions, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """O_h = softmax(τ Q_h K_hᵀ + M) V_h; heads on axis 2 of [B, T, H, d]; KV heads repeated over their group."""
    if o.groups > 1:
        K = run.rec("repeat", repeat_kv_heads(K, o.groups, 2))                       # [B, T, H, d_qk]
        V = repeat_kv_heads(V, o.groups, 2)                                         # [B, T, H, d_v]
    M = run.rec("window", window_mask(M, o.window)) if o.window else M
    logits = torch.matmul(Q.transpose(1, 2), K.transpose(1, 2).transpose(-1, -2)) * o.scale  # [B, H, T, T]
    if o.softcap:
        logits = o.softcap * torch.tanh(logits / o.softcap)
    logits = logits + M
    if o.sinks:
        sink = run.w(o.sink_name).reshape(1, -1, 1, 1).expand(*logits.shape[:-1], 1).to(logits.dtype)
        full = torch.cat([logits, sink], dim=-1)
        full = full - full.max(dim=-1, keepdim=True).values  # stable, as the reference does
        A = F.softmax(full, dim=-1, dtype=torch.float32)[..., :-1].to(Q.dtype)
    else:
        A = F.softmax(logits, dim=-1, dtype=torch.float32).to(Q.dtype)
    run.rec("softmax", A)
    return run.rec("context", torch.matmul(A, V.transpose(1, 2)).transpose(1, 2))     # [B, T, H, d_v]


@program("scores")
def run_scores(comp: Component, run: Run, Q, K, V, M) -> list[torch.Tensor]:
    return [attend(run, options(comp, ScoresOptions), Q, K, V, M)]


# ------------------------------------------------------------------------------------------- GQA attention

def per_head_qk_norms(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], heads: Dim, kv_heads: Dim,
                      d_head: Dim, eps: float, gain: Gain, size: str = "head_dim",
                      code: str = "self.{key}(...view(hidden_shape))") -> list[Component]:
    """q_norm and k_norm: RMSNorms over each query and each key head's features (size: the config key of their
    width; code: the reference's call, with {key} for the norm's name)."""
    out = []
    for key, colour, h in (("q_norm", q, heads), ("k_norm", k, kv_heads)):
        letter = key[0].upper()
        out.append(rmsnorm(ctx, key, f"{'Query' if key == 'q_norm' else 'Key'} RMSNorm (per head)",
                           weight=prefix + key + ".weight", ranges=ranges, size=size,
                           x=Port(colour(letter), ctx.tokens(h, d_head), letter),
                           y=Port(colour(rf"\hat {letter}"), ctx.tokens(h, d_head), letter + "_hat"),
                           code=code.format(key=key), eps=eps, gain=gain))
    return out


@dataclass(frozen=True, slots=True)
class AttentionOptions:
    heads: int
    kv_heads: int
    head_dim: int
    qk_norm: NormOptions | None = None


def attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, rope_options: RopeOptions,
              scores_options: ScoresOptions, bias: bool = False, o_bias: bool = False, qk_norm_eps: float | None = None,
              citations: tuple[Citation, ...] = (), qk_norm_gain: Gain = "w", scale_latex: str = "",
              rope_reference: str = "model.rotary_emb") -> Component:
    """Multi-head attention with separate q, k, v projections; kv_heads < heads shares each K/V head by a group.

    qk_norm_gain: the q/k RMSNorms' gain (Gemma's 1 + w); scale_latex: the softmax scale's step where it is not
    1/√d_head (Gemma's query_pre_attn_scalar); rope_reference: the reference's rotary module."""
    so = scores_options
    n, kvh, hd = so.heads, so.kv_heads, ctx.size("head_dim")
    heads, kv_heads, d_head = Dim("heads", n), Dim("kv_heads", kvh), Dim("d_head", hd)
    H, Hkv, D = ctx.sym("num_attention_heads"), ctx.sym("num_key_value_heads"), ctx.sym("head_dim")
    d = ctx.size("hidden_size")

    def proj(key: str, title: str, out_heads: sympy.Expr, out_dim: Dim, latex: str, name: str, what: str) -> Component:
        return linear(ctx, key, title, weight=prefix + key + ".weight", ranges=ranges, d_in="hidden_size",
                      d_out=out_heads * D, out_dim=out_dim, x=x, y=Port(latex, ctx.tokens(out_dim), name),
                      equation=rf"{latex}={x.latex}W_{{{key[0].upper()}}}" + (rf"+b_{{{key[0].upper()}}}" if bias else ""),
                      description=f"Project {d:,} features to {what}.", code=f"self.{key}(hidden_states)", bias=bias)

    q_dim, kv_dim = Dim("heads·d_head", n * hd), Dim("kv_heads·d_head", kvh * hd)
    children = [
        proj("q_proj", "Query projection", H, q_dim, q("q"), "q", f"{n} query heads of {hd} ({n * hd:,} outputs)"),
        proj("k_proj", "Key projection", Hkv, kv_dim, k("k"), "k", f"{kvh} key heads of {hd} ({kvh * hd:,} outputs)"),
        proj("v_proj", "Value projection", Hkv, kv_dim, v("v"), "v", f"{kvh} value heads of {hd} ({kvh * hd:,} outputs)"),
    ]
    norm_opts = None
    if qk_norm_eps is not None:
        children += per_head_qk_norms(ctx, prefix=prefix, ranges=ranges, heads=heads, kv_heads=kv_heads,
                                      d_head=d_head, eps=qk_norm_eps, gain=qk_norm_gain)
        norm_opts = options(children[-1], NormOptions)
    children.append(replace(rope(ctx, rope_options, code=f"{ctx.reference.prefix}RotaryEmbedding(config)"),
                            reference=rope_reference))
    groups = f"; each key/value head serves {so.groups} query heads" if so.groups > 1 else ""
    children.append(scores(ctx, so, d_qk=hd, d_v=hd, scale_latex=scale_latex or (
                           rf"\tau=1/\sqrt{{{hd}}}={so.scale:.6f}" if abs(so.scale - hd ** -0.5) < 1e-12
                           else rf"\tau={so.scale:.6f}"),
                           description=f"Causal softmax attention of {n} query heads over {hd}-dimensional dot "
                                       f"products{groups}.", citations=citations[:1],
                           weight_prefix=prefix, ranges=ranges, q_in="Q^{R}", k_in="K^{R}"))
    o_in = Port(ctx_colour("O"), ctx.tokens(Dim("heads·d_head", n * hd)), "O")
    children.append(linear(ctx, "o_proj", "Output projection", weight=prefix + "o_proj.weight", ranges=ranges,
                           d_in=H * D, d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=o_in,
                           y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                           equation=rf"\Delta_{{\mathrm{{attn}}}}=[{ctx_colour('O_1')};\dots;{ctx_colour(f'O_{{{n}}}')}]W_{{O}}"
                           + (r"+b_{O}" if o_bias else ""),
                           description=f"Mix the {n} heads' outputs ({n * hd:,} features) back to {d:,} features.",
                           code="self.o_proj(attn_output)", bias=o_bias))
    steps = _gqa_steps(ctx, children, heads, kv_heads, d_head, qk_norm_eps is not None, GAIN_SUBSCRIPT[qk_norm_gain])
    return Component(
        key="attn", title=attention_title(n, kvh), kind="learned",
        code=f"{ctx.reference.prefix}Attention(config, layer_idx)",
        description=f"{n} query heads of {hd} features attend over {kvh} key/value head{'s' if kvh > 1 else ''}"
                    f"{' with a sliding window of ' + format(so.window, ',') + ' positions' if so.window else ''}.",
        inputs=(x, Port(ctx_colour("R"), children[-3].outputs[0].shape, "R"), children[-2].inputs[3]),
        outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=headline_steps(steps), steps=steps, children=tuple(children), citations=citations,
        program="attention",
        options=AttentionOptions(n, kvh, hd, norm_opts),
    )


# The steps that set an attention apart from the plain one (a mask other than causal, norms on q, k or v, values
# made from the keys, a scaled value, a position temperature); a page's headline shows these and the softmax.
DISTINCTIVE_STEPS = ("values", "v-scale", "q_norm", "k_norm", "v_norm", "temperature", "q-l2", "k-l2", "chunk",
                     "window")
# A plain attention has none of those: its headline is the head sharing, the softmax and the output projection
# that assembles the heads' outputs O_h.
PLAIN_HEADLINE = ("repeat", "softmax", "context", "o_proj", "c_proj")


def headline_steps(steps: tuple[Step, ...], distinctive: tuple[str, ...] = DISTINCTIVE_STEPS) -> tuple[Step, ...]:
    """The equations a page shows before "All N steps": the component's distinctive steps and its softmax, or the
    plain attention's head sharing, softmax, context and output projection where nothing else sets it apart."""
    named = [s for s in steps if not s.heading and s.name]
    if any(s.name in distinctive for s in named):
        return _first_of_each([s for s in named if s.name in distinctive or s.name == "softmax"])
    return _first_of_each([s for s in named if s.name in PLAIN_HEADLINE])


def _first_of_each(steps: list[Step]) -> tuple[Step, ...]:
    """Each step name once, in order: the first step of that name."""
    return tuple({s.name: s for s in reversed(steps)}[name] for name in dict.fromkeys(s.name for s in steps))


def attention_title(heads: int, kv_heads: int) -> str:
    """Multi-query, grouped-query or multi-head attention, by how many query heads share a key/value head."""
    kind = "multi-query" if kv_heads == 1 else ("grouped-query" if kv_heads < heads else "multi-head")
    return f"{kind.capitalize()} attention"


def _gqa_steps(ctx: Ctx, children: list[Component], heads: Dim, kv_heads: Dim, d_head: Dim,
               qk_norm: bool, gain: str = "") -> tuple[Step, ...]:
    by_key = {c.key: c for c in children}
    steps = [by_key["q_proj"].steps[0], by_key["k_proj"].steps[0], by_key["v_proj"].steps[0],
             Step(rf"{q('Q')}=\operatorname{{reshape}}({q('q')}),\ {k('K')}=\operatorname{{reshape}}({k('k')}),\ "
                  rf"{v('V')}=\operatorname{{reshape}}({v('v')})", ctx.tokens(heads, d_head), "heads")]
    q_hat, k_hat = q(r"\hat Q"), k(r"\hat K")
    if qk_norm:
        steps += [Step(rf"{q_hat}=\operatorname{{RMSNorm}}{gain}({q('Q')})", ctx.tokens(heads, d_head), "q_norm"),
                  Step(rf"{k_hat}=\operatorname{{RMSNorm}}{gain}({k('K')})", ctx.tokens(kv_heads, d_head), "k_norm")]
    Qn, Kn = (q_hat, k_hat) if qk_norm else (q("Q"), k("K"))
    steps += [Step(rf"{q('Q^{R}_t')}=\operatorname{{RoPE}}({Qn}_t,{ctx_colour('R_t')})", ctx.tokens(heads, d_head), "q-rotate"),
              Step(rf"{k('K^{R}_t')}=\operatorname{{RoPE}}({Kn}_t,{ctx_colour('R_t')})", ctx.tokens(kv_heads, d_head), "k-rotate")]
    # the scores' steps open with τ's value: the softmax step uses τ, so the list gives it (issue 35)
    steps += list(by_key["scores"].steps) + list(by_key["o_proj"].steps)
    return tuple(steps)


@program("attention", role="Attention", token_mixer=True, layout="rotary-attention", mask_pattern=scores_mask)
def run_attention(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor, M: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, AttentionOptions)
    B_, T_, _ = x.shape
    q_ = run_child(comp, "q_proj", run, x)
    k_ = run_child(comp, "k_proj", run, x)
    v_ = run_child(comp, "v_proj", run, x)
    Q = run.rec("heads", q_.view(B_, T_, o.heads, o.head_dim))                     # [B, T, H, d_head]
    K = k_.view(B_, T_, o.kv_heads, o.head_dim)                                    # [B, T, H_kv, d_head]
    V = v_.view(B_, T_, o.kv_heads, o.head_dim)                                    # [B, T, H_kv, d_head]
    if o.qk_norm is not None:
        Q = apply_norm(run, "q_norm", Q, o.qk_norm, "q_norm.")
        K = apply_norm(run, "k_norm", K, o.qk_norm, "k_norm.")
    ro = options(comp.child("rope"), RopeOptions)
    Q = run.rec("q-rotate", rotate(Q, angles, ro))
    K = run.rec("k-rotate", rotate(K, angles, ro))
    O = attend(run, options(comp.child("scores"), ScoresOptions), Q, K, V, M)
    delta = run_child(comp, "o_proj", run, O.reshape(B_, T_, o.heads * o.head_dim))
    return [run.rec("attention", delta)]


def reference_mask(comp: Component, M: torch.Tensor) -> torch.Tensor:
    """The additive mask the reference layer receives from its model: causal, windowed on sliding layers."""
    for c in comp.children:
        if c.program == "scores":
            return window_mask(M, options(c, ScoresOptions).window)
        if c.children:
            return reference_mask(c, M)
    return M


def _mask_for(ref, comp: Component, M: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Where the reference layer knows its own window (Gemma 3's sliding_window, None on global layers), mask as its
    model would from its own config, so a window our spec leaves out (or adds) shows; otherwise from our spec. Returns
    the mask and whose window it carries, for the check line."""
    attn = getattr(ref, "self_attn", ref)
    if hasattr(attn, "sliding_window"):
        window = attn.sliding_window
        return window_mask(M, window), f"windowed by the reference layer's own sliding_window, {window}" if window \
            else ""
    masked = reference_mask(comp, M)
    window = _spec_window(comp)
    return masked, f"windowed by our spec's window, {window}" if window else ""


def _spec_window(comp: Component) -> int | None:
    for c in _walk(comp):
        if c.program == "scores":
            return options(c, ScoresOptions).window
    return None


@reference_call("attention")
@reference_call("mla")
@reference_call("block")
def call_with_rotary(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """Attention and blocks take the rotary cos/sin (where they rotate) and the mask their model would pass: the
    mask is the one our program built (windowed as the reference layer says where it says), the angles the
    reference's own rotary module's."""
    x, M = inputs[0], inputs[-1]
    mask, window = _mask_for(ref, comp, M)
    kwargs = {"attention_mask": mask[None, None]}
    ropes = [c for c in _walk(comp) if facts(c.program).rotary]
    if ropes:
        T_ = x.shape[1]
        rotary, rope_o = getattr(model.model, "rotary_emb", None), options(ropes[0], RopeOptions)
        for c in ropes:
            if c.reference not in ("", "-", "model.rotary_emb"):
                rotary = model.get_submodule(c.reference)
        kwargs["position_embeddings"] = reference_rotary(rotary, rope_o, x,
                                                         torch.arange(T_)[None].expand(x.shape[0], T_))
    out = ref(hidden_states=x, **kwargs) if comp.program != "block" else ref(x, **kwargs)
    return (ours, out[0] if isinstance(out, tuple) else out,
            covered(given_mask(window), OWN_ANGLES if ropes else NO_ROTARY))


def _walk(comp: Component):
    yield comp
    for c in comp.children:
        yield from _walk(c)


# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("attention")
def plain_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """K and V of every key/value head at head_dim, the last `window` positions where the layer slides; a query
    spends 2 × 2 × heads × head_dim FLOPs per key (scores, then the weighted values)."""
    so = scores_child(comp)
    d = int(values["head_dim"])
    return (LayerKind(2 * so.kv_heads * d, kv_heads_formula(values), values=so.kv_heads * d,
                      flops_per_key=2 * so.heads * 2 * d,
                      mha_per_token=2 * so.heads * d, window=so.window),)
