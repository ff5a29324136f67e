"""The MiMo-V2-Flash family: sliding-window layers (a 128-token window, each head with a learned sink logit) beside
global layers, as layer_types lists them; the sliding layers keep twice the key/value heads of the global ones;
query and key heads are 192 features wide and value heads 128, with values scaled by attention_value_scale; the
first third of each query/key head rotates (partial rotary) with a base per layer kind; the first block has a dense
SwiGLU MLP and the rest a mixture of experts under a sigmoid router with a correction bias, no shared expert; the
weights in block-wise FP8.

transformers reads neither hybrid_layer_pattern, moe_layer_freq, the swa_* keys nor rope_theta, swa_rope_theta and
partial_rotary_factor: it derives the same layouts and bases from its own defaults (MiMoV2FlashConfig), so `check`
refuses a config whose published keys say otherwise. The checkpoint's multi-token-prediction layers (model.mtp.*)
are skipped by transformers when it loads, the config declares no number of them and no tensor listing is recorded
here, so they are not described or counted.

References: "MiMo-V2-Flash Technical Report" (Xiaomi LLM-Core team, 2025); transformers'
models/mimo_v2_flash/modeling_mimo_v2_flash.py (the reference binding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.attention import ScoresOptions
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block, model_root, stack
from explorer.model.components.embedding import embedding, head
from explorer.model.components.layer_attention import (
    SHAPED_ATTENTION,
    LayerAttentionOptions,
    LayerShape,
    layer_attention,
)
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router
from explorer.model.components.norms import rmsnorm
from explorer.model.components.rope import RopeOptions
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
from explorer.model.families.minimax_m2 import BUFFER_NOTE
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Component

REFERENCE = Reference("models/mimo_v2_flash/modeling_mimo_v2_flash.py", "MiMoV2Flash")
ROPE_DEFAULTS = {"full_attention": 5_000_000.0, "sliding_attention": 10_000.0}
"""The rotary bases MiMoV2FlashConfig gives each layer kind (it reads no base from config.json)."""
PARTIAL_ROTARY = 0.334
"""MiMoV2FlashConfig's partial_rotary_factor for both layer kinds."""
KINDS = {("full_attention", "dense"): ("dense", "Global-attention dense block"),
         ("sliding_attention", "sparse"): ("sliding", "Sliding-window MoE block"),
         ("full_attention", "sparse"): ("full", "Global-attention MoE block"),
         ("sliding_attention", "dense"): ("sliding_dense", "Sliding-window dense block")}
"""(layer type, MLP type) -> block key and title."""


@dataclass(frozen=True, slots=True)
class MiMoV2FlashHyperparameters(PublishedMetadata):
    """config.json keys of MiMoV2FlashConfig, named as published; absent keys take MiMoV2FlashConfig's defaults."""

    vocab_size: int = 152576
    hidden_size: int = 4096
    intermediate_size: int = 16384
    """Width of the dense MLP (the blocks mlp_layer_types calls dense)."""
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 48
    num_attention_heads: int = 64
    num_key_value_heads: int = 4
    """Key/value heads of the global layers; the sliding layers have twice as many."""
    head_dim: int = 192
    """Width of each query and key head."""
    v_head_dim: int = 128
    """Width of each value head."""
    n_routed_experts: int = 256
    num_experts_per_tok: int = 8
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float | None = 1.0
    """Published as null in MiMo-V2-Flash's config.json: transformers then uses 1.0."""
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    attention_value_scale: float | None = 0.707
    sliding_window: int = 129
    sliding_window_size: int | None = None
    """Where published, transformers attends to sliding_window_size previous positions plus the query itself:
    sliding_window = sliding_window_size + 1."""
    layer_types: tuple[str, ...] | None = None
    """None: global attention in the first layer and every sixth, sliding elsewhere (MiMoV2FlashConfig)."""
    mlp_layer_types: tuple[str, ...] | None = None
    """None: the first layer dense, the rest sparse (MiMoV2FlashConfig)."""
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    # Published keys transformers does not read: checked to agree with the model it builds (check()).
    rope_theta: float | None = None
    swa_rope_theta: float | None = None
    partial_rotary_factor: float | None = None
    hybrid_layer_pattern: tuple[int, ...] | None = None
    moe_layer_freq: tuple[int, ...] | None = None
    swa_num_attention_heads: int | None = None
    swa_num_key_value_heads: int | None = None
    swa_head_dim: int | None = None
    swa_v_head_dim: int | None = None
    add_swa_attention_sink_bias: bool = True
    add_full_attention_sink_bias: bool = False
    n_shared_experts: int | None = None
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    layernorm_epsilon: float | None = None
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    attention_chunk_size: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | tuple[int, ...] | None = None
    output_router_logits: bool = False


def layer_types(c: Any) -> tuple[str, ...]:
    """Each layer's attention, as MiMoV2FlashConfig fills it in when the config gives none."""
    if c.layer_types is not None:
        return tuple(c.layer_types)
    return tuple("full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention"
                 for i in range(c.num_hidden_layers))


def mlp_types(c: Any) -> tuple[str, ...]:
    if c.mlp_layer_types is not None:
        return tuple(c.mlp_layer_types)
    return ("dense",) + ("sparse",) * (c.num_hidden_layers - 1)


def window(c: Any) -> int:
    return c.sliding_window_size + 1 if c.sliding_window_size is not None else c.sliding_window


def rotary_width(c: Any) -> int:
    """int(head_dim × partial_rotary_factor), as the reference's rotary module computes it."""
    return int(c.head_dim * PARTIAL_ROTARY)


def reference_module(module: str) -> str:
    """A checkpoint module name as transformers names it: the routed experts are one fused module."""
    head_, sep, _ = module.partition(".experts.")
    return head_ + ".experts" if sep else module


def to_checkpoint_names(state: dict[str, Any]) -> dict[str, Any]:
    """transformers' conversion mapping for mimo_v2_flash is Qwen2-MoE's (experts fused) plus the sink logits'
    rename attention_sink_bias -> sinks: undo both."""
    return {name.replace(".self_attn.sinks", ".self_attn.attention_sink_bias"): t
            for name, t in split_fused_experts(state).items()}


class MiMoV2Flash(Family):
    name = "mimo_v2_flash"
    model_types = ("mimo_v2_flash",)
    config_class: ClassVar[type] = MiMoV2FlashHyperparameters
    reference = ReferenceBinding("MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", renames=to_checkpoint_names)
    ref = REFERENCE
    symbols = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok")

    def check(self, c: Any) -> list[str]:
        L, kinds, mlps = c.num_hidden_layers, layer_types(c), mlp_types(c)
        derived_pattern = tuple(0 if t == "full_attention" else 1 for t in kinds)
        derived_freq = tuple(1 if m == "sparse" else 0 for m in mlps)
        ignored = "transformers 5.23 does not read it and builds"
        return rule_problems([
            (len(kinds) == L and set(kinds) <= {"full_attention", "sliding_attention"}, "layer_types",
             f"must list num_hidden_layers ({L}) entries of full_attention or sliding_attention"),
            (len(mlps) == L and set(mlps) <= {"dense", "sparse"}, "mlp_layer_types",
             f"must list num_hidden_layers ({L}) entries of dense or sparse"),
            (c.num_attention_heads % c.num_key_value_heads == 0, "num_key_value_heads",
             f"must divide num_attention_heads ({c.num_attention_heads}), got {c.num_key_value_heads}"),
            ("sliding_attention" not in kinds or c.num_attention_heads % (2 * c.num_key_value_heads) == 0,
             "num_key_value_heads", f"twice it (the sliding layers' key/value heads) must divide num_attention_heads "
             f"({c.num_attention_heads}), got {c.num_key_value_heads}"),
            (rotary_width(c) >= 2 and rotary_width(c) % 2 == 0, "head_dim",
             f"int(head_dim × {PARTIAL_ROTARY}) must be an even number of rotary features, got {rotary_width(c)}"),
            (c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
             f"must be <= n_routed_experts ({c.n_routed_experts}), got {c.num_experts_per_tok}"),
            (c.n_routed_experts % c.n_group == 0 and c.topk_group <= c.n_group, "n_group",
             f"must divide n_routed_experts ({c.n_routed_experts}) and be >= topk_group ({c.topk_group})"),
            (c.n_group == 1 or c.n_routed_experts // c.n_group >= 2, "n_group",
             "groups must hold at least 2 experts (scored by their top 2)"),
            (c.hidden_act == "silu", "hidden_act", f"must be 'silu' (SwiGLU), got {c.hidden_act!r}"),
            (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the family stores lm_head separately"),
            (window(c) >= 1, "sliding_window", f"must be >= 1, got {window(c)}"),
            (c.hybrid_layer_pattern is None or c.hybrid_layer_pattern == derived_pattern, "hybrid_layer_pattern",
             f"{ignored} layer_types {derived_pattern} (0 global, 1 sliding) instead"),
            (c.moe_layer_freq is None or c.moe_layer_freq == derived_freq, "moe_layer_freq",
             f"{ignored} mlp_layer_types {derived_freq} (1 sparse) instead"),
            (c.rope_theta in (None, ROPE_DEFAULTS["full_attention"]), "rope_theta",
             f"{ignored} the global layers' base {ROPE_DEFAULTS['full_attention']:g} instead"),
            (c.swa_rope_theta in (None, ROPE_DEFAULTS["sliding_attention"]), "swa_rope_theta",
             f"{ignored} the sliding layers' base {ROPE_DEFAULTS['sliding_attention']:g} instead"),
            (c.partial_rotary_factor in (None, PARTIAL_ROTARY), "partial_rotary_factor",
             f"{ignored} {PARTIAL_ROTARY} instead"),
            (c.swa_num_key_value_heads in (None, 2 * c.num_key_value_heads), "swa_num_key_value_heads",
             f"{ignored} 2 × num_key_value_heads ({2 * c.num_key_value_heads}) instead"),
            (c.swa_num_attention_heads in (None, c.num_attention_heads), "swa_num_attention_heads",
             f"{ignored} num_attention_heads ({c.num_attention_heads}) instead"),
            (c.swa_head_dim in (None, c.head_dim), "swa_head_dim", f"{ignored} head_dim ({c.head_dim}) instead"),
            (c.swa_v_head_dim in (None, c.v_head_dim), "swa_v_head_dim",
             f"{ignored} v_head_dim ({c.v_head_dim}) instead"),
            (c.add_swa_attention_sink_bias and not c.add_full_attention_sink_bias, "add_full_attention_sink_bias",
             f"{ignored} sink logits on the sliding layers only"),
            (not c.n_shared_experts, "n_shared_experts", f"{ignored} no shared expert"),
            (c.scoring_func == "sigmoid" and c.topk_method == "noaux_tc", "scoring_func",
             f"{ignored} sigmoid scores with a selection-only correction bias (noaux_tc)"),
            (c.layernorm_epsilon in (None, c.rms_norm_eps), "layernorm_epsilon",
             f"{ignored} its RMSNorms with rms_norm_eps ({c.rms_norm_eps}) instead"),
        ]) + fp8_problems(c.quantization_config)

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        dtype = stored_dtype(c.torch_dtype)
        ctx = Ctx(values, DIM_LABELS, REFERENCE, dtype, fp8_block_storage(c.quantization_config))
        L = c.num_hidden_layers
        pairs = tuple(zip(layer_types(c), mlp_types(c)))
        blocks = tuple(self.block(ctx, c, kind, tuple(i for i in range(L) if pairs[i] == kind))
                       for kind in dict.fromkeys(pairs))
        model_cite = (REFERENCE.cite("The model embeds token ids, runs the decoder layers and a final RMSNorm.",
                                     "Model.__init__"),)
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        n_sliding = sum(t == "sliding_attention" for t, _ in pairs)
        children = (
            embedding(ctx, "embed", "Token embedding", weight="model.embed_tokens.weight", citations=model_cite),
            stack(ctx, blocks, layers=L, citations=blocks[0].citations[:1],
                  description=f"{L} decoder layers: {n_sliding} with sliding-window attention, {L - n_sliding} with "
                              f"global attention; {sum(m == 'dense' for _, m in pairs)} with a dense MLP, the rest "
                              "with a mixture of experts."),
            rmsnorm(ctx, "norm", "Final RMSNorm", weight="model.norm.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=c.rms_norm_eps),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", citations=(
                REFERENCE.cite("lm_head is a separate bias-free Linear from hidden_size to vocab_size.",
                               "ForCausalLM.__init__"),)),
        )
        root = model_root(ctx, children, code="MiMoV2FlashForCausalLM(config)", layers=L, citations=model_cite,
                          description=f"Token embedding, {L} transformer blocks of {len(blocks)} kinds, a final "
                                      "RMSNorm and an untied LM head.")
        root = replace(root, notes=("The checkpoint's multi-token-prediction layers (model.mtp.*) are not described or "
                                    "counted: transformers skips them when it loads the model, the config declares no "
                                    "number of them (MiMoV2FlashConfig has no such key) and no tensor listing of the "
                                    "checkpoint is recorded here, so the stored figure is the main model's.",))
        return keep_named_modules_dense(root, c.quantization_config, dtype, reference_module, "mimo_v2_flash config")

    def block(self, ctx: Ctx, c: Any, kind: tuple[str, str], indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), "model.layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps, (layer_type, mlp_type) = c.rms_norm_eps, kind
        attn = self.attention(ctx, c, layer_type, p + "self_attn.", ranges, x_attn)
        if mlp_type == "sparse":
            ffn = self.moe(ctx, c, p, ranges, x_ffn, delta.latex)
        else:
            ffn = gated_mlp(ctx, "mlp", "SwiGLU MLP", "SwiGLU", prefix=p + "mlp.", ranges=ranges,
                            d_ff=ctx.sym("intermediate_size"), ff_dim=ctx.dim("intermediate_size"), x=x_ffn, y=delta,
                            description=f"A dense SwiGLU feed-forward network of width {c.intermediate_size:,}.",
                            code="MiMoV2FlashMLP(config)",
                            citations=(REFERENCE.cite("The dense MLP is down(silu(gate x) ⊙ up x).", "MLP"),))
        key, title = KINDS[kind]
        so = options_of(attn)
        what = f"sliding-window attention ({so.window:,} positions, sink logits)" if so.window else "global attention"
        ffn_text = "a mixture of experts" if mlp_type == "sparse" else "a dense SwiGLU MLP"
        return decoder_block(
            ctx, key, title, layer_indices=indices, kind=key if key != "dense" else "dense",
            attn_norm=rmsnorm(ctx, "attn_norm", "Attention RMSNorm", weight=p + "input_layernorm.weight",
                              ranges=ranges, size="hidden_size", x=x, y=x_attn,
                              code="self.input_layernorm(hidden_states)", eps=eps),
            attn=attn,
            ffn_norm=rmsnorm(ctx, "ffn_norm", ("MoE" if mlp_type == "sparse" else "MLP") + " RMSNorm",
                             weight=p + "post_attention_layernorm.weight", ranges=ranges, size="hidden_size",
                             x=x_mid, y=x_ffn, code="self.post_attention_layernorm(hidden_states)", eps=eps),
            ffn=ffn, citations=(REFERENCE.cite("A block adds attention and the MLP or mixture of experts, each after "
                                               "an RMSNorm, to the residual stream.", "DecoderLayer"),),
            description=f"Grouped-query {what} and {ffn_text}, each added to the residual stream; "
                        f"{layer_label(indices)}.")

    def attention(self, ctx: Ctx, c: Any, layer_type: str, prefix: str, ranges, x: Port) -> Component:
        sliding = layer_type == "sliding_attention"
        H, Hkv, D, Dv = (ctx.sym(n) for n in ("num_attention_heads", "num_key_value_heads", "head_dim", "v_head_dim"))
        scale = c.attention_value_scale if c.attention_value_scale is not None else 1.0
        o = LayerAttentionOptions(LayerShape.of(ctx, H, 2 * Hkv if sliding else Hkv, D, Dv), c.head_dim ** -0.5,
                                  value_scale=scale, window=window(c) if sliding else None,
                                  sinks="attention_sink_bias" if sliding else "", part=SHAPED_ATTENTION)
        cites = (REFERENCE.cite("Attention projects queries and keys to head_dim-wide heads and values to v_head_dim-"
                                "wide heads, scales the values by attention_value_scale, rotates the first rotary "
                                "features of queries and keys and attends; sliding layers double the key/value "
                                "heads and add a sink logit per head.", "Attention"),
                 REFERENCE.cite("The sink logit joins each softmax row as an extra column and is dropped after it.",
                                "eager_attention_forward", prefixed=False),
                 REFERENCE.cite("The rotary module keeps one set of frequencies per layer type, over head_dim × "
                                "partial_rotary_factor features.", "RotaryEmbedding.compute_default_rope_parameters"))
        attn = layer_attention(
            ctx, prefix=prefix, ranges=ranges, x=x, o=o,
            rope_options=RopeOptions("default", ROPE_DEFAULTS[layer_type], rotary_width(c), "half",
                                     unrotated_tail=c.head_dim - rotary_width(c), layer_type=layer_type),
            citations=cites,
            title="Sliding-window attention with sinks" if sliding else "Global grouped-query attention")
        if not sliding or c.sliding_window_size is None:
            return attn
        return replace(attn, notes=attn.notes + (
            f"config.json gives sliding_window_size {c.sliding_window_size}: transformers lets each query see that "
            f"many previous positions and itself, a window of {window(c)} (MiMoV2FlashConfig sets sliding_window to "
            "sliding_window_size + 1).",))

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        p = prefix + "mlp."
        E, k = c.n_routed_experts, c.num_experts_per_tok
        ro = RouterOptions(E, k, "sigmoid", c.norm_topk_prob, c.routed_scaling_factor or 1.0, correction_bias=True,
                           n_group=c.n_group, topk_group=c.topk_group)
        gate = router(ctx, weight=p + "gate.weight", ranges=ranges, x=x, o=ro, code="MiMoV2FlashTopkRouter(config)",
                      bias_role="buffer", citations=(REFERENCE.cite("The router scores experts with a sigmoid, adds e_score_correction_bias "
                                                "only to choose the top k, and weights the chosen experts by their "
                                                "scores, normalised when norm_topk_prob is set and multiplied by "
                                                "routed_scaling_factor.", "TopkRouter"),))
        experts = routed_experts(ctx, prefix=p + "experts.", ranges=ranges, x=x, experts=E, k=k,
                                 code="MiMoV2FlashExperts(config)", citations=(
                                     REFERENCE.cite("Each expert is a SwiGLU MLP of width moe_intermediate_size; "
                                                    "transformers fuses the gate and up weights.", "Experts"),))
        gate = replace(gate, notes=gate.notes + (BUFFER_NOTE,))
        return moe(ctx, x=x, y_latex=y_latex, router_c=gate, expert=experts, shared=None,
                   code="MiMoV2FlashMoE(config)", citations=(
                       REFERENCE.cite("The MoE routes each token to its top-k experts and sums their weighted "
                                      "outputs; unlike DeepSeek-V3's it has no shared expert.", "MoE"),))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: each block kind once, window 3 < T = 5 with sinks, 4 query heads over 1
        (global) or 2 (sliding) key/value heads, q/k heads 24 wide and value heads 16, 8 rotary features, top 2 of
        4 experts."""
        raw = {f.name: as_published(getattr(c, f.name)) for f in dataclasses.fields(c)}
        pairs = list(dict.fromkeys(zip(layer_types(c), mlp_types(c))))
        kinds, mlps = [t for t, _ in pairs], [m for _, m in pairs]
        raw.update(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                   num_hidden_layers=len(pairs), num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                   v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                   max_position_embeddings=256, sliding_window=3, sliding_window_size=2 if c.sliding_window_size
                   is not None else None, layer_types=kinds, mlp_layer_types=mlps,
                   hybrid_layer_pattern=[0 if t == "full_attention" else 1 for t in kinds],
                   moe_layer_freq=[1 if m == "sparse" else 0 for m in mlps],
                   swa_num_attention_heads=4 if c.swa_num_attention_heads is not None else None,
                   swa_num_key_value_heads=2 if c.swa_num_key_value_heads is not None else None,
                   swa_head_dim=24 if c.swa_head_dim is not None else None,
                   swa_v_head_dim=16 if c.swa_v_head_dim is not None else None,
                   bos_token_id=0, eos_token_id=1, pad_token_id=None, quantization_config=None)
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        kinds = layer_types(c)
        n_sliding = sum(t == "sliding_attention" for t in kinds)
        return (("transformer blocks", f"{c.num_hidden_layers:,} ({n_sliding} sliding, {len(kinds) - n_sliding} "
                                       "global)"),
                ("routed experts", f"{c.n_routed_experts} (top {c.num_experts_per_tok})"),
                ("attention heads", f"{c.num_attention_heads} query; {c.num_key_value_heads} key/value (global), "
                                    f"{2 * c.num_key_value_heads} (sliding)"),
                ("head widths", f"{c.head_dim} query/key, {c.v_head_dim} value"),
                ("sliding window", f"{window(c):,} positions"),
                ("vocabulary", f"{c.vocab_size:,}"))


def options_of(attn: Component) -> ScoresOptions:
    so = attn.child("scores").options
    assert isinstance(so, ScoresOptions)
    return so


FAMILY = MiMoV2Flash()
