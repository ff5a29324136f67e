"""What the steps must show of the factors applied by the feed-forward networks (dense MLPs, mixtures of experts and
their routers), the projections and LM head, and the vision towers: registered into step_terms, which checks them.

Vision options are shared by several programs (a tower, its blocks, its attention, its patch embedding); each term
names the programs that apply it, so that each component shows what its own program applies.
"""

from __future__ import annotations

from explorer.model.components.activated_clamp import ActivatedClampExpertsOptions, ActivatedClampOptions
from explorer.model.components.base import fmt_eps, fmt_num
from explorer.model.components.deepstack import DeepStackOptions
from explorer.model.components.embedding import HeadOptions
from explorer.model.components.gemma4_vision import Gemma4VisionOptions
from explorer.model.components.linear import LinearOptions
from explorer.model.components.mlp import Activation, MLPOptions
from explorer.model.components.moe import MoEOptions
from explorer.model.components.moonvit import MoonViTOptions
from explorer.model.components.parallel_moe import HalvesExpertsOptions, ScaledRouterOptions
from explorer.model.components.qwen_vision import VisionOptions
from explorer.model.components.relu2_experts import Relu2Options
from explorer.model.components.scaled_routed_moe import ScaledRoutedMoEOptions
from explorer.model.components.sigmoid_moe import InputGatedExpertsOptions, SigmoidTopKOptions
from explorer.model.components.step_terms import Term, registers, switched_by
from explorer.model.components.vision import PatchOptions, ProjectorOptions, VisionAttentionOptions

ACT_MARKS: dict[Activation, tuple[str, ...]] = {
    "silu": (r"\sigma(", r"\operatorname{SiLU}("),
    "gelu_tanh": (r"\operatorname{GELU}_{\tanh}(",),
    "gelu": (r"\operatorname{GELU}(",),
}
"""How a step names each activation: the tanh GELU and the exact one by different LaTeX, so that a step showing the
wrong one fails."""


def _act(step: str, act: Activation) -> Term:
    first, *others = ACT_MARKS[act]
    return Term("act", step, first, also=tuple(others))


def _top(k: int) -> str:
    return rf"\operatorname{{top}}_{{{k}}}"


# --------------------------------------------------------------------------------------- feed-forward networks

@registers(MLPOptions, structural=("gated",))  # gated: which program runs (gated_mlp or plain_mlp), read by neither
def _mlp(o: MLPOptions) -> tuple[Term, ...]:
    if o.limit is None:  # a plain MLP names its activation step "gelu" whatever the activation
        return (_act("silu" if o.gated and o.act == "silu" else "gelu", o.act),)
    lim = f"{o.limit:g}"  # the clamped SwiGLU: min(g, limit) for the gate, clamp(u, -limit, limit) for the up value
    terms: tuple[Term, ...] = (_act("glu", "silu"), Term("limit", "clamp", rf",{lim}),\quad"),
                               Term("limit", "clamp", f",-{lim},{lim})"))
    if o.alpha != 1.0:  # the gate's sigmoid gain (SwiGLU-OAI's 1.702)
        terms += (Term("alpha", "glu", rf"\sigma({o.alpha:g}\,"),)
    if o.up_shift:  # the up value shifted before the product
        terms += (Term("up_shift", "product", f"+{o.up_shift:g})"),)
    return terms


def _activated_clamp(limit: float) -> tuple[Term, ...]:
    """min(a, L) for the activated gate, clamp(u, -L, L) for the up value (activated_clamp.py)."""
    lim = fmt_num(limit)
    return Term("limit", "clamp", rf",{lim}),\quad"), Term("limit", "clamp", f",-{lim},{lim})")


@registers(ActivatedClampOptions)
def _activated_clamp_mlp(o: ActivatedClampOptions) -> tuple[Term, ...]:
    return _activated_clamp(o.limit)


@registers(ActivatedClampExpertsOptions, structural=("experts",))
def _activated_clamp_experts(o: ActivatedClampExpertsOptions) -> tuple[Term, ...]:
    return _activated_clamp(o.limit)


@registers(ScaledRoutedMoEOptions)
def _scaled_routed_moe(o: ScaledRoutedMoEOptions) -> tuple[Term, ...]:
    return (Term("scale", "moe-out", fmt_num(o.scale) + r"\,y^{\mathrm{routed}}"),) if o.scale != 1.0 else ()


@registers(MoEOptions, structural=("clamped",))  # clamped: the experts' step names (their own options apply it)
def _moe(o: MoEOptions) -> tuple[Term, ...]:
    act: tuple[Term, ...] = (_act("expert-glu" if o.clamped else "expert-silu" if o.act == "silu" else "expert-gelu", o.act),)
    if o.routed_scaling != 1.0:  # the routed sum's scale, applied by the MoE block (MiniMax-M3)
        act += (Term("routed_scaling", "routed-sum", fmt_num(o.routed_scaling) + r"\,\sum"),)
    return (*act, Term("shared", "moe-out", r"+y^{\mathrm{shared}}")) if o.shared else act


@registers(HalvesExpertsOptions, structural=("experts", "in_out"))  # in_out: the stored orientation
def _halves_experts(o: HalvesExpertsOptions) -> tuple[Term, ...]:
    return (_act("product", o.act),)


@registers(InputGatedExpertsOptions, structural=("experts",))
def _input_gated_experts(o: InputGatedExpertsOptions) -> tuple[Term, ...]:
    return (_act("product", o.act),)


@registers(Relu2Options, structural=("width",))
def _relu2(o: Relu2Options) -> tuple[Term, ...]:
    return ()  # ReLU(u)² has no parameter; the width is the shapes'


@registers(ScaledRouterOptions, structural=("experts",))
def _scaled_router(o: ScaledRouterOptions) -> tuple[Term, ...]:
    return Term("k", "select", _top(o.k)), Term("eps", "router-norm", fmt_eps(o.eps))


@registers(SigmoidTopKOptions, structural=("experts",))
def _sigmoid_topk(o: SigmoidTopKOptions) -> tuple[Term, ...]:
    return (Term("k", "select", _top(o.k)),)


# ------------------------------------------------------------------------------------- projections and head

@registers(LinearOptions, structural=("layout",))  # layout: how the weight is stored; xW either way
def _linear(o: LinearOptions) -> tuple[Term, ...]:
    return (Term("bias", "", "+b"),) if o.bias else ()


@registers(HeadOptions)
def _head(o: HeadOptions) -> tuple[Term, ...]:
    return (Term("tied", "logits", r"E_{\mathrm{tok}}^{\top}" if o.tied else r"W_{\mathrm{vocab}}"),)


# ------------------------------------------------------------------------------------------- vision towers

@registers(PatchOptions)
def _patch(o: PatchOptions) -> tuple[Term, ...]:
    return (Term("patch", "patches", rf"{o.patch}\times{o.patch}"),)


@registers(ProjectorOptions)
def _projector(o: ProjectorOptions) -> tuple[Term, ...]:
    k = o.patches_per_side // o.tokens_per_side
    return (Term("patches_per_side", "pool", rf"{o.patches_per_side}^2\to"),
            Term("tokens_per_side", "pool", rf"\to{o.tokens_per_side}^2"),
            Term("tokens_per_side", "pool", rf"\operatorname{{AvgPool}}_{{{k}\times{k}}}"))


# the heads are named by their range, "1, …, H", whatever letter the page gives the head index
@registers(VisionAttentionOptions)
def _vision_attention(o: VisionAttentionOptions) -> tuple[Term, ...]:
    return Term("heads", "attend", rf"1,\dots,{o.heads}"), Term("head_dim", "attend", rf"\sqrt{{{o.head_dim}}}")


QWEN_ATTENTION = ("qwen_vision_attention", "qwen_vision_block")
QWEN_TOWER = "qwen_vision_tower"


@registers(VisionOptions)
def _qwen_vision(o: VisionOptions) -> tuple[Term, ...]:
    return (Term("side", "positions", rf"[{o.side}\,\operatorname{{row}}(i)+\operatorname{{col}}(i)]",
                 programs=("qwen_positions", QWEN_TOWER)),
            Term("merge", "concat", rf"\hat \psi_{{{o.merge ** 2}i}}", programs=("qwen_merger", QWEN_TOWER)),
            Term("heads", "attend", rf"1,\dots,{o.heads}", programs=QWEN_ATTENTION),
            Term("head_dim", "attend", rf"\sqrt{{{o.head_dim}}}", programs=QWEN_ATTENTION),
            Term("head_dim", "rotate", f"-4j/{o.head_dim}", programs=QWEN_ATTENTION),
            Term("theta", "rotate", f"{o.theta:g}^", programs=QWEN_ATTENTION))


MOONVIT_ATTENTION = ("moonvit_attention", "moonvit_block")


@registers(MoonViTOptions)
def _moonvit(o: MoonViTOptions) -> tuple[Term, ...]:
    g = o.grid
    return (Term("grid", "positions", rf"\to{g.h}\times{g.w}", programs=("moonvit_patch_embed", "moonvit_tower")),
            Term("grid", "merge", rf"i<{g.merge_h},\,j<{g.merge_w}", programs=("moonvit_tower",)),
            Term("heads", "attend", rf"1,\dots,{o.heads}", programs=MOONVIT_ATTENTION),
            Term("head_dim", "attend", rf"\sqrt{{{o.head_dim}}}", programs=MOONVIT_ATTENTION),
            Term("head_dim", "rotate", f"j<{o.head_dim // 4}", programs=MOONVIT_ATTENTION),
            Term("rope_theta", "rotate", f"{o.rope_theta:g}^", programs=MOONVIT_ATTENTION))


GEMMA4_BLOCK = ("gemma4_vision_block",)
GEMMA4_TOWER = ("gemma4_vision_tower",)


@registers(Gemma4VisionOptions)
def _gemma4_vision(o: Gemma4VisionOptions) -> tuple[Term, ...]:
    out = [Term("eps", "embedding_pre_projection_norm", fmt_eps(o.eps), programs=("gemma4_vision_embedder",)),
           Term("eps", "qkv-norm", fmt_eps(o.eps), programs=GEMMA4_BLOCK),
           Term("heads", "attend", rf"1,\dots,{o.heads}", programs=GEMMA4_BLOCK),
           Term("head_dim", "rotate", f"-4j/{o.head_dim}", programs=GEMMA4_BLOCK),
           Term("theta", "rotate", f"{o.theta:g}^", programs=GEMMA4_BLOCK),
           Term("grid_width", "positions", rf"i\bmod {o.grid_width}", programs=("gemma4_patch_embed", *GEMMA4_TOWER)),
           Term("pool", "pool", rf"\operatorname{{AvgPool}}_{{{o.pool}\times{o.pool}}}", programs=GEMMA4_TOWER)]
    if o.standardize:
        out.append(Term("standardize", "standardize", r"b_{\mathrm{std}}", programs=GEMMA4_TOWER))
    return tuple(out)


for cls, names in ((MLPOptions, ("limit", "alpha", "up_shift")), (MoEOptions, ("shared", "routed_scaling")),
                   (LinearOptions, ("bias",)), (Gemma4VisionOptions, ("standardize",)), (ScaledRoutedMoEOptions, ("scale",))):
    switched_by(cls, *names)


@registers(DeepStackOptions)
def _deepstack(o: DeepStackOptions) -> tuple[Term, ...]:
    """A merger concatenates merge² patches; the stack adds one feature after each of the first levels layers."""
    return (Term("merge", "concat", rf"\psi_{{n+1,{o.merge ** 2}i}}", programs=("deepstack_merger",)),
            Term("vision_layers", "inject", rf"n=0,\dots,{o.levels - 1}", programs=("deepstack_stack",)))
