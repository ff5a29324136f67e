"""The Nemotron-H family (Nemotron 3 Nano, Super and Ultra, Nemotron-H): a hybrid stack whose layers are, by the
letters of hybrid_override_pattern, Mamba-2 mixers (M), grouped-query attention without positional encoding (*),
mixtures of squared-ReLU experts under a sigmoid router with a correction bias (E), or squared-ReLU MLPs (-). Every
layer is one pre-norm residual branch; only the attention layers keep a cache that grows with the context. Where
moe_latent_size is set (Super, Ultra), the routed experts run in that latent width (latent_moe.py). The MTP modules
a config declares are not built by transformers: they are counted from the config (`declared_mtp`) with this family's
own layer builders, apart from the main model, and never run.

References: "Nemotron-H: A Family of Accurate and Efficient Hybrid Mamba-Transformer Models" (arXiv:2504.03624);
"Nemotron 3 Nano: Open, Efficient Mixture-of-Experts Hybrid Mamba-Transformer Model for Agentic Reasoning"
(arXiv:2512.20848);
Mamba-2 (arXiv:2405.21060); transformers' models/nemotron_h/ (the reference binding).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.attention import KEYS, QUERIES, ScoresOptions
from explorer.model.components.base import layers
from explorer.model.components.blocks import model_root, stack
from explorer.model.components.embedding import embedding, head
from explorer.model.components.hybrid_block import mixer_block, mixer_ports
from explorer.model.components.latent_moe import LATENT, latent_ports, latent_projections, latent_relu2_moe
from explorer.model.components.layer_pattern import (
    NEMOTRON_H_LETTERS,
    NEMOTRON_H_TYPES,
    LayerPattern,
    pattern_problems,
    read_pattern,
    runs,
)
from explorer.model.components.mamba2 import Mamba2Options, mamba2
from explorer.model.components.moe import RouterOptions, router
from explorer.model.components.nope_attention import nope_attention
from explorer.model.components.norms import rmsnorm
from explorer.model.components.relu2_experts import relu2_experts, relu2_mlp, relu2_moe
from explorer.model.families.base import (
    DIM_LABELS,
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
    keep_named_modules_dense,
    names_module,
)
from explorer.model.families.declared_mtp import declared_mtp, mtp_norm, mtp_projection
from explorer.spec.results import FREE_SIZES
from explorer.spec.types import Component, DeclaredMTP, Dim, ModelSpec, Port, Shape

REFERENCE = Reference("models/nemotron_h/modeling_nemotron_h.py", "NemotronH")
LABELS = {**DIM_LABELS, "moe_shared_expert_intermediate_size": "d_shared", "mamba_num_heads": "ssm_heads",
          "mamba_head_dim": "d_ssm_head", "n_groups": "groups", "ssm_state_size": "d_state", "conv_kernel": "kernel",
          LATENT: "d_latent"}
KIND_TITLES = {"mamba": ("Mamba-2 layer", "Mamba-2", "Mamba-2 mixer"),
               "attention": ("Attention layer", "attention", "Attention (no RoPE)"),
               "moe": ("MoE layer", "MoE", "Mixture of experts"), "mlp": ("MLP layer", "MLP", "Squared-ReLU MLP")}
"""Layer kind -> (block title, noun for counts, heading of the mixer's steps)."""
MASK = Port("M", Shape((QUERIES, KEYS)), "mask")


@dataclass(frozen=True, slots=True)
class NemotronHHyperparameters(PublishedMetadata):
    """config.json keys of NemotronHConfig, named as published; absent keys take NemotronHConfig's defaults."""

    vocab_size: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    mamba_num_heads: int
    mamba_head_dim: int
    ssm_state_size: int
    hybrid_override_pattern: str | None = None
    """One letter per layer (M Mamba-2, * attention, E MoE, - MLP), as the published configs spell the layers."""
    layers_block_type: tuple[str, ...] | None = None
    """The same as a list of names (linear_attention, full_attention, moe, mlp), as transformers 5 saves a config;
    read in preference to the pattern, as NemotronHConfig does."""
    num_hidden_layers: int | None = None
    """Published beside the pattern; the reference derives the depth from the pattern and ignores it."""
    mtp_layers_block_type: tuple[str, ...] | None = None
    """The layer kinds of each multi-token-prediction module (NemotronHConfig's default: attention, then MoE); read
    only to validate them: transformers builds no MTP module."""
    mtp_hybrid_override_pattern: str | None = None
    """The same as letters (Nemotron 3 Super's config), which NemotronHConfig converts to mtp_layers_block_type."""
    n_groups: int = 8
    conv_kernel: int = 4
    chunk_size: int = 128
    expand: int = 2
    """Published, not read by the reference: the mixer's width is mamba_num_heads × mamba_head_dim."""
    intermediate_size: int = 21504
    """Width of the squared-ReLU MLP of "-" layers."""
    moe_intermediate_size: int = 7688
    moe_shared_expert_intermediate_size: int = 7688
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    """Published; the reference builds one shared expert of width moe_shared_expert_intermediate_size."""
    num_experts_per_tok: int = 2
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    moe_latent_size: int | None = None
    """Set: the routed experts run in this latent width, between a projection into it and one out of it
    (fc1_latent_proj, fc2_latent_proj); None: at hidden_size, with no projections."""
    mlp_hidden_act: str = "relu2"
    mamba_hidden_act: str = "silu"
    use_conv_bias: bool = True
    use_bias: bool = False
    """Bias of the Mamba-2 in_proj and out_proj (the reference reads use_bias, not mamba_proj_bias)."""
    mamba_proj_bias: bool = False
    mlp_bias: bool = False
    attention_bias: bool = False
    layer_norm_epsilon: float = 1e-5
    time_step_min: float = 0.001
    time_step_max: float = 0.1
    time_step_floor: float = 1e-4
    mamba_ssm_cache_dtype: str = "float32"
    max_position_embeddings: int = 4096
    num_nextn_predict_layers: int = 0
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8: every nn.Linear transformers' FP8 quantizer converts (the Mamba-2 in and out projections,
    attention, the MLPs and shared experts) in FP8 with a scale per block; modules_to_not_convert must name the
    routed experts (see experts_kept_problems)."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    hidden_dropout: float = 0.0
    norm_eps: float = 1e-5
    num_logits_to_keep: int = 1
    partial_rotary_factor: float = 1.0
    rope_theta: float = 10000.0
    """Published, not read: the attention layers carry no rotary embedding."""
    sliding_window: int | None = None
    rescale_prenorm_residual: bool = True
    residual_in_fp32: bool = False
    use_mamba_kernels: bool = True
    moe_shared_expert_overlap: bool = True
    output_router_logits: bool = False
    time_step_limit: tuple[float, ...] = (0.0, math.inf)
    """Published by transformers 5's NemotronHConfig; its mixer clamps Δ at (time_step_min, ∞) instead."""
    auto_map: dict[str, str] | None = None


def to_checkpoint_names(state: dict[str, Any]) -> dict[str, Any]:
    """The reference's state dict under the checkpoint's names, undoing transformers' conversion mapping for
    nemotron_h (conversion_mapping.py): WeightRenaming("backbone.", "model.") back to backbone.*, and the routed
    experts that MergeModulelist stacked into mixer.experts.up_proj [E, I, d] and down_proj [E, d, I] named as the
    checkpoint's per-expert weights (mixer.experts.{e}.up_proj.weight), still stacked on the leading axis here:
    mixer.experts.up_proj.weight. lm_head.weight keeps its name (it is outside the backbone)."""
    out = {}
    for name, tensor in state.items():
        if name.endswith((".experts.up_proj", ".experts.down_proj")):
            name += ".weight"
        out[CHECKPOINT_PREFIX + name.removeprefix(REFERENCE_PREFIX) if name.startswith(REFERENCE_PREFIX)
            else name] = tensor
    return out


REFERENCE_PREFIX, CHECKPOINT_PREFIX = "model.", "backbone."
"""transformers names the stack model.*, the published checkpoints (and their quantizers' module lists) backbone.*."""


def pattern_key(c: NemotronHHyperparameters) -> str:
    """The config key that spells the layers: layers_block_type where given (NemotronHConfig prefers it)."""
    return "layers_block_type" if c.layers_block_type is not None else "hybrid_override_pattern"


LEGACY_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}
"""Layer kinds older configs (Nemotron 3 Ultra's) spell the old way, as the base config class renames them on
reading (configuration_utils.remap_legacy_layer_types)."""


def block_types(c: NemotronHHyperparameters) -> tuple[str, ...]:
    """layers_block_type in the names NemotronHConfig keeps after reading it."""
    return tuple(LEGACY_TYPES.get(t, t) for t in c.layers_block_type or ())


def pattern_of(c: NemotronHHyperparameters) -> LayerPattern:
    if c.layers_block_type is not None:
        return read_pattern(block_types(c), NEMOTRON_H_TYPES)
    return read_pattern(c.hybrid_override_pattern or "", NEMOTRON_H_LETTERS)


def experts_kept_problems(c: NemotronHHyperparameters) -> list[str]:
    """transformers' FP8 quantizer swaps every `.experts` module for FP8Experts, whose constructor reads
    hidden_act, which NemotronHConfig does not define (it has mlp_hidden_act): an FP8 checkpoint of this family loads
    only with its routed experts left unconverted, so modules_to_not_convert must name them."""
    q, moe = c.quantization_config, pattern_of(c).indices("moe") if c.quantization_config is not None else ()
    if q is None or not moe:
        return []
    experts = f"model.layers.{moe[0]}.mixer.experts"
    if any(names_module(p, experts) for p in q.modules_to_not_convert or ()):
        return []
    return [f"key 'quantization_config.modules_to_not_convert': must name the routed experts ({experts}): "
            "transformers' FP8 quantizer cannot build NemotronH's FP8 experts (FP8Experts reads hidden_act, which "
            "NemotronHConfig does not define)"]


DEFAULT_MTP_TYPES = ("full_attention", "moe")
"""NemotronHConfig's mtp_layers_block_type where the config gives neither it nor mtp_hybrid_override_pattern."""


def mtp_layer_kinds(c: NemotronHHyperparameters) -> tuple[str, ...]:
    """The layer kinds of one MTP module ("attention", "moe"), spelled as NemotronHConfig reads them."""
    if c.mtp_layers_block_type is not None:
        return tuple(NEMOTRON_H_TYPES.get(LEGACY_TYPES.get(t, t), t) for t in c.mtp_layers_block_type)
    if c.mtp_hybrid_override_pattern is not None:
        return tuple(NEMOTRON_H_LETTERS.get(letter, letter) for letter in c.mtp_hybrid_override_pattern)
    return tuple(NEMOTRON_H_TYPES[t] for t in DEFAULT_MTP_TYPES)


def mtp_kinds(c: NemotronHHyperparameters) -> tuple[str, ...]:
    """The same as nouns ("attention", "MoE")."""
    return tuple(KIND_TITLES[k][1] if k in KIND_TITLES else k for k in mtp_layer_kinds(c))


MTP_KINDS = frozenset(NEMOTRON_H_TYPES) | frozenset(LEGACY_TYPES)
"""The layer kinds an MTP module may list (NemotronHConfig.validate_layer_type, old spellings included)."""


def mtp_kind_problems(c: NemotronHHyperparameters) -> list[str]:
    """NemotronHConfig refuses MTP layer kinds it does not know when num_nextn_predict_layers > 0."""
    if not c.num_nextn_predict_layers:
        return []
    if c.mtp_layers_block_type is not None:
        bad = sorted(set(c.mtp_layers_block_type) - MTP_KINDS)
        return [f"key 'mtp_layers_block_type': {bad[0]!r} is not one of {', '.join(sorted(NEMOTRON_H_TYPES))}"
                ] if bad else []
    if c.mtp_hybrid_override_pattern is not None:
        bad = sorted(set(c.mtp_hybrid_override_pattern) - set(NEMOTRON_H_LETTERS))
        return [f"key 'mtp_hybrid_override_pattern': symbol {bad[0]!r} is not one of "
                f"{', '.join(repr(k) for k in NEMOTRON_H_LETTERS)}"] if bad else []
    return []


class NemotronH(Family):
    name = "nemotron_h"
    model_types = ("nemotron_h",)
    config_class: ClassVar[type] = NemotronHHyperparameters
    # transformers' conversion mapping for nemotron_h renames the checkpoint's backbone.* to model.* and stacks
    # mixer.experts.{e}.up_proj/down_proj into 3-D tensors; the spec names tensors as the checkpoint does
    # (backbone.*, one tensor per expert), and to_checkpoint_names maps the reference's state dict to them.
    # mtp_hybrid_override_pattern is not handed over: NemotronHConfig converts it whenever the key is given, so an
    # unset one would fail there, and it only spells the MTP module's kinds, which transformers never builds
    # (check() validates them; tests/test_nemotron_h.py shows the tree does not change with it).
    reference = ReferenceBinding("NemotronHConfig", "NemotronHForCausalLM", renames=to_checkpoint_names,
                                 config_skip=("quantization_config", "auto_map", "architectures",
                                              "mtp_hybrid_override_pattern"))
    symbols = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
               "moe_shared_expert_intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "n_routed_experts", "num_experts_per_tok", "mamba_num_heads", "mamba_head_dim", "n_groups",
               "ssm_state_size", "conv_kernel")

    def check(self, c: NemotronHHyperparameters) -> list[str]:
        if c.layers_block_type is not None:
            problems = pattern_problems(block_types(c), NEMOTRON_H_TYPES, "layers_block_type",
                                        c.num_hidden_layers)
        elif c.hybrid_override_pattern is not None:
            problems = pattern_problems(c.hybrid_override_pattern, NEMOTRON_H_LETTERS, "hybrid_override_pattern",
                                        c.num_hidden_layers)
        else:
            problems = ["key 'hybrid_override_pattern': missing: the config must spell its layers "
                        "(hybrid_override_pattern or layers_block_type)"]
        return problems + rule_problems([
            (c.num_attention_heads % c.num_key_value_heads == 0, "num_key_value_heads",
             f"must divide num_attention_heads ({c.num_attention_heads}), got {c.num_key_value_heads}"),
            (c.mamba_num_heads % c.n_groups == 0, "n_groups",
             f"must divide mamba_num_heads ({c.mamba_num_heads}), got {c.n_groups}"),
            (c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
             f"must be <= n_routed_experts ({c.n_routed_experts}), got {c.num_experts_per_tok}"),
            (c.n_routed_experts % c.n_group == 0, "n_group",
             f"must divide n_routed_experts ({c.n_routed_experts}), got {c.n_group}"),
            (c.topk_group <= c.n_group, "topk_group", f"must be in 1..n_group ({c.n_group}), got {c.topk_group}"),
            (c.n_group == 1 or c.n_routed_experts // c.n_group >= 2, "n_group",
             "groups must hold at least 2 experts (scored by their top 2)"),
            (c.chunk_size >= 1, "chunk_size", f"must be >= 1, got {c.chunk_size}"),
            (c.conv_kernel >= 1, "conv_kernel", f"must be >= 1, got {c.conv_kernel}"),
            (c.mlp_hidden_act == "relu2", "mlp_hidden_act", f"must be 'relu2' (squared ReLU), got {c.mlp_hidden_act!r}"),
            (c.mamba_hidden_act == "silu", "mamba_hidden_act", f"must be 'silu', got {c.mamba_hidden_act!r}"),
            (not c.mlp_bias, "mlp_bias", "must be false: biased squared-ReLU projections are not in the library yet"),
            (not c.attention_bias, "attention_bias", "must be false: the reference's attention has no biases"),
            (not c.tie_word_embeddings, "tie_word_embeddings",
             "must be false: NemotronHForCausalLM never ties lm_head to the embedding"),
            (c.num_nextn_predict_layers >= 0, "num_nextn_predict_layers",
             f"must be >= 0, got {c.num_nextn_predict_layers}"),
        ]) + mtp_kind_problems(c) + fp8_problems(c.quantization_config) + experts_kept_problems(c)

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: NemotronHHyperparameters, values: dict[str, int | float]) -> Component:
        ctx = Ctx(values, LABELS, REFERENCE, stored_dtype(c.torch_dtype), fp8_block_storage(c.quantization_config),
                  citations={"rmsnorm": (
            REFERENCE.cite("RMSNorm divides by the root mean square over the last dimension (plus eps) and "
                           "multiplies by a learned weight, in float32.", "RMSNorm"),)})
        pattern = pattern_of(c)
        L = len(pattern)
        blocks = tuple(self.block(ctx, c, kind, pattern.indices(kind)) for kind in pattern.present())
        counts = ", ".join(f"{pattern.count(k)} {KIND_TITLES[k][1]}" for k in pattern.present())
        model_cite = REFERENCE.cite("The model embeds token ids, runs the layers in pattern order and applies a final "
                                    "RMSNorm (norm_f).", "Model.__init__")
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        x_in = blocks[0].inputs[0]  # the stack takes the mask whether or not its first layer attends
        layer_stack = stack(ctx, blocks, layers=L, citations=(model_cite,),
                            description=f"{L} layers in the order {pattern_key(c)} spells "
                                        f"({pattern.spelled}): {counts}.")
        children = (
            embedding(ctx, "embed", "Token embedding", weight="backbone.embeddings.weight", citations=(model_cite,)),
            replace(layer_stack, title="Hybrid layers", crumb=f"{L} hybrid layers", inputs=(x_in, MASK),
                    code="nn.ModuleList(NemotronHBlock(config, layer_idx=i) for i in range(num_hidden_layers))"),
            rmsnorm(ctx, "norm", "Final RMSNorm", weight="backbone.norm_f.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm_f(hidden_states)", eps=c.layer_norm_epsilon),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", citations=(
                REFERENCE.cite("lm_head is a separate bias-free Linear from hidden_size to vocab_size.",
                               "ForCausalLM.__init__"),)),
        )
        root = model_root(ctx, children, code="NemotronHForCausalLM(config)", layers=L, citations=(model_cite,),
                          description=f"Token embedding, {L} hybrid layers ({counts}), a final RMSNorm and an "
                                      "untied LM head.")
        root = keep_named_modules_dense(root, c.quantization_config, stored_dtype(c.torch_dtype),
                                        self.reference_module, f"{self.name} config")
        return root

    def declared_mtp(self, c: NemotronHHyperparameters, values: dict[str, int | float]) -> DeclaredMTP | None:
        """num_nextn_predict_layers modules, each the layers mtp_layer_kinds lists (this family's own blocks) between
        enorm, hnorm and eh_proj before them and a final RMSNorm after."""
        if not c.num_nextn_predict_layers:
            return None
        ctx = Ctx(values, LABELS, REFERENCE, stored_dtype(c.torch_dtype), fp8_block_storage(c.quantization_config))
        L, eps, kinds = len(pattern_of(c)), c.layer_norm_epsilon, mtp_layer_kinds(c)
        at: dict[str, list[int]] = {}
        for i, kind in enumerate(kinds):
            at.setdefault(kind, []).append(L + i)
        blocks = tuple(self.block(ctx, c, kind, tuple(ix)) for kind, ix in at.items())
        parts = (mtp_norm(ctx, "enorm", "Embedding RMSNorm", "mtp.layers.0.enorm.weight", eps),
                 mtp_norm(ctx, "hnorm", "Hidden-state RMSNorm", "mtp.layers.0.hnorm.weight", eps),
                 mtp_projection(ctx, "eh_proj", "Combining projection", "mtp.layers.0.eh_proj.weight", 2),
                 *blocks,
                 mtp_norm(ctx, "final_norm", "MTP final RMSNorm", f"mtp.layers.{len(kinds) - 1}.final_layernorm.weight",
                          eps))
        n = c.num_nextn_predict_layers
        return declared_mtp("num_nextn_predict_layers", n, parts, (
            f"The config declares {n} multi-token-prediction module{'s' if n > 1 else ''} (num_nextn_predict_layers) "
            f"of the layers its MTP pattern lists ({', '.join(mtp_kinds(c))}). "
            "transformers builds none (NemotronHPreTrainedModel ignores the checkpoint's mtp.* tensors on load) and "
            "its source gives no layout, so one is assumed: that of vLLM's NemotronH MTP draft model (not recorded "
            "here), each listed layer one of this family's own pre-norm layers, the first preceded by an RMSNorm "
            "each for the next token's embedding and the hidden state (enorm, hnorm) and a bias-free eh_proj of the "
            "two concatenated back to hidden_size, the last followed by a final RMSNorm, the embedding and LM head "
            "shared with the main model. No tensor listing of the checkpoint is recorded, so the layout is not "
            "checked against the release."))

    def block(self, ctx: Ctx, c: NemotronHHyperparameters, kind: str, indices: tuple[int, ...]) -> Component:
        """One layer kind: RMSNorm, then that kind's mixer, added to the residual stream; over `indices`."""
        ranges, p = layers(indices), "backbone.layers.{layer}."
        x, x_mix, delta = mixer_ports(ctx)
        norm = rmsnorm(ctx, "norm", "RMSNorm", weight=p + "norm.weight", ranges=ranges, size="hidden_size", x=x,
                       y=x_mix, code="self.norm(hidden_states)", eps=c.layer_norm_epsilon)
        mixer = {"mamba": self.mamba, "attention": self.attention, "moe": self.moe, "mlp": self.mlp}[kind](
            ctx, c, p + "mixer.", ranges, x_mix, delta)
        title, noun, heading = KIND_TITLES[kind]
        return mixer_block(ctx, kind, title, layer_indices=indices, norm=norm, mixer=mixer, kind=noun,
                           heading=heading, description=f"{mixer.title} after an RMSNorm, added to the residual "
                                                        f"stream; layers {runs(indices)}.",
                           citations=(REFERENCE.cite("A layer normalises its input, runs the mixer its layer type "
                                                     "names, and adds the result to the residual.", "Block"),))

    def mamba(self, ctx: Ctx, c: NemotronHHyperparameters, prefix: str, ranges, x: Port, y: Port) -> Component:
        o = Mamba2Options(c.mamba_num_heads, c.mamba_head_dim, c.n_groups, c.ssm_state_size, c.conv_kernel,
                          c.chunk_size, c.layer_norm_epsilon, c.time_step_min, c.use_conv_bias, c.use_bias,
                          state_dtype=c.mamba_ssm_cache_dtype, conv_dtype=c.torch_dtype)
        return mamba2(ctx, prefix=prefix, ranges=ranges, x=x, y=y, o=o, code="NemotronHMamba2Mixer(config, layer_idx)",
                      citations=(
                          REFERENCE.cite("The mixer splits in_proj's output into the gate, the convolved x/B/C stream "
                                         "and the time steps, convolves, scans, applies the gated RMSNorm and "
                                         "out_proj.", "Mamba2Mixer"),
                          REFERENCE.cite("Over a sequence the scan runs chunkwise: an intra-chunk product masked by "
                                         "the cumulative decays, and the states carried between chunks.",
                                         "mamba2_chunk_scan", prefixed=False),
                          REFERENCE.cite("One token at a time the state is decayed by exp(Δ·A), written with Δ·x·Bᵀ "
                                         "and read with C, plus D·x.", "mamba2_selective_state_update",
                                         prefixed=False),
                          REFERENCE.cite("The gated norm multiplies by SiLU(gate) and normalises each group of "
                                         "intermediate_size / n_groups channels.", "RMSNormGated")))

    def attention(self, ctx: Ctx, c: NemotronHHyperparameters, prefix: str, ranges, x: Port, y: Port) -> Component:
        so = ScoresOptions(c.num_attention_heads, c.num_key_value_heads, c.head_dim ** -0.5)
        return nope_attention(ctx, prefix=prefix, ranges=ranges, x=x, y=y, so=so, citations=(
            REFERENCE.cite("Attention projects q, k and v, attends causally with KV groups and projects back; it "
                           "applies no rotary embedding.", "Attention"),
            REFERENCE.cite("repeat_kv shares each key/value head with num_key_value_groups query heads.", "repeat_kv",
                           prefixed=False)))

    def values(self, c: NemotronHHyperparameters) -> dict[str, int | float]:
        """The sizes, and the experts' latent width where the config sets one."""
        values = super().values(c)
        return values if c.moe_latent_size is None else {**values, LATENT: c.moe_latent_size}

    def moe(self, ctx: Ctx, c: NemotronHHyperparameters, prefix: str, ranges, x: Port, y: Port) -> Component:
        ro = RouterOptions(c.n_routed_experts, c.num_experts_per_tok, "sigmoid", c.norm_topk_prob,
                           c.routed_scaling_factor, correction_bias=True, n_group=c.n_group, topk_group=c.topk_group)
        # the correction bias is a persistent buffer (nn.Buffer), not a parameter: stored, but not counted
        gate = router(ctx, weight=prefix + "gate.weight", ranges=ranges, x=x, o=ro, code="NemotronHTopkRouter(config)",
                      bias_role="buffer", citations=(REFERENCE.cite("The router scores experts with a sigmoid, adds "
                                                "e_score_correction_bias for selection only, takes the top k, "
                                                "normalises and scales by routed_scaling_factor.", "TopkRouter"),))
        latent = c.moe_latent_size is not None
        x_lat, y_lat = latent_ports(ctx) if latent else (x, x)
        experts = relu2_experts(ctx, prefix=prefix + "experts.", ranges=ranges, x=x_lat, experts=c.n_routed_experts,
                                k=c.num_experts_per_tok, width="moe_intermediate_size", experts_sym="n_routed_experts",
                                code="NemotronHExperts(config)", model_width=LATENT if latent else "hidden_size",
                                citations=(
                                    REFERENCE.cite("Each expert is down_proj(relu2(up_proj x)) with no gate; "
                                                   "transformers stacks the experts into 3-D tensors"
                                                   + (" of input width moe_latent_size." if latent else "."),
                                                   "Experts"),))
        width = ctx.size("moe_shared_expert_intermediate_size")
        shared = relu2_mlp(ctx, "shared", "Shared expert", "Shared expert", prefix=prefix + "shared_experts.",
                           ranges=ranges, width=ctx.sym("moe_shared_expert_intermediate_size"),
                           width_dim=Dim("d_shared", width), x=x,
                           y=Port(r"y^{\mathrm{shared}}", x.shape, "shared_out"), sub=r"\mathrm{sh}",
                           description=f"A squared-ReLU MLP of width {width:,} that every token runs.",
                           code="NemotronHMLP(config, intermediate_size=moe_shared_expert_intermediate_size)",
                           citations=(REFERENCE.cite("The shared expert is one squared-ReLU MLP of width "
                                                     "moe_shared_expert_intermediate_size.", "MoE.__init__"),))
        if not latent:
            return relu2_moe(ctx, x=x, y=y, router_c=gate, expert=experts, shared=shared, code="NemotronHMoE(config)",
                             citations=(REFERENCE.cite("The MoE layer sums the routed experts' outputs weighted by "
                                                       "the router and adds the shared expert's.", "MoE.forward"),))
        into, out = latent_projections(ctx, prefix=prefix, ranges=ranges, x=x, x_lat=x_lat, y_lat=y_lat,
                                       bias=c.mlp_bias)
        return latent_relu2_moe(ctx, x=x, y=y, router_c=gate, into=into, expert=experts, out=out, shared=shared,
                                code="NemotronHMoE(config)", citations=(
                                    REFERENCE.cite("With moe_latent_size set, the MoE layer routes on the token, "
                                                   "projects it with fc1_latent_proj, runs the experts, projects "
                                                   "their weighted sum back with fc2_latent_proj and adds the shared "
                                                   "expert's output (computed from the token at full width).",
                                                   "MoE.forward"),))

    def mlp(self, ctx: Ctx, c: NemotronHHyperparameters, prefix: str, ranges, x: Port, y: Port) -> Component:
        return relu2_mlp(ctx, "mlp", "Squared-ReLU MLP", "MLP", prefix=prefix, ranges=ranges,
                         width=ctx.sym("intermediate_size"), width_dim=ctx.dim("intermediate_size"), x=x, y=y,
                         description=f"A squared-ReLU MLP of width {c.intermediate_size:,}.",
                         code="NemotronHMLP(config)", citations=(REFERENCE.cite(
                             "The MLP is down_proj(relu2(up_proj x)).", "MLP"),))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def reference_module(self, name: str) -> str:
        """The checkpoint's backbone.layers.4.mixer is transformers' model.layers.4.mixer."""
        return (REFERENCE_PREFIX + name.removeprefix(CHECKPOINT_PREFIX) if name.startswith(CHECKPOINT_PREFIX)
                else name)

    def tiny_config(self, c: NemotronHHyperparameters) -> dict[str, Any]:
        """Small sizes, same structure: every layer kind of the pattern once, in order of first appearance, then its
        first kind again; chunks of 2 positions so the scan crosses several chunk boundaries; KV groups and
        B/C groups kept; top-k below the experts."""
        letters = {kind: letter for letter, kind in NEMOTRON_H_LETTERS.items()}
        present = "".join(letters[k] for k in pattern_of(c).present())
        pattern = present + present[0]
        grouped = c.n_group > 1
        n_group, topk_group = (4, 2) if grouped else (1, 1)
        k = min(c.num_experts_per_tok, 3)
        per_group = max(2, -(-k // topk_group) + 1) if grouped else k + 3
        raw = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        raw.update(vocab_size=97, hidden_size=64, num_hidden_layers=len(pattern), hybrid_override_pattern=pattern,
                   layers_block_type=None,
                   num_attention_heads=4, num_key_value_heads=2 if c.num_key_value_heads < c.num_attention_heads
                   else 4, head_dim=16, mamba_num_heads=4, mamba_head_dim=8,
                   n_groups=2 if c.n_groups > 1 else 1, ssm_state_size=8, conv_kernel=min(c.conv_kernel, 4),
                   chunk_size=2, intermediate_size=96, moe_intermediate_size=32,
                   moe_shared_expert_intermediate_size=48, n_routed_experts=n_group * per_group,
                   num_experts_per_tok=k, n_group=n_group, topk_group=topk_group, max_position_embeddings=64,
                   bos_token_id=0, eos_token_id=1, pad_token_id=None, quantization_config=None,
                   moe_latent_size=None if c.moe_latent_size is None else 48)
        return raw

    def tiny_label_parts(self, tiny: ModelSpec) -> tuple[str, ...]:
        """The Mamba-2 scan: how many chunks the checked sequence crosses."""
        v, chunk = tiny.values, getattr(tiny.config, "chunk_size", FREE_SIZES["T"])
        return (f"Mamba-2 {v['mamba_num_heads']} heads × {v['mamba_head_dim']} × state {v['ssm_state_size']}, "
                f"chunks of {chunk} (T = {FREE_SIZES['T']}: {-(-FREE_SIZES['T'] // chunk)} chunks)",)

    def facts(self, c: NemotronHHyperparameters) -> tuple[tuple[str, str], ...]:
        pattern = pattern_of(c)
        latent = () if c.moe_latent_size is None else (("experts' latent width", f"{c.moe_latent_size:,} "
                                                         f"(of {c.hidden_size:,})"),)
        return (("layers", f"{len(pattern)}: " + ", ".join(f"{pattern.count(k)} {KIND_TITLES[k][1]}"
                                                            for k in pattern.present())),
                ("routed experts", f"{c.n_routed_experts} (top {c.num_experts_per_tok}) + 1 shared"), *latent,
                ("SSM state per Mamba layer", f"{c.mamba_num_heads} × {c.mamba_head_dim} × {c.ssm_state_size}"),
                ("vocabulary", f"{c.vocab_size:,}"))


FAMILY = NemotronH()
