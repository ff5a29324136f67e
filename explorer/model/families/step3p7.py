"""The Step-3.7-Flash family (step3p7, its text model): MiMo-V2-Flash's layout of sliding-window layers beside
global ones, as layer_types lists them, with three changes to the attention and two to the feed-forward networks.

Attention: each query head's output is scaled by a sigmoid gate from a projection of its own (g_proj, one logit per
head: head_gated_attention.py), queries and keys are RMS-normalised per head with Gemma's 1 + w gain, and the
sliding layers may have their own query-head count (num_sliding_attention_heads, or the legacy
attention_other_setting's num_attention_heads; both absent, every layer keeps num_attention_heads). Feed-forward:
the first layers are dense SwiGLU MLPs (mlp_layer_types, the legacy moe_layers_enum, or by default every layer
from the fourth on sparse), the rest mixtures of experts whose sigmoid router renormalises the chosen scores, whose
routed sum is scaled by moe_router_scaling_factor and joined by an ungated shared expert
(scaled_routed_moe.py); and every SwiGLU may be clamped after its activation at a limit set per layer
(swiglu_limits for the routed experts, swiglu_limits_shared for the shared expert and the dense MLP:
activated_clamp.py). Blocks group by layer type, MLP type and those two limits.

The published config is flat and trimmed, and its architecture (Step3p7FlashForCausalLM) is not a transformers
class: transformers reads its keys only through Step3p7TextConfig, so the binding is Step3p7TextConfig ->
Step3p7TextModel with a separate, untied lm_head (Step3p7ForConditionalGeneration's head; no vision tower). The
keys first_k_dense_replace, num_experts, n_shared_experts, scoring_func and use_moe_router_bias are published but
not read: the reference derives the dense prefix, the expert count (n_routed_experts), one shared expert, sigmoid
scores and the correction bias on its own, so `check` refuses a config whose published keys say otherwise. The
multi-token-prediction layers (num_nextn_predict_layers) are not built by Step3p7TextModel: they are counted from
the config (`declared_mtp`) on the layout of transformers' generic MtpModel, apart from the main model, never run.

References: transformers' models/step3p7/modeling_step3p7.py and configuration_step3p7.py (the reference binding and
its defaults); "Gated Attention for Large Language Models" (arXiv:2505.06708) for the head gate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.activated_clamp import (
    ActivatedClampExpertsOptions,
    activated_clamp_experts,
    activated_clamp_mlp,
)
from explorer.model.components.base import Port, fmt_num, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block, model_root, stack
from explorer.model.components.embedding import embedding, head
from explorer.model.components.head_gated_attention import head_gated_attention
from explorer.model.components.layer_attention import LayerShape
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.moe import RouterOptions, router
from explorer.model.components.norms import NormOptions, rmsnorm
from explorer.model.components.parallel_moe import HalvesExpertsOptions, halves_experts
from explorer.model.components.rope import RopeOptions
from explorer.model.components.scaled_routed_moe import scaled_routed_moe
from explorer.model.families.base import (
    DIM_LABELS,
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
from explorer.model.families.minimax_m2 import BUFFER_NOTE
from explorer.spec.types import Component, DeclaredMTP, Dim

REFERENCE = Reference("models/step3p7/modeling_step3p7.py", "Step3p7")
FULL, SLIDING = "full_attention", "sliding_attention"
DENSE, SPARSE = "dense", "sparse"
KEYS = {(FULL, DENSE): ("full_dense", "Global-attention dense block", "global dense"),
        (SLIDING, DENSE): ("sliding_dense", "Sliding-window dense block", "sliding dense"),
        (SLIDING, SPARSE): ("sliding", "Sliding-window MoE block", "sliding MoE"),
        (FULL, SPARSE): ("full", "Global-attention MoE block", "global MoE")}
"""(layer type, MLP type) -> block key, title and the words a count of such blocks uses ("31 sliding MoE
blocks")."""
LABELS = {**DIM_LABELS, "share_expert_dim": "d_shared", "num_sliding_attention_heads": "heads"}
SYMBOLS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "share_expert_dim",
           "num_attention_heads", "num_sliding_attention_heads", "num_key_value_heads", "head_dim",
           "n_routed_experts", "num_experts_per_tok")
Limit = float | None


@dataclass(frozen=True, slots=True)
class AttentionOtherSetting:
    """The legacy config.json table of the sliding layers' attention sizes; transformers reads only its
    num_attention_heads (check refuses the others where they differ from the global layers')."""

    num_attention_heads: int | None = None
    num_attention_groups: int | None = None
    head_dim: int | None = None


@dataclass(frozen=True, slots=True)
class Step3p7Hyperparameters(PublishedMetadata):
    """config.json keys Step3p7TextConfig reads, named as published; absent keys take its defaults (transformers
    5.23.0), then the published keys it does not read."""

    vocab_size: int = 128815
    hidden_size: int = 4096
    intermediate_size: int = 11264
    """Width of the dense MLP (the layers mlp_layer_types calls dense)."""
    moe_intermediate_size: int = 1280
    share_expert_dim: int = 1280
    num_hidden_layers: int = 45
    num_attention_heads: int = 64
    num_sliding_attention_heads: int | None = None
    """Query heads of the sliding layers; None: attention_other_setting's, else num_attention_heads."""
    num_key_value_heads: int = 8
    head_dim: int = 128
    n_routed_experts: int = 288
    num_experts_per_tok: int = 8
    moe_router_scaling_factor: float = 1.0
    hidden_act: str = "silu"
    """Step3p7TextConfig sets it to silu whatever is published (the clamps are the checkpoint's swigluoai)."""
    max_position_embeddings: int = 128000
    rms_norm_eps: float = 1e-5
    rope_theta: float | tuple[float, ...] = 10000.0
    """One base for every layer, or one per layer (each layer type takes its first layer's)."""
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    """None: every layer full attention (Step3p7TextConfig)."""
    mlp_layer_types: tuple[str, ...] | None = None
    moe_layers_enum: str | tuple[int, ...] | None = None
    """Legacy: the MoE layers' indices; with mlp_layer_types absent too, every layer from the fourth is sparse."""
    attention_other_setting: AttentionOtherSetting | None = None
    swiglu_limits: tuple[float | None, ...] | None = None
    """Per layer, the routed experts' clamp limit (0 or null: none)."""
    swiglu_limits_shared: tuple[float | None, ...] | None = None
    """Per layer, the shared expert's and the dense MLP's clamp limit (0 or null: none)."""
    query_pre_attn_scalar: float | None = None
    """The softmax scale is its inverse square root; None: head_dim."""
    num_nextn_predict_layers: int = 0
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    pad_token_id: int | None = 1
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    output_router_logits: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8 (the Step-3.7-Flash-FP8 checkpoint's): every projection and the fused experts in FP8 with a
    scale per block; a storage format, not passed to the reference config class."""
    # Published keys Step3p7TextConfig does not read: checked to agree with the model it builds (check()).
    first_k_dense_replace: int | None = None
    num_experts: int | None = None
    n_shared_experts: int | None = None
    scoring_func: str | None = None
    use_moe_router_bias: bool | None = None


def _trimmed(values: tuple[Any, ...] | None, c: Any) -> tuple[Any, ...] | None:
    """A per-layer list as the reference keeps it: one padded with the MTP layers' entries loses them."""
    if values is not None and len(values) == c.num_hidden_layers + c.num_nextn_predict_layers:
        return tuple(values[:c.num_hidden_layers])
    return None if values is None else tuple(values)


def layer_types(c: Any) -> tuple[str, ...]:
    return _trimmed(c.layer_types, c) or (FULL,) * c.num_hidden_layers


def _enum_indices(c: Any) -> set[int]:
    """The MoE layers moe_layers_enum names ("3,4,5" or a list), as the reference reads them."""
    enum = c.moe_layers_enum
    if enum is None:
        return set()
    items = enum.split(",") if isinstance(enum, str) else enum
    return {int(i) for i in items if str(i).strip().lstrip("-").isdigit()}


def mlp_types(c: Any) -> tuple[str, ...]:
    if c.mlp_layer_types is not None:
        return _trimmed(c.mlp_layer_types, c) or ()
    sparse = set(range(3, c.num_hidden_layers)) if c.moe_layers_enum is None else _enum_indices(c)
    return tuple(SPARSE if i in sparse else DENSE for i in range(c.num_hidden_layers))


def limits(values: tuple[Limit, ...] | None, c: Any) -> tuple[Limit, ...]:
    """Each layer's clamp limit, None where it has none (0 or null in the config, or no list)."""
    kept = _trimmed(values, c) or (None,) * c.num_hidden_layers
    return tuple(v or None for v in kept)


def unclamped(key: str) -> str:
    """The note of a SwiGLU the config leaves unclamped at its layers."""
    return (f"Not clamped: {key} gives these layers no limit (0, null or no list). transformers implements a clamp "
            "after the activation, set layer by layer; the config does not switch it on here.")


def sliding_heads(c: Any) -> int:
    if c.num_sliding_attention_heads is not None:
        return int(c.num_sliding_attention_heads)
    other = c.attention_other_setting
    if other is not None and other.num_attention_heads is not None:
        return int(other.num_attention_heads)
    return int(c.num_attention_heads)


def rope_base(c: Any, layer_type: str) -> float:
    if isinstance(c.rope_theta, tuple):
        return float((_trimmed(c.rope_theta, c) or ())[layer_types(c).index(layer_type)])
    return float(c.rope_theta)


Kind = tuple[str, str, Limit, Limit]
"""(layer type, MLP type, routed-expert limit, shared/dense limit)."""


def layer_kinds(c: Any) -> tuple[Kind, ...]:
    return tuple(zip(layer_types(c), mlp_types(c), limits(c.swiglu_limits, c), limits(c.swiglu_limits_shared, c)))


def _continued(kinds: tuple[str, ...], n: int) -> tuple[str, ...]:
    """n entries past a per-layer list, continuing its shortest repeating period (a list trimmed of its MTP pad)."""
    period = next(p for p in range(1, len(kinds) + 1) if all(kinds[i] == kinds[i - p] for i in range(p, len(kinds))))
    out = list(kinds)
    for _ in range(n):
        out.append(out[len(out) - period])
    return tuple(out[len(kinds):])


def mtp_kinds(c: Any) -> tuple[Kind, ...]:
    """The MTP layers' kinds as Step3p7TextConfig splits them off (mtp_layer_types, mtp_mlp_layer_types): the
    padded lists' trailing entries; a layer_types trimmed to num_hidden_layers continued by its period; an MLP type
    derived over the padded range where mlp_layer_types is absent (moe_layers_enum's indices, else sparse only from
    the fourth main layer to the last, so dense), else the last main layer's. No clamp: the MtpModel's config
    keeps the main layers' limit lists, which say nothing of these layers' own."""
    L, n = c.num_hidden_layers, c.num_nextn_predict_layers
    padded = L + n
    att = (tuple(c.layer_types[L:]) if c.layer_types is not None and len(c.layer_types) == padded
           else _continued(layer_types(c), n))
    if c.mlp_layer_types is not None:
        mlp = tuple(c.mlp_layer_types[L:]) if len(c.mlp_layer_types) == padded else (c.mlp_layer_types[-1],) * n
    else:
        sparse = set(range(3, L)) if c.moe_layers_enum is None else _enum_indices(c)
        mlp = tuple(SPARSE if i in sparse else DENSE for i in range(L, padded))
    return tuple((a, m, None, None) for a, m in zip(att, mlp))


def block_keys(kinds: tuple[Kind, ...]) -> dict[Kind, tuple[str, str, str]]:
    """Each kind's block key, title and count words: the (layer type, MLP type) pair's, numbered where clamps
    split it."""
    out: dict[Kind, tuple[str, str, str]] = {}
    for kind in dict.fromkeys(kinds):
        key, title, words = KEYS[kind[:2]]
        n = sum(k[:2] == kind[:2] for k in out)
        clamped = bool(kind[2] or kind[3])
        out[kind] = (f"{key}_{n + 1}" if n else key, title + (" (clamped)" if clamped else ""),
                     words + (" clamped" if clamped else ""))
    return out


class Step3p7(Family):
    name = "step3p7"
    model_types = ("step3p7", "step3p5")
    config_class: ClassVar[type] = Step3p7Hyperparameters
    reference = ReferenceBinding("Step3p7TextConfig", "Step3p7TextModel", head="lm_head",
                                 config_skip=("architectures", "model_type", "quantization_config", "auto_map"))
    ref = REFERENCE
    symbols = SYMBOLS

    def defaulted_value(self, c: Any, key: str) -> Any:
        """What Step3p7TextConfig derives for a key left unset: the sliding layers' heads, the softmax scalar and
        the MLP kinds."""
        derived = {"num_sliding_attention_heads": lambda: sliding_heads(c), "mlp_layer_types": lambda: mlp_types(c),
                   "query_pre_attn_scalar": lambda: c.head_dim}
        if getattr(c, key, None) is None and key in derived:
            return derived[key]()
        return super().defaulted_value(c, key)

    def default_source(self, key: str) -> str:
        if key == "quantization_config":
            return "none: no quantized layout, every weight stored in torch_dtype"
        return super().default_source(key)

    def values(self, c: Any) -> dict[str, int | float]:
        return {**{n: getattr(c, n) for n in SYMBOLS if n != "num_sliding_attention_heads"},
                "num_sliding_attention_heads": sliding_heads(c)}

    def check(self, c: Any) -> list[str]:
        L, kinds, mlps = c.num_hidden_layers, layer_types(c), mlp_types(c)
        padded = (L, L + c.num_nextn_predict_layers)
        lists = [(n, getattr(c, n)) for n in ("layer_types", "mlp_layer_types", "swiglu_limits",
                                              "swiglu_limits_shared")]
        theta = c.rope_theta if isinstance(c.rope_theta, tuple) else None
        leading = next((i for i, m in enumerate(mlps) if m == SPARSE), len(mlps))
        other = c.attention_other_setting
        ignored = "transformers 5.23 does not read it and builds"
        return rule_problems([
            *((v is None or len(v) in padded, n, f"must list num_hidden_layers ({L}) entries, or that many plus "
               f"num_nextn_predict_layers ({c.num_nextn_predict_layers}), got {len(v or ())}") for n, v in lists),
            (theta is None or len(theta) in padded, "rope_theta", f"must be one number or {L} (or {padded[1]})"),
            (len(set(mtp_kinds(c))) <= 1, "num_nextn_predict_layers",
             "the multi-token-prediction layers must share one kind: one module is counted that many times"),
            (set(kinds) <= {FULL, SLIDING}, "layer_types", "entries must be full_attention or sliding_attention"),
            (set(mlps) <= {DENSE, SPARSE}, "mlp_layer_types", "entries must be dense or sparse"),
            (all(0 <= i < L for i in _enum_indices(c)), "moe_layers_enum", f"indices must lie in 0..{L - 1}"),
            (SLIDING not in kinds or (c.sliding_window or 0) >= 1, "sliding_window",
             "must be >= 1 where layer_types has sliding layers"),
            (c.num_attention_heads % c.num_key_value_heads == 0 and sliding_heads(c) % c.num_key_value_heads == 0,
             "num_key_value_heads", f"must divide num_attention_heads ({c.num_attention_heads}) and the sliding "
             f"layers' heads ({sliding_heads(c)}), got {c.num_key_value_heads}"),
            (c.head_dim % 2 == 0, "head_dim", f"must be even (RoPE pairs features), got {c.head_dim}"),
            (c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
             f"must be <= n_routed_experts ({c.n_routed_experts}), got {c.num_experts_per_tok}"),
            (all(v is None or v >= 0 for v in (*limits(c.swiglu_limits, c), *limits(c.swiglu_limits_shared, c))),
             "swiglu_limits", "limits must be >= 0 (0: no clamp)"),
            (not c.attention_bias and not c.mlp_bias, "attention_bias",
             "must be false (with mlp_bias): this family describes bias-free projections"),
            (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the binding's lm_head is untied"),
            (other is None or other.num_attention_groups in (None, c.num_key_value_heads), "attention_other_setting",
             f"{ignored} num_key_value_heads ({c.num_key_value_heads}) on the sliding layers too"),
            (other is None or other.head_dim in (None, c.head_dim), "attention_other_setting",
             f"{ignored} head_dim ({c.head_dim}) on the sliding layers too"),
            (c.first_k_dense_replace is None or c.first_k_dense_replace == leading, "first_k_dense_replace",
             f"{ignored} {leading} dense layers first (from mlp_layer_types or moe_layers_enum) instead"),
            (c.num_experts is None or c.num_experts == c.n_routed_experts, "num_experts",
             f"{ignored} n_routed_experts ({c.n_routed_experts}) experts instead"),
            (c.n_shared_experts in (None, 1), "n_shared_experts", f"{ignored} one shared expert instead"),
            (c.scoring_func in (None, "sigmoid"), "scoring_func", f"{ignored} sigmoid scores instead"),
            (c.use_moe_router_bias in (None, True), "use_moe_router_bias",
             f"{ignored} a selection-only correction bias instead"),
        ]) + fp8_problems(c.quantization_config)

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        dtype = stored_dtype(c.torch_dtype)
        ctx = Ctx(values, LABELS, REFERENCE, dtype, fp8_block_storage(c.quantization_config))
        L, kinds = c.num_hidden_layers, layer_kinds(c)
        keys = block_keys(kinds)
        blocks = tuple(self.block(ctx, c, kind, keys[kind], tuple(i for i in range(L) if kinds[i] == kind))
                       for kind in keys)
        cite = (REFERENCE.cite("The text model embeds token ids, runs the decoder layers and a final RMSNorm.",
                               "TextModel.__init__"),)
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        n_sliding = sum(t == SLIDING for t in layer_types(c))
        n_dense = sum(m == DENSE for m in mlp_types(c))
        children = (
            embedding(ctx, "embed", "Token embedding", weight="model.embed_tokens.weight", citations=cite),
            stack(ctx, blocks, layers=L, citations=blocks[0].citations[:1],
                  description=f"{L} decoder layers: {n_sliding} with sliding-window attention, {L - n_sliding} with "
                              f"global attention; {n_dense} with a dense MLP, the rest with a mixture of experts."),
            rmsnorm(ctx, "norm", "Final RMSNorm", weight="model.norm.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=c.rms_norm_eps,
                    gain="1+w"),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", citations=(
                REFERENCE.cite("lm_head is a separate bias-free Linear from hidden_size to vocab_size.",
                               "ForConditionalGeneration.__init__"),)),
        )
        root = model_root(ctx, children, code="Step3p7TextModel(config) + lm_head", layers=L, citations=cite,
                          description=f"Token embedding, {L} transformer blocks of {len(blocks)} kinds, a final "
                                      "RMSNorm and an untied LM head.")
        root = replace(root, notes=root.notes + self._notes(c))
        return keep_named_modules_dense(root, c.quantization_config, dtype, self.reference_module,
                                        f"{self.name} config", default_kept=("lm_head",))

    def _notes(self, c: Any) -> tuple[str, ...]:
        notes: tuple[str, ...] = ("Checked against Step3p7TextConfig -> Step3p7TextModel with a separate, untied lm_head (the head of "
                 "Step3p7ForConditionalGeneration), without its vision tower: the published architecture, "
                 "Step3p7FlashForCausalLM, is not a transformers class, and transformers reads the flat config.json "
                 "only through Step3p7TextConfig.",
                 "Tensors are named as transformers holds them. Its conversion mapping for step3p7 renames the "
                 "checkpoint's own names on load: moe.gate_proj and moe.up_proj (each stacked over the experts) "
                 "concatenated into mlp.experts.gate_up_proj, moe.down_proj into mlp.experts.down_proj, "
                 "moe.router_bias into mlp.gate.e_score_correction_bias and share_expert into mlp.shared_experts.")
        return notes

    def declared_mtp(self, c: Any, values: dict[str, int | float]) -> DeclaredMTP | None:
        """num_nextn_predict_layers modules as transformers' MtpModel builds them from Step3p7Config.get_mtp_config():
        enorm, hnorm, eh_proj, one decoder layer of the kind mtp_kinds gives and a post-norm."""
        kinds = mtp_kinds(c)
        if not kinds:
            return None
        ctx = Ctx(values, LABELS, REFERENCE, stored_dtype(c.torch_dtype), fp8_block_storage(c.quantization_config))
        L, eps, kind = c.num_hidden_layers, c.rms_norm_eps, kinds[0]
        p = f"model.layers.{L}."
        parts = (mtp_norm(ctx, "enorm", "Embedding RMSNorm", p + "enorm.weight", eps, "1+w"),
                 mtp_norm(ctx, "hnorm", "Hidden-state RMSNorm", p + "hnorm.weight", eps, "1+w"),
                 mtp_projection(ctx, "eh_proj", "Combining projection", p + "eh_proj.weight", 2),
                 self.block(ctx, c, kind, block_keys((kind,))[kind], (L,)),
                 mtp_norm(ctx, "post_norm", "MTP head RMSNorm", p + "shared_head.norm.weight", eps, "1+w"))
        given = c.layer_types is not None and len(c.layer_types) == L + len(kinds)
        att = ("layer_types' trailing entries" if given else
               f"layer_types, which this file trims to {L} entries, continued by its period (assumed)")
        return declared_mtp("num_nextn_predict_layers", len(kinds), parts, (
            f"The checkpoint appends {len(kinds)} multi-token-prediction layers as model.layers.{L}–"
            f"{L + len(kinds) - 1} (Step3p7TextModel ignores those keys on load). transformers 5.23 builds them only in "
            "its generic MtpModel (modeling_layers.py, for generate(use_mtp=True)), whose MtpLayer holds an RMSNorm "
            "each for the next token's embedding and the hidden state (enorm, hnorm), a bias-free eh_proj from the "
            "two concatenated back to hidden_size, one Step3p7DecoderLayer and a post-norm (the checkpoint's "
            "shared_head.norm), the embedding and LM head shared with the main model. Each layer is counted here on "
            f"that layout with this family's own block builder: {KEYS[kind[:2]][2]} (attention from {att}; the MLP "
            "type as Step3p7TextConfig derives it over the padded range). No tensor listing of the checkpoint is "
            "recorded, so the layout is not checked against the release."))

    def block(self, ctx: Ctx, c: Any, kind: Kind, key_title: tuple[str, str, str],
              indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), "model.layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps, (layer_type, mlp_type, routed_limit, shared_limit) = c.rms_norm_eps, kind
        key, title, words = key_title
        attn = self.attention(ctx, c, layer_type, p + "self_attn.", ranges, x_attn)
        ffn = (self.moe(ctx, c, p + "mlp.", ranges, x_ffn, delta.latex, routed_limit, shared_limit)
               if mlp_type == SPARSE else self.dense_mlp(ctx, c, p + "mlp.", ranges, x_ffn, delta, shared_limit))
        what = (f"sliding-window attention ({c.sliding_window:,} positions)" if layer_type == SLIDING else
                "global attention")
        ffn_text = "a mixture of experts" if mlp_type == SPARSE else "a dense SwiGLU MLP"
        norm = {"ranges": ranges, "size": "hidden_size", "eps": eps, "gain": "1+w"}
        return decoder_block(
            ctx, key, title, layer_indices=indices, kind=words,
            attn_norm=rmsnorm(ctx, "attn_norm", "Attention RMSNorm", weight=p + "input_layernorm.weight", x=x,
                              y=x_attn, code="self.input_layernorm(hidden_states)", **norm),  # type: ignore[arg-type]
            attn=attn,
            ffn_norm=rmsnorm(ctx, "ffn_norm", ("MoE" if mlp_type == SPARSE else "MLP") + " RMSNorm",
                             weight=p + "post_attention_layernorm.weight", x=x_mid, y=x_ffn,
                             code="self.post_attention_layernorm(hidden_states)", **norm),  # type: ignore[arg-type]
            ffn=ffn, citations=(REFERENCE.cite("A block adds attention and the MLP or mixture of experts, each after "
                                               "an RMSNorm, to the residual stream.", "DecoderLayer"),),
            description=f"Grouped-query {what} with a sigmoid gate per head, and {ffn_text}, each added to the "
                        f"residual stream; {layer_label(indices)}.")

    def attention(self, ctx: Ctx, c: Any, layer_type: str, prefix: str, ranges, x: Port) -> Component:
        sliding = layer_type == SLIDING
        heads = "num_sliding_attention_heads" if sliding else "num_attention_heads"
        shape = LayerShape.of(ctx, ctx.sym(heads), ctx.sym("num_key_value_heads"), ctx.sym("head_dim"))
        scalar = c.query_pre_attn_scalar if c.query_pre_attn_scalar is not None else c.head_dim
        scale_latex = (rf"\tau=1/\sqrt{{{c.head_dim}}}={scalar ** -0.5:.6f}" if scalar == c.head_dim else
                       rf"\tau=1/\sqrt{{{fmt_num(scalar)}}}={scalar ** -0.5:.6f}\ \text{{(query\_pre\_attn\_scalar)}}")
        cites = (REFERENCE.cite("Attention normalises each query and key head (RMSNorm, 1 + weight), rotates them, "
                                "attends (within sliding_window on sliding layers), multiplies each head's output by "
                                "the sigmoid of its g_proj logit and projects back; the layer's head count comes from "
                                "its per-layer config.", "Attention"),
                 REFERENCE.cite("The rotary module keeps one set of frequencies per layer type.",
                                "RotaryEmbedding.compute_default_rope_parameters"))
        attn = head_gated_attention(
            ctx, prefix=prefix, ranges=ranges, x=x, shape=shape,
            rope_options=RopeOptions("default", rope_base(c, layer_type), c.head_dim, "half", layer_type=layer_type),
            scale=scalar ** -0.5, window=c.sliding_window if sliding else None,
            norm=NormOptions("rms", c.rms_norm_eps, "1+w"), citations=cites, scale_latex=scale_latex,
            title="Sliding-window attention with head gates" if sliding else "Global attention with head gates")
        if sliding and shape.heads == c.num_attention_heads:
            return replace(attn, notes=attn.notes + (
                f"The sliding layers keep all {c.num_attention_heads} query heads here: the config sets neither "
                "num_sliding_attention_heads nor attention_other_setting. transformers implements a head count of "
                "their own for these layers; this config does not switch it on.",))
        return attn

    def dense_mlp(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y: Port, limit: Limit) -> Component:
        cite = (REFERENCE.cite("The dense MLP is down(min(silu(gate x), L) ⊙ clamp(up x, ±L)), L from "
                               "swiglu_limits_shared at its layer (none where 0 or absent).", "MLP"),)
        common = dict(prefix=prefix, ranges=ranges, d_ff=ctx.sym("intermediate_size"),
                      ff_dim=ctx.dim("intermediate_size"), x=x, y=y, code="Step3p7MLP(config, layer_idx)",
                      citations=cite, description=f"A dense SwiGLU feed-forward network of width "
                                                  f"{c.intermediate_size:,}.")
        if limit is None:
            plain = gated_mlp(ctx, "mlp", "SwiGLU MLP", "SwiGLU", **common)  # type: ignore[arg-type]
            return replace(plain, notes=plain.notes + (unclamped("swiglu_limits_shared"),))
        return activated_clamp_mlp(ctx, "mlp", "SwiGLU MLP (clamped)", "SwiGLU", limit=limit,
                                   **common)  # type: ignore[arg-type]

    def moe(self, ctx: Ctx, c: Any, p: str, ranges, x: Port, y_latex: str, routed_limit: Limit,
            shared_limit: Limit) -> Component:
        E, k = c.n_routed_experts, c.num_experts_per_tok
        gate = router(ctx, weight=p + "gate.weight", ranges=ranges, x=x,
                      o=RouterOptions(E, k, "sigmoid", True, 1.0, correction_bias=True), code="Step3p7TopKRouter(config)",
                      bias_role="buffer", citations=(REFERENCE.cite(
                          "The router scores experts with a sigmoid, adds e_score_correction_bias only to choose the "
                          "top k, and renormalises the chosen scores to sum to one.", "TopKRouter"),))
        gate = replace(gate, notes=gate.notes + (BUFFER_NOTE,))
        gates = gate.outputs[0]
        cite = (REFERENCE.cite("The experts hold gate_up [E, 2·I, d] (gate rows first) and down [E, d, I]; a layer "
                               "with a swiglu_limits entry caps silu(gate) and clamps up at it.", "Experts"),)
        if routed_limit is None:
            experts = halves_experts(ctx, prefix=p + "experts.", ranges=ranges, x=x, gates=gates,
                                     o=HalvesExpertsOptions(E, "silu"), experts_sym="n_routed_experts",
                                     width="moe_intermediate_size", code="Step3p7Experts(config)", citations=cite)
            experts = replace(experts, title="Routed experts (fused SwiGLU)",
                              description=f"{E} SwiGLU experts of width {c.moe_intermediate_size:,}, stored as one "
                                          "gate_up and one down tensor per layer (gate rows first, then up rows).",
                              notes=experts.notes + (unclamped("swiglu_limits"),))
        else:
            experts = activated_clamp_experts(ctx, prefix=p + "experts.", ranges=ranges, x=x, gates=gates,
                                              o=ActivatedClampExpertsOptions(E, routed_limit),
                                              experts_sym="n_routed_experts", width="moe_intermediate_size",
                                              code="Step3p7Experts(config, swiglu_limit)", citations=cite)
        shared = self.shared_expert(ctx, c, p + "shared_experts.", ranges, x, shared_limit)
        return scaled_routed_moe(x=x, y_latex=y_latex, router_c=gate, experts_c=experts, shared=shared,
                                 scale=c.moe_router_scaling_factor, code="Step3p7SparseMoeBlock(config, layer_idx)",
                                 citations=(REFERENCE.cite(
                                     "The MoE block multiplies the routed experts' weighted sum by "
                                     "moe_router_scaling_factor and adds the shared expert's output.",
                                     "SparseMoeBlock"),))

    def shared_expert(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, limit: Limit) -> Component:
        width = c.share_expert_dim
        common = dict(prefix=prefix, ranges=ranges, d_ff=ctx.sym("share_expert_dim"), ff_dim=Dim("d_shared", width),
                      x=x, y=Port(r"y^{\mathrm{shared}}", x.shape, "shared_out"), sub=r"\mathrm{sh}",
                      code="Step3p7MLP(config, layer_idx, is_shared_expert=True)",
                      description=f"A SwiGLU MLP of width {width:,} that every token runs, ungated.",
                      citations=(REFERENCE.cite("The shared expert is the MLP at share_expert_dim, clamped at "
                                                "swiglu_limits_shared's entry for its layer.", "MLP"),))
        if limit is None:
            plain = gated_mlp(ctx, "shared", "Shared expert", "Shared expert", **common)  # type: ignore[arg-type]
            return replace(plain, notes=plain.notes + (unclamped("swiglu_limits_shared"),))
        return activated_clamp_mlp(ctx, "shared", "Shared expert (clamped)", "Shared expert", limit=limit,
                                   **common)  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: each (layer type, MLP type) pair once, window 3 < T = 5, 4 query heads on
        global layers and 2 on sliding ones over 2 key/value heads, top 2 of 4 experts; clamps switched on (SiLU(g)
        capped at 0.5 in the sliding MoE layer's routed experts, 0.4 in its shared expert and in the first dense
        layer's MLP) so that the checks exercise the mechanisms the reference implements even where the published
        config leaves them off."""
        raw = {f.name: as_published(getattr(c, f.name)) for f in dataclasses.fields(c)}
        pairs = list(dict.fromkeys(zip(layer_types(c), mlp_types(c))))
        kinds, mlps = [t for t, _ in pairs], [m for _, m in pairs]
        first_sparse = mlps.index(SPARSE) if SPARSE in mlps else None
        routed = [0.5 if i == first_sparse else 0.0 for i in range(len(pairs))]
        shared = [0.4 if i in (0, first_sparse) else 0.0 for i in range(len(pairs))]
        leading = next((i for i, m in enumerate(mlps) if m == SPARSE), len(mlps))
        raw.update(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, share_expert_dim=48,
                   num_hidden_layers=len(pairs), num_attention_heads=4, num_sliding_attention_heads=2,
                   num_key_value_heads=2, head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                   max_position_embeddings=256, sliding_window=3, layer_types=kinds, mlp_layer_types=mlps,
                   moe_layers_enum=None, attention_other_setting=None, swiglu_limits=routed,
                   swiglu_limits_shared=shared, rope_theta=10000.0, num_nextn_predict_layers=0,
                   first_k_dense_replace=leading if c.first_k_dense_replace is not None else None,
                   num_experts=4 if c.num_experts is not None else None, pad_token_id=1, bos_token_id=0,
                   eos_token_id=2, quantization_config=None)
        return raw

    def tiny_label_parts(self, tiny: Any) -> tuple[str, ...]:
        c = tiny.config
        routed, shared = limits(c.swiglu_limits, c), limits(c.swiglu_limits_shared, c)
        clamps = [f"{what} at {fmt_num(v)} in layer {i}" for what, values in (("routed experts", routed),
                                                                                ("shared or dense MLP", shared))
                  for i, v in enumerate(values) if v is not None]
        return (f"{sliding_heads(c)} query heads on sliding layers",
                "SwiGLU clamped after the activation: " + "; ".join(clamps) if clamps else "no SwiGLU clamp")

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        kinds = layer_types(c)
        n_sliding = sum(t == SLIDING for t in kinds)
        return (("transformer blocks", f"{c.num_hidden_layers:,} ({n_sliding} sliding, {len(kinds) - n_sliding} "
                                       "global)"),
                ("routed experts", f"{c.n_routed_experts} (top {c.num_experts_per_tok}) + 1 shared"),
                ("attention heads", f"{c.num_attention_heads} query ({sliding_heads(c)} on sliding layers); "
                                    f"{c.num_key_value_heads} key/value"),
                ("sliding window", f"{c.sliding_window:,} positions" if c.sliding_window else "none"),
                ("vocabulary", f"{c.vocab_size:,}"))


FAMILY = Step3p7()
