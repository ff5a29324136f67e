"""The SmolLM3 family (SmolLM3-3B): Llama's decoder with no positional encoding on some layers. no_rope_layers
holds a 1 for each layer that rotates its queries and keys and a 0 for each that does not; absent, SmolLM3Config
makes every no_rope_layer_interval-th layer (the fourth, by default) a NoPE layer. The NoPE layers are a block kind
of their own whose attention is nope_attention.py's, taking no rotary angles; the others are Llama's block. The head
is tied to the token embedding by default, and the width per head is always hidden_size / num_attention_heads (the
config has no head_dim).

References: "SmolLM3: smol, multilingual, long-context reasoner" (Hugging Face blog, 2025-07); "Rope to Nope and
Back Again: A New Hybrid Attention Strategy" (arXiv:2501.18795) for RoPE layers interleaved with NoPE layers;
transformers' models/smollm3/modeling_smollm3.py and configuration_smollm3.py (the reference binding and its
defaults).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.attention import ScoresOptions
from explorer.model.components.base import layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block
from explorer.model.components.nope_attention import nope_attention
from explorer.model.components.norms import rmsnorm
from explorer.model.families.base import DecoderLayers, PublishedMetadata, ReferenceBinding, RopeScaling, rule_problems
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.llama import Llama
from explorer.spec.types import Component, Port


@dataclass(frozen=True, slots=True, kw_only=True)
class SmolLM3Hyperparameters(PublishedMetadata):
    """SmolLM3Config's keys, named as published; absent keys take its defaults (transformers 5.23.0)."""

    vocab_size: int = 128_256
    hidden_size: int = 2048
    intermediate_size: int = 11_008
    num_hidden_layers: int = 36
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 4
    hidden_act: str = "silu"
    max_position_embeddings: int = 32_768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 2_000_000.0
    """SmolLM3Config's default_theta, which it takes where no rope parameters are published."""
    rope_scaling: RopeScaling | None = None
    no_rope_layers: tuple[int, ...] | None = None
    """1: the layer rotates (RoPE); 0: a NoPE layer. None: every no_rope_layer_interval-th layer is NoPE."""
    no_rope_layer_interval: int = 4
    use_sliding_window: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = True
    torch_dtype: str = "bfloat16"
    quantization_config: FP8QuantizationConfig | None = None
    """Block-wise FP8, read as the llama family reads it."""
    # Informational keys beyond PublishedMetadata's: recorded as published, not used by the spec.
    pad_token_id: int | None = 128_004
    bos_token_id: int | None = 128_000
    eos_token_id: int | tuple[int, ...] | None = 128_001


def rotates(c: Any) -> tuple[bool, ...]:
    """Whether each layer rotates, as SmolLM3Config derives no_rope_layers when it is absent: layer i is NoPE where
    (i + 1) is a multiple of no_rope_layer_interval (layers 3, 7, 11, ... by default)."""
    if c.no_rope_layers is not None:
        return tuple(bool(r) for r in c.no_rope_layers[:c.num_hidden_layers])
    return tuple((i + 1) % c.no_rope_layer_interval != 0 for i in range(c.num_hidden_layers))


def kinds(c: Any) -> dict[bool, tuple[int, ...]]:
    """Rotates -> its layers, in order of the first layer of each kind."""
    out: dict[bool, list[int]] = {}
    for i, r in enumerate(rotates(c)):
        out.setdefault(r, []).append(i)
    return {r: tuple(ix) for r, ix in out.items()}


class SmolLM3(Llama):
    name = "smollm3"
    model_types = ("smollm3",)
    config_class: ClassVar[type] = SmolLM3Hyperparameters
    reference = ReferenceBinding("SmolLM3Config", "SmolLM3ForCausalLM")
    ref = Reference("models/smollm3/modeling_smollm3.py", "SmolLM3")

    def text(self, c: Any) -> Any:
        """The config as Llama's builder reads it: head_dim None (SmolLM3 derives it from hidden_size)."""
        return _Derived(c)

    def check(self, c: Any) -> list[str]:
        L = c.num_hidden_layers
        return super().check(c) + rule_problems([
            (c.no_rope_layers is None or (len(c.no_rope_layers) >= L and set(c.no_rope_layers[:L]) <= {0, 1}),
             "no_rope_layers", f"must give at least {L} entries, each 0 (NoPE) or 1 (RoPE)"),
            (c.no_rope_layer_interval >= 1, "no_rope_layer_interval", "must be >= 1"),
            (not c.use_sliding_window, "use_sliding_window",
             "must be false: sliding NoPE layers are not in this family"),
            (c.layer_types is None or set(c.layer_types) <= {"full_attention"}, "layer_types",
             "must name only full_attention layers: sliding layers are not in this family"),
            (not c.attention_bias, "attention_bias", "must be false: biased projections are not in this family"),
        ])

    def defaulted_value(self, c: Any, key: str) -> Any:
        """no_rope_layers and layer_types as SmolLM3Config derives them when absent."""
        if key == "no_rope_layers" and c.no_rope_layers is None:
            return [int(r) for r in rotates(c)]
        if key == "layer_types" and c.layer_types is None:  # full attention on every layer without a window
            return ["full_attention"] * c.num_hidden_layers
        return super().defaulted_value(c, key)

    def decoder_layers(self, ctx: Ctx, c: Any) -> DecoderLayers:
        """A RoPE block kind (Llama's) and a NoPE block kind, in order of their first layers."""
        t = self.text(c)
        blocks = tuple(self.block(ctx, t, ix) if r else self.nope_block(ctx, t, ix) for r, ix in kinds(t).items())
        rope_layers, nope_layers = (len(kinds(t).get(r, ())) for r in (True, False))
        return DecoderLayers(tuple(dataclasses.replace(b, key="rope_block", title="RoPE block") if b.key == "block"
                                   else b for b in blocks), t.num_hidden_layers,
                             f"{t.num_hidden_layers} decoder layers: {rope_layers} with rotary position embedding, "
                             f"{nope_layers} with none (NoPE).")

    def nope_block(self, ctx: Ctx, c: Any, indices: tuple[int, ...]) -> Component:
        """Llama's block with attention that rotates nothing: the same tensors, no rotary step."""
        ranges, p = layers(indices), self.text_prefix + "layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps, v = c.rms_norm_eps, self.text_values(c)
        attn = self.nope_attention(ctx, c, p + "self_attn.", ranges, x_attn, v)
        mlp = self.ffn(ctx, c, p + "mlp.", ranges, x_ffn, delta)
        return decoder_block(
            ctx, "nope_block", "NoPE block", layer_indices=indices, kind="NoPE",
            attn_norm=rmsnorm(ctx, "attn_norm", "Attention RMSNorm", weight=p + "input_layernorm.weight", ranges=ranges,
                              size="hidden_size", x=x, y=x_attn, code="self.input_layernorm(hidden_states)", eps=eps),
            attn=attn,
            ffn_norm=rmsnorm(ctx, "ffn_norm", "MLP RMSNorm", weight=p + "post_attention_layernorm.weight",
                             ranges=ranges, size="hidden_size", x=x_mid, y=x_ffn,
                             code="self.post_attention_layernorm(hidden_states)", eps=eps),
            ffn=mlp, citations=(self.ref.cite("A block adds attention and the MLP, each after an RMSNorm, to the "
                                              "residual stream.", "DecoderLayer"),),
            description=f"Grouped-query attention with no positional encoding and a SwiGLU MLP, each added to the "
                        f"residual stream; {layer_label(indices)}.")

    def nope_attention(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, v: dict[str, int | float]) -> Component:
        so = ScoresOptions(int(v["num_attention_heads"]), int(v["num_key_value_heads"]), int(v["head_dim"]) ** -0.5)
        return nope_attention(ctx, prefix=prefix, ranges=ranges, x=x, y=Port(r"\Delta_{\mathrm{attn}}", x.shape,
                                                                             "delta_attn"),
                              so=so, order_from="the RoPE layers before it", citations=(
                                  self.ref.cite("Attention projects q, k and v and attends with KV groups; it rotates "
                                                "q and k only where no_rope_layers holds a 1 for the layer "
                                                "(use_rope).", "Attention"),
                                  self.ref.cite("repeat_kv shares each key/value head with num_key_value_groups query "
                                                "heads.", "repeat_kv", prefixed=False)))

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Llama's tiny config (4 query heads over 2 KV heads, a width of 16 per head, derived), with a RoPE layer
        and a NoPE layer where the model has both kinds."""
        raw = super().tiny_config(c)
        raw.pop("head_dim")
        present = [r for r in (True, False) if r in kinds(c)]
        raw.update(num_hidden_layers=len(present), no_rope_layers=[int(r) for r in present], layer_types=None)
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        nope = rotates(c).count(False)
        return super().facts(c) + (("NoPE layers", f"{nope} of {c.num_hidden_layers}"),)


@dataclass(frozen=True, slots=True)
class _Derived:
    """A SmolLM3 config as Llama's builder reads it: head_dim None (derived from hidden_size)."""

    c: Any
    head_dim: None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.c, name)


FAMILY = SmolLM3()
