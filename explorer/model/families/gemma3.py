"""The Gemma 3 family: grouped-query attention with QK-norm, sandwich RMSNorms (before and after attention and the
MLP) whose gain is 1 + w, a token embedding scaled by √d, a GeGLU MLP, a tied head, and layers that interleave
sliding-window (local) attention with global attention, each kind rotating with its own base. Two bindings:
`gemma3_text` (the text model alone, Gemma3ForCausalLM) and `gemma3` (the multimodal checkpoint: the same text
model under model.language_model, a SigLIP vision tower and a projector, Gemma3ForConditionalGeneration).

References: "Gemma 3 Technical Report" (arXiv:2503.19786); transformers' models/gemma3/modeling_gemma3.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.attention import ScoresOptions, attention
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block, model_root, stack
from explorer.model.components.embedding import embedding, head, sqrt_width_scale
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.norms import rmsnorm
from explorer.model.components.rope import RopeOptions
from explorer.model.components.vision import projector, vision_tower
from explorer.model.families.base import (
    DIM_LABELS,
    Family,
    ReferenceBinding,
    RopeScaling,
    rope_options,
    rope_scaling_problems,
    rule_problems,
    stored_dtype,
    tower_label,
)
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_block_storage,
    fp8_problems,
    keep_named_modules_dense,
)
from explorer.spec.storage import GGUF_MIXES, GGUFMix, Storage
from explorer.spec.types import Citation, Component, Hyperparameters, ModelSpec, Step

CONFIG_FILE = "models/gemma3/configuration_gemma3.py"
GGUF_CITATION = Citation("transformers reads a GGUF file with the gguf package and dequantizes each tensor from its "
                         "llama.cpp type (Q4_K, Q5_0, Q6_K, Q8_0, ...) to floating point; the types are storage, not "
                         "parameters.", "transformers", "load_gguf_checkpoint", "modeling_gguf_pytorch_utils.py")
SLIDING, GLOBAL = "sliding_attention", "full_attention"


@dataclass(frozen=True, slots=True)
class GGUFQuantization:
    """How a GGUF file stores the weights (not a config.json key: read from the file's general.file_type)."""

    quant_method: str
    """"gguf"."""
    file_type: str
    """llama.cpp's file type, e.g. "Q4_K_M"."""


@dataclass(frozen=True, slots=True)
class Gemma3TextHyperparameters(Hyperparameters):
    """Gemma3TextConfig's keys, named as published; an absent key takes Gemma3TextConfig's default (transformers
    5.23), and the page says so."""

    vocab_size: int = 262_208
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 131_072
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    """Base of the global layers' rotary frequencies."""
    rope_local_base_freq: float = 10_000.0
    """Base of the sliding-window layers' rotary frequencies."""
    rope_scaling: RopeScaling | None = None
    """Applies to the global layers only."""
    query_pre_attn_scalar: int = 256
    """The softmax scale is query_pre_attn_scalar^-1/2 (not head_dim^-1/2)."""
    sliding_window: int = 4096
    sliding_window_pattern: int = 6
    """Every sliding_window_pattern-th layer is global, the others sliding (when layer_types is not given)."""
    layer_types: tuple[str, ...] | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    torch_dtype: str = "bfloat16"
    # Informational keys: recorded as published, not used by the spec.
    model_type: str = "gemma3_text"
    architectures: tuple[str, ...] = ()
    bos_token_id: int | None = 2
    eos_token_id: Any = 1
    """An id or a list of ids."""
    pad_token_id: int | None = 0
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    use_cache: bool = True
    use_bidirectional_attention: bool = False
    transformers_version: str = ""
    quantization_config: GGUFQuantization | None = None


def _keys_through(cls: type, last: str) -> tuple[str, ...]:
    names = [f.name for f in dataclasses.fields(cls)]
    return tuple(names[:names.index(last) + 1])


ARCHITECTURE_KEYS = _keys_through(Gemma3TextHyperparameters, "torch_dtype")
"""The text keys that shape the model (the informational ones follow): the ones whose defaults a page must name."""


@dataclass(frozen=True, slots=True)
class SiglipVisionHyperparameters:
    """SiglipVisionConfig's keys; absent keys take its defaults."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 16
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    vision_use_head: bool = True
    model_type: str = "siglip_vision_model"
    attention_dropout: float = 0.0


VISION_KEYS = _keys_through(SiglipVisionHyperparameters, "vision_use_head")


@dataclass(frozen=True, slots=True)
class Gemma3Hyperparameters(Hyperparameters):
    """Gemma3Config: the text and vision configs and the image-token keys."""

    text_config: Gemma3TextHyperparameters
    vision_config: SiglipVisionHyperparameters
    mm_tokens_per_image: int = 256
    tie_word_embeddings: bool = True
    torch_dtype: str = "bfloat16"
    boi_token_index: int = 255_999
    eoi_token_index: int = 256_000
    image_token_index: int = 262_144
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8: every nn.Linear transformers' FP8 quantizer converts (the text blocks' and the SigLIP
    tower's projections) in FP8 with a scale per block; embeddings, norms, the patch convolution and the
    projector's matrix (a bare parameter) stay in the model's dtype."""
    initializer_range: float = 0.02
    eos_token_id: Any = None
    architectures: tuple[str, ...] = ()
    model_type: str = "gemma3"
    transformers_version: str = ""


def layer_types(t: Gemma3TextHyperparameters) -> tuple[str, ...]:
    """Each layer's attention kind: as published, or every sliding_window_pattern-th layer global."""
    if t.layer_types is not None:
        return t.layer_types
    return tuple(SLIDING if (i + 1) % t.sliding_window_pattern else GLOBAL for i in range(t.num_hidden_layers))


def text_values(t: Gemma3TextHyperparameters) -> dict[str, int | float]:
    return {n: getattr(t, n) for n in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                       "num_key_value_heads", "head_dim")}


def text_problems(t: Gemma3TextHyperparameters, where: str = "") -> list[str]:
    types = layer_types(t)
    return rule_problems([
        (t.num_attention_heads % t.num_key_value_heads == 0, where + "num_key_value_heads",
         f"must divide num_attention_heads ({t.num_attention_heads}), got {t.num_key_value_heads}"),
        (t.head_dim % 2 == 0, where + "head_dim", f"must be even (rotary pairs), got {t.head_dim}"),
        (t.hidden_activation == "gelu_pytorch_tanh", where + "hidden_activation",
         f"must be 'gelu_pytorch_tanh' (GeGLU), got {t.hidden_activation!r}"),
        (len(types) == t.num_hidden_layers and set(types) <= {SLIDING, GLOBAL}, where + "layer_types",
         f"must give {t.num_hidden_layers} entries, each '{SLIDING}' or '{GLOBAL}'"),
        (t.sliding_window_pattern >= 1, where + "sliding_window_pattern", "must be >= 1"),
        (t.final_logit_softcapping is None, where + "final_logit_softcapping",
         "must be unset: logit soft-capping is not in the library yet"),
        (not t.attention_bias, where + "attention_bias", "must be false: Gemma 3's projections have no biases"),
        (not t.use_bidirectional_attention, where + "use_bidirectional_attention", "must be false (causal model)"),
        (t.quantization_config is None or t.quantization_config.file_type in GGUF_MIXES,
         where + "quantization_config.file_type", f"must be one of {', '.join(GGUF_MIXES)}"),
    ]) + rope_scaling_problems(t.rope_scaling, where + "rope_scaling")


class Gemma3Text(Family):
    """The text model alone: Gemma3ForCausalLM (Gemma 3 1B and 270M, and GGUF conversions)."""

    name = "gemma3_text"
    model_types = ("gemma3_text",)
    config_class: ClassVar[type] = Gemma3TextHyperparameters
    reference = ReferenceBinding("Gemma3TextConfig", "Gemma3ForCausalLM")
    ref = Reference("models/gemma3/modeling_gemma3.py", "Gemma3")
    symbols: ClassVar[tuple[str, ...]] = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                         "num_key_value_heads", "head_dim")
    prefix: ClassVar[str] = "model."
    """Where the text model's modules live in the reference's state dict."""

    def values(self, c: Any) -> dict[str, int | float]:
        return text_values(c)

    def check(self, c: Any) -> list[str]:
        return text_problems(c)

    def text(self, c: Any) -> Gemma3TextHyperparameters:
        return c

    def storage(self, c: Any) -> tuple[str, Storage | None]:
        """Dense dtype of unquantized tensors, and the quantized weights' storage (a GGUF mix) or None."""
        t = self.text(c)
        if t.quantization_config is not None:
            q = t.quantization_config
            return "F32", GGUFMix(q.file_type, GGUF_MIXES[q.file_type])
        return stored_dtype(getattr(c, "torch_dtype", t.torch_dtype)), None

    def build_spec(self, slug: str, raw: dict[str, Any], where: str) -> ModelSpec:
        spec = super().build_spec(slug, raw, where)
        return replace(spec, defaulted=self.defaulted(raw))

    def defaulted(self, raw: dict[str, Any]) -> tuple[str, ...]:
        return tuple(k for k in ARCHITECTURE_KEYS if k not in raw and k != "layer_types")

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        t = self.text(c)
        dtype, quantized = self.storage(c)
        ctx = Ctx(values, {**DIM_LABELS, **VISION_LABELS}, self.ref, dtype, quantized,
                  {"quantization": (GGUF_CITATION,)} if quantized is not None else None)
        return self.root(ctx, c, self.text_children(ctx, t))

    def root(self, ctx: Ctx, c: Any, children: tuple[Component, ...]) -> Component:
        L = self.text(c).num_hidden_layers
        return model_root(ctx, children, code=f"{self.reference.model_class}(config)", layers=L,
                          citations=children[0].citations,
                          description=f"A √d-scaled token embedding, {L} transformer blocks that interleave "
                                      "sliding-window and global attention, a final RMSNorm and "
                                      + ("an LM head tied to the embedding." if self.text(c).tie_word_embeddings
                                         else "an untied LM head."))

    def text_children(self, ctx: Ctx, t: Gemma3TextHyperparameters) -> tuple[Component, ...]:
        p, L = self.prefix, t.num_hidden_layers
        types = layer_types(t)
        kinds = tuple(k for k in (SLIDING, GLOBAL) if k in types)
        blocks = tuple(self.block(ctx, t, tuple(i for i, k in enumerate(types) if k == kind), kind) for kind in kinds)
        scale = sqrt_width_scale(t.hidden_size, stored_dtype(t.torch_dtype))
        exact = t.hidden_size ** 0.5
        rounded = f"; in {t.torch_dtype} √{t.hidden_size} = {exact:.4g} becomes {scale:.4g}" if scale != exact else ""
        embed = embedding(ctx, "embed", "Token embedding (scaled by √d)", weight=p + "embed_tokens.weight",
                          scale=scale, citations=(self.ref.cite(
                              "The embedding multiplies each looked-up row by embed_scale = hidden_size ** 0.5, cast "
                              f"to the weights' dtype{rounded}.", "TextScaledWordEmbedding"),))
        tied = p + "embed_tokens.weight" if t.tie_word_embeddings else ""
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        n_global = types.count(GLOBAL)
        return (
            self._quantize(ctx, embed),
            stack(ctx, blocks, layers=L, citations=(self.ref.cite(
                "The rotary module keeps one set of inverse frequencies per layer type: rope_theta (with any "
                "rope_scaling) for full attention, rope_local_base_freq for sliding layers.",
                "RotaryEmbedding.__init__"), Citation("Without layer_types, every sliding_window_pattern-th layer is "
                                               "global (full attention) and the others slide.", "transformers",
                                               "Gemma3TextConfig.__post_init__", CONFIG_FILE)),
                  description=f"{L} decoder layers of two kinds: {L - n_global} with sliding-window attention and "
                              f"{n_global} with global attention, interleaved."),
            rmsnorm(ctx, "norm", "Final RMSNorm", weight=p + "norm.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=t.rms_norm_eps,
                    gain="1+w", citations=self._norm_citation()),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", tied_to=tied, citations=(
                self.ref.cite("lm_head is a bias-free Linear to the vocabulary"
                              + (", tied to the token embedding (_tied_weights_keys)." if tied else "."),
                              "ForCausalLM" if self.prefix == "model." else "ForConditionalGeneration"),)),
        )

    def _norm_citation(self) -> tuple[Citation, ...]:
        return (self.ref.cite("Gemma's RMSNorm multiplies by (1 + weight), in float32, with the weight initialised "
                              "to zero.", "RMSNorm"),)

    def _quantize(self, ctx: Ctx, comp: Component) -> Component:
        """GGUF files quantize the token embedding too (the library stores it dense); FP8 leaves it (not a Linear)."""
        if not isinstance(ctx.quantized, GGUFMix):
            return comp
        return replace(comp, tensors=tuple(replace(t, storage=ctx.quantized) for t in comp.tensors))

    def block(self, ctx: Ctx, t: Gemma3TextHyperparameters, indices: tuple[int, ...], kind: str) -> Component:
        ranges, p = layers(indices), self.prefix + "layers.{layer}."
        sliding = kind == SLIDING
        x, x_attn, x_mid, x_ffn, d_attn, d_ffn = block_ports(ctx)
        eps, hd = t.rms_norm_eps, t.head_dim
        rope_o = (RopeOptions("default", t.rope_local_base_freq, hd, "half", layer_type=SLIDING) if sliding else
                  replace(rope_options(t.rope_theta, hd, t.rope_scaling, "half", t.max_position_embeddings),
                          layer_type=GLOBAL))
        scale = t.query_pre_attn_scalar ** -0.5
        attn = attention(
            ctx, prefix=p + "self_attn.", ranges=ranges, x=x_attn, rope_options=rope_o,
            scores_options=ScoresOptions(t.num_attention_heads, t.num_key_value_heads, scale,
                                         window=t.sliding_window if sliding else None,
                                         softcap=t.attn_logit_softcapping),
            qk_norm_eps=eps, qk_norm_gain="1+w", rope_reference=self.prefix + "rotary_emb",
            scale_latex=rf"\tau=\texttt{{query\_pre\_attn\_scalar}}^{{-1/2}}=1/\sqrt{{{t.query_pre_attn_scalar}}}"
                        rf"={scale:.6f}",
            citations=(self.ref.cite("Attention normalises q and k per head (q_norm, k_norm), rotates them, scales "
                                     "scores by query_pre_attn_scalar ** -0.5 and, on sliding layers, keeps a window "
                                     "of sliding_window positions.", "Attention"),
                       self.ref.cite("repeat_kv shares each key/value head with num_key_value_groups query heads.",
                                     "repeat_kv", prefixed=False)))

        attn = replace(attn, steps=_with_scale_step(attn))

        def norm(key: str, title: str, module: str, xp: Port, yp: Port) -> Component:
            return rmsnorm(ctx, key, title, weight=p + module + ".weight", ranges=ranges, size="hidden_size", x=xp,
                           y=yp, code=f"self.{module}(hidden_states)", eps=eps, gain="1+w",
                           citations=self._norm_citation())

        mlp = gated_mlp(ctx, "mlp", "GeGLU MLP", "GeGLU", prefix=p + "mlp.", ranges=ranges,
                        d_ff=ctx.sym("intermediate_size"), ff_dim=ctx.dim("intermediate_size"), x=x_ffn, y=d_ffn,
                        act="gelu_tanh", code="Gemma3MLP(config)",
                        description=f"A GeGLU feed-forward network (GELU, tanh approximation) of width "
                                    f"{t.intermediate_size:,}.",
                        citations=(self.ref.cite("The MLP is down(gelu_tanh(gate x) ⊙ up x).", "MLP"),))
        what = f"sliding-window attention over {t.sliding_window:,} positions" if sliding else "global attention"
        return decoder_block(
            ctx, "local" if sliding else "global", "Sliding-window block" if sliding else "Global block",
            layer_indices=indices, kind="sliding-window" if sliding else "global", ffn_heading="GeGLU MLP:",
            attn_heading=f"{attn.title} ({'sliding window' if sliding else 'global'})",
            attn_norm=norm("attn_norm", "Pre-attention RMSNorm", "input_layernorm", x, x_attn), attn=attn,
            post_attn_norm=norm("post_attn_norm", "Post-attention RMSNorm", "post_attention_layernorm", d_attn,
                                Port(r"\bar\Delta_{\mathrm{attn}}", x.shape, "delta_attn_hat")),
            ffn_norm=norm("ffn_norm", "Pre-MLP RMSNorm", "pre_feedforward_layernorm", x_mid, x_ffn), ffn=mlp,
            post_ffn_norm=norm("post_ffn_norm", "Post-MLP RMSNorm", "post_feedforward_layernorm", d_ffn,
                               Port(r"\bar\Delta_{\mathrm{ffn}}", x.shape, "delta_ffn_hat")),
            citations=(self.ref.cite("A block normalises before and after attention and before and after the MLP "
                                     "(four RMSNorms), adding each normalised branch to the residual stream.",
                                     "DecoderLayer"),),
            description=f"{what.capitalize()} and a GeGLU MLP, each between two RMSNorms and added to the residual "
                        f"stream; {layer_label(indices)} ({_layer_list(indices)}).")

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: 4 query heads over 2 KV heads, three layers (sliding, global, sliding: both
        kinds, the sliding one at non-adjacent indices) with a window of 3 < T = 5, a scalar other than head_dim."""
        return self.tiny_text(self.text(c))

    def tiny_text(self, t: Gemma3TextHyperparameters) -> dict[str, Any]:
        raw = _as_dict(t)
        raw.update(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=3,
                   sliding_window_pattern=2, layer_types=None, max_position_embeddings=256, bos_token_id=0,
                   eos_token_id=1, pad_token_id=None, quantization_config=None, torch_dtype="float32")
        return {k: v for k, v in raw.items() if v is not None}

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        t = self.text(c)
        types = layer_types(t)
        return (("transformer blocks", f"{t.num_hidden_layers:,} ({types.count(SLIDING)} sliding, "
                                       f"{types.count(GLOBAL)} global)"),
                ("attention heads", f"{t.num_attention_heads} query, {t.num_key_value_heads} key/value"),
                ("vocabulary", f"{t.vocab_size:,}"))


VISION_LABELS = {"vision_hidden_size": "d_vision", "vision_intermediate_size": "d_ff_vision",
                 "num_channels": "channels", "patch_size": "patch", "num_patches": "patches"}


class Gemma3(Gemma3Text):
    """The multimodal checkpoint: Gemma3ForConditionalGeneration (Gemma 3 4B, 12B, 27B)."""

    name = "gemma3"
    model_types = ("gemma3",)
    config_class: ClassVar[type] = Gemma3Hyperparameters
    reference = ReferenceBinding("Gemma3Config", "Gemma3ForConditionalGeneration")
    symbols = Gemma3Text.symbols + tuple(VISION_LABELS)
    prefix = "model.language_model."

    def text(self, c: Any) -> Gemma3TextHyperparameters:
        return c.text_config

    def values(self, c: Any) -> dict[str, int | float]:
        v = c.vision_config
        return {**text_values(c.text_config), "vision_hidden_size": v.hidden_size,
                "vision_intermediate_size": v.intermediate_size, "num_channels": v.num_channels,
                "patch_size": v.patch_size, "num_patches": (v.image_size // v.patch_size) ** 2}

    def check(self, c: Any) -> list[str]:
        v = c.vision_config
        side, tokens = v.image_size // v.patch_size, round(c.mm_tokens_per_image ** 0.5)
        return text_problems(c.text_config, "text_config.") + rule_problems([
            (not v.vision_use_head, "vision_config.vision_use_head", "must be false (Gemma 3 stores no pooling head)"),
            (v.hidden_size % v.num_attention_heads == 0, "vision_config.num_attention_heads",
             f"must divide hidden_size ({v.hidden_size})"),
            (v.hidden_act == "gelu_pytorch_tanh", "vision_config.hidden_act", "must be 'gelu_pytorch_tanh'"),
            (tokens ** 2 == c.mm_tokens_per_image and side % max(tokens, 1) == 0, "mm_tokens_per_image",
             f"must be a square whose side divides the {side}-patch grid side"),
            (c.tie_word_embeddings == c.text_config.tie_word_embeddings, "tie_word_embeddings",
             "must agree with text_config.tie_word_embeddings"),
        ]) + fp8_problems(c.quantization_config)

    def defaulted(self, raw: dict[str, Any]) -> tuple[str, ...]:
        text, vision = raw.get("text_config", {}), raw.get("vision_config", {})
        return (tuple(f"text_config.{k}" for k in super().defaulted(text) if k != "torch_dtype")
                + tuple(f"vision_config.{k}" for k in VISION_KEYS if k not in vision))

    def default_source(self, key: str) -> str:
        return {"text_config": "Gemma3TextConfig", "vision_config": "SiglipVisionConfig"}.get(
            key.split(".")[0], self.reference.config_class)

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        dtype, _ = self.storage(c)
        ctx = Ctx(values, {**DIM_LABELS, **VISION_LABELS}, self.ref, dtype, fp8_block_storage(c.quantization_config))
        v, t = c.vision_config, c.text_config
        text = self.text_children(ctx, replace(t, torch_dtype=c.torch_dtype))
        tower = vision_tower(ctx, prefix="model.vision_tower.", image_size=v.image_size, layers=v.num_hidden_layers,
                             heads=v.num_attention_heads, eps=v.layer_norm_eps)
        side = v.image_size // v.patch_size
        proj = projector(ctx, prefix="model.multi_modal_projector.", eps=v.layer_norm_eps, patches_per_side=side,
                         tokens_per_side=round(c.mm_tokens_per_image ** 0.5), citations=(self.ref.cite(
                             "The projector average-pools the patch grid, applies a Gemma RMSNorm and multiplies by "
                             "mm_input_projection_weight.", "MultiModalProjector"),))
        root = self.root(ctx, c, text)
        root = replace(root, children=root.children + (tower, proj),
                       description=root.description + f" Beside it, a {v.num_hidden_layers}-block SigLIP vision tower "
                       f"and a projector turn an image into {c.mm_tokens_per_image} soft tokens of the text width.")
        return keep_named_modules_dense(root, c.quantization_config, dtype, self.reference_module, f"{self.name} config")

    def tiny_label_towers(self, tiny: ModelSpec) -> tuple[str, ...]:
        return (tower_label(tiny, "vision_hidden_size"),)

    def tiny_config(self, c: Any) -> dict[str, Any]:
        raw = _as_dict(c)
        raw["text_config"] = self.tiny_text(c.text_config)
        raw["vision_config"] = {**_as_dict(c.vision_config), "hidden_size": 32, "intermediate_size": 48,
                                "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 16, "patch_size": 4}
        raw.update(mm_tokens_per_image=4, torch_dtype="float32", eos_token_id=1, boi_token_index=90,
                   eoi_token_index=91, image_token_index=92, quantization_config=None)
        return raw


def _with_scale_step(attn: Component) -> tuple[Step, ...]:
    """The attention's steps with the softmax scale τ shown before the softmax: Gemma's query_pre_attn_scalar
    replaces 1/√d_head, so the block says so where it happens."""
    scale = attn.child("scores").steps[0]
    at = next(i for i, s in enumerate(attn.steps) if s.name == "softmax")
    return attn.steps[:at] + (scale,) + attn.steps[at:]


def _as_dict(config: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {k: v for k, v in _as_dict(value).items() if v is not None}
        out[f.name] = value
    return out


def _layer_list(indices: tuple[int, ...]) -> str:
    """1-based layer numbers, runs shortened: "layers 6, 12, 18" or "layers 1–5, 7–11, …"."""
    runs: list[str] = []
    for i in indices:
        if runs and runs[-1].split("–")[-1] == str(i):
            runs[-1] = runs[-1].split("–")[0] + f"–{i + 1}"
        else:
            runs.append(str(i + 1))
    text = ", ".join(runs)
    return "layer " + text if len(indices) == 1 else "layers " + text


TEXT_FAMILY = Gemma3Text()
FAMILY = Gemma3()
