"""Gemma 4's vision encoder and its embedder into the text model: patches projected without a convolution (the image
arrives as flattened patches), a learned 2-D position table (one row per x and one per y, summed), encoder blocks
with Gemma's sandwich RMSNorms, per-head q/k RMSNorms, unit-RMS values and an axial 2-D rotary embedding, a GeGLU
MLP; then k×k average pooling over the patch grid, a √d scale, a stored standardisation (std_bias, std_scale:
persistent buffers) and the embedder (a weightless RMS and a projection to the text width).

Like vision.py (the SigLIP tower), the equations stay at block level: one step per projection, norm, rotation,
attention and residual, not down to each head.

References: Gemma 4 model card (Google DeepMind, 2026); transformers' models/gemma4/modeling_gemma4.py
(Gemma4VisionPatchEmbedder, Gemma4VisionEncoderLayer, Gemma4VisionPooler, Gemma4VisionModel,
Gemma4MultimodalEmbedder), the reference this is checked against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import B, Ctx, Run, fmt_eps, options, program, reference_call, relative_module
from explorer.model.components.check_words import NO_MASK, OWN_ANGLES, covered
from explorer.model.components.l2_qk_norm import unit_rms
from explorer.model.components.mlp import activation
from explorer.spec.storage import Dense
from explorer.spec.types import Citation, Component, IndexRange, Port, Shape, Step, TensorSpec

FILE = "models/gemma4/modeling_gemma4.py"
NOTE = ("Equations at block level: each projection, norm, rotation and residual is a step; the per-head attention "
        "is one step, softmax(Q Kᵀ)V with no mask and no 1/√d (the q and k RMSNorms fix the scale).")


def cite(claim: str, symbol: str) -> Citation:
    return Citation(claim, "transformers", symbol, FILE)


@dataclass(frozen=True, slots=True)
class Gemma4VisionOptions:
    heads: int
    head_dim: int
    eps: float
    theta: float
    pool: int
    """Pooling kernel side k: k×k patches make one soft token."""
    standardize: bool
    grid_width: int = 0
    """Patches across the image the pages and checks use (soft tokens across × k); the rows follow from the count."""


def grid_width(soft_tokens: int, pool: int) -> int:
    """Patches across a grid of `soft_tokens` pooled cells, as near square as the count allows (280 tokens: 14 × 20
    cells of 3 × 3 patches, 42 patches across)."""
    across = max(a for a in range(1, math.isqrt(soft_tokens) + 1) if soft_tokens % a == 0)
    return across * pool


def grid_positions(patches: int, width: int, device=None) -> torch.Tensor:
    """(x, y) of each patch of a grid `width` patches across, row by row: [patches, 2]."""
    i = torch.arange(patches, device=device)
    return torch.stack([i % width, i // width], dim=-1)


def _shape(ctx: Ctx, width: str = "vision_hidden_size", tokens: str = "num_patches") -> Shape:
    return Shape((B, ctx.dim(tokens), ctx.dim(width)))


# ------------------------------------------------------------------------------------------------ spec

def patch_embedder(ctx: Ctx, *, prefix: str, o: Gemma4VisionOptions) -> Component:
    D, P, S = (ctx.sym(n) for n in ("vision_hidden_size", "patch_size", "position_embedding_size"))
    pixels = Port(r"\mathcal{P}", _shape(ctx, "patch_values"), "pixel_values")
    z = Port(r"\psi_0", _shape(ctx), "psi")
    steps = (Step(r"\psi_i=2\,(\mathcal{P}_i-\tfrac12)\,W_{\mathrm{in}}", z.shape, "patches"),
             Step(r"\psi_0=\psi+E^{x}_{\mathrm{pos}}[\operatorname{col}(i)]+E^{y}_{\mathrm{pos}}[\operatorname{row}(i)],\quad "
                  rf"\operatorname{{col}}(i)=i\bmod {o.grid_width},\ \operatorname{{row}}(i)=\lfloor i/{o.grid_width}\rfloor",
                  z.shape, "positions"))
    return Component(
        key="patch_embedder", title="Patch embedding (2-D position table)", kind="learned",
        code="Gemma4VisionPatchEmbedder(config)",
        description=f"Map each flattened {ctx.size(P)}×{ctx.size(P)}×3 patch, rescaled from [0, 1] to [−1, 1], to "
                    f"{ctx.size(D):,} features and add a learned row for its x and one for its y position (tables of "
                    f"{ctx.size(S):,} positions).",
        inputs=(pixels,), outputs=(z,), equations=steps, steps=steps,
        tensors=(ctx.tensor(prefix + "input_proj.weight", (), (D, 3 * P * P), quantize=True),
                 ctx.tensor(prefix + "position_embedding_table", (), (2, S, D))),
        citations=(cite("The patch embedder rescales pixels to 2(p − 0.5), projects them with a bias-free Linear and "
                        "adds x and y rows of position_embedding_table.", "Gemma4VisionPatchEmbedder"),),
        program="gemma4_patch_embed", options=o,
    )


def encoder_block(ctx: Ctx, *, prefix: str, layers: int, o: Gemma4VisionOptions) -> Component:
    ranges = (IndexRange("layer", tuple(range(layers))),)
    p = prefix + "encoder.layers.{layer}."
    D, F_, Hd = ctx.sym("vision_hidden_size"), ctx.sym("vision_intermediate_size"), ctx.sym("vision_head_dim")
    H = ctx.sym("vision_heads")
    shape = _shape(ctx)
    tensors = tuple(ctx.tensor(p + f"self_attn.{m}.linear.weight", ranges, s, quantize=True) for m, s in (
        ("q_proj", (H * Hd, D)), ("k_proj", (H * Hd, D)), ("v_proj", (H * Hd, D)), ("o_proj", (D, H * Hd))))
    tensors += (ctx.tensor(p + "self_attn.q_norm.weight", ranges, (Hd,)),
                ctx.tensor(p + "self_attn.k_norm.weight", ranges, (Hd,)))
    tensors += tuple(ctx.tensor(p + f"mlp.{m}.linear.weight", ranges, s, quantize=True) for m, s in (
        ("gate_proj", (F_, D)), ("up_proj", (F_, D)), ("down_proj", (D, F_))))
    tensors += tuple(ctx.tensor(p + f"{n}.weight", ranges, (D,)) for n in (
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"))
    eps = fmt_eps(o.eps)
    steps = (
        Step(r"\psi_{\mathrm{attn}}=\operatorname{RMSNorm}(\psi_n)", shape, "input_layernorm"),
        Step(r"Q,K,V=\psi_{\mathrm{attn}}W_Q,\ \psi_{\mathrm{attn}}W_K,\ \psi_{\mathrm{attn}}W_V\ \text{(per head)}", shape, "qkv"),
        Step(rf"\hat Q,\hat K=\operatorname{{RMSNorm}}(Q),\operatorname{{RMSNorm}}(K),\quad \hat V=V/\sqrt{{\operatorname{{mean}}"
             rf"(V^2)+{eps}}}", shape, "qkv-norm"),
        Step(r"\hat Q,\hat K\leftarrow\operatorname{RoPE}_{2D}(\cdot,\operatorname{col}(i),\operatorname{row}(i))\ "
             r"\text{(first half of each head by the column of patch }i\text{, second by its row)},"
             rf"\ \ \omega_j={o.theta:g}^{{-4j/{o.head_dim}}}", shape, "rotate"),
        Step(rf"O_h=\operatorname{{softmax}}(\hat Q_h\hat K_h^{{\top}})\hat V_h,\ h=1,\dots,{o.heads},\quad "
             r"\Delta_{\mathrm{attn}}=[O_1;\dots]W_O",
             shape, "attend"),
        Step(r"\psi'_n=\psi_n+\operatorname{RMSNorm}(\Delta_{\mathrm{attn}})", shape, "residual-attn"),
        Step(r"\Delta_{\mathrm{ffn}}=\big(\operatorname{GELU}_{\tanh}(\hat \psi W_1)\odot \hat \psi W_3\big)W_2,\quad "
             r"\hat \psi=\operatorname{RMSNorm}(\psi'_n)", shape, "mlp"),
        Step(r"\psi_{n+1}=\psi'_n+\operatorname{RMSNorm}(\Delta_{\mathrm{ffn}})", shape, "residual-ffn"))
    return Component(
        key="encoder", title="Vision encoder block", kind="learned", code="Gemma4VisionEncoderLayer(config, i)",
        description=f"Bidirectional attention of {o.heads} heads of {o.head_dim} with q/k RMSNorms, unit-RMS values "
                    "and a 2-D rotary embedding, and a GeGLU MLP, each between two RMSNorms (Gemma's sandwich) and "
                    f"added to the residual stream; {layers} encoder blocks.",
        repeat=layers, repeat_label="vision blocks", crumb=f"{layers} vision blocks", inputs=(Port(r"\psi_n", shape, "psi"),),
        outputs=(Port(r"\psi_{n+1}", shape, "psi_next"),), equations=steps[-3:], steps=steps, tensors=tensors,
        notes=(NOTE, "Each projection is a Gemma4ClippableLinear: its weight sits under .linear. (no clipping "
                     "bounds are stored while use_clipped_linears is false)."),
        citations=(cite("An encoder layer normalises q and k per head, scales v to unit RMS, applies the multi-"
                        "dimensional rotary embedding and attends without a mask, with scaling 1.",
                        "Gemma4VisionAttention"),
                   cite("The layer wraps attention and the MLP each in two RMSNorms.", "Gemma4VisionEncoderLayer")),
        program="gemma4_vision_block", options=o,
    )


def vision_tower(ctx: Ctx, *, prefix: str, layers: int, o: Gemma4VisionOptions) -> Component:
    embed = patch_embedder(ctx, prefix=prefix + "patch_embedder.", o=o)
    block = encoder_block(ctx, prefix=prefix, layers=layers, o=o)
    out = _shape(ctx, tokens="soft_tokens")
    steps = (*embed.steps, Step(r"\psi_{n+1}=\operatorname{Block}_n(\psi_n),\quad n=0,\dots," + str(layers - 1), _shape(ctx),
                                "encoder"),
             Step(rf"\psi^{{\mathrm{{pool}}}}=\sqrt{{{ctx.size('vision_hidden_size')}}}\,\operatorname{{AvgPool}}_{{{o.pool}\times{o.pool}}}"
                  rf"(\psi_{{{layers}}})", out, "pool"))
    tensors: tuple[TensorSpec, ...] = ()
    if o.standardize:
        steps += (Step(r"\psi_{\mathrm{out}}=(\psi^{\mathrm{pool}}-b_{\mathrm{std}})\odot s_{\mathrm{std}}\quad\text{(stored buffers)}", out,
                       "standardize"),)
        tensors = tuple(TensorSpec(prefix + n, (ctx.sym("vision_hidden_size"),), (), role="buffer",
                                   storage=Dense(ctx.dtype)) for n in ("std_bias", "std_scale"))
    return Component(
        key="vision_tower", title="Gemma 4 vision tower", kind="group", code="Gemma4VisionModel(vision_config)",
        description=f"Encode an image's {ctx.size('num_patches'):,} patches into {ctx.size('soft_tokens'):,} soft "
                    f"tokens of {ctx.size('vision_hidden_size'):,} features: patch embedding, {layers} encoder blocks, "
                    f"{o.pool}×{o.pool} average pooling scaled by √d" + (", and a stored standardisation." if
                                                                        o.standardize else "."),
        inputs=embed.inputs, outputs=(Port(r"\psi_{\mathrm{out}}" if o.standardize else r"\psi^{\mathrm{pool}}", out, "v"),), equations=steps[-2:], steps=steps, tensors=tensors,
        children=(embed, block), notes=(NOTE,),
        citations=(cite("The vision model embeds patches, runs the encoder, pools k×k neighbourhoods scaled by "
                        "√hidden_size and, with standardize, subtracts std_bias and multiplies by std_scale.",
                        "Gemma4VisionModel"),),
        program="gemma4_vision_tower", options=o,
    )


def embedder(ctx: Ctx, *, prefix: str, eps: float) -> Component:
    v = Port(r"\psi_{\mathrm{out}}", _shape(ctx, tokens="soft_tokens"), "v")
    e = Port(r"x_{\mathrm{img}}", _shape(ctx, "hidden_size", "soft_tokens"), "e")
    steps = (Step(rf"\hat \psi_{{\mathrm{{out}}}}=\psi_{{\mathrm{{out}}}}/\sqrt{{\operatorname{{mean}}(\psi_{{\mathrm{{out}}}}^2)+{fmt_eps(eps)}}}",
                  v.shape, "embedding_pre_projection_norm"),
             Step(r"x_{\mathrm{img}}=\hat \psi_{\mathrm{out}}\,W_{\mathrm{emb}}", e.shape, "embedding_projection"))
    return Component(
        key="embed_vision", title="Vision embedder", kind="learned", code="Gemma4MultimodalEmbedder(vision, text)",
        description=f"Scale each soft token to unit RMS (no gain) and project its {ctx.size('vision_hidden_size'):,} "
                    f"features to the text width {ctx.size('hidden_size'):,}.",
        inputs=(v,), outputs=(e,), equations=steps, steps=steps,
        tensors=(ctx.tensor(prefix + "embedding_projection.weight", (), (ctx.sym("hidden_size"),
                                                                         ctx.sym("vision_hidden_size")), quantize=True),),
        citations=(cite("The embedder applies an RMSNorm without scale and a bias-free Linear to the text width.",
                        "Gemma4MultimodalEmbedder"),),
        program="gemma4_vision_embedder", options=Gemma4VisionOptions(0, 0, eps, 0.0, 1, False),
        reference=prefix.rstrip("."),  # the embedder module, not its one Linear
    )


# --------------------------------------------------------------------------------------------- programs

def rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x.float() * torch.pow(x.float().pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (y * w.float() if w is not None else y).type_as(x)


def rotate_2d(x: torch.Tensor, positions: torch.Tensor, o: Gemma4VisionOptions) -> torch.Tensor:
    """Axial RoPE: the first half of each head rotates by the x position, the second by y, each half with
    rotate_half pairing over its own features. x: [B, N, H, d]."""
    half = o.head_dim // 2
    inv = 1.0 / (o.theta ** (torch.arange(0, half, 2, device=x.device).float() / half))       # [half/2]
    parts = []
    for axis, piece in enumerate(x.split(half, dim=-1)):
        ang = positions[:, axis].float()[:, None] * inv[None]                                   # [N, half/2]
        cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
        a, b = piece[..., :half // 2], piece[..., half // 2:]
        parts.append(torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1))
    return torch.cat(parts, dim=-1)


@program("gemma4_patch_embed")
def run_patch_embed(comp: Component, run: Run, pixels: torch.Tensor) -> list[torch.Tensor]:
    z = run.rec("patches", F.linear(2 * (pixels - 0.5), run.w("input_proj.weight")))
    pos = grid_positions(pixels.shape[1], options(comp, Gemma4VisionOptions).grid_width, pixels.device)
    table = run.w("position_embedding_table")
    return [run.rec("positions", z + table[0][pos[:, 0]] + table[1][pos[:, 1]])]


@program("gemma4_vision_block")
def run_vision_block(comp: Component, run: Run, z: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, Gemma4VisionOptions)
    B_, N_, _ = z.shape
    a = run.rec("input_layernorm", rms(z, run.w("input_layernorm.weight"), o.eps))
    q, k, v = (F.linear(a, run.w(f"self_attn.{m}.linear.weight")).view(B_, N_, o.heads, o.head_dim)
               for m in ("q_proj", "k_proj", "v_proj"))
    run.rec("qkv", q.reshape(B_, N_, -1))
    q, k = rms(q, run.w("self_attn.q_norm.weight"), o.eps), rms(k, run.w("self_attn.k_norm.weight"), o.eps)
    v = unit_rms(v, o.eps)
    run.rec("qkv-norm", v.reshape(B_, N_, -1))
    pos = grid_positions(N_, o.grid_width, z.device)
    q, k = rotate_2d(q, pos, o), rotate_2d(k, pos, o)
    run.rec("rotate", q.reshape(B_, N_, -1))
    A = F.softmax(q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2), dim=-1, dtype=torch.float32).to(q.dtype)
    O = (A @ v.transpose(1, 2)).transpose(1, 2).reshape(B_, N_, -1)
    delta = run.rec("attend", F.linear(O, run.w("self_attn.o_proj.linear.weight")))
    z_mid = run.rec("residual-attn", z + rms(delta, run.w("post_attention_layernorm.weight"), o.eps))
    h = rms(z_mid, run.w("pre_feedforward_layernorm.weight"), o.eps)
    g, u = F.linear(h, run.w("mlp.gate_proj.linear.weight")), F.linear(h, run.w("mlp.up_proj.linear.weight"))
    ffn = run.rec("mlp", F.linear(activation(g, "gelu_tanh") * u, run.w("mlp.down_proj.linear.weight")))
    return [run.rec("residual-ffn", z_mid + rms(ffn, run.w("post_feedforward_layernorm.weight"), o.eps))]


def pool(z: torch.Tensor, k: int, width: int) -> torch.Tensor:
    """Average k×k neighbourhoods of the patch grid (row by row, `width` across), [B, N / k², d]."""
    B_, N_, D = z.shape
    grid = z.float().transpose(1, 2).reshape(B_, D, N_ // width, width)             # [B, D, y, x]
    return F.avg_pool2d(grid, k, k).flatten(2).transpose(1, 2)


@program("gemma4_vision_tower", role="Vision tower and projector", vision=True)
def run_vision_tower(comp: Component, run: Run, pixels: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, Gemma4VisionOptions)
    embed = comp.child("patch_embedder")
    (z,) = run_patch_embed(embed, run.child(relative_module(comp, embed)), pixels)
    block = comp.child("encoder")
    for layer in range(block.repeat):
        (z,) = run_vision_block(block, run.child(relative_module(comp, block).format(layer=layer), "_"), z)
    run.rec("encoder", z)
    u = run.rec("pool", pool(z, o.pool, o.grid_width) * z.shape[-1] ** 0.5)
    if o.standardize:
        bias = run.w("std_bias") if run.has("std_bias") else torch.zeros(u.shape[-1], device=u.device)
        scale = run.w("std_scale") if run.has("std_scale") else torch.ones(u.shape[-1], device=u.device)
        u = run.rec("standardize", (u - bias.float()) * scale.float())
    return [u.to(z.dtype)]


@program("gemma4_vision_embedder", role="Vision tower and projector", vision=True)
def run_embedder(comp: Component, run: Run, v: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, Gemma4VisionOptions)
    v_hat = run.rec("embedding_pre_projection_norm", unit_rms(v, o.eps))
    return [run.rec("embedding_projection", F.linear(v_hat, run.w("weight")))]  # run: the Linear's module


@reference_call("gemma4_patch_embed")
def call_patch_embed(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (pixels,) = inputs
    pos = grid_positions(pixels.shape[1], options(comp, Gemma4VisionOptions).grid_width)[None].expand(pixels.shape[0], -1, -1)
    pad = torch.zeros(pos.shape[:2], dtype=torch.bool)
    return ours, ref(pixels, pos, pad), "a patch grid without padding"


@reference_call("gemma4_vision_block")
def call_vision_block(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (z,) = inputs
    pos = grid_positions(z.shape[1], options(comp, Gemma4VisionOptions).grid_width)[None].expand(z.shape[0], -1, -1)
    rotary = model.model.vision_tower.encoder.rotary_emb
    return ours, ref(z, position_embeddings=rotary(z, pos), attention_mask=None, position_ids=pos), \
        covered("a patch grid, its positions from our program", NO_MASK, OWN_ANGLES)


@reference_call("gemma4_vision_tower")
def call_vision_tower(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (pixels,) = inputs
    pos = grid_positions(pixels.shape[1], options(comp, Gemma4VisionOptions).grid_width)[None].expand(pixels.shape[0], -1, -1)
    theirs = ref(pixel_values=pixels, pixel_position_ids=pos).last_hidden_state
    return ours.reshape(theirs.shape), theirs, "soft tokens of random patches on a grid"
