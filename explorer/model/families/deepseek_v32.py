"""The DeepSeek-V3.2 family: DeepSeek-V3 (multi-head latent attention, sigmoid-routed experts with a correction bias
and group-limited top-k, shared experts, dense first blocks, a multi-token-prediction module) whose attention is
DeepSeek Sparse Attention: a lightning indexer picks index_topk earlier tokens per query and MLA attends to those
only (explorer/model/components/dsa.py).

The DeepSeek-V3 family's composition is reused as it is; this module swaps the attention, names its own reference
file and adds the indexer's config keys. The routers' correction biases are shown as what the reference registers
them as, persistent buffers stored beside the parameters, so the parameter total is transformers' own count.

References: "DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models" (arXiv:2512.02556); transformers'
models/deepseek_v32/modeling_deepseek_v32.py (the reference binding).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.dsa import IndexerOptions, dsa
from explorer.model.components.mla import MLAOptions
from explorer.model.components.norms import NormOptions
from explorer.model.components.rope import Pairing
from explorer.model.families.base import ReferenceBinding, RopeScaling, rope_options, rule_problems
from explorer.model.families.deepseek_v3 import DIM_LABELS as V3_LABELS
from explorer.model.families.deepseek_v3 import DeepseekV3, DeepseekV3Hyperparameters, QuantizationConfig
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Citation, Component, Port, TensorRole

REFERENCE = Reference("models/deepseek_v32/modeling_deepseek_v32.py", "DeepseekV32")


@dataclass(frozen=True, slots=True)
class BlockFP8Config(QuantizationConfig):
    """config.json "quantization_config" of block-wise FP8 with the scales' format (ue8m0: powers of two)."""

    scale_fmt: str | None = None


@dataclass(frozen=True, slots=True)
class DeepseekV32Hyperparameters(DeepseekV3Hyperparameters):
    """DeepSeek-V3's keys plus the indexer's; absent ones take DeepseekV32Config's defaults."""

    quantization_config: BlockFP8Config | None = None
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 2048


class DeepseekV32(DeepseekV3):
    name = "deepseek_v32"
    model_types = ("deepseek_v32",)
    config_class = DeepseekV32Hyperparameters
    reference = ReferenceBinding("DeepseekV32Config", "DeepseekV32ForCausalLM", not_built=("mtp",),
                                 renames=split_fused_experts)
    ref: ClassVar[Reference] = REFERENCE
    attn_heading: ClassVar[str] = "DeepSeek Sparse Attention"
    correction_bias_role: ClassVar[TensorRole] = "buffer"
    indexer_pairing: ClassVar[Pairing] = "half"
    """How the indexer pairs its rotary features: the two halves in DeepSeek-V3.2 (the main attention pairs
    adjacent features)."""
    symbols = (*DeepseekV3.symbols, "index_n_heads", "index_head_dim")
    fp8_kept_modules: ClassVar[tuple[str, ...]] = ("indexer.weights_proj",)
    cited_lines: ClassVar[dict[str, tuple[int, int]]] = {"Indexer.forward": (212, 241),
                                                          "Attention.forward": (435, 456)}
    """The lines of the reference file that make each point: the indexer's scoring and selection, and the attention
    folding the selection into its mask."""

    def check(self, c: Any) -> list[str]:
        return super().check(c) + rule_problems([
            (c.q_lora_rank is not None, "q_lora_rank", "must be set: the indexer reads the query latent"),
            (c.index_head_dim >= c.qk_rope_head_dim, "index_head_dim",
             f"must be >= qk_rope_head_dim ({c.qk_rope_head_dim}): its first qk_rope_head_dim features rotate, "
             f"got {c.index_head_dim}"),
            (c.index_topk >= 1, "index_topk", f"must be >= 1, got {c.index_topk}"),
        ])

    def dim_labels(self) -> dict[str, str]:
        return {**V3_LABELS, "index_n_heads": "idx_heads", "index_head_dim": "d_idx"}

    def rope_source(self, c: Any) -> tuple[float, RopeScaling | None]:
        """The rotary base and scaling (rope_theta and rope_scaling here; GLM-5 publishes rope_parameters)."""
        return c.rope_theta, c.rope_scaling

    def attention(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port) -> Component:
        opts = MLAOptions(c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
                          c.qk_rope_head_dim, c.v_head_dim, NormOptions("rms", 1e-6))
        theta, scaling = self.rope_source(c)
        ro = rope_options(theta, c.qk_rope_head_dim, scaling, "interleaved", c.max_position_embeddings)
        io = IndexerOptions(c.index_n_heads, c.index_head_dim, c.index_topk,
                            rope_options(theta, c.qk_rope_head_dim, scaling, self.indexer_pairing,
                                         c.max_position_embeddings))
        pairing = "adjacent features" if self.indexer_pairing == "interleaved" else "the two halves"
        return dsa(ctx, prefix=prefix, ranges=ranges, x=x, o=opts, rope_options=ro, indexer_options=io, citations=(
            self.ref.cite("Attention compresses queries and keys/values through latents as DeepSeek-V3 does and builds "
                          "a lightning indexer of its own.", "Attention"),
            self._cite("The indexer's top-k indices become a mask: every key not selected is masked out of the causal "
                       "mask before the softmax.", "Attention.forward")),
            rope_citations=(), scores_citations=(
                self.ref.cite("The softmax scale is (qk_nope_head_dim + qk_rope_head_dim)^-0.5, multiplied by mscale "
                              "squared when YaRN's mscale_all_dim is set.", "Attention.__init__"),),
            indexer_citations=(
                self.ref.cite("The indexer has a query projection from the query latent (wq_b), a key projection with a "
                              "LayerNorm (wk, k_norm) and one weight per head (weights_proj).", "Indexer.__init__"),
                self._cite(f"It rotates the first qk_rope_head_dim features of queries and keys (pairing {pairing}), "
                           "scores ReLU(q·k)/√index_head_dim per head, sums the heads weighted by weights_proj/√heads, "
                           "adds the causal mask and keeps the top index_topk.", "Indexer.forward")))

    def _cite(self, claim: str, symbol: str) -> Citation:
        """A citation of the reference file narrowed to the lines that make the point."""
        return replace(self.ref.cite(claim, symbol), lines=self.cited_lines[symbol])

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """DeepSeek-V3's tiny sizes, and an indexer of 4 heads that keeps 2 tokens of the 5 traced: selection matters
        from the third position on."""
        return {**super().tiny_config(c), "index_n_heads": 4, "index_head_dim": 16, "index_topk": 2}

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return (*super().facts(c)[:2], ("sparse attention", f"top {c.index_topk:,} tokens by a {c.index_n_heads}-head "
                                                           "indexer"), *super().facts(c)[2:])


FAMILY = DeepseekV32()
