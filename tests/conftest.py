"""Shared builders: safetensors files written byte by byte, project copies, and one built site.

The suite runs in parallel (pytest-xdist, see pyproject.toml): the real site is built once per run, by
whichever worker asks first, under a file lock in the run's shared temporary folder; every project copy
starts with that build's .cache, so only tests about the cache (bare_project_copy) run the torch stages."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

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
NO_HUB_RETRIES = Path(__file__).resolve().parent / "no_hub_retries"
"""A sitecustomize for build subprocesses that must meet an unreachable Hub at once, not after 23 s of backoff."""


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


def seal_config_values(folder: Path) -> None:
    """Record the digest of folder/model.toml's [config] as checkpoint.config_values_sha256, as if its values were
    published so: for a test that writes or edits a config on purpose (a tensor mismatch, a cache miss), so that
    the edit reaches the check the test is about. An empty config_sha256 is no longer a way round the
    edited-config check (issue 37), so a test must state the values it builds."""
    import re

    from explorer.checkpoint.sources import config_values_digest
    from explorer.content.model_content import load_model_content

    toml = folder / "model.toml"
    digest = config_values_digest(load_model_content(folder).config)
    text = re.sub(r"^config_values_sha256 = .*\n", "", toml.read_text(), flags=re.M)
    text, n = re.subn(r"^(config_sha256 = .*)$", rf'\1\nconfig_values_sha256 = "{digest}"', text, count=1, flags=re.M)
    assert n == 1, f"{toml}: no config_sha256 line"
    toml.write_text(text)


def read_cache_entry(path: Path):
    """The data of a sealed torch-stage cache entry (explorer/execute/cache_seal.py)."""
    return json.loads(path.read_text(encoding="utf-8").partition("\n")[2])


def write_cache_entry(path: Path, data) -> None:
    """Write `data` as a cache entry sealed under its folder's key, as only a forger holding the key could: for
    tests of the checks made behind the seal (an edit without the key is refused by the seal alone)."""
    from explorer.execute.cache_seal import sealed

    text = sealed(path.parent, path.name, json.dumps(data))
    assert text is not None
    path.write_text(text, encoding="utf-8")


def hub_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    """Environment for a build subprocess that talks to `endpoint` as its Hub: an empty HF home of its own,
    short deadlines and no retries, so a test meets a refused connection in seconds."""
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_ETAG_TIMEOUT": "2",
           "HF_HUB_DOWNLOAD_TIMEOUT": "5", "PYTHONPATH": os.pathsep.join(
               [str(NO_HUB_RETRIES), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("HF_HUB_OFFLINE", None)
    return env


def _copy_project(dest: Path, with_cache: bool, models: tuple[str, ...] | None = None) -> Path:
    """content/ (all its models, or only `models`), templates/ and static/ copied to dest."""
    for name in ("content", "templates", "static"):
        shutil.copytree(ROOT / name, dest / name, ignore=None if models is None else shutil.ignore_patterns("models"))
    if models is not None:
        (dest / "content/models").mkdir()
    for slug in models or ():
        shutil.copytree(ROOT / "content/models" / slug, dest / "content/models" / slug)
    if with_cache:  # the real build's torch stages, keyed by inputs: a test that changes a config still misses
        shutil.copytree(ROOT / ".cache" / "execute", dest / ".cache" / "execute")
    return dest


@pytest.fixture
def project_copy(tmp_path: Path, built_site: Path) -> Path:
    """A copy of content/, templates/ and static/ that a test may break, with the real build's cache."""
    return _copy_project(tmp_path, with_cache=True)


@pytest.fixture
def small_project_copy(tmp_path: Path, built_site: Path):
    """Makes a project copy holding only the named models (name the models they follow too; none at all is
    allowed), with the real build's cache: for a build subprocess whose behaviour one or two models show, at a
    fraction of the whole site's cost."""
    return lambda *models: _copy_project(tmp_path / "small-project", with_cache=True, models=models)


@pytest.fixture
def bare_project_copy(tmp_path: Path) -> Path:
    """A project copy with no .cache, for tests about the cache itself."""
    return _copy_project(tmp_path, with_cache=False)


def _run_shared_dir(factory: pytest.TempPathFactory) -> Path:
    """A folder shared by every worker of this run (each xdist worker has its own base temp below it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


TEST_SITE = ROOT / ".cache" / "test-site"
"""Where the suite builds the real site. It stays between runs, so a run whose inputs are those of the last
(the slow tier after the default one, as in .ci/run) pays only the command's no-change check."""


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real site, built by the real command once per run (it rebuilds only what changed since the last), with a
    pool of two processes (the byte comparison with a one-process build is in test_build.py); it also fills the
    repository's .cache."""
    done = _run_shared_dir(tmp_path_factory) / "site.built"
    TEST_SITE.parent.mkdir(exist_ok=True)
    with FileLock(str(TEST_SITE.parent / "test-site.lock")):  # one build at a time, also across runs
        if not done.exists():
            if not (ROOT / ".cache" / "execute").is_dir():  # the site is kept, the cache it filled is gone: refill
                shutil.rmtree(TEST_SITE, ignore_errors=True)
            result = run_build("--out", str(TEST_SITE), "--jobs", "2")
            assert result.returncode == 0, result.stderr
            done.write_text(result.stdout)
    return TEST_SITE


@pytest.fixture(scope="session")
def builds(built_site: Path):
    """The computed models (spec, accounts, checks) of the real content, once per worker, from the cache
    the site build filled."""
    from explorer.pipeline import Project, build_all

    return {mb.slug: mb for mb in build_all(Project(ROOT), progress=lambda _: None, jobs=1)}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/ from the current build (read the diff against the seeds before committing)")


def recurrent_layer_run(tiny, model, weights, block: str, T: int = 150, seed: int = 3):
    """A recurrent mixer (Gated DeltaNet, KDA) of block kind `block` and its reference module on one random sequence
    of T positions (150: more than two 64-position chunks): our chunked output, our recurrent (one token at a time)
    output, and the reference's."""
    import torch

    from explorer.execute.executor import first_layer, module_prefix
    from explorer.model.components import PROGRAMS, Run

    comp = tiny.root.child("blocks").child(block).child("attn")
    prefix = module_prefix(comp, first_layer(comp))
    x = torch.randn(2, T, tiny.values["hidden_size"], generator=torch.Generator().manual_seed(seed))
    run = Run(weights, module=prefix)
    with torch.no_grad():
        (ours,) = PROGRAMS[comp.program](comp, run, x)
        theirs = model.get_submodule(prefix.rstrip("."))(hidden_states=x)
    return ours, run.recorded["_recurrent"], theirs
