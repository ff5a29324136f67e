"""The check that every factor a program applies is shown by a step (explorer/model/components/step_terms.py
declares the terms): it imports every module that registers terms, so the registry is whole when it runs."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

# Each registers its options' terms on import: feed-forward, head and vision; the token mixers.
from explorer.model.components import step_terms_ffn, step_terms_mixers  # noqa: F401
from explorer.model.components.step_terms import SWITCHES, TERMS, Term, TermsOf
from explorer.spec.types import Component


def unshown_terms(comp: Component) -> list[str]:
    """Each factor comp's program applies that its steps do not name, and each options field not classed;
    [] for a component whose options class is not registered (see registered())."""
    if comp.options is None or type(comp.options) not in TERMS:
        return []
    fn, structural = TERMS[type(comp.options)]
    terms = fn(comp.options)
    out = [f"options field '{f.name}' of {type(comp.options).__name__} is neither a factor a step names nor "
           "structural" for f in fields(comp.options)  # type: ignore[arg-type]  # every registered options class is a dataclass
           if f.name not in structural
           and f.name not in {t.field for t in _all_terms(fn, comp.options)}]
    for t in terms:
        if t.programs and comp.program not in t.programs:
            continue
        steps = [s for s in comp.steps if not t.step or s.name == t.step]
        if not any(text in s.latex for s in steps for text in (t.latex, *t.also)):
            where = f"step '{t.step}'" if t.step else "no step"
            out.append(f"{where} shows {t.field} = {getattr(comp.options, t.field)!r} (expected {t.latex!r} in it)")
    return out


def _all_terms(fn: TermsOf, o: Any) -> tuple[Term, ...]:
    """The terms of `o` and of the field values that switch other terms on (every field a program may read)."""
    return fn(o) + tuple(Term(f, "", "") for f in SWITCHES.get(type(o), ()))


def registered() -> tuple[type, ...]:
    return tuple(TERMS)

