"""Multi-token-prediction layers a config declares and transformers does not build (issue 35): the checkpoint stores
them (transformers' loader skips their tensors by name), so what the site calls stored counts them. Each family
builds one module from its own block builder and the module's own norms and projections (the formula the family
uses for its main layers), here assembled into a DeclaredMTP that the ledger counts apart from the main model.

A module is never run: no reference implements it, so it has no trace, no executed check and no page; its tensor
names are those the family's builders give, not the checkpoint's (its `basis` says where the checkpoint keeps them).
"""

from __future__ import annotations

from explorer.model.components import Ctx
from explorer.model.components.linear import linear
from explorer.model.components.norms import Gain, rmsnorm
from explorer.spec.types import Component, DeclaredMTP, Dim, Port


def mtp_norm(ctx: Ctx, key: str, title: str, name: str, eps: float, gain: Gain = "w") -> Component:
    """One RMSNorm of hidden_size features (the embedding's, the hidden state's, the head's)."""
    x = Port("x", ctx.tokens("hidden_size"), "x")
    return rmsnorm(ctx, key, title, weight=name, ranges=(), size="hidden_size", x=x, y=Port("y", x.shape, "y"),
                   code="-", eps=eps, gain=gain)


def mtp_projection(ctx: Ctx, key: str, title: str, name: str, inputs: int) -> Component:
    """A bias-free projection of `inputs` × hidden_size features (the concatenated embedding and hidden state: 2;
    one of them: 1) back to hidden_size, in the model's storage scheme."""
    d_in = inputs * ctx.sym("hidden_size")
    width = Dim(f"{inputs}d", inputs * ctx.size("hidden_size")) if inputs > 1 else ctx.dim("hidden_size")
    return linear(ctx, key, title, weight=name, ranges=(), d_in=d_in, d_out="hidden_size",
                  out_dim=ctx.dim("hidden_size"), x=Port("x", ctx.tokens(width), "x"),
                  y=Port("y", ctx.tokens("hidden_size"), "y"), equation="y=xW", description=title + ".", code="-")


def declared_mtp(key: str, count: int, parts: tuple[Component, ...], basis: str) -> DeclaredMTP | None:
    """`count` modules of `parts` (a decoder block and the module's own tensors), declared by config key `key`."""
    if count <= 0:
        return None
    module = Component(key="mtp", title="Multi-token-prediction module", kind="learned", code="-",
                       description=basis, children=parts, row_label="Multi-token-prediction modules")
    return DeclaredMTP(key, count, module, basis)
