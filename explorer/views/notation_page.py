"""The Notation page: every symbol of explorer/model/notation.py as MathML, with its meaning and a link to the first step
of the site that computes it (or, for a parameter, a constant or an index, the first step that reads it).

Where a symbol is defined is found by walking the built models in site order with explorer/model/step_symbols.py; a
leaf component (its own page, fewest steps) is preferred over the blocks that splice its steps in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from explorer.model.notation import SYMBOLS, Symbol, lookup
from explorer.model.step_symbols import parse_step
from explorer.spec.types import Component, ModelSpec, Step, path_key, walk
from explorer.views.basics import Link, PageBase, page_href
from explorer.views.mathml import to_mathml

_GREEK = {"α": "alpha", "β": "beta", "γ": "gamma", "δ": "delta", "ζ": "zeta", "η": "eta", "θ": "theta",
          "κ": "kappa", "λ": "lambda", "μ": "mu", "ξ": "xi", "π": "pi", "ρ": "rho", "σ": "sigma", "τ": "tau",
          "φ": "phi", "χ": "chi", "ψ": "psi", "ω": "omega", "Δ": "Delta", "Γ": "Gamma"}
_SYMBOL_IN_TEXT = re.compile(r"(?<![A-Za-z\\])([A-Za-z" + "".join(_GREEK) + r"]'?(?:[_^](?:\{[^{}]*\}|[A-Za-z0-9]+))+)")
"""A symbol with its scripts inside a meaning's prose (Q_h, x_{L,i}, W_{DKV}, e^{−z}), rendered as MathML."""

KIND_LABEL = {"computed": "computed", "parameter": "learned", "constant": "constant", "index": "index",
              "function": "function"}


@dataclass(frozen=True, slots=True)
class NotationEntryView:
    anchor: str
    """Id of the entry's row, so pages can link one symbol."""
    mathml: str
    kind: str
    meaning: tuple[tuple[str, bool], ...]
    """The meaning as (text, False) and (MathML, True) parts: symbols inside it render like the equations."""
    also: tuple[tuple[str, bool], ...]
    """A second use still made of the symbol (a known overload), in the same parts; () for none."""
    where: Link | None
    """The step that defines the symbol (or first uses it); None for a symbol no built model uses."""


@dataclass(frozen=True, slots=True)
class NotationSectionView:
    title: str
    anchor: str
    entries: tuple[NotationEntryView, ...]


@dataclass(frozen=True, slots=True)
class NotationPage(PageBase):
    heading: str
    intro_html: str
    sections: tuple[NotationSectionView, ...]


def meaning_parts(meaning: str) -> tuple[tuple[str, bool], ...]:
    """Split a meaning's prose around the symbols it names, each converted to MathML."""
    parts: list[tuple[str, bool]] = []
    at = 0
    for m in _SYMBOL_IN_TEXT.finditer(meaning):
        parts += [(meaning[at:m.start()], False), (to_mathml(_latex_of(m.group(1))), True)]
        at = m.end()
    return tuple(p for p in (*parts, (meaning[at:], False)) if p[0])


def _latex_of(text: str) -> str:
    """"d_head" -> d_{\\mathrm{head}}, "κ_h" -> \\kappa_h, "e^{−z}" -> e^{-z}."""
    text = re.sub(r"_([A-Za-z]{2,})", r"_{\\mathrm{\1}}", text.replace("−", "-"))
    return "".join(f"\\{_GREEK[c]} " if c in _GREEK else c for c in text)


def symbol_anchor(latex: str) -> str:
    """A stable id for a symbol: "\\hat c^{KV}" -> "sym-hat-c-KV", "x'" -> "sym-x-prime"."""
    return "sym-" + "-".join(w for w in re.split(r"[^A-Za-z0-9]+", latex.replace("'", " prime ")) if w)


@dataclass(frozen=True, slots=True)
class _Use:
    model: str
    path: str
    anchor: str
    composite: bool
    """Whether the component splices its parts' steps in: the first leaf in site order is linked, a composite only
    where no leaf has the symbol."""


def _uses(specs: list[ModelSpec]) -> tuple[dict[str, _Use], dict[str, _Use]]:
    """(symbol -> where a step defines it, symbol -> where a step first reads it), leaf components first."""
    defined: dict[str, _Use] = {}
    read: dict[str, _Use] = {}
    for spec in specs:
        for anc, comp in walk(spec.root):
            for step, prefix in _shown_steps(comp):
                parsed = parse_step(step.latex)
                use = _Use(spec.slug, path_key(anc, comp), prefix + step.name, bool(comp.children))
                for table, symbols in ((defined, parsed.defines), (read, parsed.reads | parsed.indices)):
                    for s in symbols:
                        key = _registered(s)
                        if key and (key not in table or use.composite < table[key].composite):
                            table[key] = use
    return defined, read


def _registered(symbol: str) -> str:
    entry = lookup(symbol)
    return entry.latex if entry else ""


def _shown_steps(comp: Component) -> list[tuple[Step, str]]:
    """The steps a component page shows with an anchor: its equations ("eq-"), then its other steps ("step-")."""
    named = [(s, "eq-") for s in comp.equations if s.name and not s.heading]
    shown = {s.name for s, _ in named}
    return named + [(s, "step-") for s in comp.steps if s.name and not s.heading and s.name not in shown]


def _where(entry: Symbol, defined: dict[str, _Use], read: dict[str, _Use]) -> Link | None:
    use = defined.get(entry.latex) if entry.kind == "computed" else None
    use = use or read.get(entry.latex) or defined.get(entry.latex)
    if use is None:
        return None
    verb = "defined" if use is defined.get(entry.latex) else "first used"
    return Link(f"{verb} on {use.model} › {use.path or 'model'}",
                f"models/{use.model}/{page_href(use.path)}#{use.anchor}")


def notation_page(specs: list[ModelSpec], intro_html: str) -> NotationPage:
    """The Notation page, one section per registry section, in the registry's order."""
    defined, read = _uses(specs)
    sections: dict[str, list[NotationEntryView]] = {}
    for entry in SYMBOLS:
        sections.setdefault(entry.section, []).append(NotationEntryView(
            symbol_anchor(entry.latex), to_mathml(entry.latex), KIND_LABEL[entry.kind], meaning_parts(entry.meaning),
            meaning_parts(entry.also),
            _where(entry, defined, read)))
    return NotationPage(
        "Notation", "Every symbol the equations use, defined once, with the step that computes it.", "",
        "glossary.html", "Notation", intro_html,
        tuple(NotationSectionView(title, "notation-" + "-".join(title.lower().split()), tuple(entries))
              for title, entries in sections.items()))
