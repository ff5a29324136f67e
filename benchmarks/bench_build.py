#!/usr/bin/env python3
"""Build benchmark: cold build, warm build and no-change rebuild, per model and for the whole site.

Every figure is a ratio to B0, measured in the same run: a bare Python that imports torch and transformers
and DeepseekV3ForCausalLM (the least a build that runs the torch stages pays), so numbers compare across
machines and across loads of a shared machine. Each build runs as a user runs it, `build.py` in its own
process, on a copy of the project holding only the models measured:
- cold: an empty .cache and no output folder (every torch stage runs);
- warm: the cache filled, no output folder (torch stages from the cache; everything else recomputed);
- no change: the same command again (the up-to-date check answers).
CPU is user + system time of the build and its workers, over wall time (200 % = both cores busy).
The scaling lines build the first 2, the first 8 and all models together. The ledger line times Kimi K2's
manifest read and reconciliation (139,644 tensors) in a process that has already imported the package.
Issue 14's targets at all models: cold <= 3x B0, warm <= 1x B0, no change <= 1 s, cold CPU > 150 %,
Kimi K2 ledger <= 0.2 s.
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
B0_CODE = "import torch, transformers; from transformers import DeepseekV3ForCausalLM"
LEDGER_CODE = """
import sys, time
from pathlib import Path
from explorer.checkpoint.manifest import read_manifest
from explorer.content.model_content import load_model_content
from explorer.model.families import load_model_spec
from explorer.checkpoint.reconcile import reconcile
content = load_model_content(Path(sys.argv[1]))
spec = load_model_spec(content)
best = float("inf")
for _ in range(5):
    start = time.perf_counter()
    balanced = reconcile(spec, read_manifest(content.folder / "checkpoint.toml")).balanced
    best = min(best, time.perf_counter() - start)
assert balanced
print(best)
"""


@dataclass(frozen=True, slots=True)
class Run:
    wall: float
    cpu: float
    """User + system seconds of the process and all its children."""


def timed(cmd: list[str]) -> Run:
    """Run a command to completion; its wall time and the CPU time it and its children used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{result.stderr}")
    return Run(wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def baseline(repeat: int) -> Run:
    """B0: the fastest of `repeat` bare imports of torch and transformers' DeepSeek-V3 model."""
    return min((timed([sys.executable, "-c", B0_CODE]) for _ in range(repeat)), key=lambda r: r.wall)


def project_with(models: list[str], dest: Path) -> Path:
    """A copy of the project's inputs holding only `models`, with no .cache."""
    for name in ("templates", "static"):
        shutil.copytree(ROOT / name, dest / name)
    (dest / "content/models").mkdir(parents=True)
    for page in ("how-to-read.md", "glossary.md"):
        shutil.copy(ROOT / "content" / page, dest / "content" / page)
    for slug in models:
        shutil.copytree(ROOT / "content/models" / slug, dest / "content/models" / slug)
        toml = dest / "content/models" / slug / "model.toml"
        follows = _FOLLOWS.search(toml.read_text())
        if follows and follows.group(1) not in models:  # its predecessor is not in the copy: nor is their comparison
            toml.write_text(_FOLLOWS.sub("", toml.read_text(), count=1))
    return dest


_FOLLOWS = re.compile(r'^follows = "([^"]+)"\n', re.M)
"""model.toml's `model.follows` line (the model this one is compared with on a static page)."""


def measure(models: list[str], tmp: Path) -> tuple[Run, Run, Run, int]:
    """Cold, warm and no-change builds of a project holding `models`; also the number of pages."""
    project = project_with(models, tmp / "project")
    out = tmp / "site"
    build = [sys.executable, str(ROOT / "build.py"), "--content", str(project), "--out", str(out)]
    cold = timed(build)
    shutil.rmtree(out)
    warm = timed(build)
    unchanged = timed(build)
    return cold, warm, unchanged, sum(1 for _ in out.rglob("*.html"))


def ledger_seconds(slug: str) -> float:
    """The fastest of five manifest reads and reconciliations of one model, imports excluded."""
    result = subprocess.run([sys.executable, "-c", LEDGER_CODE, str(ROOT / "content/models" / slug)],
                            capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"ledger timing failed:\n{result.stderr}")
    return float(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="B0 measurements to take the fastest of")
    args = parser.parse_args()
    slugs = sorted(p.name for p in (ROOT / "content/models").iterdir() if (p / "model.toml").exists())
    b0 = baseline(args.repeat)
    print(f"B0 (python -c '{B0_CODE}'): {b0.wall:.2f} s wall, {b0.cpu:.2f} s CPU")
    print("wall ×B0 is against B0's wall time, CPU ×B0 against its CPU time (steadier on a shared machine)")
    print(f"{'models':<16}{'pages':>6}  {'build':<10}{'wall':>9}{'×B0':>7}{'CPU':>9}{'×B0':>7}{'CPU use':>9}")
    scopes = [[slug] for slug in slugs] + [slugs[:n] for n in (2, 8) if n < len(slugs)] + [slugs]
    totals = {}
    for models in scopes:
        with tempfile.TemporaryDirectory() as tmp:
            runs = measure(models, Path(tmp))
        label = models[0] if len(models) == 1 else f"{'all' if models == slugs else 'first'} {len(models)} models"
        for kind, run in zip(("cold", "warm", "no change"), runs[:3]):
            print(f"{label:<16}{runs[3]:>6}  {kind:<10}{run.wall:>7.2f} s{run.wall / b0.wall:>7.2f}{run.cpu:>7.2f} s"
                  f"{run.cpu / b0.cpu:>7.2f}{run.cpu / run.wall:>9.0%}")
        if models == slugs:
            totals = dict(zip(("cold", "warm", "no change"), runs[:3]))
    ledger = ledger_seconds("kimi-k2")
    print(f"Kimi K2 ledger (manifest read + reconcile, 139,644 tensors): {ledger:.3f} s, {ledger / b0.wall:.3f} × B0")
    cold, warm, unchanged = totals["cold"], totals["warm"], totals["no change"]
    verdicts = [("cold <= 3×B0", cold.wall / b0.wall <= 3 and cold.cpu / b0.cpu <= 3),
                ("warm <= 1×B0", warm.wall / b0.wall <= 1 and warm.cpu / b0.cpu <= 1),
                ("no change <= 1 s", unchanged.wall <= 1), ("cold CPU use > 150 %", cold.cpu / cold.wall > 1.5),
                ("Kimi K2 ledger <= 0.2 s", ledger <= 0.2)]
    print("issue 14's targets at all models (wall and CPU): "
          + "; ".join(f"{name} {'met' if ok else 'NOT met'}" for name, ok in verdicts))


if __name__ == "__main__":
    main()
