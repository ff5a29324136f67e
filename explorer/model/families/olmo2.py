"""The OLMo 2 family (OLMo 2 7B and 13B): Llama's decoder with two changes. Each block normalises the outputs of
its branches, not their inputs (post_norm_block.py: x' = x + RMSNorm(Attn(x)), no norm before attention or the MLP),
and QK-norm spans all heads: one RMSNorm over the whole query projection and one over the whole key projection,
before the split into heads (layer_attention.py's "across_heads", as MiniMax-M2 has it), not per head as Qwen3.

References: "2 OLMo 2 Furious" (arXiv:2501.00656); transformers' models/olmo2/modeling_olmo2.py (the reference
binding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import layer_label, layers
from explorer.model.components.layer_attention import (
    SHAPED_ATTENTION,
    LayerAttentionOptions,
    LayerShape,
    layer_attention,
)
from explorer.model.components.mlp import gated_mlp
from explorer.model.components.norms import NormOptions, rmsnorm
from explorer.model.components.post_norm_block import post_norm_block, post_norm_ports
from explorer.model.families.base import PublishedMetadata, ReferenceBinding, RopeScaling, rope_options, rule_problems
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.llama import Llama
from explorer.spec.types import Component


@dataclass(frozen=True, slots=True)
class Olmo2Hyperparameters(PublishedMetadata):
    """config.json keys of Olmo2Config, named as published; absent keys take Olmo2Config's defaults. No head_dim:
    Olmo2Attention takes hidden_size / num_attention_heads (a head_dim key left at None would reach it)."""

    vocab_size: int = 50304
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    """None: as many KV heads as query heads (OLMo 2 7B and 13B are multi-head)."""
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, read as the llama family reads it."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = 50279


class Olmo2(Llama):
    name = "olmo2"
    model_types = ("olmo2",)
    config_class: ClassVar[type] = Olmo2Hyperparameters
    reference = ReferenceBinding("Olmo2Config", "Olmo2ForCausalLM")
    ref = Reference("models/olmo2/modeling_olmo2.py", "Olmo2")

    def values(self, c: Any) -> dict[str, int | float]:
        return {**super().values(_with_derived_head_dim(c)),
                "head_dim": c.hidden_size // c.num_attention_heads}

    def check(self, c: Any) -> list[str]:
        return super().check(_with_derived_head_dim(c)) + rule_problems([
            (not c.attention_bias, "attention_bias", "must be false: biased projections are not in this family"),
        ])

    def block(self, ctx: Ctx, c: Any, indices: tuple[int, ...]) -> Component:
        """Attention with QK-norm across heads and a SwiGLU MLP, each normalised at its output (no pre-norms)."""
        ranges, p = layers(indices), "model.layers.{layer}."
        x, d_attn, d_attn_hat, x_mid, d_ffn, d_ffn_hat = post_norm_ports(ctx)
        eps, v = c.rms_norm_eps, self.values(c)
        H, Hkv, D = (ctx.sym(n) for n in ("num_attention_heads", "num_key_value_heads", "head_dim"))
        o = LayerAttentionOptions(LayerShape.of(ctx, H, Hkv, D), int(v["head_dim"]) ** -0.5,
                                  qk_norm="across_heads", norm=NormOptions("rms", eps), part=SHAPED_ATTENTION)
        attn = layer_attention(
            ctx, prefix=p + "self_attn.", ranges=ranges, x=x, o=o,
            rope_options=rope_options(c.rope_theta, int(v["head_dim"]), c.rope_scaling, "half",
                                      c.max_position_embeddings),
            citations=(self.ref.cite("Attention normalises the whole query and key projections with q_norm and k_norm "
                                     "(RMSNorms over all heads' features), splits them into heads, rotates them and "
                                     "attends.", "Attention"),))
        mlp = gated_mlp(ctx, "mlp", "SwiGLU MLP", "SwiGLU", prefix=p + "mlp.", ranges=ranges,
                        d_ff=ctx.sym("intermediate_size"), ff_dim=ctx.dim("intermediate_size"), x=x_mid, y=d_ffn,
                        description=f"A SwiGLU feed-forward network of width {c.intermediate_size:,}.",
                        code=f"{self.ref.prefix}MLP(config)",
                        citations=(self.ref.cite("The MLP is down(silu(gate x) ⊙ up x).", "MLP"),))

        def norm(key: str, title: str, module: str, xp, yp) -> Component:
            return rmsnorm(ctx, key, title, weight=p + module + ".weight", ranges=ranges, size="hidden_size", x=xp,
                           y=yp, code=f"self.{module}(hidden_states)", eps=eps)

        return post_norm_block(
            ctx, "block", "Transformer block", layer_indices=indices, kind="transformer", attn=attn,
            post_attn_norm=norm("post_attn_norm", "Post-attention RMSNorm", "post_attention_layernorm", d_attn,
                                d_attn_hat),
            ffn=mlp,
            post_ffn_norm=norm("post_ffn_norm", "Post-MLP RMSNorm", "post_feedforward_layernorm", d_ffn, d_ffn_hat),
            citations=(self.ref.cite("A block runs attention on the residual stream as it is, normalises its output "
                                     "(post_attention_layernorm) and adds it; then the MLP the same way "
                                     "(post_feedforward_layernorm).", "DecoderLayer"),),
            description=f"{attn.title} with QK-norm across heads and a SwiGLU MLP, each normalised at its output "
                        f"and added to the residual stream; {layer_label(indices)}.")

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Llama's tiny config without the keys Olmo2Config does not take (head_dim: derived, 64 / 4 = 16)."""
        raw = super().tiny_config(c)
        raw.pop("head_dim")
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return super().facts(_with_derived_head_dim(c)) + (
            ("norms", "after attention and after the MLP, inside each branch"),
            ("QK-norm", "across all heads, before the split into heads"))


@dataclass(frozen=True, slots=True)
class _Derived:
    """An OLMo 2 config as Llama's checks and sizes read it: head_dim None (derived from hidden_size)."""

    c: Any
    head_dim: None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.c, name)


def _with_derived_head_dim(c: Any) -> Any:
    return _Derived(c)


FAMILY = Olmo2()
