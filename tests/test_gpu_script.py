"""The prepared GPU script runs (at the tiny config, on the CPU) and its traced shapes agree with the spec."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_moe_block_script_runs_at_the_tiny_config(tmp_path):
    out = tmp_path / "moe_block.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_moe_block.py"), "--tiny", "--device", "cpu",
                             "--tokens", "7", "--iterations", "1", "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["disagreements"] == []
    assert data["steps"]["softmax"] == [1, 4, 7, 7]
    assert data["steps"]["residual-ffn"] == [1, 7, 64]
    assert data["dtype"] == "torch.bfloat16"
