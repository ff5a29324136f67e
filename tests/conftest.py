"""Shared builders: safetensors files written byte by byte, project copies, and one built site."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEEPSEEK_TINY: dict = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
    "n_routed_experts": 8, "routed_scaling_factor": 2.5, "kv_lora_rank": 16, "q_lora_rank": 24,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "topk_method": "noaux_tc", "n_group": 2,
    "topk_group": 1, "num_experts_per_tok": 2, "moe_layer_freq": 1, "first_k_dense_replace": 1,
    "norm_topk_prob": True, "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "attention_bias": False, "tie_word_embeddings": False, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}
"""A small, self-consistent config of the DeepSeek-V3 family, written as config.json keys."""
DTYPE_BYTES = {"BF16": 2, "F32": 4, "F16": 2, "F8_E4M3": 1, "I64": 8}


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None) -> bytes:
    """A valid safetensors file (zero-filled data) for {name: (dtype, shape)}."""
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = DTYPE_BYTES[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> Path:
    path.write_bytes(safetensors_bytes(tensors))
    return path


def run_build(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run build.py in a separate process, as a user would."""
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def build_main(*args: str) -> subprocess.CompletedProcess[str]:
    """Run build.py's main() in this process, capturing its output: for failures that happen before any
    computing, without paying for an interpreter and the torch import per case."""
    spec = importlib.util.spec_from_file_location("explorer_build_cli", ROOT / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = module.main(list(args))
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A copy of content/, templates/ and static/ that a test may break."""
    for name in ("content", "templates", "static"):
        shutil.copytree(ROOT / name, tmp_path / name)
    return tmp_path


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real site, built once by the real command."""
    out = tmp_path_factory.mktemp("site") / "site"
    result = run_build("--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="session")
def builds():
    """The computed models (spec, accounts, checks) of the real content, once."""
    from explorer.pipeline import Project, build_all

    return {mb.slug: mb for mb in build_all(Project(ROOT), progress=lambda _: None)}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/ from the current build (read the diff against the seeds before committing)")
