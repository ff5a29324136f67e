"""A shared expert behind a sigmoid gate (Qwen3.5-MoE): every token runs one SwiGLU MLP beside its routed experts,
and its output is scaled by σ(x·w_gate), a scalar per token from a one-output projection, before it joins the
routed sum. The MLP is the library's gated_mlp; this module adds the gate.

References: Qwen2 technical report (arXiv:2407.10671), section 2.2.3, for fine-grained experts with a shared expert;
transformers' models/qwen3_5_moe/modeling_qwen3_5_moe.py (Qwen3_5MoeSparseMoeBlock) for how the reference gates it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import Ctx, Run, program, run_child
from explorer.model.components.linear import linear
from explorer.model.components.mlp import gated_mlp
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step


def gated_shared_expert(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, width: str,
                        citations: tuple[Citation, ...]) -> Component:
    """y_shared = σ(x w_gate) · SwiGLU_shared(x); `prefix` is the MoE block's module ("...mlp.")."""
    w = ctx.size(width)
    s = Port(r"E_{\mathrm{sh}}", x.shape, "shared_mlp_out")
    mlp = gated_mlp(ctx, "shared_expert", "Shared expert", "Shared expert", prefix=prefix + "shared_expert.",
                    ranges=ranges, d_ff=ctx.sym(width), ff_dim=Dim("d_shared", w), x=x, y=s, sub=r"\mathrm{sh}",
                    description=f"A SwiGLU MLP of width {w:,} that every token runs.",
                    code=f"{ctx.reference.prefix}MLP(config, intermediate_size=shared_expert_intermediate_size)",
                    citations=citations)
    gate = linear(ctx, "shared_expert_gate", "Shared-expert gate", weight=prefix + "shared_expert_gate.weight",
                  ranges=ranges, d_in="hidden_size", d_out=1, out_dim=Dim("one", 1), x=x,
                  y=Port(r"\eta", ctx.tokens(Dim("one", 1)), "eta"), equation=rf"\eta={x.latex}w_{{\mathrm{{gate}}}}",
                  description=f"One logit per token from its {ctx.size('hidden_size'):,} features.",
                  code="nn.Linear(hidden_size, 1, bias=False)")
    out = Step(r"y^{\mathrm{shared}}=\sigma(\eta)\,E_{\mathrm{sh}}", x.shape, "gated")
    return Component(
        key="shared", title="Gated shared expert", crumb="Gated shared expert", kind="learned",
        code="shared_expert, shared_expert_gate", inputs=(x,), outputs=(Port(r"y^{\mathrm{shared}}", x.shape, "shared_out"),),
        description=f"A shared SwiGLU expert of width {w:,}, scaled per token by a sigmoid gate in (0, 1).",
        equations=(out,), steps=(*mlp.steps, gate.steps[0], out), children=(mlp, gate), citations=citations,
        program="gated_shared_expert", reference="-",
        notes=("The gate is a single scalar per token: it decides how much of the shared expert joins the routed "
               "experts' sum.",),
    )


def shared_gate(eta: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(eta)


@program("gated_shared_expert")
def run_gated_shared_expert(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    s = run_child(comp, "shared_expert", run, x)
    eta = run_child(comp, "shared_expert_gate", run, x)
    return [run.rec("gated", shared_gate(eta) * s)]


__all__ = ["gated_shared_expert"]
