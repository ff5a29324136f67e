"""The Llama 4 family, text model (Llama 4 Scout, Maverick-style configs): grouped-query attention whose RoPE layers
attend within fixed chunks (attention_chunk_size) and normalise q and k to unit RMS after the rotation, while every
no_rope_layer_interval-th layer is global with no positional encoding (NoPE) and a query temperature that grows with
the position; a mixture of experts in every interleave_moe_layer_step-th layer with a top-1 sigmoid router, experts
that read the gated token, and a shared expert beside them; dense SwiGLU MLPs of width intermediate_size_mlp in the
other layers. The published config.json wraps the text model in text_config and holds no vision_config, so the vision
tower is not described here.

References: "The Llama 4 herd: The beginning of a new era of natively multimodal AI innovation" (Meta AI, April
2025); transformers' models/llama4/modeling_llama4.py and configuration_llama4.py (the reference binding:
Llama4TextConfig, Llama4ForCausalLM).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, model_root, stack
from explorer.model.components.embedding import embedding, head
from explorer.model.components.layer_attention import LayerAttentionOptions, LayerShape, layer_attention
from explorer.model.components.layer_blocks import layer_block
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.nope import Temperature
from explorer.model.components.norms import rmsnorm
from explorer.model.components.sigmoid_moe import (
    InputGatedExpertsOptions,
    SigmoidTopKOptions,
    input_gated_experts,
    sigmoid_moe,
    sigmoid_router,
)
from explorer.model.families.base import (
    DIM_LABELS,
    Family,
    ReferenceBinding,
    RopeScaling,
    rope_options,
    rope_scaling_problems,
    rule_problems,
    stored_dtype,
)
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_block_storage,
    fp8_problems,
    keep_named_modules_dense,
)
from explorer.spec.types import Citation, Component, Hyperparameters

REFERENCE = Reference("models/llama4/modeling_llama4.py", "Llama4Text")
CHUNKED, GLOBAL = "chunked_attention", "full_attention"
LABELS = {**DIM_LABELS, "intermediate_size_mlp": "d_ff"}


@dataclass(frozen=True, slots=True)
class Llama4TextHyperparameters(Hyperparameters):
    """Llama4TextConfig's keys, named as published; absent keys take Llama4TextConfig's defaults (transformers 5.23)."""

    vocab_size: int = 202_048
    hidden_size: int = 5120
    intermediate_size: int = 8192
    """Width of each routed expert and of the shared expert."""
    intermediate_size_mlp: int = 16_384
    """Width of the dense MLP in layers without experts."""
    num_hidden_layers: int = 48
    num_attention_heads: int = 40
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 131_072
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500_000.0
    rope_scaling: RopeScaling | None = None
    num_experts_per_tok: int = 1
    num_local_experts: int = 16
    moe_layers: tuple[int, ...] | None = None
    interleave_moe_layer_step: int = 1
    use_qk_norm: bool = True
    no_rope_layers: tuple[int, ...] | None = None
    """Per layer, 1 where it rotates and 0 where it is NoPE (None: every no_rope_layer_interval-th layer is NoPE)."""
    no_rope_layer_interval: int = 4
    attention_chunk_size: int | None = 8192
    layer_types: tuple[str, ...] | None = None
    attn_temperature_tuning: bool = True
    floor_scale: int = 8192
    attn_scale: float = 0.1
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    # Informational keys: recorded as published, not used by the spec.
    model_type: str = "llama4_text"
    attention_dropout: float = 0.0
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    router_jitter_noise: float = 0.0
    use_cache: bool = True
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: Any = 2


@dataclass(frozen=True, slots=True)
class Llama4Hyperparameters(Hyperparameters):
    """The published config.json: the text model's keys under text_config (no vision_config in this file)."""

    text_config: Llama4TextHyperparameters
    architectures: tuple[str, ...] = ()
    model_type: str = "llama4"
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8: every nn.Linear transformers' FP8 quantizer converts, and the routed experts, in FP8 with a
    scale per block; the router (a Linear subclass) stays in the model's dtype."""
    transformers_version: str = ""


def rope_layers(t: Llama4TextHyperparameters) -> tuple[bool, ...]:
    """Per layer, whether it rotates: as published, or NoPE every no_rope_layer_interval-th layer."""
    if t.no_rope_layers:
        return tuple(bool(r) for r in t.no_rope_layers)
    return tuple((i + 1) % t.no_rope_layer_interval != 0 for i in range(t.num_hidden_layers))


def moe_layers(t: Llama4TextHyperparameters) -> tuple[int, ...]:
    if t.moe_layers is not None:
        return tuple(t.moe_layers)
    step = t.interleave_moe_layer_step
    return tuple(range(step - 1, t.num_hidden_layers, step))


def layer_kinds(t: Llama4TextHyperparameters) -> tuple[tuple[bool, bool], ...]:
    """Per layer: (rotates, has experts)."""
    moe = set(moe_layers(t))
    return tuple((r, i in moe) for i, r in enumerate(rope_layers(t)))


class Llama4(Family):
    name = "llama4"
    model_types = ("llama4",)
    config_class: ClassVar[type] = Llama4Hyperparameters
    reference = ReferenceBinding("Llama4TextConfig", "Llama4ForCausalLM", config_key="text_config")
    symbols: ClassVar[tuple[str, ...]] = ("vocab_size", "hidden_size", "intermediate_size", "intermediate_size_mlp",
                                         "num_attention_heads", "num_key_value_heads", "head_dim",
                                         "num_local_experts", "num_experts_per_tok")

    def values(self, c: Any) -> dict[str, int | float]:
        return {n: getattr(c.text_config, n) for n in self.symbols}

    def default_source(self, key: str) -> str:
        return "Llama4TextConfig" if key.startswith("text_config") else "Llama4Config"

    def check(self, c: Any) -> list[str]:
        t, w = c.text_config, "text_config."
        types = t.layer_types
        return rule_problems([
            (t.num_attention_heads % t.num_key_value_heads == 0, w + "num_key_value_heads",
             f"must divide num_attention_heads ({t.num_attention_heads}), got {t.num_key_value_heads}"),
            (t.head_dim % 2 == 0, w + "head_dim", f"must be even (rotary pairs), got {t.head_dim}"),
            (t.num_experts_per_tok <= t.num_local_experts, w + "num_experts_per_tok",
             f"must be <= num_local_experts ({t.num_local_experts}), got {t.num_experts_per_tok}"),
            (t.hidden_act == "silu", w + "hidden_act", f"must be 'silu' (SwiGLU), got {t.hidden_act!r}"),
            (not t.attention_bias, w + "attention_bias", "must be false: the library's layer attention has no biases"),
            (not t.tie_word_embeddings, w + "tie_word_embeddings", "must be false: Llama 4 stores lm_head separately"),
            (t.no_rope_layers is None or len(t.no_rope_layers) == t.num_hidden_layers, w + "no_rope_layers",
             f"must list num_hidden_layers ({t.num_hidden_layers}) entries"),
            (t.no_rope_layer_interval >= 1, w + "no_rope_layer_interval", "must be >= 1"),
            (t.interleave_moe_layer_step >= 1, w + "interleave_moe_layer_step", "must be >= 1"),
            (all(0 <= i < t.num_hidden_layers for i in moe_layers(t)), w + "moe_layers",
             f"must be layer indices below {t.num_hidden_layers}"),
            (types is None or tuple(types) == tuple(CHUNKED if r else GLOBAL for r in rope_layers(t)),
             w + "layer_types", "must name RoPE layers chunked_attention and NoPE layers full_attention"),
            (t.attention_chunk_size is None or t.attention_chunk_size >= 1, w + "attention_chunk_size", "must be >= 1"),
            (t.floor_scale >= 1, w + "floor_scale", "must be >= 1"),
        ]) + rope_scaling_problems(t.rope_scaling, w + "rope_scaling") + fp8_problems(c.quantization_config)

    def defaulted(self, raw: dict[str, Any]) -> tuple[str, ...]:
        text = raw.get("text_config", {})
        keys = [f.name for f in dataclasses.fields(Llama4TextHyperparameters)]
        return tuple(f"text_config.{k}" for k in keys[:keys.index("torch_dtype")] if k not in text)

    def build_spec(self, slug: str, raw: dict[str, Any], where: str):
        spec = super().build_spec(slug, raw, where)
        return dataclasses.replace(spec, defaulted=self.defaulted(raw))

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        t = c.text_config
        dtype = stored_dtype(c.torch_dtype or t.torch_dtype)
        ctx = Ctx(values, LABELS, REFERENCE, dtype, fp8_block_storage(c.quantization_config))
        L, kinds = t.num_hidden_layers, layer_kinds(t)
        blocks = tuple(self.block(ctx, t, kind, tuple(i for i in range(L) if kinds[i] == kind))
                       for kind in sorted(set(kinds), key=kinds.index))
        cite = (REFERENCE.cite("The text model embeds token ids, runs the decoder layers (each with the chunked or the "
                               "global mask its layer type names) and a final RMSNorm.", "Model.forward"),)
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        n_nope = sum(1 for r, _ in kinds if not r)
        children = (
            embedding(ctx, "embed", "Token embedding", weight="model.embed_tokens.weight", citations=cite),
            stack(ctx, blocks, layers=L, citations=(Citation(
                "no_rope_layers marks the NoPE layers (every no_rope_layer_interval-th by default); layer_types names "
                "the others chunked_attention.", "transformers", "Llama4TextConfig.__post_init__",
                "models/llama4/configuration_llama4.py"),),
                  description=f"{L} decoder layers: {L - n_nope} with RoPE and chunked attention, {n_nope} global "
                              f"NoPE layers; {len(moe_layers(t))} with a mixture of experts."),
            rmsnorm(ctx, "norm", "Final RMSNorm", weight="model.norm.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=t.rms_norm_eps),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", citations=(
                Reference("models/llama4/modeling_llama4.py", "Llama4").cite(
                    "lm_head is a separate bias-free Linear from hidden_size to vocab_size.", "ForCausalLM.__init__"),)),
        )
        root = model_root(ctx, children, code="Llama4ForCausalLM(text_config)", layers=L, citations=cite,
                          description=f"The text model of a Llama 4 checkpoint: token embedding, {L} transformer "
                                      "blocks, a final RMSNorm and an untied LM head. The published config holds no "
                                      "vision_config, so the vision tower is not described here.")
        return keep_named_modules_dense(root, c.quantization_config, dtype, self.reference_module, f"{self.name} config")

    def block(self, ctx: Ctx, t: Llama4TextHyperparameters, kind: tuple[bool, bool],
              indices: tuple[int, ...]) -> Component:
        uses_rope, has_moe = kind
        ranges, p = layers(indices), "model.layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps = t.rms_norm_eps
        chunk = t.attention_chunk_size if uses_rope else None
        o = LayerAttentionOptions(
            LayerShape.of(ctx, *(ctx.sym(n) for n in ("num_attention_heads", "num_key_value_heads", "head_dim"))),
            t.head_dim ** -0.5, rope=uses_rope,
            qk_norm="l2" if t.use_qk_norm and uses_rope else "none", eps=eps, chunk=chunk,
            temperature=Temperature(t.attn_scale, t.floor_scale) if t.attn_temperature_tuning and not uses_rope
            else None)
        ro = rope_options(t.rope_theta, t.head_dim, t.rope_scaling, "interleaved", t.max_position_embeddings)
        attn = layer_attention(ctx, prefix=p + "self_attn.", ranges=ranges, x=x_attn, o=o, rope_options=ro,
                               code="Llama4TextAttention(config, layer_idx)", citations=(
                                   REFERENCE.cite("Attention rotates q and k on RoPE layers (complex products of "
                                                  "adjacent pairs), then applies the weightless L2 norm; on NoPE layers "
                                                  "it skips both and scales the queries by the temperature.",
                                                  "Attention.forward"),
                                   REFERENCE.cite("Llama4TextL2Norm scales to unit RMS with no weight.", "L2Norm")))
        ffn = self.moe(ctx, t, p + "feed_forward.", ranges, x_ffn, delta.latex) if has_moe else gated_mlp(
            ctx, "mlp", "SwiGLU MLP", "SwiGLU", prefix=p + "feed_forward.", ranges=ranges,
            d_ff=ctx.sym("intermediate_size_mlp"), ff_dim=ctx.dim("intermediate_size_mlp"), x=x_ffn, y=delta,
            description=f"A dense SwiGLU MLP of width {t.intermediate_size_mlp:,}.", code="Llama4TextMLP(config)",
            citations=(REFERENCE.cite("Layers without experts run a SwiGLU MLP of width intermediate_size_mlp.",
                                      "MLP"),))
        key = ("chunked" if uses_rope else "nope") + ("" if has_moe else "_dense")
        what = (f"chunked attention ({chunk:,}-position chunks) with RoPE and L2 QK-norm" if uses_rope
                else "global NoPE attention")
        title = ("Chunked RoPE block" if uses_rope else "Global NoPE block") + ("" if has_moe else " (dense MLP)")
        return layer_block(
            ctx, key, title, ranges=ranges, layer_indices=indices, kind="chunked" if uses_rope else "NoPE",
            attn_norm=rmsnorm(ctx, "attn_norm", "Attention RMSNorm", weight=p + "input_layernorm.weight",
                              ranges=ranges, size="hidden_size", x=x, y=x_attn,
                              code="self.input_layernorm(hidden_states)", eps=eps),
            attn=attn, attn_heading=attn.title,
            ffn_norm=rmsnorm(ctx, "ffn_norm", "FFN RMSNorm", weight=p + "post_attention_layernorm.weight",
                             ranges=ranges, size="hidden_size", x=x_mid, y=x_ffn,
                             code="self.post_attention_layernorm(hidden_states)", eps=eps),
            ffn=ffn, citations=(REFERENCE.cite("A block adds attention and the feed-forward part (experts where "
                                               "moe_layers lists the layer), each after an RMSNorm, to the residual "
                                               "stream.", "DecoderLayer"),),
            description=f"{what.capitalize()} and {'a mixture of experts with a shared expert' if has_moe else 'a dense SwiGLU MLP'}"
                        f", each added to the residual stream; {layer_label(indices)}.")

    def moe(self, ctx: Ctx, t: Llama4TextHyperparameters, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        E, k = t.num_local_experts, t.num_experts_per_tok
        gate = sigmoid_router(ctx, weight=prefix + "router.weight", ranges=ranges, x=x, o=SigmoidTopKOptions(E, k),
                              experts_sym="num_local_experts", code="Llama4Router(config)", citations=(
                                  Reference("models/llama4/modeling_llama4.py", "Llama4").cite(
                                      "The router keeps the top-k logits, sets the others to -inf and takes the "
                                      "sigmoid: kept experts get σ(logit), the others 0.", "Router"),))
        experts = input_gated_experts(ctx, prefix=prefix + "experts.", ranges=ranges, x=x, gates=gate.outputs[0],
                                      o=InputGatedExpertsOptions(E), experts_sym="num_local_experts",
                                      width="intermediate_size", code="Llama4TextExperts(config)", citations=(
                                          REFERENCE.cite("The experts hold gate_up_proj [E, d, 2·I] and down_proj "
                                                         "[E, I, d] and multiply with torch.bmm; gate and up are the "
                                                         "two halves.", "Experts"),))
        shared = gated_mlp(ctx, "shared", "Shared expert", "Shared expert", prefix=prefix + "shared_expert.",
                           ranges=ranges, d_ff=ctx.sym("intermediate_size"), ff_dim=ctx.dim("intermediate_size"), x=x,
                           y=Port(r"y^{\mathrm{shared}}", x.shape, "shared_out"), sub=r"\mathrm{sh}",
                           description=f"A SwiGLU MLP of width {t.intermediate_size:,} that every token runs.",
                           code="Llama4TextMLP(config)", citations=(REFERENCE.cite(
                               "The shared expert is a SwiGLU MLP of width intermediate_size added to the routed "
                               "output.", "Moe.forward"),))
        return sigmoid_moe(x=x, y_latex=y_latex, router_c=gate, experts_c=experts, shared=shared,
                           code="Llama4TextMoe(config)", citations=(REFERENCE.cite(
                               "The MoE repeats every token once per expert, scales each copy by that expert's router "
                               "score, runs the experts and sums them with the shared expert's output.", "Moe.forward"),))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: 4 query heads over 2 KV heads; a chunked RoPE layer and a NoPE layer (and dense
        ones where the model has them); chunks of 3 < T = 5; floor_scale 2 so the NoPE temperature exceeds 1 within T;
        top-1 of 4 experts."""
        t = c.text_config
        kinds = layer_kinds(t)
        dense = any(not m for _, m in kinds)
        n = 4 if dense else 2
        scaling = None
        if t.rope_scaling is not None:
            scaling = {k: v for k, v in dataclasses.asdict(t.rope_scaling).items() if v is not None}
            if "original_max_position_embeddings" in scaling:
                scaling["original_max_position_embeddings"] = 64
        text = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
        text.update(vocab_size=97, hidden_size=64, intermediate_size=32, intermediate_size_mlp=48, num_hidden_layers=n,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                    num_local_experts=4, num_experts_per_tok=min(t.num_experts_per_tok, 2), rope_scaling=scaling,
                    no_rope_layers=[1, 0] * (n // 2), layer_types=None, attention_chunk_size=3, floor_scale=2,
                    moe_layers=[1, 2, 3] if dense else None, interleave_moe_layer_step=1, bos_token_id=0,
                    eos_token_id=1, pad_token_id=None, torch_dtype="float32")
        return {"text_config": {k: v for k, v in text.items() if v is not None}, "architectures": list(c.architectures),
                "model_type": c.model_type, "torch_dtype": "float32"}

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        t = c.text_config
        kinds = layer_kinds(t)
        nope = sum(1 for r, _ in kinds if not r)
        return (("transformer blocks", f"{t.num_hidden_layers:,} ({t.num_hidden_layers - nope} chunked RoPE, "
                                       f"{nope} global NoPE)"),
                ("routed experts", f"{t.num_local_experts} (top {t.num_experts_per_tok}, sigmoid) + 1 shared"),
                ("attention heads", f"{t.num_attention_heads} query, {t.num_key_value_heads} key/value"),
                ("vocabulary", f"{t.vocab_size:,}"))


FAMILY = Llama4()
