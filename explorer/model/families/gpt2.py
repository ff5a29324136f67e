"""The GPT-2 family: learned absolute positions added to the token embedding, pre-LayerNorm blocks with biases,
multi-head attention through one fused c_attn projection, a GELU (tanh approximation) MLP, every projection a
Conv1D stored [in, out], and an LM head tied to the token embedding.

References: "Language Models are Unsupervised Multitask Learners" (Radford et al., 2019); transformers'
models/gpt2/modeling_gpt2.py (the reference binding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import sympy

from explorer.model.components import Ctx, Reference
from explorer.model.components.attention import ScoresOptions
from explorer.model.components.base import Port, layer_label, layers
from explorer.model.components.blocks import block_ports, decoder_block, model_root, stack
from explorer.model.components.embedding import embedding, embedding_with_positions, head, positions
from explorer.model.components.fused_attention import fused_attention
from explorer.model.components.mlp import Activation, plain_mlp
from explorer.model.components.norms import layernorm
from explorer.model.families.base import DIM_LABELS, Family, ReferenceBinding, rule_problems
from explorer.model.families.block_fp8 import FP8QuantizationConfig
from explorer.model.families.renames import strip_prefix
from explorer.spec.storage import Dense
from explorer.spec.types import Component, Hyperparameters, Layout, TensorSpec

ACTIVATIONS: dict[str, Activation] = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
"""config.json activation_function -> the library's activation (gelu_new is GELU's tanh approximation)."""


@dataclass(frozen=True, slots=True)
class GPT2Hyperparameters(Hyperparameters):
    """config.json keys of GPT2Config, named as published; absent keys take GPT2Config's defaults."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    """None: 4 × n_embd."""
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    add_cross_attention: bool = False
    tie_word_embeddings: bool = True
    torch_dtype: str = "float32"
    """GPT-2's config.json publishes no torch_dtype; its weights are float32."""
    quantization_config: FP8QuantizationConfig | None = None
    """Read only to be refused (GPT2.check): transformers' FP8 quantizer converts nothing of GPT-2."""
    # Informational keys: recorded as published, not used by the spec.
    architectures: tuple[str, ...] = ()
    model_type: str = ""
    n_ctx: int = 1024
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    initializer_range: float = 0.02
    summary_type: str = "cls_index"
    summary_use_proj: bool = True
    summary_activation: str | None = None
    summary_proj_to_labels: bool = True
    summary_first_dropout: float = 0.1
    task_specific_params: dict[str, Any] | None = None
    use_cache: bool = True
    bos_token_id: int | None = 50256
    eos_token_id: int | None = 50256
    pad_token_id: int | None = None


NO_FP8 = ("must be absent: GPT-2's projections are Conv1D, which transformers' FP8 quantizer (replace_with_fp8_linear) "
          "does not convert, and its one nn.Linear, lm_head, is tied to wte and kept by default, so an FP8 "
          "checkpoint would store nothing in FP8")
"""transformers' FineGrainedFP8HfQuantizer on GPT2LMHeadModel: every projection is a Conv1D (not nn.Linear) and
get_keys_to_not_convert keeps lm_head; it warns that no linear modules were found."""


class GPT2(Family):
    name = "gpt2"
    model_types = ("gpt2",)
    config_class: ClassVar[type] = GPT2Hyperparameters
    reference = ReferenceBinding("GPT2Config", "GPT2LMHeadModel",
                                 config_skip=("architectures", "torch_dtype", "task_specific_params"),
                                 renames=strip_prefix("transformer."))
    """The published file names its tensors without the "transformer." module transformers nests them under."""
    ref = Reference("models/gpt2/modeling_gpt2.py", "GPT2")
    symbols = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "head_dim",
               "max_position_embeddings")
    """transformers' own aliases of n_embd, n_inner, n_head and n_positions (GPT2Config.attribute_map)."""
    layout: ClassVar[Layout] = "in_out"
    """Conv1D stores every projection [in, out] (a class attribute so a test can get it wrong on purpose)."""
    tied_head: ClassVar[bool] = True
    """Whether the head follows tie_word_embeddings (a test turns this off to get the tie wrong)."""

    def reference_module(self, name: str) -> str:
        """transformers' module for a checkpoint module name: every module but the head under "transformer."."""
        return name if name.startswith("lm_head") else "transformer." + name

    def values(self, c: Any) -> dict[str, int | float]:
        return {"vocab_size": c.vocab_size, "hidden_size": c.n_embd, "intermediate_size": c.n_inner or 4 * c.n_embd,
                "num_attention_heads": c.n_head, "head_dim": c.n_embd // c.n_head,
                "max_position_embeddings": c.n_positions}

    def check(self, c: Any) -> list[str]:
        return rule_problems([
            (c.n_embd % c.n_head == 0, "n_head", f"must divide n_embd ({c.n_embd}), got {c.n_head}"),
            (c.activation_function in ACTIVATIONS, "activation_function",
             f"must be one of {', '.join(sorted(ACTIVATIONS))}, got {c.activation_function!r}"),
            (c.scale_attn_weights, "scale_attn_weights", "must be true: unscaled scores are not in this family"),
            (not c.scale_attn_by_inverse_layer_idx, "scale_attn_by_inverse_layer_idx",
             "must be false: per-layer score scaling is not in this family"),
            (not c.add_cross_attention, "add_cross_attention", "must be false: GPT-2 here is a decoder only"),
            (c.quantization_config is None, "quantization_config", NO_FP8),
        ])

    # ------------------------------------------------------------------------------------------------ build

    def build(self, c: Any, values: dict[str, int | float]) -> Component:
        ctx = Ctx(values, DIM_LABELS, self.ref, "F32" if c.torch_dtype == "float32" else c.torch_dtype.upper())
        L = c.n_layer
        block = self.block(ctx, c, tuple(range(L)))
        tied = "wte.weight" if c.tie_word_embeddings and self.tied_head else ""
        x = Port(r"x_{L}", ctx.tokens("hidden_size"), "x")
        embed = embedding_with_positions(
            ctx, embedding(ctx, "wte", "Token embedding", weight="wte.weight"),
            positions(ctx, "wpe", "Learned position embedding", weight="wpe.weight", citations=(
                self.ref.cite("wpe is an nn.Embedding of max_position_embeddings learned vectors, one per absolute "
                              "position.", "Model.__init__"),)),
            citations=(self.ref.cite("The input to the first block is wte(input_ids) + wpe(position_ids), with "
                                     "position_ids 0, 1, …, T − 1.", "Model.forward"),))
        children = (
            embed,
            stack(ctx, (block,), layers=L, description=f"{L} identical blocks.", citations=block.citations[:1]),
            layernorm(ctx, "norm", "Final LayerNorm", weight="ln_f.weight", ranges=(), size="hidden_size",
                      x=x, y=Port(r"\hat x", x.shape, "x_hat"), code="self.ln_f(hidden_states)",
                      eps=c.layer_norm_epsilon, citations=(self.ref.cite(
                          "ln_f, a LayerNorm with weight and bias, follows the last block.", "Model.__init__"),)),
            head(ctx, "lm_head", "LM head", weight="lm_head.weight", tied_to=tied, citations=(
                self.ref.cite("lm_head is a bias-free Linear from n_embd to vocab_size; _tied_weights_keys ties it "
                              "to transformer.wte.weight.", "LMHeadModel"),)),
        )
        head_text = "an LM head tied to the token embedding" if tied else "an untied LM head"
        return model_root(ctx, children, code=f"{self.reference.model_class}(config)", layers=L,
                          citations=children[0].citations,
                          description=f"Token and learned position embeddings, {L} pre-LayerNorm blocks, a final "
                                      f"LayerNorm and {head_text}.")

    def block(self, ctx: Ctx, c: Any, indices: tuple[int, ...]) -> Component:
        ranges, p = layers(indices), "h.{layer}."
        x, x_attn, x_mid, x_ffn, _, delta = block_ports(ctx)
        eps, v = c.layer_norm_epsilon, self.values(c)
        n, hd = int(v["num_attention_heads"]), int(v["head_dim"])
        ln_cite = (self.ref.cite("ln_1 and ln_2 are LayerNorms (weight and bias) before attention and before the "
                                 "MLP.", "Block.__init__"),)
        attn = fused_attention(
            ctx, prefix=p + "attn.", ranges=ranges, x=x_attn, scores_options=ScoresOptions(n, n, hd ** -0.5),
            layout=self.layout,
            citations=(self.ref.cite("c_attn's output is split into query, key and value (split_size = n_embd "
                                     "each), viewed as heads, and attended with scaling 1/√head_dim.",
                                     "Attention.forward"),
                       self.ref.cite("c_attn and c_proj are Conv1D modules, whose weight is [in, out].",
                                     "Attention.__init__")),
            notes=("The published file also stores attn.bias for each block: the causal mask as a [1, 1, "
                   "n_positions, n_positions] F32 buffer of ones on and below the diagonal. It is a buffer, not a "
                   "parameter: it is in the stored layout and its bytes, not in the parameter count; transformers "
                   "neither builds nor loads it (it masks with is_causal instead).",))
        attn = dataclasses.replace(attn, tensors=attn.tensors + (self.mask_buffer(ctx, p + "attn.bias", ranges),))
        act = ACTIVATIONS[c.activation_function]
        mlp = plain_mlp(ctx, "mlp", prefix=p + "mlp.", ranges=ranges, x=x_ffn, y=delta, names=("c_fc", "c_proj"),
                        act=act, bias=True, layout=self.layout,
                        citations=(self.ref.cite(f"The MLP is c_proj(act(c_fc(x))) with act = "
                                                 f"{c.activation_function}, both Conv1D with biases.", "MLP"),))
        block = decoder_block(
            ctx, "block", "Transformer block", layer_indices=indices, kind="transformer",
            attn_norm=layernorm(ctx, "attn_norm", "Attention LayerNorm", weight=p + "ln_1.weight", ranges=ranges,
                                size="hidden_size", x=x, y=x_attn, code="self.ln_1(hidden_states)", eps=eps,
                                citations=ln_cite),
            attn=attn,
            ffn_norm=layernorm(ctx, "ffn_norm", "MLP LayerNorm", weight=p + "ln_2.weight", ranges=ranges,
                               size="hidden_size", x=x_mid, y=x_ffn, code="self.ln_2(hidden_states)", eps=eps,
                               citations=ln_cite),
            ffn=mlp, citations=(self.ref.cite("A block adds attention and the MLP, each after a LayerNorm, to the "
                                              "residual stream.", "Block.forward"),),
            description=f"Fused-QKV attention and a GELU MLP, each after a LayerNorm and added to the residual "
                        f"stream; {layer_label(indices)}.")
        return dataclasses.replace(block, code="GPT2Block(config, layer_idx)")

    @staticmethod
    def mask_buffer(ctx: Ctx, name: str, ranges) -> TensorSpec:
        """The causal mask old GPT-2 files store per block, [1, 1, positions, positions]."""
        n = ctx.sym("max_position_embeddings")
        return TensorSpec(name, (sympy.Integer(1), sympy.Integer(1), n, n), ranges, role="buffer",
                          storage=Dense("F32"), reference_holds=False)

    # ------------------------------------------------------------------------------------------ tiny, facts

    def tiny_config(self, c: Any) -> dict[str, Any]:
        """Small sizes, same structure: 4 heads, the default 4× MLP, a tied head as published."""
        raw = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        raw.update(vocab_size=97, n_embd=64, n_head=4, n_layer=2, n_positions=32, n_ctx=32, n_inner=None,
                   bos_token_id=0, eos_token_id=1)
        return raw

    def facts(self, c: Any) -> tuple[tuple[str, str], ...]:
        return (("transformer blocks", f"{c.n_layer:,}"), ("attention heads", f"{c.n_head} (multi-head)"),
                ("vocabulary", f"{c.vocab_size:,}"), ("positions", f"{c.n_positions:,} learned"))


FAMILY = GPT2()
