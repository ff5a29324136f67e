"""Feed-forward networks: gated MLPs (SwiGLU, GeGLU: down(act(gate x) ⊙ up x)) and the plain two-layer MLP
(GPT-2: proj(GELU(x W_fc + b_fc)) + b_proj).

References: "GLU Variants Improve Transformer" (arXiv:2002.05202); GPT-2 (Radford et al., 2019).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import sympy

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import Ctx, Run, options, program, run_child
from explorer.model.components.linear import linear
from explorer.spec.types import Citation, Component, Dim, IndexRange, Layout, Port, Shape, Step

Activation = Literal["silu", "gelu_tanh", "gelu"]
ACT_LATEX = {"silu": r"a=g\,\sigma(g)", "gelu_tanh": r"a=\operatorname{GELU}_{\tanh}(g)",
             "gelu": r"a=\operatorname{GELU}(g)"}
ACT_OPERATOR = {"silu": r"\operatorname{SiLU}", "gelu_tanh": r"\operatorname{GELU}_{\tanh}",
                "gelu": r"\operatorname{GELU}"}
"""Each activation as an operator, act(g), for steps that apply it to a named value."""


def _indexed(sub: str) -> tuple[str, str, str, str, str]:
    """g, u, a, m and the weight index for a gated MLP; routed experts carry their expert index (g_i, W_{1,i})."""
    if not sub:
        return "g", "u", "a", "m", ""
    return f"g_{{{sub}}}", f"u_{{{sub}}}", f"a_{{{sub}}}", f"m_{{{sub}}}", f",{sub}"
ACT_NAMES = {"silu": "SiLU", "gelu_tanh": "GELU (tanh approximation)", "gelu": "GELU"}


@dataclass(frozen=True, slots=True)
class MLPOptions:
    act: Activation
    gated: bool = True
    limit: float | None = None
    """Clamp the gate from above and the up value on both sides at this value (DeepSeek-V4's swiglu_limit)."""
    alpha: float = 1.0
    """The clamped SwiGLU's sigmoid gain: a = ĝ σ(α ĝ) (MiniMax-M3's swiglu_alpha, 1.702)."""
    up_shift: float = 0.0
    """Added to the clamped up value before the product (1 in MiniMax-M3's SwiGLU-OAI, as in gpt-oss)."""


def activation(g: torch.Tensor, act: Activation) -> torch.Tensor:
    if act == "silu":
        return g * torch.sigmoid(g)
    if act == "gelu_tanh":
        return 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g.pow(3))))
    return F.gelu(g)


def clamped_glu(g: torch.Tensor, u: torch.Tensor, limit: float, alpha: float = 1.0, shift: float = 0.0,
                rec=None) -> torch.Tensor:
    """(clamp(u, ±limit) + shift) · ĝ σ(α ĝ) with ĝ = min(g, limit): the clamped SwiGLU of gpt-oss's experts (α 1.702,
    shift 1) and of DeepSeek-V4's experts and shared expert (α 1, shift 0); records clamp, glu and product via rec."""
    rec = rec or (lambda _name, t: t)
    g, u = rec("clamp", g.clamp(max=limit)), u.clamp(-limit, limit)
    a = rec("glu", g * torch.sigmoid(alpha * g))
    return rec("product", (u + shift) * a)


def gated_mlp(ctx: Ctx, key: str, title: str, crumb: str, *, prefix: str, ranges: tuple[IndexRange, ...],
              d_ff: sympy.Expr, ff_dim: Dim, x: Port, y: Port, description: str, code: str,
              citations: tuple[Citation, ...], act: Activation = "silu", names: tuple[str, str, str] = (
                  "gate_proj", "up_proj", "down_proj"), sub: str = "", limit: float | None = None,
              alpha: float = 1.0, up_shift: float = 0.0) -> Component:
    """down(act(gate x) ⊙ up x): three bias-free projections; `names` are their module names in the checkpoint,
    `sub` an index on every symbol (the routed expert i, the shared expert "sh"); with `limit`, the clamped SwiGLU
    (ĝ = min(g, limit), û = clamp(u, ±limit), a = ĝ σ(α ĝ), m = a ⊙ (û + up_shift))."""
    gs, us, as_, ms, ws = _indexed(sub)
    g = Port(gs, ctx.tokens(ff_dim), "g")
    h = Port(ms, ctx.tokens(ff_dim), "h")
    d = ctx.size("hidden_size")
    gate_n, up_n, down_n = names
    gate = linear(ctx, gate_n, "Gate projection", weight=prefix + gate_n + ".weight", ranges=ranges, d_in="hidden_size",
                  d_out=d_ff, out_dim=ff_dim, x=x, y=g, equation=rf"{gs}={x.latex}W_{{1{ws}}}", code=f"self.{gate_n}(x)",
                  description=f"Project {d:,} features to {ff_dim.size:,} gate pre-activations.")
    up = linear(ctx, up_n, "Up projection", weight=prefix + up_n + ".weight", ranges=ranges, d_in="hidden_size",
                d_out=d_ff, out_dim=ff_dim, x=x, y=Port(us, ctx.tokens(ff_dim), "u"), equation=rf"{us}={x.latex}W_{{3{ws}}}",
                code=f"self.{up_n}(x)", description=f"Project {d:,} features to {ff_dim.size:,} values that the gate "
                                                  "multiplies.")
    down = linear(ctx, down_n, "Down projection", weight=prefix + down_n + ".weight", ranges=ranges, d_in=d_ff,
                  d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=h, y=y, equation=rf"{y.latex}={ms}W_{{2{ws}}}",
                  code=f"self.{down_n}(self.act_fn(self.{gate_n}(x)) * self.{up_n}(x))",
                  description=f"Map {ff_dim.size:,} gated features back to {d:,} features.")
    act_name = "silu" if act == "silu" else "gelu"
    act_latex = ACT_LATEX[act].replace("(g)", f"({gs})").replace("a=g", f"{as_}={gs}").replace("a=", f"{as_}=")
    steps: tuple[Step, ...] = (gate.steps[0], up.steps[0], Step(act_latex, g.shape, act_name),
                               Step(rf"{ms}={as_}\odot {us}", h.shape, "product"), down.steps[0])
    if limit is not None:  # the clamped SwiGLU: the activation reads the clamped gate, the product the clamped up
        lim = f"{limit:g}"
        steps = (gate.steps[0], up.steps[0],
                 Step(rf"\hat {gs}=\min({gs},{lim}),\quad \hat {us}=\operatorname{{clamp}}({us},-{lim},{lim})", g.shape,
                      "clamp"),
                 Step(clamped_glu_latex(as_, gs, alpha), g.shape, "glu"),
                 Step(rf"{ms}={as_}\odot " + (rf"(\hat {us}+{up_shift:g})" if up_shift else rf"\hat {us}"), h.shape,
                      "product"), down.steps[0])
    glu = "SiLU" if act == "silu" else "GELU"
    return Component(
        key=key, title=title, crumb=crumb, kind="learned", code=code, description=description, inputs=(x,),
        outputs=(y,),
        equations=(Step(rf"{y.latex}=\left(\operatorname{{{glu}}}({x.latex}W_1)\odot {x.latex}W_3\right)W_2", y.shape,
                        "swiglu"),),
        steps=steps, children=(gate, up, down), citations=citations, program="gated_mlp",
        options=MLPOptions(act, limit=limit, alpha=alpha, up_shift=up_shift),
    )


def clamped_glu_latex(a: str, g: str, alpha: float) -> str:
    """a = ĝ σ(ĝ), or a = ĝ σ(α ĝ) where the gate's sigmoid has a gain."""
    gain = f"{alpha:g}" + r"\," if alpha != 1.0 else ""
    return rf"{a}=\hat {g}\,\sigma({gain}\hat {g})"


def gated(run: Run, comp: Component, x: torch.Tensor, act: Activation) -> torch.Tensor:
    """The gated MLP's steps, recorded under the children's names."""
    gate_c, up_c, down_c = comp.children
    g = run_child(comp, gate_c.key, run, x)
    u = run_child(comp, up_c.key, run, x)
    o = options(comp, MLPOptions)
    if o.limit is not None:
        return run_child(comp, down_c.key, run, clamped_glu(g, u, o.limit, o.alpha, o.up_shift, rec=run.rec))
    a = run.rec("silu" if act == "silu" else "gelu", activation(g, act))
    h = run.rec("product", a * u)
    return run_child(comp, down_c.key, run, h)


@program("gated_mlp", role="Feed-forward (dense)", dense_mlp=True, layout="swiglu", ffn_heading="SwiGLU MLP:")
def run_gated_mlp(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec("swiglu", gated(run, comp, x, options(comp, MLPOptions).act))]


def plain_mlp(ctx: Ctx, key: str, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, y: Port,
              names: tuple[str, str], act: Activation, bias: bool, layout: Layout,
              citations: tuple[Citation, ...]) -> Component:
    """proj(act(x W_fc + b_fc)) + b_proj, as GPT-2's c_fc and c_proj."""
    fc_n, proj_n = names
    ff = Dim("d_ff", ctx.size("intermediate_size"))
    h = Port("m", ctx.tokens(ff), "h")
    d = ctx.size("hidden_size")
    b1, b2 = (r"+b_{\mathrm{fc}}", r"+b_{\mathrm{proj}}") if bias else ("", "")
    fc = linear(ctx, fc_n, "Expansion", weight=prefix + fc_n + ".weight", ranges=ranges, d_in="hidden_size",
                d_out="intermediate_size", out_dim=ff, x=x, y=Port("g", ctx.tokens(ff), "g"),
                equation=rf"g={x.latex}W_{{\mathrm{{fc}}}}{b1}", code=f"self.{fc_n}(hidden_states)", bias=bias,
                layout=layout, description=f"Expand {d:,} features to {ff.size:,}.")
    proj = linear(ctx, proj_n, "Projection back", weight=prefix + proj_n + ".weight", ranges=ranges,
                  d_in="intermediate_size", d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=h, y=y,
                  equation=rf"{y.latex}=mW_{{\mathrm{{proj}}}}{b2}", code=f"self.{proj_n}(hidden_states)", bias=bias,
                  layout=layout, description=f"Project {ff.size:,} activated features back to {d:,}.")
    steps = (fc.steps[0], Step(ACT_LATEX[act].replace("a=", "m="), h.shape, "gelu"), proj.steps[0])
    return Component(
        key=key, title="MLP", kind="learned", code="MLP(intermediate_size, config)",
        description=f"Expand to {ff.size:,} features, apply {ACT_NAMES[act]}, and project back to {d:,}.",
        inputs=(x,), outputs=(y,),
        equations=(Step(rf"{y.latex}=\operatorname{{GELU}}({x.latex}W_{{\mathrm{{fc}}}}{b1})W_{{\mathrm{{proj}}}}{b2}",
                        y.shape, "mlp"),),
        steps=steps, children=(fc, proj), citations=citations, program="plain_mlp", options=MLPOptions(act, False),
    )


def tower_mlp(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, y: Port, hidden: Shape,
              sizes: tuple[str, str], names: tuple[str, str], calls: tuple[str, str], code: str,
              citations: tuple[Citation, ...]) -> Component:
    """fc2(GELU_tanh(fc1 x + b1)) + b2, the MLP of the vision towers (SigLIP, MoonViT, Qwen3.5's): `sizes` the config
    keys of the width and the expanded width, `hidden` the expanded activations' shape, `names` the two linears,
    `calls` how the reference calls them."""
    D, F_ = ctx.sym(sizes[0]), ctx.sym(sizes[1])
    ff, d = ctx.dim(sizes[1]), ctx.size(sizes[0])
    g = Port("g", hidden, "g")
    fc1 = linear(ctx, names[0], "Expansion", weight=prefix + names[0] + ".weight", ranges=ranges, d_in=D, d_out=F_,
                 out_dim=ff, x=x, y=g, equation=rf"g={x.latex}W_1+b_1", code=calls[0], bias=True,
                 description=f"Expand {d:,} features to {ff.size:,}.")
    fc2 = linear(ctx, names[1], "Projection back", weight=prefix + names[1] + ".weight", ranges=ranges, d_in=F_,
                 d_out=D, out_dim=ctx.dim(sizes[0]), x=Port("m", g.shape, "h"), y=y, equation=rf"{y.latex}=mW_2+b_2",
                 code=calls[1], bias=True, description=f"Project {ff.size:,} features back to {d:,}.")
    steps = (fc1.steps[0], Step(r"m=\operatorname{GELU}_{\tanh}(g)", g.shape, "gelu"), fc2.steps[0])
    return Component(
        key="mlp", title="MLP", kind="learned", code=code,
        description=f"Expand to {ff.size:,} features, apply GELU (tanh approximation), project back to {d:,}.",
        inputs=(x,), outputs=(y,),
        equations=(Step(rf"{y.latex}=\operatorname{{GELU}}_{{\tanh}}({x.latex}W_1+b_1)W_2+b_2", y.shape, "mlp"),),
        steps=steps, children=(fc1, fc2), citations=citations, program="plain_mlp",
        options=MLPOptions("gelu_tanh", False),
    )


@program("plain_mlp", role="Feed-forward (dense)", dense_mlp=True, ffn_heading="MLP:")
def run_plain_mlp(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    fc_c, proj_c = comp.children
    g = run_child(comp, fc_c.key, run, x)
    h = run.rec("gelu", activation(g, options(comp, MLPOptions).act))
    return [run.rec("mlp", run_child(comp, proj_c.key, run, h))]
