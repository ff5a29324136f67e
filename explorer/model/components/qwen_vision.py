"""Qwen3.5's vision tower and merger: a 3-D patch embedding (two frames × patch × patch pixels per patch), learned
positions resampled to the image's patch grid, bidirectional encoder blocks with a fused, biased q/k/v projection and
2-D rotary position (height and width angles side by side), and a merger that concatenates each 2 × 2 neighbourhood
of patches and maps it through a GELU MLP to the text model's width.

The pages show one image at the learned position grid's native size (√num_position_embeddings patches a side, one
temporal patch), where the bilinear resampling of the position table reduces to picking each patch's own row;
patches arrive in merge order (each 2 × 2 neighbourhood consecutive), as the reference's processor lays them out.

References: Qwen2-VL (arXiv:2409.12191) for the native-resolution ViT with 2-D rotary positions and the patch
merger; transformers' models/qwen3_5/modeling_qwen3_5.py (Qwen3_5VisionModel, Qwen3_5VisionBlock,
Qwen3_5VisionPatchMerger) for how the reference computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import (
    PROGRAMS,
    Ctx,
    Reference,
    Run,
    options,
    program,
    reference_call,
    relative_module,
    run_child,
)
from explorer.model.components.check_words import GIVEN_ANGLES, covered
from explorer.model.components.deepstack import DeepStackOptions, deepstack_mergers
from explorer.model.components.linear import linear
from explorer.model.components.mlp import tower_mlp
from explorer.model.components.norms import layernorm
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step

LABELS = {"vit_hidden_size": "d_vision", "vit_intermediate_size": "d_ff_vision", "vit_patch_values": "patch_values",
          "vit_positions": "positions_table", "vit_merged_size": "d_merge", "vit_out_hidden_size": "d_out",
          "vit_in_channels": "channels", "vit_temporal_patch_size": "frames", "vit_patch_size": "patch"}
"""Short names of the vision sizes in shapes."""
LN_EPS = 1e-6
"""The reference hard-codes the LayerNorms' epsilon."""
ROW, COL = r"\operatorname{row}(i)", r"\operatorname{col}(i)"
"""The row and column of patch i in its image (the 2D rotary angles and the position table read them)."""


@dataclass(frozen=True, slots=True)
class VisionOptions:
    side: int
    """Patches per side of the example image (the position table's native grid)."""
    merge: int
    """spatial_merge_size: patches per side of one merged token."""
    heads: int
    head_dim: int
    theta: float = 10_000.0

    @property
    def patches(self) -> int:
        return self.side * self.side


def patch_positions(o: VisionOptions, device: torch.device | None = None) -> torch.Tensor:
    """(row, column) of each patch in merge order: the merge blocks row by row, each block's patches row by row."""
    m, blocks = o.merge, o.side // o.merge
    r = torch.arange(blocks, device=device)[:, None, None, None] * m + torch.arange(m, device=device)[None, None, :, None]
    c = torch.arange(blocks, device=device)[None, :, None, None] * m + torch.arange(m, device=device)[None, None, None, :]
    r, c = torch.broadcast_tensors(r, c)
    return torch.stack([r.reshape(-1), c.reshape(-1)], dim=-1)                      # [N, 2]


def vision_angles(o: VisionOptions, device: torch.device | None = None) -> torch.Tensor:
    """The angles of each patch: row·ω_j then column·ω_j, ω_j = θ^(−2j/(d_head/2)), [N, d_head/2]."""
    half = o.head_dim // 2
    omega = 1.0 / (o.theta ** (torch.arange(0, half, 2, device=device).float() / half))
    pos = patch_positions(o, device).float()
    return torch.cat([pos[:, :1] * omega, pos[:, 1:] * omega], dim=-1)


def rotate_heads(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate feature j with feature j + d/2 of every head by angle j: x [N, H, d], angles [N, d/2]."""
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    x1, x2 = x[..., :angles.shape[-1]], x[..., angles.shape[-1]:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


# --------------------------------------------------------------------------------------------------- spec

def _patches(ctx: Ctx, o: VisionOptions, width: str = "vit_hidden_size") -> Shape:
    return Shape((Dim("patches", o.patches), ctx.dim(width)))


def vision_attention(ctx: Ctx, o: VisionOptions, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port,
                     cite: Citation, classes: str = "Qwen3_5") -> Component:
    D = ctx.sym("vit_hidden_size")
    d = ctx.size("vit_hidden_size")
    qkv = linear(ctx, "qkv", "Fused query, key and value projection", weight=prefix + "qkv.weight", ranges=ranges,
                 d_in=D, d_out=3 * D, out_dim=Dim("3·d_vision", 3 * d), x=x,
                 y=Port("[q;k;v]", Shape((Dim("patches", o.patches), Dim("3·d_vision", 3 * d))), "qkv"),
                 equation=rf"[q;k;v]={x.latex}W_{{qkv}}+b_{{qkv}}", bias=True, code="self.qkv(hidden_states)",
                 description=f"Project {d:,} features to queries, keys and values ({3 * d:,} outputs, with a bias).")
    out = Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn")
    proj = linear(ctx, "proj", "Output projection", weight=prefix + "proj.weight", ranges=ranges, d_in=D, d_out=D,
                  out_dim=ctx.dim("vit_hidden_size"), x=Port("O", x.shape, "O"), y=out, bias=True,
                  equation=rf"\Delta_{{\mathrm{{attn}}}}=[O_1;\dots;O_{{{o.heads}}}]W_O+b_O", code="self.proj(attn_output)",
                  description=f"Mix the {o.heads} heads' outputs back to {d:,} features.")
    heads = Shape((Dim("patches", o.patches), Dim("heads", o.heads), Dim("d_head", o.head_dim)))
    steps = (qkv.steps[0],
             Step(rf"Q^R_i=\operatorname{{RoPE}}_{{2D}}(q_i;\,{ROW},{COL}),\ K^R_i=\operatorname{{RoPE}}_{{2D}}(k_i;\,{ROW},"
                  rf"{COL}),\quad \text{{angles}}\ ({ROW}\,\omega_j,\ {COL}\,\omega_j),\ \omega_j={o.theta:g}^{{-4j/{o.head_dim}}}",
                  heads, "rotate"),
             Step(rf"O_h=\operatorname{{softmax}}\!\left(Q^R_hK_h^{{R\top}}/\sqrt{{{o.head_dim}}}\right)v_h,\quad "
                  rf"h=1,\dots,{o.heads}", x.shape, "attend"),
             proj.steps[0])
    return Component(
        key="attn", title="Bidirectional attention with 2-D rotary", kind="learned",
        code=f"{classes}VisionAttention(config)",
        description=f"{o.heads} heads of {o.head_dim}; half of each head's rotary pairs turn with the patch's row, "
                    "half with its column; every patch of an image attends to every other (no mask).",
        inputs=(x,), outputs=(out,), equations=(steps[2],), steps=steps, children=(qkv, proj), citations=(cite,),
        program="qwen_vision_attention", options=o,
    )


def vision_mlp(ctx: Ctx, o: VisionOptions, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port,
               y: Port, cite: Citation, classes: str = "Qwen3_5") -> Component:
    return tower_mlp(ctx, prefix=prefix, ranges=ranges, x=x, y=y, hidden=_patches(ctx, o, "vit_intermediate_size"),
                     sizes=("vit_hidden_size", "vit_intermediate_size"), names=("linear_fc1", "linear_fc2"),
                     calls=("self.linear_fc1(hidden_state)", "self.linear_fc2(...)"), code=f"{classes}VisionMLP(config)",
                     citations=(cite,))


def vision_block(ctx: Ctx, o: VisionOptions, *, prefix: str, depth: int, cite: Citation,
                 mlp_cite: Citation, classes: str = "Qwen3_5") -> Component:
    ranges = (IndexRange("layer", tuple(range(depth))),)
    p = prefix + "blocks.{layer}."
    shape = _patches(ctx, o)
    x, xa, xm, xf = (Port(s, shape, n) for s, n in ((r"\psi_n", "psi"), (r"\psi_{\mathrm{attn}}", "psi_attn"), (r"\psi'_n", "psi_mid"),
                                                   (r"\psi_{\mathrm{ffn}}", "psi_ffn")))

    def ln(key: str, title: str, xp: Port, yp: Port) -> Component:
        return layernorm(ctx, key, title, weight=p + key + ".weight", ranges=ranges, size="vit_hidden_size", x=xp,
                         y=yp, code=f"self.{key}(hidden_states)", eps=LN_EPS, citations=(cite,))

    n1, n2 = ln("norm1", "Attention LayerNorm", x, xa), ln("norm2", "MLP LayerNorm", xm, xf)
    attn = vision_attention(ctx, o, prefix=p + "attn.", ranges=ranges, x=xa, cite=cite, classes=classes)
    mlp = vision_mlp(ctx, o, prefix=p + "mlp.", ranges=ranges, x=xf, y=Port(r"\Delta_{\mathrm{ffn}}", shape, "delta"),
                     cite=mlp_cite, classes=classes)
    res_a = Step(r"\psi'_n=\psi_n+\Delta_{\mathrm{attn}}", shape, "residual-attn")
    res_f = Step(r"\psi_{n+1}=\psi'_n+\Delta_{\mathrm{ffn}}", shape, "residual-ffn")
    return Component(
        key="blocks", title="Vision encoder block", kind="learned", code=f"{classes}VisionBlock(config)",
        description=f"Bidirectional attention with 2-D rotary and a GELU MLP, each after a LayerNorm and added to the "
                    f"residual stream; {depth} blocks.",
        repeat=depth, repeat_label="vision blocks", crumb=f"{depth} vision blocks", inputs=(x,),
        outputs=(Port(r"\psi_{n+1}", shape, "psi_next"),), equations=(res_a, res_f),
        steps=(n1.steps[0], *attn.steps, res_a, n2.steps[0], *mlp.steps, res_f), children=(n1, attn, n2, mlp),
        citations=(cite,), program="qwen_vision_block", options=o,
    )


def merger(ctx: Ctx, o: VisionOptions, *, prefix: str, cite: Citation, classes: str = "Qwen3_5") -> Component:
    """LayerNorm each patch, concatenate each merge × merge neighbourhood, then fc2(GELU(fc1 u + b1)) + b2."""
    M, m2 = ctx.sym("vit_merged_size"), o.merge ** 2
    tokens = Dim("image tokens", o.patches // m2)
    merged = Shape((tokens, ctx.dim("vit_merged_size")))
    x = Port(r"\psi_{\mathrm{out}}", _patches(ctx, o), "psi")
    norm = layernorm(ctx, "norm", "Merger LayerNorm", weight=prefix + "norm.weight", ranges=(),
                     size="vit_hidden_size", x=x, y=Port(r"\hat \psi", x.shape, "psi_hat"), code="self.norm(x)",
                     eps=LN_EPS, citations=(cite,))
    fc1 = linear(ctx, "linear_fc1", "Merger expansion", weight=prefix + "linear_fc1.weight", ranges=(), d_in=M,
                 d_out=M, out_dim=ctx.dim("vit_merged_size"), x=Port(r"\bar \psi", merged, "u"),
                 y=Port("g", merged, "g"), equation=r"g=\bar \psi\,W_1+b_1", bias=True, code="self.linear_fc1(x)",
                 description=f"Mix the {m2} concatenated patches' {ctx.size('vit_merged_size'):,} features.")
    out = Port(r"x_{\mathrm{img}}", Shape((tokens, ctx.dim("vit_out_hidden_size"))), "e")
    fc2 = linear(ctx, "linear_fc2", "Projection to the text width", weight=prefix + "linear_fc2.weight", ranges=(),
                 d_in=M, d_out=ctx.sym("vit_out_hidden_size"), out_dim=ctx.dim("vit_out_hidden_size"),
                 x=Port("m", merged, "h"), y=out, equation=r"x_{\mathrm{img}}=mW_2+b_2", bias=True, code="self.linear_fc2(x)",
                 description=f"Project to the text model's {ctx.size('vit_out_hidden_size'):,} features.")
    steps = (norm.steps[0], Step(rf"\bar \psi_i=[\hat \psi_{{{m2}i}};\dots;\hat \psi_{{{m2}i+{m2 - 1}}}]", merged, "concat"),
             fc1.steps[0], Step(r"m=\operatorname{GELU}(g)", merged, "gelu"), fc2.steps[0])
    return Component(
        key="merger", title="Patch merger", kind="learned", code=f"{classes}VisionPatchMerger(config)",
        description=f"Normalise each patch, concatenate each {o.merge}×{o.merge} neighbourhood ({m2} patches) into one "
                    f"image token and map it through a GELU MLP to the text width: {o.patches:,} patches become "
                    f"{tokens.size:,} tokens.",
        inputs=(x,), outputs=(out,), equations=(steps[1], steps[-1]), steps=steps, children=(norm, fc1, fc2),
        citations=(cite,), program="qwen_merger", options=o,
        notes=("The GELU here is the exact (erf) one; the encoder blocks' is the tanh approximation.",),
    )


def qwen_vision_tower(ctx: Ctx, o: VisionOptions, *, prefix: str, depth: int, ref: Reference,
                      deepstack: DeepStackOptions | None = None) -> Component:
    """The whole tower: patch embedding, positions, the encoder blocks and the merger; with `deepstack` (Qwen3-VL),
    the DeepStack mergers of the listed blocks' outputs too, a second output. `ref` names the reference's classes."""
    classes = ref.prefix
    D = ctx.sym("vit_hidden_size")
    d, P = ctx.size("vit_hidden_size"), ctx.size("vit_patch_values")
    pixels = Port(r"\mathcal{P}", Shape((Dim("patches", o.patches), ctx.dim("vit_patch_values"))), "pixels")
    z0 = Port(r"\psi_0", _patches(ctx, o), "psi0")
    embed = linear(ctx, "patch_embed", "Patch embedding", weight=prefix + "patch_embed.proj.weight", ranges=(),
                   d_in="vit_patch_values", d_out=D, out_dim=ctx.dim("vit_hidden_size"), x=pixels, y=z0,
                   equation=r"\psi_0=\mathcal{P}\,W_{\mathrm{patch}}+b_{\mathrm{patch}}", bias=True,
                   quantize=False,  # a Conv3d: FP8 quantizers convert only nn.Linear
                   code=f"{classes}VisionPatchEmbed(config)",
                   description=f"A Conv3d whose kernel equals its stride: each patch's {P:,} pixel values (channels × "
                               f"frames × rows × columns) map to {d:,} features.",
                   citations=(ref.cite("The patch embedding is a Conv3d with kernel and stride (temporal_patch_size, "
                                       "patch_size, patch_size) and a bias.", "VisionPatchEmbed"),))
    embed = _conv3d_shape(ctx, embed, prefix)
    cite = ref.cite("Each vision block adds attention (fused biased qkv, 2-D rotary, no mask) and a GELU MLP, each "
                    "after a LayerNorm.", "VisionBlock")
    pos = Step(rf"\psi^{{+}}_i=\psi_{{0,i}}+E_{{\mathrm{{pos}}}}[{o.side}\,{ROW}+{COL}]", z0.shape, "positions")
    positions = Component(
        key="pos_embed", title="Learned positions", kind="learned", code="nn.Embedding(num_position_embeddings, "
        "hidden_size)", description=f"Add to each patch i the table row of its grid position (row(i), col(i) in "
                                    f"{o.side}×{o.side}).",
        inputs=(z0,), outputs=(Port(r"\psi^{+}", z0.shape, "psi_pos"),), equations=(pos,), steps=(pos,),
        tensors=(ctx.tensor(prefix + "pos_embed.weight", (), (ctx.sym("vit_positions"), D)),),
        citations=(ref.cite("The learned position table is resampled bilinearly to the image's patch grid and "
                            "added to the patch embeddings.", "VisionModel.forward"),),
        program="qwen_positions", options=o, reference="-",
        notes=(f"The table holds {ctx.size('vit_positions'):,} rows, a {o.side}×{o.side} grid; other image sizes read "
               "it by bilinear interpolation. At the native grid shown here each patch takes its own row.",),
    )
    blocks = vision_block(ctx, o, prefix=prefix, depth=depth, cite=cite, mlp_cite=ref.cite(
        "The vision MLP is linear_fc2(act(linear_fc1(x))), with biases and the tanh-approximated GELU.", "VisionMLP"),
        classes=classes)
    merge = merger(ctx, o, prefix=prefix + "merger.", cite=ref.cite(
        "The merger applies a LayerNorm per patch, views spatial_merge_size² patches as one vector and maps it "
        "through fc1, GELU and fc2 to out_hidden_size.", "VisionPatchMerger"), classes=classes)
    # the blocks start from the positioned patches ψ^+ and the merger reads the last block's output
    encoder = Step(rf"\psi_1=\operatorname{{Block}}_0(\psi^{{+}}),\quad \psi_{{n+1}}=\operatorname{{Block}}_n(\psi_n),\ "
                   rf"n=1,\dots,{depth - 1},\quad \psi_{{\mathrm{{out}}}}=\psi_{{{depth}}}", z0.shape, "encoder")
    steps = (embed.steps[0], pos, encoder, *merge.steps)
    children: tuple[Component, ...] = (embed, positions, blocks, merge)
    outputs, described = merge.outputs, ""
    if deepstack is not None:
        stacked = deepstack_mergers(ctx, deepstack, prefix=prefix + "deepstack_merger_list.", patches=o.patches,
                                    classes=classes, cite=ref.cite(
                                        "After each block listed in deepstack_visual_indexes, a patch merger of its "
                                        "own (use_postshuffle_norm: the LayerNorm over the merged vector) maps the "
                                        "block's output to a DeepStack feature.", "VisionModel.forward"))
        levels = Shape((Dim("levels", deepstack.levels), *stacked.outputs[0].shape.dims))
        feats = Step(r",\ ".join(rf"F_{k}=\operatorname{{Merger}}'_{k}(\psi_{{{i + 1}}})"
                                   for k, i in enumerate(deepstack.vision_layers)), levels, "deepstack")
        steps += (feats,)
        children += (stacked,)
        outputs += (Port("F", levels, "deepstack"),)
        described = (f"; the outputs of blocks {', '.join(str(i) for i in deepstack.vision_layers)} pass through "
                     f"{deepstack.levels} DeepStack mergers of their own")
    return Component(
        key="visual", title="Vision tower and merger", kind="learned", code=f"{classes}VisionModel(vision_config)",
        description=f"Encode an image ({o.side}×{o.side} patches here) with {depth} bidirectional blocks and merge each "
                    f"{o.merge}×{o.merge} neighbourhood into one token of the text width{described}.",
        inputs=(pixels,), outputs=outputs, equations=(steps[2], steps[-1]), steps=steps,
        children=children, program="qwen_vision_tower", options=o,
        citations=(ref.cite("The vision model embeds patches, adds learned positions resampled (bilinear) to the "
                            "image's grid, runs the blocks with 2-D rotary angles and merges.", "VisionModel"),),
        notes=("Patches arrive in merge order: each 2 × 2 neighbourhood that the merger joins is consecutive.",),
    )


def _conv3d_shape(ctx: Ctx, embed: Component, prefix: str) -> Component:
    """The Conv3d weight is stored [d_vision, channels, frames, patch, patch]; its product is the patch values."""
    weight = embed.tensors[0]
    shape = (ctx.sym("vit_hidden_size"), ctx.sym("vit_in_channels"), ctx.sym("vit_temporal_patch_size"),
             ctx.sym("vit_patch_size"), ctx.sym("vit_patch_size"))
    return replace(embed, tensors=(replace(weight, shape=shape), *embed.tensors[1:]), program="qwen_patch_embed",
                   reference=prefix + "patch_embed",
                   notes=("The weight is a Conv3d kernel, [d_vision, channels, frames, patch, patch]; applied with a "
                          "stride equal to the kernel it is a linear map of each flattened patch.",))


# ----------------------------------------------------------------------------------------------- programs

@program("qwen_patch_embed")
def run_patch_embed(comp: Component, run: Run, pixels: torch.Tensor) -> list[torch.Tensor]:
    w = run.w("weight")                                                              # [D, C, frames, p, p]
    return [run.rec(comp.steps[0].name, F.linear(pixels, w.reshape(w.shape[0], -1), run.w("bias")))]


@program("qwen_positions")
def run_positions(comp: Component, run: Run, z: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, VisionOptions)
    rows = patch_positions(o, z.device)
    return [run.rec("positions", z + run.w("weight")[rows[:, 0] * o.side + rows[:, 1]])]


@program("qwen_vision_attention")
def run_vision_attention(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, VisionOptions)
    N = x.shape[0]
    qkv = run_child(comp, "qkv", run, x).reshape(N, 3, o.heads, o.head_dim)
    Q, K, V = qkv.unbind(1)                                                          # [N, H, d_head]
    angles = vision_angles(o, x.device)
    Q, K = run.rec("rotate", rotate_heads(Q, angles)), rotate_heads(K, angles)
    A = F.softmax(torch.einsum("nhd,mhd->hnm", Q, K) * o.head_dim ** -0.5, dim=-1, dtype=torch.float32).to(Q.dtype)
    O = run.rec("attend", torch.einsum("hnm,mhd->nhd", A, V).reshape(N, -1))
    return [run_child(comp, "proj", run, O)]


@program("qwen_vision_block")
def run_vision_block(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    x_mid = run.rec("residual-attn", x + run_child(comp, "attn", run, run_child(comp, "norm1", run, x)))
    return [run.rec("residual-ffn", x_mid + run_child(comp, "mlp", run, run_child(comp, "norm2", run, x_mid)))]


@program("qwen_merger")
def run_merger(comp: Component, run: Run, z: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, VisionOptions)
    z_hat = run_child(comp, "norm", run, z)
    u = run.rec("concat", z_hat.reshape(-1, z_hat.shape[-1] * o.merge ** 2))       # [N / m², m²·d]
    g = run_child(comp, "linear_fc1", run, u)
    return [run_child(comp, "linear_fc2", run, run.rec("gelu", F.gelu(g)))]


@program("qwen_vision_tower", role="Vision tower and projector", vision=True)
def run_vision_tower(comp: Component, run: Run, pixels: torch.Tensor) -> list[torch.Tensor]:
    z = run_child(comp, "patch_embed", run, pixels)
    z = run_child(comp, "pos_embed", run, z)
    block = comp.child("blocks")
    stacked = next((c for c in comp.children if c.key == "deepstack_merger_list"), None)
    taps = options(stacked, DeepStackOptions).vision_layers if stacked is not None else ()
    features = []
    for layer in range(block.repeat):
        (z,) = run_vision_block(block, run.child(relative_module(comp, block).format(layer=layer), "_"), z)
        if stacked is not None and layer in taps:  # a DeepStack merger of its own reads this block's output
            module = relative_module(comp, stacked).format(layer=taps.index(layer))
            features += PROGRAMS[stacked.program](stacked, run.child(module, "_"), z)
    run.rec("encoder", z)
    (out,) = run_merger(comp.child("merger"), run.child("merger."), z)
    if stacked is None:
        return [out]
    return [out, run.rec("deepstack", torch.stack(features))]


def _reference_rotary(o: VisionOptions, x: torch.Tensor):
    angles = torch.cat([vision_angles(o, x.device)] * 2, dim=-1)
    return angles.cos(), angles.sin()


def _grid(o: VisionOptions) -> torch.Tensor:
    return torch.tensor([[1, o.side, o.side]])


@reference_call("qwen_vision_attention")
@reference_call("qwen_vision_block")
def call_vision_layer(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (x,) = inputs
    o = options(comp, VisionOptions)
    cu = torch.tensor([0, x.shape[0]], dtype=torch.int32)
    return ours, ref(x, cu_seqlens=cu, position_embeddings=_reference_rotary(o, x)), covered(
        "one image, its patch bounds (cu_seqlens) from our grid", GIVEN_ANGLES)


@reference_call("qwen_vision_tower")
def call_vision_tower(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (pixels,) = inputs
    o = options(comp, VisionOptions)
    out = ref(pixels, grid_thw=_grid(o))
    if len(comp.outputs) == 1:
        return ours, out.pooler_output, f"merged tokens of one {o.side}×{o.side}-patch image"
    mine = torch.cat([ours[None], run.recorded["deepstack"]])  # the merged tokens, then each DeepStack feature
    theirs = torch.cat([out.pooler_output[None], torch.stack(list(out.deepstack_features))])
    return mine, theirs, (f"merged tokens and the {len(out.deepstack_features)} DeepStack features of one "
                          f"{o.side}×{o.side}-patch image")


__all__ = ["VisionOptions", "qwen_vision_tower", "LABELS"]
