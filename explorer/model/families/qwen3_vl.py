"""The Qwen3-VL dense family (Qwen3-VL-2B/4B/8B/32B): Qwen3's decoder (grouped-query attention with QK-norm, SwiGLU,
RMSNorm) as the text model under model.language_model, with interleaved multimodal RoPE in every layer, and beside
it Qwen3.5's vision tower and merger plus DeepStack: mergers of their own map the outputs of three vision blocks to
features that are added to the hidden states at the image tokens after the first three decoder layers.

The family is Qwen3's, stated by what differs: where the text model sits (text_prefix, text_config), its rotary
module (mrope), its stack of layers (deepstack_stack) and the tower beside it (towers).

References: the Qwen3-VL technical report (arXiv:2511.21631); "DeepStack" (arXiv:2406.04334); Qwen2-VL
(arXiv:2409.12191) for multimodal RoPE and the native-resolution tower; transformers'
models/qwen3_vl/modeling_qwen3_vl.py and configuration_qwen3_vl.py (the reference binding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.deepstack import DeepStackOptions, deepstack_stack
from explorer.model.components.mrope import MRopeOptions, mrope
from explorer.model.components.qwen_vision import LABELS as VISION_LABELS
from explorer.model.components.qwen_vision import VisionOptions, qwen_vision_tower
from explorer.model.families.base import (
    DIM_LABELS,
    DecoderLayers,
    Family,
    Hyperparameters,
    ReferenceBinding,
    RopeScaling,
    as_published,
    rule_problems,
    tower_label,
)
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.llama import Llama
from explorer.model.families.qwen3 import Qwen3
from explorer.spec.types import Citation, Component, ModelSpec

FILE = "models/qwen3_vl/modeling_qwen3_vl.py"
MROPE_SECTION = (24, 20, 20)
"""Qwen3VLTextRotaryEmbedding's mrope_section where the config's rope settings give none."""
TEXT_SYMBOLS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "head_dim")


@dataclass(frozen=True, slots=True)
class MRopeScaling(RopeScaling):
    """text_config.rope_scaling as the Qwen3-VL files publish it: the rope type and the multimodal sections."""

    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool | None = None
    """Published as true; transformers 5.23 always interleaves (Qwen3VLTextRotaryEmbedding reads only the sections)."""


@dataclass(frozen=True, slots=True)
class Qwen3VLTextHyperparameters:
    """Qwen3VLTextConfig's keys, named as published; absent keys take its defaults (transformers 5.23)."""

    vocab_size: int = 151_936
    hidden_size: int = 4096
    intermediate_size: int = 22_016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 32
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 128_000
    rms_norm_eps: float = 1e-6
    rope_theta: float = 500_000.0
    """Qwen3VLTextConfig's default_theta where the file gives no base."""
    rope_scaling: MRopeScaling | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool | None = None
    """Published in the tied checkpoints' text_config; the top-level key is the one the head is tied by."""
    dtype: str = "bfloat16"
    # Informational keys: recorded as published, not used by the spec.
    model_type: str = "qwen3_vl_text"
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class Qwen3VLVisionHyperparameters:
    """Qwen3VLVisionConfig's keys; absent keys take its defaults."""

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
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    initializer_range: float = 0.02
    model_type: str = "qwen3_vl_vision"
    """The files publish "qwen3_vl"; Qwen3VLConfig reads that as qwen3_vl_vision (an older checkpoint's name)."""


@dataclass(frozen=True, slots=True)
class Qwen3VLHyperparameters(Hyperparameters):
    """Qwen3VLConfig: the text and vision configs and the special token ids."""

    text_config: Qwen3VLTextHyperparameters
    vision_config: Qwen3VLVisionHyperparameters
    tie_word_embeddings: bool = False
    image_token_id: int = 151_655
    video_token_id: int = 151_656
    vision_start_token_id: int = 151_652
    vision_end_token_id: int = 151_653
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, read as the llama family reads it (none of the published files sets it)."""
    architectures: tuple[str, ...] = ()
    model_type: str = "qwen3_vl"
    transformers_version: str = ""


class VisionLanguage:
    """What the Qwen3-VL families add to a text family (Qwen3's dense one, Qwen3-MoE's): the text model under
    model.language_model read from text_config, multimodal RoPE in every layer, DeepStack in the stack of layers,
    the vision tower beside them, and the keys of all three configs a trimmed file may omit. Mixed in before the
    text family, whose hooks (text, blocks, towers, ...) it fills."""

    reference: ClassVar[ReferenceBinding]
    vision_ref: ClassVar[Reference]
    """The vision tower's and the wrapper's classes (Qwen3VLVisionModel, Qwen3VLForConditionalGeneration)."""
    text_class: ClassVar[type]
    """The text_config dataclass (the defaulted keys are read from its fields)."""
    text_prefix: ClassVar[str] = "model.language_model."
    text_key: ClassVar[str] = "text_config."

    @property
    def text_ref(self) -> Reference:
        """The text model's classes: the text family's ref (Qwen3VLTextAttention, ...)."""
        return self.ref  # type: ignore[attr-defined,no-any-return]  # each text family declares its own

    def text(self, c: Any) -> Any:
        return c.text_config

    def text_dtype(self, t: Any) -> str:
        return t.dtype

    def tied(self, c: Any) -> bool:
        return bool(c.tie_word_embeddings)

    def head_citation(self, tied: bool = False) -> Citation:
        return self.vision_ref.cite("lm_head is a bias-free Linear from the text width to the vocabulary"
                                    + (", tied to the token embedding when tie_word_embeddings is set." if tied
                                       else "."), "ForConditionalGeneration.__init__")

    def values(self, c: Any) -> dict[str, int | float]:
        v = c.vision_config
        return {**self.text_values(self.text(c)),  # type: ignore[attr-defined]  # the text family's
                "vit_hidden_size": v.hidden_size, "vit_intermediate_size": v.intermediate_size,
                "vit_patch_values": v.in_channels * v.temporal_patch_size * v.patch_size ** 2,
                "vit_positions": v.num_position_embeddings, "vit_merged_size": v.hidden_size * v.spatial_merge_size ** 2,
                "vit_out_hidden_size": v.out_hidden_size, "vit_in_channels": v.in_channels,
                "vit_temporal_patch_size": v.temporal_patch_size, "vit_patch_size": v.patch_size}

    def sections(self, t: Any) -> tuple[int, ...]:
        """The pairs each axis takes: as the rope settings give them, else the rotary module's default."""
        given = t.rope_scaling.mrope_section if t.rope_scaling is not None else None
        return tuple(given) if given else MROPE_SECTION

    def head_dim(self, t: Any) -> int:
        return int(t.head_dim or t.hidden_size // t.num_attention_heads)

    def deepstack(self, c: Any) -> DeepStackOptions | None:
        """The DeepStack taps, or None where the config lists none (the class accepts an empty list: no mergers)."""
        v = c.vision_config
        taps = tuple(v.deepstack_visual_indexes)
        return DeepStackOptions(taps, v.spatial_merge_size) if taps else None

    # ------------------------------------------------------------------------------------------------ check

    def vision_language_problems(self, c: Any) -> list[str]:
        """The rotary sections, the tower and the DeepStack taps (the text family checks the rest)."""
        t, v = self.text(c), c.vision_config
        sections, pairs = self.sections(t), self.head_dim(t) // 2
        side = round(v.num_position_embeddings ** 0.5)
        taps = tuple(v.deepstack_visual_indexes)
        return rule_problems([
            (len(sections) == 3 and sum(sections) == pairs and min(sections) > 0,
             "text_config.rope_scaling.mrope_section",
             f"must give three positive sections (time, height, width) summing to head_dim / 2 ({pairs}), got "
             f"{list(sections)}"),
            (t.rope_scaling is None or t.rope_scaling.kind == "default", "text_config.rope_scaling.rope_type",
             "must be 'default' (the multimodal sections on plain frequencies)"),
            (not t.attention_bias, "text_config.attention_bias", "must be false"),
            (side * side == v.num_position_embeddings and side % v.spatial_merge_size == 0,
             "vision_config.num_position_embeddings", "must be a square whose side spatial_merge_size divides"),
            (v.hidden_size % v.num_heads == 0 and (v.hidden_size // v.num_heads) % 4 == 0, "vision_config.num_heads",
             "must divide hidden_size into heads whose size is a multiple of 4 (2-D rotary)"),
            (v.hidden_act == "gelu_pytorch_tanh", "vision_config.hidden_act", "must be 'gelu_pytorch_tanh'"),
            (len(set(taps)) == len(taps) and all(0 <= i < v.depth for i in taps) and list(taps) == sorted(taps),
             "vision_config.deepstack_visual_indexes",
             f"must list distinct vision blocks in order, each below depth ({v.depth}), got {list(taps)}"),
            (len(taps) <= t.num_hidden_layers, "vision_config.deepstack_visual_indexes",
             f"must list at most num_hidden_layers ({t.num_hidden_layers}) blocks: feature k joins after layer k"),
            (v.out_hidden_size == t.hidden_size, "vision_config.out_hidden_size",
             f"must equal text_config.hidden_size ({t.hidden_size}): image tokens replace token embeddings"),
        ])

    # ------------------------------------------------------------------------------------------------ build

    def block(self, ctx: Ctx, c: Any, *kind: Any) -> Component:
        """The text family's block with the multimodal rotary module in place of the plain one."""
        block: Component = super().block(ctx, c, *kind)  # type: ignore[misc]  # the text family's
        attn = block.child("attn")
        plain = attn.child("rope")
        o = MRopeOptions("default", c.rope_theta, self.head_dim(c), "half", sections=self.sections(c))
        rotary = mrope(ctx, o, code=f"{self.text_ref.prefix}RotaryEmbedding(config)", reference=self.text_prefix + "rotary_emb",
                       citations=(self.text_ref.cite("The rotary module computes the angles of each axis's positions and "
                                                "takes pair j from the height positions where j ≡ 1 (mod 3), from the "
                                                "width positions where j ≡ 2, each below 3 × its mrope_section, and "
                                                "from time otherwise.", "RotaryEmbedding.recomposition_frequencies"),))
        attn = dataclasses.replace(attn, children=tuple(rotary if ch is plain else ch for ch in attn.children))
        return dataclasses.replace(block, children=tuple(attn if ch.key == "attn" else ch for ch in block.children))

    def layer_stack(self, ctx: Ctx, c: Any, layers: DecoderLayers, citations: tuple[Citation, ...]) -> Component:
        o, blocks = self.deepstack(c), layers.blocks
        if o is None:
            return super().layer_stack(ctx, c, layers, citations)  # type: ignore[misc]  # the text family's
        return deepstack_stack(ctx, blocks, o=o, layers=layers.count, reference=self.text_prefix.rstrip("."),
                               description=f"{layers.description.rstrip('.')}; after each of the first {o.levels}, the "
                                           "matching DeepStack feature is added at the image tokens.",
                               citations=blocks[0].citations[:1] + (self.text_ref.cite(
                                   "After decoder layer k, for k below the number of DeepStack features, the text "
                                   "model adds feature k to the hidden states at the visual positions.",
                                   "Model._deepstack_process"),))

    def towers(self, ctx: Ctx, c: Any) -> tuple[Component, ...]:
        v = c.vision_config
        side = round(v.num_position_embeddings ** 0.5)
        vo = VisionOptions(side, v.spatial_merge_size, v.num_heads, v.hidden_size // v.num_heads)
        return (qwen_vision_tower(ctx, vo, prefix="model.visual.", depth=v.depth, ref=self.vision_ref,
                                  deepstack=self.deepstack(c)),)

    def beside_words(self, c: Any) -> str:
        v = c.vision_config
        taps = len(v.deepstack_visual_indexes)
        return (f"; beside them a {v.depth}-block vision tower whose merger emits tokens of the text width"
                + (f", and {taps} DeepStack mergers" if taps else ""))

    # ----------------------------------------------------------------------------------- defaulted keys

    def defaulted_keys(self, raw: dict[str, Any]) -> tuple[str, ...]:
        """Every key of the wrapper, its text_config and its vision_config that the file omits, dotted below the
        nested configs; exempt keys (what the file says of itself) never."""
        out = [n for n in super().defaulted_keys(raw)  # type: ignore[misc]  # Family's, for the wrapper's keys
               if n not in ("text_config", "vision_config")]
        for table, cls in (("text_config", self.text_class), ("vision_config", Qwen3VLVisionHyperparameters)):
            given = raw.get(table) or {}
            out += [f"{table}.{f.name}" for f in dataclasses.fields(cls)
                    if f.name not in given and f.name not in Family.defaulted_exempt]
        return tuple(sorted(out))

    def defaulted_value(self, config: Any, key: str) -> Any:
        if key == "text_config.rope_scaling":  # absent: the rotary module's own sections, on the default frequencies
            return {"rope_type": "default", "mrope_section": list(MROPE_SECTION)}
        value = config
        for part in key.split("."):
            value = getattr(value, part)
        return as_published(value)

    def default_source(self, key: str) -> str:
        if key == "text_config.rope_scaling":
            return f"{self.text_ref.prefix}RotaryEmbedding"
        nested = {"text_config": "TextConfig", "vision_config": "VisionConfig"}.get(key.split(".")[0])
        return self.vision_ref.prefix + nested if nested else self.reference.config_class

    def build_spec(self, slug: str, raw: dict[str, Any], where: str) -> ModelSpec:
        spec: ModelSpec = super().build_spec(slug, raw, where)  # type: ignore[misc]  # Family's
        return dataclasses.replace(spec, defaulted=self.defaulted_keys(raw))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_vision(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The tiny config's tower and token ids: three blocks over a 4×4 patch grid merged 2×2, the first two
        feeding DeepStack features into the first two layers (raw: the tiny config, changed in place)."""
        raw["vision_config"].update(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=2,
                                    temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                                    out_hidden_size=raw["text_config"]["hidden_size"], deepstack_visual_indexes=[0, 1])
        raw.update(image_token_id=90, video_token_id=91, vision_start_token_id=92, vision_end_token_id=93)
        raw.pop("quantization_config", None)
        return raw

    def tiny_label_parts(self, tiny: ModelSpec) -> tuple[str, ...]:
        return (f"mrope_section {list(self.sections(self.text(tiny.config)))}",)

    def tiny_label_towers(self, tiny: ModelSpec) -> tuple[str, ...]:
        config: Any = tiny.config
        taps = list(config.vision_config.deepstack_visual_indexes)
        return (tower_label(tiny, "vit_hidden_size", tower_key="visual", blocks_key="blocks")
                + f", DeepStack from blocks {taps}",)

    def vision_facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        v = c.vision_config
        taps = ", ".join(str(i) for i in v.deepstack_visual_indexes)
        stacked = f"; DeepStack from blocks {taps}" if taps else "; no DeepStack"
        return (("vision tower", f"{v.depth} blocks of {v.hidden_size:,}{stacked}"),)


TINY_TEXT = dict(vocab_size=97, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=24, max_position_embeddings=256, dtype="float32", bos_token_id=0, eos_token_id=1,
                 rope_scaling={"rope_type": "default", "mrope_section": [6, 3, 3], "mrope_interleaved": True})
"""The tiny text model both families share: 3 decoder layers, 4 query heads over 2 KV heads of 24 (12 rotary pairs
sectioned 6, 3, 3, so the sections' bounds matter)."""


class Qwen3VL(VisionLanguage, Qwen3):
    """Qwen3VLForConditionalGeneration: Qwen3's text model with interleaved MRoPE and DeepStack, a vision tower."""

    name = "qwen3_vl"
    model_types = ("qwen3_vl",)
    config_class: ClassVar[type] = Qwen3VLHyperparameters
    text_class: ClassVar[type] = Qwen3VLTextHyperparameters
    reference = ReferenceBinding("Qwen3VLConfig", "Qwen3VLForConditionalGeneration")
    ref = Reference(FILE, "Qwen3VLText")
    vision_ref: ClassVar[Reference] = Reference(FILE, "Qwen3VL")
    symbols: ClassVar[tuple[str, ...]] = TEXT_SYMBOLS + tuple(VISION_LABELS)
    labels: ClassVar[dict[str, str]] = {**DIM_LABELS, **VISION_LABELS}

    def check(self, c: Any) -> list[str]:
        return Llama.check(self, c) + self.vision_language_problems(c)

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """TINY_TEXT with a SwiGLU width of 96, and the tower of tiny_vision."""
        raw = as_published(c)
        raw["text_config"].update(TINY_TEXT, intermediate_size=96)
        return self.tiny_vision(raw)

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return super().facts(c) + self.vision_facts(c)


FAMILY = Qwen3VL()
