"""What each step must show of what its program applies: for a component's options (the config values its program
reads), the factors the program multiplies, adds or selects by, each with the step that must name it and the LaTeX
that names it there.

Every field of a registered options class is either such a factor or listed as structural (a size the shapes
already show, a module name): a field added to an options class, which its program may then read, fails
`unshown_terms` (explorer/model/components/step_term_checks.py, which imports every registration) until it is
classed. tests/test_truth.py checks every component of every model against these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from explorer.model.components.attention import ScoresOptions
from explorer.model.components.base import fmt_eps, fmt_num
from explorer.model.components.embedding import EmbeddingOptions
from explorer.model.components.fused_experts import ClampedSwiGLUOptions
from explorer.model.components.moe import SCORE_LATEX, RouterOptions, score_symbol
from explorer.model.components.norms import NormOptions
from explorer.model.components.rope import RopeOptions, attention_factor, yarn_bounds
from explorer.model.components.softcap import SoftcapOptions


@dataclass(frozen=True, slots=True)
class Term:
    """One factor the program applies and where the steps name it."""

    field: str
    """The options field (a config value, or one derived from config values) the program applies."""
    step: str
    """The step whose LaTeX must name it ("" for any step of the component)."""
    latex: str
    """What that step's LaTeX must contain."""
    also: tuple[str, ...] = ()
    """Other LaTeX that names it as well (a hash router's "k experts per token id" for top_k)."""
    programs: tuple[str, ...] = ()
    """The programs that apply it (() for every program of these options): where several programs share one options
    class (a vision tower, its blocks and its patch embedding; a layer and the scores child that carries its
    options), each component names what its own program applies. A field no program of a component reads has no
    term for it there, and is classed by the other programs' terms."""


TermsOf = Callable[[Any], tuple[Term, ...]]
TERMS: dict[type, tuple[TermsOf, frozenset[str]]] = {}
"""Options class -> (its terms for given options, its structural fields)."""


SWITCHES: dict[type, tuple[str, ...]] = {
    RouterOptions: ("router_bias", "softmax_after_topk", "scoring", "correction_bias", "n_group", "topk_group",
                    "norm_topk_prob", "scaling"),
    RopeOptions: ("zero_frequency_pairs", "unrotated_tail", "factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                  "original_max_position_embeddings", "low_freq_factor", "high_freq_factor", "truncate"),
    NormOptions: ("gain",),
    ScoresOptions: ("kv_heads", "window", "sinks", "softcap"),
    ClampedSwiGLUOptions: ("alpha", "up_shift", "bias"),
    EmbeddingOptions: ("scale",),
}
"""Fields whose neutral value (no bias, factor 1, no window) switches their term off: they are classed as factors
whatever their value."""


def switched_by(cls: type, *names: str) -> None:
    """Class `names` of `cls` as switches (see SWITCHES): registers() passes its own, other modules theirs."""
    SWITCHES[cls] = (*SWITCHES.get(cls, ()), *names)


def registers(cls: type, structural: tuple[str, ...] = (), switches: tuple[str, ...] = ()) -> Callable[[TermsOf], TermsOf]:
    """switches: fields classed as factors whatever their value (see SWITCHES)."""
    def register(fn: TermsOf) -> TermsOf:
        TERMS[cls] = (fn, frozenset(structural))
        switched_by(cls, *switches)
        return fn
    return register


@registers(RouterOptions, structural=("experts", "weight_name", "correction_bias_name"))
def _router(o: RouterOptions) -> tuple[Term, ...]:
    out = [Term("k", "select", rf"\operatorname{{top}}_{{{o.k}}}", also=(rf"{o.k}\text{{ experts per token id}}",))]
    if o.router_bias:
        out.append(Term("router_bias", "logits", "+b_r"))
    if o.softmax_after_topk:
        return (*out, Term("softmax_after_topk", "gates", r"e^{z_i}"))
    out.append(Term("scoring", "scores", SCORE_LATEX[o.scoring]))
    if o.correction_bias:
        out.append(Term("correction_bias", "select", score_symbol(o.scoring) + "+b"))
    if o.n_group > 1:
        out += [Term("n_group", "groups", f"over {o.n_group} groups"),
                Term("topk_group", "groups", rf"\operatorname{{top}}_{{{o.topk_group}}}"),
                Term("n_group", "select", r"-\infty")]
    if o.norm_topk_prob:
        out.append(Term("norm_topk_prob", "gates", rf"\sum_{{j}}{score_symbol(o.scoring)}_j"))
    if o.scaling != 1.0:
        out.append(Term("scaling", "gates", fmt_num(o.scaling)))
    return tuple(out)


@registers(RopeOptions, structural=("kind", "layer_type"))
def _rope(o: RopeOptions) -> tuple[Term, ...]:
    out = [Term("theta", "theta", fmt_num(o.theta)), Term("dim", "theta", f"/{o.dim}"),
           Term("pairing", "rotate", "x_{2j+1}" if o.pairing == "interleaved" else f"x_{{j+{o.pairs}}}")]
    if o.zero_frequency_pairs:
        out.append(Term("zero_frequency_pairs", "theta", rf"{o.rotated_pairs}\le j"))
    if o.unrotated_tail:
        out.append(Term("unrotated_tail", "rotate", rf"{o.dim}\le i<{o.head_width}"))
    if o.kind in ("linear", "yarn", "llama3"):
        out.append(Term("factor", "inv-freq", fmt_num(o.factor)))
    if o.kind == "yarn":
        low, high = yarn_bounds(o)
        out += [Term(f, "ramp", fmt_num(low)) for f in ("beta_fast", "original_max_position_embeddings", "truncate")]
        out.append(Term("beta_slow", "ramp", fmt_num(high)))
        if attention_factor(o) != 1.0:  # multiplies cos and sin
            out += [Term(f, "rotate", f"{attention_factor(o):.6f}") for f in ("mscale", "mscale_all_dim")]
    if o.kind == "llama3":
        out += [Term("original_max_position_embeddings", "inv-freq", str(o.original_max_position_embeddings)),
                Term("low_freq_factor", "inv-freq", fmt_num(o.low_freq_factor)),
                Term("high_freq_factor", "inv-freq", fmt_num(o.high_freq_factor))]
    return tuple(out)


@registers(NormOptions)
def _norm(o: NormOptions) -> tuple[Term, ...]:
    out = [Term("eps", "", fmt_eps(o.eps)), Term("kind", "", r"\mu" if o.kind == "layer" else r"\operatorname{mean}")]
    if o.kind == "rms":
        out.append(Term("gain", "", r"(1+\gamma)" if o.gain == "1+w" else r"\gamma"))
    return tuple(out)


@registers(ScoresOptions, structural=("heads", "sink_name"))
def _scores(o: ScoresOptions) -> tuple[Term, ...]:
    out = [Term("scale", "", f"{o.scale:.6f}")]
    if o.kv_heads != o.heads:
        out.append(Term("kv_heads", "repeat", rf"\lceil h/{o.heads // o.kv_heads}\rceil"))
    if o.window:
        out.append(Term("window", "", f"{o.window:,}"))
    if o.sinks:
        out.append(Term("sinks", "softmax", r"\kappa_h"))
    if o.softcap:
        out.append(Term("softcap", "", fmt_num(o.softcap)))
    return tuple(out)


@registers(ClampedSwiGLUOptions, structural=("experts",))
def _clamped_swiglu(o: ClampedSwiGLUOptions) -> tuple[Term, ...]:
    out = [Term("limit", "clamp", fmt_num(o.limit)), Term("interleaved", "split", "2j+1" if o.interleaved else "halves")]
    if o.alpha != 1.0:
        out.append(Term("alpha", "glu", fmt_num(o.alpha)))
    if o.up_shift:
        out.append(Term("up_shift", "product", f"+{fmt_num(o.up_shift)}"))
    if o.bias:
        out.append(Term("bias", "down", "+b"))
    return tuple(out)


@registers(EmbeddingOptions)
def _embedding(o: EmbeddingOptions) -> tuple[Term, ...]:
    return (Term("scale", "", fmt_num(o.scale)),) if o.scale != 1.0 else ()


@registers(SoftcapOptions)
def _softcap(o: SoftcapOptions) -> tuple[Term, ...]:
    return (Term("cap", "", fmt_num(o.cap)),)


def for_programs(programs: tuple[str, ...], terms: Iterable[Term]) -> list[Term]:
    """`terms`, required only of components running one of `programs`."""
    return [replace(t, programs=programs) for t in terms]
