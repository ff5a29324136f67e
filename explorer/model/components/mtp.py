"""Multi-token prediction (DeepSeek-V3): a module stored after the main layers that predicts one token further
ahead from the main model's last hidden state and the next token's embedding.

The concatenation order follows the reference code that runs these weights: transformers' DeepSeek-V3 code
skips the module, so the spec follows the checkpoint's own description; see the family's citations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import B, Ctx, Run, T, layers, options, program
from explorer.model.components.blocks import PROGRAMS, angles_for, causal_mask
from explorer.model.components.embedding import embedding, head
from explorer.model.components.linear import linear
from explorer.model.components.norms import NormOptions, apply_norm, rmsnorm
from explorer.spec.types import Citation, Component, Dim, Port, Shape, Step


def mtp(ctx: Ctx, *, first_layer: int, count: int, block: Component, eps: float,
        citations: tuple[Citation, ...]) -> Component:
    """`count` MTP modules at layers first_layer..; `block` is a decoder block built over those layer indices."""
    indices = tuple(range(first_layer, first_layer + count))
    ranges = layers(indices)
    p = "model.layers.{layer}."
    d = ctx.size("hidden_size")
    h = Port("x_{L,i}", ctx.tokens("hidden_size"), "h")
    cat = Port(r"[e';h']", ctx.tokens(Dim("2d", 2 * d)), "concat")
    embed = embedding(ctx, "embed", "MTP token embedding", weight=p + "embed_tokens.weight", ranges=ranges,
                      notes=("Stored as a tensor of its own under the MTP layer's prefix.",))
    enorm = rmsnorm(ctx, "enorm", "Embedding RMSNorm", weight=p + "enorm.weight", ranges=ranges, size="hidden_size",
                    x=Port(r"E_{\mathrm{tok}}[t^{\mathrm{id}}_{i+1}]", h.shape, "e"), y=Port("e'", h.shape, "e_norm"), code="self.enorm(embeds)", eps=eps)
    hnorm = rmsnorm(ctx, "hnorm", "Hidden-state RMSNorm", weight=p + "hnorm.weight", ranges=ranges, size="hidden_size",
                    x=h, y=Port("h'", h.shape, "h_norm"), code="self.hnorm(hidden)", eps=eps)
    eh = linear(ctx, "eh_proj", "Combining projection", weight=p + "eh_proj.weight", ranges=ranges,
                d_in=2 * ctx.sym("hidden_size"), d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=cat,
                y=Port(r"x_{\mathrm{mtp}}", h.shape, "x_mtp"), equation=r"x_{\mathrm{mtp}}=[e';h']\,W_{M}",
                description=f"Project the concatenated {2 * d:,} features (normalised embedding first, then the "
                            f"normalised hidden state) back to {d:,}.", code="self.eh_proj(torch.cat([e, h], -1))")
    norm = rmsnorm(ctx, "head_norm", "MTP head RMSNorm", weight=p + "shared_head.norm.weight", ranges=ranges,
                   size="hidden_size", x=Port(r"x_{L}", h.shape, "x"), y=Port(r"\hat x", h.shape, "x_hat"),
                   code="self.norm(hidden_states)", eps=eps)
    out = head(ctx, "head", "MTP output head", weight=p + "shared_head.head.weight", ranges=ranges)
    steps = (
        Step(r"h'=\operatorname{RMSNorm}(x_{L,i}),\quad e'=\operatorname{RMSNorm}(E_{\mathrm{tok}}[t^{\mathrm{id}}_{i+1}])", h.shape,
             "norms"),
        eh.steps[0],
        Step(r"h^{\mathrm{mtp}}=\operatorname{Block}(x_{\mathrm{mtp}})", h.shape, "block"),
        Step(r"\ell^{\mathrm{mtp}}=\operatorname{RMSNorm}(h^{\mathrm{mtp}})\,W_{\mathrm{vocab}}",
             ctx.tokens("vocab_size"), "logits"),
    )
    return Component(
        key="mtp", title="Multi-token prediction module", kind="learned", code="model.layers.{num_hidden_layers + k}",
        description="Predicts one token further ahead from the main model's last hidden state and the next token's "
                    "embedding; stored in the checkpoint, skipped by transformers when it loads the model.",
        repeat=count, repeat_label="MTP modules" if count != 1 else "MTP module", repeat_formula="num_nextn_predict_layers",
        crumb=f"{count} MTP module" + ("s" if count != 1 else ""),
        inputs=(h, Port(r"t^{\mathrm{id}}_{i+1}", Shape((B, T)), "next_ids")),
        outputs=(Port(r"\ell^{\mathrm{mtp}}", ctx.tokens("vocab_size"), "logits"),),
        equations=steps, steps=steps, children=(embed, enorm, hnorm, eh, block, norm, out), citations=citations,
        notes=("Its weights are counted in what the checkpoint stores, and shown apart from the main model.",
               "Concatenation order: the normalised embedding first, then the normalised hidden state, as inference "
               "code that runs these weights (vLLM's DeepSeek MTP module) concatenates them; the DeepSeek-V3 report "
               "writes the hidden state first. transformers does not run this module, so no executed check backs "
               "either order here."),
        program="mtp", reference="-",
    )


@program("mtp", role="Multi-token prediction", mtp=True, whole_model=True,
         layout="multi-token-prediction")
def run_mtp(comp: Component, run: Run, h: torch.Tensor, next_ids: torch.Tensor) -> list[torch.Tensor]:
    block = comp.child("block")
    layer = next(r.values[0] for t in block.children[0].tensors for r in t.ranges if r.var == "layer")
    m = run.child(f"model.layers.{layer}.")
    e = torch.nn.functional.embedding(next_ids, m.w("embed_tokens.weight"))
    h_n = apply_norm(m, "norms", h, options(comp.child("hnorm"), NormOptions), "hnorm.")
    e_n = apply_norm(m, "_enorm", e, options(comp.child("enorm"), NormOptions), "enorm.")
    x = m.rec("eh_proj", torch.nn.functional.linear(torch.cat([e_n, h_n], dim=-1), m.w("eh_proj.weight")))
    T_ = h.shape[1]
    positions = torch.arange(T_, device=h.device)
    (y,) = PROGRAMS[block.program](block, m.child(prefix="_"), x, angles_for(block, positions), causal_mask(T_, h.device))
    m.rec("block", y)
    y_hat = apply_norm(m, "_head_norm", y, options(comp.child("head_norm"), NormOptions), "shared_head.norm.")
    return [m.rec("logits", torch.nn.functional.linear(y_hat, m.w("shared_head.head.weight")))]
