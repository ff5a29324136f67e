"""The DeepSeek-V4 family (DeepSeek-V4-Flash, and other configs transformers' DeepseekV4Config accepts): every layer
attends through one shared key-value head within a sliding window, most layers add compressed entries (ratio 4
with a lightning indexer, or ratio 128) as compress_ratios lists them; the residual stream is hc_mult
hyper-connected streams; the first num_hash_layers MoE layers route by a token-id table, the rest by √softplus
scores with a correction bias; experts and the shared expert are clamped SwiGLUs.

References: the DeepSeek-V4 technical report (DeepSeek-AI, 2026); transformers'
models/deepseek_v4/modeling_deepseek_v4.py (the reference binding). The multi-token prediction layers the
checkpoint ships (num_nextn_predict_layers) are not built by the reference; they are counted from the config with this
family's own block builder (`declared_mtp`), apart from the main model, and never run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports
from explorer.model.components.compressed_attention import (
    KIND_TYPES,
    CompressorOptions,
    IndexerOptions,
    V4AttentionOptions,
    compressor,
    v4_attention,
)
from explorer.model.components.embedding import embedding, head
from explorer.model.components.fused_experts import ClampedSwiGLUOptions, clamped_experts
from explorer.model.components.hash_routing import hash_router, shared_and_routed_moe
from explorer.model.components.hc_blocks import hc_block, hc_model, hc_stack
from explorer.model.components.hyper_connections import HyperOptions, hyper_connection, hyper_head, streams_shape
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.moe import RouterOptions, router
from explorer.model.components.norms import rmsnorm
from explorer.model.components.rope import RopeOptions
from explorer.model.families.base import (
    DIM_LABELS,
    Family,
    PublishedMetadata,
    ReferenceBinding,
    RopeScaling,
    as_published,
    rope_options,
    rope_scaling_problems,
    rule_problems,
    stored_dtype,
)
from explorer.model.families.declared_mtp import declared_mtp, mtp_norm, mtp_projection
from explorer.spec.storage import BlockFP8, Dense, FP4Rows, Storage
from explorer.spec.types import Citation, Component, DeclaredMTP, ModelSpec, Shape

FILE = "models/deepseek_v4/modeling_deepseek_v4.py"
REFERENCE = Reference(FILE, "DeepseekV4")
KINDS = {0: "sliding", 4: "csa", 128: "hca"}
"""compress_ratios value -> attention kind, as DeepseekV4Config maps them (any other value is rejected there)."""
BLOCK_NOUNS = {"sliding": "sliding-window", "csa": "CSA", "hca": "HCA"}
"""Attention kind -> the words that count its blocks in breadcrumbs and budgets ("20 CSA blocks"), written as the
pages name the kinds (not the config's lower-case keys)."""
LAYER_TYPES = KIND_TYPES
DEFAULT_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
LABELS = {**DIM_LABELS, "o_groups": "groups", "o_lora_rank": "d_og", "index_n_heads": "index_heads",
          "index_head_dim": "d_index", "hc_mult": "streams"}
TITLES = {"sliding": "Sliding-window", "csa": "Compressed sparse attention (ratio {m})",
          "hca": "Heavily compressed attention (ratio {m})"}


@dataclass(frozen=True, slots=True)
class QuantizationConfig:
    """config.json "quantization_config": block-wise FP8 with power-of-two (ue8m0) scales."""

    quant_method: str
    fmt: str
    weight_block_size: tuple[int, int]
    activation_scheme: str = "dynamic"
    scale_fmt: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepseekV4Hyperparameters(PublishedMetadata):
    """config.json keys of DeepseekV4Config, named as published (its legacy keys compress_ratios and num_hash_layers
    included); absent keys take DeepseekV4Config's defaults."""

    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    q_lora_rank: int
    qk_rope_head_dim: int
    o_groups: int
    o_lora_rank: int
    n_routed_experts: int
    num_experts_per_tok: int
    compress_ratios: tuple[int, ...] | None = None
    """Per layer: 0 sliding window only, 4 compressed sparse attention, 128 heavily compressed attention (the
    published key; DeepseekV4Config folds it into layer_types)."""
    layer_types: tuple[str, ...] | None = None
    """Per layer, the attention type by name (DeepseekV4Config's own key); neither given: its default schedule."""
    mlp_layer_types: tuple[str, ...] | None = None
    """Per layer, "hash_moe" or "moe"; absent: the first num_hash_layers are hash_moe."""
    num_key_value_heads: int = 1
    n_shared_experts: int = 1
    num_hash_layers: int = 3
    compress_rates: dict[str, int] | None = None
    """Pooling ratio of each compressed layer type (DeepseekV4Config's default: 4 and 128)."""
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    sliding_window: int = 128
    swiglu_limit: float = 10.0
    scoring_func: str = "sqrtsoftplus"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.5
    topk_method: str = "noaux_tc"
    hidden_act: str = "silu"
    max_position_embeddings: int = 1048576
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 1
    torch_dtype: str = "bfloat16"
    expert_dtype: str | None = None
    """"fp4": routed experts stored in four bits; otherwise as the other linear weights."""
    quantization_config: QuantizationConfig | None = None
    bos_token_id: int | None = 0
    eos_token_id: int | None = 1


def _cite(claim: str, symbol: str) -> Citation:
    return REFERENCE.cite(claim, symbol)


RELEASE_NAMES: tuple[tuple[str, str], ...] = (
    (r"^embed_tokens\.weight$", "embed.weight"),
    (r"^lm_head\.weight$", "head.weight"),
    (r"^hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"\.hc_head\.hc_(fn|base|scale)$", r".hc_head_\1"),
    (r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1"),
    (r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1"),
    (r"\.input_layernorm\.", ".attn_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
    (r"\.self_attn\.compressor\.indexer\.scorer\.weights_proj\.", ".attn.indexer.weights_proj."),
    (r"\.self_attn\.compressor\.indexer\.q_b_proj\.", ".attn.indexer.wq_b."),
    (r"\.self_attn\.compressor\.indexer\.", ".attn.indexer.compressor."),
    (r"\.self_attn\.", ".attn."),
    (r"\.mlp\.", ".ffn."),
    (r"\.compressor\.kv_norm\.", ".compressor.norm."),
    (r"\.position_bias$", ".ape"),
    (r"\.sinks$", ".attn_sink"),
    (r"\.shared_experts\.gate_proj\.", ".shared_experts.w1."),
    (r"\.shared_experts\.down_proj\.", ".shared_experts.w2."),
    (r"\.shared_experts\.up_proj\.", ".shared_experts.w3."),
    (r"\.q_a_proj\.", ".wq_a."),
    (r"\.q_b_proj\.", ".wq_b."),
    (r"\.kv_proj\.", ".wkv."),
    (r"\.gate_proj\.", ".wgate."),
    (r"\.o_a_proj\.", ".wo_a."),
    (r"\.o_b_proj\.", ".wo_b."),
    (r"\.q_a_norm\.", ".q_norm."),
    (r"\.gate\.e_score_correction_bias$", ".gate.bias"),
    (r"\.weight_scale_inv$", ".scale"),
)
"""Reference name (without the model. prefix) -> release name, applied in order: the inverse of transformers'
conversion rules for the family (conversion_mapping.py's "deepseek_v4" table, and the FP8 quantizer's `.scale` ->
`.weight_scale_inv`); explorer/checkpoint/release_layout.py applies them and splits the fused experts."""


class DeepseekV4(Family):
    name = "deepseek_v4"
    model_types = ("deepseek_v4",)
    config_class = DeepseekV4Hyperparameters
    reference = ReferenceBinding("DeepseekV4Config", "DeepseekV4ForCausalLM", release_names=RELEASE_NAMES)
    symbols = ("vocab_size", "hidden_size", "moe_intermediate_size", "num_attention_heads", "head_dim", "q_lora_rank",
               "qk_rope_head_dim", "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim", "n_routed_experts",
               "num_experts_per_tok", "hc_mult")

    def check(self, c: DeepseekV4Hyperparameters) -> list[str]:
        q = c.quantization_config
        rates = c.compress_rates or {}
        names = {v: k_ for k_, v in LAYER_TYPES.items()}
        lists = (("compress_ratios", c.compress_ratios, KINDS), ("layer_types", c.layer_types, names),
                 ("mlp_layer_types", c.mlp_layer_types, {"hash_moe": True, "moe": False}))
        return rule_problems([
            rule for key, given, allowed in lists if given is not None for rule in (
                (len(given) >= c.num_hidden_layers, key,
                 f"must list at least num_hidden_layers ({c.num_hidden_layers}) entries, got {len(given)}"),
                (all(v in allowed for v in given), key, f"entries must be one of {', '.join(map(str, allowed))}"))
        ] + [
            (c.layer_types is None or c.compress_ratios is None, "layer_types",
             "give layer_types or compress_ratios, not both"),
            (all(k_ in DEFAULT_RATES and v >= 1 for k_, v in rates.items()), "compress_rates",
             f"keys must be {', '.join(DEFAULT_RATES)} with positive ratios"),
            (c.num_key_value_heads == 1, "num_key_value_heads", "must be 1: every head reads one shared key-value head"),
            (c.num_attention_heads % c.o_groups == 0, "o_groups",
             f"must divide num_attention_heads ({c.num_attention_heads}), got {c.o_groups}"),
            (c.qk_rope_head_dim % 2 == 0 and c.qk_rope_head_dim <= c.head_dim, "qk_rope_head_dim",
             f"must be even and at most head_dim ({c.head_dim}), got {c.qk_rope_head_dim}"),
            (c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
             f"must be <= n_routed_experts ({c.n_routed_experts}), got {c.num_experts_per_tok}"),
            (c.n_shared_experts == 1, "n_shared_experts", "must be 1: the reference builds one shared expert"),
            (c.scoring_func in ("sqrtsoftplus", "sigmoid"), "scoring_func",
             f"must be 'sqrtsoftplus' or 'sigmoid', got {c.scoring_func!r}"),
            (c.hidden_act == "silu", "hidden_act", f"must be 'silu' (SwiGLU), got {c.hidden_act!r}"),
            (c.swiglu_limit > 0, "swiglu_limit", f"must be > 0, got {c.swiglu_limit}"),
            (c.hc_mult >= 1 and c.hc_sinkhorn_iters >= 1, "hc_mult", "hc_mult and hc_sinkhorn_iters must be >= 1"),
            (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the family stores lm_head separately"),
            (q is None or q.fmt in ("e4m3", "e5m2"), "quantization_config.fmt", "must be 'e4m3' or 'e5m2'"),
        ]) + rope_scaling_problems(c.rope_scaling)

    # ------------------------------------------------------------------------------------------ layer kinds

    def kinds(self, c: DeepseekV4Hyperparameters) -> list[tuple[str, bool]]:
        """(attention kind, hash-routed) of every layer, as DeepseekV4Config resolves them: layer_types, else
        compress_ratios, else two ratio-128 layers then ratio-128 and ratio-4 alternating; mlp_layer_types, else
        the first num_hash_layers hash-routed."""
        n = c.num_hidden_layers
        if c.layer_types is not None:
            names = {v: k_ for k_, v in LAYER_TYPES.items()}
            attn = [names[t] for t in c.layer_types[:n]]
        elif c.compress_ratios is not None:
            attn = [KINDS[r] for r in c.compress_ratios[:n]]
        else:
            attn = ["hca"] * min(n, 2) + ["csa" if i % 2 else "hca" for i in range(max(n - 2, 0))]
        hashed = ([t == "hash_moe" for t in c.mlp_layer_types[:n]] if c.mlp_layer_types is not None
                  else [i < c.num_hash_layers for i in range(n)])
        return list(zip(attn, hashed))

    def rate(self, c: DeepseekV4Hyperparameters, kind: str) -> int:
        return {**DEFAULT_RATES, **(c.compress_rates or {})}.get(LAYER_TYPES[kind], 0)

    def quantized(self, c: DeepseekV4Hyperparameters) -> Storage | None:
        q = c.quantization_config
        if q is None:
            return None
        dtype = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}[q.fmt]
        return BlockFP8(dtype, tuple(q.weight_block_size), scale_dtype="F8_E8M0" if q.scale_fmt == "ue8m0" else "F32")

    def expert_storage(self, c: DeepseekV4Hyperparameters, ctx: Ctx) -> Storage:
        if c.expert_dtype == "fp4":  # as transformers' FP8 integration holds them, scales in the config's format
            q = c.quantization_config
            return FP4Rows("F8_E8M0" if q is not None and q.scale_fmt == "ue8m0" else "F32")
        return ctx.quantized or Dense(ctx.dtype)

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: DeepseekV4Hyperparameters, values: dict[str, int | float]) -> Component:
        ctx = Ctx(values, LABELS, REFERENCE, stored_dtype(c.torch_dtype), self.quantized(c))
        L, kinds = c.num_hidden_layers, self.kinds(c)
        blocks = tuple(self.block(ctx, c, kind, tuple(i for i in range(L) if kinds[i] == kind))
                       for kind in dict.fromkeys(kinds))
        model_cite = (_cite("The model embeds the tokens, copies them onto hc_mult streams, runs the decoder layers, "
                            "collapses the streams with the hyper-connection head and applies the final RMSNorm.",
                            "Model"),)
        o = self.hyper(c)
        X = Port("X_{L+1}", streams_shape(ctx, c.hc_mult), "streams")
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        counts = ", ".join(f"{len([k for k in kinds if k[0] == a])} {a}" for a in dict.fromkeys(k[0] for k in kinds))
        children = (
            embedding(ctx, "embed", "Token embedding", weight="model.embed_tokens.weight", citations=model_cite),
            hc_stack(blocks, layers=L, citations=blocks[0].citations[:1],
                     description=f"{L} decoder layers over {c.hc_mult} hyper-connected streams ({counts}; "
                                 f"{sum(h for _, h in kinds)} hash-routed)."),
            hyper_head(ctx, prefix="model.hc_head.", X=X, o=o, citations=(
                _cite("The head collapses the streams with sigmoid weights computed from the normalised, flattened "
                      "streams.", "HyperHead"),)),
            rmsnorm(ctx, "norm", "Final RMSNorm", weight="model.norm.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=c.rms_norm_eps),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", citations=(
                _cite("lm_head is a bias-free Linear from hidden_size to vocab_size.", "ForCausalLM.__init__"),)),
        )
        return hc_model(ctx, children, streams=c.hc_mult, code="DeepseekV4ForCausalLM(config)", layers=L,
                        citations=model_cite,
                        description=f"Token embedding on {c.hc_mult} residual streams, {L} blocks, the "
                                    "hyper-connection head, a final RMSNorm and an untied LM head.")

    def declared_mtp(self, c: DeepseekV4Hyperparameters, values: dict[str, int | float]) -> DeclaredMTP | None:
        """num_nextn_predict_layers modules, each one decoder layer of the kind compress_ratios gives the position
        after the main layers (score-routed: hashing is for the first layers), two hidden_size projections for the
        embedding and the hidden state, their RMSNorms, a final RMSNorm and a hyper-connection head."""
        ctx = Ctx(values, LABELS, REFERENCE, stored_dtype(c.torch_dtype), self.quantized(c))
        L, eps = c.num_hidden_layers, c.rms_norm_eps
        ratios = c.compress_ratios or ()
        kind = KINDS[ratios[L]] if len(ratios) > L else "sliding"
        X = Port("X_{L+1}", streams_shape(ctx, c.hc_mult), "streams")
        parts = (mtp_norm(ctx, "enorm", "Embedding RMSNorm", "mtp.enorm.weight", eps),
                 mtp_norm(ctx, "hnorm", "Hidden-state RMSNorm", "mtp.hnorm.weight", eps),
                 mtp_projection(ctx, "e_proj", "Embedding projection", "mtp.e_proj.weight", 1),
                 mtp_projection(ctx, "h_proj", "Hidden-state projection", "mtp.h_proj.weight", 1),
                 self.block(ctx, c, (kind, False), (L,)),
                 hyper_head(ctx, prefix="mtp.hc_head.", X=X, o=self.hyper(c), citations=()),
                 mtp_norm(ctx, "norm", "MTP final RMSNorm", "mtp.norm.weight", eps))
        place = (f"compress_ratios[{L}] = {ratios[L]}" if len(ratios) > L
                 else f"compress_ratios lists no entry {L}, so sliding attention is assumed")
        return declared_mtp("num_nextn_predict_layers", c.num_nextn_predict_layers, parts, (
            "The checkpoint stores these layers under mtp.* (transformers' DeepSeek-V4 loader ignores every key "
            "matching (^|\\.)mtp\\.), and transformers builds none, so they are counted from the config with this "
            f"family's own builders: one decoder layer of the kind {place} gives, with its hyper-connections and a "
            "score-routed MoE, plus e_proj and h_proj (hidden_size × hidden_size, for the next token's embedding and "
            "the main model's hidden state), their two RMSNorms, a final RMSNorm and a hyper-connection head, as "
            "DeepSeek's V4 inference code lays out its MTP block (not recorded here); the token embedding and the LM "
            "head are the main model's, not stored again. No tensor listing of the checkpoint is recorded, so the "
            "layout is not checked against the release."))

    def hyper(self, c: DeepseekV4Hyperparameters) -> HyperOptions:
        return HyperOptions(c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps)

    def block(self, ctx: Ctx, c: DeepseekV4Hyperparameters, kind: tuple[str, bool], indices: tuple[int, ...]) -> Component:
        attn_kind, hashed = kind
        ranges, p = layers(indices), "model.layers.{layer}."
        _, x_attn, _, x_ffn, _, delta = block_ports(ctx)
        X = Port("X_n", streams_shape(ctx, c.hc_mult), "streams")
        ids = Port(r"t^{\mathrm{id}}", Shape(ctx.tokens().dims), "input_ids")
        eps, o = c.rms_norm_eps, self.hyper(c)
        hc_cite = (_cite("Each branch's hyper-connection computes pre, post and comb weights from the normalised "
                         "streams, makes comb doubly stochastic by Sinkhorn iterations, and collapses the streams with "
                         "pre.", "HyperConnection"),)
        attn_hc = hyper_connection(ctx, "attn_hc", "Attention hyper-connection", prefix=p + "attn_hc.", ranges=ranges,
                                   X=X, o=o, branch="attn", citations=hc_cite)
        ffn_hc = hyper_connection(ctx, "ffn_hc", "FFN hyper-connection", prefix=p + "ffn_hc.", ranges=ranges,
                                  X=Port("X'_n", X.shape, "streams"), o=o, branch="ffn", citations=hc_cite)
        attn_norm = rmsnorm(ctx, "attn_norm", "Attention RMSNorm", weight=p + "input_layernorm.weight", ranges=ranges,
                            size="hidden_size", x=attn_hc.outputs[0], y=x_attn,
                            code="self.input_layernorm(collapsed)", eps=eps)
        ffn_norm = rmsnorm(ctx, "ffn_norm", "MoE RMSNorm", weight=p + "post_attention_layernorm.weight", ranges=ranges,
                           size="hidden_size", x=ffn_hc.outputs[0], y=x_ffn,
                           code="self.post_attention_layernorm(collapsed)", eps=eps)
        attn = self.attention(ctx, c, attn_kind, p + "self_attn.", ranges, x_attn)
        moe = self.moe(ctx, c, hashed, p + "mlp.", ranges, x_ffn, ids, delta.latex)
        m = self.rate(c, attn_kind)
        title = TITLES[attn_kind].format(m=m) + " block" + (" (hash routing)" if hashed else "")
        key = attn_kind + ("_hash" if hashed else "")
        routing = "experts looked up by token id" if hashed else "experts chosen by score"
        return hc_block(ctx, key, title, layer_indices=indices, attn_hc=attn_hc, attn_norm=attn_norm, attn=attn,
                        ffn_hc=ffn_hc, ffn_norm=ffn_norm, ffn=moe,
                        kind=BLOCK_NOUNS[attn_kind] + (" hash-routed" if hashed else ""),
                        citations=(_cite("A layer collapses the streams for attention, spreads its output back and "
                                         "mixes the streams, then does the same around the MoE.", "DecoderLayer"),),
                        description=f"{attn.title} and a mixture of experts ({routing}), each between "
                                    f"hyper-connections of {c.hc_mult} streams; {layer_label(indices)}.")

    def attention(self, ctx: Ctx, c: DeepseekV4Hyperparameters, kind: str, prefix: str, ranges, x: Port) -> Component:
        main = RopeOptions("default", c.rope_theta, c.qk_rope_head_dim, "interleaved")
        compress_rope = rope_options(c.compress_rope_theta, c.qk_rope_head_dim, c.rope_scaling, "interleaved",
                                     c.max_position_embeddings)
        o = V4AttentionOptions(kind, c.num_attention_heads, c.head_dim, c.qk_rope_head_dim,  # type: ignore[arg-type]
                               c.o_groups, c.o_lora_rank, c.sliding_window, main if kind == "sliding" else compress_rope,
                               c.rms_norm_eps)
        comp = None
        if kind != "sliding":
            m = self.rate(c, kind)
            co = CompressorOptions(m, c.head_dim, kind == "csa", compress_rope, c.rms_norm_eps)
            index = (IndexerOptions(CompressorOptions(m, c.index_head_dim, True, compress_rope, c.rms_norm_eps),
                                    c.index_n_heads, c.index_head_dim, c.index_topk) if kind == "csa" else None)
            cq = Port(r"{\color{stream-q}{\hat c^{Q}}}", ctx.tokens("q_lora_rank"), "c_q_hat")
            comp = compressor(ctx, prefix=prefix + "compressor.", ranges=ranges, x=x, cq=cq, o=co, index=index,
                              citations=(_cite("The compressor projects keys and gates, adds a learned bias per window "
                                               "slot, pools each window by a softmax over it, normalises and rotates "
                                               "each entry at its window's first position.",
                                               "CSACompressor" if kind == "csa" else "HCACompressor"),),
                              indexer_citations=(
                                  _cite("The indexer compresses its own keys, projects queries from the query latent, "
                                        "scores entries with per-head weighted ReLU dot products and keeps the top "
                                        "index_topk closed entries.", "Indexer"),))
        return v4_attention(ctx, prefix=prefix, ranges=ranges, x=x, o=o, compressor_c=comp, citations=(
            _cite("One shared key-value head, queries through a latent with a weightless per-head RMSNorm, partial "
                  "interleaved RoPE, sinks, compressed entries appended to the keys, the value's rotation undone, "
                  "and a grouped output projection.", "Attention"),
            REFERENCE.cite("Each head's sink logit joins the softmax as an extra column and is dropped after it.",
                           "eager_attention_forward", prefixed=False)))

    def moe(self, ctx: Ctx, c: DeepseekV4Hyperparameters, hashed: bool, prefix: str, ranges, x: Port, ids: Port,
            y_latex: str) -> Component:
        E, k = c.n_routed_experts, c.num_experts_per_tok
        ro = RouterOptions(E, k, c.scoring_func, True, c.routed_scaling_factor,  # type: ignore[arg-type]
                           correction_bias=not hashed)
        if hashed:
            gate = hash_router(ctx, prefix=prefix + "gate.", ranges=ranges, x=x, ids=ids, o=ro,
                               code="DeepseekV4HashRouter(config)", citations=(
                                   _cite("The hash router scores every expert with the learned gate but takes the "
                                         "experts from tid2eid[input_ids].", "HashRouter"),))
        else:
            # the correction bias is a persistent buffer in the reference, not a trained parameter
            gate = router(ctx, weight=prefix + "gate.weight", ranges=ranges, x=x, o=ro, code="DeepseekV4TopKRouter(config)",
                          bias_role="buffer", citations=(_cite("The router picks the top k of score + e_score_correction_bias and weights "
                                           "them by their renormalised scores × routed_scaling_factor.", "TopKRouter"),))
        limit = c.swiglu_limit
        experts = clamped_experts(
            ctx, prefix=prefix + "experts.", ranges=ranges, x=x, gates=gate.outputs[0], k=k,
            o=ClampedSwiGLUOptions(E, 1.0, limit, interleaved=False, up_shift=0.0, bias=False),
            experts_sym="n_routed_experts", width="moe_intermediate_size", storage=self.expert_storage(c, ctx),
            code="DeepseekV4Experts(config)", citations=(
                _cite("The experts split gate_up into a gate half and an up half, clamp the gate from above and the up "
                      "value on both sides at swiglu_limit, and multiply silu(gate) by up.", "Experts"),))
        shared = gated_mlp(ctx, "shared", "Shared expert", "Shared expert", prefix=prefix + "shared_experts.",
                           ranges=ranges, d_ff=ctx.sym("moe_intermediate_size"), ff_dim=ctx.dim("moe_intermediate_size"),
                           x=x, y=Port(r"y^{\mathrm{shared}}", x.shape, "shared_out"), sub=r"\mathrm{sh}", limit=limit,
                           description=f"A clamped SwiGLU MLP of width {c.moe_intermediate_size:,} that every token "
                                       "runs.", code="DeepseekV4MLP(config)",
                           citations=(_cite("The shared expert clamps its gate and up values at swiglu_limit too.",
                                            "MLP"),))
        return shared_and_routed_moe(x=x, ids=ids, y_latex=y_latex, router_c=gate, experts_c=experts, shared=shared,
                                     code="DeepseekV4SparseMoeBlock(config, layer_idx)", citations=(
                                         _cite("The MoE block runs the routed experts on the router's choice and adds "
                                               "the shared expert.", "SparseMoeBlock"),))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: DeepseekV4Hyperparameters) -> dict[str, Any]:
        """One layer of each (attention kind, routing) of the model, in its order; ratios 2 and 4 so that T = 5
        closes windows of both compressors, top-1 of 2 indexed entries, a window of 3, 3 streams, top-2 of 4
        experts, and a clamp low enough to bite."""
        kinds = list(dict.fromkeys(self.kinds(c)))
        ratio_of = {v: k_ for k_, v in KINDS.items()}
        raw = {f.name: as_published(getattr(c, f.name)) for f in dataclasses.fields(c)}
        scaling = raw["rope_scaling"]
        if scaling is not None:
            scaling["original_max_position_embeddings"] = 64
        raw.update(vocab_size=97, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=len(kinds),
                   num_attention_heads=4, head_dim=16, q_lora_rank=24, qk_rope_head_dim=8, o_groups=2, o_lora_rank=12,
                   n_routed_experts=4, num_experts_per_tok=2, compress_ratios=[ratio_of[a] for a, _ in kinds],
                   layer_types=None, mlp_layer_types=["hash_moe" if h else "moe" for _, h in kinds],
                   num_hash_layers=sum(1 for _, h in kinds if h), index_n_heads=3, index_head_dim=8, index_topk=1,
                   compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4}, hc_mult=3,
                   sliding_window=3, swiglu_limit=0.05, max_position_embeddings=1024, rope_scaling=scaling,
                   quantization_config=None, bos_token_id=0, eos_token_id=1)
        return raw

    def tiny_label_parts(self, tiny: ModelSpec) -> tuple[str, ...]:
        """The compressors close windows within the checked sequence at these rates."""
        c = tiny.config
        assert isinstance(c, DeepseekV4Hyperparameters)
        if not c.compress_rates:
            return ()
        return ("compress ratios " + " and ".join(str(r) for r in sorted(c.compress_rates.values()))
                + f", indexer top {c.index_topk}, {c.hc_mult} residual streams",)

    def facts(self, c: DeepseekV4Hyperparameters) -> tuple[tuple[str, str], ...]:
        kinds = self.kinds(c)
        attn = [a for a, _ in kinds]
        per_kind = ", ".join(f"{attn.count(a)} ratio-{self.rate(c, a)}" for a in ("csa", "hca") if a in attn)
        return (("transformer blocks", f"{c.num_hidden_layers:,} ({per_kind + ', ' if per_kind else ''}"
                                       f"{attn.count('sliding')} window only)"),
                ("routed experts", f"{c.n_routed_experts} (top {c.num_experts_per_tok}; "
                                   f"{sum(h for _, h in kinds)} layers hash-routed)"),
                ("attention heads", f"{c.num_attention_heads} query, 1 shared key-value"),
                ("residual streams", f"{c.hc_mult}"), ("vocabulary", f"{c.vocab_size:,}"))



FAMILY = DeepseekV4()
