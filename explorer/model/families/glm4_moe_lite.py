"""The GLM-4-MoE-Lite family (GLM-4.7-Flash): GLM-4-MoE's mixture of experts (explorer/model/families/glm4_moe.py: a
sigmoid router with a selection-only correction bias, a shared expert, dense blocks first) around DeepSeek-V3's
multi-head latent attention (explorer/model/components/mla.py) in place of grouped-query attention.

Three things the reference does its own way: which blocks are dense is read from mlp_layer_types (by default the
first dense, the rest sparse), not from first_k_dense_replace, which the published config carries and the reference
ignores (checked here to agree); head_dim is an alias of qk_rope_head_dim; and the rotary features of the MLA
queries and keys rotate as adjacent pairs when rope_interleave is set (the default), as the two halves otherwise.

References: transformers' models/glm4_moe_lite/modeling_glm4_moe_lite.py (the reference binding); DeepSeek-V2
(arXiv:2405.04434) for multi-head latent attention.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port
from explorer.model.components.mla import MLAOptions, mla
from explorer.model.components.norms import NormOptions
from explorer.model.components.rope import Pairing
from explorer.model.families.base import (
    PublishedMetadata,
    ReferenceBinding,
    as_published,
    rope_options,
    rope_scaling_problems,
    rule_problems,
)
from explorer.model.families.block_fp8 import FP8QuantizationConfig, fp8_problems
from explorer.model.families.deepseek_v3 import DeepseekV3
from explorer.model.families.glm4_moe import DEFAULT_THETA, Glm4Moe, RopeParameters, moe_rules
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Component

REFERENCE = Reference("models/glm4_moe_lite/modeling_glm4_moe_lite.py", "Glm4MoeLite")


@dataclass(frozen=True, slots=True)
class Glm4MoeLiteHyperparameters(PublishedMetadata):
    """config.json keys of Glm4MoeLiteConfig, named as published; absent keys take Glm4MoeLiteConfig's defaults."""

    vocab_size: int = 154880
    hidden_size: int = 2048
    intermediate_size: int = 10240
    """Width of the dense MLP of the blocks mlp_layer_types calls dense."""
    moe_intermediate_size: int = 1536
    num_hidden_layers: int = 47
    num_attention_heads: int = 20
    num_key_value_heads: int = 20
    """Informational: MLA's keys and values come from one latent per token; the reference builds nothing from it."""
    n_shared_experts: int = 1
    n_routed_experts: int = 64
    routed_scaling_factor: float = 1.8
    kv_lora_rank: int = 512
    q_lora_rank: int | None = 768
    qk_rope_head_dim: int = 64
    v_head_dim: int = 256
    qk_nope_head_dim: int = 192
    n_group: int = 1
    topk_group: int = 1
    num_experts_per_tok: int = 4
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: int = 202752
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_parameters: RopeParameters | None = None
    """None: rope_theta 10000, every rotary feature rotated (no partial_rotary_factor)."""
    rope_interleave: bool = True
    mlp_layer_types: tuple[str, ...] | None = None
    """Per layer "dense" or "sparse"; None: the first dense, the rest sparse."""
    attention_bias: bool = False
    torch_dtype: str = "bfloat16"
    dtype: str | None = None
    quantization_config: FP8QuantizationConfig | None = None
    first_k_dense_replace: int | None = None
    """Not read by the reference (mlp_layer_types decides); where published it must agree with mlp_layer_types."""
    head_dim: int | None = None
    """An alias of qk_rope_head_dim in the reference (attribute_map); where published it must equal it."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = 0
    eos_token_id: int | tuple[int, ...] | None = 1
    pretraining_tp: int = 1
    output_router_logits: bool = False


def mlp_layer_types(c: Any) -> tuple[str, ...]:
    """Each layer's FFN kind, as Glm4MoeLiteConfig derives it when mlp_layer_types is not published."""
    if c.mlp_layer_types is not None:
        return c.mlp_layer_types
    return ("dense",) + ("sparse",) * (c.num_hidden_layers - 1)


def dense_prefix(c: Any) -> int:
    """How many leading layers are dense."""
    kinds = mlp_layer_types(c)
    return next((i for i, kind in enumerate(kinds) if kind != "dense"), len(kinds))


class Glm4MoeLite(Glm4Moe):
    name = "glm4_moe_lite"
    model_types = ("glm4_moe_lite",)
    config_class = Glm4MoeLiteHyperparameters
    reference = ReferenceBinding("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", renames=split_fused_experts,
                                 config_skip=("quantization_config", "auto_map", "architectures", "head_dim"))
    # head_dim is not handed over: the reference maps it onto qk_rope_head_dim, so an unset one would unset that.
    ref: ClassVar[Reference] = REFERENCE
    attn_heading: ClassVar[str] = "Multi-head latent attention"
    attn_short: ClassVar[str] = "MLA"
    symbols = DeepseekV3.symbols

    def values(self, c: Any) -> dict[str, int | float]:
        return DeepseekV3.values(self, c)

    def defaulted_value(self, c: Any, key: str) -> Any:
        if key == "rope_parameters" and c.rope_parameters is None:  # what Glm4MoeLiteConfig standardises None to
            return {"rope_theta": DEFAULT_THETA, "rope_type": "default"}
        if key == "mlp_layer_types" and c.mlp_layer_types is None:
            return list(mlp_layer_types(c))
        return getattr(c, key)

    def check(self, c: Any) -> list[str]:
        kinds = mlp_layer_types(c)
        k = dense_prefix(c)
        partial = c.rope_parameters.partial_rotary_factor if c.rope_parameters is not None else None
        return rule_problems(moe_rules(c) + [
            (len(kinds) == c.num_hidden_layers and set(kinds) <= {"dense", "sparse"}, "mlp_layer_types",
             f"must name 'dense' or 'sparse' for each of the {c.num_hidden_layers} layers"),
            (all(kind == "sparse" for kind in kinds[k:]), "mlp_layer_types",
             "dense layers must come first: dense blocks between sparse ones are not built by this family yet"),
            (c.first_k_dense_replace is None or c.first_k_dense_replace == k, "first_k_dense_replace",
             f"the reference ignores it and makes the first {k} layer(s) dense (mlp_layer_types); got "
             f"{c.first_k_dense_replace}"),
            (c.head_dim is None or c.head_dim == c.qk_rope_head_dim, "head_dim",
             f"is qk_rope_head_dim in the reference ({c.qk_rope_head_dim}), got {c.head_dim}"),
            (partial in (None, 1.0), "rope_parameters.partial_rotary_factor",
             "must be 1 or absent: MLA rotates all qk_rope_head_dim features"),
            (c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", f"must be even (rotary pairs), got {c.qk_rope_head_dim}"),
            (not c.attention_bias, "attention_bias", "must be false: the library's MLA has no projection biases"),
        ]) + rope_scaling_problems(c.rope_parameters, "rope_parameters") + fp8_problems(c.quantization_config)

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        root = DeepseekV3.build(self, replace(c, first_k_dense_replace=dense_prefix(c),
                                              torch_dtype=c.dtype or c.torch_dtype), values)
        root = self.with_fp8_exclusions(root, c)
        return replace(root, notes=root.notes + (
            f"transformers ignores stored tensors of a layer {c.num_hidden_layers} (model.layers."
            f"{c.num_hidden_layers}.*) when loading, where a checkpoint of this family may keep a multi-token-"
            "prediction layer; the config declares none, the reference builds none, and none is described here.",))

    def attention(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port) -> Component:
        theta = c.rope_parameters.rope_theta if c.rope_parameters and c.rope_parameters.rope_theta else DEFAULT_THETA
        pairing: Pairing = "interleaved" if c.rope_interleave else "half"
        opts = MLAOptions(c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
                          c.qk_rope_head_dim, c.v_head_dim, NormOptions("rms", 1e-6))
        ro = rope_options(theta, c.qk_rope_head_dim, c.rope_parameters, pairing, c.max_position_embeddings)
        how = "adjacent pairs (rope_interleave)" if c.rope_interleave else "the two halves"
        return mla(ctx, prefix=prefix, ranges=ranges, x=x, o=opts, rope_options=ro, citations=(
            self.ref.cite("Attention compresses queries through q_a_proj, q_a_layernorm and q_b_proj, and keys and "
                          "values through kv_a_proj_with_mqa (latent plus one shared rotary key), kv_a_layernorm and "
                          f"kv_b_proj; the rotary parts rotate as {how}.", "Attention"),),
            rope_citations=(), scores_citations=(
                self.ref.cite("The softmax scale is (qk_nope_head_dim + qk_rope_head_dim)^-0.5 (times YaRN's mscale "
                              "where rope_parameters asks for it).", "Attention.__init__"),))

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: one dense block then one MoE block, MLA of 4 heads, top 2 of 8 experts."""
        raw = {f.name: as_published(getattr(c, f.name)) for f in dataclasses.fields(c)}
        grouped = c.n_group > 1
        raw.update(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                   mlp_layer_types=["dense", "sparse"] if dense_prefix(c) else ["sparse", "sparse"],
                   first_k_dense_replace=None, head_dim=None, num_attention_heads=4, num_key_value_heads=4,
                   q_lora_rank=48 if c.q_lora_rank else None, kv_lora_rank=32, qk_nope_head_dim=16,
                   qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
                   n_group=4 if grouped else 1, topk_group=2 if grouped else 1, max_position_embeddings=256,
                   bos_token_id=0, eos_token_id=1, pad_token_id=None, quantization_config=None)
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return (("transformer blocks", f"{c.num_hidden_layers:,} ({dense_prefix(c)} dense)"),
                ("routed experts", f"{c.n_routed_experts} (top {c.num_experts_per_tok}) + {c.n_shared_experts} shared"),
                ("attention", f"MLA, {c.num_attention_heads} heads, latent {c.kv_lora_rank}"),
                ("vocabulary", f"{c.vocab_size:,}"))


FAMILY = Glm4MoeLite()
