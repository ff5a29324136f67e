"""The Qwen3-MoE family (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's grouped-query attention with QK-norm, and in
every block 128 fine-grained SwiGLU experts under a softmax top-k router, renormalised over the selected experts
when norm_topk_prob is set; no shared expert.

References: Qwen3 Technical Report (arXiv:2505.09388), section 2; transformers'
models/qwen3_moe/modeling_qwen3_moe.py (the reference binding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router
from explorer.model.families.base import (
    PublishedMetadata,
    ReferenceBinding,
    RopeScaling,
    rope_scaling_problems,
    rule_problems,
)
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.renames import split_fused_experts
from explorer.model.families.sparse import SparseMoE
from explorer.spec.types import Component

REFERENCE = Reference("models/qwen3_moe/modeling_qwen3_moe.py", "Qwen3Moe")


@dataclass(frozen=True, slots=True)
class Qwen3MoeHyperparameters(PublishedMetadata):
    """config.json keys of Qwen3MoeConfig, named as published; absent keys take Qwen3MoeConfig's defaults."""

    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    num_experts: int
    num_experts_per_tok: int
    intermediate_size: int = 6144
    """Width of the dense MLP of layers in mlp_only_layers (none in the published configs)."""
    head_dim: int | None = None
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False
    use_sliding_window: bool = False
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8: every projection, experts included, in FP8 with a scale per block (explorer/model/families/sparse.py)."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    max_window_layers: int = 28
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001


class Qwen3Moe(SparseMoE):
    name = "qwen3_moe"
    model_types = ("qwen3_moe",)
    config_class: ClassVar[type] = Qwen3MoeHyperparameters
    # transformers' conversion mapping for qwen3_moe (the qwen2_moe entry of conversion_mapping.py) merges
    # mlp.experts.{e}.gate_proj and up_proj into mlp.experts.gate_up_proj (Concatenate(dim=1), gate first) and the
    # down_proj weights into mlp.experts.down_proj: split_fused_experts undoes exactly that.
    reference = ReferenceBinding("Qwen3MoeConfig", "Qwen3MoeForCausalLM", renames=split_fused_experts)
    ref = REFERENCE
    experts_key = "num_experts"
    width_key = "moe_intermediate_size"
    qk_norm = True
    symbols: ClassVar[tuple[str, ...]] = ("vocab_size", "hidden_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "num_experts", "num_experts_per_tok")

    def check(self, c: Any) -> list[str]:
        t, key = self.text(c), self.text_key
        return super().check(c) + rule_problems([
            (not t.mlp_only_layers, key + "mlp_only_layers", "must be empty: dense layers between MoE layers are not "
             "built by this family yet"),
            (t.decoder_sparse_step == 1, key + "decoder_sparse_step",
             f"must be 1 (every layer MoE), got {t.decoder_sparse_step}"),
            # Qwen3-VL-MoE's text config has no sliding_window key (its class sets it to None)
            (getattr(t, "sliding_window", None) is None, key + "sliding_window", "must be null: the published "
             "Qwen3-MoE configs attend over the whole context"),
        ]) + rope_scaling_problems(t.rope_scaling, key + "rope_scaling")

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        p = prefix + "mlp."
        E, k = c.num_experts, c.num_experts_per_tok
        renorm = ("divides the k selected probabilities by their sum (norm_topk_prob)" if c.norm_topk_prob
                  else "keeps the k selected probabilities as they are (norm_topk_prob false)")
        gate = router(ctx, weight=p + "gate.weight", ranges=ranges, x=x,
                      o=RouterOptions(E, k, "softmax", c.norm_topk_prob), code=f"{self.ref.prefix}TopKRouter(config)",
                      experts_sym="num_experts", citations=(
                          self.ref.cite(f"The router takes a softmax over all experts' logits, keeps the top k and "
                                         f"{renorm}.", "TopKRouter"),))
        experts = routed_experts(ctx, prefix=p + "experts.", ranges=ranges, x=x, experts=E, k=k,
                                 code=f"{self.ref.prefix}Experts(config)", experts_sym="num_experts",
                                 width="moe_intermediate_size", citations=(
                                     self.ref.cite("Each expert is a SwiGLU MLP of width moe_intermediate_size; "
                                                    "transformers fuses the gate and up weights into gate_up_proj.",
                                                    "Experts"),))
        return moe(ctx, x=x, y_latex=y_latex, router_c=gate, expert=experts, shared=None,
                   code=f"{self.ref.prefix}SparseMoeBlock(config)", citations=(
                       self.ref.cite("The sparse MoE block routes each token to its top-k experts and sums their "
                                      "outputs weighted by the router; there is no shared expert.", "SparseMoeBlock"),))

    def tiny_config(self, c: Any) -> dict[str, Any]:
        raw = self.tiny_sizes(c)
        raw.update(intermediate_size=96, max_window_layers=2)
        return raw


FAMILY = Qwen3Moe()
