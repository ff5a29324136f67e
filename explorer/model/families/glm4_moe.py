"""The GLM-4-MoE family (GLM-4.5, GLM-4.6, GLM-4.7): DeepSeek-V3's layout (explorer/model/families/deepseek_v3.py: the
first first_k_dense_replace blocks dense, the rest a mixture of routed SwiGLU experts under a sigmoid router with a
selection-only correction bias, plus a shared expert) around grouped-query attention instead of latent attention:
separate q, k, v projections (with biases when attention_bias is set), an optional per-head QK-norm (use_qk_norm),
and partial rotary, the first head_dim × partial_rotary_factor features of each head rotated as two halves, the
rest passed through.

The reference registers the routers' e_score_correction_bias as a persistent buffer, so the parameter total is
transformers' own count and the buffers are listed beside it. The config class also declares multi-token-
prediction layers (num_nextn_predict_layers, 1 by default), which transformers does not build; they are counted from
the config (`declared_mtp`), apart from the main model, and never run.

References: "GLM-4.5: Agentic, Reasoning, and Coding (ARC) Foundation Models" (arXiv:2508.06471); transformers'
models/glm4_moe/modeling_glm4_moe.py (the reference binding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.attention import ScoresOptions, attention
from explorer.model.components.base import Port
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router, shared_expert
from explorer.model.families.base import (
    DIM_LABELS,
    PublishedMetadata,
    ReferenceBinding,
    RopeScaling,
    as_published,
    rope_options,
    rope_scaling_problems,
    rule_problems,
    stored_dtype,
)
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_block_storage,
    fp8_problems,
    keep_named_modules_dense,
)
from explorer.model.families.deepseek_v3 import DeepseekV3
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Component, DeclaredMTP, TensorRole

REFERENCE = Reference("models/glm4_moe/modeling_glm4_moe.py", "Glm4Moe")


@dataclass(frozen=True, slots=True)
class RopeParameters(RopeScaling):
    """config.json "rope_parameters": the rotary base, the rotated share of each head, the scaling variant."""

    rope_theta: float | None = None
    partial_rotary_factor: float | None = None


@dataclass(frozen=True, slots=True)
class Glm4MoeHyperparameters(PublishedMetadata):
    """config.json keys of Glm4MoeConfig, named as published; absent keys take Glm4MoeConfig's defaults."""

    vocab_size: int = 151552
    hidden_size: int = 4096
    intermediate_size: int = 10944
    """Width of the dense MLP of the first first_k_dense_replace blocks."""
    num_hidden_layers: int = 46
    num_attention_heads: int = 96
    num_key_value_heads: int = 8
    head_dim: int | None = None
    """Not a field of Glm4MoeConfig: the reference reads it where published, else hidden_size // num_attention_heads."""
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_parameters: RopeParameters | None = None
    """None: Glm4MoeConfig's default, rope_theta 10000 with partial_rotary_factor 0.5 (see rope_settings)."""
    attention_bias: bool = False
    moe_intermediate_size: int = 1408
    num_experts_per_tok: int = 8
    n_shared_experts: int = 1
    n_routed_experts: int = 128
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    first_k_dense_replace: int = 1
    norm_topk_prob: bool = True
    use_qk_norm: bool = False
    num_nextn_predict_layers: int = 1
    """Glm4MoeConfig's num_mtp_layers (an attribute_map alias): declared, not built by transformers."""
    torch_dtype: str = "bfloat16"
    dtype: str | None = None
    """The newer name of torch_dtype; where published it is the stored dtype."""
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, modules_to_not_convert applied (explorer/model/families/block_fp8.py)."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    output_router_logits: bool = False


DEFAULT_THETA, DEFAULT_PARTIAL = 10000.0, 0.5
"""What Glm4MoeConfig fills in when rope_parameters is not published (its __post_init__ sets partial_rotary_factor
0.5 "for BC"; the base class's rope_theta default is 10000)."""


def rope_settings(c: Any) -> tuple[float, float]:
    """rope_theta and partial_rotary_factor as the reference config ends up with them."""
    r = c.rope_parameters
    theta = r.rope_theta if r is not None and r.rope_theta is not None else DEFAULT_THETA
    partial = r.partial_rotary_factor if r is not None and r.partial_rotary_factor is not None else DEFAULT_PARTIAL
    return theta, partial


def head_width(c: Any) -> int:
    return c.head_dim or c.hidden_size // c.num_attention_heads


def rotary_width(c: Any) -> int:
    """Rotated features per head, as Glm4MoeRotaryEmbedding computes them: int(head_dim × partial_rotary_factor)."""
    return int(head_width(c) * rope_settings(c)[1])


def moe_rules(c: Any) -> list[tuple[bool, str, str]]:
    """The router, the experts, the activation and the head: what GLM-4-MoE and GLM-4-MoE-Lite share."""
    per_group = c.n_routed_experts // max(c.n_group, 1)
    return [
        (c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
         f"must be <= n_routed_experts ({c.n_routed_experts}), got {c.num_experts_per_tok}"),
        (c.n_routed_experts % c.n_group == 0, "n_group",
         f"must divide n_routed_experts ({c.n_routed_experts}), got {c.n_group}"),
        (c.topk_group <= c.n_group, "topk_group", f"must be in 1..n_group ({c.n_group}), got {c.topk_group}"),
        (c.n_group == 1 or per_group >= 2, "n_group", "groups must hold at least 2 experts (scored by their top 2)"),
        (c.num_experts_per_tok <= c.topk_group * per_group, "num_experts_per_tok",
         "must not exceed the experts in the topk_group selected groups"),
        (c.n_shared_experts >= 1, "n_shared_experts", "must be >= 1: the reference always builds the shared "
         f"expert (width moe_intermediate_size × n_shared_experts), got {c.n_shared_experts}"),
        (c.hidden_act == "silu", "hidden_act", f"must be 'silu' (SwiGLU), got {c.hidden_act!r}"),
        (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the family stores lm_head separately"),
    ]


class Glm4Moe(DeepseekV3):
    name = "glm4_moe"
    model_types = ("glm4_moe",)
    config_class: ClassVar[type] = Glm4MoeHyperparameters
    reference = ReferenceBinding("Glm4MoeConfig", "Glm4MoeForCausalLM", renames=split_fused_experts)
    ref: ClassVar[Reference] = REFERENCE
    attn_heading: ClassVar[str] = "Grouped-query attention"
    attn_short: ClassVar[str] = "Grouped-query attention"
    correction_bias_role: ClassVar[TensorRole] = "buffer"
    symbols: ClassVar[tuple[str, ...]] = (
        "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
        "num_key_value_heads", "head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok")

    def defaulted_value(self, c: Any, key: str) -> Any:
        if key == "rope_parameters" and c.rope_parameters is None:  # what Glm4MoeConfig standardises None to
            theta, partial = rope_settings(c)
            return {"rope_theta": theta, "partial_rotary_factor": partial, "rope_type": "default"}
        return super().defaulted_value(c, key)

    def default_source(self, key: str) -> str:
        if key == "quantization_config":
            return "none: no quantized layout, every weight stored in torch_dtype"
        return super().default_source(key)

    def values(self, c: Any) -> dict[str, int | float]:
        return {**{n: getattr(c, n) for n in self.symbols if getattr(c, n) is not None}, "head_dim": head_width(c)}

    def check(self, c: Any) -> list[str]:
        rotary = rotary_width(c)
        return rule_problems(moe_rules(c) + [
            (0 <= c.first_k_dense_replace <= c.num_hidden_layers, "first_k_dense_replace",
             f"must be in 0..num_hidden_layers ({c.num_hidden_layers}), got {c.first_k_dense_replace}"),
            (c.num_attention_heads % c.num_key_value_heads == 0, "num_key_value_heads",
             f"must divide num_attention_heads ({c.num_attention_heads}), got {c.num_key_value_heads}"),
            (2 <= rotary <= head_width(c) and rotary % 2 == 0, "rope_parameters.partial_rotary_factor",
             f"must rotate an even number of features in 2..head_dim ({head_width(c)}), got {rotary}"),
        ]) + rope_scaling_problems(c.rope_parameters, "rope_parameters") + fp8_problems(c.quantization_config)

    def quantized_storage(self, c: Any) -> Any:
        return fp8_block_storage(c.quantization_config)

    def with_fp8_exclusions(self, root: Component, c: Any) -> Component:
        """The tree with the modules quantization_config.modules_to_not_convert names kept in the model's dtype."""
        dtype = stored_dtype(c.dtype or c.torch_dtype)
        return keep_named_modules_dense(root, c.quantization_config, dtype, self.reference_module, f"{self.name} config")

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        # DeepSeek-V3's composition without its MTP module: transformers builds none for this family.
        root = super().build(replace(c, num_nextn_predict_layers=0, torch_dtype=c.dtype or c.torch_dtype), values)
        root = self.with_fp8_exclusions(root, c)
        return root

    def declared_mtp(self, c: Any, values: dict[str, int | float]) -> DeclaredMTP | None:
        """The num_nextn_predict_layers layers (Glm4MoeConfig's num_mtp_layers), built as DeepSeek-V3's MTP module
        of this family's blocks, GLM-5's layout, outside the tree: transformers builds none for this family (GLM-4-MoE-Lite's config has
        no such key)."""
        if not getattr(c, "num_nextn_predict_layers", 0):
            return None
        whole = self.with_fp8_exclusions(super().build(replace(c, torch_dtype=c.dtype or c.torch_dtype), values), c)
        copies = 2 * int(values["vocab_size"]) * int(values["hidden_size"])
        return DeclaredMTP("num_nextn_predict_layers", c.num_nextn_predict_layers, replace(whole.child("mtp"), repeat=1), (
            "transformers builds no multi-token-prediction layer for this family (it ignores their stored tensors "
            "when loading), so they are counted from the config with the layout this project gives GLM-5's: "
            "DeepSeek-V3's MTP module over a decoder layer of this model's MoE kind, stored as layers "
            f"{c.num_hidden_layers}.. after the main ones. It includes the copies of the token embedding and the LM "
            f"head that DeepSeek-V3's checkpoint stores in its MTP layer ({copies:,} together); no tensor listing of "
            "GLM's release is recorded, so whether it stores them is not settled here, and without them the module "
            "holds that many fewer."))

    def attention(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port) -> Component:
        theta, _ = rope_settings(c)
        D, rotary = head_width(c), rotary_width(c)
        ro = replace(rope_options(theta, rotary, c.rope_parameters, "half", c.max_position_embeddings),
                     unrotated_tail=D - rotary)
        so = ScoresOptions(c.num_attention_heads, c.num_key_value_heads, D ** -0.5)
        return attention(ctx, prefix=prefix, ranges=ranges, x=x, rope_options=ro, scores_options=so,
                         bias=c.attention_bias, qk_norm_eps=c.rms_norm_eps if c.use_qk_norm else None, citations=(
                             self.ref.cite("Attention projects queries, keys and values (with biases when "
                                           "attention_bias is set), normalises each head with q_norm and k_norm "
                                           "when use_qk_norm is set, rotates and attends.", "Attention"),
                             self.ref.cite("apply_rotary_pos_emb rotates the first rotary_dim features of each head "
                                           "as two halves and passes the rest through.", "apply_rotary_pos_emb",
                                           prefixed=False),
                             self.ref.cite("The rotary frequencies cover head_dim × partial_rotary_factor features.",
                                           "RotaryEmbedding.compute_default_rope_parameters")))

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        ro = RouterOptions(c.n_routed_experts, c.num_experts_per_tok, "sigmoid", c.norm_topk_prob,
                           c.routed_scaling_factor, correction_bias=True, n_group=c.n_group, topk_group=c.topk_group)
        gate = router(ctx, weight=prefix + "gate.weight", ranges=ranges, x=x, o=ro, code=f"{self.ref.prefix}TopkRouter"
                      "(config)", bias_role=self.correction_bias_role, citations=(
                          self.ref.cite("The router scores experts with a sigmoid, adds e_score_correction_bias only "
                                        "to choose them (within the topk_group best of n_group groups), weights the "
                                        "chosen by their scores, normalised when norm_topk_prob is set, and scales "
                                        "by routed_scaling_factor.", "TopkRouter"),))
        experts = routed_experts(ctx, prefix=prefix + "experts.", ranges=ranges, x=x, experts=c.n_routed_experts,
                                 k=c.num_experts_per_tok, code=f"{self.ref.prefix}Experts(config)", citations=(
                                     self.ref.cite("Each routed expert is a SwiGLU MLP of width moe_intermediate_size; "
                                                   "transformers fuses the gate and up weights into gate_up_proj.",
                                                   "Experts"),))
        shared = shared_expert(ctx, prefix=prefix + "shared_experts.", ranges=ranges, x=x,
                               d_shared=ctx.sym("moe_intermediate_size") * ctx.sym("n_shared_experts"),
                               code=f"{self.ref.prefix}MLP(config, intermediate_size=moe_intermediate_size * "
                                    "n_shared_experts)", citations=(
                                   self.ref.cite("The shared expert is one SwiGLU MLP of width moe_intermediate_size × "
                                                 "n_shared_experts, run on every token.", "MoE.__init__"),))
        return moe(ctx, x=x, y_latex=y_latex, router_c=gate, expert=experts, shared=shared,
                   code=f"{self.ref.prefix}MoE(config)", citations=(
                       self.ref.cite("The MoE block adds the shared expert's output to the routed experts' weighted "
                                     "sum.", "MoE.forward"),))

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: a dense block then an MoE block, 4 query heads over 2 key/value heads of 16
        features with the same rotated share, top 2 of 8 experts (of 4 groups of 2 where the config groups them)."""
        grouped = c.n_group > 1
        raw = {f.name: as_published(getattr(c, f.name)) for f in dataclasses.fields(c)}
        raw.update(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                   num_hidden_layers=min(c.first_k_dense_replace, 1) + 1,
                   first_k_dense_replace=min(c.first_k_dense_replace, 1), num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
                   n_group=4 if grouped else 1, topk_group=2 if grouped else 1, num_nextn_predict_layers=0,
                   max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=None,
                   quantization_config=None)
        return raw

    def dim_labels(self) -> dict[str, str]:
        return DIM_LABELS

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return (("transformer blocks", f"{c.num_hidden_layers:,} ({c.first_k_dense_replace} dense)"),
                ("routed experts", f"{c.n_routed_experts} (top {c.num_experts_per_tok}) + {c.n_shared_experts} shared"),
                ("attention heads", f"{c.num_attention_heads} query, {c.num_key_value_heads} key/value"),
                ("rotary features", f"{rotary_width(c)} of {head_width(c)} per head"),
                ("vocabulary", f"{c.vocab_size:,}"))


FAMILY = Glm4Moe()
