"""The Phi-3 family (Phi-4, Phi-4-mini): Llama's pre-norm decoder with its projections stored fused, one qkv_proj
for the queries, keys and values (fused_qkv_attention.py) and one gate_up_proj for the SwiGLU's gate and up halves
(fused_mlp.py); rotary embedding that may be partial (partial_rotary_factor: Phi-4-mini rotates the first 96 of each
head's 128 features); an LM head that may be tied to the embedding (Phi-4-mini's is).

A sliding_window at least max_position_embeddings long masks nothing any sequence the model takes can reach, so it
is accepted and shown as full attention; a shorter one is refused (sliding layers are not modelled here).

References: "Phi-3 Technical Report" (arXiv:2404.14219); "Phi-4 Technical Report" (arXiv:2412.08905); "Phi-4-Mini
Technical Report" (arXiv:2503.01743); transformers' models/phi3/modeling_phi3.py (the reference binding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.base import layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block
from explorer.model.components.fused_mlp import fused_gated_mlp
from explorer.model.components.fused_qkv_attention import fused_qkv_attention
from explorer.model.components.layer_attention import SHAPED_ATTENTION, LayerAttentionOptions, LayerShape
from explorer.model.components.norms import rmsnorm
from explorer.model.components.rope import RopeOptions
from explorer.model.families.base import PublishedMetadata, ReferenceBinding, rule_problems
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.llama import Llama
from explorer.spec.types import Component


@dataclass(frozen=True, slots=True)
class Phi3Hyperparameters(PublishedMetadata):
    """config.json keys of Phi3Config, named as published; absent keys take Phi3Config's defaults. No head_dim (the
    reference derives it, and a key left at None would reach it), no rope_scaling (LongRoPE is not in this family)."""

    vocab_size: int = 32064
    hidden_size: int = 3072
    intermediate_size: int = 8192
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    """The share of each head's features that rotate: int(head_dim × partial_rotary_factor), the leading ones."""
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, read as the llama family reads it."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    bos_token_id: int | None = 1
    eos_token_id: int | tuple[int, ...] | None = 32000
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0


def rotary_width(c: Any) -> int:
    """Rotary features per head as Phi3RotaryEmbedding computes them: int(head_dim × partial_rotary_factor)."""
    return int(c.hidden_size // c.num_attention_heads * c.partial_rotary_factor)


class Phi3(Llama):
    name = "phi3"
    model_types = ("phi3",)
    config_class: ClassVar[type] = Phi3Hyperparameters
    reference = ReferenceBinding("Phi3Config", "Phi3ForCausalLM")
    ref = Reference("models/phi3/modeling_phi3.py", "Phi3")

    def values(self, c: Any) -> dict[str, int | float]:
        return {**super().values(_Derived(c)), "head_dim": c.hidden_size // c.num_attention_heads}

    def check(self, c: Any) -> list[str]:
        head_dim = c.hidden_size // c.num_attention_heads
        return super().check(_Derived(c)) + rule_problems([
            (0 < c.partial_rotary_factor <= 1, "partial_rotary_factor", f"must be in (0, 1], got {c.partial_rotary_factor}"),
            (rotary_width(c) >= 2 and rotary_width(c) % 2 == 0, "partial_rotary_factor",
             f"must give an even rotary width of at least 2 (head_dim {head_dim} × {c.partial_rotary_factor} = "
             f"{rotary_width(c)})"),
            (c.sliding_window is None or c.sliding_window >= c.max_position_embeddings, "sliding_window",
             f"must be null or at least max_position_embeddings ({c.max_position_embeddings:,}): sliding layers are "
             f"not in this family, got {c.sliding_window}"),
        ])

    def block(self, ctx: Ctx, c: Any, indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), "model.layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps, v = c.rms_norm_eps, self.values(c)
        D, rot = int(v["head_dim"]), rotary_width(c)
        H, Hkv, Dsym = (ctx.sym(n) for n in ("num_attention_heads", "num_key_value_heads", "head_dim"))
        o = LayerAttentionOptions(LayerShape.of(ctx, H, Hkv, Dsym), D ** -0.5, part=SHAPED_ATTENTION)
        attn = fused_qkv_attention(
            ctx, prefix=p + "self_attn.", ranges=ranges, x=x_attn, o=o,
            rope_options=RopeOptions("default", c.rope_theta, rot, "half", unrotated_tail=D - rot),
            citations=(self.ref.cite("Attention projects with one qkv_proj, slices it into queries (heads × head_dim), "
                                     "keys and values (kv_heads × head_dim each), rotates and attends.", "Attention"),
                       self.ref.cite("apply_rotary_pos_emb rotates the first cos.shape[-1] features of each head and "
                                     "passes the rest through.", "apply_rotary_pos_emb", prefixed=False),
                       self.ref.cite("The rotary module's frequencies cover int(head_dim × partial_rotary_factor) "
                                     "features.", "RotaryEmbedding.__init__")))
        mlp = fused_gated_mlp(ctx, "mlp", "SwiGLU MLP", "SwiGLU", prefix=p + "mlp.", ranges=ranges,
                              d_ff=ctx.sym("intermediate_size"), ff_dim=ctx.dim("intermediate_size"), x=x_ffn, y=delta,
                              description=f"A SwiGLU feed-forward network of width {c.intermediate_size:,}, its gate "
                                          "and up projections one fused matrix.", code=f"{self.ref.prefix}MLP(config)",
                              citations=(self.ref.cite("The MLP chunks gate_up_proj's output into the gate (first half) "
                                                       "and the up value, and returns down(up × silu(gate)).", "MLP"),))
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
            description=f"{attn.title} and a SwiGLU MLP (fused gate-up), each added to the residual stream; "
                        f"{layer_label(indices)}.")

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Llama's tiny config (4 query heads over 2 KV heads of 16 features) with the same rotary share (0.75: 12 of
        16 features rotate) and the window kept at least the tiny max_position_embeddings."""
        raw = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        raw.update(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2 if (c.num_key_value_heads or c.num_attention_heads) < c.num_attention_heads
                   else 4, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=None,
                   quantization_config=None)
        if c.sliding_window is not None:
            raw["sliding_window"] = raw["max_position_embeddings"]
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        D = c.hidden_size // c.num_attention_heads
        return super().facts(_Derived(c)) + (("rotary features", f"{rotary_width(c)} of {D} per head"),
                                             ("projections", "fused qkv_proj and gate_up_proj"))


@dataclass(frozen=True, slots=True)
class _Derived:
    """A Phi-3 config as Llama's checks and sizes read it: head_dim None (derived), no rope scaling."""

    c: Any
    head_dim: None = None
    rope_scaling: None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.c, name)


FAMILY = Phi3()
