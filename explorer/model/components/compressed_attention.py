"""DeepSeek-V4's attention: many query heads over a single shared key-value head of width head_dim (the same vector
is the key and the value), a sliding window over the recent positions, and in most layers a compressor that pools
every m positions into one extra key-value entry (m = 4 with overlapping windows and a lightning indexer that
picks the top index_topk entries per query; m = 128 without), a learned sink logit per head, the value's rotary
slice rotated back at the query position, and a grouped low-rank output projection.

References: the DeepSeek-V4 technical report (DeepSeek-AI, 2026), section 2.3 (compressed sparse attention, heavily
compressed attention, grouped output projection); the DeepSeek-V3.2 report (arXiv:2512.02556) for the lightning indexer; transformers'
models/deepseek_v4/modeling_deepseek_v4.py (DeepseekV4Attention, DeepseekV4CSACompressor,
DeepseekV4HCACompressor, DeepseekV4Indexer, DeepseekV4GroupedLinear) for the reference modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import sympy

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.attention import headline_steps, window_mask
from explorer.model.components.base import (
    B,
    Ctx,
    Run,
    T,
    ctx_colour,
    fmt_eps,
    k,
    options,
    program,
    q,
    reference_call,
    run_child,
)
from explorer.model.components.base import v as v_
from explorer.model.components.dsa import relu_scores, weigh_heads
from explorer.model.components.linear import linear
from explorer.model.components.norms import NormOptions, apply_norm, rmsnorm
from explorer.model.components.part_facts import BlockView, MaskSpec, PictureKind
from explorer.model.components.rope import RopeOptions, frequency_steps, inverse_frequencies
from explorer.spec.storage import Dense
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step, TensorSpec

AttentionKind = Literal["sliding", "csa", "hca"]
KIND_TYPES = {"sliding": "sliding_attention", "csa": "compressed_sparse_attention", "hca": "heavily_compressed_attention"}
"""Attention kind -> DeepseekV4Config's layer_types name."""
KIND_TITLES = {"sliding": "Sliding-window attention", "csa": "Compressed sparse attention",
               "hca": "Heavily compressed attention"}
FILE = "models/deepseek_v4/modeling_deepseek_v4.py"


def _cite(claim: str, symbol: str) -> Citation:
    return Citation(claim, "transformers", "DeepseekV4" + symbol, FILE)


# ------------------------------------------------------------------------------------------------ rotary

def angles(o: RopeOptions, positions: torch.Tensor, run: Run | None = None) -> torch.Tensor:
    """t·ω_j for each position and rotary pair; V4 applies no YaRN attention factor (it is set to 1). `run`
    records θ_j and ω_j (a layer's steps show them)."""
    return positions.float()[..., None] * inverse_frequencies(run if run is not None else Run({}), o, positions.device)


def rotate_tail(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (x_2j, x_2j+1) of the last 2·pairs features in place; theta [..., T, pairs] broadcasts
    over x [B, T, (H,) d] (a head axis after T gets a singleton inserted)."""
    pairs = theta.shape[-1]
    if x.dim() == 4:
        theta = theta.unsqueeze(-2)
    cos, sin = theta.cos(), theta.sin()
    head, tail = x[..., :-2 * pairs], x[..., -2 * pairs:].float()
    x1, x2 = tail[..., 0::2], tail[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat([head, rotated.to(x.dtype)], dim=-1)


# ------------------------------------------------------------------------------------------- compressor

@dataclass(frozen=True, slots=True)
class CompressorOptions:
    ratio: int
    """m: source positions pooled into one entry."""
    width: int
    """Features of one compressed entry (head_dim, or index_head_dim for the indexer's keys)."""
    overlap: bool
    """Two series per position, so entry w pools window w−1's first series with window w's second (stride m,
    span 2m), as the ratio-4 compressor and the indexer do."""
    rope: RopeOptions
    eps: float


def compressor_tensors(ctx: Ctx, prefix: str, ranges: tuple[IndexRange, ...], width: str, o: CompressorOptions,
                       ) -> tuple[TensorSpec, ...]:
    """kv_proj and gate_proj [s·width, d] (s = 2 with overlap), position_bias [m, s·width], kv_norm [width]; the
    projections stay in the model's dtype (the reference keeps them out of FP8)."""
    s = 2 if o.overlap else 1
    w, d = ctx.sym(width), ctx.sym("hidden_size")
    return (ctx.tensor(prefix + "kv_proj.weight", ranges, (s * w, d)),
            ctx.tensor(prefix + "gate_proj.weight", ranges, (s * w, d)),
            TensorSpec(prefix + "position_bias", (sympy.Integer(o.ratio), s * w), ranges, storage=Dense("F32")),
            TensorSpec(prefix + "kv_norm.weight", (w,), ranges, storage=Dense("F32")))


def entries_dim(ratio: int) -> Dim:
    """One compressed entry per closed window: ⌊T/m⌋ of them."""
    return Dim("entries", symbol=f"T/{ratio}")


def compressor_steps(ctx: Ctx, o: CompressorOptions, x: str, width: Dim, sub: str) -> tuple[Step, ...]:
    """The pooling equations; `sub` marks the indexer's copies (I)."""
    s = 2 if o.overlap else 1
    m = o.ratio
    n = entries_dim(m)
    series = Dim(("2·" if o.overlap else "") + width.label, s * (width.size or 0))
    C, Z = "C^{" + (sub or r"\mathrm{kv}") + "}", f"Z^{{{sub}}}"  # C alone is Mamba-2's read-out vector
    pooled = (rf"\tilde c^{{{sub}}}_w=\sum_{{j\in\text{{window }}w}}\operatorname{{softmax}}_j({Z}_j+B^{{\mathrm{{pos}}}}_j)"
              rf"\odot {C}_j"
              if not o.overlap else
              rf"\tilde c^{{{sub}}}_w=\sum_{{j=1}}^{{{2 * m}}}\operatorname{{softmax}}_j(\mathcal Z_{{w,j}})\odot "
              rf"\mathcal C_{{w,j}},\ \ \mathcal C_{{w}}=[C^{{a}}_{{\text{{window }}w-1}};C^{{b}}_{{\text{{window }}w}}],\ "
              rf"\mathcal Z_{{w}}=[Z^{{a}}+B^{{a}};Z^{{b}}+B^{{b}}]\ \text{{likewise}}")
    return (
        Step(rf"{C}={x}W_{{\mathrm{{KV}}}}^{{{sub}}},\quad {Z}={x}W_{{\mathrm{{Z}}}}^{{{sub}}}"
             # the two overlapping series the pooling step reads are the halves of each projection
             + (rf",\quad [C^{{a}};C^{{b}}]={C},\ [Z^{{a}};Z^{{b}}]={Z}" if o.overlap else ""), ctx.tokens(series),
             f"{sub.lower() or 'c'}-project"),
        Step(pooled + rf"\quad(\text{{ratio }}{m},\ \text{{entries }}w<\lfloor T/{m}\rfloor)", Shape((B, n, width)),
             f"{sub.lower() or 'c'}-pool"),
        Step(rf"c^{{{sub}}}_w=\operatorname{{RoPE}}_{{{m}w}}\big(\operatorname{{RMSNorm}}(\tilde c^{{{sub}}}_w)\big),\ \ "
             rf"\epsilon={fmt_eps(o.eps)}",
             Shape((B, n, width)), f"{sub.lower() or 'c'}-entries"),
    )


def compress(run: Run, o: CompressorOptions, x: torch.Tensor) -> torch.Tensor:
    """The compressed entries [B, ⌊T/m⌋, width] of x [B, T, d]; run is the compressor's (weights kv_proj...)."""
    m, w = o.ratio, o.width
    Bn, Tn, _ = x.shape
    n = Tn // m
    kv, gate = F.linear(x, run.w("kv_proj.weight")), F.linear(x, run.w("gate_proj.weight"))
    run.rec("project", kv)
    kv = kv[:, :n * m].reshape(Bn, n, m, kv.shape[-1])
    gate = gate[:, :n * m].reshape(Bn, n, m, gate.shape[-1]) + run.w("position_bias")
    if o.overlap:  # entry w: window w−1's first series (zero weight for w = 0) and window w's second series
        first_kv = torch.cat([torch.zeros_like(kv[:, :1, :, :w]), kv[:, :-1, :, :w]], dim=1)
        first_gate = torch.cat([torch.full_like(gate[:, :1, :, :w], float("-inf")), gate[:, :-1, :, :w]], dim=1)
        kv, gate = torch.cat([first_kv, kv[..., w:]], dim=2), torch.cat([first_gate, gate[..., w:]], dim=2)
    pooled = run.rec("pool", (kv * gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)).sum(dim=2))
    normed = apply_norm(run, "normed", pooled, NormOptions("rms", o.eps), "kv_norm.")
    return run.rec("entries", rotate_tail(normed, angles(o.rope, entry_positions(n, m, x.device))))


def entry_positions(n: int, ratio: int, device) -> torch.Tensor:
    """Entry w is rotated at the first position of its window, w·m."""
    return torch.arange(n, device=device) * ratio


def visible(ratio: int, T_: int, n: int, device) -> torch.Tensor:
    """Query t may read entry w once its window has closed: w < ⌊(t+1)/m⌋; [T, n] booleans."""
    t = torch.arange(T_, device=device)
    return torch.arange(n, device=device)[None, :] < ((t + 1) // ratio)[:, None]


@dataclass(frozen=True, slots=True)
class IndexerOptions:
    compressor: CompressorOptions
    heads: int
    head_dim: int
    topk: int


def indexer(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, cq: Port, o: IndexerOptions,
            citations: tuple[Citation, ...]) -> Component:
    """The lightning indexer of compressed sparse attention: its own compressed keys of width index_head_dim, its
    queries from the query latent, ReLU scores weighted per head, top-k entries per query."""
    co = o.compressor
    tensors = compressor_tensors(ctx, prefix, ranges, "index_head_dim", co) + (
        ctx.tensor(prefix + "q_b_proj.weight", ranges, (ctx.sym("index_n_heads") * ctx.sym("index_head_dim"),
                                                         ctx.sym("q_lora_rank")), quantize=True),
        ctx.tensor(prefix + "scorer.weights_proj.weight", ranges, (ctx.sym("index_n_heads"), ctx.sym("hidden_size"))))
    heads, dI = Dim("index_heads", o.heads), Dim("d_index", o.head_dim)
    steps = compressor_steps(ctx, co, x.latex, dI, "I") + (
        Step(rf"q^{{I}}_{{t}}=\operatorname{{RoPE}}_t\big({cq.latex}W^{{I}}_{{Q}}\big)", ctx.tokens(heads, dI), "iq"),
        Step(rf"w'_{{t,h}}={x.latex}W^{{I}}_{{w}}/\sqrt{{{o.heads}}}", ctx.tokens(heads), "iw"),
        Step(rf"I_{{t,s}}=\sum_{{h=1}}^{{{o.heads}}}w'_{{t,h}}\operatorname{{ReLU}}\big(q^{{I}}_{{t,h}}\cdot "
             rf"c^{{I}}_s\big)/\sqrt{{{o.head_dim}}}", ctx.tokens(entries_dim(co.ratio)), "iscores"),
        Step(rf"\mathcal S_t=\operatorname{{top}}_{{{o.topk}}}\{{I_{{t,s}}:\ s<\lfloor(t+1)/{co.ratio}\rfloor\}}", None,
             "iselect"),
    )
    return Component(
        key="indexer", title="Lightning indexer", kind="learned", code="DeepseekV4Indexer(config)",
        description=f"Score every closed compressed entry for each query with {o.heads} ReLU heads of width "
                    f"{o.head_dim} over its own compressed keys, and keep the top {o.topk}.",
        inputs=(x, cq), outputs=(Port(r"\mathcal S", ctx.tokens(entries_dim(co.ratio)), "selected"),),
        equations=steps[-2:], steps=steps,
        tensors=tensors, citations=citations, program="v4_indexer", options=o,
    )


def select(run: Run, o: IndexerOptions, x: torch.Tensor, c_q: torch.Tensor) -> torch.Tensor:
    """The top-k selection as a [B, T, n] 0/1 mask of valid (closed) entries; run is the indexer's.

    The scores are DeepSeek Sparse Attention's (dsa.relu_scores, weigh_heads: the same weighted ReLU of query-key
    products); the rest is V4's own: the keys are pooled windows (compress), not a projection of every token, the
    queries rotate their last features at V4's frequencies, not their first, and only closed entries compete, so
    the selection is a 0/1 mask over entries rather than dsa's additive mask over tokens."""
    keys = compress(run.child(prefix="i-"), o.compressor, x)                      # [B, n, d_I]
    Bn, Tn, _ = x.shape
    positions = torch.arange(Tn, device=x.device)
    qI = F.linear(c_q, run.w("q_b_proj.weight")).view(Bn, Tn, o.heads, o.head_dim)
    qI = run.rec("iq", rotate_tail(qI, angles(o.compressor.rope, positions)))
    w = run.rec("iw", F.linear(x, run.w("scorer.weights_proj.weight")).float() * o.heads ** -0.5)
    scores = run.rec("iscores", weigh_heads(w, relu_scores(qI, keys, o.head_dim ** -0.5)))  # [B, T, n]
    ok = visible(o.compressor.ratio, Tn, keys.shape[1], x.device)
    return run.rec("iselect", pick_entries(scores, ok, o.topk))


def pick_entries(scores: torch.Tensor, ok: torch.Tensor, topk: int) -> torch.Tensor:
    """1 at each query's `topk` highest-scoring closed entries (every closed one where fewer exist), else 0."""
    scores = scores.masked_fill(~ok, float("-inf"))
    picked = scores.topk(min(topk, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(scores).scatter(-1, picked, 1.0) * ok


@program("v4_indexer")
def run_indexer(comp: Component, run: Run, x: torch.Tensor, c_q: torch.Tensor) -> list[torch.Tensor]:
    return [select(run, options(comp, IndexerOptions), x, c_q)]


@reference_call("v4_indexer")
def call_indexer(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference returns top-k entry indices with −1 for picks past the causal bound: compared as sets."""
    x, c_q = inputs
    positions = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    idx = ref(x, c_q, positions, None, 0)
    theirs = torch.zeros(*idx.shape[:2], ours.shape[-1] + 1).scatter(-1, idx.where(idx >= 0, ours.shape[-1]), 1.0)
    return ours, theirs[..., :-1], f"the same top-{idx.shape[-1]} entries for all {x.shape[0] * x.shape[1]} queries"


def pooling(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: CompressorOptions) -> Component:
    """The compressor's own weights and its pooling: x [B, T, d] -> entries [B, ⌊T/m⌋, head_dim]."""
    dh = ctx.dim("head_dim")
    steps = compressor_steps(ctx, o, x.latex, dh, "")
    return Component(
        key="pool", title=f"Windowed pooling (ratio {o.ratio})", kind="learned", code="kv_proj, gate_proj, "
        "position_bias, kv_norm", description=f"Project each position to {'two series of ' if o.overlap else ''}"
        f"{dh.size} key-value features and as many gate logits, add a learned bias per slot of the window, and "
        f"pool each window of {o.ratio}{f' (span {2 * o.ratio} with the previous window)' if o.overlap else ''} by a "
        "softmax over its slots; normalise and rotate each entry.",
        inputs=(x,), outputs=(Port("c", Shape((B, entries_dim(o.ratio), dh)), "entries"),), equations=steps[1:],
        steps=steps, tensors=compressor_tensors(ctx, prefix, ranges, "head_dim", o), program="v4_pool", options=o,
        citations=(ctx.reference.cite("The compressor projects keys, values and gate logits, adds a position bias per "
                                      "window slot and pools each window by a softmax over its slots.",
                                      "CSACompressor" if o.overlap else "HCACompressor"),),
        reference="-")


@program("v4_pool")
def run_pool(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    return [compress(run.child(prefix="c-"), options(comp, CompressorOptions), x)]


def compressor(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, cq: Port, o: CompressorOptions,
               index: IndexerOptions | None, citations: tuple[Citation, ...],
               indexer_citations: tuple[Citation, ...] = ()) -> Component:
    """A layer's compressor: one KV entry per m positions (ratio 4 with overlap and an indexer; 128 without)."""
    dh = ctx.dim("head_dim")
    children: tuple[Component, ...] = (pooling(ctx, prefix=prefix, ranges=ranges, x=x, o=o),)
    if index is not None:
        children += (indexer(ctx, prefix=prefix + "indexer.", ranges=ranges, x=x, cq=cq, o=index,
                             citations=indexer_citations),)
    steps = tuple(st for c in children for st in c.steps) + (
        Step(r"\mathcal V_{t,w}=[\,w<\lfloor(t+1)/" + str(o.ratio) + r"\rfloor\,]"
             + (r"\wedge[\,w\in\mathcal S_t\,]" if index is not None else ""),
             ctx.tokens(entries_dim(o.ratio)), "c-visible"),)
    what = (f"pools every {o.ratio} positions (two overlapping series, span {2 * o.ratio}) into one "
            f"{dh.size}-feature entry, and a lightning indexer picks {index.topk} of them per query"
            if index is not None else f"pools every {o.ratio} positions into one {dh.size}-feature entry")
    return Component(
        key="compressor", title=f"KV compressor (ratio {o.ratio})", kind="learned",
        code=("DeepseekV4CSACompressor(config)" if index is not None else "DeepseekV4HCACompressor(config)"),
        description=f"A softmax-gated pooling with a learned bias per position in the window {what}.",
        # Only the indexer reads the query latent: a compressor without one (HCA) takes x alone.
        inputs=(x, cq) if index is not None else (x,), outputs=children[0].outputs,
        equations=(steps[1], steps[-1]), steps=steps, children=children, citations=citations,
        program="v4_compressor", options=o,
    )


def compressed_entries(comp: Component, run: Run, x: torch.Tensor, c_q: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(entries [B, n, head_dim], visibility [B, T, n] booleans) of a compressor component; c_q: the query latent,
    which only a compressor with an indexer reads."""
    o = options(comp, CompressorOptions)
    entries = run_child(comp, "pool", run, x)
    ok = visible(o.ratio, x.shape[1], entries.shape[1], x.device).expand(x.shape[0], -1, -1)
    if len(comp.children) > 1:
        ok = ok & (run_child(comp, "indexer", run, x, c_q) > 0)
    return entries, run.rec("c-visible", ok)


@program("v4_compressor")
def run_compressor(comp: Component, run: Run, x: torch.Tensor, *c_q: torch.Tensor) -> list[torch.Tensor]:
    """c_q: the query latent, which the attention passes every compressor and only one with an indexer reads."""
    return [compressed_entries(comp, run, x, c_q[0] if c_q else None)[0]]


# -------------------------------------------------------------------------------------------- attention

@dataclass(frozen=True, slots=True)
class V4AttentionOptions:
    kind: AttentionKind
    heads: int
    head_dim: int
    rope_dim: int
    o_groups: int
    o_lora_rank: int
    window: int
    rope: RopeOptions
    eps: float

    @property
    def kv_heads(self) -> int:
        """One key-value head shared by every query head (the single wkv projection)."""
        return 1


def grouped_output(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], o: V4AttentionOptions) -> Component:
    """o_a_proj: each of g head groups (heads·head_dim/g features) projected to its own o_lora_rank features."""
    g, per = o.o_groups, o.heads * o.head_dim // o.o_groups
    H, dh, G, r = (ctx.sym(s) for s in ("num_attention_heads", "head_dim", "o_groups", "o_lora_rank"))
    x = Port(ctx_colour(r"O^{\mathrm{grp}}"), ctx.tokens(Dim("groups", g), Dim("heads·d_head/groups", per)), "O_groups")
    y = Port(ctx_colour("O^{A}"), ctx.tokens(Dim("groups", g), ctx.dim("o_lora_rank")), "u")
    o_g = ctx_colour(r"O^{\mathrm{grp}}_{j}")
    step = Step(rf"{ctx_colour('O^{A}_{j}')}={o_g}W^{{A}}_{{j}},\ \ j=1,\dots,{g}",
                y.shape, "o-a")
    return Component(
        key="o_a_proj", title="Grouped output projection", kind="learned",
        code="DeepseekV4GroupedLinear(heads·head_dim/o_groups, o_groups·o_lora_rank, o_groups)",
        description=f"Split the {o.heads} heads' outputs into {g} groups of {per:,} features and project each group "
                    f"with its own matrix to {o.o_lora_rank:,} features (a block-diagonal map).",
        inputs=(x,), outputs=(y,), equations=(step,), steps=(step,),
        tensors=(ctx.tensor(prefix + "o_a_proj.weight", ranges, (G * r, H * dh / G), quantize=True),),
        citations=(_cite("GroupedLinear views its weight as o_groups blocks and multiplies each head group by its "
                         "own block.", "GroupedLinear"),),
        program="grouped_linear", options=o,
        notes=("The weight is stored as one [o_groups·o_lora_rank, heads·head_dim/o_groups] matrix: block j is rows "
               "j·o_lora_rank to (j+1)·o_lora_rank.",),
    )


@program("grouped_linear")
def run_grouped_linear(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, V4AttentionOptions)
    w = run.w("weight").view(o.o_groups, o.o_lora_rank, -1)
    return [run.rec("o-a", torch.einsum("btgi,goi->btgo", x, w))]


def v4_attention(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: V4AttentionOptions,
                 compressor_c: Component | None, citations: tuple[Citation, ...]) -> Component:
    """Attention of one layer kind: shared single KV head, window, optional compressor, sinks, grouped output."""
    H, dh, dr = o.heads, o.head_dim, o.rope_dim
    heads, d_head = Dim("heads", H), ctx.dim("head_dim")
    eps = o.eps
    cq = Port(q(r"\hat c^{Q}"), ctx.tokens("q_lora_rank"), "c_q_hat")
    q_a = linear(ctx, "q_a_proj", "Query down-projection", weight=prefix + "q_a_proj.weight", ranges=ranges,
                 d_in="hidden_size", d_out="q_lora_rank", out_dim=ctx.dim("q_lora_rank"), x=x,
                 y=Port(q("c^{Q}"), ctx.tokens("q_lora_rank"), "c_q"), equation=rf"{q('c^{Q}')}={x.latex}W_{{DQ}}",
                 description=f"Compress each token to a {ctx.size('q_lora_rank'):,}-dimensional query latent.",
                 code="self.q_a_proj(hidden_states)")
    q_norm = rmsnorm(ctx, "q_a_norm", "Query latent RMSNorm", weight=prefix + "q_a_norm.weight", ranges=ranges,
                     size="q_lora_rank", x=q_a.outputs[0], y=cq, code="self.q_a_norm(q_a)", eps=eps)
    q_b = linear(ctx, "q_b_proj", "Query up-projection", weight=prefix + "q_b_proj.weight", ranges=ranges,
                 d_in="q_lora_rank", d_out=ctx.sym("num_attention_heads") * ctx.sym("head_dim"),
                 out_dim=Dim("heads·d_head", H * dh), x=cq, y=Port(q("q"), ctx.tokens(Dim("heads·d_head", H * dh)), "q"),
                 equation=rf"{q('q')}={cq.latex}W_{{UQ}}", code="self.q_b_proj(q_residual)",
                 description=f"Expand the query latent to {H} heads of {dh} features.")
    kv_p = linear(ctx, "kv_proj", "Shared key-value projection", weight=prefix + "kv_proj.weight", ranges=ranges,
                  d_in="hidden_size", d_out="head_dim", out_dim=d_head, x=x,
                  y=Port(k("c^{KV}"), ctx.tokens("head_dim"), "kv"), equation=rf"{k('c^{KV}')}={x.latex}W_{{KV}}",
                  code="self.kv_proj(hidden_states)",
                  description=f"Project each token to one {dh}-feature vector that every head reads as its key and "
                              "its value.")
    kv_n = rmsnorm(ctx, "kv_norm", "Key-value RMSNorm", weight=prefix + "kv_norm.weight", ranges=ranges,
                   size="head_dim", x=kv_p.outputs[0], y=Port(k(r"\hat c^{KV}"), ctx.tokens("head_dim"), "kv_hat"),
                   code="self.kv_norm(kv)", eps=eps)
    o_a = grouped_output(ctx, prefix=prefix, ranges=ranges, o=o)
    o_b = linear(ctx, "o_b_proj", "Output mixing projection", weight=prefix + "o_b_proj.weight", ranges=ranges,
                 d_in=ctx.sym("o_groups") * ctx.sym("o_lora_rank"), d_out="hidden_size", out_dim=ctx.dim("hidden_size"),
                 x=Port(ctx_colour("O^{A}"), ctx.tokens(Dim("groups·d_og", o.o_groups * o.o_lora_rank)), "u_flat"),
                 y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"), equation=r"\Delta_{\mathrm{attn}}=[O^{A}_1;\dots;O^{A}_{"
                 + str(o.o_groups) + r"}]W_{OB}", code="self.o_b_proj(grouped)",
                 description=f"Mix the {o.o_groups} groups' {o.o_lora_rank:,} features each back to "
                             f"{ctx.size('hidden_size'):,} features.")
    hd = lambda *dims: ctx.tokens(heads, *dims)  # noqa: E731
    m = options(compressor_c, CompressorOptions).ratio if compressor_c is not None else 0
    QR, QRh, kvh = q(r"Q^{R}_{t,h}"), q(r"Q^{R}_h"), k(r"\hat c^{KV}_t")
    Ot, Ogrp, Otilde = ctx_colour(r"\tilde O_{t,h}"), ctx_colour(r"O^{\mathrm{grp}}"), ctx_colour(r"\tilde O")
    steps = [
        *q_a.steps, q_norm.equations[0], *q_b.steps,
        Step(rf"{q('Q_h')}=\operatorname{{RMSNorm}}_{{\varnothing}}({q('q')}_{{h}}),\ \ \epsilon={fmt_eps(eps)}", hd(d_head),
             "q-head-norm"),
        *frequency_steps(o.rope),
        Step(rf"{QR}=\operatorname{{RoPE}}_{{t}}({q('Q_{t,h}')})\ \text{{on the last {dr} features}}",
             hd(d_head), "q-rotate"),
        *kv_p.steps, kv_n.equations[0],
        Step(rf"{k('k_t')}=\operatorname{{RoPE}}_{{t}}({kvh})", ctx.tokens("head_dim"), "kv-rotate"),
    ]
    if compressor_c is not None:
        steps += [Step(r"\text{" + compressor_c.title + ":}", heading=True, name="compressor"), *compressor_c.steps]
    sc = sink_scores(ctx, prefix=prefix, ranges=ranges, o=o, m=m, Q=Port(QRh, hd(d_head), "Q"),
                     K=Port(k("k"), ctx.tokens("head_dim"), "k"))
    steps += [
        *sc.steps,
        Step(rf"{Ot}=\operatorname{{RoPE}}_{{-t}}({ctx_colour('O_{t,h}')})"
             rf"\ \text{{on the last {dr} features}}", hd(d_head), "o-unrotate"),
        Step(rf"{Ogrp}=\operatorname{{reshape}}({Otilde})",
             o_a.inputs[0].shape, "o-groups"),
        *o_a.steps, *o_b.steps,
    ]
    children = (q_a, q_norm, q_b, kv_p, kv_n) + ((compressor_c,) if compressor_c else ()) + (sc, o_a, o_b)
    extra = ("" if not m else f", plus one compressed entry per {m} positions" + (
        " that a lightning indexer selects from" if o.kind == "csa" else ""))
    return Component(
        key="attn", title=KIND_TITLES[o.kind], kind="learned", code="DeepseekV4Attention(config, layer_idx)",
        description=f"{H} query heads attend over one shared {dh}-feature key-value head within a window of "
                    f"{o.window} positions{extra}; a learned sink per head; the output goes through {o.o_groups} "
                    f"grouped low-rank projections.",
        inputs=(x, Port("M", Shape((T, T)), "mask")), outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=headline_steps(tuple(steps), ("keys", "c-entries", "iselect", "mask", "o-a")),
        steps=tuple(steps), children=children, citations=citations, program="v4_attention", options=o,
        extras=(("rotary base", f"{o.rope.theta:g}" + (" (YaRN)" if o.rope.kind == "yarn" else "")),
                ("window", f"{o.window} positions")),
        notes=("Keys and values are the same vector: each value carries the rotation of its position on its last "
               f"{dr} features, which the output undoes by rotating back to the query's position.",),
    )


def sink_scores(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], o: V4AttentionOptions, m: int, Q: Port,
                K: Port) -> Component:
    """Softmax attention of every head over the window's shared vectors and the visible compressed entries, with a
    learned sink logit per head that takes probability and gives no value; tensor `prefix`sinks [heads]."""
    hd, dh = ctx.tokens(Dim("heads", o.heads), ctx.dim("head_dim")), o.head_dim
    extra = (Port("c", Shape((B, entries_dim(m), ctx.dim("head_dim"))), "entries"),
             Port(r"\mathcal V", ctx.tokens(entries_dim(m)), "visible")) if m else ()
    n_extra = rf";\,c_1;\dots;c_{{\lfloor T/{m}\rfloor}}" if m else ""
    QRh = Q.latex
    keys = Dim("keys", symbol=f"T+T/{m}" if m else "T")
    steps = (
        Step(rf"{k('K')}={v_('V')}=[{k('k_1')};\dots;{k('k_T')}{n_extra}]", Shape((B, keys, ctx.dim("head_dim"))),
             "keys"),
        Step(rf"M_{{t,s}}=0\ \text{{if }}0\le t-s<{o.window}\text{{ (window)}}"
             + (r"\text{ or entry visible }(\mathcal V)" if m else "") + r",\ -\infty\text{ else}",
             Shape((B, T, keys)), "mask"),
        Step(rf"A_h=\operatorname{{softmax}}\big([{QRh}{k('K')}^{{\top}}/\sqrt{{{dh}}}+M;\ \kappa_h]\big)"
             r"_{\setminus\kappa}", Shape((B, Dim("heads", o.heads), T, keys)), "softmax"),
        Step(rf"{ctx_colour('O_h')}=A_h{v_('V')}", hd, "context"),
    )
    return Component(
        key="scores", title="Attention with sinks", kind="learned", code="eager_attention_forward(..., s_aux=sinks)",
        description=f"Each of {o.heads} heads takes a softmax over its scaled dot products with the {dh}-feature "
                    "shared vectors (window, then compressed entries) and its own sink logit, drops the sink's share "
                    "and averages the same vectors as values.",
        inputs=(Q, K, *extra, Port("M", Shape((T, T)), "mask")), outputs=(Port(ctx_colour("O"), hd, "O"),),
        equations=steps[2:], steps=steps,
        tensors=(TensorSpec(prefix + "sinks", (ctx.sym("num_attention_heads"),), ranges, storage=Dense("F32")),),
        citations=(ctx.reference.cite("The sinks join the softmax as one more logit per head, and their column is "
                                      "dropped after it.", "eager_attention_forward", prefixed=False),),
        program="v4_scores", options=o, reference="-")


@program("v4_scores")
def run_v4_scores(comp: Component, run: Run, Q: torch.Tensor, K: torch.Tensor, *rest: torch.Tensor
                  ) -> list[torch.Tensor]:
    """rest: (entries, visibility, mask) with a compressor, (mask,) without."""
    o = options(comp, V4AttentionOptions)
    Bn, Tn = Q.shape[:2]
    if len(rest) == 3:
        K = torch.cat([K, rest[0]], dim=1)
    mask = v4_mask(rest[-1], o.window, rest[1] > 0 if len(rest) == 3 else None).expand(Bn, Tn, -1)
    run.rec("keys", K), run.rec("mask", mask)
    logits = torch.einsum("bthd,bsd->bhts", Q, K) * o.head_dim ** -0.5 + mask[:, None]
    sink = run.w("sinks").reshape(1, -1, 1, 1).expand(Bn, o.heads, Tn, 1).to(logits.dtype)
    full = torch.cat([logits, sink], dim=-1)
    A = run.rec("softmax", F.softmax(full - full.max(dim=-1, keepdim=True).values, dim=-1)[..., :-1])
    return [run.rec("context", torch.einsum("bhts,bsd->bthd", A, K))]


def v4_mask(M: torch.Tensor, window: int, ok: torch.Tensor | None) -> torch.Tensor:
    """The additive mask over the window's keys and then the compressed entries: M [T, T] causal, ok [.., T, n]
    the entries each query may read (None without a compressor)."""
    mask = window_mask(M, window)
    if ok is None:
        return mask
    mask = mask.expand(*ok.shape[:-1], -1)
    return torch.cat([mask, torch.zeros_like(ok, dtype=mask.dtype).masked_fill(~ok, float("-inf"))], dim=-1)


def v4_mask_spec(comp: Component) -> MaskSpec:
    """Window and sinks, plus one entry per ratio positions where a compressor is inside (and the indexer's top-k
    where it has one)."""
    o = options(comp, V4AttentionOptions)
    comp_c = next((c for c in comp.children if c.key == "compressor"), None)
    if comp_c is None:
        return MaskSpec(window=o.window, sinks=True)
    index = next((c for c in comp_c.children if c.key == "indexer"), None)
    return MaskSpec(window=o.window, sinks=True, entry_ratio=options(comp_c, CompressorOptions).ratio,
                    selected_entries=options(index, IndexerOptions).topk if index is not None else None)


def attend_v4(comp: Component, run: Run, x: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    o = options(comp, V4AttentionOptions)
    Bn, Tn, _ = x.shape
    positions = torch.arange(Tn, device=x.device)
    R = angles(o.rope, positions, run)
    c_q = apply_norm(run, "q_a_norm", run_child(comp, "q_a_proj", run, x), NormOptions("rms", o.eps), "q_a_norm.")
    Q = run_child(comp, "q_b_proj", run, c_q).view(Bn, Tn, o.heads, o.head_dim)
    Qf = Q.float()
    Q = run.rec("q-head-norm", (Qf * torch.rsqrt(Qf.square().mean(-1, keepdim=True) + o.eps)).to(Q.dtype))
    Q = run.rec("q-rotate", rotate_tail(Q, R))
    kv = apply_norm(run, "kv_norm", run_child(comp, "kv_proj", run, x), NormOptions("rms", o.eps), "kv_norm.")
    K = run.rec("kv-rotate", rotate_tail(kv, R))                                         # [B, T, d_head]
    if "compressor" in [c.key for c in comp.children]:
        entries, ok = compressed_entries(comp.child("compressor"), run.child("compressor."), x, c_q)
        O = run_child(comp, "scores", run, Q, K, entries, ok, M)
    else:
        O = run_child(comp, "scores", run, Q, K, M)
    O = run.rec("o-unrotate", rotate_tail(O, -R))
    grouped = run.rec("o-groups", O.reshape(Bn, Tn, o.o_groups, -1))
    u = run_child(comp, "o_a_proj", run, grouped)
    return run_child(comp, "o_b_proj", run, u.flatten(2))


def v4_picture(block: BlockView) -> PictureKind:
    """The whole-model picture's cell: compressed and sparse (with the indexer), heavily compressed (a ratio without
    it), or the sliding window alone (no compressor)."""
    window, ratio = block.option("window"), block.option("ratio")
    if "v4_indexer" in block.programs:
        return "csa", f"compressed ÷{ratio} and sparse (indexer), plus a {window:,}-token window"
    if ratio:
        return "hca", f"heavily compressed ÷{ratio}, plus a {window:,}-token window"
    return "sliding", f"sliding window {window:,}"


@program("v4_attention", role="Attention", token_mixer=True, picture=v4_picture, picture_rank=4,
         layout="compressed-attention", mask_pattern=v4_mask_spec)
def run_v4_attention(comp: Component, run: Run, x: torch.Tensor, M: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec("v4-attn", attend_v4(comp, run, x, M))]


def reference_inputs(model, x: torch.Tensor, window: int):
    """position_embeddings, position_ids and the additive sliding-window causal mask [B, 1, T, T] the reference
    decoder layers take."""
    Bn, Tn = x.shape[:2]
    positions = torch.arange(Tn)[None].expand(Bn, -1)
    rotary = model.model.rotary_emb
    pe = {kind: rotary(x, positions, layer_type=kind) for kind in ("main", "compress")}
    t = torch.arange(Tn)
    allowed = (t[None, :] <= t[:, None]) & (t[:, None] - t[None, :] < window)
    mask = torch.zeros(Tn, Tn).masked_fill(~allowed, float("-inf"))[None, None].expand(Bn, 1, Tn, Tn)
    return pe, positions, mask


@reference_call("v4_attention")
def call_v4_attention(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    x, _ = inputs
    pe, positions, mask = reference_inputs(model, x, options(comp, V4AttentionOptions).window)
    theirs, _ = ref(x, position_embeddings=pe, position_ids=positions, attention_mask=mask)
    return ours, theirs, "attention output, causal window mask as the model builds it"


__all__ = ["CompressorOptions", "IndexerOptions", "V4AttentionOptions", "compressor", "v4_attention", "B", "T",
           "fmt_eps"]
