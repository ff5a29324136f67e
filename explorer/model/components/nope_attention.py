"""Attention without positional encoding (NoPE): grouped-query attention whose queries and keys are not rotated,
as in Nemotron-H's few attention layers, where the Mamba-2 layers' causal recurrence already tells positions apart,
and in SmolLM3's every fourth layer, between rotary layers that do.

References: "Transformer Language Models without Positional Encodings Still Learn Positional Information"
(arXiv:2203.16634); Nemotron-H (arXiv:2504.03624); transformers' models/nemotron_h/modeling_nemotron_h.py
(NemotronHAttention: q/k/v/o projections, no rotary embedding) and models/smollm3/modeling_smollm3.py
(SmolLM3Attention with use_rope 0: the same projections, the rotary angles it is handed left unused).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from explorer.model.components.attention import (
    ScoresOptions,
    attend,
    headline_steps,
    plain_memory,
    scores,
    scores_mask,
)
from explorer.model.components.base import (
    Ctx,
    Run,
    ctx_colour,
    first_steps,
    k,
    options,
    program,
    q,
    reference_call,
    run_child,
    v,
)
from explorer.model.components.check_words import NO_ROTARY, covered, given_mask
from explorer.model.components.linear import linear
from explorer.model.components.serving import layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step


def nope_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, y: Port, so: ScoresOptions,
                   citations: tuple[Citation, ...], order_from: str = "the Mamba-2 layers before it") -> Component:
    """q, k, v projections, heads, causal softmax attention with KV groups, output projection; no rotary step.
    order_from: what else, besides the causal mask, gives the layer's input its sense of order (for the notes)."""
    n, kvh, hd = so.heads, so.kv_heads, ctx.size("head_dim")
    H, Hkv, D = ctx.sym("num_attention_heads"), ctx.sym("num_key_value_heads"), ctx.sym("head_dim")
    heads, d_head = Dim("heads", n), Dim("d_head", hd)
    d = ctx.size("hidden_size")

    def proj(key: str, title: str, out: object, dim: Dim, latex: str, name: str, what: str) -> Component:
        return linear(ctx, key, title, weight=prefix + key + ".weight", ranges=ranges, d_in="hidden_size",
                      d_out=out, out_dim=dim, x=x, y=Port(latex, ctx.tokens(dim), name),  # type: ignore[arg-type]
                      equation=rf"{latex}={x.latex}W_{{{key[0].upper()}}}", code=f"self.{key}(hidden_states)",
                      description=f"Project {d:,} features to {what}.")

    q_dim, kv_dim = Dim("heads·d_head", n * hd), Dim("kv_heads·d_head", kvh * hd)
    sc = scores(ctx, so, d_qk=hd, d_v=hd, scale_latex=rf"\tau=1/\sqrt{{{hd}}}={so.scale:.6f}",
                description=f"Causal softmax attention of {n} query heads over {kvh} key/value heads, with no "
                            "positional rotation.", citations=citations[:1])
    children = (
        proj("q_proj", "Query projection", H * D, q_dim, q("q"), "q", f"{n} query heads of {hd}"),
        proj("k_proj", "Key projection", Hkv * D, kv_dim, k("k"), "k", f"{kvh} key heads of {hd}"),
        proj("v_proj", "Value projection", Hkv * D, kv_dim, v("v"), "v", f"{kvh} value heads of {hd}"),
        sc,
        linear(ctx, "o_proj", "Output projection", weight=prefix + "o_proj.weight", ranges=ranges, d_in=H * D,
               d_out="hidden_size", out_dim=ctx.dim("hidden_size"),
               x=Port(ctx_colour("O"), ctx.tokens(q_dim), "O"), y=y,
               equation=rf"{y.latex}=[{ctx_colour('O_1')};\dots;{ctx_colour(f'O_{{{n}}}')}]W_{{O}}",
               code="self.o_proj(attn_output)", description=f"Mix the {n} heads' outputs back to {d:,} features."),
    )
    steps = (*first_steps(children, "q_proj", "k_proj", "v_proj"),
             Step(rf"{q('Q')}=\operatorname{{reshape}}({q('q')}),\ {k('K')}=\operatorname{{reshape}}({k('k')}),\ "
                  rf"{v('V')}=\operatorname{{reshape}}({v('v')})", ctx.tokens(heads, d_head), "heads"),
             *sc.steps, *first_steps(children, "o_proj"))
    return Component(
        key="attn", title="Grouped-query attention (no RoPE)", crumb="Attention", kind="learned",
        code=f"{ctx.reference.prefix}Attention(config, layer_idx)",
        description=f"{n} query heads of {hd} features attend causally over {kvh} key/value heads; queries and keys "
                    "carry no positional rotation.",
        inputs=(x, sc.inputs[3]), outputs=(y,),
        equations=headline_steps(steps),
        steps=steps, children=children, citations=citations, program="nope_attention",
        notes=("No rotary or absolute position enters this layer: order reaches it through the causal mask and "
               f"{order_from}.", f"Each key/value head serves {so.groups} query heads."),
    )


@program("nope_attention", role="Attention", token_mixer=True, positions_from_child=True,
         mask_pattern=scores_mask)
def run_nope_attention(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """rest: the mask, or (in a block whose stack hands every layer its kind's angles, empty here) angles and mask."""
    M = rest[-1]
    so = options(comp.child("scores"), ScoresOptions)
    b, T, _ = x.shape
    hd = comp.child("q_proj").outputs[0].shape.dims[-1].size // so.heads  # type: ignore[operator]
    Q = run.rec("heads", run_child(comp, "q_proj", run, x).view(b, T, so.heads, hd))    # [B, T, H, d_head]
    K = run_child(comp, "k_proj", run, x).view(b, T, so.kv_heads, hd)                  # [B, T, H_kv, d_head]
    V = run_child(comp, "v_proj", run, x).view(b, T, so.kv_heads, hd)
    O = attend(run, so, Q, K, V, M)
    return [run.rec("attention", run_child(comp, "o_proj", run, O.reshape(b, T, so.heads * hd)))]


@reference_call("nope_attention")
def call_nope_attention(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    x, M = inputs[0], inputs[-1]
    # SmolLM3's attention takes the rotary angles on every layer and leaves them unused where use_rope is 0
    takes_angles = "position_embeddings" in inspect.signature(ref.forward).parameters
    out = ref(hidden_states=x, attention_mask=M[None, None], **({"position_embeddings": None} if takes_angles else {}))
    return ours, out[0], covered(given_mask(), NO_ROTARY)


layer_memory("nope_attention")(plain_memory)  # K and V of each key/value head, as plain attention caches them
