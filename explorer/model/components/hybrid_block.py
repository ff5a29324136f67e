"""The one-branch residual block of hybrid stacks: x_{n+1} = x_n + Mixer_n(RMSNorm(x_n)), where each layer's mixer is
one of several kinds (a Mamba-2 mixer, attention, a mixture of experts, an MLP) chosen by the layer pattern.

Unlike a transformer block, which runs attention and then an FFN in one layer, such a layer has a single norm and a
single mixer; a pattern such as Nemotron-H's "MEMEM*E..." interleaves the kinds.

References: Nemotron-H (arXiv:2504.03624); transformers' models/nemotron_h/modeling_nemotron_h.py (NemotronHBlock).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from explorer.model.components.base import Ctx, Run, program, reference_call, run_child
from explorer.model.components.check_words import given_mask
from explorer.spec.types import Citation, Component, Port, Step

TAKES_MASK = ("nope_attention",)
"""Mixer programs that take the causal mask beside x."""


def mixer_ports(ctx: Ctx) -> tuple[Port, Port, Port]:
    """The block's input, its normalised input (the mixer's input), and the mixer's output."""
    x = Port("x_n", ctx.tokens("hidden_size"), "x")
    return x, Port(r"x_{\mathrm{mix}}", x.shape, "x_mix"), Port(r"\Delta_{\mathrm{mix}}", x.shape, "delta")


def mixer_block(ctx: Ctx, key: str, title: str, *, layer_indices: tuple[int, ...], norm: Component, mixer: Component,
                kind: str, description: str, citations: tuple[Citation, ...], heading: str) -> Component:
    """x_{n+1} = x_n + Mixer(Norm(x_n)), repeated over `layer_indices`."""
    x = norm.inputs[0]
    residual = Step(rf"x_{{n+1}}=x_n+{mixer.outputs[0].latex}", x.shape, "residual")
    steps = (norm.equations[0], Step(rf"\text{{{heading}:}}", heading=True, name="mixer"), *mixer.steps, residual)
    n = len(layer_indices)
    noun = f"{kind} layer" + ("s" if n != 1 else "")
    return Component(
        key=key, title=title, kind="learned", code=f"{ctx.reference.prefix}Block(config, layer_idx)",
        description=description,
        repeat=n, repeat_label=noun, crumb=f"{n} {noun}", inputs=(x, *mixer.inputs[1:]),
        outputs=(Port("x_{n+1}", x.shape, "x_next"),), equations=(residual,), steps=steps, children=(norm, mixer),
        citations=citations, program="mixer_block",
    )


@program("mixer_block")
def run_mixer_block(comp: Component, run: Run, x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
    """rest: what the stack hands every block (rotary angles, unused here, and the mask last)."""
    norm, mixer = comp.children
    x_mix = run_child(comp, norm.key, run, x)
    extra = (rest[-1],) if mixer.program in TAKES_MASK else ()
    delta = run_child(comp, mixer.key, run, x_mix, *extra)
    return [run.rec("residual", x + delta)]


@reference_call("mixer_block")
def call_mixer_block(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    x = inputs[0]
    if comp.children[1].program in TAKES_MASK:
        return ours, ref(x, attention_mask=inputs[-1][None, None]), given_mask()
    return ours, ref(x), ""
