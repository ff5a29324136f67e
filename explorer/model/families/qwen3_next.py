"""The Qwen3-Next family (`qwen3_next`, Qwen3-Next-80B-A3B): Qwen3.5-MoE's text model, told as a diff against it.
The same hybrid (three Gated DeltaNet layers for every gated full-attention layer, each followed by routed SwiGLU
experts with a gated shared expert; RMSNorms whose gain is 1 + w), with these differences:
  - the DeltaNet layer's input projections are fused in two matrices, in_proj_qkvz and in_proj_ba, whose rows are
    grouped per key head (explorer/model/components/fused_deltanet_proj.py), where Qwen3.5 has four;
  - no vision tower: Qwen3NextForCausalLM holds the text model at model.*, its config is flat (no text_config), and
    the rotary settings are the flat rope_theta and partial_rotary_factor (no multimodal sections);
  - the config's own MoE switches (decoder_sparse_step, norm_topk_prob), which the published checkpoint sets to
    every layer sparse and renormalised gates, as Qwen3.5-MoE always is.

References: Qwen team, "Qwen3-Next: Towards Ultimate Training & Inference Efficiency" (blog, September 2025);
"Gated Delta Networks: Improving Mamba2 with Delta Rule" (arXiv:2412.06464); "Gated Attention for Large Language
Models" (arXiv:2505.06708); transformers' models/qwen3_next/modeling_qwen3_next.py (the reference binding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port
from explorer.model.components.fused_deltanet_proj import fused_deltanet_proj
from explorer.model.components.gated_deltanet import DeltaNetOptions, gated_deltanet
from explorer.model.families.base import PublishedMetadata, ReferenceBinding, RopeScaling, rule_problems
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.qwen3_5 import (
    FULL,
    LINEAR,
    MOE_SYMBOLS,
    TEXT_SYMBOLS,
    Qwen3_5Moe,
    RopeParameters,
    _as_dict,
)
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Component, IndexRange, ModelSpec


@dataclass(frozen=True, slots=True)
class Qwen3NextHyperparameters(PublishedMetadata):
    """Qwen3NextConfig's keys, named as published (flat: no text_config); absent keys take its defaults
    (transformers 5.23)."""

    vocab_size: int = 151_936
    hidden_size: int = 2048
    intermediate_size: int = 5632
    """The dense MLP's width, for layers mlp_only_layers names (none in the published config)."""
    num_hidden_layers: int = 48
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int = 256
    hidden_act: str = "silu"
    max_position_embeddings: int = 32_768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    partial_rotary_factor: float = 0.25
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    layer_types: tuple[str, ...] | None = None
    full_attention_interval: int = 4
    """Without layer_types, every full_attention_interval-th layer is full attention."""
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    num_experts: int = 512
    num_experts_per_tok: int = 10
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    """Every decoder_sparse_step-th layer has the mixture of experts (the others a dense MLP)."""
    mlp_only_layers: tuple[int, ...] = ()
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, as for Qwen3.5: every nn.Linear transformers' FP8 quantizer converts."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    use_sliding_window: bool = False
    """Published as false; no file of the reference reads it (Qwen3-Next has no sliding-window layers)."""


ARCHITECTURE_KEYS = tuple(f.name for f in dataclasses.fields(Qwen3NextHyperparameters)
                          if f.name in TEXT_SYMBOLS + MOE_SYMBOLS + ("num_hidden_layers", "rope_theta",
                                                                     "partial_rotary_factor", "full_attention_interval",
                                                                     "decoder_sparse_step", "norm_topk_prob"))
"""The keys whose default a page names when the published config omits them."""


class Qwen3Next(Qwen3_5Moe):
    """Qwen3NextForCausalLM: Qwen3.5-MoE's text model with fused DeltaNet projections and no vision tower."""

    name = "qwen3_next"
    model_types = ("qwen3_next",)
    config_class: ClassVar[type] = Qwen3NextHyperparameters
    # transformers' conversion mapping for qwen3_next is qwen2_moe's: per-expert gate/up/down in the checkpoint,
    # fused gate_up_proj and down_proj in the model; split_fused_experts undoes the fusion
    reference = ReferenceBinding("Qwen3NextConfig", "Qwen3NextForCausalLM", renames=split_fused_experts)
    ref = Reference("models/qwen3_next/modeling_qwen3_next.py", "Qwen3Next")
    symbols = tuple(s for s in TEXT_SYMBOLS if s != "intermediate_size") + MOE_SYMBOLS
    prefix = "model."
    text_model_symbol = "Model"
    head_symbol = "ForCausalLM"
    rope_symbol = "RotaryEmbedding"
    text_key = ""

    # ------------------------------------------------------------------ the flat config, no vision tower

    def text(self, c: Any) -> Any:
        return c

    def rope(self, t: Any) -> RopeParameters:
        return RopeParameters("default", t.rope_theta, t.partial_rotary_factor, ())

    def rope_key(self, name: str) -> str:
        return {"rope_type": "rope_scaling"}.get(name, name)

    def dtype(self, t: Any) -> str:
        return t.torch_dtype

    def state_dtype(self, t: Any) -> str:
        """No key names it: the reference's torch path computes and returns the state in float32."""
        return "float32"

    def vision_values(self, c: Any) -> dict[str, int | float]:
        return {}

    def vision_problems(self, c: Any) -> list[str]:
        return []

    def check(self, c: Any) -> list[str]:
        return super().check(c) + rule_problems([
            (c.rope_scaling is None or c.rope_scaling.kind == "default", "rope_scaling", "must be null (plain RoPE)"),
            (c.decoder_sparse_step == 1, "decoder_sparse_step", "must be 1 (every layer a mixture of experts)"),
            (c.norm_topk_prob, "norm_topk_prob", "must be true (the top-k gates renormalised)"),
        ])

    def defaulted(self, raw: dict[str, Any]) -> tuple[str, ...]:
        return tuple(k for k in ARCHITECTURE_KEYS if k not in raw)

    def default_source(self, key: str) -> str:
        return self.reference.config_class

    def beside_words(self, c: Any) -> str:
        return ""

    def towers(self, ctx: Ctx, c: Any) -> tuple[Component, ...]:
        return ()

    def rope_notes(self, rp: RopeParameters) -> tuple[str, ...]:
        return ()

    # ------------------------------------------------------------------------------ the fused projections

    def deltanet(self, ctx: Ctx, prefix: str, ranges: tuple[IndexRange, ...], x: Port,
                 o: DeltaNetOptions) -> Component:
        proj = fused_deltanet_proj(ctx, prefix=prefix, ranges=ranges, x=x, o=o, citations=(
            self.ref.cite("fix_query_key_value_ordering views in_proj_qkvz's output as linear_num_key_heads groups "
                          "of q, k, v and z and in_proj_ba's as groups of b and a, splits each group, and flattens "
                          "v, z, b and a over the value heads.", "GatedDeltaNet.fix_query_key_value_ordering"),))
        return gated_deltanet(ctx, prefix=prefix, ranges=ranges, x=x, o=o, projections=proj,
                              citations=self.deltanet_citations(
                                  "The layer projects with in_proj_qkvz and in_proj_ba, reorders their outputs into "
                                  "q, k, v, z, b and a, convolves q, k, v causally, takes beta = sigmoid(b) and g = "
                                  "-exp(A_log) * softplus(a + dt_bias), runs the gated delta rule (chunked over a "
                                  "sequence, recurrent for one cached token) with L2-normalised q and k, and applies "
                                  "the gated norm and out_proj."))

    # ------------------------------------------------------------------------------------- tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: three layers (DeltaNet, full, DeltaNet), 2 key heads over 4 value heads
        (two value heads per key-head group, so a grouping not per key head reorders them), d_k 8 ≠ d_v 12, 4 query
        heads over 2 KV heads, a quarter of each head rotating, 4 experts (top 2) and a gated shared expert."""
        raw = _as_dict(c)
        raw.update(vocab_size=97, hidden_size=64, num_hidden_layers=3, layer_types=[LINEAR, FULL, LINEAR],
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                   linear_conv_kernel_dim=4, max_position_embeddings=256, torch_dtype="float32", eos_token_id=1,
                   num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=24,
                   intermediate_size=96, quantization_config=None)
        return {k: v for k, v in raw.items() if v is not None}

    def tiny_label_towers(self, tiny: ModelSpec) -> tuple[str, ...]:
        return ()


FAMILY = Qwen3Next()

__all__ = ["FAMILY", "Qwen3Next", "Qwen3NextHyperparameters"]
