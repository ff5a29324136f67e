"""Rotary position embedding: inverse frequencies (default, linear, dynamic, Llama 3, YaRN), the angles R_t of
every position, and the rotation of feature pairs (adjacent pairs, or the two halves of the rotary features).

References: RoFormer (arXiv:2104.09864); YaRN (arXiv:2309.00071); the Llama 3 herd of models report
(arXiv:2407.21783) for the wavelength-dependent scaling; transformers' modeling_rope_utils.py for how each
variant is computed in the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import Ctx, Run, T, ctx_colour, fmt_num, options, program, reference_call
from explorer.spec.storage import Dense
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step, TensorSpec

RopeKind = Literal["default", "linear", "dynamic", "llama3", "yarn"]
Pairing = Literal["interleaved", "half"]
ROPE_UTILS_FILE = "modeling_rope_utils.py"


@dataclass(frozen=True, slots=True)
class RopeOptions:
    kind: RopeKind
    theta: float
    dim: int
    """Rotary features per head (even)."""
    pairing: Pairing = "half"
    """Which features rotate together: (x_2j, x_2j+1), or (x_j, x_j+d/2) as rotate_half does."""
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    truncate: bool = True
    """YaRN: round the ramp's bounds outward to whole pairs (floor, ceil); gpt-oss publishes truncate: false and
    keeps the fractional bounds (modeling_rope_utils.find_correction_range)."""
    unrotated_tail: int = 0
    """Partial rotary, leading layout (MiniMax-M2's rotary_dim, MiMo-V2-Flash's partial_rotary_factor): the head is
    dim + unrotated_tail wide; its first `dim` features rotate, paired within them with exponents over dim, and its
    last `unrotated_tail` features pass through. 0: the head is `dim` wide."""
    layer_type: str = ""
    """The reference rotary module's layer type where one module serves several ("sliding_attention" in Gemma 3,
    whose local and global layers rotate with different bases); empty: the module has one set of frequencies."""
    zero_frequency_pairs: int = 0
    """Partial rotary, proportional layout (Gemma 4's global layers, partial_rotary_factor): the whole head (`dim`)
    is paired as full rotary pairs it, but the last `zero_frequency_pairs` of the dim/2 pairs turn at frequency 0 and
    pass through unchanged (with half pairing: the tail of each half, not the tail of the head); the exponents keep
    dim as their denominator, so the rotated pairs turn at the frequencies full rotary would give them."""

    def __post_init__(self) -> None:
        if self.unrotated_tail and self.zero_frequency_pairs:
            raise ValueError("partial rotary is either a leading layout (unrotated_tail) or a proportional one "
                             "(zero_frequency_pairs), not both")

    @property
    def pairs(self) -> int:
        return self.dim // 2

    @property
    def head_width(self) -> int:
        """The features of a head the rotation reads: the rotary features and the unrotated tail after them."""
        return self.dim + self.unrotated_tail

    @property
    def rotated_pairs(self) -> int:
        """The pairs that turn at a nonzero frequency."""
        return self.pairs - self.zero_frequency_pairs


# ------------------------------------------------------------------------------------------- the numbers

def yarn_bounds(o: RopeOptions) -> tuple[float, float]:
    """The ramp's correction dimensions j_low, j_high (pairs below j_low keep θ_j, above j_high are divided),
    rounded outward to whole pairs unless the config sets truncate: false."""
    def correction_dim(rotations: float) -> float:
        return o.dim * math.log(o.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(o.theta))

    low, high = correction_dim(o.beta_fast), correction_dim(o.beta_slow)
    if o.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, o.dim - 1)
    return low, high + 0.001 if low == high else high  # as the reference does, to avoid dividing by zero


def yarn_mscale(factor: float, m: float) -> float:
    return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0


def attention_factor(o: RopeOptions) -> float:
    """YaRN scales cos and sin by mscale(factor, mscale) / mscale(factor, mscale_all_dim); others by 1."""
    if o.kind != "yarn":
        return 1.0
    if o.mscale_all_dim:
        return yarn_mscale(o.factor, o.mscale) / yarn_mscale(o.factor, o.mscale_all_dim)
    return yarn_mscale(o.factor, 1.0)


def inverse_frequencies(run: Run, o: RopeOptions, device: torch.device) -> torch.Tensor:
    """ω_j for each rotary pair, recording θ_j (and YaRN's ramp γ_j)."""
    theta = 1.0 / (o.theta ** (torch.arange(0, o.dim, 2, device=device).float() / o.dim))
    if o.zero_frequency_pairs:  # proportional partial rotary: the trailing pairs keep angle 0
        theta = torch.cat([theta[:o.rotated_pairs], torch.zeros(o.zero_frequency_pairs, device=device)])
    theta = run.rec("theta", theta)
    if o.kind == "linear":
        return run.rec("inv-freq", theta / o.factor)
    if o.kind == "yarn":
        low, high = yarn_bounds(o)
        ramp = run.rec("ramp", torch.clamp((torch.arange(o.pairs, device=device).float() - low) / (high - low), 0, 1))
        return run.rec("inv-freq", ramp * theta / o.factor + (1 - ramp) * theta)
    if o.kind == "llama3":
        return run.rec("inv-freq", _llama3(theta, o))
    return run.rec("inv-freq", theta)  # default, and dynamic within its original context


def _llama3(theta: torch.Tensor, o: RopeOptions) -> torch.Tensor:
    wavelength = 2 * math.pi / theta
    context = o.original_max_position_embeddings
    blend = (context / wavelength - o.low_freq_factor) / (o.high_freq_factor - o.low_freq_factor)
    blended = (1 - blend) * theta / o.factor + blend * theta
    long = wavelength > context / o.low_freq_factor
    short = wavelength < context / o.high_freq_factor
    return torch.where(long, theta / o.factor, torch.where(short, theta, blended))


def rotary_angles(run: Run, o: RopeOptions, positions: torch.Tensor) -> torch.Tensor:
    """R_t: the angle t·ω_j of every position and rotary pair, [T, pairs]."""
    omega = inverse_frequencies(run, o, positions.device)
    return run.rec("angles", positions.float()[:, None] * omega[None, :])


def rotate(x: torch.Tensor, angles: torch.Tensor, o: RopeOptions) -> torch.Tensor:
    """Rotate each pair by its angle, with cos and sin scaled by the variant's attention factor.

    Adjacent pairs come out as rotated evens then odds, as the reference's interleaved variant lays them out (q and
    k share the layout, so q·k is unchanged). angles: [T, pairs]; x: [T, d], [B, T, d] or [B, T, H, d].
    """
    if x.shape[-1] > o.dim:  # leading partial rotary (unrotated_tail): the features after the first `dim` pass
        return torch.cat([rotate(x[..., :o.dim], angles, o), x[..., o.dim:]], dim=-1)
    factor = attention_factor(o)
    cos, sin = (angles.cos() * factor).to(x.dtype), (angles.sin() * factor).to(x.dtype)
    if x.dim() == 3:
        cos, sin = cos[None], sin[None]
    elif x.dim() == 4:
        cos, sin = cos[None, :, None], sin[None, :, None]
    if o.pairing == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., :o.pairs], x[..., o.pairs:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


# ------------------------------------------------------------------------------------------------- spec

TITLES = {"default": "Rotary position embedding", "linear": "Rotary position embedding (linear scaling)",
          "dynamic": "Rotary position embedding (dynamic NTK scaling)",
          "llama3": "Rotary position embedding (Llama 3 scaling)", "yarn": "YaRN rotary position embedding"}


def rope(ctx: Ctx, o: RopeOptions, *, code: str, prefix: str = "", ranges: tuple[IndexRange, ...] = (),
         buffer: bool = False, citations: tuple[Citation, ...] = (), key: str = "rope") -> Component:
    """The rotary angles a block's attention uses; `buffer`: a checkpoint may store inv_freq under `prefix`."""
    pairs = Dim("pairs", o.pairs)
    angles = Port(ctx_colour("R"), Shape((T, pairs)), "R")
    steps = (*frequency_steps(o),
             Step(rf"{ctx_colour('R_t')}=\left(\cos t\omega_j,\ \sin t\omega_j\right)_{{j}}", angles.shape, "angles"),
             Step(_rotation_latex(o), Shape((T, Dim("d_rope", o.dim))), "rotate"))
    tensors = (TensorSpec(prefix + "rotary_emb.inv_freq", None, ranges, role="buffer", optional=True,
                          storage=Dense(ctx.dtype)),) if buffer else ()
    return Component(
        key=key, title=TITLES[o.kind], kind="computed", code=code, description=_description(o),
        inputs=(Port("t", Shape((T,)), "positions"),), outputs=(angles,),
        equations=tuple(s for s in steps if s.name in ("inv-freq", "angles")), steps=steps, tensors=tensors,
        extras=_extras(o), citations=citations + (_reference_citation(ctx, o),),
        row_label="Rotary embedding (computed)", program="rope", options=o, reference="model.rotary_emb",
    )


def frequency_steps(o: RopeOptions) -> tuple[Step, ...]:
    """θ_j and the frequencies ω_j the angles turn at (YaRN's ramp between), for a layer that computes its own."""
    pairs = Dim("pairs", o.pairs)
    return (Step(_theta_latex(o), Shape((pairs,)), "theta"), *_frequency_steps(o, pairs))


def _theta_latex(o: RopeOptions) -> str:
    full = rf"\theta_j={fmt_num(o.theta)}^{{-2j/{o.dim}}}"
    if not o.zero_frequency_pairs:
        return rf"{full},\quad j=0,\dots,{o.pairs - 1}"
    rotated = o.rotated_pairs
    return (rf"\theta_j=\begin{{cases}}{fmt_num(o.theta)}^{{-2j/{o.dim}}} & j<{rotated}\\ 0 & {rotated}\le j<"
            rf"{o.pairs}\end{{cases}}")


def _reference_citation(ctx: Ctx, o: RopeOptions) -> Citation:
    if o.zero_frequency_pairs:
        return Citation("transformers' proportional RoPE keeps int(partial_rotary_factor × head_dim / 2) frequencies "
                        "with exponents over the whole head_dim and pads the rest with zeros.", "transformers",
                        "_compute_proportional_rope_parameters", ROPE_UTILS_FILE)
    if o.kind == "default":  # the default frequencies live in the family's own rotary module
        return ctx.reference.cite("transformers computes the default inverse frequencies θ_j in the rotary module.",
                                  "RotaryEmbedding.compute_default_rope_parameters")
    return Citation(f"transformers computes the {o.kind} inverse frequencies in its rope utilities.", "transformers",
                    _ROPE_FUNCTIONS[o.kind], ROPE_UTILS_FILE)


_ROPE_FUNCTIONS = {"linear": "_compute_linear_scaling_rope_parameters",
                   "dynamic": "_compute_dynamic_ntk_parameters", "llama3": "_compute_llama3_parameters",
                   "yarn": "_compute_yarn_parameters"}


def _frequency_steps(o: RopeOptions, pairs: Dim) -> tuple[Step, ...]:
    shape = Shape((pairs,))
    if o.kind == "yarn":
        low, high = yarn_bounds(o)
        return (Step(rf"\phi_j=\operatorname{{clamp}}\!\left(\frac{{j-j_{{\mathrm{{low}}}}}}{{j_{{\mathrm{{high}}}}"
                     rf"-j_{{\mathrm{{low}}}}}},0,1\right),\quad j_{{\mathrm{{low}}}}={fmt_num(low)},\ "
                     rf"j_{{\mathrm{{high}}}}={fmt_num(high)}", shape, "ramp"),
                Step(rf"\omega_j=\phi_j\,\frac{{\theta_j}}{{{fmt_num(o.factor)}}}+(1-\phi_j)\,\theta_j", shape,
                     "inv-freq"))
    if o.kind == "linear":
        return (Step(rf"\omega_j=\theta_j/{fmt_num(o.factor)}", shape, "inv-freq"),)
    if o.kind == "llama3":
        n = o.original_max_position_embeddings
        return (Step(rf"\omega_j=\begin{{cases}}\theta_j & \lambda_j<{n}/{fmt_num(o.high_freq_factor)}\\ "
                     rf"\theta_j/{fmt_num(o.factor)} & \lambda_j>{n}/{fmt_num(o.low_freq_factor)}\\ "
                     rf"(1-\phi_j)\,\theta_j/{fmt_num(o.factor)}+\phi_j\,\theta_j & \text{{otherwise}}\end{{cases}},"
                     rf"\quad \lambda_j=\frac{{2\pi}}{{\theta_j}},\ \phi_j=\frac{{{n}/\lambda_j-"
                     rf"{fmt_num(o.low_freq_factor)}}}{{{fmt_num(o.high_freq_factor)}-{fmt_num(o.low_freq_factor)}}}",
                     shape, "inv-freq"),)
    return (Step(r"\omega_j=\theta_j", shape, "inv-freq"),)


def _rotation_latex(o: RopeOptions) -> str:
    first, second = (r"x_{2j}", r"x_{2j+1}") if o.pairing == "interleaved" else ("x_{j}", rf"x_{{j+{o.pairs}}}")
    scale, factor = (r"a_{\mathrm{YaRN}}\,", _attention_factor_latex(o)) if attention_factor(o) != 1.0 else ("", "")
    rotation = (rf"\operatorname{{RoPE}}(x,R_t)_{{j}}={scale}\begin{{pmatrix}}\cos t\omega_j & -\sin t\omega_j\\ "
                rf"\sin t\omega_j & \cos t\omega_j\end{{pmatrix}}\begin{{pmatrix}}{first}\\ {second}\end{{pmatrix}}"
                + factor)
    if o.unrotated_tail:
        rotation += rf",\quad \operatorname{{RoPE}}(x,R_t)_{{i}}=x_{{i}}\ \ ({o.dim}\le i<{o.head_width})"
    return rotation


def _attention_factor_latex(o: RopeOptions) -> str:
    """YaRN's attention factor a, which multiplies cos and sin (so each q·k product by a²), as attention_factor
    computes it: 0.1·mscale·ln s + 1, over the same with mscale_all_dim where the config sets that."""
    s = fmt_num(o.factor)
    top = rf"0.1\cdot{fmt_num(o.mscale)}\ln {s}+1" if o.mscale_all_dim else rf"0.1\ln {s}+1"
    value = rf"{attention_factor(o):.6f}"
    if o.mscale_all_dim:
        return rf",\quad a_{{\mathrm{{YaRN}}}}=\frac{{{top}}}{{0.1\cdot{fmt_num(o.mscale_all_dim)}\ln {s}+1}}={value}"
    return rf",\quad a_{{\mathrm{{YaRN}}}}={top}={value}"


def _description(o: RopeOptions) -> str:
    pairs = "adjacent feature pairs" if o.pairing == "interleaved" else f"feature pairs (j, j + {o.pairs})"
    base = f"Rotate each of the {o.pairs} {pairs} by a position-dependent angle"
    if o.unrotated_tail:
        base = (f"Rotate only the first {o.dim} of each head's {o.head_width} features (partial rotary), as "
                f"{o.pairs} {pairs}, by a position-dependent angle; the other {o.unrotated_tail} pass through")
    elif o.zero_frequency_pairs:
        base = (f"Rotate the first {o.rotated_pairs} of the {o.pairs} {pairs} by a position-dependent "
                f"angle; the other {o.zero_frequency_pairs} pairs carry no position (partial rotary, "
                f"{o.rotated_pairs / o.pairs:g} of the pairs)")
    if o.kind == "yarn":
        return (f"Rotate each of the {o.pairs} pairs of rotary features by a position-dependent angle, with YaRN "
                f"stretching long wavelengths {fmt_num(o.factor)}× for a "
                f"{o.original_max_position_embeddings * o.factor:,.0f}-position context.")
    if o.kind == "llama3":
        return (f"{base}; long wavelengths are stretched {fmt_num(o.factor)}×, short ones kept, and those between "
                f"blended, extending the original {o.original_max_position_embeddings:,}-position context.")
    if o.kind == "linear":
        return f"{base}; every frequency is divided by {fmt_num(o.factor)} (positions interpolated)."
    if o.kind == "dynamic":
        return (f"{base}; beyond {o.original_max_position_embeddings:,} positions the base grows with the sequence "
                "(dynamic NTK); within it the angles are the default ones shown here.")
    return base + "."


def _extras(o: RopeOptions) -> tuple[tuple[str, str], ...]:
    out = [("base θ", fmt_num(o.theta))]
    if o.zero_frequency_pairs:
        out.append(("rotated pairs", f"{o.rotated_pairs} of {o.pairs}"))
    if o.kind != "default":
        out.append(("scaling factor", fmt_num(o.factor)))
    if o.kind == "yarn":
        out.append(("beta_fast / beta_slow", f"{fmt_num(o.beta_fast)} / {fmt_num(o.beta_slow)}"))
        if not o.truncate:
            out.append(("ramp bounds", "fractional (truncate: false), not rounded to whole pairs"))
    if o.kind == "llama3":
        out.append(("low / high frequency factor", f"{fmt_num(o.low_freq_factor)} / {fmt_num(o.high_freq_factor)}"))
    if o.kind in ("yarn", "llama3", "dynamic"):
        out.append(("original context", f"{o.original_max_position_embeddings:,}"))
    return tuple(out)


# -------------------------------------------------------------------------------------- program, check

@program("rope", rotary=True)
def run_rope(comp: Component, run: Run, positions: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, RopeOptions)
    angles = rotary_angles(run, o, positions)
    run.rec("rotate", rotate(torch.zeros(positions.shape[0], o.dim, device=positions.device), angles, o))
    return [angles]


@reference_call("rope")
def call_rope(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference's rotary module returns cos and sin over both halves, already scaled by its factor."""
    o = options(comp, RopeOptions)
    (positions,) = inputs
    out = reference_rotary(ref, o, torch.zeros(1, positions.shape[0], 1), positions[None])
    # Llama 4's rotary module returns the complex factors e^{i t ω_j} (times its scaling) instead of cos and sin
    cos, sin = (out.real, out.imag) if isinstance(out, torch.Tensor) and out.is_complex() else out
    factor = attention_factor(o)
    theirs = torch.cat([cos[0, :, :o.pairs], sin[0, :, :o.pairs]], dim=-1)
    return (torch.cat([ours.cos() * factor, ours.sin() * factor], dim=-1), theirs,
            f"cos and sin of {positions.shape[0]} × {o.pairs} angles")


def reference_rotary(rotary, o: RopeOptions, x: torch.Tensor, positions: torch.Tensor):
    """cos and sin from the reference's rotary module, for the layer type this rope stands for where it has several."""
    return rotary(x, positions, o.layer_type) if o.layer_type else rotary(x, positions)
