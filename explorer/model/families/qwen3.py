"""The Qwen3 dense family (Qwen3-8B): Llama's decoder (grouped-query attention, SwiGLU, RMSNorm, RoPE) with QK-norm,
a per-head RMSNorm on queries and keys applied after the reshape to heads and before RoPE, and an explicit head_dim.

References: "Qwen3 Technical Report" (arXiv:2505.09388); transformers' models/qwen3/modeling_qwen3.py (the reference
binding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.families.base import PublishedMetadata, ReferenceBinding, RopeScaling, rule_problems
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.llama import Llama
from explorer.spec.types import Component


@dataclass(frozen=True, slots=True)
class Qwen3Hyperparameters(PublishedMetadata):
    """config.json keys of Qwen3Config, named as published; absent keys take Qwen3Config's defaults."""

    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 32
    head_dim: int | None = 128
    """Explicit: Qwen3 does not derive it from hidden_size / num_attention_heads."""
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    """Used only where use_sliding_window is set (it is not, for the dense checkpoints)."""
    max_window_layers: int = 28
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, read as the llama family reads it."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None


class Qwen3(Llama):
    name = "qwen3"
    model_types = ("qwen3",)
    config_class: ClassVar[type] = Qwen3Hyperparameters
    reference = ReferenceBinding("Qwen3Config", "Qwen3ForCausalLM")
    ref = Reference("models/qwen3/modeling_qwen3.py", "Qwen3")
    qk_norm: ClassVar[bool] = True
    width_in_heads: ClassVar[bool] = False

    def check(self, c: Any) -> list[str]:
        return super().check(c) + rule_problems([
            (not c.use_sliding_window, "use_sliding_window",
             "must be false: Qwen3's optional sliding-window layers are not in this family yet"),
        ])

    def block(self, ctx: Ctx, c: Any, indices: tuple[int, ...]) -> Component:
        """Llama's block, with the QK-norm cited where the reference applies it (after the view to heads)."""
        block = super().block(ctx, c, indices)
        cite = self.ref.cite("q_norm and k_norm are RMSNorms over head_dim, applied to each head's query and key "
                             "after the projection is viewed as heads and before the rotary embedding.",
                             "Attention.forward")
        attn = block.child("attn")
        children = tuple(dataclasses.replace(ch, citations=(cite,) + ch.citations)
                         if ch.key in ("q_norm", "k_norm") else ch for ch in attn.children)
        attn = dataclasses.replace(attn, children=children, description=attn.description.rstrip(".")
                                   + "; queries and keys are RMS-normalised per head before RoPE.")
        return dataclasses.replace(block, children=tuple(attn if ch.key == "attn" else ch for ch in block.children))

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Llama's tiny config with head_dim 24 (4 × 24 ≠ 64): the explicit head_dim is really used."""
        raw = super().tiny_config(c)
        raw.update(head_dim=24, max_window_layers=2)
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return super().facts(c) + (("QK-norm", f"per head, over {self.values(c)['head_dim']} features"),)


FAMILY = Qwen3()
