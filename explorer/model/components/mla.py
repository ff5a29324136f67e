"""Multi-head latent attention (DeepSeek-V2/V3): keys and values through a shared low-rank latent, queries through
their own latent (or projected directly when the config has no query rank), and a decoupled rotary key shared by
all heads.

References: DeepSeek-V2 (arXiv:2405.04434) and DeepSeek-V3 (arXiv:2412.19437) technical reports; transformers'
models/deepseek_v3/modeling_deepseek_v3.py for the reference module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.attention import ScoresOptions, attend, headline_steps, scores, scores_mask
from explorer.model.components.base import Ctx, Run, ctx_colour, k, options, program, q, run_child, v
from explorer.model.components.linear import linear
from explorer.model.components.norms import NormOptions, apply_norm, rmsnorm
from explorer.model.components.rope import RopeOptions, rope, rotate, yarn_mscale
from explorer.model.components.serving import LayerKind, layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step


@dataclass(frozen=True, slots=True)
class MLAOptions:
    heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    nope: int
    rope: int
    v: int
    norm: NormOptions


def softmax_scale(nope: int, rope_dim: int, o: RopeOptions) -> tuple[float, float]:
    """(mscale, τ): YaRN multiplies 1/√(d_nope + d_rope) by mscale² when mscale_all_dim is set."""
    m = yarn_mscale(o.factor, o.mscale_all_dim) if o.kind == "yarn" and o.mscale_all_dim else 1.0
    return m, (nope + rope_dim) ** -0.5 * m * m


# What sets latent attention apart: the key-value latent every head's keys and values come from, and the rotary key
# part one head carries for all.
MLA_HEADLINE = ("kv-down", "k-concat")


def mla(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: MLAOptions, rope_options: RopeOptions,
        citations: tuple[Citation, ...], rope_citations: tuple[Citation, ...], scores_citations: tuple[Citation, ...],
        ) -> Component:
    """The MLA module of one block kind, with every projection, norm, the rotary angles and the scores."""
    n, d = o.heads, ctx.size("hidden_size")
    d_qk = o.nope + o.rope
    ckv = Port("c^{KV}", ctx.tokens("kv_lora_rank"), "c_kv")
    ckv_hat = Port(r"\hat c^{KV}", ckv.shape, "c_kv_hat")
    H, nope_s, rope_s, v_s = (ctx.sym(s) for s in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                                  "v_head_dim"))
    q_children, q_source = _query_path(ctx, prefix, ranges, x, o)
    x_name = x.latex
    k_pe = k(r"k^{\mathrm{pe}}")
    kv_a = linear(ctx, "kv_a_proj_with_mqa", "Joint KV down-projection", weight=prefix + "kv_a_proj_with_mqa.weight",
                  ranges=ranges, d_in="hidden_size", d_out=ctx.sym("kv_lora_rank") + rope_s,
                  out_dim=Dim("d_ckv+d_rope", o.kv_lora_rank + o.rope), x=x,
                  y=Port("c^{KV}", ctx.tokens(Dim("d_ckv+d_rope", o.kv_lora_rank + o.rope)), "c_kv"),
                  equation=rf"[c^{{KV}};{k_pe}]={x_name}[W_{{DKV}};W_{{KR}}]",
                  description=f"Compress each token to a {o.kv_lora_rank}-dimensional key-value latent plus one shared "
                              f"{o.rope}-dimensional rotary key ({o.kv_lora_rank + o.rope} outputs).",
                  code="self.kv_a_proj_with_mqa(hidden_states)")
    kv_norm = rmsnorm(ctx, "kv_a_layernorm", "KV latent RMSNorm", weight=prefix + "kv_a_layernorm.weight",
                      ranges=ranges, size="kv_lora_rank", x=ckv, y=ckv_hat, code="self.kv_a_layernorm(kv_latent)",
                      eps=o.norm.eps)
    kv_b = linear(ctx, "kv_b_proj", "KV up-projection", weight=prefix + "kv_b_proj.weight", ranges=ranges,
                  d_in="kv_lora_rank", d_out=H * (nope_s + v_s), out_dim=Dim("heads·(d_nope+d_v)", n * (o.nope + o.v)),
                  x=ckv_hat, y=Port(rf"[{k('k^{C}')};{v('v')}]", ctx.tokens(Dim("heads·(d_nope+d_v)", n * (o.nope + o.v))), "kv"),
                  equation=rf"[{k('k^{C}')};{v('v')}]=\hat c^{{KV}}[W_{{UK}};W_{{UV}}]",
                  description=f"Expand the KV latent to {n} heads of {o.nope} key-content and {o.v} value features "
                              f"({n * (o.nope + o.v):,} outputs; W_UK and W_UV are its blocks).",
                  code="self.kv_b_proj(kv_latent)")
    o_in = Port(ctx_colour("O"), ctx.tokens(Dim("heads·d_v", n * o.v)), "O")
    o_proj = linear(ctx, "o_proj", "Output projection", weight=prefix + "o_proj.weight", ranges=ranges, d_in=H * v_s,
                    d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=o_in,
                    y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                    equation=rf"\Delta_{{\mathrm{{attn}}}}=[{ctx_colour('O_1')};\dots;{ctx_colour(f'O_{{{n}}}')}]W_{{O}}",
                    description=f"Mix the {n} heads' {o.v}-dimensional outputs ({n * o.v:,} features) back to "
                                f"{d:,} features.", code="self.o_proj(attn_output)")
    rope_c = rope(ctx, rope_options, code=f"{ctx.reference.prefix}YarnRotaryEmbedding(qk_rope_head_dim, ...)"
                  if rope_options.kind == "yarn" else f"{ctx.reference.prefix}RotaryEmbedding(config)",
                  prefix=prefix, ranges=ranges, buffer=True, citations=rope_citations)
    m, tau = softmax_scale(o.nope, o.rope, rope_options)
    scale_latex = (rf"\tau=\frac{{a_{{\mathrm{{YaRN}}}}^2}}{{\sqrt{{{d_qk}}}}},\quad a_{{\mathrm{{YaRN}}}}=0.1\ln "
                   rf"{rope_options.factor:g}+1={m:.4f},\quad "
                   rf"\tau={tau:.6f}" if m != 1.0 else rf"\tau=1/\sqrt{{{d_qk}}}={tau:.6f}")
    sc = scores(ctx, ScoresOptions(n, n, tau), d_qk=d_qk, d_v=o.v, scale_latex=scale_latex,
                description=f"Causal softmax attention per head over {d_qk}-dimensional query-key dot products"
                            + (", with the softmax scale enlarged by YaRN's mscale squared." if m != 1.0 else "."),
                citations=scores_citations)
    children = (*q_children, kv_a, kv_norm, kv_b, rope_c, sc, o_proj)
    steps = (*_query_steps(ctx, o, q_source, x_name), *_kv_steps(ctx, o, x_name), *sc.steps, *o_proj.steps)
    latent = f"a {o.q_lora_rank}-dimensional query latent and " if o.q_lora_rank else "directly projected queries and "
    return Component(
        key="attn", title="Multi-head latent attention", kind="learned",
        code=f"{ctx.reference.prefix}Attention(config, layer_idx)",
        description=f"{n} heads attend through {latent}a {o.kv_lora_rank}-dimensional key-value latent, with a "
                    f"{o.rope}-dimensional rotary key shared by all heads.",
        inputs=(x, Port(ctx_colour("R"), rope_c.outputs[0].shape, "R"), sc.inputs[3]),
        outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=headline_steps(steps, MLA_HEADLINE),
        steps=steps, children=children, citations=citations, program="mla", options=o, notes=decode_notes(o),
    )


def decode_notes(o: MLAOptions) -> tuple[str, ...]:
    """What one decoded token spends per cached position in this layer, in both forms (issue 19: a figure with two
    conventions names both), with the one the model page's decode figure counts."""
    absorbed, _ = decode_costs(o)
    steps_form, absorbed_form = decode_form_formulas(o)
    return (f"Decode FLOPs per cached position in one layer, two ways. With per-head keys and values at hand, as the "
            f"steps compute attention: {steps_form} = {2 * unabsorbed_per_key(o):,} (the model page's decode figure "
            f"counts this form, without rebuilding keys and values from the latent). In the absorbed form that the "
            f"{mla_cache(o)}-element cache implies: {absorbed_form} = {2 * absorbed.per_key:,}, more arithmetic per "
            f"cached position, but nothing rebuilt from the latent: {absorbed.note}.",)


def _query_path(ctx: Ctx, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: MLAOptions,
                ) -> tuple[tuple[Component, ...], str]:
    """q_a_proj, q_a_layernorm, q_b_proj through the query latent; or one q_proj when q_lora_rank is null."""
    n, d_qk = o.heads, o.nope + o.rope
    H, nope_s, rope_s = ctx.sym("num_attention_heads"), ctx.sym("qk_nope_head_dim"), ctx.sym("qk_rope_head_dim")
    q_out_dim = Dim("heads·d_qk", n * d_qk)
    q_port = Port(q("q"), ctx.tokens(q_out_dim), "q")
    q_pe = q(r"q^{\mathrm{pe}}")
    q_eq = rf"[{q('q^{C}')};{q_pe}]"
    if o.q_lora_rank is None:
        q_proj = linear(ctx, "q_proj", "Query projection", weight=prefix + "q_proj.weight", ranges=ranges,
                        d_in="hidden_size", d_out=H * (nope_s + rope_s), out_dim=q_out_dim, x=x, y=q_port,
                        equation=rf"{q_eq}={x.latex}[W_{{UQ}};W_{{QR}}]",
                        description=f"Project each token to {n} heads of {o.nope} content and {o.rope} rotary query "
                                    f"features ({n * d_qk:,} outputs; no query latent).", code="self.q_proj(hidden_states)")
        return (q_proj,), x.latex
    cq = Port(q("c^{Q}"), ctx.tokens("q_lora_rank"), "c_q")
    cq_hat = Port(r"\hat c^{" + q("Q") + "}", cq.shape, "c_q_hat")
    q_a = linear(ctx, "q_a_proj", "Query down-projection", weight=prefix + "q_a_proj.weight", ranges=ranges,
                 d_in="hidden_size", d_out="q_lora_rank", out_dim=ctx.dim("q_lora_rank"), x=x, y=cq,
                 equation=rf"{cq.latex}={x.latex}W_{{DQ}}",
                 description=f"Compress each {ctx.size('hidden_size'):,}-feature token to a {o.q_lora_rank:,}-"
                             "dimensional query latent.", code="self.q_a_proj(hidden_states)")
    q_norm = rmsnorm(ctx, "q_a_layernorm", "Query latent RMSNorm", weight=prefix + "q_a_layernorm.weight",
                     ranges=ranges, size="q_lora_rank", x=cq, y=cq_hat, code="self.q_a_layernorm(q_a)", eps=o.norm.eps)
    q_b = linear(ctx, "q_b_proj", "Query up-projection", weight=prefix + "q_b_proj.weight", ranges=ranges,
                 d_in="q_lora_rank", d_out=H * (nope_s + rope_s), out_dim=q_out_dim, x=cq_hat, y=q_port,
                 equation=rf"{q_eq}={cq_hat.latex}[W_{{UQ}};W_{{QR}}]",
                 description=f"Expand the query latent to {n} heads of {o.nope} content and {o.rope} rotary features "
                             f"({n * d_qk:,} outputs; W_UQ and W_QR are its column blocks).", code="self.q_b_proj(q_latent)")
    return (q_a, q_norm, q_b), cq_hat.latex


def _query_steps(ctx: Ctx, o: MLAOptions, source: str, x_name: str) -> tuple[Step, ...]:
    n = o.heads
    hd = lambda *dims: ctx.tokens(Dim("heads", n), *dims)  # noqa: E731
    nope, rope_d = Dim("d_nope", o.nope), Dim("d_rope", o.rope)
    pe = r"\mathrm{pe}"
    latent: tuple[Step, ...] = ()
    if o.q_lora_rank is not None:
        latent = (Step(rf"{q('c^{Q}')}={x_name}W_{{DQ}}", ctx.tokens("q_lora_rank"), "q-down"),
                  Step(rf"{source}=\operatorname{{RMSNorm}}({q('c^{Q}')})", ctx.tokens("q_lora_rank"), "q-norm"))
    return (
        *latent,
        Step(r"c^{KV}=" + x_name + r"W_{DKV}", ctx.tokens("kv_lora_rank"), "kv-down"),
        Step(r"\hat c^{KV}=\operatorname{RMSNorm}(c^{KV})", ctx.tokens("kv_lora_rank"), "kv-norm"),
        Step(rf"{q('q^{C}')}={source}W_{{UQ}}", ctx.tokens(Dim("heads·d_nope", n * o.nope)), "q-content"),
        Step(rf"{q('Q^{C}')}=\operatorname{{reshape}}({q('q^{C}')})", hd(nope), "q-content-heads"),
        Step(rf"{q(f'q^{{{pe}}}')}={source}W_{{QR}}", ctx.tokens(Dim("heads·d_rope", n * o.rope)), "q-rope"),
        Step(rf"{q(f'Q^{{{pe}}}')}=\operatorname{{reshape}}({q(f'q^{{{pe}}}')})", hd(rope_d), "q-rope-heads"),
        Step(rf"{q('Q^{R}_{t}')}=\operatorname{{RoPE}}({q(f'Q^{{{pe}}}_{{t}}')},{ctx_colour('R_t')})", hd(rope_d), "q-rotate"),
        Step(rf"{q('Q')}=[{q('Q^{C}')};\,{q('Q^{R}')}]", hd(Dim("d_qk", o.nope + o.rope)), "q-concat"),
    )


def _kv_steps(ctx: Ctx, o: MLAOptions, x_name: str) -> tuple[Step, ...]:
    n = o.heads
    hd = lambda *dims: ctx.tokens(Dim("heads", n), *dims)  # noqa: E731
    pe = r"\mathrm{pe}"
    return (
        Step(rf"{k('k^{C}')}=\hat c^{{KV}}W_{{UK}}", ctx.tokens(Dim("heads·d_nope", n * o.nope)), "k-content"),
        Step(rf"{k('K^{C}')}=\operatorname{{reshape}}({k('k^{C}')})", hd(Dim("d_nope", o.nope)), "k-content-heads"),
        Step(rf"{k(f'k^{{{pe}}}')}={x_name}W_{{KR}}", ctx.tokens(Dim("d_rope", o.rope)), "k-rope"),
        Step(rf"{k('k^{R}_{t}')}=\operatorname{{RoPE}}({k(f'k^{{{pe}}}_{{t}}')},{ctx_colour('R_t')})",
             ctx.tokens(Dim("d_rope", o.rope)), "k-rotate"),
        Step(rf"{k('K_h')}=[{k('K^{C}_h')};\,{k('k^{R}')}]", hd(Dim("d_qk", o.nope + o.rope)), "k-concat"),
        Step(rf"{v('v')}=\hat c^{{KV}}W_{{UV}}", ctx.tokens(Dim("heads·d_v", n * o.v)), "v"),
        Step(rf"{v('V')}=\operatorname{{reshape}}({v('v')})", hd(Dim("d_v", o.v)), "v-heads"),
    )


@program("mla", role="Attention", token_mixer=True, picture=("mla", "full, multi-head latent attention (MLA)"),
         picture_rank=6, layout="latent-attention", mask_pattern=scores_mask)
def run_mla(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor, M: torch.Tensor) -> list[torch.Tensor]:
    ro = options(comp.child("rope"), RopeOptions)
    return mla_forward(comp, run, x, M, rotate_q=lambda t: run.rec("q-rotate", rotate(t, angles, ro)),
                       rotate_k=lambda t: run.rec("k-rotate", rotate(t, angles, ro)))


def mla_forward(comp: Component, run: Run, x: torch.Tensor, M: torch.Tensor, *, rotate_q: Callable[[Any], Any],
                rotate_k: Callable[[Any], Any]) -> list[torch.Tensor]:
    """MLA's computation with the query's and the shared key's rotation given (the identity where the layer has no
    positional encoding, explorer/model/components/mla_nope.py)."""
    o = options(comp, MLAOptions)
    B_, T_, _ = x.shape
    H, nope, rope_d, dv = o.heads, o.nope, o.rope, o.v
    if o.q_lora_rank is not None:
        c_q = run.rec("q-down", run_child(comp, "q_a_proj", run, x))
        c_q_hat = apply_norm(run, "q-norm", c_q, o.norm, "q_a_layernorm.")
        q_ = run_child(comp, "q_b_proj", run, c_q_hat)
    else:
        q_ = run_child(comp, "q_proj", run, x)
    kv_latent = run_child(comp, "kv_a_proj_with_mqa", run, x)
    c_kv, k_pe = run.rec("kv-down", kv_latent[..., :o.kv_lora_rank]), kv_latent[..., o.kv_lora_rank:]
    c_kv_hat = apply_norm(run, "kv-norm", c_kv, o.norm, "kv_a_layernorm.")
    q_ = q_.view(B_, T_, H, nope + rope_d)                                          # [B, T, H, d_qk]
    Q_C = run.rec("q-content-heads", q_[..., :nope])
    run.rec("q-content", Q_C.reshape(B_, T_, H * nope))
    Q_pe = run.rec("q-rope-heads", q_[..., nope:])
    run.rec("q-rope", Q_pe.reshape(B_, T_, H * rope_d))
    Q = run.rec("q-concat", torch.cat([Q_C, rotate_q(Q_pe)], dim=-1))
    kv = run_child(comp, "kv_b_proj", run, c_kv_hat).view(B_, T_, H, nope + dv)  # [B, T, H, d_nope + d_v]
    K_C = run.rec("k-content-heads", kv[..., :nope])
    run.rec("k-content", K_C.reshape(B_, T_, H * nope))
    run.rec("k-rope", k_pe)
    k_R = rotate_k(k_pe)                             # [B, T, d_rope]
    K = run.rec("k-concat", torch.cat([K_C, k_R[:, :, None, :].expand(B_, T_, H, rope_d)], dim=-1))
    V = run.rec("v-heads", kv[..., nope:])
    run.rec("v", V.reshape(B_, T_, H * dv))
    O = attend(run, options(comp.child("scores"), ScoresOptions), Q, K, V, M)
    delta = run_child(comp, "o_proj", run, O.reshape(B_, T_, H * dv))
    return [run.rec("mla", delta)]


# ---------------------------------------------------------------------------------------------- serving memory

def mla_cache(o: MLAOptions) -> int:
    """The compressed latent and the rotary key shared by every head: all MLA caches per token."""
    return o.kv_lora_rank + o.rope


@layer_memory("mla")
def mla_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """The latent and the shared rotary key per token; a query reads every cached token as full heads (the
    up-projections applied, as the reference does), so per key it spends 2 × heads × (nope + rope + v)."""
    o = comp.options
    assert isinstance(o, MLAOptions)
    full = unabsorbed_per_key(o)
    return (LayerKind(mla_cache(o), "kv_lora_rank + qk_rope_head_dim", flops_per_key=2 * full, mha_per_token=full,
                      absorbed_flops_per_key=2 * decode_costs(o)[0].per_key, decode_forms=decode_form_formulas(o)),)


# ------------------------------------------------------------------------------------ decode cost, two forms

@dataclass(frozen=True, slots=True)
class DecodeCost:
    """Multiply-adds one decoded token spends on one cached position in one MLA layer, in one form of the
    computation; what runs once per token (the projections) is in the parameter count either way."""

    form: str
    per_key: int
    """Multiply-adds per cached position per layer, all heads."""
    formula: str
    """How per_key follows from the options, in config names."""
    note: str


def unabsorbed_per_key(o: MLAOptions) -> int:
    """Multiply-adds per cached position per layer with per-head keys and values at hand, as the steps compute
    attention: each head scores d_nope + d_rope features and sums d_v (their rebuilding from the latent not counted)."""
    return o.heads * (o.nope + o.rope + o.v)


def decode_form_formulas(o: MLAOptions) -> tuple[str, ...]:
    """The FLOPs per cached position per layer (2 × multiply-adds), unabsorbed and absorbed, in keys and numbers."""
    return (f"2 × num_attention_heads × (qk_nope_head_dim + qk_rope_head_dim + v_head_dim) = "
            f"2 × {o.heads} × ({o.nope} + {o.rope} + {o.v})",
            f"2 × num_attention_heads × (2 × kv_lora_rank + qk_rope_head_dim) = "
            f"2 × {o.heads} × (2 × {o.kv_lora_rank} + {o.rope})")


def decode_costs(o: MLAOptions) -> tuple[DecodeCost, DecodeCost]:
    """MLA's decode cost per cached position with only the latent c_KV and the rotary key cached, as the reference
    caches them, in both forms:

    - absorbed: W_UK folds into the query (q̃ = q_nope W_UKᵀ, d_ckv wide) and W_UV into the output, so each head
      scores the cached latent and rotary key directly (d_ckv + d_rope) and sums the latent weighted by the scores
      (d_ckv); the folds run once per token, with the multiply-adds of kv_b_proj's weights, already counted;
    - expanded: every cached latent is projected back up by kv_b_proj to per-head keys and values
      (d_ckv × heads × (d_nope + d_v) per position), then each head scores d_nope + d_rope and sums d_v.
    """
    n, c, r, nope, v = o.heads, o.kv_lora_rank, o.rope, o.nope, o.v
    absorbed = DecodeCost("absorbed", n * (c + r + c), "heads × (2 × kv_lora_rank + qk_rope_head_dim)",
                          "scores against the cached latent and rotary key, values summed in the latent; W_UK and W_UV "
                          "applied once per token (counted with the parameters)")
    expanded = DecodeCost("expanded", c * n * (nope + v) + n * (nope + r + v),
                          "kv_lora_rank × heads × (qk_nope_head_dim + v_head_dim) + heads × (qk_nope_head_dim + "
                          "qk_rope_head_dim + v_head_dim)",
                          "each cached latent re-projected to per-head keys and values, then standard attention")
    return absorbed, expanded
