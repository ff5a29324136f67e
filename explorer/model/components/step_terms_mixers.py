"""The terms of the token mixers' options (attention in its variants, MLA, compressed attention and its indexer,
hyper-connections, linear-attention and state-space mixers, and the blocks around them): for each, the factors its
program applies and the step that names each, or why a field is structural. See step_terms.py for the mechanism.

A norm an options class carries (a QK-norm, MLA's latent norms) is named in the layer's steps by its operator and
gain; its eps is shown by the norm's own component, whose options must equal it (nested_mismatches, which
tests/test_step_terms_mixers.py runs on every model).
"""

from __future__ import annotations

from explorer.model.components import dsa
from explorer.model.components.attention import AttentionOptions
from explorer.model.components.base import fmt_eps, fmt_num, k, options, q, v
from explorer.model.components.block_sparse_attention import BlockIndexerOptions
from explorer.model.components.blocks import BlockOptions
from explorer.model.components.compressed_attention import CompressorOptions, IndexerOptions, V4AttentionOptions
from explorer.model.components.fused_attention import FusedAttentionOptions
from explorer.model.components.fused_qkv_attention import split_widths
from explorer.model.components.gated_attention import GatedAttentionOptions
from explorer.model.components.gated_deltanet import DeltaNetOptions
from explorer.model.components.head_gated_attention import HeadGatedAttentionOptions
from explorer.model.components.hyper_connections import HyperOptions
from explorer.model.components.index_share import SharedSelectionOptions
from explorer.model.components.kda import KDAOptions
from explorer.model.components.layer_attention import LayerAttentionOptions, scores_options
from explorer.model.components.layer_blocks import LayerBlockOptions
from explorer.model.components.mamba2 import Mamba2Options
from explorer.model.components.mla import MLAOptions
from explorer.model.components.mrope import MRopeOptions
from explorer.model.components.norms import GAIN_SUBSCRIPT, NormOptions
from explorer.model.components.post_norm_block import PostNormBlockOptions
from explorer.model.components.rope import RopeOptions
from explorer.model.components.step_terms import SWITCHES, TERMS, Term, for_programs, registers
from explorer.spec.types import Component


def norm_operator(n: NormOptions) -> str:
    """How a layer's steps name the norm `n` applies: RMSNorm with its gain's subscript, or LayerNorm."""
    if n.kind == "layer":
        return r"\operatorname{LayerNorm}("
    return rf"\operatorname{{RMSNorm}}{GAIN_SUBSCRIPT[n.gain]}("


def _qk_norm_terms(field: str, n: NormOptions) -> tuple[Term, ...]:
    return (Term(field, "q_norm", norm_operator(n)), Term(field, "k_norm", norm_operator(n)))


NESTED_NORMS: dict[type, dict[str, tuple[str, ...]]] = {
    AttentionOptions: {"qk_norm": ("q_norm", "k_norm")},
    GatedAttentionOptions: {"qk_norm": ("q_norm", "k_norm")},
    HeadGatedAttentionOptions: {"qk_norm": ("q_norm", "k_norm")},
    MLAOptions: {"norm": ("q_a_layernorm", "kv_a_layernorm")},
    SharedSelectionOptions: {"norm": ("q_a_layernorm", "kv_a_layernorm")},
    LayerAttentionOptions: {"norm": ("q_norm", "k_norm")},
    V4AttentionOptions: {"eps": ("q_a_norm", "kv_norm")},
    dsa.IndexerOptions: {"norm_eps": ("k_norm",)},
    BlockIndexerOptions: {"norm": ("q_norm", "k_norm")},
}
"""Options class -> its norm field (a NormOptions, or an eps) -> the children whose own steps show that norm's eps
(the program applies the field, or builds the child from it; the page shows the child: they must agree)."""


def nested_mismatches(comp: Component) -> list[str]:
    """Each child norm whose options differ from the norm comp's program applies in its place; each compressor (or
    indexer) of a V4 layer whose rotary differs from the layer's, whose steps show its frequencies; and attention.py
    scores whose options are not the ones their layer's options give."""
    out = []
    for field, keys in NESTED_NORMS.get(type(comp.options), {}).items():
        applied = getattr(comp.options, field)
        for child in (c for c in comp.children if c.key in keys and applied is not None):
            shown = options(child, NormOptions).eps if isinstance(applied, float) else child.options
            if shown != applied:
                out.append(f"{child.key} shows {shown!r}, the program applies {applied!r}")
    if isinstance(comp.options, V4AttentionOptions):
        out += _compressor_rope_mismatches(comp, comp.options.rope)
    if isinstance(comp.options, LayerAttentionOptions) and comp.options.part == "shaped_attention":
        shown, applied = comp.child("scores").options, scores_options(comp.options)
        if shown != applied:
            out.append(f"scores show {shown!r}, the layer's options give {applied!r}")
    return out


def _compressor_rope_mismatches(layer: Component, rope: RopeOptions) -> list[str]:
    compressors = [c for c in layer.children if c.key == "compressor"]
    ropes = [options(c, CompressorOptions).rope for c in compressors] + [
        options(i, IndexerOptions).compressor.rope for c in compressors for i in c.children if i.key == "indexer"]
    return [f"a compressor rotates with {r!r}, the layer's steps show {rope!r}" for r in ropes if r != rope]


# ---------------------------------------------------------------------------------------------- attention

@registers(AttentionOptions, structural=("heads", "kv_heads", "head_dim"), switches=("qk_norm",))
def _attention(o: AttentionOptions) -> tuple[Term, ...]:
    """heads, kv_heads, head_dim only reshape (the shapes show them); the KV repeat is the scores child's."""
    return _qk_norm_terms("qk_norm", o.qk_norm) if o.qk_norm is not None else ()


@registers(GatedAttentionOptions, structural=("heads", "kv_heads"))
def _gated_attention(o: GatedAttentionOptions) -> tuple[Term, ...]:
    """head_dim splits each head's query projection into its queries and its gates."""
    return (Term("head_dim", "heads", rf"{o.head_dim}+1:{2 * o.head_dim}"), *_qk_norm_terms("qk_norm", o.qk_norm))


@registers(HeadGatedAttentionOptions, structural=("heads", "kv_heads", "head_dim"))
def _head_gated_attention(o: HeadGatedAttentionOptions) -> tuple[Term, ...]:
    """The sizes only reshape (the shapes show them; the KV repeat and the window are the scores child's); the
    per-head gate σ(g_h) is the head-gate step's."""
    return (*_qk_norm_terms("qk_norm", o.qk_norm),)


@registers(FusedAttentionOptions)
def _fused_attention(o: FusedAttentionOptions) -> tuple[Term, ...]:
    """heads × head_dim is where the fused projection splits into q, k and v."""
    w = o.heads * o.head_dim
    return (Term("heads", "split", f"{w}:{2 * w}"), Term("head_dim", "split", f"{w}:{2 * w}"))


def _layer_scores_terms(o: LayerAttentionOptions) -> list[Term]:
    hd = o.shape.qk_head_dim
    out = [Term("scale", "scale", f"{o.scale:.6f}" if abs(o.scale - hd ** -0.5) < 1e-12 else rf"\tau={o.scale:g}")]
    if o.shape.groups > 1:
        out.append(Term("shape", "repeat", rf"\lceil h/{o.shape.groups}\rceil"))
    if o.chunk:
        out.append(Term("chunk", "chunk", rf"\lfloor s/{o.chunk:,}\rfloor"))
    elif o.window:
        out.append(Term("window", "window", f"<{o.window:,}"))
    return out


@registers(LayerAttentionOptions, structural=("part",),
           switches=("shape", "scale", "window", "chunk", "sinks", "rope", "qk_norm", "norm", "eps", "keys_as_values",
                     "value_norm", "value_scale", "temperature"))
def _layer_attention(o: LayerAttentionOptions) -> tuple[Term, ...]:
    """The layer_attention part's steps include its scores'; the shaped_attention part's leave the scale, the KV
    repeat, the window and the sinks to its scores child (attention.py's, built from these options and run by the
    program with its own, whose ScoresOptions terms check them). A layer_scores child carries its layer's options
    but applies only the KV repeat, the scale and the mask. The RMS QK-norm runs over each whole projection
    (across_heads, on q and k before the split) or over each head (per_head, on Q and K), with the q_norm child's
    options (nested_mismatches checks they are `norm`); eps is the value norm's and the L2 norms'."""
    return (*for_programs(("layer_attention", "layer_scores"), _layer_scores_terms(o)),
            *for_programs(("layer_attention", "shaped_attention", "fused_qkv_attention"), _layer_own_terms(o)),
            *for_programs(("fused_qkv_attention",), _fused_split_terms(o)))


def _fused_split_terms(o: LayerAttentionOptions) -> list[Term]:
    """The fused projection splits at heads·d_head and heads·d_head + kv_heads·d_head (fused_qkv_attention.py)."""
    wq, wk, _ = split_widths(o)
    return [Term("shape", "qkv-split", f"{wq}:{wq + wk}")]


def _layer_own_terms(o: LayerAttentionOptions) -> list[Term]:
    out = []
    if o.keys_as_values:
        out.append(Term("keys_as_values", "values", f"{v('V')}={k('K')}"))
    if o.qk_norm in ("per_head", "across_heads") and o.norm is not None:
        q_in, k_in = (q("q"), k("k")) if o.qk_norm == "across_heads" else (q("Q"), k("K"))
        out += [Term("qk_norm", "q_norm", f"({q_in})"), Term("qk_norm", "k_norm", f"({k_in})"),
                *_qk_norm_terms("norm", o.norm)]
    if o.value_norm:
        out += [Term("value_norm", "v_norm", r"\operatorname{mean}"), Term("eps", "v_norm", fmt_eps(o.eps))]
    if o.value_scale != 1.0:
        out.append(Term("value_scale", "v-scale", rf"{fmt_num(o.value_scale)}\,{v('V')}"))
    if o.rope:
        out += [Term("rope", s, r"\operatorname{RoPE}") for s in ("q-rotate", "k-rotate")]
    if o.qk_norm == "l2":
        out += [Term(f, s, x) for s in ("q-l2", "k-l2")
                for f, x in (("qk_norm", r"\operatorname{mean}"), ("eps", fmt_eps(o.eps)))]
    if o.temperature is not None:
        t = o.temperature
        out += [Term("temperature", "temperature", rf"1+{t.attn_scale:g}\,\ln"),
                Term("temperature", "temperature", f"{{{t.floor_scale:,}}}")]
    return out


# ---------------------------------------------------------------------------------------------- MLA

@registers(MLAOptions, structural=("heads", "kv_lora_rank", "nope", "rope", "v"), switches=("q_lora_rank",))
def _mla(o: MLAOptions) -> tuple[Term, ...]:
    """kv_lora_rank, nope, rope and v are where the program splits the latents and heads (the shapes show them);
    q_lora_rank chooses the query path through a normed latent."""
    out = [Term("norm", "kv-norm", norm_operator(o.norm))]
    if o.q_lora_rank is not None:
        out += [Term("q_lora_rank", "q-down", "W_{DQ}"), Term("norm", "q-norm", norm_operator(o.norm))]
    return tuple(out)


@registers(SharedSelectionOptions, structural=("heads", "kv_lora_rank", "nope", "rope", "v", "topk"),
           switches=("q_lora_rank",))
def _shared_selection(o: SharedSelectionOptions) -> tuple[Term, ...]:
    """MLA's terms; topk is the size of the selection the layer is handed, which its program does not apply."""
    return _mla(o)


# ---------------------------------------------------------------------------------------------- DeepSeek V4

def _frequency_terms(field: str, o: RopeOptions) -> list[Term]:
    """RoPE's frequency terms (θ_j, YaRN's ramp, ω_j) as step_terms classes them for a rotary component, for a
    layer whose own steps show its frequencies; its rotation terms are the layer's own."""
    rope_terms, _ = TERMS[RopeOptions]
    return [Term(field, t.step, t.latex, t.also) for t in rope_terms(o) if t.step != "rotate"]


def _v4_scores_terms(o: V4AttentionOptions) -> list[Term]:
    return [Term("window", "mask", f"<{o.window}"), Term("head_dim", "softmax", rf"/\sqrt{{{o.head_dim}}}")]


def _v4_output_terms(o: V4AttentionOptions) -> list[Term]:
    return [Term("o_groups", "o-a", rf"j=1,\dots,{o.o_groups}")]


@registers(V4AttentionOptions, structural=("kind", "heads", "rope_dim", "o_lora_rank"))
def _v4_attention(o: V4AttentionOptions) -> tuple[Term, ...]:
    """kind picks the children (a compressor or none); heads and o_lora_rank are sizes; rope_dim is rope.dim, the
    features the rotation turns (named through rope). The scores child carries the layer's options and applies
    the window and the 1/√head_dim scale; the grouped output projection views its weight as o_groups blocks
    (o_lora_rank rows each, a size)."""
    return (*for_programs(("v4_attention",), [
                Term("eps", "q-head-norm", fmt_eps(o.eps)), *_frequency_terms("rope", o.rope),
                Term("rope", "q-rotate", f"last {o.rope.dim} features"),
                Term("rope", "o-unrotate", r"\operatorname{RoPE}_{-t}")]),
            *for_programs(("v4_attention", "v4_scores"), _v4_scores_terms(o)),
            *for_programs(("v4_attention", "grouped_linear"), _v4_output_terms(o)))


def _pool_terms(o: CompressorOptions, field: str = "", sub: str = "c") -> list[Term]:
    """The pooling's terms; field names the nested options field (an indexer's compressor) or "" for o's own."""
    m = o.ratio
    pooled = (rf"\sum_{{j=1}}^{{{2 * m}}}", r"C^{a}_{\text{window }w-1}") if o.overlap else (r"j\in\text{window }w",)
    return [Term(field or "ratio", f"{sub}-pool", rf"\text{{ratio }}{m}"), Term(field or "ratio", f"{sub}-entries", f"_{{{m}w}}"),
            *[Term(field or "overlap", f"{sub}-pool", x) for x in pooled],
            Term(field or "rope", f"{sub}-entries", r"\operatorname{RoPE}"),
            Term(field or "eps", f"{sub}-entries", fmt_eps(o.eps))]


@registers(CompressorOptions, structural=("width",))
def _compressor(o: CompressorOptions) -> tuple[Term, ...]:
    """width is each entry's size (the shapes show it); the rotary's frequencies are the layer's, which shows them
    (nested_mismatches checks they are the same). The pooling child carries the compressor's options and applies
    the pooling's; the compressor's own program also applies the ratio to which entries each query sees, and its
    steps include its pooling's."""
    return (*for_programs(("v4_compressor", "v4_pool"), _pool_terms(o)),
            Term("ratio", "c-visible", rf"/{o.ratio}\rfloor", programs=("v4_compressor",)))


@registers(IndexerOptions)
def _v4_indexer(o: IndexerOptions) -> tuple[Term, ...]:
    """Its own compressed keys (the compressor's terms under i-), the 1/√heads head weights, the 1/√head_dim scale,
    the top-k over closed entries."""
    return (*_pool_terms(o.compressor, "compressor", "i"),
            Term("compressor", "iselect", rf"/{o.compressor.ratio}\rfloor"),
            Term("compressor", "iq", r"\operatorname{RoPE}_t"),
            Term("heads", "iw", rf"/\sqrt{{{o.heads}}}"), Term("head_dim", "iscores", rf"/\sqrt{{{o.head_dim}}}"),
            Term("topk", "iselect", rf"\operatorname{{top}}_{{{o.topk}}}"))


@registers(dsa.IndexerOptions, structural=("norm_eps",))
def _dsa_indexer(o: dsa.IndexerOptions) -> tuple[Term, ...]:
    """norm_eps builds the k_norm child, whose options the program applies and whose steps show eps
    (nested_mismatches checks they agree). The angles are the layer's; the indexer picks the features they
    turn (the first rope.dim) and how it pairs them."""
    r = o.rope
    pairing = r"(2j,\,2j+1)" if r.pairing == "interleaved" else rf"(j,\,j+{r.pairs})"
    return (*[Term("rope", s, x) for s in ("idx-q-rotate", "idx-k-rotate") for x in (f"_{{t,:{r.dim}}}", pairing)],
            Term("heads", "idx-weights", rf"/\sqrt{{{o.heads}}}"),
            Term("head_dim", "idx-relu", rf"/\sqrt{{{o.head_dim}}}"),
            Term("topk", "idx-select", rf"\operatorname{{top}}_{{{o.topk}}}"))


@registers(BlockIndexerOptions, structural=("heads", "head_dim", "query_heads"))
def _block_indexer(o: BlockIndexerOptions) -> tuple[Term, ...]:
    """heads and head_dim only reshape; query_heads is the attention's (its msa-mask step spreads each indexer head
    over its group). The angles are the layer's; the indexer rotates the first rope.dim features of its own vectors;
    norm is applied as its q_norm and k_norm children show it (nested_mismatches)."""
    r, gain = o.rope.dim, GAIN_SUBSCRIPT[o.norm.gain]
    return (*[Term("rope", s, f"_{{t,:{r}}}") for s in ("idx-q-rotate", "idx-k-rotate")],
            *[Term("norm", s, rf"\operatorname{{RMSNorm}}{gain}(") for s in ("idx-q-norm", "idx-k-norm")],
            Term("block_size", "idx-pool", rf"{o.block_size}j\le s<{o.block_size}(j+1)"),
            Term("local_blocks", "idx-local", rf"\lfloor t/{o.block_size}\rfloor" if o.local_blocks else "no local"),
            Term("topk_blocks", "idx-select", rf"\operatorname{{top}}_{{{o.topk_blocks}}}"))


# ---------------------------------------------------------------------------------------------- hyper-connections

def _hyper_terms(o: HyperOptions) -> list[Term]:
    e = fmt_eps(o.eps)
    return [Term("norm_eps", "hc-norm", fmt_eps(o.norm_eps)), Term("eps", "hc-pre", f"+{e}"),
            Term("streams", "hc-collapse", rf"\sum_{{i=1}}^{{{o.streams}}}")]


@registers(HyperOptions)
def _hyper_connection(o: HyperOptions) -> tuple[Term, ...]:
    """eps joins pre, comb and every Sinkhorn denominator; sinkhorn_iters − 1 row-and-column rounds follow the
    first column normalisation. The head only collapses (no comb matrix, no Sinkhorn). A hyper-connected block
    (hc_block) carries its attention hyper-connection's options, but its program reads none of them: it runs its
    two hyper-connection children, which apply their own (and whose terms check them)."""
    e = fmt_eps(o.eps)
    return (*for_programs(("hyper_connection", "hyper_head"), _hyper_terms(o)),
            *for_programs(("hyper_connection",), [
                Term("eps", "hc-comb", f"+{e}"), Term("eps", "hc-sinkhorn", rf"(P\mathbf{{1}}+{e})"),
                Term("sinkhorn_iters", "hc-sinkhorn", rf"\text{{then {o.sinkhorn_iters - 1}}}\times")]))


# ---------------------------------------------------------------------------------------------- blocks

def _post_norm_terms(o: BlockOptions | LayerBlockOptions | PostNormBlockOptions) -> list[Term]:
    """The residual adds the post-normed branch (Δ̄) where the block has a post-norm, the branch itself otherwise."""
    return [Term("post_attn_norm", "residual-attn", rf"x_n+{_delta(o.post_attn_norm)}_{{\mathrm{{attn}}}}"),
            Term("post_ffn_norm", "residual-ffn", rf"x'_n+{_delta(o.post_ffn_norm)}_{{\mathrm{{ffn}}}}")]


def _delta(post_normed: bool) -> str:
    return r"\bar\Delta" if post_normed else r"\Delta"


@registers(BlockOptions)
def _block(o: BlockOptions) -> tuple[Term, ...]:
    return tuple(_post_norm_terms(o))


@registers(PostNormBlockOptions)
def _post_norm_block(o: PostNormBlockOptions) -> tuple[Term, ...]:
    """OLMo 2's block: the residual adds each branch's normalised output (its steps name the normed Δ̄)."""
    return tuple(_post_norm_terms(o))


@registers(LayerBlockOptions, structural=("ffn_reads_stream",), switches=("layer_scalar",))
def _layer_block(o: LayerBlockOptions) -> tuple[Term, ...]:
    """ffn_reads_stream is wiring (which inputs the FFN takes; its own steps say what it does with them, and a
    wrong count fails its call)."""
    out = _post_norm_terms(o)
    if o.layer_scalar:
        out.append(Term("layer_scalar", "layer-scalar", r"s_{\mathrm{layer}}\,x_{n+1}"))
    return tuple(out)


# ---------------------------------------------------------------------------------------------- Gated DeltaNet

_DELTANET_MEMORY = ("state_dtype", "state_bytes", "conv_dtype", "conv_bytes")


@registers(DeltaNetOptions, structural=_DELTANET_MEMORY)
def _deltanet(o: DeltaNetOptions) -> tuple[Term, ...]:
    """The dtypes and bytes are the cache's (the memory figures); the heads and widths split the convolved
    channels, d_k scales the queries, the key heads repeat over the value heads. The gated norm child carries the
    layer's options and applies only eps (over the d_v of each head, a size)."""
    split = f"{o.key_dim}+{o.key_dim}+{o.value_dim}"
    layer = ("gated_deltanet",)
    out = [Term(f, "split", split, programs=layer) for f in ("k_heads", "v_heads", "d_k", "d_v")]
    out += [Term("d_k", "l2norm", rf"\sqrt{{{o.d_k}}}\,\lVert", programs=layer),
            Term("conv_kernel", "conv", rf"\sum_{{j=0}}^{{{o.conv_kernel - 1}}}", programs=layer),
            Term("chunk", "chunk-writes", rf"\text{{in each chunk of }}{o.chunk}", programs=layer),
            Term("eps", "gated-norm", fmt_eps(o.eps), programs=(*layer, "gated_rmsnorm"))]
    if o.groups > 1:
        out.append(Term("v_heads", "repeat", rf"\lceil h/{o.groups}\rceil", programs=layer))
    return tuple(out)


# ---------------------------------------------------------------------------------------------- KDA

@registers(KDAOptions, structural=_DELTANET_MEMORY)
def _kda(o: KDAOptions) -> tuple[Term, ...]:
    """As Gated DeltaNet's, with one head count for queries, keys and values; the forget gate applies d_k (its
    decay is a vector per head) and the sigmoid-gated norm eps."""
    split = f"{o.key_dim}+{o.key_dim}+{o.value_dim}"
    layer = ("kda",)
    out = [Term(f, "split", split, programs=layer) for f in ("k_heads", "v_heads", "d_k", "d_v")]
    out += [Term("d_k", "l2norm", rf"\sqrt{{{o.d_k}}}\,\lVert", programs=layer),
            Term("d_k", "decay", rf"(0,1]^{{{o.d_k}}}", programs=(*layer, "kda_forget_gate", "kda_decay_rate")),
            Term("conv_kernel", "conv", rf"\sum_{{j=0}}^{{{o.conv_kernel - 1}}}", programs=layer),
            Term("chunk", "chunked", rf"\text{{the same in chunks of {o.chunk}", programs=layer),
            Term("eps", "gated-norm", fmt_eps(o.eps), programs=(*layer, "sigmoid_gated_rmsnorm"))]
    return tuple(out)


# ---------------------------------------------------------------------------------------------- Mamba-2

def _mamba_conv(o: Mamba2Options) -> list[Term]:
    out = [Term("conv_kernel", "conv", rf"\sum_{{j=0}}^{{{o.conv_kernel - 1}}}")]
    if o.conv_bias:
        out.append(Term("conv_bias", "conv", r"+b_{\mathrm{conv}}"))
    return out


def _mamba_scan(o: Mamba2Options) -> list[Term]:
    """heads, head_dim, groups and state_size split ξ̃ into x, B and C; each group's B and C serve H/G heads."""
    bc = o.groups * o.state_size
    return [*[Term(f, "heads", f"{o.inner},{bc},{bc}") for f in ("heads", "head_dim", "groups", "state_size")],
            Term("groups", "heads", rf"\lfloor h/{o.heads // o.groups}\rfloor"),
            Term("dt_min", "dt", rf"{fmt_num(o.dt_min)}\big)"), Term("chunk_size", "chunks", rf"\text{{in chunks of {o.chunk_size}}}")]


def _mamba_norm(o: Mamba2Options) -> list[Term]:
    return [Term("groups", "gate-norm", rf"_{{{o.groups}\times{o.inner // o.groups}}}"),
            Term("eps", "gate-norm", fmt_eps(o.eps))]


@registers(Mamba2Options, structural=("proj_bias", "state_dtype", "conv_dtype"), switches=("conv_bias",))
def _mamba2(o: Mamba2Options) -> tuple[Term, ...]:
    """The mixer splits in_proj's output at H·P, the conv width and H; its steps include its children's. proj_bias
    is the projections' own (their options apply it); the dtypes are the caches' (the memory figures). Each child
    (the causal conv, the scan, the gated norm) carries the mixer's options and applies only its own part's."""
    split = f"{o.inner},{o.conv_dim},{o.heads})"
    return (*[Term(f, "split", split, programs=("mamba2",)) for f in ("heads", "head_dim", "groups", "state_size")],
            *for_programs(("mamba2", "mamba_causal_conv"), _mamba_conv(o)),
            *for_programs(("mamba2", "ssd"), _mamba_scan(o)),
            *for_programs(("mamba2", "mamba_gated_rmsnorm"), _mamba_norm(o)))


@registers(MRopeOptions, structural=("kind", "layer_type"), switches=SWITCHES[RopeOptions])
def _mrope(o: MRopeOptions) -> tuple[Term, ...]:
    """The plain rotary terms, and the height and width sections' bounds in the step that deals the pairs out (the
    time section is what they leave)."""
    rope_fn, _ = TERMS[RopeOptions]
    return (*rope_fn(o), Term("sections", "axes", rf"j<{3 * o.sections[1]}"),
            Term("sections", "axes", rf"j<{3 * o.sections[2]}"))
