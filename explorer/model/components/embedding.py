"""Token embedding (optionally scaled by √d), learned absolute positions, and the LM head (tied or not)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import B, Ctx, Run, T, fmt_num, options, program, run_child
from explorer.spec.types import Citation, Component, IndexRange, Port, Shape, Step


@dataclass(frozen=True, slots=True)
class EmbeddingOptions:
    scale: float = 1.0
    """Multiplier applied after the lookup (Gemma: √d, rounded to the model's dtype)."""


@dataclass(frozen=True, slots=True)
class HeadOptions:
    tied: bool = False


def embedding(ctx: Ctx, key: str, title: str, *, weight: str, ranges: tuple[IndexRange, ...] = (),
              scale: float = 1.0, citations: tuple[Citation, ...] = (), notes: tuple[str, ...] = ()) -> Component:
    """nn.Embedding(vocab_size, hidden_size): one row per token id, optionally scaled."""
    tokens = Port(r"t^{\mathrm{id}}", Shape((B, T)), "input_ids")
    x = Port("x_1", ctx.tokens("hidden_size"), "x")
    lookup = Step(r"x_1=E_{\mathrm{tok}}[t^{\mathrm{id}}]" if scale == 1.0 else
                  rf"x_1={fmt_num(scale)}\,E_{{\mathrm{{tok}}}}[t^{{\mathrm{{id}}}}]",
                  x.shape, "lookup")
    scaled = "" if scale == 1.0 else f", multiplied by {scale:.4g} (the square root of the width)"
    return Component(
        key=key, title=title, kind="learned", code="nn.Embedding(vocab_size, hidden_size)",
        description=f"Look up a {ctx.size('hidden_size'):,}-feature vector for each of {ctx.size('vocab_size'):,} "
                    f"token ids{scaled}.",
        inputs=(tokens,), outputs=(x,), equations=(lookup,), steps=(lookup,),
        tensors=(ctx.tensor(weight, ranges, (ctx.sym("vocab_size"), ctx.sym("hidden_size"))),),
        citations=citations, notes=notes, program="embedding", options=EmbeddingOptions(scale),
    )


def sqrt_width_scale(hidden_size: int, dtype: str) -> float:
    """Gemma's embedding scale √d, as the reference computes it: rounded to the model's dtype."""
    exact = math.sqrt(hidden_size)
    return bfloat16_round(exact) if dtype == "BF16" else exact


def bfloat16_round(x: float) -> float:
    """A finite float as torch.tensor(x, dtype=torch.bfloat16) holds it: to float32, then to the nearest bfloat16
    (the top 16 bits), ties to even; worked here so a cached build builds specs without importing torch."""
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    bits += 0x7FFF + ((bits >> 16) & 1)
    return struct.unpack("<f", struct.pack("<I", (bits >> 16) << 16))[0]


def head(ctx: Ctx, key: str, title: str, *, weight: str, ranges: tuple[IndexRange, ...] = (), tied_to: str = "",
         citations: tuple[Citation, ...] = ()) -> Component:
    """The bias-free projection to vocabulary logits, stored on its own or tied to the token embedding."""
    x = Port(r"\hat x", ctx.tokens("hidden_size"), "x")
    logits = Port(r"\ell", ctx.tokens("vocab_size"), "logits")
    matrix = r"E_{\mathrm{tok}}^{\top}" if tied_to else r"W_{\mathrm{vocab}}"
    step = Step(rf"\ell=\hat x\,{matrix}", logits.shape, "logits")
    tie_text = (f"tied to the token embedding ({tied_to}): the same matrix, stored and counted once" if tied_to
                else "not tied to the embedding")
    notes = ((f"Tied: this head reads {tied_to}, so the checkpoint stores no tensor of its own and its parameters "
              "are counted once, in the token embedding.",) if tied_to else
             ("This projection has no bias parameter.", "The reference module holds the weight output by input, [out, in]."))
    return Component(
        key=key, title=title, kind="learned", code="nn.Linear(hidden_size, vocab_size, bias=False)",
        description=f"Project {ctx.size('hidden_size'):,} features to {ctx.size('vocab_size'):,} next-token logits; "
                    f"{tie_text}.",
        inputs=(x,), outputs=(logits,), equations=(step,), steps=(step,),
        tensors=(ctx.tensor(weight, ranges, (ctx.sym("vocab_size"), ctx.sym("hidden_size")), tied_to=tied_to),),
        citations=citations, notes=notes, program="head", options=HeadOptions(bool(tied_to)),
    )


def lookup(run: Run, ids: torch.Tensor, module: str, opts: EmbeddingOptions) -> torch.Tensor:
    x = F.embedding(ids, run.w(module + "weight"))
    return x * torch.tensor(opts.scale, dtype=x.dtype) if opts.scale != 1.0 else x


@program("embedding", role="Token embedding")
def run_embedding(comp: Component, run: Run, ids: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec("lookup", lookup(run, ids, "", options(comp, EmbeddingOptions)))]


@program("head", role="LM head")
def run_head(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec("logits", F.linear(x, run.w("weight")))]


# ------------------------------------------------------------------------------------ learned positions

def positions(ctx: Ctx, key: str, title: str, *, weight: str, citations: tuple[Citation, ...] = ()) -> Component:
    """nn.Embedding(max_position_embeddings, hidden_size): one learned vector per absolute position 0..T-1."""
    pos = Port("t", Shape((T,)), "positions")
    y = Port(r"x^{\mathrm{pos}}", Shape((T, ctx.dim("hidden_size"))), "P")
    step = Step(r"x^{\mathrm{pos}}_t=E_{\mathrm{pos}}[t],\quad t=0,\dots,T-1", y.shape, "positions")
    return Component(
        key=key, title=title, kind="learned", code="nn.Embedding(max_position_embeddings, hidden_size)",
        description=f"Look up a learned {ctx.size('hidden_size'):,}-feature vector for each position, up to "
                    f"{ctx.size('max_position_embeddings'):,} positions: absolute positions, learned, no rotation.",
        inputs=(pos,), outputs=(y,), equations=(step,), steps=(step,),
        tensors=(ctx.tensor(weight, (), (ctx.sym("max_position_embeddings"), ctx.sym("hidden_size"))),),
        citations=citations, program="positions",
    )


@program("positions", role="Position embedding")
def run_positions(comp: Component, run: Run, pos: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec("positions", F.embedding(pos, run.w("weight")))]


def embedding_with_positions(ctx: Ctx, tokens: Component, pos: Component, *, citations: tuple[Citation, ...]
                             ) -> Component:
    """x_1 = E_tok[t^id] + E_pos[0..T-1]: the token embedding plus learned absolute positions (GPT-2's wte + wpe)."""
    x = Port("x_1", ctx.tokens("hidden_size"), "x")
    total = Step(r"x_1=E_{\mathrm{tok}}[t^{\mathrm{id}}]+x^{\mathrm{pos}}", x.shape, "embed-sum")
    return Component(
        key="embed", title="Token and position embeddings", crumb="Embeddings", kind="learned",
        code="wte(input_ids) + wpe(position_ids)",
        description=f"Add a learned position vector to each token's {ctx.size('hidden_size'):,}-feature embedding.",
        inputs=tokens.inputs, outputs=(x,), equations=(total,), steps=(*tokens.steps, *pos.steps, total),
        children=(tokens, pos), citations=citations, program="embedding_with_positions", reference="-",
    )


@program("embedding_with_positions")
def run_embedding_with_positions(comp: Component, run: Run, ids: torch.Tensor) -> list[torch.Tensor]:
    tok = run_child(comp, comp.children[0].key, run, ids)
    pos = run_child(comp, comp.children[1].key, run, torch.arange(ids.shape[1], device=ids.device))
    return [run.rec("embed-sum", tok + pos)]
