"""What the mixture-of-experts families with grouped-query attention share (Mixtral, Qwen3-MoE, gpt-oss): the
model (embedding, blocks, final RMSNorm, untied head), a pre-norm block of GQA attention and a mixture of experts,
and the block kinds, one per attention type that `layer_types` names. Each family gives its config, its
attention options and its MoE (`moe`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from explorer.model.components import Ctx
from explorer.model.components.attention import ScoresOptions, attention
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block
from explorer.model.components.norms import rmsnorm
from explorer.model.families.base import DIM_LABELS, DecoderLayers, Family, as_published, rope_options, rule_problems
from explorer.model.families.block_fp8 import (
    fp8_problems,
)
from explorer.spec.storage import Storage
from explorer.spec.types import Citation, Component

LABELS = {**DIM_LABELS, "num_experts": "experts"}
"""Short names of sizes in shapes; Qwen3-MoE counts its experts under num_experts."""
KINDS = {"sliding_attention": ("sliding", "Sliding-window block"), "full_attention": ("full", "Full-attention block")}
"""layer_types values -> block key and title."""


def kinds_words(blocks: tuple[Component, ...]) -> str:
    """How the stack's block kinds alternate, as the stack and the root describe them."""
    return (f"{len(blocks)} block kinds alternating as layer_types lists them" if len(blocks) > 1
            else "every block with a mixture of experts")


class SparseMoE(Family):
    """A GQA decoder whose every block's FFN is a routed mixture of experts."""

    experts_key: ClassVar[str]
    """The config key that counts the routed experts."""
    width_key: ClassVar[str]
    """The config key of one expert's hidden width."""
    qk_norm: ClassVar[bool] = False
    sinks: ClassVar[bool] = False
    labels: ClassVar[dict[str, str]] = LABELS
    """Short names of the sizes in shapes."""

    def values(self, c: Any) -> dict[str, int | float]:
        return self.text_values(self.text(c))

    def text_values(self, t: Any) -> dict[str, int | float]:
        """The text model's symbol values (block() reads them from the text config it is given)."""
        out = {n: getattr(t, n) for n in self.symbols if getattr(t, n, None) is not None}
        out["num_key_value_heads"] = t.num_key_value_heads or t.num_attention_heads
        out["head_dim"] = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
        return out

    def check(self, c: Any) -> list[str]:
        t, key = self.text(c), self.text_key
        v = self.text_values(t)
        experts = getattr(t, self.experts_key)
        return rule_problems([
            (t.num_attention_heads % int(v["num_key_value_heads"]) == 0, key + "num_key_value_heads",
             f"must divide num_attention_heads ({t.num_attention_heads}), got {v['num_key_value_heads']}"),
            (int(v["head_dim"]) % 2 == 0, key + "head_dim", f"must be even (rotary pairs), got {v['head_dim']}"),
            (t.num_experts_per_tok <= experts, key + "num_experts_per_tok",
             f"must be <= {self.experts_key} ({experts}), got {t.num_experts_per_tok}"),
            (t.hidden_act == "silu", key + "hidden_act", f"must be 'silu' (SwiGLU experts), got {t.hidden_act!r}"),
            (not self.tied(c), "tie_word_embeddings", "must be false: the family stores lm_head separately"),
        ]) + fp8_problems(self.quantization(c))

    # ------------------------------------------------------------------------------------------- hooks

    def head_citation(self, tied: bool = False) -> Citation:
        return self.ref.cite("lm_head is a separate bias-free Linear from hidden_size to vocab_size.",
                             "ForCausalLM.__init__")

    def layer_types(self, c: Any) -> tuple[str, ...]:
        return ("full_attention",) * c.num_hidden_layers

    def window(self, c: Any, layer_type: str) -> int | None:
        return c.sliding_window if layer_type == "sliding_attention" else None

    def quantized(self, c: Any) -> Storage | None:
        return None

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------- build

    def decoder_layers(self, ctx: Ctx, c: Any) -> DecoderLayers:
        """One block kind per attention type that layer_types names, in order of its first layer."""
        text = self.text(c)
        L, types = text.num_hidden_layers, self.layer_types(text)
        blocks = tuple(self.block(ctx, text, t, tuple(i for i in range(L) if types[i] == t))
                       for t in dict.fromkeys(types))
        return DecoderLayers(blocks, L, f"{L} decoder layers, {kinds_words(blocks)}.")

    def model_description(self, c: Any, layers: DecoderLayers) -> str:
        return (f"Token embedding, {layers.count} transformer blocks ({kinds_words(layers.blocks)}), a final RMSNorm "
                f"and an untied LM head{self.beside_words(c)}.")

    def block(self, ctx: Ctx, c: Any, layer_type: str, indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), self.text_prefix + "layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps, v = c.rms_norm_eps, self.text_values(c)
        window = self.window(c, layer_type)
        so = ScoresOptions(c.num_attention_heads, int(v["num_key_value_heads"]), int(v["head_dim"]) ** -0.5,
                           window=window, sinks=self.sinks)
        bias = bool(getattr(c, "attention_bias", False))
        attn = attention(ctx, prefix=p + "self_attn.", ranges=ranges, x=x_attn,
                         rope_options=rope_options(c.rope_theta, int(v["head_dim"]), c.rope_scaling, "half",
                                                   c.max_position_embeddings),
                         scores_options=so, bias=bias, o_bias=bias, qk_norm_eps=eps if self.qk_norm else None,
                         rope_reference=self.text_prefix + "rotary_emb",
                         citations=self.attention_citations(c))
        key, title = KINDS[layer_type] if len(set(self.layer_types(c))) > 1 else ("moe", "MoE transformer block")
        what = f"sliding-window attention ({window:,} positions)" if window else "attention"
        return decoder_block(
            ctx, key, title, layer_indices=indices, kind=key if key != "moe" else "MoE",
            attn_norm=rmsnorm(ctx, "attn_norm", "Attention RMSNorm", weight=p + "input_layernorm.weight",
                              ranges=ranges, size="hidden_size", x=x, y=x_attn,
                              code="self.input_layernorm(hidden_states)", eps=eps),
            attn=attn,
            ffn_norm=rmsnorm(ctx, "ffn_norm", "MoE RMSNorm", weight=p + "post_attention_layernorm.weight",
                             ranges=ranges, size="hidden_size", x=x_mid, y=x_ffn,
                             code="self.post_attention_layernorm(hidden_states)", eps=eps),
            ffn=self.moe(ctx, c, p, ranges, x_ffn, delta.latex),
            citations=(self.ref.cite("A block adds attention and the mixture of experts, each after an RMSNorm, to "
                                     "the residual stream.", "DecoderLayer"),),
            description=f"Grouped-query {what} and a mixture of experts, each added to the residual stream; "
                        f"{layer_label(indices)}.")

    def attention_citations(self, c: Any) -> tuple:
        return (self.ref.cite("Attention projects queries, keys and values, applies RoPE, repeats each key/value "
                              "head over its group and attends.", "Attention"),
                self.ref.cite("repeat_kv shares each key/value head with num_key_value_groups query heads.",
                              "repeat_kv", prefixed=False))

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_sizes(self, c: Any) -> dict[str, Any]:
        """Small sizes of the same structure: 4 query heads over 2 KV heads, top-2 of 4 experts, 2 blocks."""
        raw = {f.name: as_published(getattr(c, f.name)) for f in dataclasses.fields(c)}
        if self.quantization(c) is not None:  # the executed checks compare values, whatever the checkpoint stores them in
            raw["quantization_config"] = None
        raw.update(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, max_position_embeddings=256, num_experts_per_tok=2, bos_token_id=0, eos_token_id=1)
        raw[self.experts_key] = 4
        raw[self.width_key] = 32
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        t, v = self.text(c), self.values(c)
        return (("transformer blocks", f"{t.num_hidden_layers:,}"),
                ("routed experts", f"{getattr(t, self.experts_key)} (top {t.num_experts_per_tok})"),
                ("attention heads", f"{t.num_attention_heads} query, {v['num_key_value_heads']} key/value"),
                ("vocabulary", f"{t.vocab_size:,}"))

