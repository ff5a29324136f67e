"""The post-norm-in-branch block (OLMo 2): each branch reads the residual stream as it is and is normalised at its
end, inside the branch, before it is added back: x' = x + Norm(Attn(x)); x_{n+1} = x' + Norm(FFN(x')). No norm
sits before either branch, so the stream itself is never normalised until the model's final norm; unlike the
original post-norm transformer (Norm(x + F(x))), the residual path stays an identity.

The pre-norm block (blocks.py) normalises a branch's input; Gemma's sandwich block normalises both ends. This
part is the third placement: the output only. Its children come in the order data passes through them: attention,
its norm, the feed-forward network, its norm.

References: "2 OLMo 2 Furious" (arXiv:2501.00656, section 3: the norms moved to the branch outputs for training
stability); transformers' models/olmo2/modeling_olmo2.py (Olmo2DecoderLayer: post_attention_layernorm and
post_feedforward_layernorm applied to each branch before the residual addition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

from explorer.model.components.attention import call_with_rotary
from explorer.model.components.base import Ctx, Run, options, program, reference_call, relative_module, run_child
from explorer.model.components.blocks import feed_forward_heading
from explorer.model.components.norms import NormOptions, apply_norm
from explorer.spec.types import Citation, Component, Port, Step


class PostNormPorts(NamedTuple):
    """The residual stream through one post-norm block: the block's input (attention's input too), each branch's
    output, each branch's normalised output, and the stream between the branches (the FFN's input)."""

    x: Port
    delta_attn: Port
    delta_attn_hat: Port
    x_mid: Port
    delta_ffn: Port
    delta_ffn_hat: Port


def post_norm_ports(ctx: Ctx) -> PostNormPorts:
    x = Port("x_n", ctx.tokens("hidden_size"), "x")
    return PostNormPorts(x, Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
                         Port(r"\bar\Delta_{\mathrm{attn}}", x.shape, "delta_attn_hat"), Port("x'_n", x.shape, "x_mid"),
                         Port(r"\Delta_{\mathrm{ffn}}", x.shape, "delta_ffn"),
                         Port(r"\bar\Delta_{\mathrm{ffn}}", x.shape, "delta_ffn_hat"))


@dataclass(frozen=True, slots=True)
class PostNormBlockOptions:
    post_attn_norm: bool = True
    """The attention branch ends in a norm (its output, not its input, is normalised)."""
    post_ffn_norm: bool = True
    """The feed-forward branch ends in a norm."""


def post_norm_block(ctx: Ctx, key: str, title: str, *, layer_indices: tuple[int, ...], attn: Component,
                    post_attn_norm: Component, ffn: Component, post_ffn_norm: Component, kind: str, description: str,
                    citations: tuple[Citation, ...], attn_heading: str = "") -> Component:
    """x'_n = x_n + Norm(Attn(x_n)); x_{n+1} = x'_n + Norm(FFN(x'_n)), repeated over `layer_indices`."""
    x = attn.inputs[0]
    d_attn, d_ffn = post_attn_norm.outputs[0].latex, post_ffn_norm.outputs[0].latex
    residual_attn = Step(rf"x'_n=x_n+{d_attn}", x.shape, "residual-attn")
    residual_ffn = Step(rf"x_{{n+1}}=x'_n+{d_ffn}", x.shape, "residual-ffn")
    steps = (Step(rf"\text{{{attn_heading or attn.title} (reads }}x_n\text{{, no norm before it):}}", heading=True,
                  name="attention"), *attn.steps, post_attn_norm.equations[0], residual_attn,
             Step(rf"\text{{{feed_forward_heading(ffn)[:-1]} (reads }}x'_n\text{{):}}",
                  heading=True, name="ffn"), *ffn.steps, post_ffn_norm.equations[0], residual_ffn)
    n = len(layer_indices)
    noun = f"{kind} block" + ("s" if n != 1 else "")
    return Component(
        key=key, title=title, kind="learned", code=f"{ctx.reference.prefix}DecoderLayer(config, layer_idx)",
        description=description, repeat=n, repeat_label=noun, crumb=f"{n} {noun}",
        inputs=(x, *attn.inputs[1:]), outputs=(Port("x_{n+1}", x.shape, "x_next"),),
        equations=(residual_attn, residual_ffn), steps=steps, children=(attn, post_attn_norm, ffn, post_ffn_norm),
        citations=citations, program="post_norm_block", options=PostNormBlockOptions(),
    )


def _norm(comp: Component, key: str, run: Run, x: torch.Tensor) -> torch.Tensor:
    child = comp.child(key)
    return apply_norm(run, key, x, options(child, NormOptions), relative_module(comp, child))


@program("post_norm_block", layout="residual-block")
def run_post_norm_block(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """rest: what the attention takes besides x (rotary angles and the mask)."""
    o = options(comp, PostNormBlockOptions)
    attn, _, ffn, _ = comp.children
    delta_attn = run_child(comp, attn.key, run, x, *rest)
    if o.post_attn_norm:
        delta_attn = _norm(comp, "post_attn_norm", run, delta_attn)
    x_mid = run.rec("residual-attn", x + delta_attn)
    delta_ffn = run_child(comp, ffn.key, run, x_mid)
    if o.post_ffn_norm:
        delta_ffn = _norm(comp, "post_ffn_norm", run, delta_ffn)
    return [run.rec("residual-ffn", x_mid + delta_ffn)]


reference_call("post_norm_block")(call_with_rotary)  # the decoder layer takes cos/sin and its model's mask
