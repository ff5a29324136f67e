#!/usr/bin/env python3
"""One full-size Kimi K2 MoE block in bf16 with random weights, on a GPU: record every step's shape (checked
against the spec's named shapes) and time the block. A prepared script for a lent GPU machine (about 34 GB
of weights); on a CPU, --tiny runs the same code at the tiny config.

    python benchmarks/gpu_moe_block.py --out "$OUT/moe_block.json"            # on the GPU machine, its Python
    .venv/bin/python benchmarks/gpu_moe_block.py --tiny --device cpu --out /tmp/x.json  # anywhere
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def moe_block_weights(spec, device: str, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], object, str]:
    """Random weights of the first MoE block only, allocated on the device; the block and its module prefix."""
    from explorer.execute.executor import first_layer, model_weights, module_prefix

    block = next(c for c in spec.root.children[1].children if c.key == "moe")
    prefix = module_prefix(block, first_layer(block))
    generator = torch.Generator(device=device).manual_seed(0)
    return model_weights(spec, device, generator, dtype, prefix), block, prefix


def run(spec, device: str, dtype: torch.dtype, tokens: int, iterations: int) -> dict:
    from explorer.execute.executor import label
    from explorer.model.components.base import PROGRAMS, Run
    from explorer.model.components.blocks import angles_for, causal_mask

    weights, block, prefix = moe_block_weights(spec, device, dtype)
    x = torch.randn(1, tokens, int(spec.values["hidden_size"]), device=device, dtype=dtype)
    angles = angles_for(block, torch.arange(tokens, device=device))
    mask = causal_mask(tokens, torch.device(device)).to(dtype)

    def forward() -> Run:
        run_ = Run(weights, module=prefix)
        with torch.no_grad():
            PROGRAMS[block.program](block, run_, x, angles, mask)
        return run_

    recorded = forward()  # also the warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        forward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iterations
    free = {"B": 1, "T": tokens}
    shapes, disagreements = {}, []
    for step in block.steps:
        if step.heading or step.shape is None:
            continue
        shape = tuple(recorded.recorded[step.name].shape)
        shapes[step.name] = list(shape)
        problem = label(shape, step.shape, free)
        if problem:
            disagreements.append(f"{step.name}: {problem}")
    return {
        "model": spec.slug, "block": "blocks.moe", "device": device, "dtype": str(dtype), "tokens": tokens,
        "parameters": sum(w.numel() for w in weights.values()), "seconds_per_block": seconds,
        "steps": shapes, "disagreements": disagreements,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
    }


def main(argv: list[str] | None = None) -> int:
    from explorer.content.model_content import load_model_content
    from explorer.execute.executor import tiny_spec
    from explorer.model.families import load_model_spec

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the tiny config of the same family")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = load_model_spec(load_model_content(ROOT / "content/models/kimi-k2"))
    if args.tiny:
        spec = tiny_spec(spec)
    result = run(spec, args.device, torch.bfloat16, args.tokens, args.iterations)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"{result['parameters']:,} parameters on {result['device_name']}: {result['seconds_per_block'] * 1e3:.1f} ms "
          f"per block for {args.tokens} tokens; {len(result['steps'])} steps traced, "
          f"{len(result['disagreements'])} disagreements with the spec")
    return 1 if result["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())
