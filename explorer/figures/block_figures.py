"""The block figure of each block kind: the block's parts in the order data passes through them, grouped into the
branches that the residual stream adds back (or, over hyper-connected streams, mixes back), each part with its
parameters per block from the ledger; drawn on the block's page and side by side on compare pages.

The branches follow the block's children: a branch ends at each part that is neither a norm nor a hyper-connection
(the attention or other token mixer, the feed-forward), together with the norms right after it (a post-norm), so
a pre-norm block reads [norm, attention] [norm, MLP], Gemma's [norm, attention, post-norm] [norm, MLP, post-norm],
OLMo 2's [attention, post-norm] [MLP, post-norm], a hybrid's one [norm, mixer], DeepSeek-V4's [hyper-connection,
norm, attention] [hyper-connection, norm, MoE]. A part's kind is its compare row (base.COMPARISON_ROLES), so no
part's program is named here.
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.model.account import Ledger
from explorer.model.components.base import COMPARISON_ROLES
from explorer.model.components.blocks import block_layers
from explorer.model.components.part_facts import facts
from explorer.spec.types import Component, ModelSpec, path_key, walk

NORMS, STREAM_MIXING, ATTENTION = "Norms", "Hyper-connections", "Attention"
"""The compare rows of the parts a branch carries besides its body (explorer/figures/compare_roles.py ROLES)."""


@dataclass(frozen=True, slots=True)
class BlockPart:
    """One child of the block, as the figure draws it."""

    path: str
    """The part's page (component path)."""
    title: str
    role: str
    """Its compare row ("Attention", "Mixture of experts", "Norms", ...); "" for a part with none."""
    params: int
    """Parameters per block, from the ledger."""
    token_mixer: bool
    heads: tuple[int, int] | None = None
    """An attention's (query heads, key-value heads), as its scores child runs them; None for any other part."""
    norm: str = ""
    """A norm's kind ("rms", "layer"); "" for any other part."""


@dataclass(frozen=True, slots=True)
class Branch:
    parts: tuple[BlockPart, ...]
    mixes_streams: bool
    """Added back by a hyper-connection that mixes the streams, not by a plain residual add."""


@dataclass(frozen=True, slots=True)
class BlockFigure:
    path: str
    """The block kind's page."""
    title: str
    layers: tuple[int, ...]
    """The layers of this kind, 0-based as the tensor names count them."""
    branches: tuple[Branch, ...]
    params: int
    """Parameters per block (the ledger's per-instance count)."""
    total: int
    """Over every block of this kind (the ledger's total)."""
    own_params: int
    """Parameters the block holds itself, outside its parts (0 for every block built so far)."""
    model_layers: int
    """Layers in the whole stack (for "every layer except …")."""


def block_figures(spec: ModelSpec, ledger: Ledger) -> tuple[BlockFigure, ...]:
    """The figure of every block kind of the model's main stack, in the spec's order."""
    kinds = _block_kinds(spec)
    layers = sum(len(block_layers(b)) for _, b in kinds)
    return tuple(block_figure(ledger, ancestors, block, layers) for ancestors, block in kinds)


def _block_kinds(spec: ModelSpec) -> list[tuple[tuple[Component, ...], Component]]:
    stack = spec.root.child("blocks")
    return [(a, c) for a, c in walk(spec.root) if a and a[-1] is stack]


def block_figure(ledger: Ledger, ancestors: tuple[Component, ...], block: Component,
                 model_layers: int) -> BlockFigure:
    """The figure of one block kind, its numbers the ledger's."""
    path = path_key(ancestors, block)
    acc = ledger.accounts[path]
    parts = [_part(ledger, f"{path}.{c.key}", c) for c in block.children]
    own = acc.per_instance - sum(p.params for p in parts)
    return BlockFigure(path, block.title, block_layers(block), branches(parts), acc.per_instance, acc.total, own,
                       model_layers)


def _part(ledger: Ledger, path: str, c: Component) -> BlockPart:
    role = COMPARISON_ROLES.get(c.program, "")
    return BlockPart(path, c.title, role, ledger.accounts[path].per_instance, facts(c.program).token_mixer,
                     _heads(c) if role == ATTENTION else None, str(getattr(c.options, "kind", "")) if role == NORMS
                     else "")


def _heads(attention: Component) -> tuple[int, int] | None:
    """(heads, kv_heads) of the attention's scores child: its own fields, or its layer shape's (a layer kind
    sized on its own, Gemma 4's)."""
    scores = next((c for c in attention.children if c.key == "scores"), None)
    o = scores.options if scores is not None else attention.options
    sized = getattr(o, "shape", o)
    heads, kv_heads = getattr(sized, "heads", None), getattr(sized, "kv_heads", None)
    return (heads, kv_heads) if isinstance(heads, int) and isinstance(kv_heads, int) else None


def branches(parts: list[BlockPart]) -> tuple[Branch, ...]:
    """Group the parts into residual branches, each closing after a body part (neither a norm nor a hyper-connection)
    and its post-norms. The norms between two bodies are post-norms in a block that opens with its body (OLMo 2),
    else all but the last, which opens the next branch as its pre-norm (none in Llama, one in Gemma)."""
    post_style = next((not _carried(p) for p in parts if p.role != STREAM_MIXING), False)
    groups: list[list[BlockPart]] = []
    current: list[BlockPart] = []
    i = 0
    while i < len(parts):
        current.append(parts[i])
        if _carried(parts[i]):
            i += 1
            continue
        j = i + 1
        while j < len(parts) and parts[j].role == NORMS:
            j += 1
        norms = parts[i + 1:j]
        keep = norms if post_style or j == len(parts) else norms[:-1]
        groups.append(current + keep)
        current = list(norms[len(keep):])
        i = j
    if current:
        groups.append(current)
    return tuple(Branch(tuple(g), any(p.role == STREAM_MIXING for p in g)) for g in groups)


def _carried(p: BlockPart) -> bool:
    """A part a branch carries around its body (a norm, a hyper-connection), not the body itself."""
    return p.role in (NORMS, STREAM_MIXING)
