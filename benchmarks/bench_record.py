#!/usr/bin/env python3
"""Scaling benchmark of recording a checkpoint (issue 18): `build.py --record-checkpoint` of a synthetic
mixture-of-experts checkpoint of N tensors, from a JSON listing of one entry per tensor (--from-listing) and from
a folder of sharded safetensors headers (--from-folder), at a small and a large N.

Each run is a fresh `build.py` process under /usr/bin/time -v (wall and CPU seconds, peak resident memory). The
figure that matters is the ratio large/small at a tenfold N: about 10 when recording is linear (issue 18 measured
247 s and 1.8 GB at a million tensors). Times depend on the machine and its load; compare ratios from one run, and
on a shared machine trust CPU seconds over wall seconds (a busy machine stretches the wall time, not the CPU time).

    python benchmarks/bench_record.py                 # 100,000 and 1,000,000 tensors
    python benchmarks/bench_record.py --sizes 10000 100000 --sources listing
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLUG = "kimi-k2"
"""The model whose checkpoint.toml the scratch project re-records (its content is only the record's target)."""
EXPERTS = 256
PROJECTIONS = (("gate_proj", (64, 32)), ("up_proj", (64, 32)), ("down_proj", (32, 64)))
SHARDS = 8


def tensors(n: int) -> list[tuple[str, list[int], str]]:
    """N tensors of a mixture-of-experts model, in name order per layer: a norm per layer, then each expert's
    projections (every seventh layer stores its experts in F32, so the groups are not all one shape and dtype)."""
    out: list[tuple[str, list[int], str]] = []
    layer = 0
    while len(out) < n:
        out.append((f"model.layers.{layer}.input_layernorm.weight", [64], "BF16"))
        dtype = "F32" if layer % 7 == 6 else "BF16"
        for expert in range(EXPERTS):
            for proj, shape in PROJECTIONS:
                out.append((f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight", list(shape), dtype))
        layer += 1
    return out[:n]


def write_listing(path: Path, n: int) -> None:
    entries = [{"name": name, "shape": shape, "dtype": dtype} for name, shape, dtype in tensors(n)]
    path.write_text(json.dumps({"repo_id": "synthetic/moe", "provenance": "bench_record.py", "tensors": entries},
                               separators=(",", ":")))


def write_folder(folder: Path, n: int) -> None:
    """Sharded safetensors files whose data buffers are holes (sparse files): only the headers are read."""
    folder.mkdir()
    items = tensors(n)
    per_shard = -(-len(items) // SHARDS)
    weight_map = {}
    for s in range(SHARDS):
        shard = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        header, offset = {}, 0
        for name, shape, dtype in items[s * per_shard:(s + 1) * per_shard]:
            size = shape[0] * (shape[1] if len(shape) > 1 else 1) * (4 if dtype == "F32" else 2)
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[name] = shard
        data = json.dumps(header, separators=(",", ":")).encode()
        with (folder / shard).open("wb") as f:
            f.write(struct.pack("<Q", len(data)) + data)
            f.truncate(8 + len(data) + offset)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def record(project: Path, source: str, path: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak resident MB of one `build.py --record-checkpoint` process."""
    command = ["/usr/bin/time", "-v", sys.executable, str(ROOT / "build.py"), "--content", str(project),
               "--record-checkpoint", SLUG, f"--from-{source}", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", result.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)
    cpu = re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", result.stderr)
    assert wall and rss and len(cpu) == 2, result.stderr
    seconds = int(wall.group(1) or 0) * 3600 + int(wall.group(2)) * 60 + float(wall.group(3))
    return seconds, sum(map(float, cpu)), int(rss.group(1)) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--sources", nargs="+", choices=("listing", "folder"), default=["listing", "folder"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-record-") as scratch:
        project = Path(scratch) / "project"
        shutil.copytree(ROOT / "content", project / "content")
        for source in args.sources:
            results = []
            for n in args.sizes:
                path = Path(scratch) / f"{source}-{n}"
                (write_listing if source == "listing" else write_folder)(path, n)
                seconds, cpu, mb = record(project, source, path)
                results.append((n, seconds, cpu, mb))
                print(f"--from-{source} {n:>9,} tensors: {seconds:7.1f} s wall {cpu:7.1f} s CPU {mb:7.0f} MB",
                      flush=True)
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            (n0, s0, c0, m0), (n1, s1, c1, m1) = results[0], results[-1]
            if n1 != n0:
                print(f"--from-{source} {n1 / n0:g}x the tensors: {s1 / s0:.1f}x the wall time, {c1 / c0:.1f}x the CPU "
                      f"time, {m1 / m0:.1f}x the memory (linear: {n1 / n0:g}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
