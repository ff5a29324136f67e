"""DeepStack (Qwen3-VL): the vision tower hands the text model features from several of its layers, not only its
last. After each vision block listed in deepstack_visual_indexes, a merger of its own (the patch merger with its
LayerNorm after the 2 × 2 concatenation, over the merged vector) maps the patches to image tokens of the text width;
the k-th of these is added to the hidden states at the image tokens after text decoder layer k, for the first
len(deepstack_visual_indexes) layers. Text tokens are untouched.

References: "DeepStack: Deeply Stacking Visual Tokens is Surprisingly Simple and Effective for LMMs"
(arXiv:2406.04334); the Qwen3-VL technical report (arXiv:2511.21631); transformers' models/qwen3_vl/
modeling_qwen3_vl.py (Qwen3VLVisionModel.forward, Qwen3VLVisionPatchMerger with use_postshuffle_norm,
Qwen3VLTextModel._deepstack_process) for how the reference computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import (
    PROGRAMS,
    B,
    Ctx,
    Run,
    T,
    options,
    program,
    reference_call,
    run_child,
    tensor_prefix,
)
from explorer.model.components.blocks import causal_mask, layer_order, rope_of
from explorer.model.components.check_words import OWN_ANGLES, covered
from explorer.model.components.linear import linear
from explorer.model.components.mrope import EXAMPLE, example_words, image_positions
from explorer.model.components.norms import layernorm
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step

LN_EPS = 1e-6
"""The reference hard-codes the mergers' LayerNorm epsilon."""


@dataclass(frozen=True, slots=True)
class DeepStackOptions:
    vision_layers: tuple[int, ...]
    """deepstack_visual_indexes: the vision blocks whose outputs feed a DeepStack merger, in order."""
    merge: int = 2
    """spatial_merge_size: patches per side of one merged token."""

    @property
    def levels(self) -> int:
        return len(self.vision_layers)


# ------------------------------------------------------------------------------------------- the numbers

def injection_layers(o: DeepStackOptions) -> tuple[int, ...]:
    """The text decoder layers after which the features are added: the k-th feature after layer k."""
    return tuple(range(o.levels))


def add_at_image_tokens(x: torch.Tensor, image: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """x + m ⊙ F: the features (laid out per position, [B, T, d]) added where the image mask m [B, T] is set."""
    return x + image[..., None].to(x.dtype) * features.to(x.dtype)


# ------------------------------------------------------------------------------------------------- spec

def deepstack_mergers(ctx: Ctx, o: DeepStackOptions, *, prefix: str, patches: int, cite: Citation,
                      classes: str) -> Component:
    """One merger per DeepStack level: concatenate each merge × merge neighbourhood, LayerNorm the merged vector,
    then fc2(GELU(fc1 u + b1)) + b2 to the text width."""
    ranges = (IndexRange("layer", tuple(range(o.levels))),)
    p = prefix + "{layer}."
    M, m2 = ctx.sym("vit_merged_size"), o.merge ** 2
    tokens = Dim("image tokens", patches // m2)
    merged = Shape((tokens, ctx.dim("vit_merged_size")))
    x = Port(r"\psi_{n+1}", Shape((Dim("patches", patches), ctx.dim("vit_hidden_size"))), "psi")
    u = Port(r"\psi^{\mathrm{cat}}", merged, "u")
    norm = layernorm(ctx, "norm", "LayerNorm over the merged vector", weight=p + "norm.weight", ranges=ranges,
                     size="vit_merged_size", x=u, y=Port(r"\hat \psi^{\mathrm{cat}}", merged, "u_hat"),
                     code="self.norm(x.view(-1, self.hidden_size))", eps=LN_EPS, citations=(cite,))
    fc1 = linear(ctx, "linear_fc1", "Merger expansion", weight=p + "linear_fc1.weight", ranges=ranges, d_in=M,
                 d_out=M, out_dim=ctx.dim("vit_merged_size"), x=norm.outputs[0], y=Port("g", merged, "g"),
                 equation=r"g=\hat \psi^{\mathrm{cat}}\,W_1+b_1", bias=True, code="self.linear_fc1(x)",
                 description=f"Mix the {m2} concatenated, normalised patches' {ctx.size('vit_merged_size'):,} "
                             "features.")
    out = Port("F", Shape((tokens, ctx.dim("vit_out_hidden_size"))), "F")
    fc2 = linear(ctx, "linear_fc2", "Projection to the text width", weight=p + "linear_fc2.weight", ranges=ranges,
                 d_in=M, d_out=ctx.sym("vit_out_hidden_size"), out_dim=ctx.dim("vit_out_hidden_size"),
                 x=Port("m", merged, "h"), y=out, equation=r"F=mW_2+b_2", bias=True, code="self.linear_fc2(x)",
                 description=f"Project to the text model's {ctx.size('vit_out_hidden_size'):,} features.")
    concat = Step(rf"\psi^{{\mathrm{{cat}}}}_i=[\psi_{{n+1,{m2}i}};\dots;\psi_{{n+1,{m2}i+{m2 - 1}}}]", merged, "concat")
    steps = (concat, norm.steps[0], fc1.steps[0], Step(r"m=\operatorname{GELU}(g)", merged, "gelu"), fc2.steps[0])
    return Component(
        key="deepstack_merger_list", title="DeepStack mergers", kind="learned",
        code=f"{classes}VisionPatchMerger(config, use_postshuffle_norm=True)",
        description=f"One merger per DeepStack level ({o.levels}), reading the outputs of vision blocks "
                    f"{', '.join(str(i) for i in o.vision_layers)}: unlike the final merger, each concatenates a "
                    f"{o.merge}×{o.merge} neighbourhood first and normalises the merged vector.",
        repeat=o.levels, repeat_label="DeepStack mergers", crumb=f"{o.levels} DeepStack mergers", inputs=(x,),
        outputs=(out,), equations=(steps[1], steps[-1]), steps=steps, children=(norm, fc1, fc2), citations=(cite,),
        program="deepstack_merger", options=o,
    )


def deepstack_stack(ctx: Ctx, blocks: tuple[Component, ...], *, o: DeepStackOptions, layers: int, reference: str,
                    description: str, citations: tuple[Citation, ...]) -> Component:
    """The decoder layers in order, with the k-th DeepStack feature added at the image tokens after layer k."""
    x, angles, mask = blocks[0].inputs
    image = Port(r"m^{\mathrm{img}}", Shape((B, T)), "image_mask")
    features = Port("F", Shape((Dim("levels", o.levels), B, T, ctx.dim("hidden_size"))), "deepstack")
    last = o.levels - 1
    stack = Step(rf"x_{{n+1}}=\operatorname{{Block}}_n(x_n;\,{angles.latex},{mask.latex}),\quad n=0,\dots,{layers - 1}",
                 x.shape, "stack")
    inject = Step(rf"x_{{n+1}}\leftarrow x_{{n+1}}+m^{{\mathrm{{img}}}}\odot F_n,\quad n=0,\dots,{last}", x.shape,
                  "inject")
    return Component(
        key="blocks", title="Transformer blocks with DeepStack", crumb=f"{layers} transformer blocks", kind="group",
        code=f"nn.ModuleList({ctx.reference.prefix}DecoderLayer(config, i) for i in range(num_hidden_layers))",
        description=description, inputs=(*blocks[0].inputs, image, features), outputs=blocks[0].outputs,
        equations=(stack, inject), steps=(stack, inject), children=blocks, citations=citations,
        program="deepstack_stack", options=o, reference=reference,
        notes=(f"m^img_t is 1 at the image tokens and 0 elsewhere; F_n holds the n-th DeepStack merger's image tokens at "
               f"those positions. The features join after layers 0 to {last} only: the later layers see them through "
               "the residual stream.",),
    )


# ----------------------------------------------------------------------------------------------- programs

@program("deepstack_merger")
def run_deepstack_merger(comp: Component, run: Run, z: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, DeepStackOptions)
    u = run.rec("concat", z.reshape(-1, z.shape[-1] * o.merge ** 2))              # [N / m², m²·d]
    g = run_child(comp, "linear_fc1", run, run_child(comp, "norm", run, u))
    return [run_child(comp, "linear_fc2", run, run.rec("gelu", F.gelu(g)))]


@program("deepstack_stack", whole_model=True)
def run_deepstack_stack(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor, M: torch.Tensor,
                        image: torch.Tensor | None = None, features: torch.Tensor | None = None) -> list[torch.Tensor]:
    """angles: the rotary angles of every position (from the three-axis positions); image [B, T]; features
    [levels, B, T, d], one per injection layer. Without them (a prompt of text alone, as the whole text model runs
    it) nothing is added: DeepStack adds features at image tokens only."""
    o = options(comp, DeepStackOptions)
    after = injection_layers(o)
    order = layer_order(comp)
    rope_c = rope_of(comp)
    if angles.numel() == 0 and rope_c is not None:  # handed none (the whole text model): a text prompt's angles,
        # whose three axes count the same positions
        (angles,) = PROGRAMS[rope_c.program](rope_c, Run({}), torch.arange(x.shape[1], device=x.device))
    if x.is_meta:  # shapes only: every layer of a kind maps x to the same shape, so trace each kind once
        order = [next(p for p in order if p[1] is b) for b in comp.children]
    for layer, block in order:
        (x,) = PROGRAMS[block.program](block, run.child(tensor_prefix(block).format(layer=layer), "_"), x, angles, M)
        if layer in after and image is not None and features is not None:
            x = run.rec("inject", add_at_image_tokens(x, image, features[after.index(layer)]))
    return [run.rec("stack", x)]


@reference_call("deepstack_stack")
def call_deepstack_stack(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The text model on a prompt holding an image, with random DeepStack features at its tokens: ours against the
    reference's hidden states before its final norm (the executor's own inputs carry no image)."""
    o = options(comp, DeepStackOptions)
    positions = image_positions(*EXAMPLE)
    T_, width = positions.shape[1], inputs[0].shape[-1]
    image = torch.zeros(1, T_, dtype=torch.bool)
    image[0, EXAMPLE[0]:EXAMPLE[0] + EXAMPLE[1] * EXAMPLE[2]] = True
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, T_, width, generator=g)
    features = torch.randn(o.levels, 1, T_, width, generator=g) * image[None, ..., None]
    rope_c = rope_of(comp)
    assert rope_c is not None  # the family builds every Qwen3-VL layer with the multimodal rope
    (angles,) = PROGRAMS[rope_c.program](rope_c, Run({}), positions)
    (mine,) = run_deepstack_stack(comp, Run(run.weights), x, angles, causal_mask(T_, x.device), image, features)
    seen: list[torch.Tensor] = []
    hook = ref.norm.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    try:
        ref(inputs_embeds=x, position_ids=positions[:, None, :], visual_pos_masks=image,
            deepstack_visual_embeds=[f[image] for f in features])
    finally:
        hook.remove()
    return mine, seen[0], covered(example_words(), f"{o.levels} random DeepStack features at the image tokens",
                                  "the hidden states before the final norm", OWN_ANGLES)


__all__ = ["DeepStackOptions", "deepstack_mergers", "deepstack_stack", "injection_layers", "add_at_image_tokens"]
