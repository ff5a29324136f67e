"""Multi-head attention with one fused query-key-value projection (GPT-2's c_attn): a single [in, out] matrix and
bias yield q, k and v side by side, which a split separates before the heads; no rotary embedding (positions are
learned and added to the token embedding instead).

References: "Language Models are Unsupervised Multitask Learners" (Radford et al., 2019); transformers'
models/gpt2/modeling_gpt2.py (GPT2Attention: c_attn(...).split(split_size, dim=2)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.attention import (
    KEYS,
    QUERIES,
    ScoresOptions,
    attend,
    call_with_rotary,
    headline_steps,
    plain_memory,
    scores,
    scores_mask,
)
from explorer.model.components.base import Ctx, Run, ctx_colour, k, options, program, q, reference_call, run_child, v
from explorer.model.components.linear import linear
from explorer.model.components.serving import layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Layout, Port, Shape, Step


@dataclass(frozen=True, slots=True)
class FusedAttentionOptions:
    heads: int
    head_dim: int


def fused_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, scores_options: ScoresOptions,
                    names: tuple[str, str] = ("c_attn", "c_proj"), layout: Layout = "in_out", bias: bool = True,
                    citations: tuple[Citation, ...] = (), notes: tuple[str, ...] = ()) -> Component:
    """x W_qkv + b → split into q, k, v → heads → softmax(τ QKᵀ + M) V → output projection."""
    so = scores_options
    n, hd, d = so.heads, ctx.size("head_dim"), ctx.size("hidden_size")
    qkv_n, out_n = names
    H = ctx.sym("hidden_size")
    heads, d_head, width = Dim("heads", n), Dim("d_head", hd), ctx.dim("hidden_size")
    fused = Dim("3·d", 3 * d)
    qkv = linear(ctx, qkv_n, "Fused QKV projection", weight=prefix + qkv_n + ".weight", ranges=ranges,
                 d_in="hidden_size", d_out=3 * H, out_dim=fused, x=x, y=Port(r"[q;k;v]", ctx.tokens(fused), "qkv"),
                 equation=rf"[{q('q')};{k('k')};{v('v')}]={x.latex}W_{{\mathrm{{qkv}}}}"
                          + (r"+b_{\mathrm{qkv}}" if bias else ""),
                 description=f"One matrix projects {d:,} features to {3 * d:,}: the queries, keys and values of all "
                             f"{n} heads side by side.", code=f"self.{qkv_n}(hidden_states)", bias=bias, layout=layout)
    split = Step(rf"{q('q')}=[q;k;v]_{{:,\,0:{d}}},\ {k('k')}=[q;k;v]_{{:,\,{d}:{2 * d}}},\ "
                 rf"{v('v')}=[q;k;v]_{{:,\,{2 * d}:{3 * d}}}", ctx.tokens(width), "split")
    reshape = Step(rf"{q('Q')}=\operatorname{{reshape}}({q('q')}),\ {k('K')}=\operatorname{{reshape}}({k('k')}),\ "
                   rf"{v('V')}=\operatorname{{reshape}}({v('v')})", ctx.tokens(heads, d_head), "heads")
    sc = scores(ctx, so, d_qk=hd, d_v=hd, scale_latex=rf"\tau=1/\sqrt{{d_{{\mathrm{{head}}}}}}=1/\sqrt{{{hd}}}="
                                                      rf"{so.scale:.6f}",
                description=f"Causal softmax attention of {n} heads over {hd}-dimensional dot products, scaled by "
                            f"1/√{hd}.", citations=citations[:1])
    o_in = Port(ctx_colour("O"), ctx.tokens(Dim("heads·d_head", n * hd)), "O")
    out = linear(ctx, out_n, "Output projection", weight=prefix + out_n + ".weight", ranges=ranges, d_in="hidden_size",
                 d_out="hidden_size", out_dim=width, x=o_in, y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                 equation=rf"\Delta_{{\mathrm{{attn}}}}=[{ctx_colour('O_1')};\dots;{ctx_colour(f'O_{{{n}}}')}]"
                          r"W_{O}" + (r"+b_{O}" if bias else ""),
                 description=f"Mix the {n} heads' outputs ({n * hd:,} features) back to {d:,} features.",
                 code=f"self.{out_n}(attn_output)", bias=bias, layout=layout)
    steps = (qkv.steps[0], split, reshape, *sc.steps, out.steps[0])
    return Component(
        key="attn", title="Multi-head attention (fused QKV)", kind="learned",
        code="GPT2Attention(config, layer_idx)",
        description=f"{n} heads of {hd} features; one fused projection yields queries, keys and values, split apart "
                    "before the heads.",
        inputs=(x, Port("M", Shape((QUERIES, KEYS)), "mask")),
        outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=headline_steps(steps),
        steps=steps, children=(qkv, sc, out), citations=citations, notes=notes, program="fused_attention",
        options=FusedAttentionOptions(n, hd),
    )


@program("fused_attention", role="Attention", token_mixer=True, mask_pattern=scores_mask)
def run_fused_attention(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """rest ends with the mask (a block passes rotary angles first, which this attention does not use)."""
    o = options(comp, FusedAttentionOptions)
    B_, T_, _ = x.shape
    qkv_c, sc, out_c = comp.children
    qkv = run_child(comp, qkv_c.key, run, x)
    q_, k_, v_ = qkv.split(o.heads * o.head_dim, dim=-1)
    run.rec("split", q_)
    Q = run.rec("heads", q_.reshape(B_, T_, o.heads, o.head_dim))
    K = k_.reshape(B_, T_, o.heads, o.head_dim)
    V = v_.reshape(B_, T_, o.heads, o.head_dim)
    O = attend(run, options(sc, ScoresOptions), Q, K, V, rest[-1])
    delta = run_child(comp, out_c.key, run, O.reshape(B_, T_, o.heads * o.head_dim))
    return [run.rec("attention", delta)]


reference_call("fused_attention")(call_with_rotary)


layer_memory("fused_attention")(plain_memory)  # K and V of each key/value head, as plain attention caches them
