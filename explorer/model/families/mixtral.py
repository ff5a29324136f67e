"""The Mixtral family (Mixtral 8x7B): grouped-query attention and, in every block, a sparse mixture of 8 SwiGLU
experts with softmax top-2 routing renormalised over the two, no shared expert.

References: "Mixtral of Experts" (arXiv:2401.04088), section 2.1; transformers' models/mixtral/modeling_mixtral.py
(the reference binding).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router
from explorer.model.families.base import PublishedMetadata, ReferenceBinding, RopeScaling, rope_scaling_problems
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.sparse import SparseMoE
from explorer.spec.types import Component

REFERENCE = Reference("models/mixtral/modeling_mixtral.py", "Mixtral")


@dataclass(frozen=True, slots=True)
class MixtralHyperparameters(PublishedMetadata):
    """config.json keys of MixtralConfig, named as published; absent keys take MixtralConfig's defaults."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    """Width of each expert (Mixtral has no dense MLP)."""
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    num_local_experts: int
    num_experts_per_tok: int
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096 * 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8: every projection, experts included, in FP8 with a scale per block (explorer/model/families/sparse.py)."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    router_jitter_noise: float = 0.0


def to_checkpoint_names(state: dict[str, Any]) -> dict[str, Any]:
    """transformers' conversion mapping for "mixtral" (conversion_mapping.py) renames block_sparse_moe to mlp and
    merges experts.{e}.w1 and experts.{e}.w3 into experts.gate_up_proj [E, 2·I, d] (w1 first, Concatenate(dim=1)),
    experts.{e}.w2 into experts.down_proj [E, d, I]; this undoes it, experts stacked on the leading axis."""
    out = {}
    for name, tensor in state.items():
        name = name.replace(".mlp.", ".block_sparse_moe.")
        if name.endswith(".experts.gate_up_proj"):
            w1, w3 = tensor.chunk(2, dim=1)
            out[name.replace("gate_up_proj", "w1.weight")], out[name.replace("gate_up_proj", "w3.weight")] = w1, w3
        elif name.endswith(".experts.down_proj"):
            out[name.replace("down_proj", "w2.weight")] = tensor
        else:
            out[name] = tensor
    return out


class Mixtral(SparseMoE):
    name = "mixtral"
    model_types = ("mixtral",)
    config_class: ClassVar[type] = MixtralHyperparameters
    reference = ReferenceBinding("MixtralConfig", "MixtralForCausalLM", renames=to_checkpoint_names)
    ref = REFERENCE
    experts_key = "num_local_experts"
    width_key = "intermediate_size"
    symbols = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "num_local_experts", "num_experts_per_tok")

    def check(self, c: Any) -> list[str]:
        return super().check(c) + rope_scaling_problems(c.rope_scaling)

    def layer_types(self, c: Any) -> tuple[str, ...]:
        # MixtralConfig gives every layer the same attention: windowed when sliding_window is set.
        return (("sliding_attention" if c.sliding_window else "full_attention"),) * c.num_hidden_layers

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        p = prefix + "block_sparse_moe."
        module = f"model.layers.{ranges[0].values[0]}.mlp"  # transformers' name of the block_sparse_moe module
        E, k = c.num_local_experts, c.num_experts_per_tok
        gate = router(ctx, weight=p + "gate.weight", ranges=ranges, x=x, o=RouterOptions(E, k, "softmax", True),
                      code="MixtralTopKRouter(config)", experts_sym="num_local_experts", citations=(
                          REFERENCE.cite("The router takes a softmax over all experts' logits, keeps the top k and "
                                         "divides them by their sum. (A softmax over the k largest logits gives the "
                                         "same gates, as the Mixtral paper writes it.)", "TopKRouter"),))
        experts = routed_experts(ctx, prefix=p + "experts.", ranges=ranges, x=x, experts=E, k=k,
                                 code="MixtralExperts(config)", names=("w1", "w3", "w2"),
                                 experts_sym="num_local_experts", width="intermediate_size", citations=(
                                     REFERENCE.cite("Each expert is a SwiGLU MLP of width intermediate_size: "
                                                    "w2(silu(w1 x) ⊙ w3 x); transformers fuses w1 and w3 into one "
                                                    "gate_up_proj.", "Experts"),))
        gate = replace(gate, reference=module + ".gate")
        block = moe(ctx, x=x, y_latex=y_latex, router_c=gate, expert=experts, shared=None,
                    code="MixtralSparseMoeBlock(config)", citations=(
                        REFERENCE.cite("The sparse MoE block routes each token to its top-k experts and sums their "
                                       "outputs weighted by the router.", "SparseMoeBlock"),))
        return replace(block, reference=module)

    def tiny_config(self, c: Any) -> dict[str, Any]:
        raw = self.tiny_sizes(c)
        raw.update(sliding_window=3 if c.sliding_window else None)
        return raw


FAMILY = Mixtral()
