"""The MiniMax-M2 family (MiniMax-M2.5): full attention in every layer with QK-norm across all heads (one RMSNorm
over the whole query projection and one over the whole key projection, before the split into heads), partial rotary
(the first rotary_dim of each head's features rotate), and in every block a mixture of fine-grained SwiGLU experts
under a sigmoid router whose correction bias, stored beside the gate in the MoE block, steers selection only; the
weights in block-wise FP8 except the modules quantization_config names.

The published config also declares multi-token-prediction modules (use_mtp, num_mtp_modules, mtp_transformer_layers);
transformers does not build them: they are counted from the config (`declared_mtp`), apart from the main model, on
an assumed layout that the module's words say.

References: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention" (arXiv:2506.13585) for the
lineage; transformers' models/minimax_m2/modeling_minimax_m2.py (the reference binding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block
from explorer.model.components.layer_attention import (
    SHAPED_ATTENTION,
    LayerAttentionOptions,
    LayerShape,
    layer_attention,
)
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router
from explorer.model.components.norms import NormOptions, rmsnorm
from explorer.model.components.rope import RopeOptions
from explorer.model.families.base import (
    DIM_LABELS,
    DecoderLayers,
    Family,
    PublishedMetadata,
    ReferenceBinding,
    as_published,
    rule_problems,
    stored_dtype,
)
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_block_storage,
    fp8_problems,
    keep_named_modules_dense,
)
from explorer.model.families.declared_mtp import declared_mtp, mtp_norm, mtp_projection
from explorer.model.families.mixtral import to_checkpoint_names
from explorer.spec.types import Citation, Component, DeclaredMTP

REFERENCE = Reference("models/minimax_m2/modeling_minimax_m2.py", "MiniMaxM2")


@dataclass(frozen=True, slots=True)
class MiniMaxM2Hyperparameters(PublishedMetadata):
    """config.json keys of MiniMaxM2Config, named as published; absent keys take MiniMaxM2Config's defaults."""

    vocab_size: int = 200064
    hidden_size: int = 3072
    intermediate_size: int = 1536
    """Width of each routed expert (the model has no dense MLP)."""
    num_hidden_layers: int = 62
    num_attention_heads: int = 48
    num_key_value_heads: int = 8
    head_dim: int = 128
    num_local_experts: int = 256
    num_experts_per_tok: int = 8
    rotary_dim: int | None = None
    """Rotary features per head; None: the whole head rotates (transformers reads it as partial_rotary_factor =
    rotary_dim / head_dim)."""
    partial_rotary_factor: float | None = None
    """Published beside rotary_dim by configs saved with transformers 4.57 (NVIDIA's NVFP4 repacks); where published it
    is the one built, as MiniMaxM2Config derives the factor from rotary_dim only where the config gives none."""
    sliding_window: int | None = None
    """Published as null by the same configs; transformers' MiniMax-M2 attends over every earlier token (its mask is
    create_causal_mask's), and the family builds no window, so a set value is refused."""
    rope_theta: float = 5000000.0
    hidden_act: str = "silu"
    max_position_embeddings: int = 196608
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    """Not published in MiniMax-M2.5's config.json: its unquantized weights are taken to be BF16."""
    quantization_config: FP8QuantizationConfig | None = None
    # Published keys transformers does not read: checked to describe the model it builds (check()).
    use_qk_norm: bool = True
    qk_norm_type: str = "per_layer"
    use_routing_bias: bool = True
    scoring_func: str = "sigmoid"
    shared_intermediate_size: int = 0
    use_mtp: bool = False
    mtp_transformer_layers: int = 0
    num_mtp_modules: int = 0
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = 200034
    eos_token_id: int | None = 200020
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    router_jitter_noise: float = 0.0
    auto_map: dict[str, str] = field(default_factory=dict)


def rotary_factor(c: Any) -> float:
    """The share of each head that rotates, as MiniMaxM2Config settles it: partial_rotary_factor where published,
    else rotary_dim / head_dim, else the whole head."""
    if c.partial_rotary_factor is not None:
        return c.partial_rotary_factor
    return 1.0 if c.rotary_dim is None else c.rotary_dim / c.head_dim


def rotary_width(c: Any) -> int:
    """Rotary features per head as transformers computes them: int(head_dim × partial_rotary_factor)."""
    return int(c.head_dim * rotary_factor(c))


def rotary_key(c: Any) -> str:
    """The key that sets the rotary width: partial_rotary_factor where published, else rotary_dim."""
    return "rotary_dim" if c.partial_rotary_factor is None else "partial_rotary_factor"


BUFFER_NOTE = ("e_score_correction_bias is a persistent buffer: the checkpoint stores it, the parameter total leaves "
               "it out and lists it beside the parameters.")
"""What the router's page says of a correction bias built with router(..., bias_role="buffer")."""


def reference_module(module: str) -> str:
    """A checkpoint module name as transformers names it: block_sparse_moe is mlp, the experts one fused module."""
    module = module.replace(".block_sparse_moe.", ".mlp.")
    head, sep, _ = module.partition(".experts.")
    return head + ".experts" if sep else module


class MiniMaxM2(Family):
    name = "minimax_m2"
    model_types = ("minimax_m2",)
    config_class: ClassVar[type] = MiniMaxM2Hyperparameters
    # transformers' conversion mapping for minimax_m2 is Mixtral's (block_sparse_moe -> mlp, experts w1/w3 fused
    # into gate_up_proj, w2 stacked into down_proj) plus the correction bias's rename: to_checkpoint_names undoes it.
    reference = ReferenceBinding("MiniMaxM2Config", "MiniMaxM2ForCausalLM", renames=to_checkpoint_names,
                                 skip_when_unset=("partial_rotary_factor",))
    ref = REFERENCE
    symbols: ClassVar[tuple[str, ...]] = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                          "num_key_value_heads", "head_dim", "num_local_experts", "num_experts_per_tok")

    def check(self, c: Any) -> list[str]:
        return rule_problems([
            (c.num_attention_heads % c.num_key_value_heads == 0, "num_key_value_heads",
             f"must divide num_attention_heads ({c.num_attention_heads}), got {c.num_key_value_heads}"),
            (c.rotary_dim is None or c.partial_rotary_factor is not None or 2 <= rotary_width(c) <= c.head_dim,
             "rotary_dim",
             f"must be in 2..head_dim ({c.head_dim}), got {c.rotary_dim}"),
            (c.partial_rotary_factor is None or 0 < c.partial_rotary_factor <= 1, "partial_rotary_factor",
             f"must be in (0, 1], got {c.partial_rotary_factor}"),
            (rotary_width(c) % 2 == 0 and rotary_width(c) >= 2, rotary_key(c),
             f"must rotate an even number of head_dim's {c.head_dim} features, got {rotary_width(c)}"),
            (c.sliding_window is None, "sliding_window",
             f"must be null: transformers' MiniMax-M2 builds no sliding window, got {c.sliding_window}"),
            (c.num_experts_per_tok <= c.num_local_experts, "num_experts_per_tok",
             f"must be <= num_local_experts ({c.num_local_experts}), got {c.num_experts_per_tok}"),
            (c.hidden_act == "silu", "hidden_act", f"must be 'silu' (SwiGLU experts), got {c.hidden_act!r}"),
            (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the family stores lm_head separately"),
            (c.use_qk_norm and c.qk_norm_type == "per_layer", "use_qk_norm",
             "transformers always builds QK-norm across all heads (qk_norm_type 'per_layer'); this config says "
             f"use_qk_norm {c.use_qk_norm}, qk_norm_type {c.qk_norm_type!r}"),
            (c.use_routing_bias, "use_routing_bias", "transformers always builds the router's correction bias"),
            (c.scoring_func == "sigmoid", "scoring_func", f"transformers scores experts with a sigmoid, got "
             f"{c.scoring_func!r}"),
            (c.shared_intermediate_size == 0, "shared_intermediate_size",
             "must be 0: transformers builds no shared expert"),
        ]) + fp8_problems(c.quantization_config)

    # ------------------------------------------------------------------------------------------------ build

    def decoder_layers(self, ctx: Ctx, c: Any) -> DecoderLayers:
        L = c.num_hidden_layers
        return DecoderLayers((self.block(ctx, c, tuple(range(L))),), L,
                             f"{L} identical decoder layers, each with full attention and a mixture of experts.")

    def head_citation(self, tied: bool) -> Citation:
        return self.ref.cite("lm_head is a separate bias-free Linear from hidden_size to vocab_size.",
                             "ForCausalLM.__init__")

    def finish(self, ctx: Ctx, c: Any, root: Component) -> Component:
        """The FP8 keep-list matched against the reference's module names (block_sparse_moe is mlp there)."""
        return keep_named_modules_dense(root, c.quantization_config, ctx.dtype, reference_module, f"{self.name} config")

    def declared_mtp(self, c: Any, values: dict[str, int | float]) -> DeclaredMTP | None:
        """num_mtp_modules modules of mtp_transformer_layers decoder layers each, on DeepSeek-V3's MTP layout."""
        if not (c.use_mtp and c.mtp_transformer_layers):
            return None
        dtype = stored_dtype(c.torch_dtype)
        ctx = Ctx(values, DIM_LABELS, REFERENCE, dtype, fp8_block_storage(c.quantization_config))
        L, n, eps = c.num_hidden_layers, c.mtp_transformer_layers, c.rms_norm_eps
        parts = (mtp_norm(ctx, "enorm", "Embedding RMSNorm", "mtp.enorm.weight", eps),
                 mtp_norm(ctx, "hnorm", "Hidden-state RMSNorm", "mtp.hnorm.weight", eps),
                 mtp_projection(ctx, "eh_proj", "Combining projection", "mtp.eh_proj.weight", 2),
                 self.block(ctx, c, tuple(range(L, L + n))),
                 mtp_norm(ctx, "head_norm", "MTP head RMSNorm", "mtp.shared_head.norm.weight", eps))
        return declared_mtp("num_mtp_modules", c.num_mtp_modules, parts, (
            f"The config declares {c.num_mtp_modules} multi-token-prediction modules (use_mtp) of "
            f"{n} transformer layer{'s' if n > 1 else ''} each (mtp_transformer_layers). transformers builds none and "
            "no file recorded here gives their layout or lists the checkpoint's tensors, so whether the release "
            "stores them is not settled here; they are counted from the config on an assumed layout, DeepSeek-V3's "
            "MTP module (an RMSNorm each for the next token's embedding and the hidden state, a bias-free projection "
            "of the two concatenated back to hidden_size, the decoder layers of the main model's kind and a head "
            "RMSNorm, the embedding and LM head shared with the main model), and the main model's figure is given "
            "beside the total."))

    def block(self, ctx: Ctx, c: Any, indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), "model.layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps = c.rms_norm_eps
        H, Hkv, D = (ctx.sym(n) for n in ("num_attention_heads", "num_key_value_heads", "head_dim"))
        o = LayerAttentionOptions(LayerShape.of(ctx, H, Hkv, D), c.head_dim ** -0.5, qk_norm="across_heads",
                                  norm=NormOptions("rms", eps), part=SHAPED_ATTENTION)
        attn = layer_attention(
            ctx, prefix=p + "self_attn.", ranges=ranges, x=x_attn, o=o,
            rope_options=RopeOptions("default", c.rope_theta, rotary_width(c), "half",
                                     unrotated_tail=c.head_dim - rotary_width(c)),
            citations=(
                REFERENCE.cite("Attention normalises the whole query and key projections with q_norm and k_norm "
                               "(RMSNorms over all heads' features), splits them into heads, rotates the first "
                               "rotary features of each head and attends.", "Attention"),
                REFERENCE.cite("apply_rotary_pos_emb rotates the first rotary_dim features of each head and passes "
                               "the rest through.", "apply_rotary_pos_emb", prefixed=False),
                REFERENCE.cite("The rotary module's frequencies cover head_dim × partial_rotary_factor features.",
                               "RotaryEmbedding.compute_default_rope_parameters")))
        return decoder_block(
            ctx, "moe", "MoE transformer block", layer_indices=indices, kind="MoE",
            attn_norm=rmsnorm(ctx, "attn_norm", "Attention RMSNorm", weight=p + "input_layernorm.weight",
                              ranges=ranges, size="hidden_size", x=x, y=x_attn,
                              code="self.input_layernorm(hidden_states)", eps=eps),
            attn=attn,
            ffn_norm=rmsnorm(ctx, "ffn_norm", "MoE RMSNorm", weight=p + "post_attention_layernorm.weight",
                             ranges=ranges, size="hidden_size", x=x_mid, y=x_ffn,
                             code="self.post_attention_layernorm(hidden_states)", eps=eps),
            ffn=self.moe(ctx, c, p, ranges, x_ffn, delta.latex),
            citations=(REFERENCE.cite("A block adds attention and the mixture of experts, each after an RMSNorm, to "
                                      "the residual stream.", "DecoderLayer"),),
            description=f"Grouped-query attention with QK-norm across heads and a mixture of experts, each added to "
                        f"the residual stream; {layer_label(indices)}.")

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        p = prefix + "block_sparse_moe."
        module = f"model.layers.{ranges[0].values[0]}.mlp"  # transformers' name of the block_sparse_moe module
        E, k = c.num_local_experts, c.num_experts_per_tok
        gate = router(ctx, weight=p + "gate.weight", ranges=ranges, x=x, bias_module=p,
                      o=RouterOptions(E, k, "sigmoid", True, correction_bias=True), code="MiniMaxM2TopKRouter(config)",
                      experts_sym="num_local_experts", bias_role="buffer", citations=(
                          REFERENCE.cite("The router scores every expert with a sigmoid, adds the block's "
                                         "e_score_correction_bias only to choose the top k, and weights the chosen "
                                         "experts by their scores divided by their sum.", "TopKRouter"),
                          REFERENCE.cite("The MoE block holds e_score_correction_bias and hands it to its router.",
                                         "SparseMoeBlock")))
        experts = routed_experts(ctx, prefix=p + "experts.", ranges=ranges, x=x, experts=E, k=k,
                                 code="MiniMaxM2Experts(config)", names=("w1", "w3", "w2"),
                                 experts_sym="num_local_experts", width="intermediate_size", citations=(
                                     REFERENCE.cite("Each expert is a SwiGLU MLP of width intermediate_size; "
                                                    "transformers fuses w1 and w3 into gate_up_proj.", "Experts"),))
        gate = replace(gate, reference=module + ".gate", notes=gate.notes + (BUFFER_NOTE,))
        block = moe(ctx, x=x, y_latex=y_latex, router_c=gate, expert=experts,
                    shared=None, code="MiniMaxM2SparseMoeBlock(config)", citations=(
                        REFERENCE.cite("The sparse MoE block routes each token to its top-k experts and sums their "
                                       "outputs weighted by the router; there is no shared expert.",
                                       "SparseMoeBlock"),))
        return replace(block, reference=module)

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: 4 query heads over 2 KV heads, 8 of 16 head features rotating, top 2 of 4."""
        raw = {f.name: as_published(getattr(c, f.name)) for f in dataclasses.fields(c)}
        raw.update(vocab_size=97, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, rotary_dim=8 if c.rotary_dim is not None else None,
                   partial_rotary_factor=0.5 if c.partial_rotary_factor is not None else None,
                   num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256, bos_token_id=0,
                   eos_token_id=1, pad_token_id=None, quantization_config=None)
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return (("transformer blocks", f"{c.num_hidden_layers:,}"),
                ("routed experts", f"{c.num_local_experts} (top {c.num_experts_per_tok})"),
                ("attention heads", f"{c.num_attention_heads} query, {c.num_key_value_heads} key/value"),
                ("rotary features", f"{rotary_width(c)} of {c.head_dim} per head"),
                ("vocabulary", f"{c.vocab_size:,}"))



FAMILY = MiniMaxM2()
