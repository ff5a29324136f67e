"""The terms of the token mixers' options (attention in its variants, MLA, compressed attention and its indexer,
hyper-connections, linear-attention and state-space mixers, and the blocks around them): for each, the factors its
program applies and the step that names each, or why a field is structural. See step_terms.py for the mechanism.

A norm an options class carries (a QK-norm, MLA's latent norms) is named in the layer's steps by its operator and
gain; its eps is shown by the norm's own component, whose options test_step_terms_mixers checks equal it.
"""

from __future__ import annotations

from ..spec.types import Component
from .attention import AttentionOptions
from .base import fmt_eps, fmt_num, k, q, v
from .fused_attention import FusedAttentionOptions
from .gated_attention import GatedAttentionOptions
from .layer_attention import LayerAttentionOptions
from .mla import MLAOptions
from .norms import GAIN_SUBSCRIPT, NormOptions
from .shaped_attention import ShapedAttentionOptions
from .step_terms import Term, registers


def norm_operator(n: NormOptions) -> str:
    """How a layer's steps name the norm `n` applies: RMSNorm with its gain's subscript, or LayerNorm."""
    if n.kind == "layer":
        return r"\operatorname{LayerNorm}("
    return rf"\operatorname{{RMSNorm}}{GAIN_SUBSCRIPT[n.gain]}("


def _qk_norm_terms(field: str, n: NormOptions) -> tuple[Term, ...]:
    return (Term(field, "q_norm", norm_operator(n)), Term(field, "k_norm", norm_operator(n)))


NESTED_NORMS: dict[type, dict[str, tuple[str, ...]]] = {
    AttentionOptions: {"qk_norm": ("q_norm", "k_norm")},
    GatedAttentionOptions: {"qk_norm": ("q_norm", "k_norm")},
    ShapedAttentionOptions: {"norm": ("q_norm", "k_norm")},
    MLAOptions: {"norm": ("q_a_layernorm", "kv_a_layernorm")},
}
"""Options class -> its NormOptions field -> the children whose own steps show that norm's eps (the program applies
the field, the page shows the child: they must be equal)."""


def nested_norm_mismatches(comp: Component) -> list[str]:
    """Each child norm whose options differ from the NormOptions comp's program applies in its place."""
    out = []
    for field, keys in NESTED_NORMS.get(type(comp.options), {}).items():
        applied = getattr(comp.options, field)
        for child in comp.children:
            if applied is not None and child.key in keys and child.options != applied:
                out.append(f"{child.key} shows {child.options!r}, the program applies {applied!r}")
    return out


# ---------------------------------------------------------------------------------------------- attention

@registers(AttentionOptions, structural=("heads", "kv_heads", "head_dim"), switches=("qk_norm",))
def _attention(o: AttentionOptions) -> tuple[Term, ...]:
    """heads, kv_heads, head_dim only reshape (the shapes show them); the KV repeat is the scores child's."""
    return _qk_norm_terms("qk_norm", o.qk_norm) if o.qk_norm is not None else ()


@registers(GatedAttentionOptions, structural=("heads", "kv_heads"))
def _gated_attention(o: GatedAttentionOptions) -> tuple[Term, ...]:
    """head_dim splits each head's query projection into its queries and its gates."""
    return (Term("head_dim", "heads", rf"{o.head_dim}+1:{2 * o.head_dim}"), *_qk_norm_terms("qk_norm", o.qk_norm))


@registers(FusedAttentionOptions)
def _fused_attention(o: FusedAttentionOptions) -> tuple[Term, ...]:
    """heads × head_dim is where the fused projection splits into q, k and v."""
    w = o.heads * o.head_dim
    return (Term("heads", "split", f"{w}:{2 * w}"), Term("head_dim", "split", f"{w}:{2 * w}"))


@registers(ShapedAttentionOptions, structural=("heads", "kv_heads", "qk_head_dim", "v_head_dim", "cache_formula"),
           switches=("qk_norm", "norm", "value_scale"))
def _shaped_attention(o: ShapedAttentionOptions) -> tuple[Term, ...]:
    """cache_formula only labels the memory figures; the norm runs over each whole projection (across_heads, on
    q and k before the split) or over each head (per_head, on Q and K)."""
    out = []
    if o.qk_norm != "none" and o.norm is not None:
        q_in, k_in = (q("q"), k("k")) if o.qk_norm == "across_heads" else (q("Q"), k("K"))
        out += [Term("qk_norm", "q_norm", f"({q_in})"), Term("qk_norm", "k_norm", f"({k_in})"),
                *_qk_norm_terms("norm", o.norm)]
    if o.value_scale != 1.0:
        out.append(Term("value_scale", "v-scale", rf"{fmt_num(o.value_scale)}\,{v('V')}"))
    return tuple(out)


_LAYER_SCORES_FIELDS = ("shape", "scale", "window", "chunk")


def _layer_scores_terms(o: LayerAttentionOptions) -> list[Term]:
    hd = o.shape.head_dim
    out = [Term("scale", "scale", f"{o.scale:.6f}" if abs(o.scale - hd ** -0.5) < 1e-12 else rf"\tau={o.scale:g}")]
    if o.shape.groups > 1:
        out.append(Term("shape", "repeat", rf"\lceil h/{o.shape.groups}\rceil"))
    if o.chunk:
        out.append(Term("chunk", "chunk", rf"\lfloor s/{o.chunk:,}\rfloor"))
    elif o.window:
        out.append(Term("window", "window", f"<{o.window:,}"))
    return out


@registers(LayerAttentionOptions, switches=("shape", "window", "chunk", "rope", "qk_norm", "qk_gain", "eps",
                                            "keys_as_values", "value_norm", "temperature"))
def _layer_attention(o: LayerAttentionOptions) -> tuple[Term, ...]:
    """The layer's own steps include its scores'. Its RMS QK-norm applies the q_norm child's options (that child
    shows eps); eps here is the value norm's and the L2 norms'."""
    out = _layer_scores_terms(o)
    if o.keys_as_values:
        out.append(Term("keys_as_values", "values", f"{v('V')}={k('K')}"))
    if o.qk_norm == "rms":
        out += [Term("qk_norm", s, r"\operatorname{RMSNorm}") for s in ("q_norm", "k_norm")]
        out += [Term("qk_gain", s, rf"\operatorname{{RMSNorm}}{GAIN_SUBSCRIPT[o.qk_gain]}(") for s in ("q_norm", "k_norm")]
    if o.value_norm:
        out += [Term("value_norm", "v_norm", r"\operatorname{mean}"), Term("eps", "v_norm", fmt_eps(o.eps))]
    if o.rope:
        out += [Term("rope", s, r"\operatorname{RoPE}") for s in ("q-rotate", "k-rotate")]
    if o.qk_norm == "l2":
        out += [Term(f, s, x) for s in ("q-l2", "k-l2")
                for f, x in (("qk_norm", r"\operatorname{mean}"), ("eps", fmt_eps(o.eps)))]
    if o.temperature is not None:
        t = o.temperature
        out += [Term("temperature", "temperature", rf"1+{t.attn_scale:g}\,\ln"),
                Term("temperature", "temperature", f"{{{t.floor_scale:,}}}")]
    return tuple(out)


@registers(LayerAttentionOptions, program="layer_scores",
           structural=("rope", "qk_norm", "qk_gain", "eps", "keys_as_values", "value_norm", "temperature"))
def _layer_scores(o: LayerAttentionOptions) -> tuple[Term, ...]:
    """The scores child carries its layer's options but applies only the KV repeat, the scale and the mask; the
    rest (listed structural here) is the layer's, whose own terms check them."""
    return tuple(_layer_scores_terms(o))


# ---------------------------------------------------------------------------------------------- MLA

@registers(MLAOptions, structural=("heads", "kv_lora_rank", "nope", "rope", "v"), switches=("q_lora_rank",))
def _mla(o: MLAOptions) -> tuple[Term, ...]:
    """kv_lora_rank, nope, rope and v are where the program splits the latents and heads (the shapes show them);
    q_lora_rank chooses the query path through a normed latent."""
    out = [Term("norm", "kv-norm", norm_operator(o.norm))]
    if o.q_lora_rank is not None:
        out += [Term("q_lora_rank", "q-down", "W_{DQ}"), Term("norm", "q-norm", norm_operator(o.norm))]
    return tuple(out)
