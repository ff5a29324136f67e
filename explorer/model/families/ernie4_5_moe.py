"""The ERNIE 4.5 MoE family (ERNIE-4.5-21B-A3B): Llama's pre-norm decoder of grouped-query attention with the
queries and keys rotated in adjacent pairs (not in halves), a head tied to the token embedding, and from
moe_layer_start_index on (every moe_layer_interval-th layer up to moe_layer_end_index) a mixture of experts in place
of the dense MLP: a softmax router over moe_num_experts experts whose top moe_k are chosen by the probability plus a
correction bias (selection only) and renormalised over the chosen, beside moe_num_shared_experts shared experts
fused into one SwiGLU MLP. The width per head is hidden_size / num_attention_heads (the config has no head_dim).

References: "ERNIE 4.5 Technical Report" (Baidu ERNIE Team, 2025-06); transformers'
models/ernie4_5_moe/modeling_ernie4_5_moe.py and configuration_ernie4_5_moe.py (the reference binding and its
defaults).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port, layer_label
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router, shared_expert
from explorer.model.components.rope import Pairing
from explorer.model.families.base import (
    DIM_LABELS,
    DecoderLayers,
    PublishedMetadata,
    ReferenceBinding,
    RopeScaling,
    rule_problems,
)
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.llama import Llama
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Component

BIAS = "moe_statics.e_score_correction_bias"
"""The correction bias below the router's module (Ernie4_5_MoeStatics), a parameter of shape [1, experts]."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ernie45MoeHyperparameters(PublishedMetadata):
    """Ernie4_5_MoeConfig's keys, named as published; absent keys take its defaults (transformers 5.23.0)."""

    vocab_size: int = 103_424
    hidden_size: int = 2560
    intermediate_size: int = 12_288
    num_hidden_layers: int = 28
    num_attention_heads: int = 20
    num_key_value_heads: int | None = 4
    hidden_act: str = "silu"
    max_position_embeddings: int = 131_072
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    rope_theta: float = 500_000.0
    """Ernie4_5_MoeConfig's default_theta, which it takes where no rope parameters are published."""
    rope_scaling: RopeScaling | None = None
    use_bias: bool = False
    moe_intermediate_size: int = 1536
    moe_k: int = 6
    moe_num_experts: int = 64
    moe_num_shared_experts: int = 2
    moe_layer_start_index: int = 1
    moe_layer_end_index: int = -1
    """-1: the last layer."""
    moe_layer_interval: int = 1
    moe_norm_min: float = 1e-12
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, read as the llama family reads it."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | tuple[int, ...] | None = 2
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001


def moe_layers(c: Any) -> tuple[bool, ...]:
    """Whether each layer runs experts, as Ernie4_5_MoeDecoderLayer decides: (i + 1) a multiple of the interval and
    i within [moe_layer_start_index, moe_layer_end_index] (-1: the last layer)."""
    end = c.num_hidden_layers - 1 if c.moe_layer_end_index == -1 else c.moe_layer_end_index
    return tuple((i + 1) % c.moe_layer_interval == 0 and c.moe_layer_start_index <= i <= end
                 for i in range(c.num_hidden_layers))


class Ernie45Moe(Llama):
    name = "ernie4_5_moe"
    model_types = ("ernie4_5_moe",)
    config_class: ClassVar[type] = Ernie45MoeHyperparameters
    # the reference holds each layer's experts as 3-D gate_up_proj and down_proj; split_fused_experts names them per
    # projection as a checkpoint of separate experts does
    reference = ReferenceBinding("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", renames=split_fused_experts)
    ref = Reference("models/ernie4_5_moe/modeling_ernie4_5_moe.py", "Ernie4_5_Moe")
    symbols: ClassVar[tuple[str, ...]] = Llama.symbols + ("moe_intermediate_size", "moe_num_experts", "moe_k",
                                                          "moe_num_shared_experts")
    labels: ClassVar[dict[str, str]] = {**DIM_LABELS, "moe_num_experts": "experts", "moe_k": "k"}
    rope_pairing: ClassVar[Pairing] = "interleaved"

    def text(self, c: Any) -> Any:
        """The config as Llama's builder reads it: head_dim None (derived), use_bias under Llama's two names."""
        return _Derived(c)

    def text_values(self, t: Any) -> dict[str, int | float]:
        return {**super().text_values(t), **{n: getattr(t, n) for n in self.symbols[len(Llama.symbols):]}}

    def check(self, c: Any) -> list[str]:
        return super().check(c) + rule_problems([
            (c.moe_k <= c.moe_num_experts, "moe_k", f"must be <= moe_num_experts ({c.moe_num_experts})"),
            (c.moe_layer_interval >= 1, "moe_layer_interval", "must be >= 1"),
            (not c.use_bias, "use_bias", "must be false: biased projections are not in this family"),
        ])

    def decoder_layers(self, ctx: Ctx, c: Any) -> DecoderLayers:
        """A dense block kind and a MoE block kind, in order of their first layers."""
        t = self.text(c)
        groups: dict[bool, list[int]] = {}
        for i, sparse in enumerate(moe_layers(t)):
            groups.setdefault(sparse, []).append(i)
        blocks = tuple(self.kind_block(ctx, t, sparse, tuple(ix)) for sparse, ix in groups.items())
        n_moe = len(groups.get(True, ()))
        return DecoderLayers(blocks, t.num_hidden_layers,
                             f"{t.num_hidden_layers} decoder layers: {t.num_hidden_layers - n_moe} with a dense MLP, "
                             f"{n_moe} with a mixture of experts.")

    def kind_block(self, ctx: Ctx, t: Any, sparse: bool, indices: tuple[int, ...]) -> Component:
        block = self.block(ctx, t, indices)
        if not sparse:
            return dataclasses.replace(block, key="dense", title="Dense block")
        return dataclasses.replace(block, key="moe", title="MoE block", description=(
            f"Grouped-query attention and a mixture of {t.moe_num_experts} experts (top {t.moe_k}) with a shared "
            f"expert, each added to the residual stream; {layer_label(indices)}."))

    def ffn(self, ctx: Ctx, c: Any, prefix: str, ranges: tuple, x: Port, y: Port) -> Component:
        """The MoE on the layers moe_layers names (read from the block's first layer), else Llama's dense MLP."""
        if moe_layers(c)[ranges[0].values[0]]:
            return self.moe(ctx, c, prefix, ranges, x, y.latex)
        return super().ffn(ctx, c, prefix, ranges, x, y)

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges: tuple, x: Port, y_latex: str) -> Component:
        E, k = c.moe_num_experts, c.moe_k
        o = RouterOptions(E, k, "softmax", True, correction_bias=True, correction_bias_name=BIAS)
        gate = router(ctx, weight=prefix + "gate.weight", ranges=ranges, x=x, o=o, bias_name=BIAS, bias_groups=1,
                      experts_sym="moe_num_experts", code=f"{self.ref.prefix}TopKRouter(config)", citations=(
                          self.ref.cite("The router takes a softmax over all experts' logits in float32, selects the "
                                        "top k of the probabilities plus moe_statics' correction bias, and divides "
                                        "the k unbiased probabilities by their sum.", "TopKRouter.forward"),))
        experts = routed_experts(ctx, prefix=prefix + "experts.", ranges=ranges, x=x, experts=E, k=k,
                                 experts_sym="moe_num_experts", width="moe_intermediate_size",
                                 code=f"{self.ref.prefix}Experts(config)", citations=(
                                     self.ref.cite("Each expert is a SwiGLU MLP of width moe_intermediate_size, held "
                                                   "as 3-D gate_up_proj and down_proj tensors.", "Experts"),))
        shared = None if not c.moe_num_shared_experts else shared_expert(
            ctx, prefix=prefix + "shared_experts.", ranges=ranges, x=x,
            d_shared=ctx.sym("moe_intermediate_size") * ctx.sym("moe_num_shared_experts"),
            code=f"{self.ref.prefix}MLP(config, moe_intermediate_size * moe_num_shared_experts)",
            citations=(self.ref.cite("The shared experts are one SwiGLU MLP of width moe_intermediate_size × "
                                     "moe_num_shared_experts, added to the routed output.", "SparseMoeBlock"),))
        return moe(ctx, x=x, y_latex=y_latex, router_c=gate, expert=experts, shared=shared,
                   code=f"{self.ref.prefix}SparseMoeBlock(config)", citations=(
                       self.ref.cite("The sparse MoE block sums the selected experts' outputs weighted by the router "
                                     "and adds the shared experts'.", "SparseMoeBlock.forward"),))

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Llama's tiny sizes (4 query heads over 2 KV heads of 16 features, derived) with a dense layer and a MoE
        layer of 4 experts, top 2, and the shared experts where the model has them."""
        raw = super().tiny_config(c)
        for key in ("head_dim", "attention_bias", "mlp_bias"):
            raw.pop(key, None)
        raw.update(num_hidden_layers=2, moe_layer_start_index=1, moe_layer_end_index=-1, moe_layer_interval=1,
                   moe_num_experts=4, moe_k=2, moe_intermediate_size=32, pad_token_id=None)
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return super().facts(c) + (("routed experts", f"{c.moe_num_experts} (top {c.moe_k}), "
                                                      f"{c.moe_num_shared_experts} shared"),)


@dataclass(frozen=True, slots=True)
class _Derived:
    """An ERNIE 4.5 MoE config as Llama's builder reads it: head_dim None (derived), no MLP bias."""

    c: Any
    head_dim: None = None

    @property
    def attention_bias(self) -> bool:
        return bool(self.c.use_bias)

    @property
    def mlp_bias(self) -> bool:
        return bool(self.c.use_bias)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.c, name)


FAMILY = Ernie45Moe()
