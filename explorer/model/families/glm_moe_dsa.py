"""The GLM-MoE-DSA family (GLM-5): DeepSeek-V3.2's architecture (explorer/model/families/deepseek_v32.py) at other sizes,
with two differences the reference makes: the indexer rotates adjacent feature pairs (interleaved, as the main
attention does) rather than the two halves, and the config publishes its rotary settings as rope_parameters.

From GLM-5.2 on, most layers keep no indexer and reuse the previous layer's selection (IndexShare: indexer_types
"shared", published as a list or derived from index_topk_freq and index_skip_topk_offset or index_topk_pattern;
explorer/model/components/index_share.py). Which layers are dense is read from mlp_layer_types where published
(GlmMoeDsaConfig derives it from first_k_dense_replace otherwise). The layers are grouped into block kinds by the pair
of their feed-forward and indexer kinds.

References: "GLM-5: from Vibe Coding to Agentic Engineering" (arXiv:2602.15763); transformers'
models/glm_moe_dsa/modeling_glm_moe_dsa.py (the reference binding).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.blocks import stack
from explorer.model.components.index_share import (
    index_share_stack,
    reuses_selection,
    shared_selection_attention,
    shared_selection_block,
)
from explorer.model.components.mla import MLAOptions
from explorer.model.components.norms import NormOptions
from explorer.model.components.rope import Pairing
from explorer.model.families.base import (
    ReferenceBinding,
    RopeScaling,
    rope_options,
    rope_scaling_problems,
    rule_problems,
)
from explorer.model.families.deepseek_v3 import LayerGroup
from explorer.model.families.deepseek_v32 import DeepseekV32, DeepseekV32Hyperparameters
from explorer.model.families.renames import split_fused_experts
from explorer.spec.types import Component, Port

REFERENCE = Reference("models/glm_moe_dsa/modeling_glm_moe_dsa.py", "GlmMoeDsa")


@dataclass(frozen=True, slots=True)
class RopeParameters(RopeScaling):
    """config.json "rope_parameters": the rotary base with the scaling variant and its keys."""

    rope_theta: float | None = None


@dataclass(frozen=True, slots=True)
class GlmMoeDsaHyperparameters(DeepseekV32Hyperparameters):
    """DeepSeek-V3.2's keys as GLM-5 publishes them; absent ones take GlmMoeDsaConfig's defaults."""

    rope_theta: float = 10000.0
    """Used only when rope_parameters is absent (GLM-5 publishes rope_parameters)."""
    rope_parameters: RopeParameters | None = None
    index_n_heads: int = 32
    head_dim: int = 64
    """Informational: the reference sets it to qk_rope_head_dim whatever is published."""
    qk_head_dim: int | None = None
    """Informational: qk_nope_head_dim + qk_rope_head_dim, checked when published."""
    rope_interleave: bool = True
    indexer_rope_interleave: bool = True
    dtype: str | None = None
    """The newer name of torch_dtype; where published it is the stored dtype."""
    eos_token_id: int | tuple[int, ...] | None = None  # type: ignore[assignment]  # GLM-5 publishes a list
    pad_token_id: int | None = None
    indexer_types: tuple[str, ...] | None = None
    """Per layer, "full" (runs its indexer) or "shared" (reuses the previous full layer's selection); None: from
    index_topk_pattern, else from index_topk_freq and index_skip_topk_offset."""
    index_topk_pattern: str | None = None
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 2
    mlp_layer_types: tuple[str, ...] | None = None
    """Per layer "dense" or "sparse" (MoE); None: the first first_k_dense_replace dense, the rest sparse."""
    layer_types: tuple[str, ...] | None = None
    """Per layer attention kind, published by NVIDIA's GLM-5.2 and 5.3 repacks in the old spelling
    "deepseek_sparse_attention" (the base config class reads it as "indexed_attention"); GlmMoeDsaConfig uses it only
    to choose cache classes and builds every layer with DeepSeek Sparse Attention, so only that kind is taken."""
    mlp_bias: bool = False
    """Defined by GlmMoeDsaConfig, read by no modeling code: its MLPs and experts have no bias whatever it says
    (tests/test_newer_config_keys.py varies it on the reference)."""
    num_experts: int | None = None
    """GlmMoeDsaConfig's old name for n_routed_experts: where published, the config class sets n_routed_experts to it
    (validate() does the same)."""


ATTENTION_KINDS = ("indexed_attention", "deepseek_sparse_attention")
"""layer_types entries the family builds: the kind transformers builds for every layer, in both spellings."""


def mlp_layer_types(c: GlmMoeDsaHyperparameters) -> tuple[str, ...]:
    """Each layer's feed-forward kind, as GlmMoeDsaConfig derives it when mlp_layer_types is not published."""
    if c.mlp_layer_types is not None:
        return c.mlp_layer_types
    dense = min(c.first_k_dense_replace, c.num_hidden_layers)
    return ("dense",) * dense + ("sparse",) * (c.num_hidden_layers - dense)


def indexer_types(c: GlmMoeDsaHyperparameters) -> tuple[str, ...]:
    """Which layers run their own indexer, as GlmMoeDsaConfig derives it when indexer_types is not published."""
    if c.indexer_types is not None:
        return c.indexer_types
    if c.index_topk_pattern is not None:
        return tuple({"F": "full", "S": "shared"}.get(ch, ch) for ch in c.index_topk_pattern)
    freq = max(c.index_topk_freq, 1)
    return tuple("full" if max(i - c.index_skip_topk_offset + 1, 0) % freq == 0 else "shared"
                 for i in range(c.num_hidden_layers))


class GlmMoeDsa(DeepseekV32):
    name = "glm_moe_dsa"
    model_types = ("glm_moe_dsa",)
    config_class = GlmMoeDsaHyperparameters
    reference = ReferenceBinding("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM", not_built=("mtp",),
                                 renames=split_fused_experts)
    ref: ClassVar[Reference] = REFERENCE
    indexer_pairing: ClassVar[Pairing] = "interleaved"
    cited_lines: ClassVar[dict[str, tuple[int, int]]] = {"Indexer.forward": (213, 242),
                                                          "Attention.forward": (405, 429)}

    def validate(self, raw: dict[str, Any], where: str) -> Any:
        """The typed config, with num_experts (where published) in n_routed_experts, as GlmMoeDsaConfig re-routes it."""
        if raw.get("num_experts") is not None:
            raw = {**raw, "n_routed_experts": raw["num_experts"]}
        return super().validate(raw, where)

    def check(self, c: Any) -> list[str]:
        kinds, ffn = indexer_types(c), mlp_layer_types(c)
        theta = c.rope_parameters.rope_theta if c.rope_parameters is not None else c.rope_theta
        return super().check(c) + rule_problems([
            (c.qk_head_dim is None or c.qk_head_dim == c.qk_nope_head_dim + c.qk_rope_head_dim, "qk_head_dim",
             f"must be qk_nope_head_dim + qk_rope_head_dim ({c.qk_nope_head_dim + c.qk_rope_head_dim}), got "
             f"{c.qk_head_dim}"),
            (c.rope_interleave and c.indexer_rope_interleave, "indexer_rope_interleave",
             "must be true: the reference rotates adjacent pairs in both the attention and the indexer"),
            (theta is not None and theta > 0, "rope_parameters.rope_theta", f"must be > 0, got {theta}"),
            (len(kinds) == c.num_hidden_layers and set(kinds) <= {"full", "shared"}, "indexer_types",
             f"must name 'full' or 'shared' for each of the {c.num_hidden_layers} layers (published, or from "
             f"index_topk_freq, index_skip_topk_offset or index_topk_pattern), got {list(kinds)[:8]}…"),
            (not kinds or kinds[0] == "full", "indexer_types",
             "the first layer must run its indexer: a shared layer reuses the previous layer's selection, and "
             "transformers raises where there is none"),
            (len(ffn) == c.num_hidden_layers and set(ffn) <= {"dense", "sparse"}, "mlp_layer_types",
             f"must name 'dense' or 'sparse' for each of the {c.num_hidden_layers} layers"),
            (c.layer_types is None or (len(c.layer_types) == c.num_hidden_layers
                                       and set(c.layer_types) <= set(ATTENTION_KINDS)), "layer_types",
             f"must name {' or '.join(map(repr, ATTENTION_KINDS))} for each of the {c.num_hidden_layers} layers: "
             "transformers builds DeepSeek Sparse Attention in every layer, and the family models no other kind"),
        ]) + rope_scaling_problems(c.rope_parameters, "rope_parameters")

    def rope_source(self, c: Any) -> tuple[float, RopeScaling | None]:
        if c.rope_parameters is None:
            return c.rope_theta, c.rope_scaling
        return c.rope_parameters.rope_theta, c.rope_parameters

    def defaulted_value(self, c: Any, key: str) -> Any:
        if key == "indexer_types" and c.indexer_types is None:
            return list(indexer_types(c))
        if key == "mlp_layer_types" and c.mlp_layer_types is None:
            return list(mlp_layer_types(c))
        if key == "layer_types" and c.layer_types is None:  # GlmMoeDsaConfig: every layer DSA
            return ["indexed_attention"] * c.num_hidden_layers
        return getattr(c, key)

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        return super().build(replace(c, torch_dtype=c.dtype or c.torch_dtype), values)

    def layer_groups(self, c: Any) -> tuple[LayerGroup, ...]:
        """One block kind per pair of feed-forward kind (mlp_layer_types) and indexer kind (indexer_types)."""
        ffn, kinds = mlp_layer_types(c), indexer_types(c)
        groups = []
        for moe_ffn, ffn_word in ((False, "dense"), (True, "sparse")):
            for kind in ("full", "shared"):
                layers = tuple(i for i in range(c.num_hidden_layers) if ffn[i] == ffn_word and kinds[i] == kind)
                if not layers:
                    continue
                shares = kind == "shared"
                key = ("moe" if moe_ffn else "dense") + ("_shared" if shares else "")
                title = ("MoE" if moe_ffn else "Dense") + " transformer block" + (
                    ", selection shared" if shares else "")
                formula = (f"layers whose mlp_layer_types is '{ffn_word}'" + (
                    f" and indexer_types '{kind}'" if "shared" in kinds else ""))
                groups.append(LayerGroup(key, title, layers, moe_ffn, formula))
        return tuple(groups)

    def stack(self, ctx: Ctx, blocks: tuple[Component, ...], **kw: Any) -> Component:
        built = stack(ctx, blocks, **kw)
        shares = any(reuses_selection(b) for b in blocks)
        return index_share_stack(built) if shares else built

    def block(self, ctx: Ctx, c: Any, key: str, title: str, indices: tuple[int, ...], moe_ffn: bool,
              label: str = "") -> Component:
        built = super().block(ctx, c, key, title, indices, moe_ffn, label)
        if not self._shares(c, indices):
            return built
        heading = r"\text{Sparse attention, shared selection:}"  # fits a phone's width (390 px)
        steps = tuple(replace(s, latex=heading) if s.heading and s.name == "attention" else s for s in built.steps)
        return shared_selection_block(replace(built, steps=steps))

    def attention(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port) -> Component:
        layers = next((r.values for r in ranges if r.var == "layer"), ())
        if not self._shares(c, layers):
            return super().attention(ctx, c, prefix, ranges, x)
        opts = MLAOptions(c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
                          c.qk_rope_head_dim, c.v_head_dim, NormOptions("rms", 1e-6))
        theta, scaling = self.rope_source(c)
        ro = rope_options(theta, c.qk_rope_head_dim, scaling, "interleaved", c.max_position_embeddings)
        return shared_selection_attention(
            ctx, prefix=prefix, ranges=ranges, x=x, o=opts, topk=c.index_topk, rope_options=ro, citations=(
                self.ref.cite("A layer whose indexer_types entry is \"shared\" builds no indexer and reuses the "
                              "top-k indices of the layer before it (prev_topk_indices).", "Attention.__init__"),
                self.ref.cite("The model hands each layer the top-k indices the previous layer returned.",
                              "Model.forward")),
            scores_citations=(
                self.ref.cite("The softmax scale is (qk_nope_head_dim + qk_rope_head_dim)^-0.5, multiplied by mscale "
                              "squared when YaRN's mscale_all_dim is set.", "Attention.__init__"),))

    @staticmethod
    def _shares(c: Any, layers: tuple[int, ...]) -> bool:
        """Whether these layers (all of one kind) reuse the previous selection; an MTP layer, past the last main
        layer, runs its own indexer (its stored tensors include one)."""
        kinds = indexer_types(c)
        return bool(layers) and all(i < len(kinds) and kinds[i] == "shared" for i in layers)

    def tiny_config(self, c: Any) -> dict[str, Any]:
        raw = super().tiny_config(c)
        raw.update(qk_head_dim=raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"], head_dim=raw["qk_rope_head_dim"],
                   pad_token_id=None, eos_token_id=1,  # token ids inside the tiny vocabulary
                   index_topk_pattern=None, mlp_layer_types=None, indexer_types=None, layer_types=None,
                   num_experts=None)  # n_routed_experts is the tiny one
        if "shared" in indexer_types(c):  # a shared layer between two that run their indexer: every kind present
            dense = raw["first_k_dense_replace"]
            raw.update(num_hidden_layers=3, indexer_types=["full", "shared", "full"],
                       mlp_layer_types=["dense"] * dense + ["sparse"] * (3 - dense))
        return raw


FAMILY = GlmMoeDsa()
