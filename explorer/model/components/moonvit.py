"""MoonViT, Kimi K2.5's vision tower, and its patch-merger projector.

The tower takes an image at its own resolution: cut into patches of `patch` × `patch` pixels on an h × w grid, each
patch embedded by a convolution, plus a learned position table resampled (bicubic) from its fixed grid to h × w.
Its blocks are pre-LayerNorm bidirectional attention and GELU MLPs, as SigLIP's, but queries and keys are rotated by
a two-axis rotary embedding (one half of the angles from the patch's column, one from its row), so the tower needs
no fixed image size. A final LayerNorm, then each 2 × 2 neighbourhood of patches becomes one group of four vectors;
the projector normalises each vector, concatenates the four (d_merge = 4 d_vision), and maps them through a GELU
MLP to the text width: one image token per four patches.

An image is one sequence without a batch axis: patches of all images are packed along one axis and attention stays
inside each image (the reference cuts the sequence at cu_seqlens). The pages show one image of grid h × w.

Equations stay at block level like the SigLIP tower's (components/vision.py): one step per projection, norm,
rotation or residual, the per-head softmax as one step.

References: "Kimi K2.5: Visual Agentic Intelligence" (Kimi K2.5 technical report, arXiv:2602.02276; MoonViT is
from "Kimi-VL Technical Report", arXiv:2504.07491); transformers' models/kimi_k25/modeling_kimi_k25.py.
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
    Ctx,
    Run,
    first_steps,
    options,
    program,
    reference_call,
    relative_module,
    run_child,
)
from explorer.model.components.check_words import OWN_ANGLES, covered
from explorer.model.components.linear import linear
from explorer.model.components.mlp import tower_mlp
from explorer.model.components.norms import layernorm
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step

KIMI_FILE = "models/kimi_k25/modeling_kimi_k25.py"
NOTE = ("Equations at block level: each projection, norm, rotation and residual is a step; the per-head attention "
        "is one step, softmax(QKᵀ/√d_h)V over the patches of the same image (no causal mask).")
LABELS = {"vision_hidden_size": "d_vision", "vision_intermediate_size": "d_ff_vision", "num_channels": "channels",
          "patch_size": "patch", "pos_emb_height": "grid_h", "pos_emb_width": "grid_w",
          "merged_hidden_size": "d_merge"}
"""Short names of the tower's sizes in shapes."""


def kimi(claim: str, symbol: str) -> Citation:
    return Citation(claim, "transformers", symbol, KIMI_FILE)


@dataclass(frozen=True, slots=True)
class ImageGrid:
    """The example image every page and check uses: `h` × `w` patches (one frame), merged `merge` × `merge`."""

    h: int
    w: int
    merge_h: int
    merge_w: int

    @property
    def patches(self) -> int:
        return self.h * self.w

    @property
    def tokens(self) -> int:
        return self.patches // (self.merge_h * self.merge_w)


@dataclass(frozen=True, slots=True)
class MoonViTOptions:
    grid: ImageGrid
    heads: int
    head_dim: int
    rope_theta: float = 10_000.0


def _dims(ctx: Ctx, grid: ImageGrid) -> tuple[Dim, Dim, Dim]:
    return Dim("patches", grid.patches), Dim("image tokens", grid.tokens), Dim("merge", grid.merge_h * grid.merge_w)


def _hidden(ctx: Ctx, grid: ImageGrid, width: str = "vision_hidden_size") -> Shape:
    """[N patches, width]: one image's patches, no batch axis."""
    return Shape((_dims(ctx, grid)[0], ctx.dim(width)))


# ---------------------------------------------------------------------------------------------- spec

def patch_embedding(ctx: Ctx, *, prefix: str, grid: ImageGrid, o: MoonViTOptions) -> Component:
    """Conv2d(channels -> d_vision, kernel = stride = patch) per patch, plus the learned position grid resampled."""
    C, P, D = (ctx.sym(n) for n in ("num_channels", "patch_size", "vision_hidden_size"))
    Hp, Wp = ctx.sym("pos_emb_height"), ctx.sym("pos_emb_width")
    n, _, _ = _dims(ctx, grid)
    patch = Dim("pixels", ctx.size(P))
    pixels = Port(r"\mathcal{P}", Shape((n, ctx.dim("num_channels"), patch, patch)), "pixel_values")
    z = Port(r"\psi_0", _hidden(ctx, grid), "psi")
    gh, gw = ctx.size(Hp), ctx.size(Wp)
    steps = (Step(r"\psi_i=W_{\mathrm{patch}}\operatorname{vec}(\mathcal{P}_i)+b_{\mathrm{patch}}", z.shape, "patches"),
             Step(rf"\psi_0=\psi+\operatorname{{Bicubic}}_{{{gh}\times{gw}\to{grid.h}\times{grid.w}}}(E_{{\mathrm{{pos}}}})",
                  z.shape, "positions"))
    return Component(
        key="patch_embed", title="Patch embedding", kind="learned", code="Kimi_K25VisionPatchEmbed(config)",
        description=f"Project each {ctx.size(P)}×{ctx.size(P)}-pixel patch to {ctx.size(D):,} features and add a "
                    f"learned position: the {gh}×{gw} table is resampled (bicubic) to the image's own patch grid, "
                    f"here {grid.h}×{grid.w}.",
        inputs=(pixels,), outputs=(z,), equations=steps, steps=steps,
        tensors=(ctx.tensor(prefix + "proj.weight", (), (D, C, P, P)),
                 ctx.tensor(prefix + "proj.bias", (), (D,)),
                 ctx.tensor(prefix + "pos_emb.position_embeddings", (), (Hp, Wp, D))),
        citations=(kimi("Patches are embedded by a Conv2d whose kernel and stride are the patch size; the learned "
                        "position grid is resampled bicubically to each image's grid and added, with a temporal "
                        "sinusoid that is zero for single images.", "Kimi_K25VisionPatchEmbed"),),
        notes=("The temporal position table (a fixed sinusoid, a non-persistent buffer) adds zero to a single "
               "image; it only separates the frames of a video.",),
        program="moonvit_patch_embed", options=o,
    )


def attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: MoonViTOptions) -> Component:
    """Bidirectional attention with biased q, k, v, out projections and a two-axis rotary embedding."""
    D, dim, d = ctx.sym("vision_hidden_size"), ctx.dim("vision_hidden_size"), ctx.size("vision_hidden_size")

    def proj(key: str, title: str, latex: str, module: str = "", xp: Port = x, y: Port | None = None,
             source: str = "") -> Component:
        """source: how the equation writes its input where it is assembled from parts (the heads' O_h)."""
        module = module or key
        y = y or Port(latex, x.shape, latex)
        return linear(ctx, key, title, weight=prefix + module + ".weight", ranges=ranges, d_in=D, d_out=D,
                      out_dim=dim, x=xp, y=y, equation=rf"{y.latex}={source or xp.latex}W_{{{latex}}}+b_{{{latex}}}",
                      description=f"Project {d:,} features to {d:,}.", code=f"self.{module}(hidden_states)", bias=True)

    out = Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn")
    children = (proj("q_proj", "Query projection", "q"), proj("k_proj", "Key projection", "k"),
                proj("v_proj", "Value projection", "v"),
                proj("proj", "Output projection", "O", xp=Port("O", x.shape, "O"), y=out,
                     source=rf"[O_1;\dots;O_{{{o.heads}}}]"))
    hd, quarter = o.head_dim, o.head_dim // 4
    col, row = r"\operatorname{col}(i)", r"\operatorname{row}(i)"
    rotate = Step(rf"\tilde q_{{i}}=\operatorname{{R}}({col},{row})\,q_i,\ \tilde k_{{i}}=\operatorname{{R}}({col},{row})\,k_i,"
                  rf"\quad \theta_{{2j}}={col}\,\omega_j,\ \theta_{{2j+1}}={row}\,\omega_j,\ \omega_j="
                  rf"{o.rope_theta:g}^{{-j/{quarter}}},\ j<{quarter}", x.shape, "rotate")
    attend = Step(rf"O_h=\operatorname{{softmax}}\!\left(\tilde q_h\tilde k_h^{{\top}}/\sqrt{{{hd}}}\right)v_h,\quad "
                  rf"h=1,\dots,{o.heads}", x.shape, "attend")
    steps = (*first_steps(children, "q_proj", "k_proj", "v_proj"), rotate, attend, *first_steps(children, "proj"))
    return Component(
        key="attn", title="Bidirectional attention with 2-D rotary positions", kind="learned",
        code="Kimi_K25VisionAttention(config)",
        description=f"{o.heads} heads of {hd} features; every patch attends to every patch of its image. Queries "
                    f"and keys are rotated by angles from the patch's column (even pairs) and row (odd pairs), so "
                    f"attention sees relative 2-D offsets at any image size.",
        inputs=(x,), outputs=(out,), equations=(rotate, attend), steps=steps, children=children,
        citations=(kimi("q, k and v are separate biased projections; q and k are rotated with the 2-D rotary "
                        "embedding, attention runs within each image (cu_seqlens) and proj mixes the heads.",
                        "Kimi_K25VisionAttention"),
                   kimi("The rotary angles interleave the column (width) and row (height) frequencies and repeat "
                        "them over the two halves the rotation pairs.", "Kimi_K25VisionRotaryEmbedding"),),
        notes=(f"Each head's {hd} features rotate in pairs (j, j + {hd // 2}) (rotate-half); pair j takes the "
               f"column position when j is even and the row position when j is odd, at frequency ω_(j//2).",),
        program="moonvit_attention", options=o,
    )


def mlp(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, y: Port, grid: ImageGrid) -> Component:
    """fc2(GELU_tanh(fc1 x + b1)) + b2."""
    return tower_mlp(ctx, prefix=prefix, ranges=ranges, x=x, y=y, hidden=_hidden(ctx, grid, "vision_intermediate_size"),
                     sizes=("vision_hidden_size", "vision_intermediate_size"), names=("fc1", "fc2"),
                     calls=("self.fc1(x)", "self.fc2(x)"),
                     code="Kimi_K25VisionMLP(hidden_size, intermediate_size, hidden_act)",
                     citations=(kimi("The MLP is fc2(act(fc1 x)) with hidden_act gelu_pytorch_tanh.",
                                     "Kimi_K25VisionMLP"),))


def block(ctx: Ctx, *, prefix: str, layers: int, o: MoonViTOptions, eps: float) -> Component:
    """x' = x + Attn(LN₁(x)); x_next = x' + MLP(LN₂(x')), one instance per encoder layer."""
    ranges = (IndexRange("layer", tuple(range(layers))),)
    p = prefix + "layers.{layer}."
    shape = _hidden(ctx, o.grid)
    x, xa, xm, xf = (Port(s, shape, n) for s, n in ((r"\psi_n", "psi"), (r"\psi_{\mathrm{attn}}", "psi_attn"), (r"\psi'_n", "psi_mid"),
                                                   (r"\psi_{\mathrm{ffn}}", "psi_ffn")))
    cite = (kimi("Each encoder layer applies a LayerNorm (gain and bias, eps 1e-5) before attention and before the "
                 "MLP and adds each result to the residual stream.", "Kimi_K25VisionEncoderLayer"),)
    ln1 = layernorm(ctx, "norm1", "Attention LayerNorm", weight=p + "norm1.weight", ranges=ranges,
                    size="vision_hidden_size", x=x, y=xa, code="self.norm1(hidden_states)", eps=eps, citations=cite)
    attn = attention(ctx, prefix=p + "attn.", ranges=ranges, x=xa, o=o)
    ln2 = layernorm(ctx, "norm2", "MLP LayerNorm", weight=p + "norm2.weight", ranges=ranges,
                    size="vision_hidden_size", x=xm, y=xf, code="self.norm2(hidden_states)", eps=eps, citations=cite)
    ffn = mlp(ctx, prefix=p + "mlp.", ranges=ranges, x=xf, y=Port(r"\Delta_{\mathrm{ffn}}", shape, "delta"),
              grid=o.grid)
    res_a = Step(r"\psi'_n=\psi_n+\Delta_{\mathrm{attn}}", shape, "residual-attn")
    res_f = Step(r"\psi_{n+1}=\psi'_n+\Delta_{\mathrm{ffn}}", shape, "residual-ffn")
    return Component(
        key="encoder", title="Vision encoder block", kind="learned", code="Kimi_K25VisionEncoderLayer(config)",
        description=f"Bidirectional attention with 2-D rotary positions and a GELU MLP, each after a LayerNorm and "
                    f"added to the residual stream; {layers} encoder blocks.",
        repeat=layers, repeat_label="vision blocks", crumb=f"{layers} vision blocks", inputs=(x,),
        outputs=(Port(r"\psi_{n+1}", shape, "psi_next"),), equations=(res_a, res_f),
        steps=(ln1.steps[0], *attn.steps, res_a, ln2.steps[0], *ffn.steps, res_f),
        children=(ln1, attn, ln2, ffn), notes=(NOTE,), citations=cite, program="moonvit_block", options=o,
    )


def vision_tower(ctx: Ctx, *, prefix: str, layers: int, o: MoonViTOptions, eps: float = 1e-5) -> Component:
    """Patch embedding, the encoder blocks, a final LayerNorm, and the 2 × 2 grouping the projector consumes."""
    embed = patch_embedding(ctx, prefix=prefix + "patch_embed.", grid=o.grid, o=o)
    enc = block(ctx, prefix=prefix, layers=layers, o=o, eps=eps)
    shape = _hidden(ctx, o.grid)
    n, m, k = _dims(ctx, o.grid)
    post = layernorm(ctx, "final_layernorm", "Final LayerNorm", weight=prefix + "final_layernorm.weight", ranges=(),
                     size="vision_hidden_size", x=Port(rf"\psi_{{{layers}}}", shape, "psi"), y=Port(r"\psi_{\mathrm{out}}", shape, "v"),
                     code="self.final_layernorm(hidden_states)", eps=eps,
                     citations=(kimi("The tower ends with a LayerNorm over the last block's output.",
                                     "Kimi_K25VisionModel"),))
    grouped = Port(r"\psi^{\mathrm{grp}}", Shape((m, k, ctx.dim("vision_hidden_size"))), "u")
    g = o.grid
    group = Step(rf"\psi^{{\mathrm{{grp}}}}_{{{g.w // g.merge_w}a+b}}=\bigl(\psi_{{\mathrm{{out}},\,({g.merge_h}a+i)\,{g.w}+{g.merge_w}b+j}}\bigr)"
                 rf"_{{i<{g.merge_h},\,j<{g.merge_w}}}",
                 grouped.shape, "merge")
    steps = (embed.steps[0], embed.steps[1],
             Step(rf"\psi_{{n+1}}=\operatorname{{Block}}_n(\psi_n),\quad n=0,\dots,{layers - 1}", shape, "encoder"),
             post.steps[0], group)
    return Component(
        key="vision_tower", title="MoonViT vision tower", kind="group", code="Kimi_K25VisionModel(vision_config)",
        description=f"Encode an image of {g.h}×{g.w} patches as {g.tokens:,} groups of {k.size} patch vectors of "
                    f"{ctx.size('vision_hidden_size'):,} features: patch embedding, {layers} encoder blocks, a final "
                    f"LayerNorm, then each {g.merge_h}×{g.merge_w} neighbourhood of patches gathered into one group "
                    "(averaged over the frames of a video; a single image has one).",
        inputs=embed.inputs, outputs=(grouped,), equations=(steps[2], steps[3], group), steps=steps,
        children=(embed, enc, post), notes=(NOTE,),
        citations=(kimi("The vision model embeds patches, runs the encoder layers and a final LayerNorm, and pools "
                        "each merge_kernel_size neighbourhood over time into one group.", "Kimi_K25VisionModel"),),
        program="moonvit_tower", options=o,
    )


def projector(ctx: Ctx, *, prefix: str, grid: ImageGrid, eps: float) -> Component:
    """LayerNorm each patch vector, concatenate a group's vectors, GELU MLP to the text width."""
    n, m, k = _dims(ctx, grid)
    Dm, d = ctx.sym("merged_hidden_size"), ctx.sym("hidden_size")
    u = Port(r"\psi^{\mathrm{grp}}", Shape((m, k, ctx.dim("vision_hidden_size"))), "u")
    u_hat = Port(r"\hat \psi^{\mathrm{grp}}", u.shape, "u_hat")
    cat = Port(r"\bar \psi", Shape((m, ctx.dim("merged_hidden_size"))), "s")
    g = Port("g", cat.shape, "g")
    a = Port("a", cat.shape, "a")
    e = Port(r"x_{\mathrm{img}}", Shape((m, ctx.dim("hidden_size"))), "e")
    cite = (kimi("The projector applies pre_norm to each patch vector, views each group of merge_kernel_size patches "
                 "as one vector of vision width × 4, and runs in_proj, GELU and out_proj.",
                 "Kimi_K25MultimodalProjection"),)
    norm = layernorm(ctx, "pre_norm", "Patch LayerNorm", weight=prefix + "pre_norm.weight", ranges=(),
                     size="vision_hidden_size", x=u, y=u_hat, code="self.pre_norm(hidden_states)", eps=eps,
                     citations=cite)
    in_proj = linear(ctx, "in_proj", "Merge projection", weight=prefix + "in_proj.weight", ranges=(), d_in=Dm, d_out=Dm,
                     out_dim=ctx.dim("merged_hidden_size"), x=cat, y=g, equation=r"g=\bar \psi\,W_{\mathrm{in}}+b_{\mathrm{in}}",
                     code="self.in_proj(hidden_states)", bias=True, citations=cite,
                     description=f"Mix the {k.size} concatenated patch vectors ({ctx.size(Dm):,} features).")
    out_proj = linear(ctx, "out_proj", "Projection to the text width", weight=prefix + "out_proj.weight", ranges=(),
                      d_in=Dm, d_out=d, out_dim=ctx.dim("hidden_size"), x=a, y=e,
                      equation=r"x_{\mathrm{img}}=aW_{\mathrm{out}}+b_{\mathrm{out}}", code="self.out_proj(hidden_states)", bias=True,
                      citations=cite, description=f"Project {ctx.size(Dm):,} features to the text model's width "
                                                  f"{ctx.size(d):,}.")
    concat = Step(rf"\bar \psi_m=\bigl[\hat \psi^{{\mathrm{{grp}}}}_{{m,1}};\dots;\hat \psi^{{\mathrm{{grp}}}}_{{m,{k.size}}}\bigr]", cat.shape, "concat")
    gelu = Step(r"a=\operatorname{GELU}(g)", cat.shape, "gelu")
    steps = (norm.steps[0], concat, in_proj.steps[0], gelu, out_proj.steps[0])
    return Component(
        key="projector", title="Patch-merger projector", kind="learned", code="Kimi_K25MultimodalProjection(config)",
        description=f"Normalise each patch vector, concatenate each group of {k.size} into {ctx.size(Dm):,} features "
                    f"and map them through a GELU MLP to {ctx.size(d):,}: {grid.tokens:,} image tokens for "
                    f"{grid.patches:,} patches.",
        inputs=(u,), outputs=(e,), equations=(concat, in_proj.steps[0], gelu, out_proj.steps[0]), steps=steps,
        children=(norm, in_proj, out_proj), citations=cite, program="kimi_projector",
        notes=("GELU here is the exact (erf) GELU of nn.GELU(), unlike the tower's tanh approximation.",),
    )


# ------------------------------------------------------------------------------------------------ programs

def axial_angles(grid: ImageGrid, head_dim: int, theta: float) -> torch.Tensor:
    """[N, head_dim] rotation angles of each patch (raster order): pair j turns by column·ω_(j//2) when j is even,
    row·ω_(j//2) when odd, repeated over the two halves that rotate-half pairs."""
    quarter = head_dim // 4
    omega = theta ** (-torch.arange(quarter, dtype=torch.float64) / quarter)           # [hd/4]
    rows = torch.arange(grid.h, dtype=torch.float64).repeat_interleave(grid.w)       # [N]
    cols = torch.arange(grid.w, dtype=torch.float64).repeat(grid.h)
    pairs = torch.stack((cols[:, None] * omega, rows[:, None] * omega), dim=-1).flatten(1)  # [N, hd/2]
    return torch.cat((pairs, pairs), dim=-1).float()


def _rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotation of [N, heads, hd] by [N, hd] angles."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * angles.cos()[:, None] + turned * angles.sin()[:, None]


@program("moonvit_patch_embed")
def run_patch_embed(comp: Component, run: Run, pixels: torch.Tensor) -> list[torch.Tensor]:
    g = options(comp, MoonViTOptions).grid
    z = run.rec("patches", F.conv2d(pixels, run.w("proj.weight"), run.w("proj.bias")).flatten(1))    # [N, D]
    return [run.rec("positions", z + resample(run.w("pos_emb.position_embeddings"), g))]


def resample(table: torch.Tensor, grid: ImageGrid) -> torch.Tensor:
    """The [H, W, D] position table at the image's grid, as [h·w, D] rows in raster order: bicubic with
    align_corners=False (at the table's own size, the table itself)."""
    image = F.interpolate(table.permute(2, 0, 1)[None], size=(grid.h, grid.w), mode="bicubic", align_corners=False)
    return image[0].flatten(1).transpose(0, 1)


@program("moonvit_attention")
def run_attention(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, MoonViTOptions)
    N_ = x.shape[0]
    q, k, v = (run_child(comp, key, run, x).view(N_, o.heads, o.head_dim) for key in ("q_proj", "k_proj", "v_proj"))
    angles = axial_angles(o.grid, o.head_dim, o.rope_theta).to(x.device)
    q, k = _rotate(q, angles), _rotate(k, angles)
    run.rec("rotate", q.flatten(1))
    scores = torch.einsum("nhd,mhd->hnm", q, k) * o.head_dim ** -0.5
    A = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    O = run.rec("attend", torch.einsum("hnm,mhd->nhd", A, v).reshape(N_, o.heads * o.head_dim))
    return [run_child(comp, "proj", run, O)]


@program("moonvit_block")
def run_block(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    x_mid = run.rec("residual-attn", x + run_child(comp, "attn", run, run_child(comp, "norm1", run, x)))
    return [run.rec("residual-ffn", x_mid + run_child(comp, "mlp", run, run_child(comp, "norm2", run, x_mid)))]


def merge_groups(v: torch.Tensor, grid: ImageGrid) -> torch.Tensor:
    """[N, D] raster patches -> [tokens, merge_h·merge_w, D]: each merge_h × merge_w neighbourhood, row-major."""
    D = v.shape[-1]
    blocks = v.view(grid.h // grid.merge_h, grid.merge_h, grid.w // grid.merge_w, grid.merge_w, D)
    return blocks.transpose(1, 2).reshape(grid.tokens, grid.merge_h * grid.merge_w, D)


@program("moonvit_tower", role="Vision tower and projector", vision=True)
def run_tower(comp: Component, run: Run, pixels: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, MoonViTOptions)
    z = run_child(comp, "patch_embed", run, pixels)
    enc = comp.child("encoder")
    for layer in range(enc.repeat):
        (z,) = run_block(enc, run.child(relative_module(comp, enc).format(layer=layer), "_"), z)
    run.rec("encoder", z)
    v = run_child(comp, "final_layernorm", run, z)
    return [run.rec("merge", merge_groups(v, o.grid))]


@program("kimi_projector", role="Vision tower and projector", vision=True)
def run_projector(comp: Component, run: Run, u: torch.Tensor) -> list[torch.Tensor]:
    u_hat = run_child(comp, "pre_norm", run, u)
    s = run.rec("concat", u_hat.flatten(1))
    a = run.rec("gelu", F.gelu(run_child(comp, "in_proj", run, s)))
    return [run_child(comp, "out_proj", run, a)]


# ------------------------------------------------------------------------------------------ reference calls

def _grid_thw(grid: ImageGrid) -> torch.Tensor:
    return torch.tensor([[1, grid.h, grid.w]])


def _reference_rotary(model, grid: ImageGrid, x: torch.Tensor):
    """The reference tower's own (cos, sin) for the example image, from its own position ids."""
    from transformers.vision_utils import get_vision_position_ids

    tower = model.model.vision_tower
    return tower.rotary_emb(x, get_vision_position_ids(_grid_thw(grid), spatial_merge_size=1))


def _cu_seqlens(grid: ImageGrid) -> torch.Tensor:
    return torch.tensor([0, grid.patches], dtype=torch.int32)


@reference_call("moonvit_patch_embed")
def call_patch_embed(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (pixels,) = inputs
    return ours, ref(pixels, grid_thw=_grid_thw(options(comp, MoonViTOptions).grid)), "one image, one frame"


@reference_call("moonvit_attention")
def call_attention(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The attention and the whole block take the same arguments: the image's patch bounds and its axial rotary."""
    (x,) = inputs
    g = options(comp, MoonViTOptions).grid
    return ours, ref(x, cu_seqlens=_cu_seqlens(g), position_embeddings=_reference_rotary(model, g, x)), \
        covered("one image: attention over all its patches", OWN_ANGLES)


reference_call("moonvit_block")(call_attention)


@reference_call("moonvit_tower")
def call_tower(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (pixels,) = inputs
    g = options(comp, MoonViTOptions).grid
    return ours, ref(pixels, grid_thw=_grid_thw(g)).pooler_output, "pooled 2×2 groups of random pixels"


@reference_call("kimi_projector")
def call_projector(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    (u,) = inputs
    return ours, ref(u).squeeze(1), "one output row per group"


__all__ = ["ImageGrid", "MoonViTOptions", "LABELS", "vision_tower", "projector", "axial_angles"]
