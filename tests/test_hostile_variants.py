"""Issue 37: the variant path and the new inputs tried as an attacker would. Each test reproduces one defect of the
third hostile pass; the fix gives one line and exit 1, writes nothing, or a bounded result.

Everything here runs on a scratch content folder holding one or two models (no site build, no torch stage)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, build_main, read_cache_entry, write_cache_entry
from test_hostile import deadline

from explorer.checkpoint.variants import load_variants
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.model.families import load_model_spec
from explorer.model.quantization import ignored

BASE = "qwen3-8b"
REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project holding content/models/qwen3-8b only."""
    shutil.copytree(ROOT / "content/models" / BASE, tmp_path / "project/content/models" / BASE)
    return tmp_path / "project"


def modelopt(tmp_path: Path, name: str = "q.json", **quantization) -> Path:
    path = tmp_path / name
    table = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"], **quantization}
    path.write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.43.0"}, "quantization": table}))
    return path


def compressed(tmp_path: Path, group_size=32, ignore=("lm_head",)) -> Path:
    path = tmp_path / "config.json"
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group_size}
    path.write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": list(ignore),
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}}))
    return path


def add_variant(project: Path, config: Path, *extra: str, base: str = BASE, repo: str = "nvidia/Qwen3-8B-NVFP4"):
    return build_main("--content", str(project), "--add-variant", base, "--quant-config", str(config),
                      "--repo", repo, "--revision", "unpinned", *extra)


def one_line_error(result, *fragments: str) -> None:
    """Exit 1 and "error: " with one line per problem, each naming what it is about; no traceback."""
    assert result.returncode == 1, result.stdout
    assert result.stderr.startswith("error: ") and result.stderr.endswith("\n"), result.stderr
    assert "Traceback" not in result.stderr and "\n\n" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------- writes outside content/

def test_add_variant_base_is_a_model_name_not_a_path(project, tmp_path):
    (project / "x").mkdir()
    (project / "x/model.toml").write_text("")  # where content/models/../../x points: once enough to be written into
    result = add_variant(project, modelopt(tmp_path), base="../../x")
    one_line_error(result, "'../../x': not a model name")
    assert sorted(p.name for p in (project / "x").iterdir()) == ["model.toml"]


@pytest.mark.parametrize("link", ["folder", "file"])
def test_add_variant_refuses_a_link_at_every_level(project, tmp_path, link):
    """A `variants/` that is a link, or a `variants/NAME.toml` that is one, used to be followed and its target
    overwritten."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "qwen3-8b-nvfp4.toml"
    victim.write_text("precious\n")
    variants = project / "content/models" / BASE / "variants"
    if link == "folder":
        variants.symlink_to(outside, target_is_directory=True)
    else:
        variants.mkdir()
        (variants / "qwen3-8b-nvfp4.toml").symlink_to(victim)
    one_line_error(add_variant(project, modelopt(tmp_path), "--replace"), "is a link", "nothing written")
    assert victim.read_text() == "precious\n" and sorted(p.name for p in outside.iterdir()) == [victim.name]


def test_a_second_owner_of_the_same_name_does_not_replace_the_first(project, tmp_path):
    """nvidia/X-NVFP4 and someone/X-NVFP4 both make variants/x-nvfp4.toml: the second used to replace the first,
    hand edits included."""
    assert add_variant(project, modelopt(tmp_path)).returncode == 0
    path = project / "content/models" / BASE / "variants/qwen3-8b-nvfp4.toml"
    edited = path.read_text().replace('producer = "modelopt 0.43.0"', 'producer = "modelopt 0.43.0 (checked)"')
    path.write_text(edited)
    result = add_variant(project, modelopt(tmp_path), repo="someone/Qwen3-8B-NVFP4")
    one_line_error(result, "already exists", "--replace")
    assert path.read_text() == edited
    assert add_variant(project, modelopt(tmp_path), "--replace", repo="someone/Qwen3-8B-NVFP4").returncode == 0
    assert 'repo_id = "someone/Qwen3-8B-NVFP4"' in path.read_text()


def test_a_refused_variant_leaves_nothing_behind(project, tmp_path):
    """A refused --add-variant used to leave its file, and every later build failed on it."""
    before = files_under(project)
    one_line_error(add_variant(project, modelopt(tmp_path, group_size=7)), "group_size")
    assert files_under(project) == before and not (project / "content/models" / BASE / "variants").exists()
    assert load_variants(project / "content/models" / BASE) == ()


def test_record_checkpoint_replaces_a_manifest_only_when_asked(project, tmp_path):
    from conftest import write_safetensors

    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {"w": ("F32", [2])})
    args = ("--content", str(project), "--record-checkpoint", BASE, "--from-folder", str(folder))
    assert build_main(*args).returncode == 0
    manifest = project / "content/models" / BASE / "checkpoint.toml"
    manifest.write_text(manifest.read_text() + "# edited\n")
    one_line_error(build_main(*args), "checkpoint.toml: already exists", "--replace")
    assert manifest.read_text().endswith("# edited\n")
    assert build_main(*args, "--replace").returncode == 0 and not manifest.read_text().endswith("# edited\n")
    manifest.unlink()
    manifest.symlink_to(tmp_path / "elsewhere.toml")
    one_line_error(build_main(*args, "--replace"), "is a link")
    assert not (tmp_path / "elsewhere.toml").exists()


# ------------------------------------------------------------------------- keys and values pasted into TOML

@pytest.mark.parametrize("key", ['x"y', "a = 1\n[variant]\nname", "quant_algo = \"FP8\"\n#"])
def test_quantization_keys_are_escaped_and_unknown_ones_refused(project, tmp_path, key):
    """[quantization] keys were pasted into TOML unescaped: a quote broke the file, a newline injected tables."""
    result = add_variant(project, modelopt(tmp_path, **{key: 1}))
    one_line_error(result, "unknown")
    assert not (project / "content/models" / BASE / "variants").exists()


@pytest.mark.parametrize("body", ["[1, 2]", "{\"quantization\": [1]}", "{\"quantization\": {\"quant_algo\": 5}}",
                                  "not json", "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": true}}",
                                  "{\"text_config\": 1}", "{\"quantization_config\": {\"config_groups\": 3}}",
                                  "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": \"16\"}}"])
def test_malformed_quant_configs_are_one_line(project, tmp_path, body):
    path = tmp_path / "q.json"
    path.write_text(body)
    one_line_error(add_variant(project, path))
    assert not (project / "content/models" / BASE / "variants").exists()


def test_quant_config_is_read_with_a_bound(project, tmp_path):
    """--quant-config was read whole, however large (a device such as /dev/zero never ends)."""
    from explorer.commands.add_variant import MAX_QUANT_CONFIG_BYTES

    big = tmp_path / "big.json"
    big.write_bytes(b"{" + b" " * MAX_QUANT_CONFIG_BYTES + b"}")  # one byte past the cap; old code read it all
    one_line_error(add_variant(project, big), "over the", "cap")
    with deadline(20):
        one_line_error(add_variant(project, Path("/dev/zero")), "over the", "cap")


# -------------------------------------------------------------------------------- impossible numbers

@pytest.mark.parametrize("group_size", [-16, 0, 7, 32, 10**30])
def test_nvfp4_group_size_outside_its_definition_is_refused(project, tmp_path, group_size):
    """group_size -16 published "-434,109,960 scale elements"; 7 and 10^30 were accepted too."""
    one_line_error(add_variant(project, modelopt(tmp_path, group_size=group_size)), "quantization.group_size")


@pytest.mark.parametrize("group_size, why", [(-16, "power of two"), (7, "power of two"), (10**30, "power of two"),
                                             (8192, "does not divide the input width 4,096")])
def test_pack_quantized_group_size_is_positive_a_power_of_two_and_divides_the_width(project, tmp_path, group_size,
                                                                                    why):
    one_line_error(add_variant(project, compressed(tmp_path, group_size), repo="x/Qwen3-8B-INT4"), "group_size", why)


def test_a_pack_quantized_variant_within_the_rules_is_recorded(project, tmp_path):
    result = add_variant(project, compressed(tmp_path, 128), repo="x/Qwen3-8B-INT4")
    assert result.returncode == 0, result.stderr
    (variant,) = load_variants(project / "content/models" / BASE)
    assert variant.compressed_tensors.config_groups["group_0"].weights.group_size == 128


def _with_quantization(slug: str, **changes):
    content = load_model_content(ROOT / "content/models" / slug)
    q = {**content.config["quantization_config"], **changes}
    return dataclasses.replace(content, config={**content.config, "quantization_config": q})


@pytest.mark.parametrize("slug", ["deepseek-v4-flash", "deepseek-v3"])
@pytest.mark.parametrize("block", [[-128, 128], [0, 128], [128, 10**30]])
def test_fp8_blocks_are_refused_by_every_family(slug, block):
    """DeepSeek-V4 accepted [-128, 128] (publishing -357,504 bytes of scales) and crashed on [0, 128]; the other
    FP8 families refused both. The rule is now the scheme's, so no family skips it."""
    with pytest.raises(ContentError) as e:
        load_model_spec(_with_quantization(slug, weight_block_size=block))
    (line,) = e.value.problems
    assert "model.toml" in line and "weight_block_size" in line


def test_the_recorded_fp8_blocks_still_build():
    spec = load_model_spec(load_model_content(ROOT / "content/models/deepseek-v4-flash"))
    assert spec.family == "deepseek_v4"


# ------------------------------------------------------------------------------------- patterns bounded

@pytest.mark.parametrize("pattern, why", [("re:(.*)*X", "a repeat inside a repeat"), ("re:(", "not a regular"),
                                          ("re:(a|ab)+$", "alternation inside a repeat"),
                                          ("re:(a)\\1", "backreference"), ("re:" + "a" * 400, "longer than")])
def test_backtracking_or_broken_ignore_patterns_are_refused_with_the_key(project, tmp_path, pattern, why):
    """"re:(.*)*X" was accepted and every later build and --check ran for ever; "re:(" gave a traceback."""
    with deadline(20):
        result = add_variant(project, compressed(tmp_path, 32, ("lm_head", pattern)), repo="x/Qwen3-8B-INT4")
    one_line_error(result, "key 'quantization_config.ignore'", why)


def test_a_hand_written_pathological_variant_fails_the_build_in_bounded_time(project, tmp_path):
    assert add_variant(project, compressed(tmp_path, 32), repo="x/Qwen3-8B-INT4").returncode == 0
    path = project / "content/models" / BASE / "variants/qwen3-8b-int4.toml"
    path.write_text(path.read_text().replace('ignore = ["lm_head"]', 'ignore = ["re:(.*)*X"]'))
    start = time.monotonic()
    with pytest.raises(ContentError) as e:
        load_variants(project / "content/models" / BASE)
    assert time.monotonic() - start < 5
    (line,) = e.value.problems
    assert str(path) in line and "key 'quantization_config.ignore'" in line


def test_matching_an_unchecked_pattern_refuses_instead_of_hanging():
    with deadline(10), pytest.raises(ContentError, match="repeat inside a repeat"):
        ignored("model.layers.0.mlp.gate_proj" * 4, ("re:(.*)*X",))


def test_published_patterns_pass_the_bound():
    from explorer.model.quantization import pattern_problem

    for pattern in (".*lm_head", "model.layers.[0-9]+.mlp.gate$", r".*\.(q|k|v)_proj", "model.layers.*.self_attn"):
        assert pattern_problem(pattern) == ""


def test_kimi_k25_ignore_list_is_bounded_too():
    content = load_model_content(ROOT / "content/models/kimi-k2.5")
    text = content.config["text_config"]
    q = {**text["quantization_config"], "ignore": ["re:(.*)*X"]}
    bad = dataclasses.replace(content, config={**content.config,
                                               "text_config": {**text, "quantization_config": q}})
    with deadline(20), pytest.raises(ContentError, match="ignore.*repeat inside a repeat"):
        load_model_spec(bad)


# ----------------------------------------------------------------------------- variant files read as content

def test_a_variant_file_linking_out_of_its_model_is_refused(project, tmp_path):
    assert add_variant(project, modelopt(tmp_path)).returncode == 0
    variants = project / "content/models" / BASE / "variants"
    outside = tmp_path / "outside.toml"
    (variants / "qwen3-8b-nvfp4.toml").rename(outside)
    (variants / "qwen3-8b-nvfp4.toml").symlink_to(outside)
    with pytest.raises(ContentError, match="link"):
        load_variants(project / "content/models" / BASE)


@pytest.mark.parametrize("edit, key", [
    (("repo_id = \"nvidia/Qwen3-8B-NVFP4\"", "repo_id = \"../../x\""), "variant.repo_id"),
    (("revision = \"unpinned\"", "revision = \"main\""), "variant.revision"),
    (("name = \"Qwen3-8B-NVFP4\"", "name = \"" + "x" * 400 + "\""), "variant.name"),
    (("[quantization]", "[extra]\n[quantization]"), "table 'extra'"),
])
def test_variant_files_go_through_the_content_checks(project, tmp_path, edit, key):
    assert add_variant(project, modelopt(tmp_path)).returncode == 0
    path = project / "content/models" / BASE / "variants/qwen3-8b-nvfp4.toml"
    path.write_text(path.read_text().replace(*edit))
    with pytest.raises(ContentError, match=key.replace(".", r"\.")):
        load_variants(project / "content/models" / BASE)


# ----------------------------------------------------------------------- quoted files checked by their hash

def _resolve_with_cache(monkeypatch, tmp_path, slug: str, files: dict[str, str], **ref_changes):
    """Citations of a model resolved with `files` in a fake Hugging Face cache at its pinned revision."""
    from explorer.checkpoint import sources

    content = load_model_content(ROOT / "content/models" / slug)
    content = dataclasses.replace(content, checkpoint=dataclasses.replace(content.checkpoint, **ref_changes))
    ref = content.checkpoint
    snapshot = tmp_path / "hub" / ref.revision
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    monkeypatch.setattr(sources, "try_to_load_from_cache",
                        lambda repo, name, revision: str(snapshot / name) if name in files else None)
    cited = sources.resolve_citations(load_model_spec(content), content)
    return [c for cs in cited.values() for c in cs]


def test_a_cached_config_json_with_other_bytes_is_not_quoted_as_pinned(monkeypatch, tmp_path, capfd):
    """A served or cached config.json with [64, 64] blocks was quoted as "read from the pinned file" beside
    numbers computed for 128 x 128: now only a file whose bytes hash to config_sha256 is quoted."""
    content = load_model_content(ROOT / "content/models/deepseek-v3")
    published = json.dumps(content.config, indent=2, sort_keys=True) + "\n"  # hashes to config_sha256 (tested)
    forged = published.replace('"weight_block_size": [\n      128,\n      128', '"weight_block_size": [\n      64,\n      64')
    assert forged != published
    cited = _resolve_with_cache(monkeypatch, tmp_path / "a", "deepseek-v3", {"config.json": forged})
    quoted = [c for c in cited if c.file == "config.json"]
    assert quoted and all(c.origin != "cache" for c in quoted)
    assert not any(c.lines and any("64" in line for line in c.lines) for c in quoted)
    err = capfd.readouterr().err
    assert "warning: deepseek-ai/DeepSeek-V3@" in err and "config.json: its sha256" in err and "not quoted" in err
    cited = _resolve_with_cache(monkeypatch, tmp_path / "b", "deepseek-v3", {"config.json": published})
    assert any(c.origin == "cache" for c in cited if c.file == "config.json")  # the real file still is


def test_a_cached_modeling_file_is_quoted_only_with_its_recorded_hash(monkeypatch, tmp_path, capfd):
    from test_content import synth_module

    ref = load_model_content(ROOT / "content/models/kimi-k2").checkpoint
    synthetic = synth_module(ref.source_lines)
    cited = _resolve_with_cache(monkeypatch, tmp_path / "a", "kimi-k2", {ref.modeling_file: synthetic})
    assert not any(c.lines for c in cited if c.file == ref.modeling_file)
    assert "no checkpoint.modeling_sha256 is recorded" in capfd.readouterr().err
    digest = __import__("hashlib").sha256(synthetic.encode()).hexdigest()
    cited = _resolve_with_cache(monkeypatch, tmp_path / "b", "kimi-k2", {ref.modeling_file: synthetic},
                                modeling_sha256=digest)
    assert any(c.lines for c in cited if c.file == ref.modeling_file)


# ------------------------------------------------------------------------------------------- --verify-hub

@pytest.mark.parametrize("reason, calls", [("timed out", 1), ("connection refused or unreachable", 1),
                                           ("file not found (404)", 2)])
def test_verify_hub_stops_at_the_first_unreachable_hub(tmp_path, monkeypatch, reason, calls):
    """With the Hub down, --verify-hub waited out the timeout again for every model (25 s each); a missing file
    of one model still lets the others be checked."""
    from explorer.checkpoint import sources
    from explorer.errors import CheckpointError

    for slug in ("qwen3-8b", "llama-3.1-8b"):
        shutil.copytree(ROOT / "content/models" / slug, tmp_path / "content/models" / slug)
    asked = []

    def down(repo_id, revision, filename, *args, **kwargs):
        asked.append(repo_id)
        raise CheckpointError(f"{repo_id}@{revision}/{filename}", reason)

    monkeypatch.setattr(sources, "fetch_hub_file", down)
    result = build_main("--content", str(tmp_path), "--verify-hub")
    assert result.returncode == 1 and len(asked) == calls and "Traceback" not in result.stderr
    assert ("1 more pinned model(s) not verified" in result.stderr) == (calls == 1)


# ------------------------------------------------------------------------------------------------ --jobs

@pytest.mark.parametrize("jobs", ["1000", "0", "-1", "x" * 100])
def test_jobs_is_bounded(jobs):
    """--jobs 1000 was accepted (a thousand processes, each holding a torch stage)."""
    result = _argparse(("--check", "--jobs", jobs))
    assert result.returncode == 2 and "at most 64" in result.stderr and "Traceback" not in result.stderr


def _argparse(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """build.py's main() in this process, as conftest's build_main runs it, also for arguments argparse refuses
    (it prints its usage and one error line, and exits 2)."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location("explorer_build_cli", ROOT / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = module.main(list(args))
        except SystemExit as e:
            rc = e.code
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())


# ----------------------------------------------------------------------- every command on malformed input

def _cases(project: Path, tmp: Path) -> list[tuple[str, ...]]:
    bad_json = tmp / "bad.json"
    bad_json.write_text("{")
    listing = tmp / "listing.json"
    listing.write_text('{"tensors": 5}')
    not_a_folder = tmp / "file"
    not_a_folder.write_text("x")
    c = ("--content", str(project))
    return [
        (*c, "--add-variant", BASE),
        (*c, "--add-variant", BASE, "--quant-config", str(tmp / "missing.json"), "--repo", "a/b", "--revision",
         "unpinned"),
        (*c, "--add-variant", BASE, "--quant-config", str(bad_json), "--repo", "a/b", "--revision", "unpinned"),
        (*c, "--add-variant", BASE, "--quant-config", str(tmp), "--repo", "a/b", "--revision", "unpinned"),
        (*c, "--add-variant", "", "--quant-config", str(bad_json), "--repo", "a/b", "--revision", "unpinned"),
        (*c, "--add-variant", "nope", "--quant-config", str(bad_json), "--repo", "a/b", "--revision", "unpinned"),
        (*c, "--add-variant", BASE, "--quant-config", str(bad_json), "--repo", "a", "--revision", "x"),
        (*c, "--add-variant", BASE, "--quant-config", str(bad_json), "--repo", "a/...", "--revision", "unpinned"),
        (*c, "--add-model", "new", "--config", str(tmp / "missing.json"), "--repo", "a/b", "--revision", "unpinned"),
        (*c, "--add-model", "new", "--config", str(bad_json), "--repo", "a/b", "--revision", "unpinned"),
        (*c, "--add-model", "new", "--config", str(tmp), "--repo", "a/b", "--revision", "unpinned"),
        (*c, "--add-model", "../x", "--config", str(bad_json), "--repo", "a/b", "--revision", "unpinned"),
        (*c, "--add-model", "new"),
        (*c, "--record-checkpoint", BASE),
        (*c, "--record-checkpoint", BASE, "--from-folder", str(tmp / "missing")),
        (*c, "--record-checkpoint", BASE, "--from-folder", str(not_a_folder)),
        (*c, "--record-checkpoint", BASE, "--from-listing", str(listing)),
        (*c, "--record-checkpoint", BASE, "--from-listing", str(bad_json)),
        (*c, "--record-checkpoint", BASE, "--from-gguf", str(bad_json)),
        (*c, "--record-checkpoint", "../x", "--from-listing", str(listing)),
        ("--content", str(tmp / "missing"), "--check"),
        ("--content", str(not_a_folder), "--verify-hub"),
        ("--jobs", "many"),
        ("--no-such-flag",),
    ]


def test_every_command_on_malformed_input_is_one_line(project, tmp_path):
    """No traceback from any command on bad input: exit 1 with one line per problem, or argparse's usage line
    and one error line with exit 2."""
    tmp = tmp_path / "inputs"
    tmp.mkdir()
    for args in _cases(project, tmp):
        result = _argparse(args)  # a traceback would end the test here
        if result.returncode == 2:
            assert result.stderr.splitlines()[-1].split(": ")[1] == "error", (args, result.stderr)
            continue
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        one_line_error(result)
    assert sorted(p.name for p in (project / "content/models").iterdir()) == [BASE]


def test_unknown_key_cost_is_linear(project, tmp_path):
    """Each unknown config key cost ~8 ms, a regex search of every reference file (20,000 keys took over 120 s);
    --add-model of a config with 20,000 unknown keys now ends well inside the deadline (some 8 s on 2 cores)."""
    raw = load_model_content(ROOT / "content/models" / BASE).config
    raw = {k: v for k, v in raw.items() if v is not None}
    raw.update({f"unknown_key_{i}": i for i in range(20_000)})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with deadline(60):
        result = build_main("--content", str(project), "--add-model", "many-keys", "--config", str(path),
                            "--repo", "a/b", "--revision", "unpinned")
    assert result.returncode == 0, result.stderr
    unused = load_model_content(project / "content/models/many-keys").checkpoint.config_unused
    assert len([k for k in unused if k.startswith("unknown_key_")]) == 20_000



# ----------------------------------------------------------------------------------- caches hold checkable values

@pytest.mark.parametrize("edit", [{"layer": 99}, {"experts": 10}, {"selected": [10_000]}, {"selected": [5, 5]},
                                  {"selected": []}, {"selected": list(range(20))}, {"path": "blocks.dense"}, None])
def test_an_edited_picture_routing_entry_is_recomputed(tmp_path, monkeypatch, edit):
    """The picture-routing cache published whatever its entry said (layer 99, expert 10,000 of 256): an entry that
    disagrees with what the spec states is run again."""
    from explorer.execute import picture_routing as pr

    spec = load_model_spec(load_model_content(ROOT / "content/models/deepseek-v3"))
    routing = pr.picture_routing(spec, tmp_path)
    (entry,) = tmp_path.glob("deepseek-v3-picture-*.json")
    data = read_cache_entry(entry)
    write_cache_entry(entry, None if edit is None else {**data, **edit})  # resealed: the checks behind the seal
    runs = []
    real = pr.route_example
    monkeypatch.setattr(pr, "route_example", lambda s: runs.append(1) or real(s))
    assert pr.picture_routing(spec, tmp_path) == routing and runs == [1]
    assert pr.picture_routing(spec, tmp_path) == routing and runs == [1]  # the rewritten entry is read back
