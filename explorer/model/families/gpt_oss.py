"""The gpt-oss family (gpt-oss-20b, gpt-oss-120b): grouped-query attention with biases and a learned sink logit per
head, sliding-window and full-attention layers alternating as layer_types lists them, YaRN rotary embeddings
(fractional ramp bounds: truncate false), and in every block a mixture of experts whose router has a bias and takes
its softmax over the top-k logits only, and whose experts are clamped SwiGLUs stored fused, in MXFP4.

References: "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv:2508.10925), section 2; transformers'
models/gpt_oss/modeling_gpt_oss.py (the reference binding) and integrations/mxfp4.py (the stored layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port
from explorer.model.components.fused_experts import ClampedSwiGLUOptions, clamped_experts, fused_moe
from explorer.model.components.moe import RouterOptions, router
from explorer.model.families.base import (
    PublishedMetadata,
    ReferenceBinding,
    RopeScaling,
    rope_scaling_problems,
    rule_problems,
    stored_dtype,
)
from explorer.model.families.sparse import KINDS, SparseMoE
from explorer.spec.storage import MXFP4, Dense, Storage
from explorer.spec.types import Citation, Component

REFERENCE = Reference("models/gpt_oss/modeling_gpt_oss.py", "GptOss")
EXPERTS_MODULE = "model.layers.{layer}.mlp.experts"


@dataclass(frozen=True, slots=True)
class QuantizationConfig:
    """config.json "quantization_config" of gpt-oss: MXFP4 for every linear module except those listed."""

    quant_method: str
    modules_to_not_convert: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GptOssHyperparameters(PublishedMetadata):
    """config.json keys of GptOssConfig, named as published; absent keys take GptOssConfig's defaults."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    """Width of each expert."""
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    num_local_experts: int
    num_experts_per_tok: int
    head_dim: int = 64
    layer_types: tuple[str, ...] = ()
    """Per layer, "sliding_attention" or "full_attention" (empty: GptOssConfig alternates, sliding first)."""
    sliding_window: int | None = 128
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    """Not published in gpt-oss's config.json: GptOssConfig's default applies."""
    attention_bias: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    rope_theta: float = 150000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    """Not published in gpt-oss's config.json; its unquantized weights are BF16."""
    quantization_config: QuantizationConfig | None = None
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    experts_per_token: int = 4
    initial_context_length: int = 4096
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    auto_map: dict[str, str] = field(default_factory=dict)


def to_checkpoint_layout(state: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss has no entry in transformers' conversion mapping: its names are the checkpoint's. Its MXFP4 loader
    (integrations/mxfp4.py, convert_moe_packed_tensors) dequantizes `_blocks`/`_scales` of logical shape
    [E, out, in] and transposes the last two axes, so GptOssExperts holds gate_up_proj [E, d, 2·I] and down_proj
    [E, I, d]; transpose them back to the stored [E, out, in]."""
    return {name: tensor.transpose(1, 2) if name.endswith((".experts.gate_up_proj", ".experts.down_proj")) else tensor
            for name, tensor in state.items()}


class GptOss(SparseMoE):
    name = "gpt_oss"
    model_types = ("gpt_oss",)
    config_class: ClassVar[type] = GptOssHyperparameters
    reference = ReferenceBinding("GptOssConfig", "GptOssForCausalLM", renames=to_checkpoint_layout)
    ref = REFERENCE
    experts_key = "num_local_experts"
    width_key = "intermediate_size"
    sinks = True
    symbols = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "num_local_experts", "num_experts_per_tok")

    def check(self, c: Any) -> list[str]:
        q = c.quantization_config
        return super().check(c) + rule_problems([
            (not c.layer_types or len(c.layer_types) == c.num_hidden_layers, "layer_types",
             f"must list num_hidden_layers ({c.num_hidden_layers}) entries, got {len(c.layer_types)}"),
            (all(t in KINDS for t in c.layer_types), "layer_types",
             f"entries must be one of {', '.join(KINDS)}"),
            (c.swiglu_limit > 0, "swiglu_limit", f"must be > 0, got {c.swiglu_limit}"),
            (q is None or q.quant_method == "mxfp4", "quantization_config.quant_method",
             f"must be 'mxfp4', got {q.quant_method if q else ''!r}"),
        ]) + rope_scaling_problems(c.rope_scaling)

    def layer_types(self, c: Any) -> tuple[str, ...]:
        if c.layer_types:
            return tuple(c.layer_types)
        return tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(c.num_hidden_layers))

    def expert_storage(self, c: Any) -> Storage:
        """MXFP4 unless modules_to_not_convert names the experts (fnmatch patterns over module paths)."""
        q, module = c.quantization_config, EXPERTS_MODULE.format(layer=0)
        parents = [module.rsplit(".", n)[0] for n in range(module.count(".") + 1)]
        if q is None or any(fnmatch(m, p) for p in q.modules_to_not_convert for m in parents):
            return Dense(stored_dtype(c.torch_dtype))
        return MXFP4()

    def attention_citations(self, c: Any) -> tuple[Citation, ...]:
        return super().attention_citations(c) + (
            REFERENCE.cite("Each head's learned sink logit joins the softmax as an extra column and is dropped "
                           "after it: it takes probability but contributes no value.", "eager_attention_forward",
                           prefixed=False),
            REFERENCE.cite("A layer attends within sliding_window positions when layer_types names it "
                           "sliding_attention.", "Attention.__init__"))

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        p = prefix + "mlp."
        E, k = c.num_local_experts, c.num_experts_per_tok
        gate = router(ctx, weight=p + "router.weight", ranges=ranges, x=x,
                      o=RouterOptions(E, k, "softmax", False, router_bias=True, softmax_after_topk=True),
                      code="GptOssTopKRouter(config)", experts_sym="num_local_experts", citations=(
                          REFERENCE.cite("The router's logits are a biased linear map; it keeps the top k logits and "
                                         "takes the softmax over those k only.", "TopKRouter"),))
        storage = self.expert_storage(c)
        experts = clamped_experts(
            ctx, prefix=p + "experts.", ranges=ranges, x=x, gates=gate.outputs[0], k=k,
            o=ClampedSwiGLUOptions(E, c.swiglu_alpha, c.swiglu_limit), experts_sym="num_local_experts",
            width="intermediate_size", storage=storage, code="GptOssExperts(config)", citations=(
                REFERENCE.cite("The experts split gate_up into interleaved gate and up columns, clamp the gate from "
                               "above and the up value on both sides at swiglu_limit, and compute (up + 1) · gate · "
                               "σ(swiglu_alpha · gate) before the biased down projection.", "Experts"),
                Citation("The MXFP4 loader dequantizes each expert weight from its _blocks and _scales and transposes "
                         "it to [experts, in, out].", "transformers", "convert_moe_packed_tensors",
                         "integrations/mxfp4.py")))
        return fused_moe(x=x, y_latex=y_latex, router_c=gate, experts_c=experts, code="GptOssMLP(config)", citations=(
            REFERENCE.cite("The MoE flattens the tokens, routes them and runs the selected experts weighted by the "
                           "router scores.", "MLP"),))

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Window 3 < T = 5 on the sliding layers; the YaRN variant kept (original context 64: the ramp is fractional
        in the tiny config too)."""
        raw = self.tiny_sizes(c)
        scaling = raw["rope_scaling"]
        if scaling is not None:
            scaling["original_max_position_embeddings"] = 64
        kinds = list(dict.fromkeys(self.layer_types(c)))  # one layer of each kind (one, for a 1-layer model)
        raw.update(sliding_window=3, layer_types=kinds, num_hidden_layers=len(kinds), rope_scaling=scaling,
                   max_position_embeddings=2048, pad_token_id=None, experts_per_token=2)
        return raw


FAMILY = GptOss()
