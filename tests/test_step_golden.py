"""Every displayed step of every model, held in tests/golden/steps/SLUG.txt: a step whose formula is edited alone
(its LaTeX changed, with the program untouched) fails here naming the model, the component and the step (issue 19:
"editing ... any step's formula alone makes --check or the suite fail naming it").

The golden pages (test_golden.py) hold a few whole pages; this holds every step of all models, one line a step.
`pytest --update-golden` rewrites them, and a person reads the diff before committing it, as for the pages: the
formulas are then reviewed text, and the executed checks and tests/test_truth.py tie them to what runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import ROOT

from explorer.content.model_content import load_all_models
from explorer.model.families import load_model_spec
from explorer.spec.types import ModelSpec, path_key, walk

STEPS = Path(__file__).parent / "golden" / "steps"


def steps_text(spec: ModelSpec) -> str:
    """Each component with its program, then one line a step: its anchor name and its LaTeX."""
    lines = []
    for ancestors, comp in walk(spec.root):
        if comp.steps:
            lines.append(f"## {path_key(ancestors, comp)} ({comp.program or 'composite'})")
            lines += [f"{s.name or '-'}{' [heading]' if s.heading else ''}: {s.latex}" for s in comp.steps]
    return "\n".join(lines) + "\n"


def step_differences(golden: str, now: str) -> list[str]:
    """'component › step: golden … / now …' for each line that differs, in order; components are the '## ' lines."""
    out, where = [], ""
    old, new = golden.splitlines(), now.splitlines()
    for i in range(max(len(old), len(new))):
        a = old[i] if i < len(old) else "(none)"
        b = new[i] if i < len(new) else "(none)"
        if b.startswith("## "):
            where = b[3:]
        if a != b:
            out.append(f"{where} › line {i + 1}: golden {a!r} / now {b!r}")
    return out


@pytest.fixture(scope="module")
def specs() -> dict[str, ModelSpec]:
    return {m.slug: load_model_spec(m) for m in load_all_models(ROOT / "content")}


def test_every_model_has_a_steps_golden(specs):
    assert sorted(p.stem for p in STEPS.glob("*.txt")) == sorted(specs)


def test_every_step_matches_its_golden(specs, request):
    problems = []
    for slug, spec in sorted(specs.items()):
        now, golden = steps_text(spec), STEPS / f"{slug}.txt"
        if request.config.getoption("--update-golden"):
            STEPS.mkdir(parents=True, exist_ok=True)
            golden.write_text(now, encoding="utf-8")
            continue
        problems += [f"{slug} › {d}" for d in step_differences(golden.read_text(encoding="utf-8"), now)[:5]]
    assert problems == [], "steps changed (read the diff, then pytest --update-golden):\n" + "\n".join(problems)


def test_one_step_edited_alone_is_named(specs):
    spec = specs["gpt-oss-20b"]
    golden = steps_text(spec)
    experts = next(c for _, c in walk(spec.root) if any(s.name == "routed-sum" for s in c.steps))
    edited_steps = tuple(dataclasses.replace(s, latex=s.latex.replace(r"\sum", r"\prod"))
                         if s.name == "routed-sum" else s for s in experts.steps)
    edited = dataclasses.replace(experts, steps=edited_steps)
    now = steps_text(dataclasses.replace(spec, root=_replaced(spec.root, experts, edited)))
    differences = step_differences(golden, now)
    assert differences and all("routed-sum" in d for d in differences)
    assert any(f"› {path_key_of(spec, experts)} " in f"› {d}" for d in differences)


def _replaced(node, old, new):
    """The tree `node` with the component `old` replaced by `new` (components are frozen dataclasses)."""
    if node is old:
        return new
    children = getattr(node, "children", ())
    if not children:
        return node
    return dataclasses.replace(node, children=tuple(_replaced(c, old, new) for c in children))


def path_key_of(spec: ModelSpec, comp) -> str:
    return next(path_key(a, c) for a, c in walk(spec.root) if c is comp)
