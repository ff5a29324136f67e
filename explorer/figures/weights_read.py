"""Bytes of weights one decoded token reads, per weight format: the speed bounds' numerator (explorer/figures/fits.py).

A token reads every matrix it multiplies, at its stored dtype: the dense weights, the router and shared experts, the
routed experts k of N, the whole LM head (a tied head reads the embedding's matrix again), and of the embedding one
row, not the table. Multi-token-prediction modules and image encoders are left out (they do not run for a decoded
text token). Bytes counted here are never more than a token reads, so bandwidth ÷ them stays an upper bound.
"""

from __future__ import annotations

from explorer.model.account import Ledger
from explorer.spec.types import ModelSpec, path_key, walk


def subtree_stored_bytes(ledger: Ledger, path: str) -> int:
    """Stored bytes of the weights of a component and everything under it: values and their scales, tied tensors
    once where they are stored, buffers (causal masks, rotary tables) left out, as a token's matmuls do not read them
    from memory whole."""
    return sum(ta.spec.count * st.nbytes for p, acc in ledger.accounts.items()
               if p == path or p.startswith(path + ".") or path == ""
               for ta in acc.tensors for st in ta.stored if not ta.spec.tied_to and st.role != "buffer")


def read_as_stored(spec: ModelSpec, ledger: Ledger, routed: dict[str, str], skipped: tuple[str, ...],
                   tied_head: bool) -> int:
    """Stored bytes one decoded token reads. `routed`: MoE program -> the key of its routed experts' child;
    `skipped`: programs that do not run for a text token (MTP, vision). Each embedding table counts one row (its
    bytes ÷ its rows, rounded down), and the token table whole again where the head is tied to it."""
    total = subtree_stored_bytes(ledger, "")
    for ancestors, comp in walk(spec.root):
        path = path_key(ancestors, comp)
        if any(a.program in skipped for a in ancestors):
            continue  # already taken out with its ancestor
        if comp.program in skipped:
            total -= subtree_stored_bytes(ledger, path)
        elif comp.program in routed:
            o = next(c for c in comp.children if c.key == "router").options
            assert hasattr(o, "experts") and hasattr(o, "k")  # RouterOptions or a library router's own options
            experts = subtree_stored_bytes(ledger, f"{path}.{routed[comp.program]}")
            total -= experts * (o.experts - o.k) // o.experts
    if "embed" in ledger.accounts:
        rows, tables = embedding_rows(ledger)
        total += rows - (0 if tied_head else tables) - (tables - max_table(ledger, spec) if tied_head else 0)
    return total


def _embedding_tensors(ledger: Ledger) -> list[tuple[int, int]]:
    """(bytes, rows) of each stored tensor under the embedding (the token table, GPT-2's position table)."""
    return [(ta.spec.count * st.nbytes, st.shape[0] if st.shape else 1) for p, acc in ledger.accounts.items()
            if p == "embed" or p.startswith("embed.") for ta in acc.tensors for st in ta.stored
            if not ta.spec.tied_to and st.role != "buffer"]


def embedding_rows(ledger: Ledger) -> tuple[int, int]:
    """(bytes of one row of each embedding table, rounded down; bytes of all of them): a token looks one row up."""
    tensors = _embedding_tensors(ledger)
    return sum(b // max(1, r) for b, r in tensors), sum(b for b, _ in tensors)


def max_table(ledger: Ledger, spec: ModelSpec) -> int:
    """Bytes of the token embedding table (vocab_size rows), which a tied LM head reads whole."""
    return sum(b for b, r in _embedding_tensors(ledger) if r == vocab_size(spec))


def read_params(matmul: int, embed: int, spec: ModelSpec) -> int:
    """Parameters one decoded token reads: every one it multiplies (`matmul`) and one row of the embedding."""
    return matmul + (embed // vocab_size(spec) if embed else 0)


def vocab_size(spec: ModelSpec) -> int:
    values = spec.values
    return int(values.get("vocab_size") or values["text_config.vocab_size"])
