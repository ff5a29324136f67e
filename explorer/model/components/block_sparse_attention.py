"""MiniMax sparse attention (MiniMax-M3): grouped-query attention whose keys are grouped in blocks of
index_block_size positions, of which each query attends only to the index_topk_blocks blocks a small block indexer
ranks highest, its own (local) block always among them.

The indexer projects each token to index_n_heads query heads and one key of index_head_dim shared by them, each
normalised per head (RMSNorm with the model's 1 + γ gain) and rotated on the same leading features as the main
attention. A query's score for a key is the plain dot product (no scale, no ReLU, no head weights); a block's score is
the maximum over its keys of the causal scores; the query's own block (and the index_local_blocks − 1 before it)
scores +∞, so it is always kept; every indexer head keeps its own top blocks, and serves the num_attention_heads /
index_n_heads query heads of its group. Selection happens per block, not per token (DeepSeek Sparse Attention, dsa.py,
keeps individual tokens and weights its heads into one score). The indexer's keys are cached beside K and V:
index_head_dim more elements per token and sparse layer.

References: the MiniMax-M3 model card (MiniMaxAI/MiniMax-M3) for the sparse attention's description;
"Native Sparse Attention" (arXiv:2502.11089) for block-wise key selection with a forced local window; transformers'
models/minimax_m3_vl/modeling_minimax_m3_vl.py (MiniMaxM3VLIndexer, build_block_mask, MiniMaxM3VLAttention), the
reference binding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.attention import call_with_rotary, headline_steps
from explorer.model.components.base import B, Ctx, Run, ctx_colour, k, options, program, q, reference_call, run_child
from explorer.model.components.layer_attention import LayerAttentionOptions, run_layer_attention
from explorer.model.components.linear import linear
from explorer.model.components.moe import RoutingMismatch
from explorer.model.components.norms import GAIN_SUBSCRIPT, NormOptions, apply_norm, rmsnorm
from explorer.model.components.part_facts import BlockView, PictureKind
from explorer.model.components.rope import RopeOptions, reference_rotary, rotate
from explorer.model.components.serving import LayerKind, layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step

QUERIES, KEYS = Dim("queries", symbol="T"), Dim("keys", symbol="T")


@dataclass(frozen=True, slots=True)
class BlockIndexerOptions:
    heads: int
    """index_n_heads: one block selection per indexer head."""
    head_dim: int
    """index_head_dim."""
    block_size: int
    """index_block_size: key positions pooled into one scored block."""
    topk_blocks: int
    """index_topk_blocks: blocks each query keeps (its local blocks among them)."""
    local_blocks: int
    """index_local_blocks: the query's own block and the ones just before it, always kept."""
    query_heads: int
    """num_attention_heads: each indexer head's selection serves query_heads / heads attention heads."""
    rope: RopeOptions
    """The main attention's rotary: the indexer rotates the same leading features of its queries and keys."""
    norm: NormOptions
    """The per-head RMSNorm of the indexer's queries and keys."""

    @property
    def group(self) -> int:
        """Attention heads per indexer head."""
        return self.query_heads // self.heads

    @property
    def keys_kept(self) -> int:
        """The most keys one query attends to: index_topk_blocks × index_block_size."""
        return self.topk_blocks * self.block_size


def blocks_dim(o: BlockIndexerOptions) -> Dim:
    """The key blocks, ⌈T / index_block_size⌉ of them (the last one may be partial)."""
    return Dim("key blocks", symbol=f"⌈T/{o.block_size}⌉")


# ------------------------------------------------------------------------------------------------ spec

def block_indexer(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, R: Port, M: Port,
                  o: BlockIndexerOptions, names: tuple[str, str, str, str], reference: str,
                  citations: tuple[Citation, ...]) -> Component:
    """The block indexer of one sparse layer: its projections, per-head norms, block scores and top-k selection.
    names: the checkpoint's module names of the query and key projections and norms; reference: the reference's
    indexer module at this layer."""
    q_name, k_name, qn_name, kn_name = names
    n, d_i = o.heads, o.head_dim
    H, D = ctx.sym("index_n_heads"), ctx.sym("index_head_dim")
    q_dim, heads, d_idx = Dim("idx_heads·d_idx", n * d_i), Dim("idx_heads", n), Dim("d_idx", d_i)
    q_i, k_i = q("q^{I}"), k("k^{I}")
    wq = linear(ctx, "q_proj", "Indexer query projection", weight=f"{prefix}{q_name}.weight", ranges=ranges,
                d_in="hidden_size", d_out=H * D, out_dim=q_dim, x=x, y=Port(q_i, ctx.tokens(q_dim), "q_idx"),
                equation=rf"{q_i}={x.latex}W_{{IQ}}", code="self.q_proj(hidden_states)",
                description=f"Project each token to {n} indexer query heads of {d_i} features ({n * d_i:,} outputs).")
    wk = linear(ctx, "k_proj", "Indexer key projection", weight=f"{prefix}{k_name}.weight", ranges=ranges,
                d_in="hidden_size", d_out="index_head_dim", out_dim=d_idx, x=x, y=Port(k_i, ctx.tokens(d_idx), "k_idx"),
                equation=rf"{k_i}={x.latex}W_{{IK}}", code="self.k_proj(hidden_states)",
                description=f"Project each token to one {d_i}-feature indexer key, shared by all {n} indexer heads.")
    q_norm = rmsnorm(ctx, "q_norm", "Indexer query RMSNorm (per head)", weight=f"{prefix}{qn_name}.weight",
                     ranges=ranges, size="index_head_dim", x=Port(q("Q^{I}"), ctx.tokens(heads, d_idx), "Q_idx"),
                     y=Port(q(r"\hat Q^{I}"), ctx.tokens(heads, d_idx), "Q_idx_hat"), code="self.q_norm(idx_q)",
                     eps=o.norm.eps, gain=o.norm.gain)
    k_norm = rmsnorm(ctx, "k_norm", "Indexer key RMSNorm", weight=f"{prefix}{kn_name}.weight", ranges=ranges,
                     size="index_head_dim", x=wk.outputs[0], y=Port(k(r"\hat k^{I}"), ctx.tokens(d_idx), "k_idx_hat"),
                     code="self.k_norm(idx_k)", eps=o.norm.eps, gain=o.norm.gain)
    steps = indexer_steps(ctx, o, x.latex, heads, d_idx, q_dim)
    b, kept = o.block_size, o.topk_blocks
    return Component(
        key="indexer", title="Block indexer", kind="learned", code=f"{ctx.reference.prefix}Indexer(config, layer_idx)",
        description=f"Scores every earlier key for each query with {n} small heads of {d_i} features, takes each block "
                    f"of {b:,} keys' best score, and keeps the {kept} best blocks per head, the query's own block "
                    f"always among them; the first {o.rope.dim} features of its queries and keys rotate.",
        inputs=(x, R, M), outputs=(Port(r"M^{\mathrm{sel}}", Shape((B, heads, QUERIES, blocks_dim(o))), "sel"),),
        equations=tuple(s for s in steps if s.name in ("idx-pool", "idx-select")), steps=steps,
        children=(wq, wk, q_norm, k_norm), citations=citations, program="block_indexer", options=o, reference=reference,
        extras=(("indexer heads", f"{n} × {d_i} features"), ("key block", f"{b:,} positions"),
                ("blocks kept per query", f"{kept} (at most {o.keys_kept:,} keys), {o.local_blocks} local"),
                ("query heads per indexer head", f"{o.group}"),
                ("indexer key cache", f"{d_i} elements per token per sparse layer")),
        notes=("The indexer picks blocks; its scores never reach the attention weights (the reference returns only the "
               "chosen blocks' indices), and it has no value path of its own.",
               "Blocks are counted from position 0, so a query at position t has its own block ⌊t / block size⌋; "
               "blocks wholly after it score −∞ and are never kept, so while fewer than the top-k blocks exist, every "
               "earlier block is kept."),
    )


def indexer_steps(ctx: Ctx, o: BlockIndexerOptions, x: str, heads: Dim, d_idx: Dim, q_dim: Dim) -> tuple[Step, ...]:
    """The indexer's steps, each reading only what an earlier one made (x, the angles R and the causal mask M)."""
    r, b, kk = o.rope.dim, o.block_size, o.topk_blocks
    gain = GAIN_SUBSCRIPT[o.norm.gain]
    qI, qh, kI, kh = q("Q^{I}"), q(r"\hat Q^{I}"), k("k^{I}"), k(r"\hat k^{I}")
    qR, kR = q("Q^{IR}"), k("K^{I}")
    score_shape = Shape((B, heads, QUERIES, KEYS))
    block_shape = Shape((B, heads, QUERIES, blocks_dim(o)))
    local = ("j=\\lfloor t/" + f"{b}" + r"\rfloor" if o.local_blocks == 1 else
             rf"\lfloor t/{b}\rfloor-{o.local_blocks - 1}\le j\le\lfloor t/{b}\rfloor")
    return (
        Step(rf"{q('q^{I}')}={x}W_{{IQ}}", ctx.tokens(q_dim), "idx-q"),
        Step(rf"{qI}=\operatorname{{reshape}}({q('q^{I}')})", ctx.tokens(heads, d_idx), "idx-q-heads"),
        Step(rf"{qh}=\operatorname{{RMSNorm}}{gain}({qI})", ctx.tokens(heads, d_idx), "idx-q-norm"),
        Step(rf"{kI}={x}W_{{IK}}", ctx.tokens(d_idx), "idx-k"),
        Step(rf"{kh}=\operatorname{{RMSNorm}}{gain}({kI})", ctx.tokens(d_idx), "idx-k-norm"),
        Step(rf"{qR}_t=[\operatorname{{RoPE}}({qh}_{{t,:{r}}},{ctx_colour('R_t')});\,{qh}_{{t,{r}:}}]",
             ctx.tokens(heads, d_idx), "idx-q-rotate"),
        Step(rf"{kR}_t=[\operatorname{{RoPE}}({kh}_{{t,:{r}}},{ctx_colour('R_t')});\,{kh}_{{t,{r}:}}]",
             ctx.tokens(d_idx), "idx-k-rotate"),
        Step(rf"I_{{h,t,s}}={qR}_{{t,h}}\cdot {kR}_s+M_{{t,s}}", score_shape, "idx-scores"),
        Step(rf"I^{{\mathrm{{blk}}}}_{{h,t,j}}=\max_{{{b}j\le s<{b}(j+1)}}I_{{h,t,s}}\quad\text{{(blocks of {b:,} keys)}}", block_shape,
             "idx-pool"),
        Step(rf"\hat I^{{\mathrm{{blk}}}}_{{h,t,j}}=\begin{{cases}}+\infty & {local}\\ I^{{\mathrm{{blk}}}}_{{h,t,j}} & "
             r"\text{otherwise}\end{cases}" if o.local_blocks else
             r"\hat I^{\mathrm{blk}}=I^{\mathrm{blk}}\quad\text{(no local block forced)}", block_shape, "idx-local"),
        Step(rf"M^{{\mathrm{{sel}}}}_{{h,t,j}}=\begin{{cases}}0 & j\in\operatorname{{top}}_{{{kk}}}(\hat I^{{\mathrm{{blk}}}}_{{h,t}}),\ "
             r"\hat I^{\mathrm{blk}}_{h,t,j}>-\infty\\ -\infty & \text{otherwise}\end{cases}", block_shape, "idx-select"),
    )


def block_sparse_attention(ctx: Ctx, *, base: Component, indexer_c: Component) -> Component:
    """A grouped-query attention (layer_attention's `base`) whose causal mask is narrowed, per query and head group,
    to the key blocks `indexer_c` selects."""
    o = options(indexer_c, BlockIndexerOptions)
    heads = Dim("heads", o.query_heads)
    g, b = o.group, o.block_size
    head_of = rf"\lceil h/{g}\rceil" if g > 1 else "h"
    mask = Step(rf"M^{{\mathrm{{MSA}}}}_{{h,t,s}}=M_{{t,s}}+M^{{\mathrm{{sel}}}}_{{{head_of},\,t,\,\lfloor s/{b}\rfloor}}",
                Shape((B, heads, QUERIES, KEYS)), "msa-mask")
    first = next(i for i, s in enumerate(base.steps) if s.name in ("scale", "repeat", "softmax"))
    steps = (*base.steps[:first], *indexer_c.steps, mask, *(_sparse(s) for s in base.steps[first:]))
    scores_c = base.child("scores")
    sparse_scores = replace(scores_c, steps=tuple(_sparse(s) for s in scores_c.steps),
                            equations=tuple(_sparse(s) for s in scores_c.equations),
                            inputs=tuple(replace(p, latex=r"M^{\mathrm{MSA}}") if p.name == "mask" else p
                                         for p in scores_c.inputs),
                            description=scores_c.description.rstrip(".") + ", over only the key blocks the indexer "
                                        "selected for each query's head group.")
    children = tuple(sparse_scores if c.key == "scores" else c for c in base.children)
    at = next(i for i, c in enumerate(children) if c.key == "scores")
    return replace(
        base, title="MiniMax sparse attention", children=(*children[:at], indexer_c, *children[at:]), steps=steps,
        equations=headline_steps(steps, ("idx-pool", "idx-select", "msa-mask")), program="block_sparse_attention",
        description=base.description.rstrip(".") + f"; each query attends only within the {o.topk_blocks} blocks of "
                    f"{b:,} keys the block indexer ranks highest for its head group, its own block always among them "
                    "(every earlier block while fewer exist).",
    )


def _sparse(step: Step) -> Step:
    """The softmax over the causal mask narrowed by the indexer's block selection."""
    if step.name != "softmax":
        return step
    return replace(step, latex=step.latex.replace("+M", r"+M^{\mathrm{MSA}}"))


# ---------------------------------------------------------------------------------------------- programs

def key_scores(Q: torch.Tensor, K: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """I [B, H_I, T, T]: each indexer head's dot products Q_h·K_s (unscaled) plus the causal mask M [T, T]."""
    return torch.matmul(Q.float().transpose(1, 2), K.float().transpose(-1, -2).unsqueeze(1)) + M


def pool_blocks(I: torch.Tensor, block: int) -> torch.Tensor:
    """I^blk [B, H_I, T, ⌈T/block⌉]: the maximum over each block's keys (a partial last block padded with −∞)."""
    T_k = I.shape[-1]
    n = -(-T_k // block)
    padded = torch.nn.functional.pad(I, (0, n * block - T_k), value=float("-inf"))
    return padded.view(*I.shape[:-1], n, block).amax(dim=-1)


def select_blocks(P: torch.Tensor, topk: int) -> torch.Tensor:
    """M^sel [B, H_I, T, blocks] from Î^blk: 0 at each head's top-k blocks that score above −∞, −∞ elsewhere."""
    top = P.topk(min(topk, P.shape[-1]), dim=-1)
    keep = torch.zeros_like(P, dtype=torch.bool).scatter(-1, top.indices, top.values > float("-inf"))
    return torch.zeros_like(P).masked_fill(~keep, float("-inf"))


def block_mask(M: torch.Tensor, sel: torch.Tensor, o: BlockIndexerOptions) -> torch.Tensor:
    """M^MSA [B, H, T, T]: the causal mask plus each key's block's selection, for the indexer head of each head's
    group."""
    T_k = M.shape[-1]
    per_key = sel.repeat_interleave(o.block_size, dim=-1)[..., :T_k]                 # [B, H_I, T, T]
    return M + per_key.repeat_interleave(o.group, dim=1)                              # [B, H, T, T]


def indexer_selection(run: Run, comp: Component, x: torch.Tensor, angles: torch.Tensor,
                      M: torch.Tensor) -> torch.Tensor:
    """The indexer's steps on x, recorded under their names; returns M^sel."""
    o = options(comp, BlockIndexerOptions)
    B_, T_, _ = x.shape
    q_ = run.rec("idx-q", run_child(comp, "q_proj", run, x))
    Q = run.rec("idx-q-heads", q_.view(B_, T_, o.heads, o.head_dim))                 # [B, T, H_I, d_I]
    Q = apply_norm(run, "idx-q-norm", Q, o.norm, _module(comp, "q_norm"))
    k_ = run.rec("idx-k", run_child(comp, "k_proj", run, x))                         # [B, T, d_I]
    K = apply_norm(run, "idx-k-norm", k_, o.norm, _module(comp, "k_norm"))
    Q = run.rec("idx-q-rotate", rotate(Q, angles, o.rope))
    K = run.rec("idx-k-rotate", rotate(K, angles, o.rope))
    I = run.rec("idx-scores", key_scores(Q, K, M))
    P = run.rec("idx-pool", pool_blocks(I, o.block_size))
    P = run.rec("idx-local", force_local_blocks(P, o))
    return run.rec("idx-select", select_blocks(P, o.topk_blocks))


def force_local_blocks(P: torch.Tensor, o: BlockIndexerOptions) -> torch.Tensor:
    """Î^blk: each query's own block ⌊t / block_size⌋ and the local_blocks − 1 before it (clamped at 0) set to +∞."""
    if o.local_blocks <= 0:
        return P
    T_ = P.shape[-2]
    own = torch.arange(T_, device=P.device) // o.block_size                            # [T]
    idx = (own[:, None] - torch.arange(o.local_blocks, device=P.device)[None]).clamp(min=0)  # [T, local]
    return P.scatter(-1, idx.expand(*P.shape[:-1], o.local_blocks), float("inf"))


def _module(comp: Component, key: str) -> str:
    """A child's weights' module below the indexer's ("index_q_norm.")."""
    child = comp.child(key)
    return child.tensors[0].template.rsplit(".", 1)[0].rsplit(".", 1)[-1] + "."


@program("block_indexer")
def run_block_indexer(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor,
                      M: torch.Tensor) -> list[torch.Tensor]:
    return [indexer_selection(run, comp, x, angles, M)]


def msa_picture(block: BlockView) -> PictureKind:
    """The whole-model picture's cell: attention over the key blocks the indexer keeps."""
    return "dsa", (f"block-sparse (an indexer keeps {block.option('topk_blocks')} blocks of "
                   f"{block.option('block_size'):,} keys)")


@program("block_sparse_attention", role="Attention", token_mixer=True, picture=msa_picture, picture_rank=5)
def run_block_sparse_attention(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor,
                               M: torch.Tensor) -> list[torch.Tensor]:
    indexer_c = comp.child("indexer")
    sel = run_child(comp, "indexer", run, x, angles, M)                               # [B, H_I, T, blocks]
    M_msa = run.rec("msa-mask", block_mask(M, sel, options(indexer_c, BlockIndexerOptions)))
    (delta,) = run_layer_attention(comp, run, x, angles, M_msa)
    return [run.rec("block_sparse_attention", delta)]


reference_call("block_sparse_attention")(call_with_rotary)  # the reference attention builds its own selection


@reference_call("block_indexer")
def call_block_indexer(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference indexer returns each query's kept block indices per indexer head (−1 for empty slots): compare
    the kept sets."""
    x, _, _ = inputs
    o = options(comp, BlockIndexerOptions)
    B_, T_, _ = x.shape
    positions = torch.arange(T_)[None].expand(B_, T_)
    cos_sin = reference_rotary(model.model.rotary_emb, o.rope, x, positions)
    their_idx = ref(x, cos_sin, None, positions)                                      # [B, H_I, T, k]
    n = ours.shape[-1]
    safe = their_idx.long().masked_fill(their_idx < 0, n)
    theirs = torch.zeros(*their_idx.shape[:-1], n + 1).scatter(-1, safe, 1.0)[..., :n]
    mine = (ours == 0).float()
    if not torch.equal(mine, theirs):
        raise RoutingMismatch(f"step 'idx-select' selects different key blocks from transformers' "
                              f"{type(ref).__name__}")
    return mine, theirs, (f"same blocks of {o.block_size} keys selected for every query and indexer head "
                          f"(top {o.topk_blocks} of {n}, the local block forced)")


# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("block_sparse_attention")
def block_sparse_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """K and V of every key/value head plus the indexer's key, for every token; the indexer scores every cached key,
    attention reads at most index_topk_blocks × index_block_size of them."""
    o, io = comp.options, comp.child("indexer").options
    assert isinstance(o, LayerAttentionOptions) and isinstance(io, BlockIndexerOptions)
    s = o.shape
    full = s.heads * (s.qk_head_dim + s.v_head_dim)
    kv = s.kv_heads * (s.qk_head_dim + s.v_head_dim)
    return (LayerKind(
        kv + io.head_dim, f"{o.cache_formula} + index_head_dim", flops_per_key=2 * full, mha_per_token=full,
        topk=io.keys_kept, index_flops_per_key=2 * io.heads * io.head_dim, by_kind=True,
        note=f"K and V, {kv}, and the indexer's key, {io.head_dim}; attention reads at most {io.topk_blocks} blocks "
             f"of {io.block_size:,} cached tokens per query, the indexer scores all of them"),)
