"""The MiniMax-M3 family (text model), as a diff against MiniMax-M2: the same grouped-query attention with partial
rotary and a sigmoid router with a correction bias beside the gate, but
- MiniMax sparse attention on the layers sparse_attention_freq names: a block indexer keeps, per query and head
  group, the index_topk_blocks best blocks of index_block_size keys (explorer/model/components/block_sparse_attention.py);
  the other layers attend to every earlier key;
- a dense prefix: the layers moe_layer_freq marks 0 run a dense MLP of dense_intermediate_size;
- QK-norm per head (not across all heads), and every RMSNorm scaled by 1 + γ (Gemma's convention, use_gemma_norm);
- SwiGLU-OAI feed-forwards (gpt-oss's clamped SwiGLU: min(g, limit) σ(α·), the up value clamped and shifted by one)
  in the experts, the shared expert and the dense MLP;
- one shared expert of shared_intermediate_size in every MoE layer, the routed sum scaled by routed_scaling_factor.

transformers registers no "minimax_m3" config: its MiniMaxM3VLTextConfig (the text config of minimax_m3_vl) reads the
published flat file, turning sparse_attention_config and moe_layer_freq into its per-layer lists; the published
multi-token-prediction modules (num_mtp_modules) are not built by MiniMaxM3VLForCausalLM: they are counted from the
config (`declared_mtp`) on an assumed DeepSeek-V3 layout, apart from the main model, and never run.

References: the MiniMax-M3 model card (MiniMaxAI/MiniMax-M3); transformers' models/minimax_m3_vl/modeling_minimax_m3_vl.py
and configuration_minimax_m3_vl.py (the reference binding, and its conversion mapping for the checkpoint's names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.block_sparse_attention import BlockIndexerOptions, block_indexer, block_sparse_attention
from explorer.model.components.blocks import block_ports, decoder_block, stack
from explorer.model.components.layer_attention import (
    SHAPED_ATTENTION,
    LayerAttentionOptions,
    LayerShape,
    layer_attention,
)
from explorer.model.components.mlp import MLPOptions, gated_mlp
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router
from explorer.model.components.norms import NormOptions, rmsnorm
from explorer.model.components.rope import RopeOptions
from explorer.model.families.base import (
    DIM_LABELS,
    DecoderLayers,
    Family,
    PublishedMetadata,
    ReferenceBinding,
    rule_problems,
    stored_dtype,
)
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_block_storage,
    fp8_problems,
)
from explorer.model.families.declared_mtp import declared_mtp, mtp_norm, mtp_projection
from explorer.model.families.minimax_m2 import BUFFER_NOTE, MiniMaxM2
from explorer.spec.types import Citation, Component, DeclaredMTP, Dim

REFERENCE = Reference("models/minimax_m3_vl/modeling_minimax_m3_vl.py", "MiniMaxM3VL")
SPARSE_LAYER, FULL_LAYER = "minimax_m3_sparse", "full_attention"
MOE_LAYER, DENSE_LAYER = "sparse", "dense"


@dataclass(frozen=True, slots=True)
class SparseAttentionConfig:
    """config.json "sparse_attention_config": MiniMaxM3VLTextConfig reads the sparse_* keys into its index_* keys
    and sparse_attention_freq into layer_types; the rest it does not read (checked in check())."""

    use_sparse_attention: bool = True
    sparse_attention_freq: tuple[int, ...] | None = None
    """1: a sparse layer (the block indexer narrows its keys), 0: full attention; one per layer."""
    sparse_block_size: int | None = None
    sparse_topk_blocks: int | None = None
    sparse_local_block: int | None = None
    sparse_num_index_heads: int | None = None
    sparse_index_dim: int | None = None
    sparse_init_block: int = 0
    """Leading blocks always kept; the reference keeps none, so only 0 describes what it builds."""
    sparse_score_type: str = "max"
    """How a block's score pools its keys' scores; the reference takes the maximum."""
    sparse_disable_index_value: tuple[int, ...] | None = None
    """1 on a layer whose indexer has no value path; the reference builds none on any layer."""


@dataclass(frozen=True, slots=True)
class MiniMaxM3Hyperparameters(PublishedMetadata):
    """config.json keys of MiniMax-M3's text model as MiniMaxM3VLTextConfig reads them, named as published; absent
    keys take that class's defaults."""

    vocab_size: int = 200064
    hidden_size: int = 6144
    intermediate_size: int = 3072
    """Width of each routed expert."""
    dense_intermediate_size: int = 12288
    """Width of the dense MLP of the layers moe_layer_freq marks 0."""
    shared_intermediate_size: int = 3072
    num_hidden_layers: int = 60
    num_attention_heads: int = 64
    num_key_value_heads: int = 4
    head_dim: int = 128
    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    routed_scaling_factor: float = 2.0
    rope_theta: float = 5000000.0
    partial_rotary_factor: float | None = None
    """The rotating share of each head; transformers rotates int(head_dim × partial_rotary_factor) features (all of
    them where it is absent)."""
    rotary_dim: int = 64
    """Not read by the reference's rotary (partial_rotary_factor decides); checked to agree with it."""
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    hidden_act: str = "silu"
    """Published as "swigluoai"; transformers computes the gate inline and sets hidden_act to silu."""
    max_position_embeddings: int = 524288
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, read as MiniMax-M2's (the published text config has none)."""
    sparse_attention_config: SparseAttentionConfig | None = None
    moe_layer_freq: tuple[int, ...] | None = None
    """1: a mixture of experts, 0: a dense MLP; one per layer (transformers reads it into mlp_layer_types)."""
    layer_types: tuple[str, ...] | None = None
    mlp_layer_types: tuple[str, ...] | None = None
    index_n_heads: int = 4
    index_head_dim: int = 128
    index_block_size: int = 128
    index_topk_blocks: int = 16
    index_local_blocks: int = 1
    # Published keys transformers does not read: checked to describe the model it builds (check()).
    use_gemma_norm: bool = True
    use_qk_norm: bool = True
    qk_norm_type: str = "per_head"
    attention_output_gate: bool = False
    scoring_func: str = "sigmoid"
    use_routing_bias: bool = True
    n_shared_experts: int = 1
    moe_intermediate_size: int | None = None
    first_k_dense_replace: int | None = None
    num_mtp_modules: int = 0
    num_nextn_predict_layers: int = 0
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = 200034
    eos_token_id: int | None = 200020
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    router_jitter_noise: float = 0.0
    auto_map: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------ the config as the reference reads it

def attention_kinds(c: MiniMaxM3Hyperparameters) -> tuple[str, ...]:
    """Each layer's attention as MiniMaxM3VLTextConfig resolves it: layer_types, else sparse_attention_freq, else
    full attention everywhere."""
    if c.layer_types is not None:
        return tuple(c.layer_types)
    freq = c.sparse_attention_config.sparse_attention_freq if c.sparse_attention_config else None
    if freq is not None:
        return tuple(SPARSE_LAYER if f else FULL_LAYER for f in freq)
    return (FULL_LAYER,) * c.num_hidden_layers


def mlp_kinds(c: MiniMaxM3Hyperparameters) -> tuple[str, ...]:
    """Each layer's feed-forward: mlp_layer_types, else moe_layer_freq, else a mixture of experts everywhere."""
    if c.mlp_layer_types is not None:
        return tuple(c.mlp_layer_types)
    if c.moe_layer_freq is not None:
        return tuple(MOE_LAYER if f else DENSE_LAYER for f in c.moe_layer_freq)
    return (MOE_LAYER,) * c.num_hidden_layers


INDEX_KEYS = {"index_n_heads": "sparse_num_index_heads", "index_head_dim": "sparse_index_dim",
              "index_block_size": "sparse_block_size", "index_topk_blocks": "sparse_topk_blocks",
              "index_local_blocks": "sparse_local_block"}
"""The reference's flat indexer keys and the sparse_attention_config keys that override them."""


def index_setting(c: MiniMaxM3Hyperparameters, key: str) -> int:
    """An indexer size as the reference reads it: sparse_attention_config's key where given, else the flat one."""
    nested = getattr(c.sparse_attention_config, INDEX_KEYS[key], None) if c.sparse_attention_config else None
    return int(nested if nested is not None else getattr(c, key))


def rotary_width(c: MiniMaxM3Hyperparameters) -> int:
    """Rotary features per head as transformers computes them: int(head_dim × partial_rotary_factor)."""
    return int(c.head_dim * (c.partial_rotary_factor if c.partial_rotary_factor is not None else 1.0))


# ------------------------------------------------------------------------------------------- the checkpoint's names

_INDEXER = re.compile(r"\.self_attn\.indexer\.(q_proj|k_proj|q_norm|k_norm)\.")
_MOE = re.compile(r"\.mlp\.(experts|gate|shared_experts)\.")


def to_checkpoint_names(state: dict[str, Any]) -> dict[str, Any]:
    """transformers' conversion mapping for minimax_m3_vl read backwards (without the language_model. prefix of the
    multimodal checkpoint): the MoE block is block_sparse_moe with its correction bias beside the gate, the indexer's
    modules are index_q_proj, index_k_proj, index_q_norm and index_k_norm, the routed experts w1, w3, w2 (stacked on
    the leading axis here), and every fused gate_up_proj Linear (dense MLP, shared expert) a gate_proj and an
    up_proj, gate first."""
    out = {}
    for name, tensor in state.items():
        name = _INDEXER.sub(r".self_attn.index_\1.", _MOE.sub(r".block_sparse_moe.\1.", name))
        name = name.replace(".block_sparse_moe.gate.e_score_correction_bias", ".block_sparse_moe.e_score_correction_bias")
        if name.endswith(".experts.gate_up_proj"):
            w1, w3 = tensor.chunk(2, dim=1)
            out[name.replace("gate_up_proj", "w1.weight")], out[name.replace("gate_up_proj", "w3.weight")] = w1, w3
        elif name.endswith(".experts.down_proj"):
            out[name.replace("down_proj", "w2.weight")] = tensor
        elif name.endswith(".gate_up_proj.weight"):
            gate, up = tensor.chunk(2, dim=0)
            out[name.replace("gate_up_proj", "gate_proj")], out[name.replace("gate_up_proj", "up_proj")] = gate, up
        else:
            out[name] = tensor
    return out


def reference_module(module: str) -> str:
    """A checkpoint module name as transformers names it (to_checkpoint_names undone; a dense gate_proj or up_proj
    has no module of its own there, so the name stays and matches nothing)."""
    module = re.sub(r"\.self_attn\.index_(q_proj|k_proj|q_norm|k_norm)", r".self_attn.indexer.\1", module)
    module = module.replace(".block_sparse_moe.", ".mlp.")
    head_, sep, _ = module.partition(".experts.")
    return head_ + ".experts" if sep else module


LABELS = {**DIM_LABELS, "num_local_experts": "experts", "dense_intermediate_size": "d_dense",
          "shared_intermediate_size": "d_shared", "index_n_heads": "idx_heads", "index_head_dim": "d_idx"}


class MiniMaxM3(MiniMaxM2):
    name = "minimax_m3"
    model_types = ("minimax_m3",)
    config_class: ClassVar[type] = MiniMaxM3Hyperparameters
    reference = ReferenceBinding("MiniMaxM3VLTextConfig", "MiniMaxM3VLForCausalLM", renames=to_checkpoint_names)
    ref = REFERENCE
    symbols: ClassVar[tuple[str, ...]] = (
        "vocab_size", "hidden_size", "intermediate_size", "dense_intermediate_size", "shared_intermediate_size",
        "num_attention_heads", "num_key_value_heads", "head_dim", "num_local_experts", "num_experts_per_tok",
        "index_n_heads", "index_head_dim")

    def values(self, c: Any) -> dict[str, int | float]:
        return {**{n: getattr(c, n) for n in self.symbols},
                **{key: index_setting(c, key) for key in ("index_n_heads", "index_head_dim")}}

    def reference_module(self, name: str) -> str:
        return reference_module(name)

    def defaulted_keys(self, raw: dict[str, Any]) -> tuple[str, ...]:
        """The base's list without the flat keys the published nested ones decide: an index_* key that
        sparse_attention_config gives, layer_types beside sparse_attention_freq, mlp_layer_types beside
        moe_layer_freq (transformers derives each from the published one); nor quantization_config, a storage block
        no config class defaults (absent: the weights are stored unquantized)."""
        nested = raw.get("sparse_attention_config") or {}
        decided = {key for key, legacy in INDEX_KEYS.items() if legacy in nested} | {"quantization_config"}
        decided |= {"layer_types"} if "sparse_attention_freq" in nested else set()
        decided |= {"mlp_layer_types"} if "moe_layer_freq" in raw else set()
        return tuple(k for k in super().defaulted_keys(raw) if k not in decided)

    def check(self, c: Any) -> list[str]:
        L, att, mlp = c.num_hidden_layers, attention_kinds(c), mlp_kinds(c)
        n_idx, d_idx = index_setting(c, "index_n_heads"), index_setting(c, "index_head_dim")
        sparse = c.sparse_attention_config or SparseAttentionConfig()
        return rule_problems([
            (c.num_attention_heads % c.num_key_value_heads == 0, "num_key_value_heads",
             f"must divide num_attention_heads ({c.num_attention_heads}), got {c.num_key_value_heads}"),
            (2 <= rotary_width(c) <= c.head_dim and rotary_width(c) % 2 == 0, "partial_rotary_factor",
             f"must rotate an even number of features in 2..head_dim ({c.head_dim}), got {rotary_width(c)}"),
            (c.partial_rotary_factor is None or c.rotary_dim == rotary_width(c), "rotary_dim",
             f"the reference rotates int(head_dim × partial_rotary_factor) = {rotary_width(c)} features; "
             f"rotary_dim says {c.rotary_dim}"),
            (c.num_experts_per_tok <= c.num_local_experts, "num_experts_per_tok",
             f"must be <= num_local_experts ({c.num_local_experts}), got {c.num_experts_per_tok}"),
            (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the family stores lm_head separately"),
            (len(att) == L and set(att) <= {SPARSE_LAYER, FULL_LAYER}, "layer_types",
             f"must give {L} entries, each {SPARSE_LAYER!r} or {FULL_LAYER!r} (sparse_attention_freq: 1 or 0)"),
            (len(mlp) == L and set(mlp) <= {MOE_LAYER, DENSE_LAYER}, "mlp_layer_types",
             f"must give {L} entries, each {MOE_LAYER!r} or {DENSE_LAYER!r} (moe_layer_freq: 1 or 0)"),
            (c.num_attention_heads % n_idx == 0, "index_n_heads",
             f"must divide num_attention_heads ({c.num_attention_heads}): each indexer head serves a group, got {n_idx}"),
            (d_idx >= rotary_width(c), "index_head_dim",
             f"must be >= the rotary width ({rotary_width(c)}): the indexer rotates as many features, got {d_idx}"),
            (index_setting(c, "index_block_size") >= 1 and index_setting(c, "index_topk_blocks") >= 1,
             "index_block_size", "the block size and index_topk_blocks must be >= 1"),
            (0 <= index_setting(c, "index_local_blocks") <= index_setting(c, "index_topk_blocks"),
             "index_local_blocks", "must be in 0..index_topk_blocks"),
            (sparse.use_sparse_attention or SPARSE_LAYER not in att, "sparse_attention_config.use_sparse_attention",
             "is false, but transformers builds the sparse layers sparse_attention_freq names all the same"),
            (sparse.sparse_init_block == 0, "sparse_attention_config.sparse_init_block",
             "transformers keeps no leading blocks: only 0 describes the model it builds"),
            (sparse.sparse_score_type == "max", "sparse_attention_config.sparse_score_type",
             f"transformers pools a block's scores by their maximum, got {sparse.sparse_score_type!r}"),
            (c.use_gemma_norm, "use_gemma_norm", "transformers always scales by 1 + γ (Gemma's RMSNorm)"),
            (c.use_qk_norm and c.qk_norm_type == "per_head", "qk_norm_type",
             f"transformers always builds QK-norm per head; got use_qk_norm {c.use_qk_norm}, {c.qk_norm_type!r}"),
            (not c.attention_output_gate, "attention_output_gate", "transformers builds no output gate"),
            (c.scoring_func == "sigmoid" and c.use_routing_bias, "scoring_func",
             "transformers scores experts with a sigmoid and always builds the correction bias"),
            (c.n_shared_experts == 1, "n_shared_experts", "transformers builds exactly one shared expert"),
            (c.moe_intermediate_size in (None, c.intermediate_size), "moe_intermediate_size",
             f"transformers sizes the experts by intermediate_size ({c.intermediate_size})"),
            (c.first_k_dense_replace is None or mlp[:c.first_k_dense_replace] == (DENSE_LAYER,) * c.first_k_dense_replace,
             "first_k_dense_replace", "disagrees with moe_layer_freq, which transformers reads"),
        ]) + fp8_problems(c.quantization_config)

    # ------------------------------------------------------------------------------------------------ build

    labels: ClassVar[dict[str, str]] = LABELS

    def decoder_layers(self, ctx: Ctx, c: Any) -> DecoderLayers:
        """One block kind per pair of attention kind and feed-forward kind, in order of its first layer."""
        L, att, mlp = c.num_hidden_layers, attention_kinds(c), mlp_kinds(c)
        kinds: dict[tuple[str, str], list[int]] = {}
        for i in range(L):
            kinds.setdefault((att[i], mlp[i]), []).append(i)
        n_sparse, n_dense = att.count(SPARSE_LAYER), mlp.count(DENSE_LAYER)
        return DecoderLayers(tuple(self.m3_block(ctx, c, pair, tuple(ix)) for pair, ix in kinds.items()), L,
                             f"{L} decoder layers: {n_sparse} with MiniMax sparse attention and {L - n_sparse} with "
                             f"full attention; {n_dense} with a dense MLP, the rest with a mixture of experts.")

    def model_citations(self, c: Any) -> tuple[Citation, ...]:
        return (REFERENCE.cite("The text model embeds token ids, runs the decoder layers (sparse or full attention as "
                               "layer_types names it, a mixture of experts or a dense MLP as mlp_layer_types names it) "
                               "and a final RMSNorm.", "TextModel.__init__"),)

    def layer_stack(self, ctx: Ctx, c: Any, layers: DecoderLayers, citations: tuple[Citation, ...]) -> Component:
        return stack(ctx, layers.blocks, layers=layers.count, citations=citations, description=layers.description)

    def final_norm(self, ctx: Ctx, c: Any) -> Component:
        """The final RMSNorm scales by 1 + w, as every MiniMax-M3 norm does."""
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        return rmsnorm(ctx, "norm", "Final RMSNorm", weight="model.norm.weight", ranges=(), size="hidden_size", x=x,
                       y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=c.rms_norm_eps,
                       gain="1+w")

    def model_description(self, c: Any, layers: DecoderLayers) -> str:
        return (f"Token embedding, {layers.count} decoder layers ({attention_kinds(c).count(SPARSE_LAYER)} "
                "block-sparse), a final RMSNorm and an untied LM head.")

    def finish(self, ctx: Ctx, c: Any, root: Component) -> Component:
        return Family.finish(self, ctx, c, root)  # the base's: this family's reference_module is its own

    def declared_mtp(self, c: Any, values: dict[str, int | float]) -> DeclaredMTP | None:
        """num_mtp_modules modules on DeepSeek-V3's MTP layout, each one decoder layer of the kind the per-layer lists
        give the last main layer (past the dense prefix: sparse attention and a mixture of experts)."""
        ctx = Ctx(values, LABELS, REFERENCE, stored_dtype(c.torch_dtype), fp8_block_storage(c.quantization_config))
        L, eps = c.num_hidden_layers, c.rms_norm_eps
        pair = (attention_kinds(c)[-1], mlp_kinds(c)[-1])
        parts = (mtp_norm(ctx, "enorm", "Embedding RMSNorm", "mtp.enorm.weight", eps, "1+w"),
                 mtp_norm(ctx, "hnorm", "Hidden-state RMSNorm", "mtp.hnorm.weight", eps, "1+w"),
                 mtp_projection(ctx, "eh_proj", "Combining projection", "mtp.eh_proj.weight", 2),
                 self.m3_block(ctx, c, pair, (L,)),
                 mtp_norm(ctx, "head_norm", "MTP head RMSNorm", "mtp.shared_head.norm.weight", eps, "1+w"))
        layer = (f"{'MiniMax sparse' if pair[0] == SPARSE_LAYER else 'full'} attention and "
                 f"{'a mixture of experts' if pair[1] == MOE_LAYER else 'a dense MLP'}")
        return declared_mtp("num_mtp_modules", c.num_mtp_modules, parts, (
            f"The config declares {c.num_mtp_modules} multi-token-prediction modules (num_mtp_modules; it also gives "
            f"num_nextn_predict_layers {c.num_nextn_predict_layers}). MiniMaxM3VLForCausalLM builds none (it ignores "
            "mtp.* tensors on load) and no file recorded here gives their layout or lists the checkpoint's tensors, "
            "so they are counted on an assumed layout, DeepSeek-V3's MTP module as for MiniMax-M2: an RMSNorm each "
            "for the next token's embedding and the hidden state, a bias-free projection of the two concatenated "
            "back to hidden_size, one decoder layer of the kind the per-layer lists give the last main layer "
            f"({layer}, as DeepSeek-V3's MTP layer is of its main layers' kind past the dense prefix) and a head "
            "RMSNorm, every norm scaled by 1 + γ as the main model's; the embedding and LM head are shared with the "
            "main model. The main model's figure is given beside the total."))

    def m3_block(self, ctx: Ctx, c: Any, pair: tuple[str, str], indices: tuple[int, ...]) -> Component:
        att_kind, mlp_kind = pair
        ranges, p = layers(indices), "model.layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        sparse, routed = att_kind == SPARSE_LAYER, mlp_kind == MOE_LAYER

        def norm(key: str, title: str, module: str, xp: Port, yp: Port) -> Component:
            return rmsnorm(ctx, key, title, weight=p + module + ".weight", ranges=ranges, size="hidden_size", x=xp,
                           y=yp, code=f"self.{module}(hidden_states)", eps=c.rms_norm_eps, gain="1+w")

        attn = self.attention(ctx, c, p + "self_attn.", ranges, x_attn, indices[0], sparse)
        ffn = self.moe(ctx, c, p, ranges, x_ffn, delta.latex) if routed else self.dense_mlp(ctx, c, p, ranges,
                                                                                           x_ffn, delta)
        key = f"{'sparse' if sparse else 'full'}_{'moe' if routed else 'dense'}"
        mixer = "MiniMax sparse attention" if sparse else "full grouped-query attention"
        ffn_words = "a mixture of experts with a shared expert" if routed else "a dense SwiGLU-OAI MLP"
        return decoder_block(
            ctx, key, f"{'Sparse' if sparse else 'Full'}-attention block ({'MoE' if routed else 'dense MLP'})",
            layer_indices=indices, kind="MoE" if routed else "dense",
            attn_heading="MiniMax sparse attention" if sparse else "",
            attn_norm=norm("attn_norm", "Attention RMSNorm", "input_layernorm", x, x_attn), attn=attn,
            ffn_norm=norm("ffn_norm", "MLP RMSNorm", "post_attention_layernorm", x_mid, x_ffn), ffn=ffn,
            citations=(REFERENCE.cite("A decoder layer adds the attention and then the MLP or mixture of experts "
                                      "(mlp_layer_types), each after an RMSNorm, to the residual stream.",
                                      "DecoderLayer"),),
            description=f"{mixer[0].upper() + mixer[1:]} with per-head QK-norm and {ffn_words}, each added to the "
                        f"residual stream; {layer_label(indices)}.")

    def attention(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, layer: int, sparse: bool) -> Component:
        H, Hkv, D = (ctx.sym(n) for n in ("num_attention_heads", "num_key_value_heads", "head_dim"))
        norm = NormOptions("rms", c.rms_norm_eps, "1+w")
        o = LayerAttentionOptions(LayerShape.of(ctx, H, Hkv, D), c.head_dim ** -0.5, qk_norm="per_head", norm=norm,
                                  part=SHAPED_ATTENTION)
        rw = rotary_width(c)
        ro = RopeOptions("default", c.rope_theta, rw, "half", unrotated_tail=c.head_dim - rw)
        base = layer_attention(ctx, prefix=prefix, ranges=ranges, x=x, o=o, rope_options=ro, citations=(
            REFERENCE.cite("Attention projects q, k and v, normalises each query and key head with an RMSNorm scaled "
                           "by 1 + weight, rotates the first features of each head and attends; a sparse layer also "
                           "builds an indexer and folds its block selection into the mask.", "Attention"),
            REFERENCE.cite("apply_rotary_pos_emb rotates the first cos.shape[-1] features of each head and passes the "
                           "rest through.", "apply_rotary_pos_emb", prefixed=False),
            REFERENCE.cite("The rotary module's frequencies cover head_dim × partial_rotary_factor features.",
                           "RotaryEmbedding.compute_default_rope_parameters")))
        if not sparse:
            return base
        io = BlockIndexerOptions(index_setting(c, "index_n_heads"), index_setting(c, "index_head_dim"),
                                 index_setting(c, "index_block_size"), index_setting(c, "index_topk_blocks"),
                                 index_setting(c, "index_local_blocks"), c.num_attention_heads, ro, norm)
        _, R, M = base.inputs
        indexer_c = block_indexer(
            ctx, prefix=prefix, ranges=ranges, x=x, R=R, M=M, o=io, reference=f"model.layers.{layer}.self_attn.indexer",
            names=("index_q_proj", "index_k_proj", "index_q_norm", "index_k_norm"), citations=(
                REFERENCE.cite("The indexer has a query projection to index_n_heads heads, one key projection, and a "
                               "per-head RMSNorm of each.", "Indexer.__init__"),
                REFERENCE.cite("It rotates queries and keys with the layer's angles, scores q·k per head, masks future "
                               "keys, max-pools the scores per block of index_block_size keys, forces the query's own "
                               "block to +inf and keeps the top index_topk_blocks blocks (−1 for blocks scoring −inf).",
                               "Indexer.forward"),
                REFERENCE.cite("build_block_mask keeps each selected block's keys for the query heads of the indexer "
                               "head's group, beside the causal mask.", "Indexer.build_block_mask")))
        return block_sparse_attention(ctx, base=base, indexer_c=indexer_c)

    def clamp(self, c: Any) -> MLPOptions:
        """The SwiGLU-OAI activation of every feed-forward: swiglu_limit, swiglu_alpha, the up value shifted by 1."""
        return MLPOptions("silu", limit=c.swiglu_limit, alpha=c.swiglu_alpha, up_shift=1.0)

    def dense_mlp(self, ctx: Ctx, c: Any, p: str, ranges, x: Port, y: Port) -> Component:
        o = self.clamp(c)
        return gated_mlp(
            ctx, "mlp", "SwiGLU-OAI MLP", "SwiGLU-OAI", prefix=p + "mlp.", ranges=ranges,
            d_ff=ctx.sym("dense_intermediate_size"), ff_dim=ctx.dim("dense_intermediate_size"), x=x, y=y,
            limit=o.limit, alpha=o.alpha, up_shift=o.up_shift, code="MiniMaxM3VLDenseMLP(config)",
            description=f"A dense clamped SwiGLU of width {c.dense_intermediate_size:,}: the gate clamped above at "
                        f"{c.swiglu_limit:g} through g σ({c.swiglu_alpha:g} g), the up value clamped at ±"
                        f"{c.swiglu_limit:g} and shifted by one.",
            citations=(REFERENCE.cite("The dense MLP fuses gate and up into gate_up_proj (the checkpoint's gate_proj "
                                      "and up_proj), clamps them and multiplies (up + 1) by gate·σ(α·gate).",
                                      "DenseMLP"),))

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        p = prefix + "block_sparse_moe."
        module = f"model.layers.{ranges[0].values[0]}.mlp"  # transformers' name of the block_sparse_moe module
        E, k = c.num_local_experts, c.num_experts_per_tok
        gate = router(ctx, weight=p + "gate.weight", ranges=ranges, x=x, bias_module=p,
                      o=RouterOptions(E, k, "sigmoid", True, correction_bias=True), code="MiniMaxM3VLTopKRouter(config)",
                      experts_sym="num_local_experts", bias_role="buffer", citations=(
                          REFERENCE.cite("The router scores every expert with a sigmoid, adds e_score_correction_bias "
                                         "only to choose the top k, and weights the chosen experts by their scores "
                                         "divided by their sum.", "TopKRouter"),))
        experts = routed_experts(ctx, prefix=p + "experts.", ranges=ranges, x=x, experts=E, k=k, clamp=self.clamp(c),
                                 code="MiniMaxM3VLExperts(config)", names=("w1", "w3", "w2"),
                                 experts_sym="num_local_experts", width="intermediate_size", citations=(
                                     REFERENCE.cite("Each expert is a clamped SwiGLU of width intermediate_size, gate "
                                                    "half then up half (not interleaved as gpt-oss's).", "Experts"),))
        o = self.clamp(c)
        shared = gated_mlp(ctx, "shared", "Shared expert", "Shared expert", prefix=p + "shared_experts.", ranges=ranges,
                           d_ff=ctx.sym("shared_intermediate_size"),
                           ff_dim=Dim("d_shared", c.shared_intermediate_size), x=x,
                           y=Port(r"y^{\mathrm{shared}}", x.shape, "shared_out"), sub=r"\mathrm{sh}",
                           limit=o.limit, alpha=o.alpha, up_shift=o.up_shift,
                           description=f"A clamped SwiGLU of width {c.shared_intermediate_size:,} that every token "
                                       "runs.", code="MiniMaxM3VLDenseMLP(config, shared_intermediate_size)",
                           citations=(REFERENCE.cite("The shared expert is a dense MLP of shared_intermediate_size.",
                                                     "SparseMoeBlock.__init__"),))
        gate = replace(gate, reference=module + ".gate", notes=gate.notes + (BUFFER_NOTE,))
        block = moe(ctx, x=x, y_latex=y_latex, router_c=gate, expert=experts, shared=shared,
                    routed_scaling=c.routed_scaling_factor, code="MiniMaxM3VLSparseMoeBlock(config)", citations=(
                        REFERENCE.cite("The sparse MoE block sums the chosen experts' weighted outputs, multiplies "
                                       "the sum by routed_scaling_factor and adds the shared expert's output.",
                                       "SparseMoeBlock.forward"),))
        return replace(block, reference=module)

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: a full-attention dense layer, then sparse MoE layers; 4 query heads over 2
        key/value heads of 16 features, 8 rotating; 2 indexer heads keeping 2 blocks of 2 keys (so at the traced 5
        positions the last query drops a block); a SwiGLU-OAI limit of 0.3, which the tiny activations reach (at 7
        no clamp would act)."""
        layers_ = (0, 1, 1)
        return {"architectures": ["MiniMaxM3ForCausalLM"], "model_type": "minimax_m3", "vocab_size": 97,
                "hidden_size": 64, "intermediate_size": 32, "dense_intermediate_size": 48,
                "shared_intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "partial_rotary_factor": 0.5, "rotary_dim": 8,
                "num_local_experts": 4, "num_experts_per_tok": 2, "routed_scaling_factor": c.routed_scaling_factor,
                "swiglu_alpha": c.swiglu_alpha, "swiglu_limit": 0.3, "rope_theta": c.rope_theta,
                "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": 256, "moe_layer_freq": list(layers_),
                "sparse_attention_config": {"use_sparse_attention": True, "sparse_attention_freq": list(layers_),
                                            "sparse_block_size": 2, "sparse_topk_blocks": 2, "sparse_local_block": 1,
                                            "sparse_num_index_heads": 2, "sparse_index_dim": 16},
                "torch_dtype": "float32", "bos_token_id": 0, "eos_token_id": 1, "quantization_config": None}

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        att = attention_kinds(c)
        return (("decoder layers", f"{c.num_hidden_layers} ({att.count(SPARSE_LAYER)} block-sparse)"),
                ("sparse attention", f"top {index_setting(c, 'index_topk_blocks')} blocks of "
                                     f"{index_setting(c, 'index_block_size')} keys by a "
                                     f"{index_setting(c, 'index_n_heads')}-head indexer"),
                ("routed experts", f"{c.num_local_experts} (top {c.num_experts_per_tok}) and 1 shared"),
                ("attention heads", f"{c.num_attention_heads} query, {c.num_key_value_heads} key/value"),
                ("rotary features", f"{rotary_width(c)} of {c.head_dim} per head"),
                ("vocabulary", f"{c.vocab_size:,}"))


FAMILY = MiniMaxM3()
