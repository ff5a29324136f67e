"""Kimi K2.5: Kimi K2's text model (the DeepSeek-V3 family, composed here, not copied) under
model.language_model, a MoonViT vision tower and a patch-merger projector (components/moonvit.py), and routed
experts stored as compressed-tensors INT4 (pack-quantized, group 32, symmetric) with the config's ignore list
applied: attention, the shared experts, the dense MLP and the head stay BF16.

The published vision_config carries the original remote code's keys (vt_hidden_size, init_pos_emb_height, ...);
transformers 5.23's Kimi_K25VisionConfig reads hidden_size, pos_emb_height, ... instead, which the file does not
publish, so they take that class's defaults. The family says so (the page lists them as defaulted) and checks that
the published keys agree with the values the reference uses, so a config whose vt_* keys differ is rejected
rather than built at the wrong size.

References: "Kimi K2.5: Visual Agentic Intelligence" (arXiv:2602.02276); transformers'
models/kimi_k25/modeling_kimi_k25.py and models/deepseek_v3/modeling_deepseek_v3.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.moonvit import LABELS as VISION_LABELS
from explorer.model.components.moonvit import ImageGrid, MoonViTOptions, projector, vision_tower
from explorer.model.components.part_facts import facts
from explorer.model.families.base import ReferenceBinding, RopeScaling, rule_problems, stored_dtype, tower_label
from explorer.model.families.deepseek_v3 import DIM_LABELS, DeepseekV3, DeepseekV3Hyperparameters
from explorer.model.families.renames import split_fused_experts
from explorer.model.quantization import CompressedTensorsConfig, compressed_tensors_problems, ignored, quantize_linears
from explorer.spec.storage import PackQuantized
from explorer.spec.types import Citation, Component, ModelSpec

REFERENCE = Reference("models/kimi_k25/modeling_kimi_k25.py", "Kimi_K25")
TEXT_PREFIX = "model.language_model."


@dataclass(frozen=True, slots=True)
class RopeParameters(RopeScaling):
    """text_config "rope_parameters": transformers 5's name for rope_scaling, with the rotary base inside it (Kimi
    K2.7's config publishes it in place of rope_scaling)."""

    rope_theta: float | None = None


def with_rope_parameters(t: Any) -> Any:
    """The text config with rope_parameters read as DeepseekV3Config reads it: its scaling for rope_scaling, its base
    for rope_theta (check refuses the two spellings disagreeing)."""
    rp = t.rope_parameters
    if rp is None:
        return t
    scaling = {f.name: getattr(rp, f.name) for f in dataclasses.fields(RopeScaling)}
    return replace(t, rope_theta=rp.rope_theta if rp.rope_theta is not None else t.rope_theta,
                   rope_scaling=RopeScaling(**scaling) if rp.kind != "default" else None)


@dataclass(frozen=True, slots=True)
class KimiK25TextHyperparameters(DeepseekV3Hyperparameters):
    """text_config: the DeepSeek-V3 keys, the INT4 quantization config, and the generic keys an older transformers
    wrote into every serialized config (recorded as published, passed on to the reference as it would read them)."""

    quantization_config: CompressedTensorsConfig | None = None  # type: ignore[assignment]
    dtype: str = "bfloat16"
    rope_parameters: RopeParameters | None = None
    """Where published, the rotary base and scaling (rope_theta and rope_scaling, where also published, must agree)."""
    _name_or_path: str = ""
    add_cross_attention: bool = False
    bad_words_ids: Any = None
    begin_suppress_tokens: Any = None
    chunk_size_feed_forward: int = 0
    cross_attention_hidden_size: int | None = None
    decoder_start_token_id: int | None = None
    diversity_penalty: float = 0.0
    do_sample: bool = False
    early_stopping: bool = False
    encoder_no_repeat_ngram_size: int = 0
    exponential_decay_length_penalty: Any = None
    finetuning_task: str | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None
    id2label: dict[str, str] = field(default_factory=dict)
    is_decoder: bool = False
    is_encoder_decoder: bool = False
    label2id: dict[str, int] = field(default_factory=dict)
    length_penalty: float = 1.0
    max_length: int = 20
    min_length: int = 0
    no_repeat_ngram_size: int = 0
    num_beam_groups: int = 1
    num_beams: int = 1
    num_return_sequences: int = 1
    output_attentions: bool = False
    output_hidden_states: bool = False
    output_scores: bool = False
    pad_token_id: int | None = None
    prefix: str | None = None
    problem_type: str | None = None
    pruned_heads: dict[str, Any] = field(default_factory=dict)
    remove_invalid_values: bool = False
    repetition_penalty: float = 1.0
    return_dict: bool = True
    return_dict_in_generate: bool = False
    sep_token_id: int | None = None
    suppress_tokens: Any = None
    task_specific_params: Any = None
    temperature: float = 1.0
    tf_legacy_loss: bool = False
    tie_encoder_decoder: bool = False
    tokenizer_class: str | None = None
    top_k: int = 50
    top_p: float = 1.0
    torchscript: bool = False
    typical_p: float = 1.0
    use_bfloat16: bool = False


@dataclass(frozen=True, slots=True)
class KimiK25VisionHyperparameters:
    """vision_config: Kimi_K25VisionConfig's keys (absent from the published file: its defaults) and the keys the
    file publishes for the original remote code (checked to agree)."""

    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_hidden_layers: int = 27
    num_attention_heads: int = 16
    patch_size: int = 14
    pos_emb_height: int = 64
    pos_emb_width: int = 64
    pos_emb_time: int = 4
    hidden_act: str = "gelu_pytorch_tanh"
    merge_kernel_size: tuple[int, int] = (2, 2)
    model_type: str = "kimi_k25_vision"
    # Published for the remote code; transformers 5.23 does not read them.
    _attn_implementation: str | None = None
    vt_hidden_size: int | None = None
    vt_intermediate_size: int | None = None
    vt_num_attention_heads: int | None = None
    vt_num_hidden_layers: int | None = None
    init_pos_emb_height: int | None = None
    init_pos_emb_width: int | None = None
    init_pos_emb_time: int | None = None
    mm_hidden_size: int | None = None
    text_hidden_size: int | None = None
    merge_type: str | None = None
    mm_projector_type: str | None = None
    pos_emb_type: str | None = None
    projector_hidden_act: str | None = None
    projector_ln_eps: float | None = None
    video_attn_type: str | None = None


VISION_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size",
               "pos_emb_height", "pos_emb_width", "pos_emb_time", "hidden_act", "merge_kernel_size")
"""The keys transformers reads to size the tower: a page names the ones the file leaves to defaults."""

PUBLISHED_TWINS = (("vt_hidden_size", "hidden_size"), ("vt_intermediate_size", "intermediate_size"),
                   ("vt_num_attention_heads", "num_attention_heads"), ("vt_num_hidden_layers", "num_hidden_layers"),
                   ("init_pos_emb_height", "pos_emb_height"), ("init_pos_emb_width", "pos_emb_width"),
                   ("init_pos_emb_time", "pos_emb_time"), ("mm_hidden_size", "hidden_size"))
"""(published remote-code key, the transformers key that must equal it)."""


@dataclass(frozen=True, slots=True)
class KimiK25Hyperparameters:
    """Kimi_K25Config: the text and vision configs, the projector's keys and the media token ids."""

    text_config: KimiK25TextHyperparameters
    vision_config: KimiK25VisionHyperparameters
    projection_hidden_size: int = 1152
    projection_layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    image_token_id: int = 163_605
    video_token_id: int = 163_840
    vision_start_token_id: int = 163_602
    vision_end_token_id: int = 163_604
    # Informational keys: recorded as published, not used by the spec.
    architectures: tuple[str, ...] = ()
    auto_map: dict[str, str] = field(default_factory=dict)
    model_type: str = "kimi_k25"
    dtype: str = "bfloat16"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    ignore_index: int = -100
    media_placeholder_token_id: int | None = None
    use_unified_vision_chunk: bool = False
    video_placeholder: str = ""


class KimiK25(DeepseekV3):
    """Kimi_K25ForConditionalGeneration: the DeepSeek-V3 text model, a MoonViT tower and a projector."""

    name = "kimi_k25"
    model_types: ClassVar[tuple[str, ...]] = ("kimi_k25",)
    config_class: ClassVar[type] = KimiK25Hyperparameters
    reference = ReferenceBinding(
        "Kimi_K25Config", "Kimi_K25ForConditionalGeneration", renames=split_fused_experts,
        config_skip=("auto_map", "architectures", "text_config.quantization_config", "text_config.auto_map",
                     "text_config.architectures", "vision_config._attn_implementation"))
    prefix = TEXT_PREFIX

    # ------------------------------------------------------------------------------------------- config

    def values(self, c: Any) -> dict[str, int | float]:
        v = c.vision_config
        kh, kw = v.merge_kernel_size
        return {**super().values(c.text_config), "vision_hidden_size": v.hidden_size,
                "vision_intermediate_size": v.intermediate_size, "num_channels": 3, "patch_size": v.patch_size,
                "pos_emb_height": v.pos_emb_height, "pos_emb_width": v.pos_emb_width,
                "merged_hidden_size": v.hidden_size * kh * kw}

    def check(self, c: Any) -> list[str]:
        t, v = c.text_config, c.vision_config
        twins = [(getattr(v, pub) is None or getattr(v, pub) == getattr(v, key), f"vision_config.{pub}",
                  f"must equal vision_config.{key} ({getattr(v, key)}): transformers 5.23 sizes the tower from "
                  f"{key}, not {pub}") for pub, key in PUBLISHED_TWINS]
        heads_ok = v.num_attention_heads >= 1 and v.hidden_size % v.num_attention_heads == 0
        return [p.replace("key '", "key 'text_config.", 1) for p in super().check(replace(with_rope_parameters(t), quantization_config=None))] + compressed_tensors_problems(
            t.quantization_config, "text_config.quantization_config") + rule_problems(twins + [
                # the reference takes text_config without its null keys (as_published), so a null query latent
                # would build DeepseekV3Config's default q_a_proj where this family builds q_proj
                (t.rope_parameters is None or t.rope_scaling is None
                 or with_rope_parameters(t).rope_scaling == t.rope_scaling, "text_config.rope_parameters",
                 "must give the same scaling as text_config.rope_scaling where both are published"),
                (t.rope_parameters is None or t.rope_parameters.rope_theta in (None, t.rope_theta),
                 "text_config.rope_parameters.rope_theta",
                 f"must equal text_config.rope_theta ({t.rope_theta}) where both are published"),
                (t.q_lora_rank is not None, "text_config.q_lora_rank",
                 "must be set: a text config without a query latent (q_lora_rank null) is not in this family yet"),
                (heads_ok and (v.hidden_size // max(v.num_attention_heads, 1)) % 4 == 0,
                 "vision_config.num_attention_heads",
                 "must divide hidden_size into heads whose width is a multiple of 4 (two axes, rotary pairs)"),
                (v.hidden_act == "gelu_pytorch_tanh", "vision_config.hidden_act", "must be 'gelu_pytorch_tanh'"),
                (len(v.merge_kernel_size) == 2 and min(v.merge_kernel_size) >= 1, "vision_config.merge_kernel_size",
                 "must be two positive integers"),
                (c.projection_hidden_size == v.hidden_size, "projection_hidden_size",
                 f"must equal vision_config.hidden_size ({v.hidden_size}): the projector normalises each patch vector"),
                (v.text_hidden_size is None or v.text_hidden_size == t.hidden_size, "vision_config.text_hidden_size",
                 f"must equal text_config.hidden_size ({t.hidden_size})"),
                (v.projector_hidden_act in (None, "gelu"), "vision_config.projector_hidden_act",
                 "must be 'gelu' (the projector's nn.GELU)"),
                (v.merge_type in (None, "sd2_tpool"), "vision_config.merge_type", "must be 'sd2_tpool'"),
                (not c.tie_word_embeddings and not t.tie_word_embeddings, "tie_word_embeddings",
                 "must be false: Kimi K2.5 stores lm_head separately"),
            ])

    def build_spec(self, slug: str, raw: dict[str, Any], where: str) -> ModelSpec:
        spec = super().build_spec(slug, raw, where)
        vision = raw.get("vision_config") or {}
        return replace(spec, defaulted=tuple(f"vision_config.{k}" for k in VISION_KEYS if k not in vision))

    def default_source(self, key: str) -> str:
        return {"vision_config": "Kimi_K25VisionConfig", "text_config": "DeepseekV3Config"}.get(
            key.split(".")[0], self.reference.config_class)

    # ------------------------------------------------------------------------------------------------ build

    def quantized_storage(self, c: Any) -> Any:
        return None  # the INT4 format reaches only the projections the ignore list leaves, applied after the build

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        t, v = c.text_config, c.vision_config
        text = super().build(replace(with_rope_parameters(t), torch_dtype=t.dtype), values)
        text = _rope_reference(self.quantize(text, t), TEXT_PREFIX + "rotary_emb")
        ctx = Ctx(values, {**DIM_LABELS, **VISION_LABELS}, REFERENCE, stored_dtype(c.dtype))
        grid = example_grid(v)
        o = MoonViTOptions(grid, v.num_attention_heads, v.hidden_size // v.num_attention_heads)
        tower = vision_tower(ctx, prefix="model.vision_tower.", layers=v.num_hidden_layers, o=o)
        proj = projector(ctx, prefix="model.mm_projector.", grid=grid, eps=c.projection_layer_norm_eps)
        px = v.patch_size
        return replace(text, children=text.children + (tower, proj), code="Kimi_K25ForConditionalGeneration(config)",
                       citations=text.citations + (REFERENCE.cite(
                           "The model holds the vision tower, the DeepSeek-V3 language model and the projector; "
                           "image features replace the image placeholder tokens' embeddings.", "Model"),),
                       description=text.description + f" Beside it, a {v.num_hidden_layers}-block MoonViT vision "
                       f"tower and a projector turn an image into one token of the text width per "
                       f"{grid.merge_h}×{grid.merge_w} patches of {px}×{px} pixels (shown for an image "
                       f"{grid.w * px:,} pixels wide and {grid.h * px:,} tall: {grid.patches:,} patches, "
                       f"{grid.tokens:,} tokens)." + _bias_note(t))

    def quantize(self, text: Component, t: KimiK25TextHyperparameters) -> Component:
        """Routed experts (every Linear the ignore list leaves) as pack-quantized integers."""
        q = t.quantization_config
        if q is None:
            return text
        w = next(iter(q.config_groups.values())).weights
        assert w is not None and w.group_size is not None  # compressed_tensors_problems rejected anything else
        storage = PackQuantized(w.num_bits, w.group_size, stored_dtype(t.dtype))
        citation = Citation(f"Weights are stored {storage.stored_as}, except modules matching the ignore list "
                            f"({', '.join(q.ignore)}); scales and shapes are quantization metadata, not parameters.",
                            "config", "text_config.quantization_config")
        return quantize_linears(text, storage, lambda name: ignored(name, q.ignore), citation,
                                module_name=self.text_module_name)

    def text_module_name(self, name: str) -> str:
        """The name text_config.quantization_config's ignore list sees: the text model was quantized on its own, so
        "model.language_model.layers.3.mlp" is "model.layers.3.mlp"."""
        return "model." + name.removeprefix(TEXT_PREFIX) if name.startswith(TEXT_PREFIX) else name

    def variant_module_name(self, name: str) -> str:
        """The name a repack of the whole checkpoint matches (ModelOpt's exclude_modules for Kimi K2.6 and K2.7):
        the checkpoint's own module names, "language_model.model.layers.3.mlp", "language_model.lm_head",
        "vision_tower.…" and "mm_projector.…" for transformers' model.language_model.layers.3.mlp, lm_head,
        model.vision_tower.… and model.mm_projector.…"""
        if name.startswith(TEXT_PREFIX):
            return "language_model.model." + name.removeprefix(TEXT_PREFIX)
        if name == "lm_head" or name.startswith("lm_head."):
            return "language_model." + name
        return name.removeprefix("model.")

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """The DeepSeek-V3 tiny text model; a 2-block tower of width 32 (2 heads of 16) whose 4 × 4 position grid
        is resampled to a 6 × 4-patch image (not square, not the table's size), merged 2 × 2 into 6 tokens."""
        # rope_parameters read as rope_scaling (K2.7 spells it so), so the tiny YaRN shrinks its original positions too
        text = super().tiny_config(replace(with_rope_parameters(c.text_config), rope_parameters=None))
        text.update(id2label={}, label2id={}, pruned_heads={}, pad_token_id=None, dtype="float32", torch_dtype="float32")
        vision = {**_as_dict(c.vision_config), "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                  "num_attention_heads": 2, "patch_size": 2, "pos_emb_height": 4, "pos_emb_width": 4,
                  "_attn_implementation": None}
        for pub, key in PUBLISHED_TWINS:
            if vision.get(pub) is not None:
                vision[pub] = vision[key]
        if vision.get("text_hidden_size") is not None:
            vision["text_hidden_size"] = text["hidden_size"]
        return {**_as_dict(c), "text_config": text, "vision_config": vision, "projection_hidden_size": 32,
                "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": None, "dtype": "float32"}
        # the media token ids stay as published, beyond the tiny vocabulary: text-only checks then see no
        # placeholder (the reference zeroes a placeholder's id before the embedding)

    def tiny_label_towers(self, tiny: ModelSpec) -> tuple[str, ...]:
        return (tower_label(tiny, "vision_hidden_size"),)

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        v = c.vision_config
        return super().facts(c.text_config) + (
            ("vision tower", f"MoonViT, {v.num_hidden_layers} blocks of width {v.hidden_size:,}"),)


def example_grid(v: KimiK25VisionHyperparameters) -> ImageGrid:
    """The image the pages and checks show: half again as tall as the position table and as wide (a 3:2 portrait
    image, so the table is resampled and the two axes differ), rounded up to whole merge groups."""
    kh, kw = v.merge_kernel_size
    return ImageGrid(-(-(v.pos_emb_height * 3 // 2) // kh) * kh, -(-v.pos_emb_width // kw) * kw, kh, kw)


def _bias_note(t: KimiK25TextHyperparameters) -> str:
    """Which of the two totals the page's count is: the router's correction biases are persistent buffers in
    transformers (not parameters) that the checkpoint stores beside the weights, and the ledger counts them."""
    moe_layers = t.num_hidden_layers - t.first_k_dense_replace
    n = moe_layers * t.n_routed_experts
    return (f" The count includes the {moe_layers} × {t.n_routed_experts} = {n:,} elements of the routers' "
            "e_score_correction_bias, which transformers holds as persistent buffers, not parameters: subtract them "
            "for its parameter count.")


def _rope_reference(comp: Component, module: str) -> Component:
    """The text model's rotary components name the reference's rotary module where it lives in this model (under
    model.language_model), so their checks and the attention's reference call use it."""
    if facts(comp.program).rotary and comp.reference in ("", "model.rotary_emb"):
        return replace(comp, reference=module)
    children = tuple(_rope_reference(c, module) for c in comp.children)
    return replace(comp, children=children) if children != comp.children else comp


def _as_dict(config: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = _as_dict(value)
        elif isinstance(value, dict):
            value = {k: _as_dict(x) if dataclasses.is_dataclass(x) else x for k, x in value.items()}
        out[f.name] = value
    return out


FAMILY = KimiK25()
