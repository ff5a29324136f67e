"""Chunked attention: the sequence is cut into fixed chunks of `chunk` positions and a query attends causally
within its own chunk only, so the keys a layer keeps are capped at the chunk (Llama 4's RoPE layers,
attention_chunk_size).

References: "The Llama 4 herd" (Meta AI blog, April 2025) for interleaved chunked and global attention;
transformers' masking_utils.py (chunked_overlay, create_chunked_causal_mask) for the reference mask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import Dim
from explorer.spec.types import Citation, Shape, Step

QUERIES, KEYS = Dim("queries", symbol="T"), Dim("keys", symbol="T")
MASK_CITATION = Citation("The chunked mask keeps key s for query t only when both fall in the same chunk "
                         "(s // chunk_size == t // chunk_size) and s <= t.", "transformers", "chunked_overlay",
                         "masking_utils.py")


def chunk_step(chunk: int) -> Step:
    """M_ts: 0 where key s is causal and in query t's chunk, -inf elsewhere."""
    return Step(rf"M_{{ts}}=\begin{{cases}}0 & s\le t,\ \lfloor s/{chunk:,}\rfloor=\lfloor t/{chunk:,}\rfloor\\ "
                rf"-\infty & \text{{otherwise}}\end{{cases}}", Shape((QUERIES, KEYS)), "chunk")


def chunk_mask(M: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """Add -inf where the key lies in an earlier chunk than the query."""
    if not chunk:
        return M
    t = torch.arange(M.shape[-1], device=M.device)
    other_chunk = (t[:, None] // chunk) != (t[None, :] // chunk)
    return M.masked_fill(other_chunk, float("-inf"))

