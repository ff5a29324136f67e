"""The Qwen3.5 families: a hybrid decoder whose layers follow layer_types, three Gated DeltaNet (linear-attention)
layers for every gated full-attention layer in the published configs, each followed by a SwiGLU MLP (`qwen3_5`,
Qwen3.5-27B) or by routed experts with a gated shared expert (`qwen3_5_moe`, Qwen3.5-35B-A3B); RMSNorms whose gain is
1 + w; a vision tower and merger beside the text model (Qwen3_5ForConditionalGeneration).

References: "Gated Delta Networks: Improving Mamba2 with Delta Rule" (arXiv:2412.06464); "Gated Attention for Large
Language Models" (arXiv:2505.06708); Qwen3 Technical Report (arXiv:2505.09388) for the predecessor; transformers'
models/qwen3_5/modeling_qwen3_5.py and models/qwen3_5_moe/modeling_qwen3_5_moe.py (the reference bindings).
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
from explorer.model.components.gated_attention import gated_attention
from explorer.model.components.gated_deltanet import DeltaNetOptions, gated_deltanet, recurrent_block
from explorer.model.components.gated_shared_expert import gated_shared_expert
from explorer.model.components.layer_pattern import LayerPattern, from_layer_types
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.moe import RouterOptions, moe, routed_experts, router
from explorer.model.components.norms import rmsnorm
from explorer.model.components.qwen_vision import LABELS as VISION_LABELS
from explorer.model.components.qwen_vision import VisionOptions, qwen_vision_tower
from explorer.model.components.rope import RopeOptions
from explorer.model.families.base import DIM_LABELS, Family, ReferenceBinding, rule_problems, stored_dtype, tower_label
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_block_storage,
    fp8_problems,
    keep_named_modules_dense,
)
from explorer.model.families.declared_mtp import declared_mtp, mtp_norm, mtp_projection
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Citation, Component, DeclaredMTP, Hyperparameters, IndexRange, ModelSpec

LINEAR, FULL = "linear_attention", "full_attention"
KINDS = {LINEAR: ("linear", "Gated DeltaNet block"), FULL: ("full", "Gated-attention block")}
"""layer_types values -> block key and title."""
LETTERS = {LINEAR: "L", FULL: "F"}
LABELS = {**DIM_LABELS, **VISION_LABELS, "linear_num_key_heads": "k_heads", "linear_num_value_heads": "v_heads",
          "linear_key_head_dim": "d_k", "linear_value_head_dim": "d_v", "linear_conv_kernel_dim": "kernel",
          "num_experts": "experts", "shared_expert_intermediate_size": "d_shared"}
TEXT_SYMBOLS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim")
DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}
DENSE_WIDTH = 12_288
"""Qwen3_5TextConfig's default intermediate_size."""
MOE_SYMBOLS = ("moe_intermediate_size", "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok")


@dataclass(frozen=True, slots=True)
class RopeParameters:
    """text_config.rope_parameters: the base, the rotated share of each head and the multimodal sections."""

    rope_type: str = "default"
    rope_theta: float = 10_000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    """Rotary pairs given to the temporal, height and width positions of an image token; text tokens have one
    position in all three, so their angles are the plain ones."""
    mrope_interleaved: bool = False


@dataclass(frozen=True, slots=True)
class Qwen3_5TextHyperparameters:
    """Qwen3_5TextConfig's keys, named as published; absent keys take its defaults (transformers 5.23)."""

    vocab_size: int = 248_320
    hidden_size: int = 4096
    intermediate_size: int | None = None
    """The dense MLP's width (Qwen3_5TextConfig's default 12,288 where absent); Qwen3.5-MoE has none."""
    num_hidden_layers: int = 32
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 256
    hidden_act: str = "silu"
    max_position_embeddings: int = 32_768
    rms_norm_eps: float = 1e-6
    rope_parameters: RopeParameters | None = None
    attention_bias: bool = False
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    layer_types: tuple[str, ...] | None = None
    full_attention_interval: int = 4
    """Without layer_types, every full_attention_interval-th layer is full attention."""
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    # MoE keys (qwen3_5_moe_text); None in the dense family
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    # Informational keys: recorded as published, not used by the spec.
    attn_output_gate: bool = True
    """Published as true; the reference always builds the output gate."""
    mtp_num_hidden_layers: int = 0
    """Multi-token-prediction layers the checkpoint stores under mtp.*; transformers does not build them."""
    mtp_use_dedicated_embeddings: bool = False
    mamba_ssm_dtype: str = "float32"
    mlp_only_layers: tuple[int, ...] = ()
    model_type: str = "qwen3_5_text"
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    use_cache: bool = True
    router_aux_loss_coef: float = 0.001
    output_router_logits: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    partial_rotary_factor: float | None = None
    """The legacy top-level copy of rope_parameters.partial_rotary_factor, which transformers' rope standardisation
    reads only where rope_parameters has none (Qwen3.6's configs publish both); where both are published they must
    agree, and rope_parameters' is the one built."""


ARCHITECTURE_KEYS = tuple(f.name for f in dataclasses.fields(Qwen3_5TextHyperparameters))[:21]


@dataclass(frozen=True, slots=True)
class Qwen3_5VisionHyperparameters:
    """Qwen3_5VisionConfig's keys; absent keys take its defaults."""

    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = ()
    initializer_range: float = 0.02
    model_type: str = "qwen3_5_vision"


@dataclass(frozen=True, slots=True)
class Qwen3_5Hyperparameters(Hyperparameters):
    """Qwen3_5Config (and Qwen3_5MoeConfig): the text and vision configs and the special token ids."""

    text_config: Qwen3_5TextHyperparameters
    vision_config: Qwen3_5VisionHyperparameters
    tie_word_embeddings: bool = False
    image_token_id: int = 248_056
    video_token_id: int = 248_057
    vision_start_token_id: int = 248_053
    vision_end_token_id: int = 248_054
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8: every nn.Linear transformers' FP8 quantizer converts (text and vision tower alike) in FP8
    with a scale per block; embeddings, norms, the DeltaNet convolution and the routers stay in the model's dtype."""
    architectures: tuple[str, ...] = ()
    model_type: str = "qwen3_5"
    transformers_version: str = ""


def layer_pattern(t: Qwen3_5TextHyperparameters) -> LayerPattern:
    """Each layer's kind, read once: as published, or every full_attention_interval-th layer full attention."""
    return from_layer_types(t.layer_types, t.num_hidden_layers, t.full_attention_interval, LINEAR, FULL)


def rope_of(t: Qwen3_5TextHyperparameters) -> RopeParameters:
    return t.rope_parameters or RopeParameters()


class Qwen3_5(Family):
    """The dense hybrid: Qwen3_5ForConditionalGeneration."""

    name = "qwen3_5"
    model_types = ("qwen3_5",)
    config_class: ClassVar[type] = Qwen3_5Hyperparameters
    reference = ReferenceBinding("Qwen3_5Config", "Qwen3_5ForConditionalGeneration")
    ref = Reference("models/qwen3_5/modeling_qwen3_5.py", "Qwen3_5")
    symbols: ClassVar[tuple[str, ...]] = TEXT_SYMBOLS + tuple(VISION_LABELS)
    prefix = "model.language_model."

    # ----------------------------------------------------------------- hooks: the text model and what is beside it

    text_model_symbol: ClassVar[str] = "TextModel"
    """The reference's text-model class, after the family's prefix (Qwen3_5TextModel)."""
    head_symbol: ClassVar[str] = "ForConditionalGeneration"
    """The reference's class that holds lm_head, after the prefix."""
    rope_symbol: ClassVar[str] = "TextRotaryEmbedding"
    """The reference's text rotary module, after the prefix."""

    text_key: ClassVar[str] = "text_config."
    """Where the text model's keys are in the config, for the problems check() names."""

    def text(self, c: Any) -> Any:
        """The text model's config (here the nested text_config; a text-only family's whole config)."""
        return c.text_config

    def rope_key(self, name: str) -> str:
        """The config key of a rotary setting, for check()'s problems."""
        return f"{self.text_key}rope_parameters.{name}"

    def rope(self, t: Any) -> RopeParameters:
        return rope_of(t)

    def dtype(self, t: Any) -> str:
        """The text model's dtype as published."""
        return t.dtype

    def state_dtype(self, t: Any) -> str:
        """The recurrent state's cache dtype (the config's mamba_ssm_dtype)."""
        return t.mamba_ssm_dtype

    def values(self, c: Any) -> dict[str, int | float]:
        t = self.text(c)
        out: dict[str, int | float] = {n: getattr(t, n) for n in TEXT_SYMBOLS if getattr(t, n) is not None}
        if "intermediate_size" in self.symbols:
            out["intermediate_size"] = t.intermediate_size or DENSE_WIDTH
        out.update({n: getattr(t, n) for n in MOE_SYMBOLS if getattr(t, n) is not None})
        return {**out, **self.vision_values(c)}

    def vision_values(self, c: Any) -> dict[str, int | float]:
        v = c.vision_config
        return dict(vit_hidden_size=v.hidden_size, vit_intermediate_size=v.intermediate_size,
                    vit_patch_values=v.in_channels * v.temporal_patch_size * v.patch_size ** 2,
                    vit_positions=v.num_position_embeddings, vit_merged_size=v.hidden_size * v.spatial_merge_size ** 2,
                    vit_out_hidden_size=v.out_hidden_size, vit_in_channels=v.in_channels,
                    vit_temporal_patch_size=v.temporal_patch_size, vit_patch_size=v.patch_size)

    def check(self, c: Any) -> list[str]:
        return self.text_problems(c) + self.vision_problems(c) + fp8_problems(c.quantization_config)

    def text_problems(self, c: Any) -> list[str]:
        t = self.text(c)
        pattern = layer_pattern(t)
        rp = self.rope(t)
        rot = int(t.head_dim * rp.partial_rotary_factor)
        return rule_problems([
            (len(pattern.kinds) == t.num_hidden_layers and set(pattern.kinds) <= {LINEAR, FULL},
             self.text_key + "layer_types", f"must give {t.num_hidden_layers} entries, each '{LINEAR}' or '{FULL}'"),
            (t.num_attention_heads % t.num_key_value_heads == 0, self.text_key + "num_key_value_heads",
             f"must divide num_attention_heads ({t.num_attention_heads})"),
            (t.linear_num_value_heads % t.linear_num_key_heads == 0, self.text_key + "linear_num_key_heads",
             f"must divide linear_num_value_heads ({t.linear_num_value_heads})"),
            (rot % 2 == 0 and 0 < rot <= t.head_dim, self.rope_key("partial_rotary_factor"),
             f"must rotate an even number of head_dim's {t.head_dim} features"),
            (t.partial_rotary_factor in (None, rp.partial_rotary_factor), self.text_key + "partial_rotary_factor",
             f"must equal rope_parameters.partial_rotary_factor ({rp.partial_rotary_factor}) where both are published, "
             f"got {t.partial_rotary_factor}"),
            (rp.rope_type == "default", self.rope_key("rope_type"), "must be 'default'"),
            (t.hidden_act == "silu", self.text_key + "hidden_act", "must be 'silu' (SwiGLU)"),
            (not t.attention_bias, self.text_key + "attention_bias", "must be false"),
            (not t.mlp_only_layers, self.text_key + "mlp_only_layers", "must be empty"),
            (not t.tie_word_embeddings and not c.tie_word_embeddings, "tie_word_embeddings", "must be false"),
        ])

    def vision_problems(self, c: Any) -> list[str]:
        v = c.vision_config
        side = round(v.num_position_embeddings ** 0.5)
        return rule_problems([
            (side * side == v.num_position_embeddings and side % v.spatial_merge_size == 0,
             "vision_config.num_position_embeddings", "must be a square whose side spatial_merge_size divides"),
            (v.hidden_size % v.num_heads == 0 and (v.hidden_size // v.num_heads) % 4 == 0, "vision_config.num_heads",
             "must divide hidden_size into heads whose size is a multiple of 4 (2-D rotary)"),
            (not v.deepstack_visual_indexes, "vision_config.deepstack_visual_indexes", "must be empty"),
        ])

    def build_spec(self, slug: str, raw: dict[str, Any], where: str) -> ModelSpec:
        return replace(super().build_spec(slug, raw, where), defaulted=self.defaulted(raw))

    def defaulted(self, raw: dict[str, Any]) -> tuple[str, ...]:
        """The architecture keys the published config omits (they take the reference config classes' defaults)."""
        text, vision = raw.get("text_config", {}), raw.get("vision_config", {})
        return (tuple(f"text_config.{k}" for k in ARCHITECTURE_KEYS if k not in text and k != "layer_types")
                + tuple(f"vision_config.{f.name}" for f in dataclasses.fields(Qwen3_5VisionHyperparameters)[:11]
                        if f.name not in vision))

    def default_source(self, key: str) -> str:
        return {"text_config": self.reference.config_class.replace("Config", "TextConfig"),
                "vision_config": self.reference.config_class.replace("Config", "VisionConfig")}.get(
            key.split(".")[0], self.reference.config_class)

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        t = self.text(c)
        ctx = Ctx(values, LABELS, self.ref, stored_dtype(self.dtype(t)), fp8_block_storage(c.quantization_config))
        p, L = self.prefix, t.num_hidden_layers
        pattern = layer_pattern(t)
        blocks = tuple(self.block(ctx, t, kind, pattern.indices(kind)) for kind in pattern.present())
        cite = (self.ref.cite("The text model embeds tokens, runs each decoder layer as layer_types names it (Gated "
                              "DeltaNet or full attention) and applies a final RMSNorm.",
                              f"{self.text_model_symbol}.__init__"),)
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        n_full = pattern.count(FULL)
        text = (
            embedding(ctx, "embed", "Token embedding", weight=p + "embed_tokens.weight", citations=cite),
            # the stack takes what its widest block takes: x, and for the attention layers the angles and the mask
            replace(stack(ctx, blocks, layers=L, citations=cite,
                          description=f"{L} decoder layers of two kinds, in the pattern {pattern.letters(LETTERS)} (L: "
                                      f"Gated DeltaNet, F: gated full attention): {L - n_full} linear-attention and "
                                      f"{n_full} full-attention layers."),
                    inputs=max((b.inputs for b in blocks), key=len)),
            rmsnorm(ctx, "norm", "Final RMSNorm", weight=p + "norm.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=t.rms_norm_eps,
                    gain="1+w", citations=self._norm_citation()),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", citations=(
                self.ref.cite("lm_head is a separate bias-free Linear to the vocabulary.", self.head_symbol),)),
        )
        root = model_root(ctx, text, code=f"{self.reference.model_class}(config)", layers=L, citations=cite,
                          description=f"A token embedding, {L} decoder layers ({L - n_full} Gated DeltaNet, {n_full} "
                                      "gated full attention), a final RMSNorm and an untied LM head"
                                      f"{self.beside_words(c)}.")
        return keep_named_modules_dense(replace(root, children=root.children + self.towers(ctx, c)),
                                        c.quantization_config, stored_dtype(self.dtype(t)), self.reference_module,
                                        f"{self.name} config")

    def declared_mtp(self, c: Any, values: dict[str, int | float]) -> DeclaredMTP | None:
        """One module of mtp_num_hidden_layers full-attention decoder layers (the main model's full-attention block,
        its feed-forward included) behind a projection of the concatenated embedding and hidden state, with their
        two RMSNorms and a final one."""
        t = self.text(c)
        n = getattr(t, "mtp_num_hidden_layers", 0)
        if not n:
            return None
        ctx = Ctx(values, LABELS, self.ref, stored_dtype(self.dtype(t)), fp8_block_storage(c.quantization_config))
        L, eps = t.num_hidden_layers, t.rms_norm_eps
        parts = (mtp_norm(ctx, "pre_fc_norm_embedding", "Embedding RMSNorm", "mtp.pre_fc_norm_embedding.weight", eps,
                          "1+w"),
                 mtp_norm(ctx, "pre_fc_norm_hidden", "Hidden-state RMSNorm", "mtp.pre_fc_norm_hidden.weight", eps,
                          "1+w"),
                 mtp_projection(ctx, "fc", "Combining projection", "mtp.fc.weight", 2),
                 self.block(ctx, t, FULL, tuple(range(L, L + n))),
                 mtp_norm(ctx, "norm", "MTP final RMSNorm", "mtp.norm.weight", eps, "1+w"))
        shared = ("the token embedding and the LM head are the main model's (mtp_use_dedicated_embeddings is false), "
                  "not stored again" if not t.mtp_use_dedicated_embeddings else
                  "mtp_use_dedicated_embeddings is true, but the dedicated embedding is not counted here")
        return declared_mtp(self.text_key + "mtp_num_hidden_layers", 1, parts, (
            "The checkpoint stores this module under mtp.* (transformers ignores every key matching ^mtp.* when it "
            "loads) and transformers builds none, so it is counted from the config with this family's own builders: "
            f"{n} full-attention decoder layer{'s' if n > 1 else ''} of the main model's kind (its feed-forward "
            "included), a bias-free fc projection of the concatenated embedding and hidden state (2 × hidden_size "
            "to hidden_size), the two RMSNorms before it and a final RMSNorm, as the inference engines that run "
            f"Qwen's MTP lay it out (not recorded here); {shared}. No tensor listing of the checkpoint is recorded, "
            "so the layout is not checked against the release."))

    def beside_words(self, c: Any) -> str:
        """What the root's description adds after the text model (the vision tower)."""
        return (f"; beside them a {c.vision_config.depth}-block vision tower whose merger emits tokens of the text "
                "width")

    def towers(self, ctx: Ctx, c: Any) -> tuple[Component, ...]:
        """The modules beside the text model: the vision tower and its merger."""
        v = c.vision_config
        side = round(v.num_position_embeddings ** 0.5)
        vo = VisionOptions(side, v.spatial_merge_size, v.num_heads, v.hidden_size // v.num_heads)
        return (qwen_vision_tower(ctx, vo, prefix="model.visual.", depth=v.depth, ref=self.ref),)

    def _norm_citation(self):
        return (self.ref.cite("Qwen3.5's RMSNorm multiplies by (1 + weight), in float32, with the weight "
                              "initialised to zero.", "RMSNorm"),)

    def block(self, ctx: Ctx, t: Qwen3_5TextHyperparameters, kind: str, indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), self.prefix + "layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps = t.rms_norm_eps
        if kind == LINEAR:
            dtype, state = self.dtype(t), self.state_dtype(t)
            o = DeltaNetOptions(t.linear_num_key_heads, t.linear_num_value_heads, t.linear_key_head_dim,
                                t.linear_value_head_dim, t.linear_conv_kernel_dim, eps,
                                state_dtype=state, state_bytes=DTYPE_SIZES.get(state, 4),
                                conv_dtype=dtype, conv_bytes=DTYPE_SIZES.get(dtype, 2))
            mixer = self.deltanet(ctx, p + "linear_attn.", ranges, x_attn, o)
            heading = "Gated DeltaNet"
        else:
            rp = self.rope(t)
            ro = RopeOptions("default", rp.rope_theta, int(t.head_dim * rp.partial_rotary_factor), "half")
            so = ScoresOptions(t.num_attention_heads, t.num_key_value_heads, t.head_dim ** -0.5)
            mixer = gated_attention(ctx, prefix=p + "self_attn.", ranges=ranges, x=x_attn, rope_options=ro,
                                    scores_options=so, eps=eps, gain="1+w", rope_reference=self.prefix + "rotary_emb",
                                    notes=self.rope_notes(rp), rope_class=self.rope_symbol,
                                    citations=(self.ref.cite(
                                        "The attention splits q_proj's output per head into query and gate, "
                                        "normalises q and k per head, rotates the first rotary features, attends "
                                        "and multiplies the result by sigmoid(gate) before o_proj.", "Attention"),
                                        self.ref.cite("apply_rotary_pos_emb rotates only the first cos.shape[-1] "
                                                      "features and passes the rest.", "apply_rotary_pos_emb",
                                                      prefixed=False)))
            heading = "Gated attention"
        key, title = KINDS[kind]

        def norm(k_: str, title_: str, module: str, xp: Port, yp: Port) -> Component:
            return rmsnorm(ctx, k_, title_, weight=p + module + ".weight", ranges=ranges, size="hidden_size", x=xp,
                           y=yp, code=f"self.{module}(hidden_states)", eps=eps, gain="1+w",
                           citations=self._norm_citation())

        block = decoder_block(
            ctx, key, title, layer_indices=indices, kind="Gated DeltaNet" if kind == LINEAR else "gated-attention",
            attn_heading=heading, attn_norm=norm("attn_norm", "Pre-mixer RMSNorm", "input_layernorm", x, x_attn),
            attn=mixer, ffn_norm=norm("ffn_norm", "Pre-MLP RMSNorm", "post_attention_layernorm", x_mid, x_ffn),
            ffn=self.ffn(ctx, t, p, ranges, x_ffn, delta),
            citations=(self.ref.cite("A decoder layer runs the token mixer its layer type names (linear_attn or "
                                     "self_attn), then the MLP, each after an RMSNorm and added to the residual.",
                                     "DecoderLayer"),),
            description=f"{'A Gated DeltaNet' if kind == LINEAR else 'Gated full attention'} and "
                        f"{self.ffn_words(t)}, each added to the residual stream; {layer_label(indices)}.")
        return recurrent_block(block) if kind == LINEAR else block

    def deltanet(self, ctx: Ctx, prefix: str, ranges: tuple[IndexRange, ...], x: Port,
                 o: DeltaNetOptions) -> Component:
        return gated_deltanet(ctx, prefix=prefix, ranges=ranges, x=x, o=o, citations=self.deltanet_citations(
            "The layer projects q, k, v (fused), z, b and a, convolves q, k, v causally, takes beta = sigmoid(b) and "
            "g = -exp(A_log) * softplus(a + dt_bias), runs the gated delta rule (chunked over a sequence, recurrent "
            "for one cached token) with L2-normalised q and k, and applies the gated norm and out_proj."),
            norm_code="Qwen3_5RMSNormGated(head_v_dim, eps=rms_norm_eps)")  # as both Qwen3.5 pages have named it

    def deltanet_citations(self, forward: str) -> tuple[Citation, ...]:
        """The gated norm, the layer's forward (what `forward` says of it) and the two forms of the delta rule."""
        return (
            self.ref.cite("The gated RMSNorm normalises each value head's output, multiplies by its weight and then "
                          "by SiLU of the gate z.", "RMSNormGated"),
            self.ref.cite(forward, "GatedDeltaNet.forward"),
            self.ref.cite("The recurrent form decays the state by exp(g), corrects it toward v by beta along k, and "
                          "reads it with q.", "torch_recurrent_gated_delta_rule", prefixed=False),
            self.ref.cite("The chunked form solves each chunk's updates with a unit lower-triangular system and "
                          "carries the state across chunks.", "torch_chunk_gated_delta_rule", prefixed=False))

    def rope_notes(self, rp: RopeParameters) -> tuple[str, ...]:
        return (f"The rotary module is multimodal (mrope_section {list(rp.mrope_section)}: pairs given to an image "
                "token's temporal, height and width positions). A text token has the same position in all three, so "
                "its angles are the plain ones shown here.",)

    def ffn(self, ctx: Ctx, t: Qwen3_5TextHyperparameters, p: str, ranges, x: Port, y: Port) -> Component:
        return gated_mlp(ctx, "mlp", "SwiGLU MLP", "SwiGLU", prefix=p + "mlp.", ranges=ranges,
                         d_ff=ctx.sym("intermediate_size"), ff_dim=ctx.dim("intermediate_size"), x=x, y=y,
                         description=f"A SwiGLU feed-forward network of width {t.intermediate_size or DENSE_WIDTH:,}.",
                         code=f"{self.ref.prefix}MLP(config, intermediate_size)",
                         citations=(self.ref.cite("The MLP is down(silu(gate x) ⊙ up x).", "MLP"),))

    def ffn_words(self, t: Qwen3_5TextHyperparameters) -> str:
        return "a SwiGLU MLP"

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: three layers (DeltaNet, full, DeltaNet: the DeltaNet layers non-adjacent),
        2 key heads over 4 value heads with d_k 8 ≠ d_v 12, 4 query heads over 2 KV heads, a quarter of each head
        rotating, and a two-block vision tower over a 4×4 patch grid merged 2×2."""
        raw = _as_dict(c)
        t = raw["text_config"]
        t.update(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                 layer_types=[LINEAR, FULL, LINEAR], num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                 linear_conv_kernel_dim=4, max_position_embeddings=256, dtype="float32", eos_token_id=1,
                 mtp_num_hidden_layers=0)
        raw["vision_config"] = {**raw["vision_config"], "depth": 2, "hidden_size": 32, "intermediate_size": 48,
                                "num_heads": 4, "patch_size": 2, "temporal_patch_size": 2, "spatial_merge_size": 2,
                                "num_position_embeddings": 16, "out_hidden_size": 64}
        raw.update(image_token_id=90, video_token_id=91, vision_start_token_id=92, vision_end_token_id=93,
                   quantization_config=None)
        return raw

    def tiny_label_parts(self, tiny: ModelSpec) -> tuple[str, ...]:
        v = tiny.values
        return (f"DeltaNet {v['linear_num_key_heads']} key and {v['linear_num_value_heads']} value heads, d_k "
                f"{v['linear_key_head_dim']}, d_v {v['linear_value_head_dim']}",)

    def tiny_label_towers(self, tiny: ModelSpec) -> tuple[str, ...]:
        return (tower_label(tiny, "vit_hidden_size", tower_key="visual", blocks_key="blocks"),)

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        t = self.text(c)
        pattern = layer_pattern(t)
        return (("decoder layers", f"{t.num_hidden_layers} ({pattern.count(LINEAR)} Gated DeltaNet, "
                                   f"{pattern.count(FULL)} gated attention)"),
                ("attention heads", f"{t.num_attention_heads} query, {t.num_key_value_heads} key/value"),
                ("DeltaNet heads", f"{t.linear_num_key_heads} query/key, {t.linear_num_value_heads} value"),
                ("vocabulary", f"{t.vocab_size:,}"))


class Qwen3_5Moe(Qwen3_5):
    """Qwen3_5MoeForConditionalGeneration: the same hybrid with routed experts and a gated shared expert."""

    name = "qwen3_5_moe"
    model_types = ("qwen3_5_moe",)
    # transformers' conversion mapping for qwen3_5_moe_text adds qwen2_moe's: per-expert gate/up/down in the
    # checkpoint, fused gate_up_proj and down_proj in the model; split_fused_experts undoes the fusion
    reference = ReferenceBinding("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", renames=split_fused_experts)
    ref = Reference("models/qwen3_5_moe/modeling_qwen3_5_moe.py", "Qwen3_5Moe")
    symbols = tuple(s for s in TEXT_SYMBOLS if s != "intermediate_size") + MOE_SYMBOLS + tuple(VISION_LABELS)

    def check(self, c: Any) -> list[str]:
        t = self.text(c)
        missing = [n for n in MOE_SYMBOLS if getattr(t, n) is None]
        return super().check(c) + rule_problems([
            (not missing, self.text_key + (missing[0] if missing else ""), "missing (a Qwen3.5-MoE size)"),
            (not missing and (t.num_experts_per_tok or 0) <= (t.num_experts or 0), self.text_key + "num_experts_per_tok",
             "must be <= num_experts"),
        ])

    def ffn(self, ctx: Ctx, t: Qwen3_5TextHyperparameters, p: str, ranges, x: Port, y: Port) -> Component:
        m = p + "mlp."
        E, k = int(t.num_experts or 0), int(t.num_experts_per_tok or 0)  # check() has required both
        gate = router(ctx, weight=m + "gate.weight", ranges=ranges, x=x, o=RouterOptions(E, k, "softmax", True),
                      code=f"{self.ref.prefix}TopKRouter(config)", experts_sym="num_experts", citations=(
                          self.ref.cite("The router takes a softmax over all experts, keeps the top k and divides "
                                        "them by their sum.", "TopKRouter"),))
        experts = routed_experts(ctx, prefix=m + "experts.", ranges=ranges, x=x, experts=E, k=k,
                                 code=f"{self.ref.prefix}Experts(config)", experts_sym="num_experts",
                                 width="moe_intermediate_size", citations=(
                                     self.ref.cite("Each expert is a SwiGLU MLP of width moe_intermediate_size; "
                                                   "transformers fuses gate and up into gate_up_proj.", "Experts"),))
        shared = gated_shared_expert(ctx, prefix=m, ranges=ranges, x=x, width="shared_expert_intermediate_size",
                                     citations=(self.ref.cite("The shared expert's output is multiplied by "
                                                              "sigmoid(shared_expert_gate(x)) and added to the "
                                                              "routed sum.", "SparseMoeBlock"),))
        block = moe(ctx, x=x, y_latex=y.latex, router_c=gate, expert=experts, shared=shared,
                    code=f"{self.ref.prefix}SparseMoeBlock(config)", citations=shared.citations)
        return replace(block, description=f"Route each token to {k} of {E} experts and add a shared expert scaled by "
                                          "a sigmoid gate of the token.")

    def ffn_words(self, t: Qwen3_5TextHyperparameters) -> str:
        return f"a mixture of {t.num_experts} experts (top {t.num_experts_per_tok}) with a gated shared expert"

    def tiny_config(self, c: Any) -> dict[str, Any]:
        raw = super().tiny_config(c)
        raw["text_config"].update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                  shared_expert_intermediate_size=24)
        raw["text_config"].pop("intermediate_size", None)
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        t = self.text(c)
        return super().facts(c)[:1] + (("routed experts", f"{t.num_experts} (top {t.num_experts_per_tok}) + 1 "
                                                          "gated shared"),) + super().facts(c)[1:]


def _as_dict(config: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {k: v for k, v in _as_dict(value).items() if v is not None}
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


FAMILY = Qwen3_5()
MOE_FAMILY = Qwen3_5Moe()
