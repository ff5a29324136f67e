"""The Gemma 4 family (Gemma 4 26B-A4B and configs like it): Gemma 3's layout (a √d-scaled embedding, sandwich
RMSNorms, per-head q/k RMSNorms, interleaved sliding-window and global layers, a tied head) with
  - global layers of their own shape: a wider head (global_head_dim) over fewer key/value heads
    (num_global_key_value_heads), whose keys double as values (attention_k_eq_v: no v_proj), rotated on a quarter of
    their pairs only (proportional partial rotary);
  - values scaled to unit RMS (v_norm) and a softmax scale of 1 on every layer (the normed q and k fix the scale);
  - RMSNorms whose gain is w itself (initialised to 1), not Gemma 3's 1 + w;
  - a mixture of experts beside the dense GeGLU MLP in every block (enable_moe_block), each branch with its own norms;
  - a stored scalar per layer (layer_scalar, a persistent buffer) and soft-capped final logits;
  - a vision tower of its own (2-D position table, axial rotary, pooling, standardisation) and an embedder.

References: Gemma 4 model card (Google DeepMind, 2026); "Gemma 3 Technical Report" (arXiv:2503.19786) for the
layout it extends; transformers' models/gemma4/modeling_gemma4.py and configuration_gemma4.py (the reference
binding: Gemma4Config, Gemma4ForConditionalGeneration).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, model_root, stack
from explorer.model.components.embedding import embedding, head, sqrt_width_scale
from explorer.model.components.gemma4_vision import Gemma4VisionOptions, embedder, grid_width, vision_tower
from explorer.model.components.layer_attention import LayerAttentionOptions, LayerShape, layer_attention
from explorer.model.components.layer_blocks import layer_block
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.norms import NormOptions, rmsnorm
from explorer.model.components.parallel_moe import (
    HalvesExpertsOptions,
    ScaledRouterOptions,
    halves_experts,
    moe_beside_mlp,
    scaled_router,
)
from explorer.model.components.rope import RopeOptions
from explorer.model.components.softcap import softcapped
from explorer.model.families.base import DIM_LABELS, Family, ReferenceBinding, rule_problems, stored_dtype, tower_label
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_block_storage,
    fp8_problems,
    keep_named_modules_dense,
)
from explorer.spec.types import Citation, Component, Hyperparameters, ModelSpec

REFERENCE = Reference("models/gemma4/modeling_gemma4.py", "Gemma4Text")
MODEL_REFERENCE = Reference("models/gemma4/modeling_gemma4.py", "Gemma4")
SLIDING, GLOBAL = "sliding_attention", "full_attention"
LABELS = {**DIM_LABELS, "global_head_dim": "d_head_global", "num_global_key_value_heads": "kv_heads_global",
          "num_experts": "experts", "vision_hidden_size": "d_vision", "vision_intermediate_size": "d_ff_vision",
          "vision_heads": "heads_vision", "vision_head_dim": "d_head_vision", "patch_size": "patch",
          "patch_values": "3·patch²", "position_embedding_size": "pos_table", "num_patches": "patches",
          "soft_tokens": "soft tokens"}


@dataclass(frozen=True, slots=True)
class LayerRope:
    """One layer type's entry of rope_parameters."""

    rope_type: str = "default"
    rope_theta: float = 10_000.0
    partial_rotary_factor: float | None = None


@dataclass(frozen=True, slots=True)
class RopeParameters:
    full_attention: LayerRope = LayerRope("proportional", 1_000_000.0, 0.25)
    sliding_attention: LayerRope = LayerRope("default", 10_000.0)


@dataclass(frozen=True, slots=True)
class Gemma4TextHyperparameters(Hyperparameters):
    """Gemma4TextConfig's keys, named as published; absent keys take its defaults (transformers 5.23)."""

    vocab_size: int = 262_144
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 30
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    global_head_dim: int = 512
    """Head width of the global (full-attention) layers."""
    num_global_key_value_heads: int | None = None
    """Key/value heads of the global layers when attention_k_eq_v (None: num_key_value_heads)."""
    attention_k_eq_v: bool = False
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 131_072
    rms_norm_eps: float = 1e-6
    rope_parameters: RopeParameters = RopeParameters()
    sliding_window: int = 512
    layer_types: tuple[str, ...] | None = None
    final_logit_softcapping: float | None = None
    enable_moe_block: bool = False
    num_experts: int | None = None
    top_k_experts: int | None = None
    moe_intermediate_size: int | None = None
    hidden_size_per_layer_input: int = 256
    vocab_size_per_layer_input: int = 262_144
    num_kv_shared_layers: int = 0
    use_double_wide_mlp: bool = False
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    dtype: str = "bfloat16"
    # Informational keys: recorded as published, not used by the spec.
    use_bidirectional_attention: str | None = None
    """"vision": image tokens see each other both ways; text stays causal (the pages describe text)."""
    model_type: str = "gemma4_text"
    bos_token_id: int | None = 2
    eos_token_id: Any = 1
    pad_token_id: int | None = 0
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    use_cache: bool = True


@dataclass(frozen=True, slots=True)
class VisionRope:
    rope_type: str = "axial"
    rope_theta: float = 100.0


@dataclass(frozen=True, slots=True)
class Gemma4VisionHyperparameters(Hyperparameters):
    """Gemma4VisionConfig's keys; absent keys take its defaults."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 16
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    head_dim: int = 64
    hidden_activation: str = "gelu_pytorch_tanh"
    rms_norm_eps: float = 1e-6
    rope_parameters: VisionRope = VisionRope()
    pooling_kernel_size: int = 3
    patch_size: int = 16
    position_embedding_size: int = 10_240
    use_clipped_linears: bool = False
    standardize: bool = False
    attention_bias: bool = False
    # Informational keys: recorded as published, not used by the spec.
    global_head_dim: int | None = None
    default_output_length: int | None = None
    max_position_embeddings: int = 131_072
    dtype: str = "bfloat16"
    model_type: str = "gemma4_vision"
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    chunk_size_feed_forward: int = 0
    is_encoder_decoder: bool = False
    output_attentions: bool = False
    output_hidden_states: bool = False
    return_dict: bool = True
    id2label: dict[str, str] = field(default_factory=dict)
    label2id: dict[str, int] = field(default_factory=dict)
    _name_or_path: str = ""
    architectures: tuple[str, ...] | None = None
    problem_type: str | None = None


@dataclass(frozen=True, slots=True)
class Gemma4Hyperparameters(Hyperparameters):
    """Gemma4Config: the text and vision configs (no audio tower in this family's models) and token ids."""

    text_config: Gemma4TextHyperparameters
    vision_config: Gemma4VisionHyperparameters
    vision_soft_tokens_per_image: int = 280
    tie_word_embeddings: bool = True
    dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8: every nn.Linear transformers' FP8 quantizer converts (projections, routers, experts, the
    vision tower's) in FP8 with a scale per block."""
    audio_config: None = None
    architectures: tuple[str, ...] = ()
    model_type: str = "gemma4"
    transformers_version: str = ""
    initializer_range: float = 0.02
    boi_token_id: int | None = 255_999
    eoi_token_id: int | None = 258_882
    image_token_id: int | None = 258_880
    video_token_id: int | None = 258_884
    boa_token_id: int | None = 256_000
    eoa_token_id: int | None = None
    eoa_token_index: int | None = 258_883
    audio_token_id: int | None = 258_881


def layer_types(t: Gemma4TextHyperparameters) -> tuple[str, ...]:
    """As published, or every sixth layer global; the reference forces the last layer global."""
    types = list(t.layer_types) if t.layer_types is not None else [
        SLIDING if (i + 1) % 6 else GLOBAL for i in range(t.num_hidden_layers)]
    if types:
        types[-1] = GLOBAL
    return tuple(types)


def global_kv_heads(t: Gemma4TextHyperparameters) -> tuple[int, str]:
    """The global layers' key/value heads and the config key they come from."""
    if t.attention_k_eq_v and t.num_global_key_value_heads is not None:
        return t.num_global_key_value_heads, "num_global_key_value_heads"
    return t.num_key_value_heads, "num_key_value_heads"


class Gemma4(Family):
    name = "gemma4"
    model_types = ("gemma4",)
    config_class: ClassVar[type] = Gemma4Hyperparameters
    reference = ReferenceBinding("Gemma4Config", "Gemma4ForConditionalGeneration")
    symbols: ClassVar[tuple[str, ...]] = tuple(LABELS)
    prefix: ClassVar[str] = "model.language_model."

    def values(self, c: Any) -> dict[str, int | float]:
        t, v = c.text_config, c.vision_config
        k = v.pooling_kernel_size
        out: dict[str, int | float] = {n: getattr(t, n) for n in (
            "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "global_head_dim")}
        out["num_global_key_value_heads"] = global_kv_heads(t)[0]
        if t.enable_moe_block:
            out.update(num_experts=t.num_experts, moe_intermediate_size=t.moe_intermediate_size,
                       num_experts_per_tok=t.top_k_experts)
        out.update(vision_hidden_size=v.hidden_size, vision_intermediate_size=v.intermediate_size,
                   vision_heads=v.num_attention_heads, vision_head_dim=v.head_dim, patch_size=v.patch_size,
                   patch_values=3 * v.patch_size ** 2, position_embedding_size=v.position_embedding_size,
                   soft_tokens=c.vision_soft_tokens_per_image, num_patches=c.vision_soft_tokens_per_image * k * k)
        return out

    def default_source(self, key: str) -> str:
        return {"text_config": "Gemma4TextConfig", "vision_config": "Gemma4VisionConfig"}.get(key.split(".")[0],
                                                                                             "Gemma4Config")

    def check(self, c: Any) -> list[str]:
        t, v, w = c.text_config, c.vision_config, "text_config."
        types = layer_types(t)
        rules = [
            (t.num_attention_heads % t.num_key_value_heads == 0, w + "num_key_value_heads",
             f"must divide num_attention_heads ({t.num_attention_heads})"),
            (t.num_attention_heads % global_kv_heads(t)[0] == 0, w + "num_global_key_value_heads",
             f"must divide num_attention_heads ({t.num_attention_heads})"),
            (t.head_dim % 2 == 0 and t.global_head_dim % 2 == 0, w + "head_dim", "head widths must be even"),
            (t.hidden_activation == "gelu_pytorch_tanh", w + "hidden_activation", "must be 'gelu_pytorch_tanh'"),
            (len(types) == t.num_hidden_layers and set(types) <= {SLIDING, GLOBAL}, w + "layer_types",
             f"must give {t.num_hidden_layers} entries, each '{SLIDING}' or '{GLOBAL}'"),
            (t.hidden_size_per_layer_input == 0, w + "hidden_size_per_layer_input",
             "must be 0: per-layer input embeddings (Gemma 4's small models) are not in the library yet"),
            (t.num_kv_shared_layers == 0, w + "num_kv_shared_layers",
             "must be 0: layers sharing another layer's keys and values are not in the library yet"),
            (not t.attention_bias, w + "attention_bias", "must be false"),
            (not t.enable_moe_block or None not in (t.num_experts, t.top_k_experts, t.moe_intermediate_size),
             w + "num_experts", "enable_moe_block needs num_experts, top_k_experts and moe_intermediate_size"),
            (not t.enable_moe_block or (t.top_k_experts or 0) <= (t.num_experts or 0), w + "top_k_experts",
             "must be <= num_experts"),
            (t.rope_parameters.sliding_attention.rope_type == "default", w + "rope_parameters.sliding_attention",
             "rope_type must be 'default'"),
            (t.rope_parameters.full_attention.rope_type in ("default", "proportional"),
             w + "rope_parameters.full_attention", "rope_type must be 'default' or 'proportional'"),
            (c.tie_word_embeddings == t.tie_word_embeddings, "tie_word_embeddings",
             "must agree with text_config.tie_word_embeddings"),
            (v.hidden_size == v.num_attention_heads * v.head_dim and v.head_dim % 4 == 0, "vision_config.head_dim",
             "must be hidden_size / num_attention_heads and divisible by 4 (two rotary axes of pairs)"),
            (v.num_key_value_heads == v.num_attention_heads, "vision_config.num_key_value_heads",
             "must equal num_attention_heads"),
            (not v.use_clipped_linears, "vision_config.use_clipped_linears", "must be false (no clipping buffers)"),
            (v.rope_parameters.rope_type in ("axial", "default"), "vision_config.rope_parameters.rope_type",
             "must be 'axial' (published as 'default', which Gemma4VisionConfig reads as its axial rotary)"),
        ]
        return rule_problems(rules) + fp8_problems(c.quantization_config)

    def defaulted(self, raw: dict[str, Any]) -> tuple[str, ...]:
        text, vision = raw.get("text_config", {}), raw.get("vision_config", {})
        tk = [f.name for f in dataclasses.fields(Gemma4TextHyperparameters)]
        vk = [f.name for f in dataclasses.fields(Gemma4VisionHyperparameters)]
        return (tuple(f"text_config.{k}" for k in tk[:tk.index("dtype")] if k not in text)
                + tuple(f"vision_config.{k}" for k in vk[:vk.index("attention_bias")] if k not in vision))

    def build_spec(self, slug: str, raw: dict[str, Any], where: str):
        spec = super().build_spec(slug, raw, where)
        return replace(spec, defaulted=self.defaulted(raw))

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        t, v = c.text_config, c.vision_config
        ctx = Ctx(values, LABELS, REFERENCE, stored_dtype(c.dtype), fp8_block_storage(c.quantization_config),
                  citations={"rmsnorm": _norm_citation()})
        L, p = t.num_hidden_layers, self.prefix
        types = layer_types(t)
        blocks = tuple(self.block(ctx, t, kind, tuple(i for i, k in enumerate(types) if k == kind))
                       for kind in (SLIDING, GLOBAL) if kind in types)
        scale = sqrt_width_scale(t.hidden_size, stored_dtype(c.dtype))
        embed = embedding(ctx, "embed", "Token embedding (scaled by √d)", weight=p + "embed_tokens.weight",
                          scale=scale, citations=(REFERENCE.cite(
                              "The embedding multiplies each row by hidden_size ** 0.5 in the weights' dtype.",
                              "ScaledWordEmbedding"),))
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        tied = p + "embed_tokens.weight" if t.tie_word_embeddings else ""
        lm_head = head(ctx, "lm_head", "LM head", weight="lm_head.weight", tied_to=tied, citations=(
            MODEL_REFERENCE.cite("lm_head is a bias-free Linear to the vocabulary, tied to the token embedding.",
                                 "ForConditionalGeneration"),))
        if t.final_logit_softcapping is not None:
            lm_head = softcapped(lm_head, t.final_logit_softcapping, MODEL_REFERENCE.cite(
                "The model divides the logits by final_logit_softcapping, applies tanh and multiplies back.",
                "ForConditionalGeneration.forward"))
        n_global = types.count(GLOBAL)
        text = (embed,
                stack(ctx, blocks, layers=L, citations=(REFERENCE.cite(
                    "The model computes rotary cos/sin per layer type and hands each layer the mask of its type "
                    "(sliding window or causal).", "Model.forward"),),
                      description=f"{L} decoder layers: {L - n_global} sliding-window and {n_global} global, "
                                  "interleaved, each with "
                                  + ("a dense MLP and a mixture of experts side by side." if t.enable_moe_block
                                     else "a dense MLP.")),
                rmsnorm(ctx, "norm", "Final RMSNorm", weight=p + "norm.weight", ranges=(), size="hidden_size", x=x,
                        y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=t.rms_norm_eps,
                        citations=_norm_citation()),
                lm_head)
        root = model_root(ctx, text, code="Gemma4ForConditionalGeneration(config)", layers=L,
                          citations=text[1].citations,
                          description=f"A √d-scaled token embedding, {L} transformer blocks, a final RMSNorm and a "
                                      "tied LM head" + (" with soft-capped logits." if t.final_logit_softcapping else "."))
        vo = Gemma4VisionOptions(v.num_attention_heads, v.head_dim, v.rms_norm_eps, v.rope_parameters.rope_theta,
                                 v.pooling_kernel_size, v.standardize,
                                 grid_width(c.vision_soft_tokens_per_image, v.pooling_kernel_size))
        tower = vision_tower(ctx, prefix="model.vision_tower.", layers=v.num_hidden_layers, o=vo)
        emb = embedder(ctx, prefix="model.embed_vision.", eps=v.rms_norm_eps)
        root = replace(root, children=root.children + (tower, emb),
                       description=root.description + f" Beside it, a {v.num_hidden_layers}-block vision tower and an "
                       f"embedder turn an image into {c.vision_soft_tokens_per_image} soft tokens of the text width.")
        # the embedder's projection is the model's last parameter: transformers keeps it by default
        return keep_named_modules_dense(root, c.quantization_config, stored_dtype(c.dtype), self.reference_module,
                                        f"{self.name} config", default_kept=("model.embed_vision.embedding_projection",))

    def block(self, ctx: Ctx, t: Gemma4TextHyperparameters, kind: str, indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), self.prefix + "layers.{layer}."
        x, x_attn, x_mid, x_ffn, d_attn, d_ffn = block_ports(ctx)
        eps, sliding = t.rms_norm_eps, kind == SLIDING
        if sliding:
            shape = LayerShape.of(ctx, ctx.sym("num_attention_heads"), ctx.sym("num_key_value_heads"),
                                  ctx.sym("head_dim"))
            lr = t.rope_parameters.sliding_attention
            ro = RopeOptions("default", lr.rope_theta, t.head_dim, "half", layer_type=SLIDING)
        else:
            _, kv_key = global_kv_heads(t)
            shape = LayerShape.of(ctx, ctx.sym("num_attention_heads"), ctx.sym(kv_key), ctx.sym("global_head_dim"))
            lr = t.rope_parameters.full_attention
            factor = lr.partial_rotary_factor if lr.rope_type == "proportional" and lr.partial_rotary_factor else 1.0
            rotated = int(factor * t.global_head_dim // 2)
            ro = RopeOptions("default", lr.rope_theta, t.global_head_dim, "half", layer_type=GLOBAL,
                             zero_frequency_pairs=t.global_head_dim // 2 - rotated)
        o = LayerAttentionOptions(shape, 1.0, qk_norm="per_head", norm=NormOptions("rms", eps), eps=eps,
                                  keys_as_values=t.attention_k_eq_v and not sliding, value_norm=True,
                                  window=t.sliding_window if sliding else None)
        attn = layer_attention(ctx, prefix=p + "self_attn.", ranges=ranges, x=x_attn, o=o, rope_options=ro,
                               code="Gemma4TextAttention(config, layer_idx)",
                               rope_reference=self.prefix + "rotary_emb", citations=(
                                   REFERENCE.cite("Attention normalises q and k per head (q_norm, k_norm), scales v "
                                                  "to unit RMS (v_norm), rotates q and k and attends with scaling 1; "
                                                  "global layers take their own head_dim and key/value heads from "
                                                  "per_layer_config.", "Attention"),))

        def norm(key: str, title: str, module: str, xp: Port, yp: Port) -> Component:
            return rmsnorm(ctx, key, title, weight=p + module + ".weight", ranges=ranges, size="hidden_size", x=xp,
                           y=yp, code=f"self.{module}(hidden_states)", eps=eps, citations=_norm_citation())

        dense_y = Port(r"\Delta_{\mathrm{mlp}}", x.shape, "delta_mlp") if t.enable_moe_block else d_ffn
        mlp = gated_mlp(ctx, "mlp", "GeGLU MLP", "GeGLU", prefix=p + "mlp.", ranges=ranges,
                        d_ff=ctx.sym("intermediate_size"), ff_dim=ctx.dim("intermediate_size"), x=x_ffn, y=dense_y,
                        act="gelu_tanh", code="Gemma4TextMLP(config, layer_idx)",
                        description=f"A dense GeGLU MLP of width {t.intermediate_size:,}.",
                        citations=(REFERENCE.cite("The MLP is down(gelu_tanh(gate x) ⊙ up x).", "MLP"),))
        ffn = self.moe_beside(ctx, t, p, ranges, x_ffn, x_mid, d_ffn, mlp, norm) if t.enable_moe_block else mlp
        what = f"sliding-window attention over {t.sliding_window:,} positions" if sliding else (
            f"global attention with {shape.kv_heads} key heads of {shape.qk_head_dim}"
            + (" that double as values" if o.keys_as_values else ""))
        return layer_block(
            ctx, "local" if sliding else "global", "Sliding-window block" if sliding else "Global block",
            ranges=ranges, scalar_name=p + "layer_scalar", layer_indices=indices,
            kind="sliding-window" if sliding else "global", attn_heading=attn.title,
            ffn_heading="Dense MLP and experts, side by side:" if t.enable_moe_block else "GeGLU MLP:",
            attn_norm=norm("attn_norm", "Pre-attention RMSNorm", "input_layernorm", x, x_attn), attn=attn,
            post_attn_norm=norm("post_attn_norm", "Post-attention RMSNorm", "post_attention_layernorm", d_attn,
                                Port(r"\bar\Delta_{\mathrm{attn}}", x.shape, "delta_attn_hat")),
            ffn_norm=norm("ffn_norm", "Pre-MLP RMSNorm", "pre_feedforward_layernorm", x_mid, x_ffn), ffn=ffn,
            post_ffn_norm=norm("post_ffn_norm", "Post-FFN RMSNorm", "post_feedforward_layernorm", d_ffn,
                               Port(r"\bar\Delta_{\mathrm{ffn}}", x.shape, "delta_ffn_hat")),
            citations=(REFERENCE.cite("A block wraps attention and the feed-forward part each in two RMSNorms, runs "
                                      "the experts beside the MLP from the same residual stream, and multiplies the "
                                      "block's output by layer_scalar.", "DecoderLayer"),),
            description=f"{what.capitalize()} and "
                        + ("a dense MLP with a mixture of experts beside it" if t.enable_moe_block else "a GeGLU MLP")
                        + f", each between RMSNorms and added to the residual stream; {layer_label(indices)}.")

    def moe_beside(self, ctx: Ctx, t: Gemma4TextHyperparameters, p: str, ranges, x_ffn: Port, x_mid: Port,
                   y: Port, mlp: Component, norm) -> Component:
        E, k = int(t.num_experts or 0), int(t.top_k_experts or 0)  # check() makes both present
        moe_in = Port(r"x_{\mathrm{moe}}", x_mid.shape, "x_moe")
        routed = Port(r"y^{\mathrm{routed}}", x_mid.shape, "routed")
        router_c = scaled_router(ctx, prefix=p + "router.", ranges=ranges, x=x_mid,
                                 o=ScaledRouterOptions(E, k, t.rms_norm_eps), experts_sym="num_experts",
                                 citations=(REFERENCE.cite("The router normalises the stream without a gain, multiplies "
                                                           "by scale and hidden_size ** -0.5, takes a softmax over the "
                                                           "experts, keeps the top_k_experts, renormalises them and "
                                                           "multiplies by per_expert_scale.", "Router"),))
        experts_c = halves_experts(ctx, prefix=p + "experts.", ranges=ranges, x=moe_in, gates=router_c.outputs[0],
                                   o=HalvesExpertsOptions(E), experts_sym="num_experts", width="moe_intermediate_size",
                                   code="Gemma4TextExperts(config)", citations=(REFERENCE.cite(
                                       "gate_up_proj [E, 2·I, d] splits into gate and up halves; each selected expert's "
                                       "output is weighted by its router weight.", "Experts"),))
        return moe_beside_mlp(
            ctx, x_ffn=x_ffn, x_mid=x_mid, y=y, mlp=mlp,
            post_mlp_norm=norm("post_mlp_norm", "Post-MLP RMSNorm", "post_feedforward_layernorm_1", mlp.outputs[0],
                               Port(r"\bar\Delta_{\mathrm{mlp}}", x_mid.shape, "delta_mlp_hat")),
            router_c=router_c,
            pre_moe_norm=norm("pre_moe_norm", "Pre-experts RMSNorm", "pre_feedforward_layernorm_2", x_mid, moe_in),
            experts_c=experts_c,
            post_moe_norm=norm("post_moe_norm", "Post-experts RMSNorm", "post_feedforward_layernorm_2", routed,
                               Port(r"\bar y^{\mathrm{routed}}", x_mid.shape, "routed_hat")),
            citations=(REFERENCE.cite("With enable_moe_block, the layer adds post_feedforward_layernorm_1(mlp output) "
                                      "and post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(stream)))",
                                      "DecoderLayer.forward"),))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: 4 query heads over 2 KV heads on sliding layers and 1 (wider) on the global
        one, keys as values, window 3 < T = 5, a quarter of the global pairs rotated, top-2 of 4 experts beside the
        MLP, the vision tower on a 4×4 patch grid pooled 2×2."""
        t, v = c.text_config, c.vision_config
        text = _as_dict(t)
        moe = dict(num_experts=4, top_k_experts=2, moe_intermediate_size=16) if t.enable_moe_block else {}
        text.update(vocab_size=97, hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, global_head_dim=32,
                    num_global_key_value_heads=1 if t.num_global_key_value_heads is not None else None,
                    sliding_window=3, layer_types=[SLIDING, SLIDING, GLOBAL],
                    max_position_embeddings=256, vocab_size_per_layer_input=97, bos_token_id=0, eos_token_id=1,
                    pad_token_id=None, dtype="float32", **moe)
        vision = _as_dict(v)
        vision.update(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, head_dim=8, patch_size=2, pooling_kernel_size=2,
                      position_embedding_size=16, global_head_dim=None, default_output_length=None, dtype="float32")
        raw = _as_dict(c)
        raw.update(text_config={k: x for k, x in text.items() if x is not None},
                   vision_config={k: x for k, x in vision.items() if x is not None}, vision_soft_tokens_per_image=4,
                   dtype="float32", audio_config=None, quantization_config=None)
        return {k: x for k, x in raw.items() if x is not None}

    def tiny_label_towers(self, tiny: ModelSpec) -> tuple[str, ...]:
        return (tower_label(tiny, "vision_hidden_size"),)

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        t = c.text_config
        types = layer_types(t)
        kvh, _ = global_kv_heads(t)
        out: tuple[tuple[str, str], ...] = (("transformer blocks", f"{t.num_hidden_layers:,} ({types.count(SLIDING)} sliding, "
                                      f"{types.count(GLOBAL)} global)"),
               ("attention heads", f"{t.num_attention_heads} query; {t.num_key_value_heads} key/value of "
                                   f"{t.head_dim} (sliding), {kvh} of {t.global_head_dim} (global)"))
        if t.enable_moe_block:
            out += (("routed experts", f"{t.num_experts} (top {t.top_k_experts}) beside a dense MLP"),)
        return out + (("vocabulary", f"{t.vocab_size:,}"),)


def _norm_citation() -> tuple[Citation, ...]:
    return (MODEL_REFERENCE.cite("Gemma 4's RMSNorm multiplies by its weight (initialised to ones), in float32; "
                                 "unlike Gemma 3 there is no 1 + w.", "RMSNorm"),)


def _as_dict(config: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {k: x for k, x in _as_dict(value).items() if x is not None}
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


FAMILY = Gemma4()
