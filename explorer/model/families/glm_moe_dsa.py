"""The GLM-MoE-DSA family (GLM-5): DeepSeek-V3.2's architecture (explorer/model/families/deepseek_v32.py) at other sizes,
with two differences the reference makes: the indexer rotates adjacent feature pairs (interleaved, as the main
attention does) rather than the two halves, and the config publishes its rotary settings as rope_parameters.

The reference can also let a layer reuse the previous layer's selection (indexer_types "shared", from
index_topk_freq or index_topk_pattern); GLM-5's config publishes none of those keys, so every layer runs its own
indexer, and configs that set them are refused here rather than drawn wrong.

References: "GLM-5: from Vibe Coding to Agentic Engineering" (arXiv:2602.15763); transformers'
models/glm_moe_dsa/modeling_glm_moe_dsa.py (the reference binding).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Reference
from explorer.model.components.rope import Pairing
from explorer.model.families.base import ReferenceBinding, RopeScaling, rope_scaling_problems, rule_problems
from explorer.model.families.deepseek_v32 import DeepseekV32, DeepseekV32Hyperparameters
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Component

REFERENCE = Reference("models/glm_moe_dsa/modeling_glm_moe_dsa.py", "GlmMoeDsa")


@dataclass(frozen=True, slots=True)
class RopeParameters(RopeScaling):
    """config.json "rope_parameters": the rotary base with the scaling variant and its keys."""

    rope_theta: float | None = None


@dataclass(frozen=True, slots=True)
class GlmMoeDsaHyperparameters(DeepseekV32Hyperparameters):
    """DeepSeek-V3.2's keys as GLM-5 publishes them; absent ones take GlmMoeDsaConfig's defaults."""

    rope_theta: float = 10000.0
    """Used only when rope_parameters is absent (GLM-5 publishes rope_parameters)."""
    rope_parameters: RopeParameters | None = None
    index_n_heads: int = 32
    head_dim: int = 64
    """Informational: the reference sets it to qk_rope_head_dim whatever is published."""
    qk_head_dim: int | None = None
    """Informational: qk_nope_head_dim + qk_rope_head_dim, checked when published."""
    rope_interleave: bool = True
    indexer_rope_interleave: bool = True
    dtype: str | None = None
    """The newer name of torch_dtype; where published it is the stored dtype."""
    eos_token_id: int | tuple[int, ...] | None = None  # type: ignore[assignment]  # GLM-5 publishes a list
    pad_token_id: int | None = None
    indexer_types: tuple[str, ...] | None = None
    """Per layer, "full" (runs its indexer) or "shared" (reuses the previous full layer's selection); None: from
    index_topk_pattern, else from index_topk_freq and index_skip_topk_offset."""
    index_topk_pattern: str | None = None
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 2


def indexer_types(c: GlmMoeDsaHyperparameters) -> tuple[str, ...]:
    """Which layers run their own indexer, as GlmMoeDsaConfig derives it when indexer_types is not published."""
    if c.indexer_types is not None:
        return c.indexer_types
    if c.index_topk_pattern is not None:
        return tuple({"F": "full", "S": "shared"}.get(ch, ch) for ch in c.index_topk_pattern)
    freq = max(c.index_topk_freq, 1)
    return tuple("full" if max(i - c.index_skip_topk_offset + 1, 0) % freq == 0 else "shared"
                 for i in range(c.num_hidden_layers))


class GlmMoeDsa(DeepseekV32):
    name = "glm_moe_dsa"
    model_types = ("glm_moe_dsa",)
    config_class = GlmMoeDsaHyperparameters
    reference = ReferenceBinding("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM", not_built=("mtp",),
                                 renames=split_fused_experts)
    ref: ClassVar[Reference] = REFERENCE
    indexer_pairing: ClassVar[Pairing] = "interleaved"
    cited_lines: ClassVar[dict[str, tuple[int, int]]] = {"Indexer.forward": (213, 242),
                                                          "Attention.forward": (405, 429)}

    def check(self, c: Any) -> list[str]:
        theta = c.rope_parameters.rope_theta if c.rope_parameters is not None else c.rope_theta
        return super().check(c) + rule_problems([
            (c.qk_head_dim is None or c.qk_head_dim == c.qk_nope_head_dim + c.qk_rope_head_dim, "qk_head_dim",
             f"must be qk_nope_head_dim + qk_rope_head_dim ({c.qk_nope_head_dim + c.qk_rope_head_dim}), got "
             f"{c.qk_head_dim}"),
            (c.rope_interleave and c.indexer_rope_interleave, "indexer_rope_interleave",
             "must be true: the reference rotates adjacent pairs in both the attention and the indexer"),
            (theta is not None and theta > 0, "rope_parameters.rope_theta", f"must be > 0, got {theta}"),
            (set(indexer_types(c)) <= {"full"}, "indexer_types",
             "every layer must run its own indexer: layers that reuse the previous layer's selection (\"shared\", "
             "from index_topk_freq, index_skip_topk_offset or index_topk_pattern) are not in the library yet"),
        ]) + rope_scaling_problems(c.rope_parameters, "rope_parameters")

    def rope_source(self, c: Any) -> tuple[float, RopeScaling | None]:
        if c.rope_parameters is None:
            return c.rope_theta, c.rope_scaling
        return c.rope_parameters.rope_theta, c.rope_parameters

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        return super().build(replace(c, torch_dtype=c.dtype or c.torch_dtype), values)

    def tiny_config(self, c: Any) -> dict[str, Any]:
        raw = super().tiny_config(c)
        raw.update(qk_head_dim=raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"], head_dim=raw["qk_rope_head_dim"],
                   pad_token_id=None, eos_token_id=1)  # token ids inside the tiny vocabulary
        return raw


FAMILY = GlmMoeDsa()
