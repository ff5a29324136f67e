#!/usr/bin/env python3
"""Build benchmark: the whole site cold and with a warm cache, the torch stages per model, and per page.

Every time is also printed as a ratio against a reference measured in the same run (rendering one trivial
Jinja page to disk), so numbers compare across machines of different speed.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def best_of(fn, repeat: int = 1):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def reference_unit() -> float:
    """Seconds to render and write one small page with Jinja2 (autoescape on)."""
    from jinja2 import Environment

    template = Environment(autoescape=True).from_string(
        "<html><body>{% for i in items %}<p>{{ i }}</p>{% endfor %}</body></html>")
    with tempfile.TemporaryDirectory() as tmp:
        def hundred() -> None:
            for _ in range(100):
                (Path(tmp) / "page.html").write_text(template.render(items=range(50)))
        seconds, _ = best_of(hundred, repeat=5)
    return seconds / 100


def main() -> None:
    from explorer.content import load_all_models
    from explorer.execute import execute
    from explorer.families import FAMILIES, load_model_spec
    from explorer.pipeline import Project, build_site

    unit = reference_unit()
    print(f"reference unit: one trivial page rendered and written in {unit * 1e3:.3f} ms")

    def show(label: str, seconds: float) -> None:
        print(f"{label}: {seconds:.2f} s = {seconds / unit:,.0f} units")

    for content in load_all_models(ROOT / "content"):
        spec = load_model_spec(content)
        seconds, _ = best_of(lambda spec=spec: execute(spec, FAMILIES[spec.family].reference.not_built))
        show(f"trace at full size on meta + equation checks, {spec.slug}", seconds)

    with tempfile.TemporaryDirectory() as tmp:
        project_root = Path(tmp) / "project"
        for name in ("content", "templates", "static"):
            shutil.copytree(ROOT / name, project_root / name)
        project = Project(project_root)
        out = Path(tmp) / "site"
        cold, _ = best_of(lambda: build_site(project, out, lambda _: None))
        warm, _ = best_of(lambda: build_site(project, out, lambda _: None), repeat=2)
        pages = sum(1 for _ in out.rglob("*.html"))
    show(f"whole site, cold cache ({pages} pages)", cold)
    show("whole site, warm cache (nothing changed)", warm)
    show("per page, warm cache", warm / pages)
    print(f"warm / cold: {warm / cold:.2f}")


if __name__ == "__main__":
    main()
