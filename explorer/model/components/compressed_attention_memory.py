"""What DeepSeek-V4's compressed attention keeps while serving (its part is explorer/model/components/
compressed_attention.py, which had no room left under 600 lines): per stream (sliding window, compressed, indexer),
the entries per token, and the compressors' pending positions and overlap state, as the reference's cache holds them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from explorer.model.components.compressed_attention import CompressorOptions, IndexerOptions, V4AttentionOptions
from explorer.model.components.serving import LayerKind, layer_memory
from explorer.spec.types import Component

# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("v4_attention")
def v4_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """One shared key-value vector per position in the window; with a compressor, one entry of head_dim per `ratio`
    positions, kept for the whole context; with the indexer, its own keys of index_head_dim per entry. Per token of
    context a stream costs entry / ratio elements (exact for Flash's widths; floored otherwise)."""
    o = comp.options
    assert isinstance(o, V4AttentionOptions)
    per_key = 2 * o.heads * 2 * o.head_dim  # scores and the weighted sum, every head, over one shared vector
    compressor = next((c for c in comp.children if c.key == "compressor"), None)
    # the reference's compressed layers hold one tensor as keys and values (Deepseek V4's HCA cache: values = keys);
    # a layer without a compressor is a plain sliding layer there, whose value tensor is a copy of the keys
    copies = 1 if compressor is not None else 2
    out = [LayerKind(copies * o.head_dim, "head_dim (one vector is the key and the value)" if copies == 1 else
                     "2 × head_dim (the key and a copy of it as the value)", flops_per_key=per_key,
                     mha_per_token=2 * o.heads * o.head_dim, window=o.window, stream="window", by_kind=True,
                     stream_title="sliding window",
                     note=f"The window branch: one {o.head_dim}-element vector per position, the last {o.window:,} "
                          "positions kept" + ("." if copies == 1 else
                                              "; held twice, as keys and as values, as the reference's plain "
                                              "sliding cache stores them."))]
    if compressor is None:
        return tuple(out)
    co = compressor.options
    assert isinstance(co, CompressorOptions)
    m = co.ratio
    index = next((c.options for c in compressor.children if isinstance(c.options, IndexerOptions)), None)
    out.append(LayerKind(o.head_dim // m, f"head_dim / {m}", flops_per_key=per_key, ratio=m, entry=o.head_dim,
                         topk=index.topk if index else None, stream="compressed", by_kind=True, stream_title="compressed stream",
                         note=f"One {o.head_dim}-element entry per {m} positions, kept for the whole context"
                              + (f"; a query reads at most {index.topk:,} of them (the indexer's top-k)." if index
                                 else "; a query reads all of them.") + _buffer_note(co),
                         pending=_pending(co, o.head_dim), overlap=_overlap(co, o.head_dim)))
    if index is not None:
        out.append(LayerKind(index.head_dim // m, f"index_head_dim / {m}", flops_per_key=2 * index.heads * index.head_dim,
                             ratio=m, entry=index.head_dim, stream="indexer", by_kind=True, stream_title="indexer keys",
                             note=f"The lightning indexer's own {index.head_dim}-element key per {m} positions, "
                                  "scored for every query." + _buffer_note(index.compressor),
                             pending=_pending(index.compressor, index.head_dim),
                             overlap=_overlap(index.compressor, index.head_dim)))
    return tuple(out)


def _pending(co: CompressorOptions, width: int) -> int:
    """What a compressor holds per position not yet pooled (the reference's DeepseekV4HCACache buffer_kv and
    buffer_gate): its projected values and gates, s × width each (s = 2 series with overlapping windows)."""
    return 2 * (2 if co.overlap else 1) * width


def _overlap(co: CompressorOptions, width: int) -> int:
    """With overlapping windows, the last pooled window's first series of values and gates, ratio × width each,
    carried to the next window (DeepseekV4CSACache's overlap_kv and overlap_gate); none otherwise."""
    return 2 * co.ratio * width if co.overlap else 0


def _buffer_note(co: CompressorOptions) -> str:
    series = "2 × " if co.overlap else ""
    return (f" Beside the entries, the positions not yet pooled (context mod {co.ratio}) wait as projected values and "
            f"gates ({series}width each)" + (f", and the last window's first series of values and gates ({co.ratio} × "
                                            "width each) is carried to the next, overlapping window." if co.overlap
                                            else "."))
