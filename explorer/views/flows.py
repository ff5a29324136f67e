"""Which shape each component's data flow takes: the children in the order data passes through them, streams
that run side by side, residual additions and the sum over experts.

A layout is the one the component's part declares (`layout`, explorer/model/components/part_facts.py), by name,
and is built from its children's keys. A layout that does not draw every child exactly once is not used: the
component falls back to its children in order, so a family whose children differ still gets a complete (if
plainer) diagram. A new part names an existing layout, or adds one here as `LAYOUTS["name"] = function`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from explorer.model.components.part_facts import facts
from explorer.spec.types import Component
from explorer.views.diagrams import Box, FlowNode, Item, Op, Residual, Seq, Split
from explorer.views.symbols import symbol_text

NodeOf = Callable[[Component], FlowNode]
Layout = Callable[[Component, NodeOf], Item | None]


def _boxes(comp: Component, node: NodeOf, *keys: str) -> list[Item]:
    """Boxes for the children with these keys, in this order, skipping keys the component lacks."""
    by_key = {c.key: c for c in comp.children}
    return [Box(node(by_key[k])) for k in keys if k in by_key]


def _step_op(comp: Component, symbol: str, names: tuple[str, ...], fallback: str) -> Op:
    """An op drawing the first of these steps the component has, labelled with the step's own equation (so the
    diagram uses the equations' symbols); the fallback label where it has none of them."""
    step = next((s for n in names for s in comp.steps if s.name == n and not s.heading), None)
    return Op(symbol, symbol_text(step.latex), step.name) if step is not None else Op(symbol, fallback)


def _residual(comp: Component, body: Item, step: str, fallback: str) -> Residual:
    op = _step_op(comp, "+", (step,), fallback)
    return Residual(body, op.label, op.step)


def _chain(items: Sequence[Item]) -> Item:
    return items[0] if len(items) == 1 else Seq(tuple(items))


def block_layout(comp: Component, node: NodeOf) -> Item | None:
    """A pre-norm block: norm and attention (and a post-norm, where the block has one) added back to the residual
    stream, then the feed-forward half the same way; its children come in that order."""
    if len(comp.children) not in (4, 6):
        return None
    c = [Box(node(ch)) for ch in comp.children]
    half = len(c) // 2
    return Seq((_residual(comp, Seq(tuple(c[:half])), "residual-attn", "x′ = x + Δattn"),
                _residual(comp, Seq(tuple(c[half:])), "residual-ffn", "x_next = x′ + Δffn")))


def mla_layout(comp: Component, node: NodeOf) -> Item | None:
    """Latent attention: a query stream and a key-value stream through their latents, then RoPE, scores, output."""
    query = _boxes(comp, node, "q_a_proj", "q_a_layernorm", "q_b_proj", "q_proj")
    kv = _boxes(comp, node, "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj")
    if not query or not kv:
        return None
    return Seq((Split((("query stream", _chain(query)), ("key-value stream (rotary key split off)", _chain(kv)))),
                *_boxes(comp, node, "rope", "scores", "o_proj")))


def attention_layout(comp: Component, node: NodeOf) -> Item | None:
    """Attention with separate projections: query, key and value streams side by side, then RoPE, scores, output."""
    streams = [(name, _boxes(comp, node, *keys)) for name, keys in (
        ("query", ("q_proj", "q_norm")), ("key", ("k_proj", "k_norm")), ("value", ("v_proj",)))]
    if not all(boxes for _, boxes in streams):
        return None
    return Seq((Split(tuple((name, _chain(boxes)) for name, boxes in streams)),
                *_boxes(comp, node, "rope", "scores", "o_proj")))


def swiglu_layout(comp: Component, node: NodeOf) -> Item | None:
    """SwiGLU: the gate through SiLU, times the up projection, then down."""
    gate, up, down = (_boxes(comp, node, k) for k in ("gate_proj", "up_proj", "down_proj"))
    if not (gate and up and down):
        return None
    return Seq((Split((("gate", Seq((gate[0], _step_op(comp, "σ", ("silu", "gelu", "glu"), "SiLU")))), ("up", up[0]))),
                _step_op(comp, "⊙", ("product",), "a ⊙ u"), down[0]))


def fused_qkv_layout(comp: Component, node: NodeOf) -> Item | None:
    """Attention with one fused projection: it, the split into q, k and v, then RoPE, scores, output."""
    fused = _boxes(comp, node, "qkv_proj")
    if not fused:
        return None
    return Seq((fused[0], _step_op(comp, "⫼", ("qkv-split",), "split into q, k, v"),
                *_boxes(comp, node, "rope", "scores", "o_proj")))


def fused_swiglu_layout(comp: Component, node: NodeOf) -> Item | None:
    """SwiGLU from one fused gate-up projection: split in halves, SiLU on the gate, times the up half, then down."""
    gate_up, down = (_boxes(comp, node, k) for k in ("gate_up_proj", "down_proj"))
    if not (gate_up and down):
        return None
    return Seq((gate_up[0], _step_op(comp, "⫼", ("gate-up-split",), "split into g, u"),
                _step_op(comp, "σ", ("silu",), "SiLU"), _step_op(comp, "⊙", ("product",), "a ⊙ u"), down[0]))


def moe_layout(comp: Component, node: NodeOf) -> Item | None:
    """Mixture of experts: the router picks experts; their gated outputs are summed, plus the shared expert."""
    router, routed, shared = (_boxes(comp, node, k) for k in ("router", "expert", "shared"))
    if not (router and routed):
        return None
    columns = (("selected routed experts", routed[0]),) + ((("shared expert, every token", shared[0]),)
                                                           if shared else ())
    label = "Δ = Σ G·E over the selected experts" + (" + shared" if shared else "")
    return Seq((router[0], Split(columns), _step_op(comp, "Σ", ("routed-sum",), label)))


def mtp_layout(comp: Component, node: NodeOf) -> Item | None:
    """Multi-token prediction: the next token's embedding and the hidden state, normalised, joined, projected."""
    emb, hid = _boxes(comp, node, "embed", "enorm"), _boxes(comp, node, "hnorm")
    rest = _boxes(comp, node, "eh_proj", "block", "head_norm", "head")
    if not (emb and hid and rest):
        return None
    return Seq((Split((("next token's embedding", _chain(emb)), ("hidden state", _chain(hid)))),
                Op("‖", "concatenate"), *rest))


def model_layout(comp: Component, node: NodeOf) -> Item | None:
    """The model: embedding, blocks, final norm and head; a multi-token prediction module branches off. Where the
    model has a vision tower, the image's pixels go through it and its projector beside the token embedding, and
    the image features take the image tokens' places in the sequence before the first block, as the reference's
    forward merges them (masked_scatter into the input embeddings)."""
    vision = [Box(node(c)) for c in comp.children if facts(c.program).vision]
    main = [Box(node(c)) for c in comp.children if not facts(c.program).mtp and not facts(c.program).vision]
    side = [Box(node(c)) for c in comp.children if facts(c.program).mtp]
    if not main:
        return None
    head: list[Item] = [main[0]]
    if vision:
        head = [Split((("text: token ids", main[0]), ("image: pixels", _chain(vision)))),
                Op("←", "image features take the image tokens' places")]
    if not side or len(main) < 3:
        return Seq((*head, *main[1:]))
    return Seq((*head, main[1], Split((("next token", Seq(tuple(main[2:]))), ("token after next", _chain(side))))))


def hc_block_layout(comp: Component, node: NodeOf) -> Item | None:
    """A block over hyper-connected streams (DeepSeek-V4): each branch reads the collapsed streams and writes back
    to all of them beside the mixed old streams."""
    attn, ffn = (_boxes(comp, node, *keys) for keys in (("attn_hc", "attn_norm", "attn"), ("ffn_hc", "ffn_norm", "moe")))
    if len(attn) != 3 or len(ffn) != 3:
        return None
    return Seq((Residual(Seq(tuple(attn)), "X′ = π_post·Δattn + Pᵀ X"),
                Residual(Seq(tuple(ffn)), "X_next = π_post·Δffn + Pᵀ X′")))


def v4_attention_layout(comp: Component, node: NodeOf) -> Item | None:
    """DeepSeek-V4's attention: a query stream through its latent, the shared key-value vector, and the compressed
    entries where the layer has a compressor; then attention with sinks and the grouped output."""
    query, kv = _boxes(comp, node, "q_a_proj", "q_a_norm", "q_b_proj"), _boxes(comp, node, "kv_proj", "kv_norm")
    if len(query) != 3 or len(kv) != 2:
        return None
    columns: tuple[tuple[str, Item], ...] = (("query stream", _chain(query)), ("shared key-value (window)", _chain(kv)))
    compressed = _boxes(comp, node, "compressor")
    if compressed:
        columns += (("compressed entries", compressed[0]),)
    return Seq((Split(columns), *_boxes(comp, node, "scores", "o_a_proj", "o_b_proj")))


def shared_and_routed_moe_layout(comp: Component, node: NodeOf) -> Item | None:
    """A router (by score or by table), the fused routed experts and the shared expert, summed."""
    router, routed, shared = (_boxes(comp, node, k) for k in ("router", "experts", "shared"))
    if not (router and routed and shared):
        return None
    return Seq((router[0], Split((("selected routed experts", routed[0]), ("shared expert, every token", shared[0]))),
                Op("Σ", "Δ = Σ G·E over the selected experts + shared")))


LAYOUTS: dict[str, Layout] = {
    "residual-block": block_layout, "latent-attention": mla_layout, "rotary-attention": attention_layout,
    "swiglu": swiglu_layout, "fused-qkv": fused_qkv_layout, "fused-swiglu": fused_swiglu_layout,
    "routed-experts": moe_layout, "multi-token-prediction": mtp_layout, "whole-model": model_layout,
    "hyper-connected-block": hc_block_layout, "compressed-attention": v4_attention_layout,
    "shared-and-routed-experts": shared_and_routed_moe_layout,
}
"""Layout name (a part's declared `layout`) -> the function that draws it."""


def drawn_boxes(item: Item) -> list[str]:
    """The page (or title) of every box in a layout, to check that each child is drawn once."""
    if isinstance(item, Box):
        return [item.node.href or item.node.title]
    if isinstance(item, Op):
        return []
    if isinstance(item, Seq):
        return [t for i in item.items for t in drawn_boxes(i)]
    if isinstance(item, Split):
        return [t for _, i in item.columns for t in drawn_boxes(i)]
    return drawn_boxes(item.body)


def layout(comp: Component, node: NodeOf) -> Item:
    """The component's flow: its program's layout when that draws every child once, else the children in order
    (a leaf is one box standing for itself)."""
    if not comp.children:
        return Box(node(comp))
    fallback = Seq(tuple(Box(node(c)) for c in comp.children))
    chosen = LAYOUTS.get(facts(comp.program).layout, lambda c, n: None)(comp, node)
    if chosen is None or sorted(drawn_boxes(chosen)) != sorted(drawn_boxes(fallback)):
        return fallback
    return chosen
