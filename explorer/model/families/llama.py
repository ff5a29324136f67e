"""The Llama family (Llama 3.1, SmolLM2): grouped-query attention, SwiGLU MLP, RMSNorm, RoPE (llama3 scaling
where configured), an LM head that may be tied to the token embedding. Qwen3 (qwen3.py) extends it with QK-norm.

References: "The Llama 3 Herd of Models" (arXiv:2407.21783); transformers' models/llama/modeling_llama.py (the
reference binding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.attention import ScoresOptions, attention
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.norms import rmsnorm
from explorer.model.components.rope import Pairing
from explorer.model.families.base import (
    DecoderLayers,
    Family,
    PublishedMetadata,
    ReferenceBinding,
    RopeScaling,
    rope_options,
    rope_scaling_problems,
    rule_problems,
)
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_problems,
)
from explorer.spec.types import Component


@dataclass(frozen=True, slots=True)
class LlamaHyperparameters(PublishedMetadata):
    """config.json keys of LlamaConfig, named as published; absent keys take LlamaConfig's defaults."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    """None: as many KV heads as query heads (multi-head attention)."""
    head_dim: int | None = None
    """None: hidden_size / num_attention_heads."""
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8 (quant_method "fp8" with weight_block_size, as transformers' FP8 quantizer reads it): every
    projection in FP8 with a scale per block, except the modules modules_to_not_convert names."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pretraining_tp: int = 1


class Llama(Family):
    name = "llama"
    model_types = ("llama",)
    config_class: ClassVar[type] = LlamaHyperparameters
    reference = ReferenceBinding("LlamaConfig", "LlamaForCausalLM")
    ref = Reference("models/llama/modeling_llama.py", "Llama")
    symbols: ClassVar[tuple[str, ...]] = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim")
    qk_norm: ClassVar[bool] = False
    rope_pairing: ClassVar[Pairing] = "half"
    """Which features rotate together: the two halves of a head ("half"), or adjacent pairs ("interleaved", as
    ERNIE 4.5 rotates them)."""
    width_in_heads: ClassVar[bool] = True
    """LlamaConfig refuses a width that is no multiple of the head count even where head_dim is given (its
    validate_architecture); Qwen3Config has no such rule."""

    def values(self, c: Any) -> dict[str, int | float]:
        return self.text_values(self.text(c))

    def text_values(self, t: Any) -> dict[str, int | float]:
        """The text model's symbol values (block() reads them from the text config it is given)."""
        return {"vocab_size": t.vocab_size, "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
                "num_attention_heads": t.num_attention_heads,
                "num_key_value_heads": t.num_key_value_heads or t.num_attention_heads,
                "head_dim": t.head_dim or t.hidden_size // t.num_attention_heads}

    def check(self, c: Any) -> list[str]:
        t, key = self.text(c), self.text_key
        kv = t.num_key_value_heads or t.num_attention_heads
        head_dim = t.head_dim or t.hidden_size // t.num_attention_heads
        return rule_problems([
            (t.num_attention_heads % kv == 0, key + "num_key_value_heads",
             f"must divide num_attention_heads ({t.num_attention_heads}), got {kv}"),
            ((t.head_dim is not None and not self.width_in_heads) or t.hidden_size % t.num_attention_heads == 0,
             key + "num_attention_heads", f"must divide hidden_size ({t.hidden_size})"
             + (f" ({self.reference.config_class} refuses it otherwise)" if self.width_in_heads
                else " when head_dim is not given")),
            (head_dim % 2 == 0, key + "head_dim", f"must be even (rotary pairs), got {head_dim}"),
            (t.hidden_act == "silu", key + "hidden_act", f"must be 'silu' (SwiGLU), got {t.hidden_act!r}"),
            (not getattr(t, "mlp_bias", False), key + "mlp_bias",
             "must be false: biased SwiGLU projections are not in the library yet"),
        ]) + rope_scaling_problems(t.rope_scaling, key + "rope_scaling") + fp8_problems(c.quantization_config)

    # ------------------------------------------------------------------------------------------------ build

    def decoder_layers(self, ctx: Ctx, c: Any) -> DecoderLayers:
        """One block kind here (a family whose layers differ, as SmolLM3's NoPE layers do, overrides it)."""
        L = self.text(c).num_hidden_layers
        return DecoderLayers((self.block(ctx, self.text(c), tuple(range(L))),), L, f"{L} identical decoder layers.")

    def block(self, ctx: Ctx, c: Any, indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), self.text_prefix + "layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps, v = c.rms_norm_eps, self.text_values(c)
        heads, kv = int(v["num_attention_heads"]), int(v["num_key_value_heads"])
        attn = attention(ctx, prefix=p + "self_attn.", ranges=ranges, x=x_attn,
                         rope_options=rope_options(c.rope_theta, int(v["head_dim"]), c.rope_scaling, self.rope_pairing,
                                                   c.max_position_embeddings),
                         scores_options=ScoresOptions(heads, kv, int(v["head_dim"]) ** -0.5),
                         bias=c.attention_bias, o_bias=c.attention_bias, qk_norm_eps=eps if self.qk_norm else None,
                         rope_reference=self.text_prefix + "rotary_emb",
                         citations=(self.ref.cite("Attention projects queries, keys and values, applies RoPE, repeats "
                                                  "each key/value head over its group and attends.", "Attention"),
                                    self.ref.cite("repeat_kv shares each key/value head with num_key_value_groups "
                                                  "query heads.", "repeat_kv", prefixed=False)))
        mlp = self.ffn(ctx, c, p + "mlp.", ranges, x_ffn, delta)
        return decoder_block(
            ctx, "block", "Transformer block", layer_indices=indices, kind="transformer",
            attn_norm=rmsnorm(ctx, "attn_norm", "Attention RMSNorm", weight=p + "input_layernorm.weight", ranges=ranges,
                              size="hidden_size", x=x, y=x_attn, code="self.input_layernorm(hidden_states)", eps=eps),
            attn=attn,
            ffn_norm=rmsnorm(ctx, "ffn_norm", "MLP RMSNorm", weight=p + "post_attention_layernorm.weight",
                             ranges=ranges, size="hidden_size", x=x_mid, y=x_ffn,
                             code="self.post_attention_layernorm(hidden_states)", eps=eps),
            ffn=mlp, citations=(self.ref.cite("A block adds attention and the MLP, each after an RMSNorm, to the "
                                              "residual stream.", "DecoderLayer"),),
            description=f"{attn.title} and a SwiGLU MLP, each added to the residual stream; {layer_label(indices)}.")

    def ffn(self, ctx: Ctx, c: Any, prefix: str, ranges: tuple, x: Port, y: Port) -> Component:
        """The block's feed-forward network: a SwiGLU MLP of width intermediate_size (ERNIE 4.5's MoE layers run a
        mixture of experts here)."""
        return gated_mlp(ctx, "mlp", "SwiGLU MLP", "SwiGLU", prefix=prefix, ranges=ranges,
                         d_ff=ctx.sym("intermediate_size"), ff_dim=ctx.dim("intermediate_size"), x=x, y=y,
                         description=f"A SwiGLU feed-forward network of width {c.intermediate_size:,}.",
                         code=f"{self.ref.prefix}MLP(config)",
                         citations=(self.ref.cite("The MLP is down(silu(gate x) ⊙ up x).", "MLP"),))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: several KV groups (4 query heads over 2 KV heads), the same rope variant."""
        raw = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        scaling = None
        if c.rope_scaling is not None:
            scaling = {k: v for k, v in dataclasses.asdict(c.rope_scaling).items() if v is not None}
            if "original_max_position_embeddings" in scaling:
                scaling["original_max_position_embeddings"] = 64
        raw.update(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2 if (c.num_key_value_heads or c.num_attention_heads) < c.num_attention_heads
                   else 4, head_dim=16, max_position_embeddings=256, rope_scaling=scaling, bos_token_id=0,
                   eos_token_id=1, pad_token_id=None, quantization_config=None)
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        t, v = self.text(c), self.values(c)
        return (("transformer blocks", f"{t.num_hidden_layers:,}"),
                ("attention heads", f"{t.num_attention_heads} query, {v['num_key_value_heads']} key/value"),
                ("vocabulary", f"{t.vocab_size:,}"))


FAMILY = Llama()
