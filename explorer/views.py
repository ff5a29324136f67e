"""View models: every string a template shows, formatted here, so templates hold no arithmetic."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import JsonLexer, PythonLexer

from .account import AccountRow, ComponentAccount, TensorAccount
from .calculator import CalculatorView, calculator_view
from .components.rope import RopeOptions
from .content import render_markdown
from .diagrams import FlowNode, budget_svg, flow_svg
from .execution import RealWeightCheck
from .families import FAMILIES
from .flows import layout
from .mathml import STREAMS, numbers_mathml, product_mathml, to_mathml
from .model_build import ModelBuild
from .model_picture import describe, draw
from .sources import ResolvedCitation
from .spec.storage import MXFP4, BlockFP8
from .spec.types import Component, Port, Shape, Step, TensorSpec, path_key, walk
from .symbols import symbol_text
from .term_links import IN, OUT, TermLink, page_links, part_id, tag_terms


@dataclass(frozen=True, slots=True)
class Link:
    text: str
    href: str


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
class ExcerptView:
    """One cited range of one file, shown once per page however many claims cite it."""

    anchor: str
    """Id of the excerpt on its page ("code-1"), which the claims citing it link to."""
    file: str
    lines: str
    source: str
    revision_short: str
    url: str
    html: str
    """Highlighted lines, each with its own line number, or "" when the file is not at hand."""
    note: str
    """How the text was obtained, or why it is not shown, in reader terms ("" for an installed package)."""
    note_link: Link | None = None
    """Where to read lines that are not shown (the pinned file on Hugging Face)."""


@dataclass(frozen=True, slots=True)
class CitationView:
    claim: str
    scope: str
    source: str
    file: str
    revision_short: str
    url: str
    lines: str
    excerpt: Link
    """The excerpt on this page that holds the cited lines (its caption and anchor)."""


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
class PageBase:
    """Fields every page has."""

    title: str
    description: str
    root: str
    """Relative prefix to the site root ("" or "../../")."""
    path: str
    """Output path relative to the site root."""


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
    unused: tuple[UnusedKeyView, ...] = ()
    """Model page only: the keys the published config holds that nothing reads (checkpoint.config_unused)."""
    unused_reader: str = ""
    """The reference config class those keys are not read by ("LlamaConfig")."""
    variants: tuple[VariantView, ...] = ()
    """Model page only: each published quantized variant's "Stored as" section."""
    calculator: CalculatorView | None = None
    """Model page only: the serving calculator (explorer/calculator.py)."""


@dataclass(frozen=True, slots=True)
class DefaultView:
    """A config key the published config omits: the value the model is built with, and whose default it is."""

    key: str
    value: str
    source: str


@dataclass(frozen=True, slots=True)
class UnusedKeyView:
    """A published config key nothing reads, with its value as published."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class CheckView:
    """The equation check line: what the step program was compared with, and the error measured."""

    status: str
    text: str
    link: Link | None
    config: Link | None = None
    """Where the tiny test configuration is described (once per model, on its overview page)."""
    tail: str = ""
    """What follows the configuration: the verdict and tolerance."""
    measured: str = ""
    """The max |Δ| this machine measured: its last digits depend on the CPU's kernels, so it is marked as such on
    the page (golden texts leave it out, issue 18)."""
    after: str = ""
    """What follows the measured value."""


@dataclass(frozen=True, slots=True)
class RealCheckView:
    """A real-weight check line: the verdict, the measured max |Δ| (machine-dependent digits) and the rest."""

    text: str
    measured: str
    after: str


@dataclass(frozen=True, slots=True)
class RoutingCellView:
    text: str
    selected: bool


@dataclass(frozen=True, slots=True)
class RoutingView:
    """A router's worked example: one token's values per expert, from the executed check."""

    caption: str
    experts: tuple[RoutingCellView, ...]
    rows: tuple[tuple[str, tuple[RoutingCellView, ...]], ...]
    summary: str


@dataclass(frozen=True, slots=True)
class LedgerRowView:
    role: str
    dtype: str
    tensors: str
    parameters: str
    """Logical parameters the row's tensors carry ("—" for scales and buffers)."""
    elements: str
    bytes: str


@dataclass(frozen=True, slots=True)
class LedgerView:
    source: str
    rows: tuple[LedgerRowView, ...]
    total_tensors: str
    total_parameters: str
    total_elements: str
    total_bytes: str
    parameters: str
    scales: str
    buffers: str
    status: str
    balanced: bool
    reference: str
    predicted: bool = False
    """The rows are the storage schemes' prediction, not a reconciled listing."""


@dataclass(frozen=True, slots=True)
class VariantView:
    """A published variant's "Stored as" section: where it is, how it stores the weights, and its numbers."""

    name: str
    repo_url: str
    revision: str
    storage: str
    rows: tuple[LedgerRowView, ...]
    tensors: tuple[tuple[str, str, str, str], ...]
    """(name pattern, dtype, shape, bytes per tensor)."""
    tensors_summary: str
    parameters: str
    header_elements: str
    bytes: str
    reason: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FigureRowView:
    label: str
    value: str
    readable: str
    """The value in words a reader scans ("32.9 billion", "9.2 GB"); the exact integer stays beside it."""
    formula: str
    definition: str


@dataclass(frozen=True, slots=True)
class FiguresView:
    rows: tuple[FigureRowView, ...]
    claim: str
    """How the lab's published active-parameter figure is reproduced ("" when none is recorded)."""
    claim_matched: bool


@dataclass(frozen=True, slots=True)
class ModelCardView:
    name: str
    href: str
    meta: str
    tagline: str
    params: str
    facts: tuple[tuple[str, str], ...]
    checked: str
    preview_svg: str = ""


@dataclass(frozen=True, slots=True)
class IndexPage(PageBase):
    models: tuple[ModelCardView, ...]


@dataclass(frozen=True, slots=True)
class ProsePage(PageBase):
    heading: str
    body_html: str


@dataclass(frozen=True, slots=True)
class PartPage(PageBase):
    """One library part (a program under one key) across the models built from it."""

    heading: str
    entries: tuple[tuple[Link, Link, str], ...]
    """(model, component page, breadcrumb) in site order."""


ROLE_NAMES = {"parameter": "parameters", "quant_scale": "FP8 block scales", "buffer": "stored buffers"}
STORED_AS = {("parameter", "U8"): "MXFP4 blocks: packed FP4 values, two per byte",
             ("quant_scale", "U8"): "MXFP4 scales: one E8M0 exponent per 32 values",
             ("parameter", "I32"): "INT4 packed words: eight 4-bit values per int32 (compressed-tensors)",
             ("quant_scale", "BF16"): "INT4 group scales: one per group of input values",
             ("quant_scale", "I64"): "shapes of the packed weights (weight_shape, two integers each)",
             ("quant_scale", "F8_E4M3"): "NVFP4 block scales: one FP8 E4M3 per 16 values"}
"""Ledger row labels where a dtype says what the bytes hold (U8 stores MXFP4, the only U8 scheme)."""


def crumb_texts(chain: Sequence[Component]) -> list[str]:
    """Breadcrumb words for a chain of components: a dense model's one block kind is counted like the whole stack
    ("32 transformer blocks"), so a crumb that would repeat the one before it names the component by its title."""
    texts: list[str] = []
    for comp in chain:
        text = comp.crumb or comp.title
        texts.append(comp.title if texts and text == texts[-1] else text)
    return texts


def page_href(path: str) -> str:
    """File name of a component page inside its model folder."""
    return "index.html" if path == "" else f"{path}.html"


def month(released: str) -> str:
    """"2025-07" -> "Jul 2025"; an unrecorded release month is said so."""
    if not released:
        return "release month not recorded"
    return datetime.date.fromisoformat(released + "-01").strftime("%b %Y")


def fmt(n: int) -> str:
    return f"{n:,}"


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


Excerpt = tuple[tuple[str, ...], int, str]
"""Cited lines, the number of the first, and the file's name."""
_highlighted: dict[Excerpt, str] = {}
"""highlight_lines' results in this process; a build adds those a worker made (highlight_citations)."""


def highlight_lines(lines: tuple[str, ...], first: int, file: str) -> str:
    """Pygments HTML, one element per line holding its own line number, so numbers cannot drift from lines."""
    key = (lines, first, file)
    if key not in _highlighted:
        _highlighted[key] = _highlight(*key)
    return _highlighted[key]


def highlight_citations(citations: dict[str, tuple[ResolvedCitation, ...]]) -> dict[Excerpt, str]:
    """The excerpts of a model's citations, highlighted as its pages will show them: made where a core is idle
    and handed to remember_highlights in the process that forks the page writers (highlighting is a third of
    the time pages take)."""
    return {(c.lines, c.first, c.file): highlight_lines(c.lines, c.first, c.file)
            for cits in citations.values() for c in cits if c.lines is not None}


def remember_highlights(highlighted: dict[Excerpt, str]) -> None:
    _highlighted.update(highlighted)


def _highlight(lines: tuple[str, ...], first: int, file: str) -> str:
    lexer = JsonLexer() if file.endswith(".json") else PythonLexer()
    body = highlight("\n".join(lines) + "\n", lexer, HtmlFormatter(nowrap=True))
    # HtmlFormatter closes every token's span at a line end, so each split line is well-formed on its own
    rows = body.rstrip("\n").split("\n")
    numbered = "".join(f'<span class="line"><span class="ln" aria-hidden="true">{first + i}</span>{row}</span>'
                       for i, row in enumerate(rows))
    return f'<pre class="code"><code>{numbered}</code></pre>'


def _revision_short(cit: ResolvedCitation) -> str:
    return "v" + cit.revision if cit.source == "transformers" else cit.revision[:12]


def excerpt_note(cit: ResolvedCitation, config_sha256: str) -> str:
    """Where the excerpt's text comes from, or why it is not shown, for the reader."""
    if cit.origin == "regenerated":
        return (f"Regenerated from the configuration values recorded for {cit.revision[:7]}, and verified: the "
                f"regenerated file's sha256 ({config_sha256[:12]}…) equals the recorded hash of the published file.")
    if cit.origin == "absent":
        return "The pinned file is not bundled with this site; read"
    if cit.origin == "cache":
        return f"Read from the pinned file at {cit.revision[:7]}."
    return ""


def excerpt_views(mb: ModelBuild, cits: list[tuple[ResolvedCitation, str]]) -> tuple[ExcerptView, ...]:
    """Each distinct cited range once: the checkpoint's own files first, then transformers."""
    ordered = sorted({(c.source == "transformers", c.file, c.first, c.last): c for c, _ in cits}.items())
    sha = mb.content.checkpoint.config_sha256
    return tuple(ExcerptView(f"code-{i}", c.file, f"{c.first}–{c.last}", c.source, _revision_short(c), c.url,
                             highlight_lines(c.lines, c.first, c.file) if c.lines is not None else "",
                             excerpt_note(c, sha), _read_at(c))
                 for i, (_, c) in enumerate(ordered, 1))


def _read_at(cit: ResolvedCitation) -> Link | None:
    if cit.origin != "absent":
        return None
    return Link(f"lines {cit.first}–{cit.last} at {cit.revision[:7]} on Hugging Face ↗", cit.url)


def citation_views(cits: list[tuple[ResolvedCitation, str]], excerpts: tuple[ExcerptView, ...],
                   ) -> tuple[CitationView, ...]:
    """The claims, each linked to the excerpt that holds its lines."""
    by_range = {(e.file, e.lines): e for e in excerpts}
    out = []
    for c, scope in cits:
        lines = f"{c.first}–{c.last}"
        ex = by_range[(c.file, lines)]
        out.append(CitationView(c.claim, scope, c.source, c.file, _revision_short(c), c.url, lines,
                                Link(f"{c.file} {lines}", f"#{ex.anchor}")))
    return tuple(out)


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
        slug=mb.slug, revision_note=ref.revision_note)


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


SCALE_NAMES = {BlockFP8: "FP8 block scales", MXFP4: "MXFP4 block scales"}
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
        return f"Derived from the pinned configuration; checked tensor by tensor against {against}."
    specs = [t for _, c in owned for t in c.tensors]
    left_out = sorted({SCALE_NAMES[type(t.storage)] for t in specs if type(t.storage) in SCALE_NAMES})
    if any(t.role == "buffer" for t in specs):
        left_out.append("stored rotary buffers" if any("rotary" in t.template for t in specs) else "stored buffers")
    excluded = f" ({' and '.join(left_out)} excluded)" if left_out else ""
    return ("Derived from the pinned configuration and implementation, and equal to the count of the checkpoint’s "
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


# --------------------------------------------------------------------------------------------- evidence

def evidence(mb: ModelBuild, ancestors: tuple[Component, ...], comp: Component,
             ) -> list[tuple[ResolvedCitation, str]]:
    """The component's own citations, then the nearest ancestor's (the module that defines it), with scopes."""
    path = path_key(ancestors, comp)
    found = [(c, comp.key or "model") for c in mb.citations.get(path, ())]
    chain = list(ancestors)
    while chain and len(found) < 2:
        parent = chain.pop()
        parent_path = path_key(tuple(chain), parent)
        found += [(c, parent.key or "model") for c in mb.citations.get(parent_path, ())]
    return found


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


def ledger_view(mb: ModelBuild) -> LedgerView:
    rec = mb.checkpoint or mb.predicted or mb.reference
    rows = tuple(LedgerRowView(STORED_AS.get((t.role, t.dtype), ROLE_NAMES[t.role]), t.dtype, fmt(t.tensors),
                               fmt(t.parameters) if t.parameters else "—", fmt(t.elements), fmt(t.bytes))
                 for t in rec.totals)
    problems = (f"{len(rec.unowned)} unowned, {len(rec.owned_twice)} owned twice, {len(rec.missing)} missing, "
                f"{len(rec.shape_mismatch)} shape mismatches, {len(rec.dtype_mismatch)} dtype mismatches")
    if rec is mb.predicted:
        problems = "Predicted, not read: with no listing to compare against, nothing here is reconciled"
    ref = (f"Against the reference implementation ({mb.reference_label}): "
           f"{fmt(mb.reference.role_total('parameter')[0])} parameter tensors, "
           f"{fmt(mb.reference.role_total('parameter')[1])} elements, "
           + (f"and {fmt(mb.reference.role_total('buffer')[0])} persistent buffers of "
              f"{fmt(mb.reference.role_total('buffer')[1])} elements beside them, "
              if mb.reference.role_total('buffer')[0] else "")
           + f"{'balanced' if mb.reference.balanced else 'NOT balanced'}"
           + (f"; modules it does not build: {', '.join(mb.reference_skips)}." if mb.reference_skips else "."))
    if mb.checkpoint_index is not None:
        source = (f"Checkpoint headers of {mb.content.checkpoint.at}, "
                  f"from the recorded manifest ({mb.checkpoint_index.provenance})")
    else:
        source = ("No checkpoint tensor listing is recorded for this model: the stored layout below is predicted "
                  "from the config (each weight's storage scheme, from torch_dtype and any quantization_config, "
                  "gives its stored tensors' names, shapes and dtypes), not read from the checkpoint. Its "
                  "parameters are checked against the reference implementation.")
    return LedgerView(
        source=source, rows=rows, total_tensors=fmt(sum(t.tensors for t in rec.totals)),
        total_parameters=fmt(sum(t.parameters for t in rec.totals)),
        total_elements=fmt(sum(t.elements for t in rec.totals)), total_bytes=fmt(sum(t.bytes for t in rec.totals)),
        parameters=fmt(rec.role_total("parameter")[1]), scales=fmt(rec.role_total("quant_scale")[1]),
        buffers=fmt(rec.role_total("buffer")[1]), status=problems, balanced=rec.balanced, reference=ref,
        predicted=rec is mb.predicted)


def readable(value: int, unit: str) -> str:
    """1,026,408,232,448 -> "1.03 trillion"; bytes -> "9.21 GB" (decimal units)."""
    if unit == "bytes":
        for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if value >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value} bytes"
    for scale, name in ((1e15, "quadrillion"), (1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
        if value >= scale:
            return f"{value / scale:.3g} {name}"
    return fmt(value)


def figures_view(mb: ModelBuild) -> FiguresView:
    rows = tuple(FigureRowView(f.label, fmt(f.value), readable(f.value, "bytes" if "bytes" in f.key else ""),
                               f.formula, f.definition) for f in mb.figures.figures)
    claim, matched = "", False
    if mb.claim is not None:
        m = mb.claim.matched
        matched = m is not None
        stated = ("which, cut to the precision the lab writes, is" if mb.claim.rounding == "down" else "which rounds to")
        claim = (f"Published: {mb.claim.claim} active parameters ({mb.claim.source}). "
                 + (f"What the lab counts: {mb.claim.evidence} " if mb.claim.evidence else "")
                 + (f"Reproduced by “{m.label.lower()}” ({m.definition.rstrip('.')}): {fmt(m.value)}, {stated} "
                    f"{mb.claim.claim}." if m else "No definition derived here reproduces it within its rounding."))
    return FiguresView(rows, claim, matched)


def routing_view(mb: ModelBuild, path: str) -> RoutingView | None:
    """The worked example a router's executed check recorded, formatted per expert."""
    example = mb.checks[path].example
    if example is None:
        return None
    chosen = set(example.selected)
    n = len(example.rows[0][1])
    experts = tuple(RoutingCellView(f"expert {i + 1}", i in chosen) for i in range(n))
    rows = tuple((label, tuple(RoutingCellView(f"{v:.4f}", i in chosen) for i, v in enumerate(values)))
                 for label, values in example.rows)
    names = ", ".join(str(i + 1) for i in example.selected)
    return RoutingView(
        caption=f"Routing of one token ({example.token}) in the executed check, {mb.checks[path].config}.",
        experts=experts, rows=rows,
        summary=f"Selected: expert{'s' if len(chosen) > 1 else ''} {names} (highlighted); transformers' router "
                f"selected the same experts with the same gates, within the tolerance {mb.checks[path].tolerance:g}.")


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
        steps_label=f"All {sum(1 for s in comp.steps if not s.heading)} steps",
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
        unused=unused_view(mb) if is_model else (),
        unused_reader=FAMILIES[mb.spec.family].reference.config_class,
        variants=variant_views(mb) if is_model else (),
        calculator=calculator_view(mb.figures.serving, mb.figures.get("max_context").formula) if is_model else None)


VARIANT_STORED_AS = {
    "NVFP4": {("parameter", "U8"): "NVFP4 values: two FP4 (E2M1) per byte",
              ("quant_scale", "F32"): "per-tensor scales (weight_scale_2, input_scale)"},
    "FP8PerTensor": {("quant_scale", "F32"): "per-tensor scales (weight_scale, input_scale)"},
}
"""Row labels where a variant's scheme says what a dtype holds (U8 is NVFP4 here, not MXFP4)."""


def variant_views(mb: ModelBuild) -> tuple[VariantView, ...]:
    """Each published variant's predicted layout and numbers, formatted (explorer/variants.py computes them)."""
    out = []
    for s in mb.variants:
        m = s.variant.meta
        names = {**STORED_AS, **VARIANT_STORED_AS.get(s.scheme, {})}
        rows = tuple(LedgerRowView(names.get((r.role, r.dtype), ROLE_NAMES[r.role]), r.dtype, fmt(r.tensors),
                                   fmt(r.parameters) if r.parameters else "—", fmt(r.elements), fmt(r.bytes))
                     for r in s.rows)
        tensors = tuple((name, dtype, "[" + ", ".join(f"{d:,}" for d in shape) + "]", fmt(nbytes))
                        for name, dtype, shape, nbytes in s.tensors)
        revision = m.revision if m.revision != "unpinned" else f"revision not pinned: {m.revision_note}"
        out.append(VariantView(m.name, f"https://huggingface.co/{m.repo_id}", revision, s.storage_label, rows, tensors,
                               f"Every stored tensor ({len(tensors)} name patterns)", fmt(s.parameters), fmt(s.header_elements), fmt(s.bytes), s.naive_count_reason,
                               s.notes))
    return tuple(out)


def defaults_view(mb: ModelBuild) -> tuple[DefaultView, ...]:
    """Each defaulted key with the value the spec was built with and the reference config class it comes from."""
    family = FAMILIES[mb.spec.family]
    return tuple(DefaultView(key, config_display(_config_value(mb.spec.config, key)), family.default_source(key))
                 for key in mb.spec.defaulted)


def unused_view(mb: ModelBuild) -> tuple[UnusedKeyView, ...]:
    """Each published key recorded as unused, with its value as config.json writes it."""
    out = []
    for key in mb.content.checkpoint.config_unused:
        value: object = mb.content.config
        for part in key.split("."):  # "text_config.some_key": a key inside a nested table
            value = value[part]  # type: ignore[index]
        written = value is None or isinstance(value, (dict, list))  # published null is null, not "unset"
        shown = json.dumps(value, ensure_ascii=False) if written else config_display(value)
        out.append(UnusedKeyView(key, shown))
    return tuple(out)


def _config_value(config: object, key: str) -> object:
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def config_display(value: object) -> str:
    """A config value as config.json writes it (true, null, 1e-06)."""
    if value is None:
        return "null (unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value) if isinstance(value, (int, float)) else str(value)


def check_view(mb: ModelBuild, path: str) -> CheckView:
    """The check line; the tiny configuration is spelled out on the model page only, and linked from the rest."""
    check = mb.checks[path]
    if check.status == "checked":
        detail = f"; {check.detail}" if check.detail else ""
        lead = f"Equations executed and checked against {check.reference} on the"
        return CheckView("checked", lead, None, Link("tiny test configuration", "index.html#tiny-config"),
                         f": within the tolerance {check.tolerance:g} (max |Δ| = ", measured(check.max_abs_error),
                         f" on the machine that built this page){detail}.")
    if check.status == "part":
        title = _title_of(mb, check.part_of)
        return CheckView("part", f"Equations executed and checked as part of {title}: its step program runs "
                         "these steps and matches the reference there.", Link(title, page_href(check.part_of)))
    return CheckView("unchecked", f"Equations traced but not checked against a reference: {check.detail}.", None)


def tiny_config(mb: ModelBuild) -> str:
    """The model page's one description of the configuration every equation check runs on."""
    configs = sorted({c.config for c in mb.checks.values() if c.config})
    if not configs:
        return ""
    return ("Every equation check on these pages runs the page's step program and the reference implementation "
            f"on the same input, at the family's {'; '.join(configs)}. Small widths keep a check fast; the "
            "routing, scaling and rotary settings are the model's own.")


def real_check_view(c: RealWeightCheck) -> RealCheckView:
    return RealCheckView(
        f"Checked on the checkpoint’s real weights: block {c.layer + 1} run with the weights stored in {c.source} "
        f"and compared with {c.reference}: within the tolerance {c.tolerance:g} (max |Δ| = ",
        measured(c.max_abs_error), f" on the machine that built this page); {c.detail}.")


def measured(error: float) -> str:
    """A measured max |Δ| as the page prints it."""
    return f"{error:.1e}"


def _title_of(mb: ModelBuild, path: str) -> str:
    for anc, comp in walk(mb.spec.root):
        if path_key(anc, comp) == path:
            return comp.title if path else mb.content.meta.name
    return path


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
            return FlowNode(c.title, (f"{c.kind}, no parameters",), page_href(c_path), 0, part_id(c.key))
        if len(row.factors) == 2:
            return FlowNode(c.title, (f"{fmt(row.factors[0])} × {fmt(row.factors[1])}", f"= {fmt(row.value)} params"),
                            page_href(c_path), row.value, part_id(c.key))
        return FlowNode(c.title, (f"{fmt(row.value)} params",), page_href(c_path), row.value, part_id(c.key))

    # the boxes name each port by its symbol in the equations, as the terms that light them do
    inputs = FlowNode("in", tuple(f"{symbol_text(p.latex)} {traced_display(t, p.shape)}"
                                  for p, t in zip(comp.inputs, traced.inputs)), light=IN)
    outputs = FlowNode("out", tuple(f"{symbol_text(p.latex)} {traced_display(t, p.shape)}"
                                    for p, t in zip(comp.outputs, traced.outputs)), light=OUT)
    return flow_svg(comp.title if path else mb.content.meta.name, inputs, layout(comp, node), outputs)


def budget_preview(mb: ModelBuild) -> str:
    """Index preview: the share of parameters in each top-level part of the model."""
    segments = []
    for ch in mb.spec.root.children:
        acc = mb.ledger.accounts[ch.key]
        if ch.children and ch.kind == "group":
            for sub in ch.children:
                sub_acc = mb.ledger.accounts[f"{ch.key}.{sub.key}"]
                segments.append((sub.crumb or sub.title, sub_acc.total))
        elif acc.total:
            segments.append((ch.title, acc.total))
    return budget_svg(mb.content.meta.name, segments)


def model_card(mb: ModelBuild, preview_svg: str = "") -> ModelCardView:
    facts = mb.spec.facts
    return ModelCardView(mb.content.meta.name, f"models/{mb.slug}/index.html",
                         f"{mb.content.meta.lab} · {month(mb.content.meta.released)}", mb.content.meta.tagline,
                         fmt(mb.ledger.total), facts, mb.check_phrase, preview_svg)


@dataclass(frozen=True, slots=True)
class PageGroup:
    """Pages made on demand: the renderer makes and writes each group in one worker."""

    make: Callable[[], list[PageBase]]
    pages: int
    """How many pages it makes (the renderer hands out the largest groups first)."""


def part_path(program: str, key: str) -> str:
    """The page of one library part (a program under one key) across the models built from it."""
    return f"parts/{program}.{key}.html"
