"""The package's folders are the pipeline's stages (issue 31): each module imports only its own stage and the stages
before it (type-only imports aside), no modules import each other in a circle, the top level stays small and no
module outgrows 600 lines. Read from the source's import statements, so a moved or added module is checked as it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "explorer"

STAGES = ("base", "content", "model", "checkpoint", "execute", "figures", "views", "render", "commands", "pipeline")
"""In pipeline order; a module may import its own stage and those before it."""
BASE = {"errors", "parallel", "digest", "project", "torch_on_first_use", "spec", "__init__"}


def stage_of(module: str) -> str:
    """The stage of a dotted module name inside the package ('explorer.model.account' -> 'model')."""
    parts = module.split(".")
    first = parts[1] if len(parts) > 1 else "__init__"
    if first in BASE:
        return "base"
    if first not in STAGES:
        raise AssertionError(f"{module}: in no stage folder (stages: {', '.join(STAGES[1:])})")
    return first


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_only_lines(tree: ast.Module) -> set[int]:
    """Lines inside `if TYPE_CHECKING:` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """The package's modules that a file imports at run time (function-level imports too, unless top_level_only)."""
    tree = ast.parse(path.read_text())
    skip = _type_only_lines(tree)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "explorer":
            assert node.level == 0, f"{path}: relative import"
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                out.add(candidate if _is_module(candidate) else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "explorer")
    return out


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def stage_violations(found: dict[str, set[str]]) -> list[str]:
    """Each import that runs against the stage order."""
    rank = {s: i for i, s in enumerate(STAGES)}
    return sorted(f"{m} ({stage_of(m)}) imports {d} ({stage_of(d)})" for m, deps in found.items() for d in deps
                  if rank[stage_of(d)] > rank[stage_of(m)])


def circles(found: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every set of modules that import each other in a loop (strongly connected components of two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(found.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(tuple(sorted(group)))

    for v in sorted(found):
        if v not in index:
            visit(v)
    return out


def _without_packages(found: dict[str, set[str]]) -> dict[str, set[str]]:
    """Importing a module runs its package's __init__ first; a package face that imports its members for registration
    is not a circle with them, so package names are dropped from the graph (a package's own imports stay)."""
    return {m: {d for d in deps if not (PACKAGE / Path(*d.split(".")[1:]) / "__init__.py").is_file()}
            for m, deps in found.items()}


def test_every_import_follows_the_stage_order() -> None:
    found = {m: imports(p) for m, p in modules().items()}
    assert stage_violations(found) == []


def test_no_import_circle() -> None:
    found = _without_packages({m: imports(p, top_level_only=True) for m, p in modules().items()})
    assert circles(found) == []


def test_the_top_level_is_small_and_no_module_outgrows_600_lines() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    long = {module_name(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


@pytest.mark.parametrize("graph, expected", [
    ({"explorer.views.site": {"explorer.render.publish"}}, ["explorer.views.site (views) imports explorer.render.publish (render)"]),
    ({"explorer.render.publish": {"explorer.views.site"}}, []),
])
def test_the_stage_check_names_a_backward_import(graph, expected) -> None:
    """The check can fail: a view importing the renderer is named, the renderer importing a view is not."""
    assert stage_violations(graph) == expected


def test_the_circle_check_finds_a_planted_loop() -> None:
    graph = {"explorer.model.a": {"explorer.model.b"}, "explorer.model.b": {"explorer.model.c"},
             "explorer.model.c": {"explorer.model.a"}, "explorer.model.d": {"explorer.model.a"}}
    assert circles(graph) == [("explorer.model.a", "explorer.model.b", "explorer.model.c")]
