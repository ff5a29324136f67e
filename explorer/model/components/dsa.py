"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): a small "lightning indexer" scores every past token for each
query, keeps the index_topk best, and multi-head latent attention attends only to those.

The indexer reads the query latent the MLA query path already computes (ĉ^Q), projects it to index_n_heads heads of
index_head_dim, and projects each token to one key of index_head_dim shared by those heads (with a LayerNorm);
the first qk_rope_head_dim features of both are rotated. A query's score for a key is a weighted sum over the
indexer heads of ReLU(τ_I q·k), with per-token head weights from a third projection. The indexer's keys are cached
beside the MLA latent: index_head_dim more elements per token and layer.

References: DeepSeek-V3.2 technical report ("DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models",
arXiv:2512.02556), which introduces DSA; transformers' models/deepseek_v32/modeling_deepseek_v32.py (the indexer,
half-split rotary) and models/glm_moe_dsa/modeling_glm_moe_dsa.py (the same indexer with interleaved rotary).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.attention import KEYS, QUERIES, call_with_rotary, headline_steps, scores_mask
from explorer.model.components.base import B, Ctx, Run, ctx_colour, k, options, program, q, reference_call, run_child
from explorer.model.components.linear import linear
from explorer.model.components.mla import MLAOptions, decode_costs, decode_form_formulas, mla, run_mla
from explorer.model.components.moe import RoutingMismatch
from explorer.model.components.norms import NormOptions, apply_norm, layernorm
from explorer.model.components.part_facts import BlockView, MaskSpec, PictureKind
from explorer.model.components.rope import RopeOptions, reference_rotary, rotate
from explorer.model.components.serving import LayerKind, layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step


@dataclass(frozen=True, slots=True)
class IndexerOptions:
    heads: int
    """index_n_heads."""
    head_dim: int
    """index_head_dim."""
    topk: int
    """index_topk: keys kept per query."""
    rope: RopeOptions
    """The rotary of the first rope.dim features of each indexer query and key; its pairing is the indexer's own
    (half-split in DeepSeek-V3.2, adjacent pairs in GLM-5), whatever the main attention uses."""
    norm_eps: float = 1e-6

    @property
    def scale(self) -> float:
        """τ_I = 1/√index_head_dim, the dot products' scale."""
        return self.head_dim ** -0.5

    @property
    def weight_scale(self) -> float:
        """1/√index_n_heads, applied to the per-head weights."""
        return self.heads ** -0.5


SCORES = Shape((B, QUERIES, KEYS))


# ------------------------------------------------------------------------------------------------ spec

def indexer(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, c_q: Port, R: Port, M: Port,
            o: IndexerOptions, citations: tuple[Citation, ...]) -> Component:
    """The lightning indexer of one block kind: its projections, key norm, scores and top-k selection."""
    p = prefix + "indexer."
    n, d_i, r = o.heads, o.head_dim, o.rope.dim
    H, D = ctx.sym("index_n_heads"), ctx.sym("index_head_dim")
    q_dim, heads, d_idx = Dim("idx_heads·d_idx", n * d_i), Dim("idx_heads", n), Dim("d_idx", d_i)
    q_i, k_i, k_hat = q("q^{I}"), k("k^{I}"), k(r"\hat k^{I}")
    wq = linear(ctx, "wq_b", "Indexer query projection", weight=p + "wq_b.weight", ranges=ranges, d_in="q_lora_rank",
                d_out=H * D, out_dim=q_dim, x=c_q, y=Port(q_i, ctx.tokens(q_dim), "q_idx"),
                equation=rf"{q_i}={c_q.latex}W_{{IQ}}",
                description=f"Expand the query latent to {n} indexer heads of {d_i} features ({n * d_i:,} outputs).",
                code="self.wq_b(q_resid)")
    wk = linear(ctx, "wk", "Indexer key projection", weight=p + "wk.weight", ranges=ranges, d_in="hidden_size",
                d_out="index_head_dim", out_dim=d_idx, x=x, y=Port(k_i, ctx.tokens(d_idx), "k_idx"),
                equation=rf"{k_i}={x.latex}W_{{IK}}",
                description=f"Project each token to one {d_i}-feature indexer key, shared by all {n} indexer heads.",
                code="self.wk(hidden_states)")
    k_norm = layernorm(ctx, "k_norm", "Indexer key LayerNorm", weight=p + "k_norm.weight", ranges=ranges,
                       size="index_head_dim", x=wk.outputs[0], y=Port(k_hat, ctx.tokens(d_idx), "k_idx_hat"),
                       code="self.k_norm(k)", eps=o.norm_eps, citations=citations[:1])
    w_out = Port(r"\tilde w", ctx.tokens(heads), "w_idx")
    weights = linear(ctx, "weights_proj", "Indexer head weights", weight=p + "weights_proj.weight", ranges=ranges,
                     d_in="hidden_size", d_out="index_n_heads", out_dim=heads, x=x, y=w_out,
                     equation=rf"\tilde w={x.latex}W_{{w}}", quantize=False,
                     description=f"One weight per indexer head for each query token ({n} outputs).",
                     code="self.weights_proj(hidden_states)")
    steps = _indexer_steps(ctx, o, c_q.latex, x.latex, heads, d_idx, q_dim)
    pairing = "adjacent features" if o.rope.pairing == "interleaved" else "the two halves"
    return Component(
        key="indexer", title="Lightning indexer", kind="learned", code=f"{ctx.reference.prefix}Indexer(config, layer_idx)",
        description=f"Scores every earlier token for each query with {n} small heads of {d_i} features (ReLU of the "
                    f"dot products, weighted per head) and keeps the {o.topk:,} best; the first {r} features of its "
                    f"queries and keys rotate ({pairing} paired).",
        inputs=(x, c_q, R, M), outputs=(Port(r"M^{\mathrm{sel}}", SCORES, "sel"),),
        equations=tuple(s for s in steps if s.name in ("idx-scores", "idx-select")), steps=steps,
        children=(wq, wk, k_norm, weights), citations=citations, program="indexer", options=o,
        extras=(("indexer heads", f"{n} × {d_i} features"), ("tokens kept per query", f"{o.topk:,}"),
                ("indexer key cache", f"{d_i} elements per token per layer"),
                ("score scale τ_I", f"1/√{d_i} = {o.scale:.6f}"), ("head-weight scale", f"1/√{n} = {o.weight_scale:.6f}")),
        notes=("The indexer picks tokens; its scores never reach the attention weights, so no gradient flows from "
               "the language-model loss into it through the selection (transformers runs it under no_grad).",
               "DeepSeek's inference code rotates queries and keys by a Hadamard transform and scores in FP8; the "
               "transform is orthogonal (dot products unchanged) and FP8 is a precision choice, so the reference, "
               "like this page, scores in full precision."),
    )


def _indexer_steps(ctx: Ctx, o: IndexerOptions, c_q: str, x: str, heads: Dim, d_idx: Dim, q_dim: Dim,
                   ) -> tuple[Step, ...]:
    r = o.rope.dim
    tau, n = o.head_dim, o.heads
    qI, k_hat = q("Q^{I}"), k(r"\hat k^{I}")
    pairs = (r",\ \ \text{features }(2j,\,2j+1)\text{ paired}" if o.rope.pairing == "interleaved"
             else rf",\ \ \text{{features }}(j,\,j+{o.rope.pairs})\text{{ paired}}")  # the indexer's own, maybe not the layer's
    return (
        Step(rf"{q('q^{I}')}={c_q}W_{{IQ}}", ctx.tokens(q_dim), "idx-q"),
        Step(rf"{qI}=\operatorname{{reshape}}({q('q^{I}')})", ctx.tokens(heads, d_idx), "idx-q-heads"),
        Step(rf"{k('k^{I}')}={x}W_{{IK}}", ctx.tokens(d_idx), "idx-k"),
        Step(rf"{k_hat}=\operatorname{{LayerNorm}}({k('k^{I}')})", ctx.tokens(d_idx), "idx-k-norm"),
        Step(rf"{q('Q^{IR}_t')}=[\operatorname{{RoPE}}({qI}_{{t,:{r}}},{ctx_colour('R_t')});\,{qI}_{{t,{r}:}}]{pairs}",
             ctx.tokens(heads, d_idx), "idx-q-rotate"),
        Step(rf"{k('K^{I}_t')}=[\operatorname{{RoPE}}({k_hat}_{{t,:{r}}},{ctx_colour('R_t')});\,"
             rf"{k_hat}_{{t,{r}:}}]{pairs}", ctx.tokens(d_idx), "idx-k-rotate"),
        Step(rf"w'={x}W_{{w}}\,/\sqrt{{{n}}}", ctx.tokens(heads), "idx-weights"),
        Step(rf"\tilde I_{{t,h,s}}=\operatorname{{ReLU}}\!\left({q('Q^{IR}_{t,h}')}\cdot{k('K^{I}_s')}/\sqrt{{{tau}}}\right)",
             Shape((B, QUERIES, heads, KEYS)), "idx-relu"),
        Step(r"I_{t,s}=\textstyle\sum_{h}w'_{t,h}\,\tilde I_{t,h,s}+M_{t,s}", SCORES, "idx-scores"),
        Step(rf"M^{{\mathrm{{sel}}}}_{{t,s}}=\begin{{cases}}0 & s\in\operatorname{{top}}_{{{o.topk}}}(I_t)\\ -\infty & "
             r"\text{otherwise}\end{cases}", SCORES, "idx-select"),
    )


def dsa(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: MLAOptions, rope_options: RopeOptions,
        indexer_options: IndexerOptions, citations: tuple[Citation, ...], rope_citations: tuple[Citation, ...],
        scores_citations: tuple[Citation, ...], indexer_citations: tuple[Citation, ...]) -> Component:
    """MLA whose causal mask is narrowed, per query, to the index_topk tokens the lightning indexer selects."""
    if o.q_lora_rank is None:
        raise ValueError("DeepSeek Sparse Attention reads the query latent: q_lora_rank must be set")
    base = mla(ctx, prefix=prefix, ranges=ranges, x=x, o=o, rope_options=rope_options, citations=citations,
               rope_citations=rope_citations, scores_citations=scores_citations)
    x_, R, M = base.inputs
    idx = indexer(ctx, prefix=prefix, ranges=ranges, x=x_, c_q=base.child("q_a_layernorm").outputs[0], R=R, M=M,
                  o=indexer_options, citations=indexer_citations)
    mask = Step(r"M^{\mathrm{DSA}}=M+M^{\mathrm{sel}}", SCORES, "dsa-mask")
    scores_c = base.child("scores")
    first = next(i for i, s in enumerate(base.steps) if s.name in ("repeat", "softmax"))
    steps = (*base.steps[:first], *idx.steps, mask, *(_sparse(s) for s in base.steps[first:]))
    sparse_scores = replace(scores_c, steps=tuple(_sparse(s) for s in scores_c.steps),
                            equations=tuple(_sparse(s) for s in scores_c.equations),
                            inputs=tuple(replace(p, latex=r"M^{\mathrm{DSA}}") if p.name == "mask" else p
                                         for p in scores_c.inputs),
                            description=scores_c.description.rstrip(".") + ", over only the keys the indexer "
                                        "selected for each query.")
    children = tuple(sparse_scores if c.key == "scores" else c for c in base.children)
    at = next(i for i, c in enumerate(children) if c.key == "scores")
    n = indexer_options.topk
    return replace(
        base, title="DeepSeek Sparse Attention", children=(*children[:at], idx, *children[at:]), steps=steps,
        equations=headline_steps(steps, ("idx-scores", "idx-select", "dsa-mask")),
        program="dsa", code=f"{ctx.reference.prefix}Attention(config, layer_idx)",
        description=base.description.rstrip(".") + f"; each query attends only to the {n:,} earlier tokens the "
                    "lightning indexer ranks highest (all of them while fewer have been seen).",
    )


def _sparse(step: Step) -> Step:
    """The softmax over the causal mask narrowed by the indexer's selection."""
    if step.name != "softmax":
        return step
    return replace(step, latex=step.latex.replace("+M", r"+M^{\mathrm{DSA}}"))


# ---------------------------------------------------------------------------------------------- programs

def relu(x: torch.Tensor) -> torch.Tensor:
    """The indexer's activation on each head's scaled dot products (a module-level name, so a test can swap it)."""
    return F.relu(x)


def relu_scores(Q: torch.Tensor, K: torch.Tensor, scale: float) -> torch.Tensor:
    """S [B, T, H, S_k]: ReLU(scale · Q_h·K_s) for queries Q [B, T, H, d] and keys K [B, S_k, d] shared by the heads
    (DeepSeek-V4's indexer scores its compressed keys with it too)."""
    return relu(torch.matmul(Q.float(), K.float().transpose(-1, -2).unsqueeze(1)) * scale)


def weigh_heads(w: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """I [B, T, S_k] = Σ_h w_h S_h for head weights w [B, T, H]."""
    return torch.matmul(w.float().unsqueeze(-2), S).squeeze(-2)


def index_scores(run: Run, o: IndexerOptions, Q: torch.Tensor, K: torch.Tensor, w: torch.Tensor,
                 M: torch.Tensor) -> torch.Tensor:
    """I [B, T, T]: Σ_h w_h ReLU(τ_I Q_h·K) plus the causal mask; Q [B, T, H, d], K [B, T, d], w [B, T, H]."""
    S = run.rec("idx-relu", relu_scores(Q, K, o.scale))
    return run.rec("idx-scores", weigh_heads(w, S) + M)


def select(run: Run, o: IndexerOptions, I: torch.Tensor) -> torch.Tensor:
    """M^sel [B, T, T]: 0 at each query's top-k keys (all of them when fewer exist), -inf elsewhere."""
    return run.rec("idx-select", selection_mask(I, o.topk))


def selection_mask(I: torch.Tensor, topk: int) -> torch.Tensor:
    """0 at the `topk` highest scores of each row of I (every one where fewer exist), -inf elsewhere; I holds the
    causal mask already, so a future key is picked only where a row has fewer than `topk` causal keys, and adding
    M back removes it."""
    top = I.topk(min(topk, I.shape[-1]), dim=-1).indices
    return torch.full_like(I, float("-inf")).scatter(-1, top, 0.0)


def _rotate_front(x: torch.Tensor, angles: torch.Tensor, ro: RopeOptions) -> torch.Tensor:
    """Rotate the first ro.dim features, keep the rest."""
    return torch.cat([rotate(x[..., :ro.dim], angles, ro), x[..., ro.dim:]], dim=-1)


@program("indexer")
def run_indexer(comp: Component, run: Run, x: torch.Tensor, c_q: torch.Tensor, angles: torch.Tensor,
                M: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, IndexerOptions)
    B_, T_, _ = x.shape
    q_ = run.rec("idx-q", run_child(comp, "wq_b", run, c_q))
    Q = run.rec("idx-q-heads", q_.view(B_, T_, o.heads, o.head_dim))              # [B, T, H_I, d_I]
    k_ = run.rec("idx-k", run_child(comp, "wk", run, x))                          # [B, T, d_I]
    k_hat = apply_norm(run, "idx-k-norm", k_, options(comp.child("k_norm"), NormOptions), "k_norm.")
    Q = run.rec("idx-q-rotate", _rotate_front(Q, angles, o.rope))
    K = run.rec("idx-k-rotate", _rotate_front(k_hat, angles, o.rope))
    w = run.rec("idx-weights", run_child(comp, "weights_proj", run, x).float() * o.weight_scale)  # [B, T, H_I]
    I = index_scores(run, o, Q, K, w, M)
    return [select(run, o, I)]


def dsa_picture(block: BlockView) -> PictureKind:
    """The whole-model picture's cell: sparse attention over the tokens the indexer keeps."""
    return "dsa", f"sparse (DSA: an indexer keeps {block.option('topk'):,} tokens), latent KV"


def dsa_mask(comp: Component) -> MaskSpec:
    """The causal mask (and any window) of MLA's scores, narrowed to the indexer's top-k tokens."""
    return replace(scores_mask(comp), selected_tokens=options(comp.child("indexer"), IndexerOptions).topk)


@program("dsa", role="Attention", token_mixer=True, picture=dsa_picture, picture_rank=5, mask_pattern=dsa_mask)
def run_dsa(comp: Component, run: Run, x: torch.Tensor, angles: torch.Tensor, M: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, MLAOptions)
    hidden = run.child(prefix="_")  # the query latent again, as the indexer reads it (MLA records its own)
    c_q_hat = apply_norm(hidden, "q-norm", run_child(comp, "q_a_proj", hidden, x), o.norm, "q_a_layernorm.")
    sel = run_child(comp, "indexer", run, x, c_q_hat, angles, M)
    M_dsa = run.rec("dsa-mask", M + sel)                                           # [B, T, T]
    (delta,) = run_mla(comp, run, x, angles, M_dsa[:, None])                       # heads broadcast
    return [run.rec("dsa", delta)]


reference_call("dsa")(call_with_rotary)


@reference_call("indexer")
def call_indexer(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference indexer returns each query's top-k key indices: compare the selections, where causal."""
    x, c_q, _, M = inputs
    o = options(comp, IndexerOptions)
    B_, T_, _ = x.shape
    positions = torch.arange(T_)[None].expand(B_, T_)
    cos_sin = reference_rotary(model.model.rotary_emb, o.rope, x, positions)
    their_idx = ref(x, c_q, cos_sin, M[None].expand(B_, T_, T_), positions)
    causal = (M == 0)[None].expand(B_, T_, T_)
    theirs = torch.zeros(B_, T_, T_).scatter(-1, their_idx.long(), 1.0) * causal
    mine = ((ours == 0) & causal).float()
    if not torch.equal(mine, theirs):
        raise RoutingMismatch(f"step 'idx-select' selects different keys from transformers' {type(ref).__name__}")
    kept = min(o.topk, T_)
    return mine, theirs, f"same {kept} of {T_} keys selected for every query (earlier ones where fewer exist)"


# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("dsa")
def dsa_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """DeepSeek Sparse Attention caches MLA's latent and rotary key and the indexer's own key for every token; the
    indexer scores every cached key, MLA attends to at most index_topk of them."""
    o, io = comp.options, comp.child("indexer").options
    assert isinstance(o, MLAOptions) and isinstance(io, IndexerOptions)
    mla_cache = o.kv_lora_rank + o.rope
    full = o.heads * (o.nope + o.rope + o.v)
    return (LayerKind(
        mla_cache + io.head_dim, "kv_lora_rank + qk_rope_head_dim + index_head_dim", flops_per_key=2 * full,
        mha_per_token=full, topk=io.topk, indexer=io.head_dim, index_flops_per_key=2 * io.heads * (io.head_dim + 1),
        absorbed_flops_per_key=2 * decode_costs(o)[0].per_key, decode_forms=decode_form_formulas(o),
        note=f"the MLA latent and rotary key, {mla_cache}, and the indexer's key, {io.head_dim}; attention reads at "
             f"most {io.topk:,} cached tokens per query, the indexer scores all of them"),)
