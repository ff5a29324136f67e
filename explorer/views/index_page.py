"""The front page's model index, built to scale to a hundred models: cards grouped by lab, then lineage, newest
first; each card says the model's kind (dense, MoE, hybrid), its attention kinds, its size, active parameters and
KV cache per token, as text and as data attributes that static/index.js filters and sorts by. Without JavaScript
the page is the grouped list. Everything here is read from the content (lab, lineage, release month) and from the
stages that computed it (the ledger, the derived figures, the whole-model picture's layer kinds); this module only
groups and formats."""

from __future__ import annotations

from dataclasses import dataclass

from explorer.figures.calculator import size
from explorer.figures.model_build import ModelBuild
from explorer.views.basics import fmt, month
from explorer.views.model_page import budget_preview
from explorer.views.model_picture import describe

MIXER_FILTERS = {"full": "full attention", "global": "full attention", "nope": "full attention",
                 "sliding": "sliding window", "chunked": "chunked", "mla": "latent (MLA)", "dsa": "sparse (DSA)",
                 "csa": "compressed", "hca": "compressed", "linear": "linear (delta rule)", "mamba": "Mamba-2"}
"""The whole-model picture's mixer classes, as the index's attention filter names them (NoPE layers are full
attention without a position encoding; DeepSeek-V4's two compressed kinds are one filter; Gated DeltaNet and KDA, both
delta-rule recurrences with a fixed state, are one)."""

SIZES = ((10**10, "under 10B"), (10**11, "10B to 100B"), (5 * 10**11, "100B to 500B"), (None, "500B and more"))
"""Buckets of total parameters for the size filter: (upper bound, exclusive; None: no bound), label."""

KINDS = ("dense", "MoE", "hybrid")
"""The architecture filter: dense or mixture-of-experts feed-forward, and hybrid (recurrent layers beside
attention); a hybrid MoE model is both."""

@dataclass(frozen=True, slots=True)
class IndexCard:
    """One model on the index."""

    name: str
    href: str
    meta: str
    tagline: str
    params: str
    active: str
    cache: str
    cache_note: str
    """What the cache figure leaves out (a hybrid's recurrent layers keep a fixed state instead)."""
    facts: tuple[tuple[str, str], ...]
    kinds: tuple[str, ...]
    attention: tuple[str, ...]
    size: str
    checked: str
    preview_svg: str
    released: str
    """"YYYY-MM", for sorting (empty where not recorded)."""
    total_value: int
    active_value: int
    cache_value: int
    """Bytes per token at BF16, for sorting."""


@dataclass(frozen=True, slots=True)
class Lineage:
    name: str
    cards: tuple[IndexCard, ...]


@dataclass(frozen=True, slots=True)
class LabGroup:
    lab: str
    anchor: str
    lineages: tuple[Lineage, ...]
    count: str
    """"3 models"."""


@dataclass(frozen=True, slots=True)
class IndexFilters:
    """The filter controls' options, in the order shown."""

    kinds: tuple[str, ...]
    attention: tuple[str, ...]
    sizes: tuple[str, ...]


def size_bucket(total: int) -> str:
    return next(label for bound, label in SIZES if bound is None or total < bound)


def lineage_of(mb: ModelBuild, by_slug: dict[str, ModelBuild]) -> str:
    """The content's lineage; where none is recorded, that of the model it follows in the same lab, else its own
    name (a lineage of one)."""
    seen: set[str] = set()
    current = mb
    while not current.content.meta.lineage:
        parent = by_slug.get(current.content.meta.follows)
        if parent is None or parent.content.meta.lab != mb.content.meta.lab or parent.slug in seen:
            return mb.content.meta.name
        seen.add(parent.slug)
        current = parent
    return current.content.meta.lineage


def index_card(mb: ModelBuild) -> IndexCard:
    picture = describe(mb.spec, mb.content.meta.name)
    mixers = [k.mixer.css for k in picture.kinds]
    kinds = tuple(k for k, present in zip(KINDS, (
        not any(k.ffn.css.startswith("moe") for k in picture.kinds),
        any(k.ffn.css.startswith("moe") for k in picture.kinds),
        any(m in ("linear", "mamba") for m in mixers))) if present)
    attention = tuple(dict.fromkeys(MIXER_FILTERS[m] for m in mixers if m in MIXER_FILTERS))
    figures = mb.figures
    total, active = figures.get("total_parameters").value, figures.get("active_parameters").value
    cache = figures.get("kv_cache_bytes_per_token_bf16").value
    recurrent = any(k.state for k in figures.serving.kinds)
    meta = mb.content.meta
    return IndexCard(meta.name, f"models/{mb.slug}/index.html", f"{meta.lab} · {month(meta.released)}", meta.tagline,
                     fmt(total), fmt(active), size(cache),
                     "attention layers only; the recurrent layers keep a fixed-size state" if recurrent else "",
                     mb.spec.facts, kinds, attention, size_bucket(total), mb.check_phrase, budget_preview(mb),
                     meta.released, total, active, cache)


def _newest(cards: list[IndexCard]) -> str:
    return max(c.released for c in cards)


def _anchor(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")


def index_groups(builds: list[ModelBuild]) -> tuple[LabGroup, ...]:
    """Labs, then their lineages, then models: each newest first (ties keep the content's order)."""
    by_slug = {mb.slug: mb for mb in builds}
    ordered = sorted(builds, key=lambda mb: mb.content.meta.order)
    labs: dict[str, dict[str, list[IndexCard]]] = {}
    for mb in ordered:
        lineage = lineage_of(mb, by_slug)
        labs.setdefault(mb.content.meta.lab, {}).setdefault(lineage, []).append(index_card(mb))
    groups = []
    for lab, lineages in labs.items():
        lines = [Lineage(name, tuple(sorted(cards, key=lambda c: c.released, reverse=True)))  # sorted is stable
                 for name, cards in lineages.items()]
        lines.sort(key=lambda ln: _newest(list(ln.cards)), reverse=True)
        n = sum(len(ln.cards) for ln in lines)
        groups.append(LabGroup(lab, "lab-" + _anchor(lab), tuple(lines), f"{n} model{'s' if n != 1 else ''}"))
    groups.sort(key=lambda g: g.lab.lower())
    groups.sort(key=lambda g: max(c.released for ln in g.lineages for c in ln.cards), reverse=True)
    return tuple(groups)


def index_filters(groups: tuple[LabGroup, ...]) -> IndexFilters:
    cards = [c for g in groups for ln in g.lineages for c in ln.cards]
    present = {a for c in cards for a in c.attention}
    sizes = {c.size for c in cards}
    return IndexFilters(tuple(k for k in KINDS if any(k in c.kinds for c in cards)),
                        tuple(a for a in dict.fromkeys(MIXER_FILTERS.values()) if a in present),
                        tuple(label for _, label in SIZES if label in sizes))
