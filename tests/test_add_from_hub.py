"""`build.py --add-model SLUG --from-hub OWNER/NAME --revision SHA` against a loopback Hub (tests/hub_server.py):
the repository's config.json and safetensors headers at a pinned commit become model.toml and checkpoint.toml in
one step, the headers reconciled against the layout the config describes before anything is written.

The checkpoint served is a tiny Llama written out by hand below (not predicted by the code under test): two
layers of 64 wide, 4 query and 2 key/value heads of 16, an MLP of 128, 256 tokens, an untied head."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib

import pytest
from conftest import ROOT, build_main, hub_env, safetensors_bytes
from hub_server import FakeHub

from explorer.checkpoint.manifest import read_manifest
from explorer.commands.add_from_hub import add_from_hub
from explorer.errors import CheckpointError, ContentError

REPO, REV = "someone/tiny-llama", "89abcdef0123456789abcdef0123456789abcdef"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu"}


def tensors(drop: str = "", wide_k: bool = False) -> dict[str, tuple[str, list[int]]]:
    out = {"model.embed_tokens.weight": ("BF16", [256, 64]), "model.norm.weight": ("BF16", [64]),
           "lm_head.weight": ("BF16", [256, 64])}
    for i in range(2):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": ("BF16", [64, 64]),
                p + "self_attn.k_proj.weight": ("BF16", [64 if wide_k else 32, 64]),
                p + "self_attn.v_proj.weight": ("BF16", [32, 64]), p + "self_attn.o_proj.weight": ("BF16", [64, 64]),
                p + "mlp.gate_proj.weight": ("BF16", [128, 64]), p + "mlp.up_proj.weight": ("BF16", [128, 64]),
                p + "mlp.down_proj.weight": ("BF16", [64, 128]), p + "input_layernorm.weight": ("BF16", [64]),
                p + "post_attention_layernorm.weight": ("BF16", [64])}
    return {k: v for k, v in out.items() if k != drop}


def serve(hub: FakeHub, checkpoint: dict[str, tuple[str, list[int]]], config: dict | None = None) -> None:
    hub.files[(REPO, REV, "config.json")] = json.dumps(config or CONFIG, indent=2).encode()
    hub.files[(REPO, REV, "model.safetensors")] = safetensors_bytes(checkpoint)


@pytest.fixture
def content(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "content" / "models").mkdir(parents=True)
    return tmp_path / "content"


def test_config_and_headers_become_the_model_and_its_manifest(content):
    with FakeHub() as hub:
        serve(hub, tensors())
        model, manifest, count = add_from_hub(content, "tiny", REPO, REV, "2026-11", endpoint=hub.url)
        served = hub.files[(REPO, REV, "config.json")]
    assert count == 21  # 3 + 2 layers × 9
    recorded = tomllib.loads(model.read_text())
    assert (recorded["checkpoint"]["repo_id"], recorded["checkpoint"]["revision"]) == (REPO, REV)
    assert "revision_note" not in recorded["checkpoint"]  # pinned: nothing to explain
    assert f"fetched from the Hub at revision {REV}" in recorded["checkpoint"]["config_provenance"]
    assert recorded["checkpoint"]["config_sha256"] == hashlib.sha256(served).hexdigest()
    assert recorded["config"]["hidden_size"] == 64 and recorded["model"]["family"] == "llama"
    index = read_manifest(manifest)
    assert (index.repo_id, index.revision, index.tensor_count) == (REPO, REV, 21)
    assert index.tensors["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert "--from-hub" in index.provenance


@pytest.mark.parametrize("checkpoint, words", [
    (tensors(drop="model.layers.1.mlp.down_proj.weight"), "missing: model.layers.1.mlp.down_proj.weight"),
    (tensors(wide_k=True), "shape mismatch: model.layers.0.self_attn.k_proj.weight"),
    ({**tensors(), "model.layers.0.extra.weight": ("BF16", [4])}, "unowned: model.layers.0.extra.weight"),
])
def test_headers_that_differ_from_the_config_are_refused_and_nothing_written(content, checkpoint, words):
    """Mutations of the served checkpoint: a tensor left out, a key projection as wide as the queries (the config
    says 2 key heads), a tensor nothing owns. Each is named, and no folder is left behind."""
    with FakeHub() as hub:
        serve(hub, checkpoint)
        with pytest.raises(ContentError) as info:
            add_from_hub(content, "tiny", REPO, REV, endpoint=hub.url)
    assert "do not match the stored layout" in info.value.problems[0]
    assert any(words in line for line in info.value.problems), info.value.problems
    assert list((content / "models").iterdir()) == []


def test_a_quantized_export_is_sent_to_add_variant(content):
    with FakeHub() as hub:
        serve(hub, tensors())
        hub.files[(REPO, REV, "hf_quant_config.json")] = b'{"quantization": {"quant_algo": "NVFP4"}}'
        with pytest.raises(ContentError) as info:
            add_from_hub(content, "tiny", REPO, REV, endpoint=hub.url)
        asked = [path for _, path in hub.requests]
    assert "--add-variant BASE --quant-config hf_quant_config.json" in info.value.problems[0]
    assert not any(p.endswith(".safetensors") for p in asked)  # refused before the headers were read
    assert list((content / "models").iterdir()) == []


def test_hub_failures_name_the_repository_and_leave_nothing(content):
    with FakeHub() as hub:
        serve(hub, tensors())
        with pytest.raises(CheckpointError) as info:
            add_from_hub(content, "tiny", REPO, "f" * 40, endpoint=hub.url)
        assert info.value.reason == "unknown revision"
        del hub.files[(REPO, REV, "model.safetensors")]
        with pytest.raises(CheckpointError) as info:
            add_from_hub(content, "tiny", REPO, REV, endpoint=hub.url)
        assert info.value.reason == "file not found (404)" and "model.safetensors" in info.value.source
    assert list((content / "models").iterdir()) == []


def test_a_config_the_family_refuses_is_refused_before_writing(content):
    with FakeHub() as hub:
        serve(hub, tensors(), {**CONFIG, "num_key_value_heads": 3})  # 4 query heads do not share 3 key heads
        with pytest.raises(ContentError):
            add_from_hub(content, "tiny", REPO, REV, endpoint=hub.url)
    assert list((content / "models").iterdir()) == []


def test_a_branch_name_is_not_a_revision(content):
    with pytest.raises(ContentError) as info:
        add_from_hub(content, "tiny", REPO, "main")
    assert "--revision: 'main'" in info.value.problems[0]


def test_the_command_line(tmp_path):
    """build.py's flags: --from-hub takes the repository with --add-model and none with --record-checkpoint. (A
    process of its own for the Hub: huggingface_hub reads HF_ENDPOINT when it is first imported.)"""
    project = tmp_path / "p"
    (project / "content" / "models").mkdir(parents=True)
    with FakeHub() as hub:
        serve(hub, tensors())
        ok = subprocess.run([sys.executable, str(ROOT / "build.py"), "--content", str(project), "--add-model", "tiny",
                             "--from-hub", REPO, "--revision", REV], env=hub_env(tmp_path, hub.url),
                            capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "21 tensors, reconciled" in ok.stdout
    assert (project / "content/models/tiny/checkpoint.toml").is_file()
    bad = build_main("--content", str(project), "--add-model", "other", "--from-hub", "--repo", REPO)
    assert bad.returncode == 1
    assert "needs the repository" in bad.stderr and "needs --revision" in bad.stderr and "takes no --repo" in bad.stderr
    again = build_main("--content", str(project), "--record-checkpoint", "tiny", "--from-hub", REPO)
    assert again.returncode == 1 and "takes no repository" in again.stderr
