#!/usr/bin/env python3
"""Scaling benchmark (issue 26): the build and the site at 15, 30 and 50 models, as ratios to B0 measured in the
same run, so that a reader sees the slope.

The content is grown in a scratch copy: the project's real models first (in site order), then variants of them
added as a user adds a model, `build.py --add-model` with a config.json that differs from the real one in its
layer count (each variant is a model of its own: its own pages, checks and cache entries). For each size it prints
cold (no .cache, no output), warm (cache filled, no output) and no-change builds (each the fastest of --repeat
runs, as B0 is), in wall and CPU time as ratios to B0, the pages, the site's bytes per model and the search index's
bytes per model; then the slopes (seconds per added model from 15 to 30 and from 30 to 50) and issue 26's targets:
cold <= 3x B0 and warm <= 1x B0 at 30 models; the 30 -> 50 slope no steeper than 15 -> 30; no change <= 1 s;
site bytes per model constant within 20 %.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from bench_build import B0_CODE, ROOT, Run, baseline, project_with, timed

VARIED = ("gpt2", "smollm2-135m", "qwen3-8b", "llama-3.1-8b", "gemma-3-270m", "mixtral-8x7b", "qwen3-30b-a3b",
          "gpt-oss-20b")
"""Models whose variants grow the content (small layer counts keep a variant's checks as cheap as its model's)."""


def real_slugs() -> list[str]:
    """The project's models in site order."""
    found = []
    for folder in (ROOT / "content/models").iterdir():
        if (folder / "model.toml").exists():
            meta = tomllib.loads((folder / "model.toml").read_text())["model"]
            found.append((meta.get("order", 0), folder.name))
    return [slug for _, slug in sorted(found)]


def published_config(slug: str) -> dict:
    """The model's config.json as its content records it (nulls restored)."""
    data = tomllib.loads((ROOT / "content/models" / slug / "model.toml").read_text())
    config = dict(data["config"])
    config.update(dict.fromkeys(data["checkpoint"].get("config_nulls", []), None))
    return config


def add_variants(project: Path, count: int, scratch: Path) -> None:
    """Add `count` variants of VARIED models to the project with --add-model, each with another layer count."""
    for i in range(count):
        base = VARIED[i % len(VARIED)]
        config = published_config(base)
        layers_key = "n_layer" if "n_layer" in config else "num_hidden_layers"
        config[layers_key] = max(2, int(config[layers_key]) - 1 - i // len(VARIED))
        if "layer_types" in config:
            config["layer_types"] = config["layer_types"][:config[layers_key]]
        path = scratch / f"variant-{i}.json"
        path.write_text(json.dumps(config))
        cmd = [sys.executable, str(ROOT / "build.py"), "--content", str(project), "--add-model", f"variant-{i}",
               "--config", str(path), "--repo", f"bench/variant-{i}", "--revision", "0" * 40]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"adding a variant of {base} failed:\n{result.stderr}")


def measure(size: int, tmp: Path, repeat: int) -> dict:
    """Cold, warm and no-change builds of a project of `size` models, each the fastest of `repeat` (as B0 is: a
    shared machine only ever slows a run down), with the site's sizes."""
    real = real_slugs()
    project = project_with(real[:size], tmp / "project")
    add_variants(project, max(0, size - len(real)), tmp)
    out = tmp / "site"
    build = [sys.executable, str(ROOT / "build.py"), "--content", str(project), "--out", str(out)]

    def fastest(before) -> Run:
        runs = []
        for _ in range(repeat):
            before()
            runs.append(timed(build))
        return min(runs, key=lambda r: r.wall)

    cold = fastest(lambda: (shutil.rmtree(project / ".cache", ignore_errors=True), shutil.rmtree(out, ignore_errors=True)))
    warm = fastest(lambda: shutil.rmtree(out))
    unchanged = fastest(lambda: None)
    files = [p for p in out.rglob("*") if p.is_file()]
    return {"cold": cold, "warm": warm, "no change": unchanged, "pages": sum(1 for p in files if p.suffix == ".html"),
            "site_bytes": sum(p.stat().st_size for p in files),
            "search_bytes": sum(p.stat().st_size for p in files if p.name.startswith("search-index"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="15,30,50", help="model counts to build (default 15,30,50)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of B0 and of each build to take the fastest of")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    load_before = os.getloadavg()[0]  # the ratios assume an otherwise idle machine: say how idle it was
    b0: Run = baseline(args.repeat)
    print(f"B0 (python -c '{B0_CODE}'): {b0.wall:.2f} s wall, {b0.cpu:.2f} s CPU")
    print(f"{'models':>6}{'pages':>7}  {'build':<10}{'wall':>9}{'×B0':>7}{'CPU':>9}{'×B0':>7}"
          f"{'site/model':>12}{'search/model':>14}")
    results = {}
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            r = results[size] = measure(size, Path(tmp), args.repeat)
        for kind in ("cold", "warm", "no change"):
            run = r[kind]
            print(f"{size:>6}{r['pages']:>7}  {kind:<10}{run.wall:>7.2f} s{run.wall / b0.wall:>7.2f}{run.cpu:>7.2f} s"
                  f"{run.cpu / b0.cpu:>7.2f}{r['site_bytes'] / size / 1e6:>10.2f} MB{r['search_bytes'] / size / 1e3:>11.1f} KB")
    slopes = [(a, b, (results[b]["cold"].wall - results[a]["cold"].wall) / (b - a)) for a, b in zip(sizes, sizes[1:])]
    for a, b, slope in slopes:
        print(f"cold build slope {a} -> {b} models: {slope:.3f} s per added model ({slope / b0.wall:.3f} × B0)")
    if 30 in results:
        at30 = results[30]
        per_model = [results[s]["site_bytes"] / s for s in sizes]
        verdicts = [("cold <= 3×B0 at 30", at30["cold"].wall / b0.wall <= 3),
                    ("warm <= 1×B0 at 30", at30["warm"].wall / b0.wall <= 1),
                    ("slope 30->50 <= slope 15->30", len(slopes) < 2 or slopes[1][2] <= slopes[0][2] * 1.1),
                    ("no change <= 1 s", all(r["no change"].wall <= 1 for r in results.values())),
                    ("site bytes per model within 20 %", max(per_model) <= 1.2 * min(per_model))]
        print("issue 26's targets: " + "; ".join(f"{name} {'met' if ok else 'NOT met'}" for name, ok in verdicts))
    print(f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f} on "
          f"{len(os.sched_getaffinity(0))} cores (above about 1, another process shared the cores)")


if __name__ == "__main__":
    main()
