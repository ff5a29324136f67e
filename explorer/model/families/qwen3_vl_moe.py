"""The Qwen3-VL mixture-of-experts family (Qwen3-VL-30B-A3B, Qwen3-VL-235B-A22B): Qwen3-MoE's decoder (grouped-query
attention with QK-norm, 128 SwiGLU experts under a softmax top-8 router in every layer, no shared expert) as the text
model, with what the dense Qwen3-VL family adds: interleaved multimodal RoPE, DeepStack and the vision tower
(VisionLanguage, explorer/model/families/qwen3_vl.py). Unlike Qwen3-MoE's, the checkpoint stores each layer's experts
fused, input axis first (mlp.experts.gate_up_proj [E, d, 2·I], gate half first, and mlp.experts.down_proj [E, I, d]):
the spec names and shapes them so (parallel_moe's halves experts, in_out), and transformers' conversion mapping for
qwen3_vl_moe transposes them to what its model holds.

transformers 5.23 always renormalises the selected experts' probabilities (Qwen3VLMoeTextTopKRouter); its config
class has no norm_topk_prob, which the published files set to true, so the family requires it true.

References: the Qwen3-VL technical report (arXiv:2511.21631); Qwen3 Technical Report (arXiv:2505.09388) for the
MoE decoder; transformers' models/qwen3_vl_moe/modeling_qwen3_vl_moe.py (the reference binding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port
from explorer.model.components.fused_experts import fused_moe
from explorer.model.components.parallel_moe import HalvesExpertsOptions, halves_experts
from explorer.model.components.qwen_vision import LABELS as VISION_LABELS
from explorer.model.families.base import Hyperparameters, ReferenceBinding, as_published, rule_problems
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.qwen3_moe import Qwen3Moe
from explorer.model.families.qwen3_vl import TINY_TEXT, MRopeScaling, Qwen3VLVisionHyperparameters, VisionLanguage
from explorer.model.families.renames import transpose_fused_experts
from explorer.model.families.sparse import LABELS
from explorer.spec.types import Citation, Component

FILE = "models/qwen3_vl_moe/modeling_qwen3_vl_moe.py"


@dataclass(frozen=True, slots=True)
class Qwen3VLMoeTextHyperparameters:
    """Qwen3VLMoeTextConfig's keys, named as published; absent keys take its defaults (transformers 5.23)."""

    vocab_size: int = 151_936
    hidden_size: int = 2048
    intermediate_size: int = 5632
    """The dense MLP's width in layers mlp_only_layers names (none in the published configs)."""
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 16
    head_dim: int | None = None
    """None: hidden_size / num_attention_heads."""
    hidden_act: str = "silu"
    max_position_embeddings: int = 128_000
    rms_norm_eps: float = 1e-6
    rope_theta: float = 500_000.0
    """Qwen3VLMoeTextConfig's default_theta where the file gives no base."""
    rope_scaling: MRopeScaling | None = None
    attention_bias: bool = False
    decoder_sparse_step: int = 1
    moe_intermediate_size: int = 1408
    num_experts_per_tok: int = 4
    num_experts: int = 60
    norm_topk_prob: bool = True
    """Published as true; transformers 5.23 always renormalises (its config class removes the key)."""
    mlp_only_layers: tuple[int, ...] = ()
    tie_word_embeddings: bool = True
    """The text config class's own default; the head is tied by the top-level key, false in both files."""
    dtype: str = "bfloat16"
    # Informational keys: recorded as published, not used by the spec.
    model_type: str = "qwen3_vl_moe_text"
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    use_cache: bool = True
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class Qwen3VLMoeVisionHyperparameters(Qwen3VLVisionHyperparameters):
    """Qwen3VLMoeVisionConfig: the dense tower's keys and defaults, under its own model type."""

    model_type: str = "qwen3_vl_moe_vision"
    """The files publish "qwen3_vl_moe"; Qwen3VLMoeConfig reads that as qwen3_vl_moe_vision."""


@dataclass(frozen=True, slots=True)
class Qwen3VLMoeHyperparameters(Hyperparameters):
    """Qwen3VLMoeConfig: the text and vision configs and the special token ids."""

    text_config: Qwen3VLMoeTextHyperparameters
    vision_config: Qwen3VLMoeVisionHyperparameters
    tie_word_embeddings: bool = False
    image_token_id: int = 151_655
    video_token_id: int = 151_656
    vision_start_token_id: int = 151_652
    vision_end_token_id: int = 151_653
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, read as the Qwen3-MoE family reads it (none of the published files sets it)."""
    architectures: tuple[str, ...] = ()
    model_type: str = "qwen3_vl_moe"
    transformers_version: str = ""


class Qwen3VLMoe(VisionLanguage, Qwen3Moe):
    """Qwen3VLMoeForConditionalGeneration."""

    name = "qwen3_vl_moe"
    model_types = ("qwen3_vl_moe",)
    config_class: ClassVar[type] = Qwen3VLMoeHyperparameters
    text_class: ClassVar[type] = Qwen3VLMoeTextHyperparameters
    # the checkpoint stores each layer's experts fused, input axis first (gate_up_proj [E, d, 2·I], down_proj
    # [E, I, d]); transformers' conversion mapping for qwen3_vl_moe transposes them to the [E, 2·I, d] and [E, d, I]
    # it holds (Transpose(1, 2), only where the shapes differ): transpose_fused_experts undoes exactly that
    reference = ReferenceBinding("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration",
                                 renames=transpose_fused_experts)
    ref = Reference(FILE, "Qwen3VLMoeText")
    vision_ref: ClassVar[Reference] = Reference(FILE, "Qwen3VLMoe")
    symbols = Qwen3Moe.symbols + tuple(VISION_LABELS)
    labels: ClassVar[dict[str, str]] = {**LABELS, **VISION_LABELS}

    def check(self, c: Any) -> list[str]:
        return Qwen3Moe.check(self, c) + self.vision_language_problems(c) + rule_problems([
            (self.text(c).norm_topk_prob, "text_config.norm_topk_prob",
             "must be true: transformers 5.23 always renormalises the selected experts' probabilities"),
        ])

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        """Qwen3-MoE's router over the routed experts as the checkpoint stores them: fused, input axis first."""
        gate = super().moe(ctx, c, prefix, ranges, x, y_latex).child("router")
        E = c.num_experts
        experts = halves_experts(
            ctx, prefix=prefix + "mlp.experts.", ranges=ranges, x=x, gates=gate.outputs[0],
            o=HalvesExpertsOptions(E, "silu", in_out=True), experts_sym="num_experts", width="moe_intermediate_size",
            code=f"{self.ref.prefix}Experts(config)", citations=(
                self.ref.cite("The experts hold gate_up_proj [E, 2·I, d] and down_proj [E, d, I]; each expert's "
                              "gate_up output splits into the gate half, then the up half.", "Experts"),
                Citation("The checkpoint's mlp.experts.gate_up_proj and down_proj are transposed on loading "
                         "(Transpose(1, 2), where the stored shape is not the model's).", "transformers",
                         "_build_checkpoint_conversion_mapping", "conversion_mapping.py", lines=(1361, 1372))))
        return fused_moe(x=x, y_latex=y_latex, router_c=gate, experts_c=experts,
                         code=f"{self.ref.prefix}SparseMoeBlock(config)", citations=(
                             self.ref.cite("The sparse MoE block routes each token to its top-k experts and sums "
                                           "their outputs weighted by the router; there is no shared expert.",
                                           "SparseMoeBlock"),))

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """The dense family's tiny text model with 4 experts of width 48, top 2, and its tower. Not 32: with
        hidden_size = 2 × moe_intermediate_size the stored gate_up [E, d, 2·I] has transformers' own shape, and its
        loader transposes only where the shapes differ (Transpose(1, 2, check_dims=True))."""
        raw = as_published(c)
        raw["text_config"].update(TINY_TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                  intermediate_size=96)
        return self.tiny_vision(raw)

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return super().facts(c) + self.vision_facts(c)


FAMILY = Qwen3VLMoe()
