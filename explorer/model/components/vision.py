"""A SigLIP vision encoder (patch embedding, bidirectional pre-LayerNorm blocks, final LayerNorm) and Gemma 3's
multimodal projector (average-pool the patch grid, RMSNorm with gain 1 + w, project to the text width).

These components carry every tensor of a vision tower and their parameter formulas; their equations stay at block
level (one step per projection, norm or residual), as the pages say, not down to each head.

References: "Sigmoid Loss for Language Image Pre-Training" (arXiv:2303.15343); transformers'
models/siglip/modeling_siglip.py and models/gemma3/modeling_gemma3.py (Gemma3MultiModalProjector).
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
    B,
    Ctx,
    Run,
    first_steps,
    options,
    program,
    reference_call,
    relative_module,
    run_child,
)
from explorer.model.components.linear import linear
from explorer.model.components.mlp import tower_mlp
from explorer.model.components.norms import layernorm, rmsnorm
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step

SIGLIP_FILE = "models/siglip/modeling_siglip.py"
ENCODER_NOTE = ("Equations at block level: each projection, norm and residual is a step; the per-head attention "
                "inside the tower is one step, softmax(QKᵀ/√d_h)V with no mask (every patch sees every patch).")


def siglip(claim: str, symbol: str) -> Citation:
    return Citation(claim, "transformers", symbol, SIGLIP_FILE)


@dataclass(frozen=True, slots=True)
class VisionAttentionOptions:
    heads: int
    head_dim: int


@dataclass(frozen=True, slots=True)
class PatchOptions:
    patch: int


@dataclass(frozen=True, slots=True)
class ProjectorOptions:
    patches_per_side: int
    tokens_per_side: int


def _patch_shape(ctx: Ctx, width: str = "vision_hidden_size") -> Shape:
    """[B batch, N patches, width]: the patches take the place of positions."""
    return Shape((B, ctx.dim("num_patches"), ctx.dim(width)))


def patch_embedding(ctx: Ctx, *, prefix: str, image_size: int) -> Component:
    """Conv2d(channels -> d_vision, kernel = stride = patch) over the image, plus a learned position per patch."""
    C, P, N, D = (ctx.sym(n) for n in ("num_channels", "patch_size", "num_patches", "vision_hidden_size"))
    pixels = Port(r"\mathcal{P}", Shape((B, ctx.dim("num_channels"), Dim("pixels", image_size), Dim("pixels", image_size))),
                  "pixel_values")
    z = Port(r"\psi_0", _patch_shape(ctx), "psi")
    p = ctx.size(P)
    steps = (Step(rf"\psi_i=W_{{\mathrm{{patch}}}}\operatorname{{vec}}(\mathcal{{P}}_i)+b_{{\mathrm{{patch}}}},\quad \mathcal{{P}}_i:\ "
                  rf"\text{{the }}i"
                  rf"\text{{-th }}{p}\times{p}\text{{ patch, stride }}{p}", z.shape, "patches"),
             Step(r"\psi_0=\psi+E_{\mathrm{pos}}", z.shape, "positions"))
    return Component(
        key="embeddings", title="Patch embedding", kind="learned", code="SiglipVisionEmbeddings(config)",
        description=f"Cut the {image_size}×{image_size} image into {ctx.size(N):,} patches of {ctx.size(P)}×"
                    f"{ctx.size(P)} pixels, project each to {ctx.size(D):,} features and add a learned position.",
        inputs=(pixels,), outputs=(z,), equations=steps, steps=steps,
        tensors=(ctx.tensor(prefix + "patch_embedding.weight", (), (D, C, P, P)),
                 ctx.tensor(prefix + "patch_embedding.bias", (), (D,)),
                 ctx.tensor(prefix + "position_embedding.weight", (), (N, D))),
        citations=(siglip("Patches come from a Conv2d whose kernel and stride are the patch size; a learned "
                          "embedding per patch position is added.", "SiglipVisionEmbeddings"),),
        notes=("The convolution weight is stored [out channels, in channels, patch, patch], with a bias.",),
        program="patch_embed", options=PatchOptions(ctx.size(P)),
    )


def vision_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, heads: int) -> Component:
    """Bidirectional multi-head attention with biased q, k, v and output projections."""
    d = ctx.size("vision_hidden_size")
    D, dim = ctx.sym("vision_hidden_size"), ctx.dim("vision_hidden_size")

    def proj(key: str, title: str, latex: str) -> Component:
        return linear(ctx, key, title, weight=prefix + key + ".weight", ranges=ranges, d_in=D, d_out=D, out_dim=dim,
                      x=x, y=Port(latex, x.shape, latex), equation=rf"{latex}={x.latex}W_{{{latex}}}+b_{{{latex}}}",
                      description=f"Project {d:,} features to {d:,}.", code=f"self.{key}(hidden_states)", bias=True)

    out = Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn")
    children = (proj("q_proj", "Query projection", "q"), proj("k_proj", "Key projection", "k"),
                proj("v_proj", "Value projection", "v"),
                linear(ctx, "out_proj", "Output projection", weight=prefix + "out_proj.weight", ranges=ranges,
                       d_in=D, d_out=D, out_dim=dim, x=Port("O", x.shape, "O"), y=out,
                       equation=rf"\Delta_{{\mathrm{{attn}}}}=[O_1;\dots;O_{{{heads}}}]W_O+b_O",
                       description=f"Mix the {heads} heads' outputs.",
                       code="self.out_proj(attn_output)", bias=True))
    hd = d // heads
    attend = Step(rf"O_h=\operatorname{{softmax}}\!\left(q_hk_h^{{\top}}/\sqrt{{{hd}}}\right)v_h,\quad h=1,\dots,"
                  rf"{heads}", x.shape, "attend")
    steps = (*first_steps(children, "q_proj", "k_proj", "v_proj"), attend, *first_steps(children, "out_proj"))
    return Component(
        key="self_attn", title="Bidirectional attention", kind="learned", code="SiglipAttention(config)",
        description=f"{heads} heads of {hd} features; every patch attends to every patch (no mask).",
        inputs=(x,), outputs=(out,), equations=(attend,), steps=steps, children=children,
        citations=(siglip("SigLIP attention is not causal: is_causal is False and q, k, v and out projections "
                          "carry biases.", "SiglipAttention"),),
        program="vision_attention", options=VisionAttentionOptions(heads, hd),
    )


def vision_mlp(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, y: Port) -> Component:
    """fc2(GELU_tanh(fc1 x + b1)) + b2, as SigLIP's MLP."""
    return tower_mlp(ctx, prefix=prefix, ranges=ranges, x=x, y=y, hidden=_patch_shape(ctx, "vision_intermediate_size"),
                     sizes=("vision_hidden_size", "vision_intermediate_size"), names=("fc1", "fc2"),
                     calls=("self.fc1(hidden_states)", "self.fc2(hidden_states)"), code="SiglipMLP(config)",
                     citations=(siglip("The MLP is fc2(act(fc1 x)).", "SiglipMLP"),))


def vision_block(ctx: Ctx, *, prefix: str, layers: int, heads: int, eps: float) -> Component:
    """x' = x + Attn(LN₁(x)); x_next = x' + MLP(LN₂(x')), one instance per encoder layer."""
    ranges = (IndexRange("layer", tuple(range(layers))),)
    p = prefix + "encoder.layers.{layer}."
    shape = _patch_shape(ctx)
    x, xa, xm, xf = (Port(s, shape, n) for s, n in ((r"\psi_n", "psi"), (r"\psi_{\mathrm{attn}}", "psi_attn"), (r"\psi'_n", "psi_mid"),
                                                   (r"\psi_{\mathrm{ffn}}", "psi_ffn")))
    norm_cite = (siglip("Each encoder layer applies nn.LayerNorm (a gain and a bias) before attention and before "
                        "the MLP.", "SiglipEncoderLayer"),)
    ln1 = layernorm(ctx, "layer_norm1", "Attention LayerNorm", weight=p + "layer_norm1.weight", ranges=ranges,
                    size="vision_hidden_size", x=x, y=xa, code="self.layer_norm1(hidden_states)", eps=eps,
                    citations=norm_cite)
    attn = vision_attention(ctx, prefix=p + "self_attn.", ranges=ranges, x=xa, heads=heads)
    ln2 = layernorm(ctx, "layer_norm2", "MLP LayerNorm", weight=p + "layer_norm2.weight", ranges=ranges,
                    size="vision_hidden_size", x=xm, y=xf, code="self.layer_norm2(hidden_states)", eps=eps,
                    citations=norm_cite)
    mlp = vision_mlp(ctx, prefix=p + "mlp.", ranges=ranges, x=xf, y=Port(r"\Delta_{\mathrm{ffn}}", shape, "delta"))
    res_a = Step(r"\psi'_n=\psi_n+\Delta_{\mathrm{attn}}", shape, "residual-attn")
    res_f = Step(r"\psi_{n+1}=\psi'_n+\Delta_{\mathrm{ffn}}", shape, "residual-ffn")
    return Component(
        key="encoder", title="Vision encoder block", kind="learned", code="SiglipEncoderLayer(config)",
        description=f"Bidirectional attention and a GELU MLP, each after a LayerNorm and added to the residual "
                    f"stream; {layers} encoder blocks.",
        repeat=layers, repeat_label="vision blocks", crumb=f"{layers} vision blocks", inputs=(x,),
        outputs=(Port(r"\psi_{n+1}", shape, "psi_next"),), equations=(res_a, res_f),
        steps=(ln1.steps[0], *attn.steps, res_a, ln2.steps[0], *mlp.steps, res_f),
        children=(ln1, attn, ln2, mlp), notes=(ENCODER_NOTE,),
        citations=(siglip("An encoder layer adds attention and the MLP, each after a LayerNorm, to the residual.",
                          "SiglipEncoderLayer"),),
        program="vision_block", options=VisionAttentionOptions(heads, ctx.size("vision_hidden_size") // heads),
    )


def vision_tower(ctx: Ctx, *, prefix: str, image_size: int, layers: int, heads: int, eps: float) -> Component:
    """The whole SigLIP encoder: patch embedding, the encoder blocks, a final LayerNorm (no pooling head)."""
    embed = patch_embedding(ctx, prefix=prefix + "embeddings.", image_size=image_size)
    block = vision_block(ctx, prefix=prefix, layers=layers, heads=heads, eps=eps)
    shape = _patch_shape(ctx)
    post = layernorm(ctx, "post_layernorm", "Final LayerNorm", weight=prefix + "post_layernorm.weight", ranges=(),
                     size="vision_hidden_size", x=Port(rf"\psi_{{{layers}}}", shape, "psi"), y=Port(r"\psi_{\mathrm{out}}", shape, "v"),
                     code="self.post_layernorm(last_hidden_state)", eps=eps,
                     citations=(siglip("The vision model ends with a LayerNorm over the encoder's output.",
                                       "SiglipVisionModel"),))
    steps = (embed.steps[0], embed.steps[1], Step(r"\psi_{n+1}=\operatorname{Block}_n(\psi_n),\quad n=0,\dots,"
                                                  f"{layers - 1}", shape, "encoder"), post.steps[0])
    return Component(
        key="vision_tower", title="SigLIP vision tower", kind="group", code="SiglipVisionModel(vision_config)",
        description=f"Encode an image as {ctx.size('num_patches'):,} patch vectors of "
                    f"{ctx.size('vision_hidden_size'):,} features: patch embedding, {layers} bidirectional encoder "
                    "blocks and a final LayerNorm.",
        inputs=embed.inputs, outputs=post.outputs, equations=(steps[2], steps[3]), steps=steps,
        children=(embed, block, post), notes=(ENCODER_NOTE,),
        citations=(siglip("The vision transformer embeds patches, runs the encoder and a final LayerNorm.",
                          "SiglipVisionModel"),),
        program="vision_tower",
    )


def projector(ctx: Ctx, *, prefix: str, eps: float, patches_per_side: int, tokens_per_side: int,
              citations: tuple[Citation, ...]) -> Component:
    """Average-pool the patch grid to the image's soft tokens, RMSNorm (gain 1 + w), project to the text width."""
    k_ = patches_per_side // tokens_per_side
    tokens = Dim("image tokens", tokens_per_side ** 2)
    pooled = Port(r"\psi^{\mathrm{pool}}", Shape((B, tokens, ctx.dim("vision_hidden_size"))), "u")
    normed = Port(r"\hat \psi^{\mathrm{pool}}", pooled.shape, "u_hat")
    out = Port(r"x_{\mathrm{img}}", Shape((B, tokens, ctx.dim("hidden_size"))), "e")
    norm = rmsnorm(ctx, "mm_soft_emb_norm", "Soft-token RMSNorm", weight=prefix + "mm_soft_emb_norm.weight", ranges=(),
                   size="vision_hidden_size", x=pooled, y=normed, code="self.mm_soft_emb_norm(pooled)", eps=eps,
                   gain="1+w", citations=citations[:1])
    proj = linear(ctx, "mm_input_projection", "Input projection", weight=prefix + "mm_input_projection_weight",
                  ranges=(), d_in="vision_hidden_size", d_out="hidden_size", out_dim=ctx.dim("hidden_size"),
                  x=normed, y=out, equation=r"x_{\mathrm{img}}=\hat \psi^{\mathrm{pool}}\,W_{\mathrm{mm}}", layout="in_out",
                  quantize=False,  # a bare parameter, not an nn.Linear: FP8 quantizers leave it
                  code="torch.matmul(normed, self.mm_input_projection_weight)", citations=citations,
                  description=f"Project {ctx.size('vision_hidden_size'):,} features to the text width "
                              f"{ctx.size('hidden_size'):,}.")
    # a bare parameter of the projector, not a module: its own program reads it by name, and it is checked as
    # part of the projector
    proj = replace(proj, reference="-", program="mm_projection")
    pool = Step(rf"\psi^{{\mathrm{{pool}}}}=\operatorname{{AvgPool}}_{{{k_}\times{k_}}}(\psi_{{\mathrm{{out}}}}),\ {patches_per_side}^2\to{tokens_per_side}^2"
                r"\text{ tokens}", pooled.shape, "pool")
    steps = (pool, norm.steps[0], proj.steps[0])
    return Component(
        key="projector", title="Multimodal projector", kind="learned", code="Gemma3MultiModalProjector(config)",
        description=f"Average {k_}×{k_} neighbourhoods of the {patches_per_side}×{patches_per_side} patch grid into "
                    f"{tokens.size} image tokens, normalise them and project each to the text model's width.",
        inputs=(Port(r"\psi_{\mathrm{out}}", _patch_shape(ctx), "v"),), outputs=(out,), equations=steps, steps=steps,
        children=(norm, proj), citations=citations, program="projector",
        options=ProjectorOptions(patches_per_side, tokens_per_side),
        notes=("The projection matrix is stored input by output, [d_vision, d], and applied as a matmul.",),
    )


# ------------------------------------------------------------------------------------------------ programs

@program("patch_embed")
def run_patch_embed(comp: Component, run: Run, pixels: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, PatchOptions)
    z = F.conv2d(pixels, run.w("patch_embedding.weight"), run.w("patch_embedding.bias"), stride=o.patch)
    z = run.rec("patches", z.flatten(2).transpose(1, 2))                               # [B, N, D]
    return [run.rec("positions", z + run.w("position_embedding.weight")[None])]


@program("vision_attention")
def run_vision_attention(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, VisionAttentionOptions)
    B_, N_, _ = x.shape
    q, k, v = (run_child(comp, key, run, x).view(B_, N_, o.heads, o.head_dim).transpose(1, 2)
               for key in ("q_proj", "k_proj", "v_proj"))
    A = F.softmax(q @ k.transpose(-1, -2) * o.head_dim ** -0.5, dim=-1, dtype=torch.float32).to(q.dtype)
    O = run.rec("attend", (A @ v).transpose(1, 2).reshape(B_, N_, o.heads * o.head_dim))
    return [run_child(comp, "out_proj", run, O)]


@program("vision_block")
def run_vision_block(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    x_mid = run.rec("residual-attn", x + run_child(comp, "self_attn", run, run_child(comp, "layer_norm1", run, x)))
    return [run.rec("residual-ffn", x_mid + run_child(comp, "mlp", run, run_child(comp, "layer_norm2", run, x_mid)))]


@program("vision_tower", role="Vision tower and projector", vision=True)
def run_vision_tower(comp: Component, run: Run, pixels: torch.Tensor) -> list[torch.Tensor]:
    z = run_child(comp, "embeddings", run, pixels)
    block = comp.child("encoder")
    for layer in range(block.repeat):
        module = relative_module(comp, block).format(layer=layer)
        (z,) = run_vision_block(block, run.child(module, "_"), z)
    run.rec("encoder", z)
    return [run_child(comp, "post_layernorm", run, z)]


@program("projector", role="Vision tower and projector", vision=True)
def run_projector(comp: Component, run: Run, v: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, ProjectorOptions)
    B_, _, D = v.shape
    grid = v.transpose(1, 2).reshape(B_, D, o.patches_per_side, o.patches_per_side)
    k_ = o.patches_per_side // o.tokens_per_side
    u = run.rec("pool", F.avg_pool2d(grid, k_, k_).flatten(2).transpose(1, 2))       # [B, tokens, D]
    u_hat = run_child(comp, "mm_soft_emb_norm", run, u)
    return [run_child(comp, "mm_input_projection", run, u_hat)]


@program("mm_projection")
def run_mm_projection(comp: Component, run: Run, u_hat: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec(comp.steps[0].name, u_hat @ run.w("mm_input_projection_weight"))]


@reference_call("vision_attention")
def call_vision_attention(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (x,) = inputs
    return ours, ref(hidden_states=x)[0], "no mask: bidirectional"


@reference_call("vision_block")
def call_vision_block(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (x,) = inputs
    return ours, ref(x, attention_mask=None), "no mask: bidirectional"


@reference_call("vision_tower")
def call_vision_tower(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (pixels,) = inputs
    return ours, ref(pixel_values=pixels).last_hidden_state, "last hidden state of random pixels"


__all__ = ["vision_tower", "projector"]
