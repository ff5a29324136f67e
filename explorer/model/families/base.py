"""The family contract: what a model family provides so that every stage can build, check and explain its models.

A family (as MkDocs' BasePlugin declares its hooks) is a small subclass of `Family` that
  - names itself and the config.json `model_type` values it reads (`name`, `model_types`),
  - declares its typed config (`config_class`, a frozen dataclass of config.json keys, named as published),
  - cross-checks a parsed config (`check`), beyond the types and ranges every family gets from `validate`,
  - builds the component tree from library parts: `build` is the skeleton most families share (token embedding →
    decoder layers grouped by layer kind → any modules after the stack (MTP) → final norm → LM head → towers beside
    the text model), and a family overrides the small hooks below it — `decoder_layers` (its block kinds, the one
    hook every family writes), `context`, `embedding`, `layer_stack`, `after_stack`, `final_norm`, `lm_head`,
    `towers`, `model_description`, `finish` — rather than restating the chain,
  - gives a tiny config that keeps the structure the pages claim (`tiny_config`),
  - binds the reference implementation (`reference`: transformers classes, tensor renames, modules it skips),
  - and says what the index card shows (`facts`).

Content: a config.json key published as null is listed in model.toml's `checkpoint.config_nulls`; a key the
published config omits takes the family's default, which is the reference config class's default (a key the typed
config requires takes the default the class's source gives, explorer/model/config_defaults.py), and the page says it is a
default; `dtype` and `torch_dtype` are one key under two names. `validate` rejects non-finite numbers and sizes outside LIMITS with the valid range.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.content.model_content import parse_table
from explorer.errors import ContentError
from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port
from explorer.model.components.blocks import model_root, stack
from explorer.model.components.embedding import embedding, head
from explorer.model.components.norms import rmsnorm
from explorer.model.components.rope import Pairing, RopeOptions
from explorer.model.config_defaults import aliased_dtype, with_class_defaults
from explorer.model.families.block_fp8 import FP8QuantizationConfig, fp8_block_storage, keep_named_modules_dense
from explorer.model.families.rules import rule_problems
from explorer.spec.storage import TORCH_DTYPES, BlockFP8, SchemeError, Storage
from explorer.spec.types import Citation, Component, DeclaredMTP, Hyperparameters, ModelSpec, walk

DIM_LABELS = {
    "hidden_size": "d", "intermediate_size": "d_ff", "moe_intermediate_size": "d_expert", "vocab_size": "vocab",
    "q_lora_rank": "d_cq", "kv_lora_rank": "d_ckv", "num_attention_heads": "heads", "num_key_value_heads": "kv_heads",
    "qk_nope_head_dim": "d_nope", "qk_rope_head_dim": "d_rope", "v_head_dim": "d_v", "n_routed_experts": "experts",
    "num_experts_per_tok": "k", "head_dim": "d_head", "n_shared_experts": "shared", "num_local_experts": "experts",
    "max_position_embeddings": "positions",
}
"""Short names of config sizes in shapes ("7168 d")."""

LIMITS = {
    "vision_soft_tokens_per_image": 1_000_000, "interleave_moe_layer_step": 1_000,
    "original_max_position_embeddings": 100_000_000,
    "vocab_size": 10_000_000, "hidden_size": 1_000_000, "intermediate_size": 10_000_000,
    "moe_intermediate_size": 10_000_000, "num_hidden_layers": 1_000, "num_attention_heads": 10_000,
    "num_key_value_heads": 10_000, "head_dim": 100_000, "n_routed_experts": 4_096, "num_local_experts": 4_096,
    "num_experts_per_tok": 4_096, "q_lora_rank": 1_000_000, "kv_lora_rank": 1_000_000, "qk_nope_head_dim": 100_000,
    "qk_rope_head_dim": 100_000, "v_head_dim": 100_000, "n_shared_experts": 1_024, "max_position_embeddings": 100_000_000,
    "num_nextn_predict_layers": 16, "n_group": 4_096, "topk_group": 4_096, "sliding_window": 100_000_000,
    "hc_mult": 64, "hc_sinkhorn_iters": 1_000, "o_groups": 10_000, "o_lora_rank": 1_000_000, "index_n_heads": 10_000,
    "index_head_dim": 100_000, "index_topk": 100_000_000, "num_hash_layers": 1_000,
    # the newer families' sizes (issue 37: a zero gave a traceback, a huge one a build past the machine's memory)
    "linear_num_heads": 10_000, "linear_head_dim": 100_000, "linear_num_key_heads": 10_000,
    "linear_num_value_heads": 10_000, "linear_key_head_dim": 100_000, "linear_value_head_dim": 100_000,
    "linear_conv_kernel_dim": 1_024, "num_experts": 4_096, "experts_per_token": 4_096, "top_k_experts": 4_096,
    "shared_expert_intermediate_size": 10_000_000, "moe_shared_expert_intermediate_size": 10_000_000,
    "shared_intermediate_size": 10_000_000, "intermediate_size_mlp": 10_000_000, "global_head_dim": 100_000,
    "num_global_key_value_heads": 10_000, "swa_head_dim": 100_000, "swa_v_head_dim": 100_000,
    "swa_num_attention_heads": 10_000, "swa_num_key_value_heads": 10_000, "mamba_num_heads": 10_000,
    "mamba_head_dim": 100_000, "ssm_state_size": 100_000, "n_groups": 10_000, "conv_kernel": 1_024,
    "moe_latent_size": 1_000_000, "rotary_dim": 100_000, "qk_head_dim": 100_000, "first_k_dense_replace": 1_000,
    "decoder_sparse_step": 1_000, "full_attention_interval": 1_000, "mtp_num_hidden_layers": 16,
    "num_mtp_modules": 16, "mtp_transformer_layers": 16, "dense_intermediate_size": 10_000_000,
    # MiniMax-M3's block indexer, flat and as sparse_attention_config names it
    "index_block_size": 1_000_000, "index_topk_blocks": 1_000_000, "index_local_blocks": 1_000_000,
    "sparse_block_size": 1_000_000, "sparse_topk_blocks": 1_000_000, "sparse_local_block": 1_000_000,
    "sparse_num_index_heads": 10_000, "sparse_index_dim": 100_000, "sparse_init_block": 1_000_000,
    # vision towers (depth and widths: a tower of 10^6 blocks was accepted and its build ran out of memory)
    "depth": 1_000, "num_heads": 10_000, "out_hidden_size": 1_000_000, "num_position_embeddings": 10_000_000,
    "patch_size": 10_000, "spatial_merge_size": 64, "temporal_patch_size": 64, "in_channels": 64,
    "num_channels": 64, "image_size": 100_000, "mm_tokens_per_image": 10_000_000, "vt_hidden_size": 1_000_000,
    "vt_intermediate_size": 10_000_000, "vt_num_attention_heads": 10_000, "vt_num_hidden_layers": 1_000,
    "mm_hidden_size": 1_000_000, "text_hidden_size": 1_000_000,
    # GPT-2's names
    "n_embd": 1_000_000, "n_head": 10_000, "n_layer": 1_000, "n_inner": 10_000_000, "n_positions": 100_000_000,
    "n_ctx": 100_000_000,
}
"""Largest accepted value of each size key: checked before anything is built, so a hostile config cannot
allocate without bound."""
MAX_MODEL_TENSORS = 400_000
"""Most weight tensors a model's spec may describe (Qwen3.5-397B-A17B, the largest here, has 93,411; Kimi K2 70,036):
the reference is built module by module on the meta device, and each sizes within LIMITS can still multiply past
the machine's memory (1,000 layers of 4,096 experts: 12 million modules)."""
MAY_BE_ZERO = ("num_nextn_predict_layers", "n_shared_experts", "sliding_window", "num_hash_layers",
               "first_k_dense_replace", "mtp_num_hidden_layers", "num_mtp_modules", "mtp_transformer_layers",
               "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", "shared_intermediate_size",
               "index_local_blocks", "sparse_local_block", "sparse_init_block")
"""Size keys for which 0 means "none"."""

POSITIVE_FLOATS = ("rms_norm_eps", "layer_norm_epsilon", "rope_theta", "routed_scaling_factor", "factor",
                   "beta_fast", "beta_slow", "compress_rope_theta", "hc_eps", "query_pre_attn_scalar", "norm_eps",
                   "layer_norm_eps")
"""Keys (at any depth) that must be finite and > 0."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedMetadata(Hyperparameters):
    """config.json keys that families of the transformers lineage publish alike and the spec does not use: recorded
    as published (and handed to the reference config class), with the defaults those config classes share."""

    architectures: tuple[str, ...] = ()
    model_type: str = ""
    pad_token_id: int | None = None
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    use_cache: bool = True
    transformers_version: str = ""


@dataclass(frozen=True, slots=True)
class ReferenceBinding:
    """How the reference implementation builds a family's models."""

    config_class: str
    """transformers config class, e.g. "LlamaConfig"."""
    model_class: str
    """transformers model class, e.g. "LlamaForCausalLM"."""
    not_built: tuple[str, ...] = ()
    """Component paths the reference does not build (DeepSeek-V3's MTP module)."""
    renames: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """Maps the reference's state dict to checkpoint tensor names (e.g. splits fused experts); None: same names."""
    config_skip: tuple[str, ...] = ("quantization_config", "auto_map", "architectures")
    """Config keys not passed to the reference config class (storage formats and loader metadata)."""
    skip_when_unset: tuple[str, ...] = ()
    """Config keys passed to the reference config class only where set: one it would read as a value when handed
    None (MiniMaxM2Config rotates whole heads for a None partial_rotary_factor, where an omitted one comes from
    rotary_dim)."""
    config_key: str = ""
    """The nested table the reference config class takes where the published file wraps it (Llama 4 Scout's
    text_config, built as Llama4TextConfig); empty: the whole config."""
    head: str = ""
    """Where model_class is a text model without an LM head (Step3p7TextModel: the published architecture is not a
    transformers class), the name of the untied, bias-free Linear from hidden_size to vocab_size that the binding
    adds beside it ("lm_head"), the text model then sitting under "model"; empty: model_class has its head."""
    release_names: tuple[tuple[str, str], ...] = ()
    """Where the release names its tensors otherwise than the reference (and the spec): regex rules, applied in order,
    from a reference tensor name (without its "model." prefix) to the release's, the inverse of transformers'
    conversion mapping for the family (explorer/checkpoint/release_layout.py); empty: the release uses the spec's
    names."""
    release_splits: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Reference tensors the loader concatenates from several release tensors along their first axis: a pattern of
    the release name, and the replacements that name each part, in order (equal parts)."""


@dataclass(frozen=True, slots=True)
class DecoderLayers:
    """A family's decoder layers as the skeleton stacks them."""

    blocks: tuple[Component, ...]
    """One block per layer kind, in order of its first layer."""
    count: int
    """Layers in the stack."""
    description: str
    """What the stack's page says of them ("32 identical decoder layers.")."""


class Family:
    """Base of every family module: override the class attributes, `decoder_layers` (or the skeleton's other
    hooks), `tiny_config` and `facts`."""

    name: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]]
    config_class: ClassVar[type]
    reference: ClassVar[ReferenceBinding]
    ref: ClassVar[Reference]
    """The reference source the family's citations point into."""
    labels: ClassVar[dict[str, str]] = DIM_LABELS
    """Short names of the sizes in shapes."""
    text_prefix: ClassVar[str] = "model."
    """The text model's module path in the reference and the checkpoint ("model.language_model." where a vision
    model wraps it, as Qwen3-VL does)."""
    text_key: ClassVar[str] = ""
    """Where the text model's keys are in the config ("text_config."), for the problems check() names."""
    symbols: ClassVar[tuple[str, ...]]
    """Config keys that appear in formulas and shapes (sympy symbols)."""
    fp8_kept_modules: ClassVar[tuple[str, ...]] = ()
    """The reference model's _keep_in_fp32_modules: transformers' FP8 quantizer adds them to a config's
    modules_to_not_convert, so a block-wise FP8 release keeps them in its dtype (explorer/checkpoint/variants.py)."""

    # ------------------------------------------------------------------------------------- hooks to override

    def check(self, config: Any) -> list[str]:
        """Relations between keys a self-consistent config satisfies: "key 'k': message" per problem."""
        return []

    def build(self, config: Any, values: dict[str, int | float]) -> Component:
        """The component tree of a model of this family: the skeleton, each piece from a hook below. The blocks are
        built first (before the embedding), the order every family has built them in."""
        ctx = self.context(config, values)
        layers = self.decoder_layers(ctx, config)
        cites = self.model_citations(config)
        children = (self.embedding(ctx, config, cites), self.layer_stack(ctx, config, layers, cites),
                    *self.after_stack(ctx, config, layers), self.final_norm(ctx, config), self.lm_head(ctx, config))
        root = model_root(ctx, children, code=self.root_code(config), layers=layers.count, citations=cites[:1],
                          description=self.model_description(config, layers))
        root = dataclasses.replace(root, children=root.children + self.towers(ctx, config))
        return self.finish(ctx, config, root)

    # ----------------------------------------------------------------------- the skeleton's hooks

    def text(self, c: Any) -> Any:
        """The text model's config: the whole config here, a nested text_config in a vision-language family."""
        return c

    def text_dtype(self, t: Any) -> str:
        """The text model's stored dtype as published."""
        return t.torch_dtype

    def quantization(self, c: Any) -> FP8QuantizationConfig | None:
        """The config's block-wise FP8 quantization_config, where it has one (gpt-oss's MXFP4 is its own)."""
        q = getattr(c, "quantization_config", None)
        return q if isinstance(q, FP8QuantizationConfig) else None

    def context(self, c: Any, values: dict[str, int | float]) -> Ctx:
        """The sizes and storage policy every part is built with."""
        return Ctx(values, self.labels, self.ref, stored_dtype(self.text_dtype(self.text(c))),
                   fp8_block_storage(self.quantization(c)))

    def decoder_layers(self, ctx: Ctx, c: Any) -> DecoderLayers:
        """The block kinds in order of their first layer, and how the stack describes them."""
        raise NotImplementedError

    def model_citations(self, c: Any) -> tuple[Citation, ...]:
        """What the embedding cites of the model's chain (the root cites the first)."""
        return (self.ref.cite("The model embeds token ids, runs the decoder layers and a final RMSNorm.",
                              "Model.__init__"),)

    def embedding(self, ctx: Ctx, c: Any, citations: tuple[Citation, ...]) -> Component:
        return embedding(ctx, "embed", "Token embedding", weight=self.text_prefix + "embed_tokens.weight",
                         citations=citations)

    def layer_stack(self, ctx: Ctx, c: Any, layers: DecoderLayers, citations: tuple[Citation, ...]) -> Component:
        """The decoder layers in order (a family whose layers take more than the residual stream overrides it)."""
        return stack(ctx, layers.blocks, layers=layers.count, description=layers.description,
                     citations=layers.blocks[0].citations[:1])

    def after_stack(self, ctx: Ctx, c: Any, layers: DecoderLayers) -> tuple[Component, ...]:
        """Modules between the stack and the final norm (DeepSeek-V3's MTP layer); none here."""
        return ()

    def final_norm(self, ctx: Ctx, c: Any) -> Component:
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        return rmsnorm(ctx, "norm", "Final RMSNorm", weight=self.text_prefix + "norm.weight", ranges=(),
                       size="hidden_size", x=x, y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)",
                       eps=self.text(c).rms_norm_eps)

    def tied(self, c: Any) -> bool:
        """Whether the LM head is the token embedding (the key transformers ties the weights by)."""
        return bool(getattr(self.text(c), "tie_word_embeddings", False))

    def lm_head(self, ctx: Ctx, c: Any) -> Component:
        tied = self.text_prefix + "embed_tokens.weight" if self.tied(c) else ""
        return head(ctx, "lm_head", "LM head", weight="lm_head.weight", tied_to=tied,
                    citations=(self.head_citation(bool(tied)),))

    def head_citation(self, tied: bool) -> Citation:
        return self.ref.cite("lm_head is a bias-free Linear from hidden_size to vocab_size"
                             + (", tied to the token embedding when tie_word_embeddings is set." if tied else "."),
                             "ForCausalLM.__init__")

    def towers(self, ctx: Ctx, c: Any) -> tuple[Component, ...]:
        """The modules beside the text model (a vision tower); none here."""
        return ()

    def beside_words(self, c: Any) -> str:
        """What the root's description adds after the text model (the vision tower)."""
        return ""

    def model_description(self, c: Any, layers: DecoderLayers) -> str:
        head_words = "an LM head tied to the embedding" if self.tied(c) else "an untied LM head"
        return (f"Token embedding, {layers.count} transformer blocks, a final RMSNorm and {head_words}"
                f"{self.beside_words(c)}.")

    def root_code(self, c: Any) -> str:
        return f"{self.reference.model_class}(config)"

    def finish(self, ctx: Ctx, c: Any, root: Component) -> Component:
        """The tree as stored: modules a block-wise FP8 config names kept in the model's dtype."""
        return keep_named_modules_dense(root, self.quantization(c), ctx.dtype, self.reference_module,
                                        f"{self.name} config")

    def tiny_config(self, config: Any) -> dict[str, Any]:
        """A small config of the same structure for the executed checks (config.json keys)."""
        raise NotImplementedError

    def declared_mtp(self, config: Any, values: dict[str, int | float]) -> DeclaredMTP | None:
        """The multi-token-prediction layers the config declares and the reference does not build, one module built
        with this family's own builders, so that what the checkpoint stores counts them (None: there are none, or
        the tree describes them)."""
        return None

    def facts(self, config: Any) -> tuple[tuple[str, str], ...]:
        """(label, value) pairs for the index card."""
        return (("transformer blocks", f"{config.num_hidden_layers:,}"),
                ("attention heads", f"{config.num_attention_heads:,}"), ("vocabulary", f"{config.vocab_size:,}"))

    def values(self, config: Any) -> dict[str, int | float]:
        """Config symbol -> value for the formulas (override to add derived sizes such as head_dim)."""
        return {n: getattr(config, n) for n in self.symbols}

    def tiny_label_parts(self, tiny: ModelSpec) -> tuple[str, ...]:
        """How the tiny config exercises this family's own layer mechanisms (a scan's chunks, a compressor's
        rates), for the executed checks' label after the sizes every family shares (explorer/execute/executor.py)."""
        return ()

    def tiny_label_towers(self, tiny: ModelSpec) -> tuple[str, ...]:
        """The tiny config's modules beside the text blocks (a vision tower), for the same label after the blocks."""
        return ()

    def variant_module_name(self, name: str) -> str:
        """The name a quantizer's exclude or ignore list sees for the module `name` (the reference's module name):
        the same unless the checkpoint names it otherwise (explorer/checkpoint/variants.py)."""
        return name

    def reference_module(self, name: str) -> str:
        """The reference model's module path for a checkpoint module name (the executed checks call it): the same
        unless the checkpoint names its modules otherwise (GPT-2's file drops transformers' "transformer.")."""
        return name

    def default_source(self, key: str) -> str:
        """The reference config class whose default a defaulted key (dotted for nested tables) takes."""
        return self.reference.config_class

    defaulted_exempt: ClassVar[tuple[str, ...]] = ("architectures", "model_type", "transformers_version", "auto_map")
    """Keys never listed as taking a default: what the file says of itself and its loader, not of the model."""

    def defaulted_keys(self, raw: dict[str, Any]) -> tuple[str, ...]:
        """Every key of the family's config that the published config `raw` omits (published null is not omitted),
        so that it takes the reference config class's default: what --add-model records as
        checkpoint.config_defaulted. dtype and torch_dtype name one setting: neither is listed when one is given, and
        only dtype (the name transformers 5 writes) when neither is."""
        aliases = {"dtype": "torch_dtype", "torch_dtype": "dtype"}
        names = {f.name for f in dataclasses.fields(self.config_class)}
        return tuple(sorted(n for n in names
                            if n not in raw and n not in self.defaulted_exempt and aliases.get(n) not in raw
                            and not (n == "torch_dtype" and "dtype" in names)))

    def defaulted_value(self, config: Any, key: str) -> Any:
        """The value a defaulted key took, as the model page shows it: the config's own, unless the reference
        config class derives it when the key is absent (override: GLM-4-MoE's rope_parameters)."""
        return getattr(config, key)

    # ------------------------------------------------------------------------------------------ shared work

    def validate(self, raw: dict[str, Any], where: str) -> Any:
        """Parse a config table into the typed config; ContentError lists every problem with the valid range."""
        problems: list[str] = []
        problems += [f"{where}: {p}" for p in value_problems(raw)]
        table = aliased_dtype(self.config_class, raw, where, problems)  # dtype read as torch_dtype, or back
        table = with_class_defaults(self.config_class, table, self.default_source)  # omitted: the class's default
        config = parse_table(table, self.config_class, where, problems)
        if config is not None and not problems:
            problems += [f"{where}: {p}" for p in self.check(config)]
        if problems:
            raise ContentError(problems)
        return config

    def build_spec(self, slug: str, raw: dict[str, Any], where: str) -> ModelSpec:
        """Validate a config and build the model's spec."""
        config = self.validate(raw, where)
        values = self.values(config)
        defaulted = tuple(f.name for f in dataclasses.fields(self.config_class)
                          if f.name not in raw and f.name in self.symbols)
        try:  # a storage scheme refuses a number outside its definition, whichever family supplied it
            root = self.build(config, values)
            mtp = self.declared_mtp(config, values)
        except SchemeError as e:
            raise ContentError([f"{where}: {p}" for p in e.problems]) from None
        if (tensors := tensor_count(root)) > MAX_MODEL_TENSORS:  # before any torch work builds them
            raise ContentError([f"{where}: {_scale_keys(config)}: the config describes {tensors:,} tensors, "
                                f"over the {MAX_MODEL_TENSORS:,} a build can hold in memory (the largest model "
                                "here has under 100,000)"])
        return ModelSpec(slug=slug, family=self.name, root=root, values=values, config=config,
                         facts=self.facts(config), defaulted=defaulted, declared_mtp=mtp)


def tensor_count(root: Component) -> int:
    """The weight tensors a spec describes, each template counted over its index ranges (none is listed)."""
    return sum(math.prod(len(r.values) for r in t.ranges) for _, comp in walk(root) for t in comp.tensors)


def _scale_keys(config: Any) -> str:
    """The keys that multiply a model's tensors, as a message names them: its depth and, where it has experts,
    their count ("keys 'num_hidden_layers' and 'n_routed_experts'")."""
    names = [f.name for f in dataclasses.fields(config)]
    keys = ["num_hidden_layers" if "num_hidden_layers" in names else "n_layer"]
    keys += [n for n in ("n_routed_experts", "num_local_experts", "num_experts") if n in names][:1]
    return " and ".join(f"'{k}'" for k in keys).join(("keys " if len(keys) > 1 else "key ", ""))


def value_problems(raw: dict[str, Any], path: str = "") -> list[str]:
    """Non-finite numbers, and sizes or positive quantities out of range, at any depth of a config table."""
    out: list[str] = []
    for key, value in sorted(raw.items()):
        name = f"{path}{key}"
        if isinstance(value, dict):
            out += value_problems(value, name + ".")
        elif isinstance(value, float) and not math.isfinite(value):
            out.append(f"key '{name}': must be a finite number, got {value!r}")
        elif key in POSITIVE_FLOATS and isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            out.append(f"key '{name}': must be > 0, got {value!r}")
        elif key in LIMITS and isinstance(value, int) and not isinstance(value, bool):
            low = 0 if key in MAY_BE_ZERO else 1
            if not low <= value <= LIMITS[key]:
                out.append(f"key '{name}': must be an integer in {low}..{LIMITS[key]:,}, got {value!r}")
    return out


def tower_label(tiny: ModelSpec, width_key: str, tower_key: str = "vision_tower", blocks_key: str = "encoder") -> str:
    """A vision tower's part of the tiny label: its width and how many encoder blocks the tiny config keeps."""
    tower = tiny.root.child(tower_key)
    return f"vision tower d {tiny.values[width_key]} with {tower.child(blocks_key).repeat} blocks"


def stored_dtype(torch_dtype: str) -> str:
    return TORCH_DTYPES.get(torch_dtype, torch_dtype)


def fp8_storage(quantization_config: Any) -> Storage | None:
    """DeepSeek-style block-wise FP8 (quant_method "fp8", fmt e4m3/e5m2, weight_block_size) or None."""
    if quantization_config is None:
        return None
    dtype = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}.get(quantization_config.fmt, "F8_E4M3")
    return BlockFP8(dtype, tuple(quantization_config.weight_block_size),
                    scale_fmt=getattr(quantization_config, "scale_fmt", None) or "")


__all__ = ["DecoderLayers", "Family", "Hyperparameters", "ReferenceBinding", "DIM_LABELS", "LIMITS", "rule_problems", "stored_dtype"]


# ---------------------------------------------------------------------------------------------- rope_scaling

@dataclass(frozen=True, slots=True)
class RopeScaling:
    """config.json "rope_scaling", any variant; keys a variant does not publish stay None."""

    type: str | None = None
    rope_type: str | None = None
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    truncate: bool | None = None

    @property
    def kind(self) -> str:
        return self.rope_type or self.type or "default"


ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn")


def rope_scaling_problems(r: RopeScaling | None, key: str = "rope_scaling") -> list[str]:
    """The variant is known and has the keys it needs."""
    if r is None:
        return []
    if r.kind not in ROPE_KINDS:
        return [f"key '{key}.rope_type': must be one of {', '.join(ROPE_KINDS)}, got {r.kind!r}"]
    needs = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
             "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")}
    out = [f"key '{key}.{n}': missing (needed by {r.kind} scaling)" for n in needs.get(r.kind, ())
           if getattr(r, n) is None]
    if r.kind != "default" and r.factor is not None and r.factor < 1:
        out.append(f"key '{key}.factor': must be >= 1, got {r.factor}")
    return out


def rope_options(theta: float, dim: int, scaling: RopeScaling | None, pairing: Pairing,
                 max_position_embeddings: int) -> RopeOptions:
    """The library's rotary options for a config's rope_theta, rotary width and rope_scaling."""
    if scaling is None or scaling.kind == "default":
        return RopeOptions("default", theta, dim, pairing)
    original = scaling.original_max_position_embeddings or max_position_embeddings
    given = {n: getattr(scaling, n) for n in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "low_freq_factor",
                                              "high_freq_factor", "truncate") if getattr(scaling, n) is not None}
    return RopeOptions(scaling.kind, theta, dim, pairing, factor=scaling.factor or 1.0,  # type: ignore[arg-type]
                       original_max_position_embeddings=original, **given)


def reference_config(config: Any, skip: tuple[str, ...], skip_when_unset: tuple[str, ...] = ()) -> dict[str, Any]:
    """The config as the reference config class takes it: published keys, nested keys left unset dropped."""
    out = {}
    for f in dataclasses.fields(config):
        if f.name in skip or (f.name in skip_when_unset and getattr(config, f.name) is None):
            continue
        value = as_published(getattr(config, f.name))
        inner = tuple(s.partition(".")[2] for s in skip if s.startswith(f.name + "."))
        if inner and isinstance(value, dict):  # a dotted entry ("text_config.quantization_config") skips a nested key
            value = {k: x for k, x in value.items() if k not in inner}
        out[f.name] = value
    return out


def as_published(value: Any) -> Any:
    """A config value as config.json would hold it: nested tables (Gemma 3's text_config, its rope_scaling) as dicts
    without their unset keys, tuples as lists; for the reference config class and for families' tiny configs."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_published(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}
    return list(value) if isinstance(value, tuple) else value
