"""Parts describe themselves (issue 31): what a later stage needs to know about a library part is declared in the
part's own module (explorer/model/components/part_facts.py), so no module outside explorer/model/components/ names
a part's program. Read from the source, so a module that adds a switch on a program name is caught as it is written.

A program name that is a plain word ("router", "rope", "block", "mtp") is also a child key, a CSS class or a path
segment, so such a name counts only where it is used as a program: compared with or tested against something named
`program`/`progs`, or in a table whose every string is a program name. A name no other use could share (it holds an
underscore or a digit: "gated_deltanet", "v4_attention") counts wherever it is a string literal, except as a child
key (a parameter or keyword named `key` or `..._key`: a vision tower's child is keyed "vision_tower").
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import explorer.model.families  # noqa: F401  (imports every library part, so every program is registered)
from explorer.model.components.base import PROGRAMS
from explorer.model.components.part_facts import PART_FACTS, declare, facts
from explorer.views.flows import LAYOUTS

PACKAGE = Path(__file__).resolve().parent.parent / "explorer"
COMPONENTS = PACKAGE / "model" / "components"
PROGRAM_CONTEXT = re.compile(r"program|progs", re.IGNORECASE)

KNOWN_REMAINING: set[tuple[str, str]] = set()
"""(module, program) switches not yet moved into the part's declarations; it may only shrink."""


def _strings(node: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _is_program_table(node: ast.AST, names: frozenset[str]) -> bool:
    """A dict, set, tuple or list display whose strings (a dict's keys) are two or more program names and nothing
    else."""
    if isinstance(node, ast.Dict):
        items: list[ast.AST | None] = list(node.keys)
    elif isinstance(node, ast.Set | ast.Tuple | ast.List):
        items = list(node.elts)
    else:
        return False
    strings = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    return len(strings) >= 2 and len(strings) == len(items) and all(s in names for s in strings)


def _child_keys(tree: ast.AST) -> set[int]:
    """ids of the string constants given as a child key: a keyword `key=`/`..._key=`, or such a parameter's
    default."""
    keyed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg and (node.arg == "key" or node.arg.endswith("_key")):
            keyed.add(id(node.value))
        elif isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            pairs = list(zip(positional[len(positional) - len(node.defaults):], node.defaults))
            pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
            keyed |= {id(d) for a, d in pairs if a.arg == "key" or a.arg.endswith("_key")}
    return keyed


def program_mentions(source: str, names: frozenset[str]) -> set[tuple[int, str]]:
    """(line, program) wherever the source names a registered program (the module docstring says when a name
    counts)."""
    found: set[tuple[int, str]] = set()
    tree = ast.parse(source)
    keys = _child_keys(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names \
                and re.search(r"[_0-9]", node.value) and id(node) not in keys:
            found.add((node.lineno, node.value))
        elif isinstance(node, ast.Compare) and PROGRAM_CONTEXT.search(ast.unparse(node)):
            found |= {(s.lineno, s.value) for s in _strings(node) if s.value in names}
        elif _is_program_table(node, names):
            found |= {(s.lineno, s.value) for s in _strings(node) if s.value in names}
    return found


def _outside_parts() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if COMPONENTS not in p.parents)


def _names() -> frozenset[str]:
    return frozenset(PROGRAMS)


def test_no_module_outside_the_parts_names_a_program() -> None:
    names = _names()
    hits = {(str(p.relative_to(PACKAGE.parent)), name): line for p in _outside_parts()
            for line, name in program_mentions(p.read_text(), names)}
    unexpected = sorted(f"{module}:{line}: {name!r}" for (module, name), line in hits.items()
                        if (module, name) not in KNOWN_REMAINING)
    assert not unexpected, "declare these in the part's module (part_facts.py) instead:\n" + "\n".join(unexpected)
    stale = sorted(KNOWN_REMAINING - set(hits))
    assert not stale, f"no longer needed, remove from KNOWN_REMAINING: {stale}"


@pytest.mark.parametrize("planted", [
    'if comp.program == "gated_deltanet":\n    pass\n',  # a switch on a program
    'KINDS = {"mla": 1, "dsa": 2}\n',  # a table keyed by program names
    'progs = set()\nlocal = "mtp" in progs\n',  # a plain-word program tested against a block's programs
    'TITLE = "v4_attention"\n',  # a name no other use shares, anywhere
])
def test_the_grep_finds_a_planted_program_name(planted: str) -> None:
    assert program_mentions(planted, _names())


@pytest.mark.parametrize("benign", [
    'router = next(c for c in comp.children if c.key == "router")\n',  # a child key
    'CSS = {"mla": "latent (MLA)", "full": "full attention"}\n',  # a table that is not of programs alone
    'prefix = path.startswith("mtp")\n',
    'def tower(spec, tower_key: str = "vision_tower"):\n    return spec.root.child(key="vision_tower")\n',
])
def test_the_grep_passes_a_word_that_is_not_used_as_a_program(benign: str) -> None:
    assert not program_mentions(benign, _names())


def test_every_declaration_names_a_registered_program() -> None:
    assert not set(PART_FACTS) - set(PROGRAMS), "a fact declared for a program no part registers"


def test_every_declared_layout_is_drawn() -> None:
    layouts = {p: f.layout for p, f in PART_FACTS.items() if f.layout}
    assert layouts and not {p: name for p, name in layouts.items() if name not in LAYOUTS}
    assert not set(LAYOUTS) & set(PROGRAMS), "layouts are named for the drawing, not for a program"


def test_a_fact_is_checked_when_declared() -> None:
    with pytest.raises(TypeError, match="no part fact"):
        declare("gated_mlp", draws_as="swiglu")
    with pytest.raises(RuntimeError, match="declared twice"):
        declare("gated_mlp", layout="routed-experts")
    assert facts("gated_mlp").layout == "swiglu" and facts("no such program") == facts("another")
