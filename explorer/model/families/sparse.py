"""What the mixture-of-experts families with grouped-query attention share (Mixtral, Qwen3-MoE, gpt-oss): the
model (embedding, blocks, final RMSNorm, untied head), a pre-norm block of GQA attention and a mixture of experts,
and the block kinds, one per attention type that `layer_types` names. Each family gives its config, its
attention options and its MoE (`moe`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from explorer.model.components import Ctx, Reference
from explorer.model.components.attention import ScoresOptions, attention
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block, model_root, stack
from explorer.model.components.embedding import embedding, head
from explorer.model.components.norms import rmsnorm
from explorer.model.families.base import DIM_LABELS, Family, as_published, rope_options, rule_problems, stored_dtype
from explorer.model.families.block_fp8 import (
    FP8QuantizationConfig,
    fp8_block_storage,
    fp8_problems,
    keep_named_modules_dense,
)
from explorer.spec.storage import Storage
from explorer.spec.types import Component

LABELS = {**DIM_LABELS, "num_experts": "experts"}
"""Short names of sizes in shapes; Qwen3-MoE counts its experts under num_experts."""
KINDS = {"sliding_attention": ("sliding", "Sliding-window block"), "full_attention": ("full", "Full-attention block")}
"""layer_types values -> block key and title."""


def block_fp8(c: Any) -> FP8QuantizationConfig | None:
    """The config's block-wise FP8 quantization_config, where it has one (gpt-oss's MXFP4 is its own)."""
    q = getattr(c, "quantization_config", None)
    return q if isinstance(q, FP8QuantizationConfig) else None


class SparseMoE(Family):
    """A GQA decoder whose every block's FFN is a routed mixture of experts."""

    ref: ClassVar[Reference]
    experts_key: ClassVar[str]
    """The config key that counts the routed experts."""
    width_key: ClassVar[str]
    """The config key of one expert's hidden width."""
    qk_norm: ClassVar[bool] = False
    sinks: ClassVar[bool] = False

    def values(self, c: Any) -> dict[str, int | float]:
        out = {n: getattr(c, n) for n in self.symbols if getattr(c, n, None) is not None}
        out["num_key_value_heads"] = c.num_key_value_heads or c.num_attention_heads
        out["head_dim"] = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return out

    def check(self, c: Any) -> list[str]:
        v = self.values(c)
        experts = getattr(c, self.experts_key)
        return rule_problems([
            (c.num_attention_heads % int(v["num_key_value_heads"]) == 0, "num_key_value_heads",
             f"must divide num_attention_heads ({c.num_attention_heads}), got {v['num_key_value_heads']}"),
            (int(v["head_dim"]) % 2 == 0, "head_dim", f"must be even (rotary pairs), got {v['head_dim']}"),
            (c.num_experts_per_tok <= experts, "num_experts_per_tok",
             f"must be <= {self.experts_key} ({experts}), got {c.num_experts_per_tok}"),
            (c.hidden_act == "silu", "hidden_act", f"must be 'silu' (SwiGLU experts), got {c.hidden_act!r}"),
            (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the family stores lm_head separately"),
        ]) + fp8_problems(block_fp8(c))

    # ------------------------------------------------------------------------------------------- hooks

    def layer_types(self, c: Any) -> tuple[str, ...]:
        return ("full_attention",) * c.num_hidden_layers

    def window(self, c: Any, layer_type: str) -> int | None:
        return c.sliding_window if layer_type == "sliding_attention" else None

    def quantized(self, c: Any) -> Storage | None:
        return None

    def moe(self, ctx: Ctx, c: Any, prefix: str, ranges, x: Port, y_latex: str) -> Component:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------- build

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        dtype = stored_dtype(c.torch_dtype)
        ctx = Ctx(values, LABELS, self.ref, dtype, fp8_block_storage(block_fp8(c)))
        L = c.num_hidden_layers
        types = self.layer_types(c)
        blocks = tuple(self.block(ctx, c, t, tuple(i for i in range(L) if types[i] == t))
                       for t in dict.fromkeys(types))
        model_cite = (self.ref.cite("The model embeds token ids, runs the decoder layers and a final RMSNorm.",
                                    "Model.__init__"),)
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        kinds = (f"{len(blocks)} block kinds alternating as layer_types lists them" if len(blocks) > 1
                 else "every block with a mixture of experts")
        children = (
            embedding(ctx, "embed", "Token embedding", weight="model.embed_tokens.weight", citations=model_cite),
            stack(ctx, blocks, layers=L, description=f"{L} decoder layers, {kinds}.",
                  citations=blocks[0].citations[:1]),
            rmsnorm(ctx, "norm", "Final RMSNorm", weight="model.norm.weight", ranges=(), size="hidden_size", x=x,
                    y=Port(r"\hat x", x.shape, "x_hat"), code="self.norm(hidden_states)", eps=c.rms_norm_eps),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", citations=(
                self.ref.cite("lm_head is a separate bias-free Linear from hidden_size to vocab_size.",
                              "ForCausalLM.__init__"),)),
        )
        root = model_root(ctx, children, code=f"{self.reference.model_class}(config)", layers=L,
                          citations=model_cite, description=f"Token embedding, {L} transformer blocks ({kinds}), a "
                                                            "final RMSNorm and an untied LM head.")
        return keep_named_modules_dense(root, block_fp8(c), dtype, self.reference_module, f"{self.name} config")

    def block(self, ctx: Ctx, c: Any, layer_type: str, indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), "model.layers.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps, v = c.rms_norm_eps, self.values(c)
        window = self.window(c, layer_type)
        so = ScoresOptions(c.num_attention_heads, int(v["num_key_value_heads"]), int(v["head_dim"]) ** -0.5,
                           window=window, sinks=self.sinks)
        bias = bool(getattr(c, "attention_bias", False))
        attn = attention(ctx, prefix=p + "self_attn.", ranges=ranges, x=x_attn,
                         rope_options=rope_options(c.rope_theta, int(v["head_dim"]), c.rope_scaling, "half",
                                                   c.max_position_embeddings),
                         scores_options=so, bias=bias, o_bias=bias, qk_norm_eps=eps if self.qk_norm else None,
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
        if block_fp8(c) is not None:  # the executed checks compare values, whatever the checkpoint stores them in
            raw["quantization_config"] = None
        raw.update(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, max_position_embeddings=256, num_experts_per_tok=2, bos_token_id=0, eos_token_id=1)
        raw[self.experts_key] = 4
        raw[self.width_key] = 32
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        v = self.values(c)
        return (("transformer blocks", f"{c.num_hidden_layers:,}"),
                ("routed experts", f"{getattr(c, self.experts_key)} (top {c.num_experts_per_tok})"),
                ("attention heads", f"{c.num_attention_heads} query, {v['num_key_value_heads']} key/value"),
                ("vocabulary", f"{c.vocab_size:,}"))

