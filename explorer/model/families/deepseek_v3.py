"""The DeepSeek-V3 family (DeepSeek-V3, Kimi K2, DeepSeek-V2-Lite-style configs): multi-head latent attention,
sigmoid-scored routed experts with a correction bias and group-limited top-k, shared experts, the first
first_k_dense_replace blocks dense, and multi-token-prediction modules stored after the main layers.

References: DeepSeek-V3 technical report (arXiv:2412.19437); the checkpoint's modeling_deepseek.py;
transformers' models/deepseek_v3/modeling_deepseek_v3.py (the reference binding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block, model_root, stack
from explorer.model.components.embedding import embedding, head
from explorer.model.components.mla import MLAOptions, mla
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router, shared_expert
from explorer.model.components.mtp import mtp
from explorer.model.components.norms import NormOptions, rmsnorm
from explorer.model.families.base import (
    Family,
    ReferenceBinding,
    RopeScaling,
    fp8_storage,
    rope_options,
    rope_scaling_problems,
    rule_problems,
    stored_dtype,
)
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Citation, Component, Hyperparameters, TensorRole

TRANSFORMERS_FILE = "models/deepseek_v3/modeling_deepseek_v3.py"
REFERENCE = Reference(TRANSFORMERS_FILE, "DeepseekV3")


@dataclass(frozen=True, slots=True)
class QuantizationConfig:
    """config.json "quantization_config" (block-wise FP8)."""

    quant_method: str
    fmt: str
    activation_scheme: str
    weight_block_size: tuple[int, int]


@dataclass(frozen=True, slots=True)
class DeepseekV3Hyperparameters(Hyperparameters):
    """The config.json keys of the family, named as published; informational keys are optional."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    n_shared_experts: int
    n_routed_experts: int
    routed_scaling_factor: float
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    n_group: int
    topk_group: int
    num_experts_per_tok: int
    first_k_dense_replace: int
    norm_topk_prob: bool
    hidden_act: str
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    q_lora_rank: int | None = None
    """None (published as null): queries are projected directly by q_proj, with no query latent."""
    rope_scaling: RopeScaling | None = None
    topk_method: str = "noaux_tc"
    moe_layer_freq: int = 1
    scoring_func: str = "sigmoid"
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 0
    torch_dtype: str = "bfloat16"
    quantization_config: QuantizationConfig | None = None
    # Informational keys: recorded as published, not used by the spec.
    architectures: tuple[str, ...] = ()
    model_type: str = ""
    bos_token_id: int = 0
    eos_token_id: int = 0
    initializer_range: float = 0.0
    attention_dropout: float = 0.0
    aux_loss_alpha: float = 0.0
    seq_aux: bool = False
    pretraining_tp: int = 1
    ep_size: int = 1
    use_cache: bool = True
    transformers_version: str = ""
    auto_map: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """One block kind of the stack: its key and title, its layer indices, whether its feed-forward is the mixture of
    experts, and its count in config keys."""

    key: str
    title: str
    layers: tuple[int, ...]
    moe_ffn: bool
    repeat_formula: str


def _checkpoint(claim: str, symbol: str, lines: tuple[int, int] | None = None) -> Citation:
    return Citation(claim, "checkpoint", symbol, lines=lines)


BLOCK_CITATIONS = (
    _checkpoint("A block applies input RMSNorm, attention and a residual addition, then post-attention RMSNorm, the "
                "FFN and a second residual addition; the first first_k_dense_replace blocks use the dense MLP, the "
                "rest MoE.", "DeepseekV3DecoderLayer.__init__", lines=(1152, 1166)),
    _checkpoint("The forward pass adds attention and FFN outputs to the residual stream.",
                "DeepseekV3DecoderLayer.forward", lines=(1198, 1218)),
    REFERENCE.cite("transformers' decoder layer has the same structure.", "DecoderLayer"),
)
MLP_CITATIONS = (
    _checkpoint("The dense feed-forward network is a SwiGLU MLP: down(silu(gate x) ⊙ up x), with no biases.",
                "DeepseekV3MLP"),
    REFERENCE.cite("transformers implements the same SwiGLU MLP.", "MLP"),
)


class DeepseekV3(Family):
    name = "deepseek_v3"
    model_types: ClassVar[tuple[str, ...]] = ("deepseek_v3", "kimi_k2")
    config_class: ClassVar[type] = DeepseekV3Hyperparameters
    reference = ReferenceBinding("DeepseekV3Config", "DeepseekV3ForCausalLM", not_built=("mtp",),
                                 renames=split_fused_experts)
    ref: ClassVar[Reference] = REFERENCE
    """Where the family's transformers code lives (citations, class names); a subclass for a sibling model type
    (DeepSeek-V3.2) points it at its own file."""
    attn_heading: ClassVar[str] = "Multi-head latent attention"
    attn_short: ClassVar[str] = "MLA"
    """The attention's name at the start of a block's description (GLM-4-MoE's blocks hold grouped-query attention)."""
    correction_bias_role: ClassVar[TensorRole] = "parameter"
    """The routers' e_score_correction_bias: counted as a parameter here; a persistent buffer in the reference."""
    symbols: ClassVar[tuple[str, ...]] = (
        "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank",
        "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
        "n_shared_experts", "num_experts_per_tok")
    prefix: ClassVar[str] = "model."
    """Where the text model's modules live in the reference's state dict (Kimi K2.5 nests it under
    model.language_model.)."""

    def quantized_storage(self, c: Any) -> Any:
        """Storage of the weights the checkpoint quantizes, given to every projection (None: none is)."""
        return fp8_storage(c.quantization_config)

    def values(self, config: Any) -> dict[str, int | float]:
        return {n: getattr(config, n) for n in self.symbols if getattr(config, n) is not None}

    def check(self, c: DeepseekV3Hyperparameters) -> list[str]:
        per_group = c.n_routed_experts // max(c.n_group, 1)
        return rule_problems([
            (c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
             f"must be <= n_routed_experts ({c.n_routed_experts}), got {c.num_experts_per_tok}"),
            (c.n_routed_experts % c.n_group == 0, "n_group",
             f"must divide n_routed_experts ({c.n_routed_experts}), got {c.n_group}"),
            (c.topk_group <= c.n_group, "topk_group", f"must be in 1..n_group ({c.n_group}), got {c.topk_group}"),
            (c.n_group == 1 or per_group >= 2, "n_group", "groups must hold at least 2 experts (scored by their top 2)"),
            (c.num_experts_per_tok <= c.topk_group * per_group, "num_experts_per_tok",
             "must not exceed the experts in the topk_group selected groups"),
            (0 <= c.first_k_dense_replace <= c.num_hidden_layers, "first_k_dense_replace",
             f"must be in 0..num_hidden_layers ({c.num_hidden_layers}), got {c.first_k_dense_replace}"),
            (c.moe_layer_freq >= 1, "moe_layer_freq", f"must be >= 1, got {c.moe_layer_freq}"),
            (c.n_shared_experts >= 1, "n_shared_experts", "must be >= 1: the reference always builds the shared "
             f"experts (width moe_intermediate_size × n_shared_experts), got {c.n_shared_experts}"),
            (c.num_attention_heads % c.num_key_value_heads == 0, "num_key_value_heads",
             f"must divide num_attention_heads ({c.num_attention_heads}), got {c.num_key_value_heads}"),
            (c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", f"must be even (rotary pairs), got {c.qk_rope_head_dim}"),
            (c.scoring_func == "sigmoid", "scoring_func", f"must be 'sigmoid' for this family, got {c.scoring_func!r}"),
            (c.hidden_act == "silu", "hidden_act", f"must be 'silu' (SwiGLU), got {c.hidden_act!r}"),
            (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the family stores lm_head separately"),
            (0 <= c.num_nextn_predict_layers <= 16, "num_nextn_predict_layers",
             f"must be in 0..16, got {c.num_nextn_predict_layers}"),
            (c.quantization_config is None or all(b >= 1 for b in c.quantization_config.weight_block_size),
             "quantization_config.weight_block_size", "must be positive integers"),
            (c.quantization_config is None or c.quantization_config.fmt in ("e4m3", "e5m2"),
             "quantization_config.fmt", "must be 'e4m3' or 'e5m2'"),
        ]) + rope_scaling_problems(c.rope_scaling)

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: DeepseekV3Hyperparameters, values: dict[str, int | float]) -> Component:
        ctx = Ctx(values, self.dim_labels(), self.ref, stored_dtype(c.torch_dtype), self.quantized_storage(c),
                  citations={"rmsnorm": (
                      _checkpoint("RMSNorm divides by the root mean square over the last dimension (plus eps) and "
                                  "multiplies by a learned weight of that length.", "DeepseekV3RMSNorm"),
                      self.ref.cite("The same RMSNorm in the transformers implementation.", "RMSNorm"))})
        L = c.num_hidden_layers
        groups = self.layer_groups(c)
        blocks = [replace(self.block(ctx, c, g.key, g.title, g.layers, moe_ffn=g.moe_ffn),
                          repeat_formula=g.repeat_formula) for g in groups]
        moe_layers = tuple(i for g in groups if g.moe_ffn for i in g.layers)
        dense_layers = tuple(i for g in groups if not g.moe_ffn for i in g.layers)
        model_cites = (_checkpoint("The model embeds token ids with nn.Embedding(vocab_size, hidden_size), runs the "
                                   "decoder layers and a final RMSNorm.", "DeepseekV3Model.__init__"),
                       self.ref.cite("transformers builds the same embedding, layers and final norm.", "Model.__init__"))
        children: list[Component] = [
            embedding(ctx, "embed", "Token embedding", weight=self.prefix + "embed_tokens.weight", citations=model_cites),
            self.stack(ctx, tuple(blocks), layers=L, citations=BLOCK_CITATIONS[:1],
                       description=f"{L} decoder layers: {len(dense_layers)} dense, {len(moe_layers)} with a mixture "
                                   "of experts.")]
        if getattr(c, "num_nextn_predict_layers", 0):  # GLM-4-MoE-Lite's config has no such key
            mtp_layers = tuple(range(L, L + c.num_nextn_predict_layers))
            block = replace(self.block(ctx, c, "block", "MTP transformer block", mtp_layers, moe_ffn=True,
                                       label="run on the combined state"),
                            crumb="MTP block", repeat=1, repeat_label="", repeat_formula="")
            children.append(mtp(ctx, first_layer=L, count=c.num_nextn_predict_layers, block=block, eps=c.rms_norm_eps,
                                citations=(self.ref.cite("transformers skips the stored multi-token-prediction layer "
                                                          "when loading.", "PreTrainedModel"),)))
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        children += [
            rmsnorm(ctx, "norm", "Final RMSNorm", weight=self.prefix + "norm.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=c.rms_norm_eps),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", citations=(
                _checkpoint("lm_head is a separate bias-free Linear from hidden_size to vocab_size.",
                            "DeepseekV3ForCausalLM.__init__"),
                self.ref.cite("transformers builds the same untied head.", "ForCausalLM.__init__")))]
        return model_root(ctx, tuple(children), code=f"{self.reference.model_class}(config)", layers=L,
                          description=f"Token embedding, {L} transformer blocks, a final RMSNorm and an untied LM head.",
                          citations=model_cites[:1])

    def layer_groups(self, c: Any) -> tuple[LayerGroup, ...]:
        """The block kinds of the stack, each with its layers. The reference makes every layer from
        first_k_dense_replace on MoE; it does not read moe_layer_freq (modeling_deepseek_v3.py), so neither do we: a
        checkpoint's layout is what its loader builds."""
        L, k = c.num_hidden_layers, c.first_k_dense_replace
        groups = (LayerGroup("dense", "Dense transformer block", tuple(range(min(k, L))), False,
                             "first_k_dense_replace"),
                  LayerGroup("moe", "MoE transformer block", tuple(range(k, L)), True,
                             "num_hidden_layers − first_k_dense_replace"))
        return tuple(g for g in groups if g.layers)

    def stack(self, ctx: Ctx, blocks: tuple[Component, ...], **kw: Any) -> Component:
        """The decoder layers in order (GLM-MoE-DSA's carry an indexer's selection from layer to layer)."""
        return stack(ctx, blocks, **kw)

    def block(self, ctx: Ctx, c: DeepseekV3Hyperparameters, key: str, title: str, indices: tuple[int, ...],
              moe_ffn: bool, label: str = "") -> Component:
        """One decoder layer kind (dense or MoE), repeated over `indices`."""
        ranges = layers(indices)
        p = self.prefix + "layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta_ffn = block_ports(ctx)
        eps = c.rms_norm_eps
        attn_norm = rmsnorm(ctx, "attn_norm", "Attention RMSNorm", weight=p + "input_layernorm.weight", ranges=ranges,
                            size="hidden_size", x=x, y=x_attn, code="self.input_layernorm(hidden_states)", eps=eps)
        ffn_norm = rmsnorm(ctx, "ffn_norm", ("MoE" if moe_ffn else "MLP") + " RMSNorm",
                           weight=p + "post_attention_layernorm.weight", ranges=ranges, size="hidden_size", x=x_mid,
                           y=x_ffn, code="self.post_attention_layernorm(hidden_states)", eps=eps)
        attn = self.attention(ctx, c, p + "self_attn.", ranges, x_attn)
        if moe_ffn:
            ffn = self.moe(ctx, c, p + "mlp.", ranges, x_ffn, delta_ffn.latex)
        else:
            ffn = gated_mlp(ctx, "mlp", "SwiGLU MLP", "SwiGLU", prefix=p + "mlp.", ranges=ranges,
                            d_ff=ctx.sym("intermediate_size"), ff_dim=ctx.dim("intermediate_size"), x=x_ffn, y=delta_ffn,
                            description=f"A dense SwiGLU feed-forward network of width {c.intermediate_size:,}.",
                            code=f"{self.ref.prefix}MLP(config)",
                            citations=(*MLP_CITATIONS[:1], self.ref.cite("transformers implements the same SwiGLU MLP.",
                                                                         "MLP")))
        kind = "MoE" if moe_ffn else "dense"
        block = decoder_block(
            ctx, key, title, layer_indices=indices, attn_norm=attn_norm, attn=attn, ffn_norm=ffn_norm, ffn=ffn,
            kind=kind, citations=(*BLOCK_CITATIONS[:2], self.ref.cite("transformers' decoder layer has the same "
                                                                      "structure.", "DecoderLayer")),
            attn_heading=self.attn_heading,
            description=f"{self.attn_short} and {'a mixture of experts' if moe_ffn else 'a dense SwiGLU MLP'}, each added to the "
                        f"residual stream; {label or layer_label(indices)}.")
        return replace(block, repeat_formula="num_hidden_layers − first_k_dense_replace" if moe_ffn
                       else "first_k_dense_replace")

    def attention(self, ctx: Ctx, c: DeepseekV3Hyperparameters, prefix: str, ranges, x: Port) -> Component:
        opts = MLAOptions(c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
                          c.qk_rope_head_dim, c.v_head_dim, NormOptions("rms", 1e-6))
        ro = rope_options(c.rope_theta, c.qk_rope_head_dim, c.rope_scaling, "interleaved", c.max_position_embeddings)
        return mla(ctx, prefix=prefix, ranges=ranges, x=x, o=opts, rope_options=ro, citations=(
            _checkpoint("Attention compresses queries through q_a_proj, q_a_layernorm and q_b_proj, and keys and values "
                        "through kv_a_proj_with_mqa (latent plus shared rotary key), kv_a_layernorm and kv_b_proj.",
                        "DeepseekV3Attention.__init__"),
            _checkpoint("The forward pass splits content and rotary parts, applies RoPE to the rotary parts only, "
                        "concatenates them per head and attends.", "DeepseekV3Attention.forward"),
            self.ref.cite("transformers builds the same projections and forward pass.", "Attention")),
            rope_citations=(_checkpoint("YaRN blends interpolated and extrapolated inverse frequencies with a linear ramp "
                                        "between the beta_fast and beta_slow correction dimensions.",
                                        "DeepseekV3YarnRotaryEmbedding"),) if ro.kind == "yarn" else (),
            scores_citations=(self.ref.cite("The softmax scale is (qk_nope_head_dim + qk_rope_head_dim)^-0.5, "
                                             "multiplied by mscale squared when YaRN's mscale_all_dim is set.",
                                             "Attention.__init__"),))

    def moe(self, ctx: Ctx, c: DeepseekV3Hyperparameters, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        ro = RouterOptions(c.n_routed_experts, c.num_experts_per_tok, "sigmoid", c.norm_topk_prob,
                           c.routed_scaling_factor, correction_bias=True, n_group=c.n_group, topk_group=c.topk_group)
        gate = router(ctx, weight=prefix + "gate.weight", ranges=ranges, x=x, o=ro, code="MoEGate(config)",
                      bias_role=self.correction_bias_role, citations=(
            _checkpoint("The gate scores experts with a sigmoid, adds e_score_correction_bias only for selection "
                        "(noaux_tc), keeps the top groups, takes the top-k, normalises and scales by "
                        "routed_scaling_factor.", "MoEGate.forward"),
            self.ref.cite("transformers' router implements the same selection and weighting.", "TopkRouter")))
        experts = routed_experts(ctx, prefix=prefix + "experts.", ranges=ranges, x=x, experts=c.n_routed_experts,
                                 k=c.num_experts_per_tok,
                                 code=f"{self.ref.prefix}MLP(config, intermediate_size=moe_intermediate_size)",
                                 citations=(
                                     _checkpoint("Routed experts are SwiGLU MLPs of width moe_intermediate_size.",
                                                 "DeepseekV3MoE.__init__"),
                                     self.ref.cite("transformers fuses the experts' gate and up weights into one 3-D "
                                                    "tensor.", "Experts")))
        shared = shared_expert(ctx, prefix=prefix + "shared_experts.", ranges=ranges, x=x,
                               d_shared=ctx.sym("moe_intermediate_size") * ctx.sym("n_shared_experts"),
                               code=f"{self.ref.prefix}MLP(config, intermediate_size=moe_intermediate_size * "
                                    "n_shared_experts)",
                               citations=(_checkpoint("The shared experts are one SwiGLU MLP of width "
                                                      "moe_intermediate_size × n_shared_experts, added to the routed "
                                                      "output.", "DeepseekV3MoE.__init__"),))
        return moe(ctx, x=x, y_latex=y_latex, router_c=gate, expert=experts, shared=shared,
                   code=f"{self.ref.prefix}MoE(config)",
                   citations=(_checkpoint("The MoE layer sums the gated outputs of the selected routed experts and adds "
                                          "the shared experts' output.", "DeepseekV3MoE.forward"),
                              self.ref.cite("transformers' MoE adds the shared experts to the routed experts' output.",
                                             "MoE")))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: DeepseekV3Hyperparameters) -> dict[str, Any]:
        """Small sizes, same structure: top-k below the experts, more groups than topk_group, a dense block if any."""
        grouped = c.n_group > 1
        n_group, topk_group = (4, 2) if grouped else (1, 1)
        k = min(c.num_experts_per_tok, 4)
        per_group = max(2, math.ceil(k / topk_group) + 1)
        factor = c.rope_scaling.factor if c.rope_scaling is not None and c.rope_scaling.factor else 1.0
        rope_scaling = None
        if c.rope_scaling is not None:
            rope_scaling = {k_: v for k_, v in _asdict(c.rope_scaling).items() if v is not None}
            if c.rope_scaling.original_max_position_embeddings is not None:
                rope_scaling["original_max_position_embeddings"] = 64
        return {**_asdict(c), "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
                "num_hidden_layers": min(c.first_k_dense_replace, 1) + 1,
                "first_k_dense_replace": min(c.first_k_dense_replace, 1), "moe_layer_freq": 1,
                "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 48 if c.q_lora_rank else None,
                "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                "n_group": n_group, "topk_group": topk_group, "num_experts_per_tok": k,
                "n_routed_experts": n_group * per_group, "n_shared_experts": 1,
                "num_nextn_predict_layers": min(c.num_nextn_predict_layers, 1),
                "max_position_embeddings": int(64 * factor), "bos_token_id": 0, "eos_token_id": 1,
                "rope_scaling": rope_scaling}

    def dim_labels(self) -> dict[str, str]:
        """Config symbol -> its short name in shapes."""
        return DIM_LABELS

    def facts(self, c: DeepseekV3Hyperparameters) -> tuple[tuple[str, str], ...]:
        return (("transformer blocks", f"{c.num_hidden_layers:,}"),
                ("routed experts", f"{c.n_routed_experts} (top {c.num_experts_per_tok})"),
                ("attention heads", f"{c.num_attention_heads:,}"), ("vocabulary", f"{c.vocab_size:,}"))


def _asdict(value: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(value)


DIM_LABELS = {
    "hidden_size": "d", "intermediate_size": "d_ff", "moe_intermediate_size": "d_expert", "vocab_size": "vocab",
    "q_lora_rank": "d_cq", "kv_lora_rank": "d_ckv", "num_attention_heads": "heads", "qk_nope_head_dim": "d_nope",
    "qk_rope_head_dim": "d_rope", "v_head_dim": "d_v", "n_routed_experts": "experts", "num_experts_per_tok": "k",
    "n_shared_experts": "shared",
}

FAMILY = DeepseekV3()
