"""The Kimi Linear family (Kimi-Linear-48B-A3B): a hybrid decoder of Kimi Delta Attention layers (linear attention,
a fixed state per layer, decay per key channel) and multi-head latent attention layers with no positional encoding,
three KDA layers to each MLA layer in the reference config, every layer's feed-forward network DeepSeek-V3's: a
dense SwiGLU MLP in the first layers, then sigmoid-routed experts (group-limited top-k with a selection-only
correction bias, renormalised and scaled) beside a shared expert.

The layers follow layer_types ("linear_attention" or "full_attention"; absent, every fourth layer after the first
is full attention, as KimiLinearConfig derives it) and mlp_layer_types ("dense" or "sparse"; absent, the first
first_k_dense_replace layers are dense). Each pair of kinds present is one block kind.

References: "Kimi Linear: An Expressive, Efficient Attention Architecture" (Kimi Team, arXiv:2510.26692);
DeepSeek-V3 (arXiv:2412.19437) for MLA and the router; transformers' models/kimi_linear/modeling_kimi_linear.py and
configuration_kimi_linear.py (the reference binding and its defaults).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block, model_root, stack
from explorer.model.components.embedding import embedding, head
from explorer.model.components.gated_deltanet import recurrent_block
from explorer.model.components.kda import KDAOptions, kda
from explorer.model.components.mla import MLAOptions
from explorer.model.components.mla_nope import mla_nope
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router, shared_expert
from explorer.model.components.norms import NormOptions, rmsnorm
from explorer.model.families.base import (
    DIM_LABELS,
    Family,
    PublishedMetadata,
    ReferenceBinding,
    rule_problems,
    stored_dtype,
)
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_block_storage,
    fp8_problems,
    keep_named_modules_dense,
)
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Component, ModelSpec

REFERENCE = Reference("models/kimi_linear/modeling_kimi_linear.py", "KimiLinear")
LINEAR, FULL = "linear_attention", "full_attention"
DENSE, SPARSE = "dense", "sparse"
LABELS = {**DIM_LABELS, "linear_num_heads": "heads", "linear_head_dim": "d_k", "linear_conv_kernel_dim": "kernel",
          "num_local_experts": "experts"}
SYMBOLS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank",
           "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_local_experts",
           "n_shared_experts", "num_experts_per_tok", "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim")
DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}
RELEASE_NAMES = (
    (r"\.self_attn\.forget_gate\.", ".self_attn."),
    (r"\.mlp\.(experts|gate|shared_experts)\.", r".block_sparse_moe.\1."),
    (r"\.experts\.(\d+)\.gate_proj\.", r".experts.\1.w1."),
    (r"\.experts\.(\d+)\.up_proj\.", r".experts.\1.w3."),
    (r"\.experts\.(\d+)\.down_proj\.", r".experts.\1.w2."),
    (r"^(?!lm_head\.)", "model."),
)
"""Reference name (without the model. prefix) -> the release's (Moonshot's own names), applied in order: the inverse
of transformers' conversion mapping for kimi_linear (forget-gate tensors attached to the attention module, the MoE
block as block_sparse_moe, experts' w1, w3 and w2 merged into gate_up_proj and down_proj)."""
RELEASE_SPLITS = ((r"\.self_attn\.conv1d\.", (".self_attn.q_conv1d.", ".self_attn.k_conv1d.", ".self_attn.v_conv1d.")),)
"""The KDA convolution transformers concatenates on load from the release's q, k and v convolutions, in that order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KimiLinearHyperparameters(PublishedMetadata):
    """KimiLinearConfig's keys, named as published; absent keys take its defaults (transformers 5.23.0)."""

    vocab_size: int = 163_840
    hidden_size: int = 2304
    intermediate_size: int = 9216
    moe_intermediate_size: int = 1024
    num_hidden_layers: int = 27
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 32
    n_shared_experts: int = 1
    routed_scaling_factor: float = 2.446
    kv_lora_rank: int = 512
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 64
    """The key part shared by the heads (named for DeepSeek's rotary part; nothing rotates it here)."""
    v_head_dim: int = 128
    qk_nope_head_dim: int = 128
    n_group: int = 1
    topk_group: int = 1
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: int = 1_048_576
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    num_local_experts: int = 256
    mlp_layer_types: tuple[str, ...] | None = None
    layer_types: tuple[str, ...] | None = None
    first_k_dense_replace: int = 1
    """Read by KimiLinearConfig from its keyword arguments only when mlp_layer_types is absent."""
    linear_head_dim: int = 128
    linear_num_heads: int = 32
    linear_conv_kernel_dim: int = 4
    torch_dtype: str = "bfloat16"
    dtype: str | None = None
    """The newer name of torch_dtype; where published it is the stored dtype."""
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, modules_to_not_convert applied (explorer/model/families/block_fp8.py)."""
    # Informational keys: recorded as published, not used by the spec.
    bos_token_id: int | None = 163_584
    eos_token_id: int | tuple[int, ...] | None = 163_586
    pretraining_tp: int = 1
    output_router_logits: bool = False


def attention_kinds(c: KimiLinearHyperparameters) -> tuple[str, ...]:
    """Each layer's token mixer, as published or as KimiLinearConfig derives it (full attention at every fourth
    layer after layer 0)."""
    if c.layer_types is not None:
        return tuple(c.layer_types)
    return tuple(FULL if i and i % 4 == 0 else LINEAR for i in range(c.num_hidden_layers))


def mlp_kinds(c: KimiLinearHyperparameters) -> tuple[str, ...]:
    if c.mlp_layer_types is not None:
        return tuple(c.mlp_layer_types)
    return tuple(DENSE if i < c.first_k_dense_replace else SPARSE for i in range(c.num_hidden_layers))


def block_kinds(c: KimiLinearHyperparameters) -> dict[tuple[str, str], tuple[int, ...]]:
    """(mixer, MLP) pairs in order of first appearance -> their layers."""
    out: dict[tuple[str, str], list[int]] = {}
    for i, pair in enumerate(zip(attention_kinds(c), mlp_kinds(c))):
        out.setdefault(pair, []).append(i)
    return {pair: tuple(ix) for pair, ix in out.items()}


def stored(c: KimiLinearHyperparameters) -> str:
    return c.dtype or c.torch_dtype


class KimiLinear(Family):
    name = "kimi_linear"
    model_types = ("kimi_linear",)
    config_class: ClassVar[type] = KimiLinearHyperparameters
    reference = ReferenceBinding("KimiLinearConfig", "KimiLinearForCausalLM", renames=split_fused_experts,
                                 release_names=RELEASE_NAMES, release_splits=RELEASE_SPLITS)
    ref: ClassVar[Reference] = REFERENCE
    symbols: ClassVar[tuple[str, ...]] = SYMBOLS

    def values(self, c: Any) -> dict[str, int | float]:
        return {n: getattr(c, n) for n in self.symbols if getattr(c, n) is not None}

    def check(self, c: KimiLinearHyperparameters) -> list[str]:
        L, E = c.num_hidden_layers, c.num_local_experts
        per_group = E // max(c.n_group, 1)
        att, mlp = attention_kinds(c), mlp_kinds(c)
        return rule_problems([
            (len(att) == L and set(att) <= {LINEAR, FULL}, "layer_types",
             f"must give {L} entries, each '{LINEAR}' or '{FULL}'"),
            (len(mlp) == L and set(mlp) <= {DENSE, SPARSE}, "mlp_layer_types",
             f"must give {L} entries, each '{DENSE}' or '{SPARSE}'"),
            (c.num_key_value_heads in (None, c.num_attention_heads), "num_key_value_heads",
             f"must equal num_attention_heads ({c.num_attention_heads}): MLA expands its latent to every head"),
            (c.num_experts_per_tok <= E, "num_experts_per_tok", f"must be <= num_local_experts ({E})"),
            (E % c.n_group == 0, "n_group", f"must divide num_local_experts ({E}), got {c.n_group}"),
            (c.topk_group <= c.n_group, "topk_group", f"must be in 1..n_group ({c.n_group}), got {c.topk_group}"),
            (c.n_group == 1 or per_group >= 2, "n_group", "groups must hold at least 2 experts (scored by their top 2)"),
            (c.num_experts_per_tok <= c.topk_group * per_group, "num_experts_per_tok",
             "must not exceed the experts in the topk_group selected groups"),
            (c.n_shared_experts >= 1, "n_shared_experts", "must be >= 1: the reference always builds the shared expert"),
            (c.hidden_act == "silu", "hidden_act", f"must be 'silu' (SwiGLU), got {c.hidden_act!r}"),
            (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the family stores lm_head separately"),
            (not c.attention_bias, "attention_bias", "must be false"),
        ]) + fp8_problems(c.quantization_config)

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: KimiLinearHyperparameters, values: dict[str, int | float]) -> Component:
        ctx = Ctx(values, LABELS, self.ref, stored_dtype(stored(c)), fp8_block_storage(c.quantization_config))
        L = c.num_hidden_layers
        kinds = block_kinds(c)
        blocks = tuple(self.block(ctx, c, pair, ix) for pair, ix in kinds.items())
        n_full = attention_kinds(c).count(FULL)
        cite = (self.ref.cite("The model embeds tokens, runs each decoder layer (KDA or MLA as layer_types names it, a "
                              "dense MLP or a mixture of experts as mlp_layer_types names it) and a final RMSNorm.",
                              "Model.__init__"),)
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        children = (
            embedding(ctx, "embed", "Token embedding", weight="model.embed_tokens.weight", citations=cite),
            replace(stack(ctx, blocks, layers=L, citations=cite,
                          description=f"{L} decoder layers: {L - n_full} Kimi Delta Attention and {n_full} latent "
                                      f"attention layers; {mlp_kinds(c).count(DENSE)} with a dense MLP, the rest with "
                                      "a mixture of experts."),
                    inputs=max((b.inputs for b in blocks), key=len)),
            rmsnorm(ctx, "norm", "Final RMSNorm", weight="model.norm.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=c.rms_norm_eps),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", citations=(
                self.ref.cite("lm_head is a separate bias-free Linear to the vocabulary.", "ForCausalLM.__init__"),)),
        )
        root = model_root(ctx, children, code=f"{self.reference.model_class}(config)", layers=L, citations=cite,
                          description=f"A token embedding, {L} decoder layers ({L - n_full} KDA, {n_full} MLA with no "
                                      "positional encoding), a final RMSNorm and an untied LM head.")
        return keep_named_modules_dense(root, c.quantization_config, stored_dtype(stored(c)), self.reference_module,
                                        f"{self.name} config")

    def block(self, ctx: Ctx, c: KimiLinearHyperparameters, pair: tuple[str, str], indices: tuple[int, ...]
              ) -> Component:
        mixer_kind, mlp_kind = pair
        ranges, p = layers(indices), "model.layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps = c.rms_norm_eps

        def norm(key: str, title: str, module: str, xp: Port, yp: Port) -> Component:
            return rmsnorm(ctx, key, title, weight=p + module + ".weight", ranges=ranges, size="hidden_size", x=xp,
                           y=yp, code=f"self.{module}(hidden_states)", eps=eps)

        linear = mixer_kind == LINEAR
        mixer = self.kda(ctx, c, p + "self_attn.", ranges, x_attn) if linear else \
            self.mla(ctx, c, p + "self_attn.", ranges, x_attn)
        ffn = self.moe(ctx, c, p + "mlp.", ranges, x_ffn, delta.latex) if mlp_kind == SPARSE else gated_mlp(
            ctx, "mlp", "SwiGLU MLP", "SwiGLU", prefix=p + "mlp.", ranges=ranges, d_ff=ctx.sym("intermediate_size"),
            ff_dim=ctx.dim("intermediate_size"), x=x_ffn, y=delta, code=f"{self.ref.prefix}MLP(config)",
            description=f"A dense SwiGLU feed-forward network of width {c.intermediate_size:,}.",
            citations=(self.ref.cite("The MLP is down(silu(gate x) ⊙ up x).", "MLP"),))
        mixer_words = "Kimi Delta Attention" if linear else "latent attention with no positional encoding"
        ffn_words = "a mixture of experts" if mlp_kind == SPARSE else "a dense SwiGLU MLP"
        key = f"{'kda' if linear else 'mla'}_{'moe' if mlp_kind == SPARSE else 'dense'}"
        title = f"{'KDA' if linear else 'MLA'} block ({'MoE' if mlp_kind == SPARSE else 'dense MLP'})"
        block = decoder_block(
            ctx, key, title, layer_indices=indices, kind="KDA" if linear else "MLA",
            attn_heading="Kimi Delta Attention" if linear else "Multi-head latent attention (no positions)",
            attn_norm=norm("attn_norm", "Pre-mixer RMSNorm", "input_layernorm", x, x_attn), attn=mixer,
            ffn_norm=norm("ffn_norm", "Pre-FFN RMSNorm", "post_attention_layernorm", x_mid, x_ffn), ffn=ffn,
            citations=(self.ref.cite("A decoder layer runs KDA or MLA (layer_types), then the MLP or MoE "
                                     "(mlp_layer_types), each after an RMSNorm and added to the residual.",
                                     "DecoderLayer"),),
            description=f"{mixer_words[0].upper() + mixer_words[1:]} and {ffn_words}, each added to the residual "
                        f"stream; {layer_label(indices)}.")
        return recurrent_block(block) if linear else block

    def kda(self, ctx: Ctx, c: KimiLinearHyperparameters, prefix: str, ranges, x: Port) -> Component:
        dtype = stored(c)
        o = KDAOptions(c.linear_num_heads, c.linear_num_heads, c.linear_head_dim, c.linear_head_dim,
                       c.linear_conv_kernel_dim, c.rms_norm_eps, conv_dtype=dtype, conv_bytes=DTYPE_SIZES.get(dtype, 2))
        return kda(ctx, prefix=prefix, ranges=ranges, x=x, o=o, citations=(
            self.ref.cite("One depthwise causal convolution of linear_conv_kernel_dim taps runs over q, k and v "
                          "concatenated, with SiLU (the checkpoint's q_conv1d, k_conv1d and v_conv1d, stacked when "
                          "loaded).", "DeltaAttention.__init__"),
            self.ref.cite("The forget gate is f_b_proj(f_a_proj(x)) plus dt_bias, per head and key channel, through "
                          "a softplus scaled by -exp(A_log) of its head.", "ForgetGate.forward"),
            self.ref.cite("The output is RMSNorm(o) · weight · sigmoid(gate), in float32, with the gate "
                          "g_b_proj(g_a_proj(x)).", "RMSNormGated.forward"),
            self.ref.cite("The chunked form carries the state from chunk to chunk, decaying it per key channel.",
                          "chunk_kimi_delta_attention", prefixed=False)))

    def mla(self, ctx: Ctx, c: KimiLinearHyperparameters, prefix: str, ranges, x: Port) -> Component:
        o = MLAOptions(c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim,
                       c.v_head_dim, NormOptions("rms", 1e-6))
        return mla_nope(ctx, prefix=prefix, ranges=ranges, x=x, o=o, citations=(
            self.ref.cite("The attention projects queries, a key-value latent with a key part shared by all heads, "
                          "normalises the latent, expands it to per-head keys and values and attends, rotating "
                          "nothing.", "Attention.forward"),),
            scores_citations=(self.ref.cite("The softmax scale is (qk_nope_head_dim + qk_rope_head_dim)^-0.5.",
                                            "Attention.__init__"),))

    def moe(self, ctx: Ctx, c: KimiLinearHyperparameters, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        ro = RouterOptions(c.num_local_experts, c.num_experts_per_tok, "sigmoid", c.norm_topk_prob,
                           c.routed_scaling_factor, correction_bias=True, n_group=c.n_group, topk_group=c.topk_group)
        gate = router(ctx, weight=prefix + "gate.weight", ranges=ranges, x=x, o=ro, code="KimiLinearTopkRouter(config)",
                      experts_sym="num_local_experts", bias_role="buffer", citations=(
                          self.ref.cite("The router scores experts with a sigmoid, adds e_score_correction_bias for "
                                        "selection only, keeps the top groups, takes the top-k, renormalises and "
                                        "scales by routed_scaling_factor.", "TopkRouter.forward"),))
        experts = routed_experts(ctx, prefix=prefix + "experts.", ranges=ranges, x=x, experts=c.num_local_experts,
                                 k=c.num_experts_per_tok, experts_sym="num_local_experts",
                                 code=f"{self.ref.prefix}Experts(config)", citations=(
                                     self.ref.cite("The routed experts are SwiGLU MLPs of width moe_intermediate_size, "
                                                   "held as 3-D tensors.", "Experts"),))
        shared = shared_expert(ctx, prefix=prefix + "shared_experts.", ranges=ranges, x=x,
                               d_shared=ctx.sym("moe_intermediate_size") * ctx.sym("n_shared_experts"),
                               code=f"{self.ref.prefix}MLP(config, intermediate_size=moe_intermediate_size * "
                                    "n_shared_experts)",
                               citations=(self.ref.cite("The shared expert is one SwiGLU MLP added to the routed "
                                                        "output.", "MoE.forward"),))
        return moe(ctx, x=x, y_latex=y_latex, router_c=gate, expert=experts, shared=shared,
                   code=f"{self.ref.prefix}MoE(config)",
                   citations=(self.ref.cite("The MoE layer sums the weighted selected experts and adds the shared "
                                            "expert.", "MoE.forward"),))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: KimiLinearHyperparameters) -> dict[str, Any]:
        """Small sizes, same structure: a dense KDA layer, an MoE KDA layer and an MoE MLA layer; 2 heads of d_k 8;
        grouped routing where the config groups."""
        grouped = c.n_group > 1
        n_group, topk_group = (4, 2) if grouped else (1, 1)
        return {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "vocab_size": 97,
                "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 3,
                "layer_types": [LINEAR, LINEAR, FULL], "mlp_layer_types": [DENSE, SPARSE, SPARSE],
                "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 48 if c.q_lora_rank else None,
                "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                "n_group": n_group, "topk_group": topk_group, "num_experts_per_tok": 2, "num_local_experts": 8,
                "n_shared_experts": 1, "routed_scaling_factor": c.routed_scaling_factor,
                "norm_topk_prob": c.norm_topk_prob, "linear_num_heads": 2, "linear_head_dim": 8,
                "linear_conv_kernel_dim": c.linear_conv_kernel_dim, "rms_norm_eps": c.rms_norm_eps,
                "max_position_embeddings": 256, "dtype": "float32", "pad_token_id": 0, "bos_token_id": 0,
                "eos_token_id": 1, "quantization_config": None}

    def tiny_label_parts(self, tiny: ModelSpec) -> tuple[str, ...]:
        v = tiny.values
        return (f"KDA {v['linear_num_heads']} heads of d_k {v['linear_head_dim']}",)

    def facts(self, c: KimiLinearHyperparameters) -> tuple[tuple[str, str], ...]:
        att = attention_kinds(c)
        return (("decoder layers", f"{c.num_hidden_layers} ({att.count(LINEAR)} KDA, {att.count(FULL)} MLA)"),
                ("routed experts", f"{c.num_local_experts} (top {c.num_experts_per_tok})"),
                ("attention heads", f"{c.num_attention_heads} MLA, {c.linear_num_heads} KDA"),
                ("vocabulary", f"{c.vocab_size:,}"))


FAMILY = KimiLinear()
