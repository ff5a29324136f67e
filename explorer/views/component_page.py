"""View models of the pages: every string a template shows, formatted here, so templates hold no arithmetic.

This module assembles a component page; the model-level views (ledger, figures, checks, variants) are in
model_views.py, the citations and their excerpts in evidence_views.py, and what they all share in view_basics.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from explorer.content.model_content import render_markdown
from explorer.figures.calculator import CalculatorView, calculator_view
from explorer.figures.model_build import ModelBuild
from explorer.figures.stored import STORED_DEFINITION
from explorer.model.account import AccountRow, ComponentAccount, TensorAccount
from explorer.model.components.part_facts import facts
from explorer.model.components.rope import RopeOptions
from explorer.model.families import FAMILIES
from explorer.spec.storage import MXFP4, BlockFP8, FP4Rows
from explorer.spec.types import Component, Port, Shape, Step, TensorSpec, path_key, walk
from explorer.views.attention_grid import AttentionGridView, attention_grid_view
from explorer.views.basics import Link, PageBase, crumb_texts, fmt, month, page_href
from explorer.views.block_figure import BlockFigureView, block_figure_view
from explorer.views.diagrams import FlowNode, flow_svg
from explorer.views.evidence import CitationView, ExcerptView, citation_views, evidence, excerpt_views
from explorer.views.flows import layout
from explorer.views.index_page import IndexFilters, LabGroup
from explorer.views.mathml import STREAMS, numbers_mathml, product_mathml, to_mathml
from explorer.views.model_page import (
    CheckView,
    DefaultView,
    FiguresView,
    LedgerView,
    RealCheckView,
    RoutingView,
    UnusedKeyView,
    VariantView,
    check_view,
    defaults_view,
    figures_view,
    ledger_view,
    real_check_view,
    routing_view,
    tiny_config,
    unused_view,
    variant_views,
)
from explorer.views.model_picture import describe, draw
from explorer.views.symbols import symbol_text
from explorer.views.term_links import IN, OUT, TermLink, page_links, part_id, tag_terms


@dataclass(frozen=True, slots=True)
class StepView:
    mathml: str
    latex: str
    shape: str
    anchor: str
    heading: bool


@dataclass(frozen=True, slots=True)
class PortView:
    mathml: str
    shape: str


@dataclass(frozen=True, slots=True)
class RowView:
    label: str
    calculation: str
    """MathML or plain text."""
    formula: str
    """In config names; "" for a child counted across its own components (its page shows its formula)."""
    value: str
    href: str


@dataclass(frozen=True, slots=True)
class TensorRowView:
    pattern: str
    pattern_parts: tuple[str, ...]
    """The name split at its dots, so a narrow screen breaks it there and nowhere else."""
    owner: Link
    role: str
    count: str
    shape: str
    dtype: str
    elements: str
    scale: str


@dataclass(frozen=True, slots=True)
class CardView:
    title: str
    href: str
    kind: str
    description: str
    params: str
    repeat: str


@dataclass(frozen=True, slots=True)
class HeaderView:
    """The model banner on every page of a model."""

    name: str
    href: str
    meta: str
    tagline: str
    repo_id: str
    revision_short: str
    repo_url: str
    checked: str
    slug: str
    """The model's folder name, so search can put this model's pages first."""
    revision_note: str = ""
    """Why no revision is pinned (empty when one is)."""
    footer: str = ""
    """The footer's provenance sentence, true of this model: pinned to a commit, or recorded without one."""


@dataclass(frozen=True, slots=True)
class ParametersView:
    headline: str
    rows: tuple[RowView, ...]
    total: str
    across: str
    across_math: str
    check: str
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OutlineNode:
    title: str
    href: str
    params: str
    repeat: str
    children: tuple[OutlineNode, ...] = ()


@dataclass(frozen=True, slots=True)
class ComponentPage(PageBase):
    header: HeaderView
    section: str
    crumbs: tuple[Link, ...]
    heading: str
    kind: str
    code: str
    summary: str
    prose_html: str
    extras: tuple[tuple[str, str], ...]
    equations: tuple[StepView, ...]
    steps: tuple[StepView, ...]
    steps_label: str
    inputs: tuple[PortView, ...]
    outputs: tuple[PortView, ...]
    trace_note: str
    check: CheckView
    real_checks: tuple[RealCheckView, ...]
    """Checks of this component on the checkpoint's real weights (the first is where a page shows one)."""
    diagram: str
    params_line: str
    parameters: ParametersView | None
    tensors: tuple[TensorRowView, ...]
    tensors_summary: str
    """Summary line of the collapsible table when the component owns many tensor families ("" otherwise)."""
    tensors_check: str
    children: tuple[CardView, ...]
    excerpts: tuple[ExcerptView, ...]
    citations: tuple[CitationView, ...]
    sources_count: str
    prev: Link | None
    next: Link | None
    outline: OutlineNode | None
    ledger: LedgerView | None
    figures: FiguresView | None
    compare: tuple[Link, ...]
    """Model page only: its static comparisons (the model it follows, the models that follow it)."""
    same_part: Link | None
    """The page of this library part (same program and key) across models, where other models have it."""
    picture: str
    """Model page only: the whole-model SVG (residual stream, block kinds, experts lit per token)."""
    picture_caption: str
    legend: tuple[tuple[str, str], ...]
    tiny_config: str
    """The model page only: the configuration the equation checks run on."""
    routing: RoutingView | None = None
    defaults: tuple[DefaultView, ...] = ()
    """Model page only: the keys the published config omits, with the default values used."""
    defaults_complete: bool = False
    """True where defaults lists every key the family reads that the file omits (checkpoint.config_defaulted, as
    --add-model recorded it), not only those in formulas: the page then says the checkpoint may set them otherwise."""
    unused: tuple[UnusedKeyView, ...] = ()
    """Model page only: the keys the published config holds that nothing reads (checkpoint.config_unused)."""
    unused_reader: str = ""
    """The reference config class those keys are not read by ("LlamaConfig")."""
    variants: tuple[VariantView, ...] = ()
    """Model page only: each published quantized variant's "Stored as" section."""
    calculator: CalculatorView | None = None
    """Model page only: the serving calculator (explorer/figures/calculator.py)."""
    attention_grid: AttentionGridView | None = None
    """Attention pages: which keys each query reads, drawn small from the model's own masks."""
    block_figure: BlockFigureView | None = None
    """Block pages: the block's parts in order with their parameters and residual branches."""


@dataclass(frozen=True, slots=True)
class IndexPage(PageBase):
    groups: tuple[LabGroup, ...]
    filters: IndexFilters
    count: str
    """"26 models from 14 labs"."""
    stored: str = STORED_DEFINITION
    """What each card's parameter count counts, in the words every page with the figure uses."""


@dataclass(frozen=True, slots=True)
class ProsePage(PageBase):
    heading: str
    body_html: str


@dataclass(frozen=True, slots=True)
class PartsIndexPage(PageBase):
    """parts/index.html: every library part shared by two or more models, with how many use it."""

    entries: tuple[tuple[Link, str, str], ...]
    """(the part's page, its program and key, "in 3 models")."""


@dataclass(frozen=True, slots=True)
class PartPage(PageBase):
    """One library part (a program under one key) across the models built from it."""

    heading: str
    entries: tuple[tuple[Link, Link, str], ...]
    """(model, component page, breadcrumb) in site order."""


# ----------------------------------------------------------------------------------------- small parts

def traced_display(traced: tuple[int, ...] | None, shape: Shape | None) -> str:
    """A traced shape with the spec's dimension names: (2, 5, 7168) -> [B batch, T positions, 7168 d]."""
    if shape is None or traced is None:
        return ""
    return "[" + ", ".join(d.display if d.size is None else f"{size} {d.label}"
                           for size, d in zip(traced, shape.dims)) + "]"


def step_view(step: Step, traced: dict[str, tuple[int, ...]], prefix: str = "",
              links: tuple[TermLink, ...] = ()) -> StepView:
    return StepView(tag_terms(to_mathml(step.latex), links), step.latex, traced_display(traced.get(step.name), step.shape),
                    f"{prefix}{step.name}" if step.name else "", step.heading)


def port_view(port: Port, traced: tuple[int, ...] | None, links: tuple[TermLink, ...] = ()) -> PortView:
    return PortView(tag_terms(to_mathml(port.latex), links), traced_display(traced, port.shape))


def calculation(row: AccountRow) -> str:
    if row.across_children:
        return f"{fmt(row.value)} across its components"
    return product_mathml(row.factors)


def header_view(mb: ModelBuild, root: str) -> HeaderView:
    ref = mb.content.checkpoint
    return HeaderView(
        name=mb.content.meta.name, href=f"{root}models/{mb.slug}/index.html",
        meta=f"{mb.content.meta.lab} · {month(mb.content.meta.released)}", tagline=mb.content.meta.tagline,
        repo_id=ref.repo_id, revision_short=ref.revision_short, repo_url=ref.repo_url, checked=mb.check_phrase,
        slug=mb.slug, revision_note=ref.revision_note, footer=footer_sentence(mb))


def footer_sentence(mb: ModelBuild) -> str:
    """Where this model's numbers come from, in the words its revision allows."""
    ref = mb.content.checkpoint
    if ref.pinned:
        return (f"Every number on these pages is derived from {mb.content.meta.name}'s configuration pinned at "
                f"{ref.at} and checked at build time.")
    return (f"Every number on these pages is derived from {mb.content.meta.name}'s configuration as recorded without "
            "a Hub revision (revision not pinned; the note at the top says where it came from) and checked at "
            "build time.")


def configuration_words(mb: ModelBuild) -> str:
    """"the pinned configuration", or, for a config recorded without a Hub revision, words that do not say pinned."""
    return "the pinned configuration" if mb.content.checkpoint.pinned else "the recorded configuration (revision not pinned)"


# ------------------------------------------------------------------------------------------- parameters

def parameters_view(mb: ModelBuild, comp: Component, acc: ComponentAccount, path: str,
                    owned: list[tuple[str, Component]]) -> ParametersView | None:
    if acc.per_instance == 0:
        return None
    rows = tuple(RowView(r.label, calculation(r), "" if r.across_children else r.formula, fmt(r.value),
                         page_href(r.child) if r.child else "") for r in acc.rows)
    learned = "across its learned components" if comp.children else "per instance"
    noun = acc.instances_label.rstrip("s") if acc.instances_label.endswith("s") else acc.instances_label
    headline = (f"{fmt(acc.per_instance)} parameters per {noun}, {learned}" if comp.children
                else f"{fmt(acc.per_instance)} parameters per instance.")
    return ParametersView(
        headline=headline, rows=rows, total=fmt(acc.per_instance),
        across=_across_text(acc), across_math=numbers_mathml((acc.per_instance, acc.instances, acc.total), ("×", "=")),
        check=_check_sentence(mb, path, owned), notes=comp.notes)


def _across_text(acc: ComponentAccount) -> str:
    """'Across 60 independent MoE blocks:'; empty for a component the model has once and nothing repeats."""
    label = acc.instances_label
    if acc.instances == 1 and acc.instances_label == "instances":
        return ""
    breakdown = [f"{fmt(n)} {lbl}" for n, lbl in acc.instances_factors if n > 1]
    detail = f" ({' × '.join(breakdown)})" if len(breakdown) > 1 else ""
    return f"Across {fmt(acc.instances)} independent {_plural_label(label)}{detail}:"


def _plural_label(label: str) -> str:
    return label if label.endswith("s") else label + "s"


SCALE_NAMES = {BlockFP8: "FP8 block scales", MXFP4: "MXFP4 block scales", FP4Rows: "FP4 row scales"}
"""What a storage scheme stores beside the values, named as the count's provenance names it."""


def _check_sentence(mb: ModelBuild, path: str, owned: list[tuple[str, Component]]) -> str:
    """What the count was checked against; what the count leaves out is named only where the component has it."""
    against = mb.checked_against(path)
    index = mb.checkpoint_index
    if mb.checkpoint is not None and index is not None and (
            index.provenance.startswith("GGUF") or any(".gguf" in g.shard for g in index.groups)):
        return ("Derived from the configuration read from the GGUF file's metadata, and equal to the count of the "
                "tensors its GGUF header lists (quantized types keep their element counts; a tied head is stored "
                f"once). Checked against {against}.")
    if mb.checkpoint is None:
        return f"Derived from {configuration_words(mb)}; checked tensor by tensor against {against}."
    specs = [t for _, c in owned for t in c.tensors]
    left_out = sorted({SCALE_NAMES[type(t.storage)] for t in specs if type(t.storage) in SCALE_NAMES})
    if any(t.role == "buffer" for t in specs):
        left_out.append("stored rotary buffers" if any("rotary" in t.template for t in specs) else "stored buffers")
    excluded = f" ({' and '.join(left_out)} excluded)" if left_out else ""
    return (f"Derived from {configuration_words(mb)} and implementation, and equal to the count of the checkpoint’s "
            f"tensors read from its safetensors headers{excluded}. Checked against {against}.")


def params_line(acc: ComponentAccount) -> str:
    if acc.per_instance == 0:
        return "no learned parameters"
    if acc.instances == 1:
        return fmt(acc.per_instance)
    return f"{fmt(acc.per_instance)} · × {fmt(acc.instances)} {_plural_label(acc.instances_label)} = {fmt(acc.total)}"


# ---------------------------------------------------------------------------------------------- tensors

def owned_tensors(ancestors: tuple[Component, ...], comp: Component) -> list[tuple[str, Component]]:
    """Every component (itself and its descendants) that owns tensors: (path, component)."""
    return [(path_key(anc, c), c) for anc, c in walk(comp, ancestors) if c.tensors]


def tensor_rows(mb: ModelBuild, owned: list[tuple[str, Component]]) -> tuple[TensorRowView, ...]:
    return tuple(_tensor_row(mb, ta, owner, c) for owner, c in owned for ta in mb.ledger.accounts[owner].tensors)


def _tensor_row(mb: ModelBuild, ta: TensorAccount, owner: str, comp: Component) -> TensorRowView:
    title = comp.title
    t = ta.spec
    stored = _stored(mb, t)
    shape = ta.shape if ta.shape is not None else (stored.shape if stored is not None else None)
    elements = ta.elements if ta.elements is not None else (stored.elements * t.count if stored is not None else None)
    # what the storage scheme stores beside the values (block scales), or instead of them (MXFP4's _blocks and
    # _scales take the weight's place)
    replaced = bool(ta.stored) and ta.stored[0].name != t.first_name
    extra = ta.stored if replaced else ta.stored[1:]
    scale = "; ".join(f"{e.name.rsplit('.', 1)[-1]} [{', '.join(map(str, e.shape))}] {e.dtype}" for e in extra)
    role = "buffer (not a parameter)" if t.role == "buffer" else "parameter"
    if t.tied_to:
        role = f"tied to {t.tied_to} (stored and counted once, there)"
    if t.optional and stored is None:
        role += ", not stored"
    role += _unused_rotary_buffer_note(mb, comp, stored.shape if stored is not None else None)
    return TensorRowView(
        pattern=t.pattern, pattern_parts=tuple(t.pattern.split(".")), owner=Link(title, page_href(owner)), role=role,
        count=fmt(t.count),
        shape=("[" + ", ".join(fmt(s) for s in shape) + "]" + (" (input × output)" if t.layout == "in_out" else "")
               if shape is not None else "not set by the config"),
        dtype=stored.dtype if stored is not None else ("packed (see stored as)" if replaced else t.dtype or "—"),
        elements=fmt(elements) if elements is not None else "—", scale=scale)


def _unused_rotary_buffer_note(mb: ModelBuild, comp: Component, stored: tuple[int, ...] | None) -> str:
    """A checkpoint's per-layer inv_freq whose length is not the layer's frequency count (Kimi K2 stores 56 where
    qk_rope_head_dim gives 32): say that it goes unused, and where its length matches a default head width."""
    o = comp.options
    if not isinstance(o, RopeOptions) or stored is None or stored == (o.pairs,):
        return ""
    n, values = stored[0], mb.content.config
    d, heads = values.get("hidden_size"), values.get("num_attention_heads")
    why = (f" ({d:,} / {heads} / 2: hidden_size / num_attention_heads / 2, a rotary module sized for the whole "
           f"head width, not for the {o.dim} rotary features)"
           if isinstance(d, int) and isinstance(heads, int) and heads and d // heads == 2 * n else "")
    return (f"; {n} values stored{why}, where this layer computes {o.pairs} frequencies; unused: transformers "
            "skips per-layer inv_freq when loading and computes the frequencies itself")


def _stored(mb: ModelBuild, t: TensorSpec):
    if mb.checkpoint_index is None:
        return None
    return mb.checkpoint_index.group_of(t.first_name)


# ---------------------------------------------------------------------------------------------- pages

def children_cards(mb: ModelBuild, path: str, comp: Component) -> tuple[CardView, ...]:
    cards = []
    for ch in comp.children:
        ch_path = f"{path}.{ch.key}" if path else ch.key
        acc = mb.ledger.accounts[ch_path]
        cards.append(CardView(ch.title, page_href(ch_path), ch.kind, ch.description,
                              params_line(acc), f"× {fmt(ch.repeat)} {ch.repeat_label}" if ch.repeat > 1 else ""))
    return tuple(cards)


def siblings(ancestors: tuple[Component, ...], comp: Component) -> tuple[Link | None, Link | None]:
    if not ancestors:
        return None, None
    parent = ancestors[-1]
    keys = [c.key for c in parent.children]
    i = keys.index(comp.key)
    parent_path = path_key(ancestors[:-1], parent)

    def link(c: Component) -> Link:
        return Link(c.title, page_href(f"{parent_path}.{c.key}" if parent_path else c.key))

    return (link(parent.children[i - 1]) if i > 0 else None,
            link(parent.children[i + 1]) if i + 1 < len(keys) else None)


def outline(mb: ModelBuild, comp: Component, path: str = "") -> OutlineNode:
    acc = mb.ledger.accounts[path]
    kids = tuple(outline(mb, ch, f"{path}.{ch.key}" if path else ch.key) for ch in comp.children)
    return OutlineNode(comp.crumb or comp.title if path else mb.content.meta.name, page_href(path),
                       fmt(acc.per_instance) if acc.per_instance else "",
                       f"× {fmt(comp.repeat)}" if comp.repeat > 1 else "", kids)


def component_page(mb: ModelBuild, ancestors: tuple[Component, ...], comp: Component, related: tuple[Link, ...] = (),
                   shared_parts: frozenset[tuple[str, str]] = frozenset()) -> ComponentPage:
    """One component's page; `related` are the model's static comparisons, `shared_parts` the library parts that
    more than one model is built from (their pages are linked)."""
    path = path_key(ancestors, comp)
    root = "../../"
    acc = mb.ledger.accounts[path]
    traced = mb.trace.components[path]
    picture = describe(mb.spec, mb.content.meta.name, mb.picture_routing) if not ancestors else None
    owned = owned_tensors(ancestors, comp)
    families = [ta for owner, _ in owned for ta in mb.ledger.accounts[owner].tensors]
    tensors = tensor_rows(mb, owned)
    cits = evidence(mb, ancestors, comp)
    excerpts = excerpt_views(mb, cits)
    crumbs = tuple(Link(text, page_href(path_key(ancestors[:i + 1], a)))
                   for i, (a, text) in enumerate(zip(ancestors[1:], crumb_texts(ancestors[1:]))))
    is_model = path == ""
    prev, nxt = siblings(ancestors, comp)
    show_steps = len(comp.steps) > len(comp.equations) or comp.steps != comp.equations
    links = page_links(comp)
    name = mb.content.meta.name
    title = name if is_model else f"{comp.title} · {name}"
    return ComponentPage(
        title=title, description=comp.description, root=root, path=f"models/{mb.slug}/{page_href(path)}",
        header=header_view(mb, root), section=ancestors[-1].title if len(ancestors) > 1 else (
            "Model" if is_model else "Overview"),
        crumbs=crumbs, heading=name if is_model else comp.title, kind=comp.kind, code=comp.code,
        summary=comp.description, prose_html=render_markdown(mb.content.prose.get(path, "")),
        extras=comp.extras, equations=tuple(step_view(s, traced.steps, "eq-", links) for s in comp.equations),
        steps=tuple(step_view(s, traced.steps, "step-", links) for s in comp.steps) if show_steps else (),
        steps_label=_steps_label(sum(1 for s in comp.steps if not s.heading)),
        inputs=tuple(port_view(p, t, links) for p, t in zip(comp.inputs, traced.inputs)),
        outputs=tuple(port_view(p, t, links) for p, t in zip(comp.outputs, traced.outputs)),
        trace_note=(f"Shapes traced by running this component at full size on the {mb.trace.device} device "
                    f"(no weights allocated), with B = {mb.trace.free['B']} and T = {mb.trace.free['T']}."),
        check=check_view(mb, path), real_checks=tuple(real_check_view(c) for c in mb.real_checks if c.path == path),
        diagram=flow_diagram(mb, path, comp, traced),
        params_line=params_line(acc), parameters=parameters_view(mb, comp, acc, path, owned),
        tensors=tensors, tensors_check=mb.checked_against(path),
        tensors_summary=(f"All {len(tensors)} tensor families ({fmt(sum(ta.spec.count for ta in families))} tensors)"
                         if len(tensors) > 6 else ""),
        children=children_cards(mb, path, comp), excerpts=excerpts, citations=citation_views(cits, excerpts),
        sources_count=str(len(cits)),
        prev=prev, next=nxt, outline=outline(mb, comp) if is_model else None,
        ledger=ledger_view(mb) if is_model else None,
        figures=figures_view(mb) if is_model else None,
        same_part=Link("every model built from this part →", f"{root}{part_path(comp.program, comp.key)}")
        if not is_model and (comp.program, comp.key) in shared_parts else None,
        picture=draw(picture) if picture is not None else "", picture_caption=picture.caption if picture else "",
        compare=related if is_model else (),
        legend=STREAMS if any("stream-" in s.latex for s in comp.steps + comp.equations) else (),
        tiny_config=tiny_config(mb) if is_model else "",
        routing=routing_view(mb, path),
        defaults=defaults_view(mb) if is_model else (),
        defaults_complete=is_model and bool(mb.content.checkpoint.config_defaulted),
        unused=unused_view(mb) if is_model else (),
        unused_reader=FAMILIES[mb.spec.family].reference.config_class,
        variants=variant_views(mb) if is_model else (),
        calculator=calculator_view(mb.figures.serving, mb.figures.get("max_context").formula) if is_model else None,
        attention_grid=next((attention_grid_view(g) for g in mb.attention_patterns if g.path == path), None),
        block_figure=next((block_figure_view(mb.spec, f) for f in mb.block_figures if f.path == path), None))


def _steps_label(count: int) -> str:
    return "The one step" if count == 1 else f"All {count} steps"


def flow_diagram(mb: ModelBuild, path: str, comp: Component, traced) -> str:
    """SVG: inputs → the component's flow (every child, with its parameters) → outputs, with traced shapes."""
    rows = {r.child: r for r in mb.ledger.accounts[path].rows if r.child}

    def node(c: Component) -> FlowNode:
        if c is comp:
            own = mb.ledger.accounts[path].per_instance
            return FlowNode(c.title, (f"{fmt(own)} params" if own else f"{c.kind}, no parameters",), "", own)
        c_path = f"{path}.{c.key}" if path else c.key
        row = rows.get(c_path)
        if row is None:
            tied = next((t.tied_to for _, d in walk(c) for t in d.tensors if t.tied_to), "")
            # a tied head owns no parameters of its own: it multiplies by the tensor it is tied to
            detail = f"tied: reuses {tied}" if tied else f"{c.kind}, no parameters"
            return FlowNode(c.title, (detail,), page_href(c_path), 0, part_id(c.key))
        if len(row.factors) == 2:
            return FlowNode(c.title, (f"{fmt(row.factors[0])} × {fmt(row.factors[1])}", f"= {fmt(row.value)} params"),
                            page_href(c_path), row.value, part_id(c.key))
        return FlowNode(c.title, (f"{fmt(row.value)} params",), page_href(c_path), row.value, part_id(c.key))

    # the boxes name each port by its symbol in the equations, as the terms that light them do
    images = ("image pixels, into the vision tower",) if not path and any(
        facts(c.program).vision for c in comp.children) else ()
    inputs = FlowNode("in", tuple(f"{symbol_text(p.latex)} {traced_display(t, p.shape)}"
                                  for p, t in zip(comp.inputs, traced.inputs)) + images, light=IN)
    outputs = FlowNode("out", tuple(f"{symbol_text(p.latex)} {traced_display(t, p.shape)}"
                                    for p, t in zip(comp.outputs, traced.outputs)), light=OUT)
    return flow_svg(comp.title if path else mb.content.meta.name, inputs, layout(comp, node), outputs)


@dataclass(frozen=True, slots=True)
class PageGroup:
    """Pages made on demand: the renderer makes and writes each group in one worker."""

    make: Callable[[], list[PageBase]]
    cost: int
    """The work it takes, about one per page made (the renderer hands out the costliest groups first, so that no
    long group starts last while the other workers have nothing left to do)."""


def part_path(program: str, key: str) -> str:
    """The page of one library part (a program under one key) across the models built from it."""
    return f"parts/{program}.{key}.html"
