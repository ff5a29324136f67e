"""Read GGUF checkpoint headers (llama.cpp's format) into the same CheckpointIndex as safetensors headers.

GGUF layout (little-endian; ggml's docs/gguf.md): magic "GGUF", u32 version, u64 tensor count, u64 key-value
count; the key-value metadata (string key, u32 value type, value; arrays carry an element type and a u64
length); one info per tensor (string name, u32 number of dimensions, u64 per dimension innermost first, u32
GGML type, u64 offset into the data section); then, aligned to general.alignment (default 32), the data.

Only the header is read, through a byte budget, so a file's first split part (gemma-3-270m's part00) reads like
the whole file and a remote range read could serve the same parser. Each GGML type's block size and bytes per
block come from the gguf package (llama.cpp's own reader), so element and byte counts are exact.

References: ggml docs/gguf.md (layout); gguf-py constants (GGML_QUANT_SIZES, GGMLQuantizationType, and
GGUFValueType's numbering); llama.cpp convert_hf_to_gguf.py (tensor names, the q/k row permutation, Gemma's
norm shift); transformers' GGUF loading (modeling_gguf_pytorch_utils.py), the oracle in tests/test_gguf.py.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from explorer.checkpoint.index import CheckpointIndex, TensorInfo, check_spans
from explorer.errors import CheckpointError

if TYPE_CHECKING:
    import torch

MAGIC = b"GGUF"
VERSIONS = (2, 3)
"""Version 1 counted in 32 bits and is long gone; 2 and 3 share the header layout (3 allows big-endian
files, whose version then reads as 0x03000000 here and is refused)."""
MAX_HEADER_BYTES = 100_000_000
"""Budget for everything before the tensor data (Gemma 3's 262,144-token vocabulary takes about 6 MB)."""
MAX_TENSORS = 1_000_000
MAX_KEYS = 100_000
MAX_ARRAY = 10_000_000
MAX_DIMS = 4
"""GGML_MAX_DIMS: ggml tensors have at most four dimensions."""
DEFAULT_ALIGNMENT = 32
CHUNK_BYTES = 1 << 20

Scalar = Union[int, float, bool, str]
Value = Union[Scalar, tuple[Scalar, ...]]

# Fixed-width value types of the metadata (GGUFValueType numbering): struct format of one element.
_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor info of a GGUF header, as llama.cpp wrote it."""

    name: str
    """llama.cpp's name, e.g. "blk.0.attn_q.weight"."""
    ggml_type: str
    """GGML type name: F32, F16, Q8_0, Q4_K, ..."""
    dims: tuple[int, ...]
    """Innermost dimension first (ggml's ne[]); the reference's shape is this reversed."""
    offset: int
    """Byte offset from the start of the data section."""
    elements: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """Everything before a GGUF file's tensor data."""

    source: str
    version: int
    metadata: dict[str, Value]
    """Key-value metadata in file order; arrays are tuples."""
    tensors: tuple[GGUFTensor, ...]
    data_offset: int
    """Absolute byte offset where the (aligned) tensor data begins."""

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointError(self.source, "metadata has no string 'general.architecture'")
        return arch


# ------------------------------------------------------------------------------------------ the parser

class _Cursor:
    """Sequential reads from a byte source, never past the header budget; every failure names the source."""

    def __init__(self, read: Callable[[int], bytes], source: str, budget: int) -> None:
        self._read, self.source, self._budget = read, source, budget
        self._buffer = bytearray()
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > self._budget:
            raise CheckpointError(self.source, f"{what} at byte {self.pos:,} runs past the {self._budget:,}-byte "
                                               "header budget")
        while len(self._buffer) < end:
            chunk = self._read(min(max(CHUNK_BYTES, end - len(self._buffer)), self._budget - len(self._buffer)))
            if not chunk:
                raise CheckpointError(self.source, f"truncated: {what} at byte {self.pos:,} needs {n:,} bytes, "
                                                   f"the source ends at {len(self._buffer):,}")
            self._buffer += chunk
        data = bytes(self._buffer[self.pos:end])
        self.pos = end
        return data

    def unpack(self, fmt: str, what: str) -> int:
        (value,) = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))
        return int(value)

    def string(self, what: str) -> str:
        n = self.unpack("Q", f"length of {what}")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(self.source, f"{what} is not UTF-8: {e}") from e

    def value(self, vtype: int, what: str) -> Value:
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            return self._array(what)
        fmt = _FORMATS.get(vtype)
        if fmt is None:
            raise CheckpointError(self.source, f"{what}: unknown value type {vtype}")
        (value,) = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))
        return value  # type: ignore[no-any-return]

    def _array(self, what: str) -> tuple[Scalar, ...]:
        etype = self.unpack("I", f"element type of {what}")
        n = self.unpack("Q", f"length of {what}")
        if n > MAX_ARRAY:
            raise CheckpointError(self.source, f"{what}: array of {n:,} elements exceeds the {MAX_ARRAY:,} cap")
        if etype == _STRING:
            return tuple(self.string(f"{what}, element {i},") for i in range(n))
        fmt = _FORMATS.get(etype)
        if fmt is None:  # arrays of arrays are legal in the spec but written by no converter
            raise CheckpointError(self.source, f"{what}: unsupported array element type {etype}")
        return tuple(struct.unpack(f"<{n}{fmt}", self.take(n * struct.calcsize(fmt), what)))


def parse_gguf_header(read: Callable[[int], bytes], source: str, data_size: int | None = None) -> GGUFHeader:
    """Parse a GGUF header from a stream of bytes (read(n) returns up to the next n bytes).

    data_size, when known, is the whole file's size: every tensor must then end inside it.
    """
    cur = _Cursor(read, source, MAX_HEADER_BYTES)
    magic = cur.take(4, "magic")
    if magic != MAGIC:
        raise CheckpointError(source, f"not a GGUF file: magic {magic!r}, expected {MAGIC!r}")
    version = cur.unpack("I", "version")
    if version not in VERSIONS:
        raise CheckpointError(source, f"unsupported GGUF version {version} (readable: 2, 3, little-endian)")
    n_tensors = _bounded(cur.unpack("Q", "tensor count"), MAX_TENSORS, "tensor count", source)
    n_keys = _bounded(cur.unpack("Q", "key-value count"), MAX_KEYS, "key-value count", source)
    metadata = _read_metadata(cur, n_keys)
    alignment = _alignment(metadata, source)
    tensors = tuple(_read_tensor_info(cur, i, alignment) for i in range(n_tensors))
    data_offset = -(-cur.pos // alignment) * alignment
    _check_tensors(tensors, source, None if data_size is None else data_size - data_offset)
    return GGUFHeader(source, version, metadata, tensors, data_offset)


def _bounded(n: int, cap: int, what: str, source: str) -> int:
    if n > cap:
        raise CheckpointError(source, f"{what} {n:,} exceeds the {cap:,} cap")
    return n


def _read_metadata(cur: _Cursor, n_keys: int) -> dict[str, Value]:
    metadata: dict[str, Value] = {}
    for i in range(n_keys):
        key = cur.string(f"key {i}")
        if key in metadata:
            raise CheckpointError(cur.source, f"key '{key}' appears twice")
        metadata[key] = cur.value(cur.unpack("I", f"type of key '{key}'"), f"key '{key}'")
    return metadata


def _alignment(metadata: dict[str, Value], source: str) -> int:
    value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1):
        raise CheckpointError(source, f"key 'general.alignment': {value!r} is not a positive power of two")
    return value


def _read_tensor_info(cur: _Cursor, i: int, alignment: int) -> GGUFTensor:
    name = cur.string(f"name of tensor {i}")
    where = f"tensor '{name}'"
    n_dims = cur.unpack("I", f"{where}: number of dimensions")
    if not 1 <= n_dims <= MAX_DIMS:
        raise CheckpointError(cur.source, f"{where}: {n_dims} dimensions, expected 1 to {MAX_DIMS}")
    dims = tuple(cur.unpack("Q", f"{where}: dimension {d}") for d in range(n_dims))
    type_id = cur.unpack("I", f"{where}: type")
    offset = cur.unpack("Q", f"{where}: offset")
    ggml_type, block, block_bytes = _ggml_type(type_id, cur.source, where)
    if dims[0] % block:
        raise CheckpointError(cur.source, f"{where}: innermost dimension {dims[0]:,} is not a multiple of "
                                          f"{ggml_type}'s block of {block}")
    if offset % alignment:
        raise CheckpointError(cur.source, f"{where}: offset {offset:,} is not aligned to {alignment}")
    elements = math.prod(dims)
    return GGUFTensor(name, ggml_type, dims, offset, elements, elements // block * block_bytes)


def _ggml_type(type_id: int, source: str, where: str) -> tuple[str, int, int]:
    """Name, elements per block and bytes per block of a GGML type id, from the gguf package's table."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(type_id)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise CheckpointError(source, f"{where}: unknown GGML type {type_id}") from None
    return qtype.name, block, block_bytes


def _check_tensors(tensors: tuple[GGUFTensor, ...], source: str, data_size: int | None) -> None:
    """Names are unique; data spans neither overlap nor, when the file is whole, run past its end."""
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise CheckpointError(source, f"tensor '{t.name}' is listed twice")
        seen.add(t.name)
    check_spans(((t.offset, t.offset + t.nbytes, t.name) for t in tensors), source, data_size,
                of=" of the data", buffer="the file's {size:,} data bytes")


# ---------------------------------------------------------------------------------------- local files

_SPLIT_PART = re.compile(r"\.gguf\.part\d+$")
"""A raw split of one GGUF file ("...gguf.part00"): its tensor data continues in the next parts."""


def read_gguf_header(path: Path) -> GGUFHeader:
    """Read only the header of one local GGUF file (or of the first raw part of a split one)."""
    source = str(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            return parse_gguf_header(f.read, source, None if _SPLIT_PART.search(path.name) else size)
    except OSError as e:
        raise CheckpointError(source, f"cannot read: {e.strerror or e}") from e


# ----------------------------------------------------------------------------- names in the reference's terms

# llama.cpp's stems (llama.cpp src/llama-arch.cpp) -> transformers' module paths. The same stem can mean
# different modules per architecture: in Llama "ffn_norm" is the norm after attention (post_attention_layernorm),
# in Gemma 3 the pre-feed-forward norm of its sandwich, next to the separate post_attention_norm and post_ffw_norm.
# Names and shapes only: llama.cpp's Gemma converter also stores each norm gain as 1 + w (its RMSNorm multiplies
# by the stored weight, Gemma's by 1 + w), so Gemma values read from GGUF are shifted by one.
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GEMMA3_BLOCK = {
    **_LLAMA_BLOCK, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
BLOCK_NAMES = {"llama": _LLAMA_BLOCK, "gemma3": _GEMMA3_BLOCK}
"""Per GGUF architecture: llama.cpp block stem -> transformers module path inside model.layers.N."""
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL_NAME = re.compile(r"^(\w+)\.(weight|bias)$")


def reference_name(gguf_name: str, arch: str) -> str | None:
    """transformers' checkpoint name for a llama.cpp tensor name, or None when there is no mapping."""
    if m := _BLOCK_NAME.match(gguf_name):
        module = BLOCK_NAMES[arch].get(m[2])
        return None if module is None else f"model.layers.{m[1]}.{module}.{m[3]}"
    if m := _GLOBAL_NAME.match(gguf_name):
        module = _GLOBAL_NAMES.get(m[1])
        return None if module is None else f"{module}.{m[2]}"
    return None


def gguf_tensor_infos(header: GGUFHeader, shard: str = "") -> dict[str, TensorInfo]:
    """The header's tensors under the reference's names and in its shape order, with their GGML types.

    A tied head is simply absent (llama.cpp writes no output.weight); any tensor without a mapping is an error.
    """
    arch = header.architecture
    if arch not in BLOCK_NAMES:
        raise CheckpointError(header.source, f"architecture '{arch}' has no tensor-name mapping; known: "
                                             f"{', '.join(sorted(BLOCK_NAMES))}")
    unmapped = sorted(t.name for t in header.tensors if reference_name(t.name, arch) is None)
    if unmapped:
        raise CheckpointError(header.source, f"{len(unmapped)} tensors have no {arch} mapping: "
                                             f"{', '.join(unmapped[:5])}{' ...' if len(unmapped) > 5 else ''}")
    tensors = {}
    for t in header.tensors:
        name = reference_name(t.name, arch)
        assert name is not None
        # ggml lists the innermost (contiguous) dimension first; torch lists it last
        tensors[name] = TensorInfo(name, t.ggml_type, tuple(reversed(t.dims)), shard)
    return dict(sorted(tensors.items()))


def read_gguf_checkpoint(path: Path) -> CheckpointIndex:
    """Read one GGUF file's header as a CheckpointIndex in the reference's names, shapes and GGML types."""
    return CheckpointIndex.of(gguf_tensor_infos(read_gguf_header(path), shard=path.name), source=str(path))


# ----------------------------------------------------------------------------------- hyper-parameters

# transformers config key -> GGUF key under the architecture's prefix ("llama.", "gemma3.").
_REQUIRED_KEYS = {
    "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
    "num_hidden_layers": "block_count", "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base", "max_position_embeddings": "context_length",
}
_OPTIONAL_KEYS = {"head_dim": "attention.key_length", "sliding_window": "attention.sliding_window"}
_TOKEN_KEYS = {"bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id",
               "pad_token_id": "tokenizer.ggml.padding_token_id"}
MODEL_TYPES = {"llama": "llama", "gemma3": "gemma3_text"}
"""transformers' model_type of each GGUF architecture's text model."""

Config = dict[str, Union[int, float, bool, str]]


def gguf_config(path: Path) -> tuple[Config, dict[str, str]]:
    """A config.json-style dict (transformers key names) from a GGUF file's metadata, and each key's provenance."""
    return config_from_header(read_gguf_header(path))


def config_from_header(header: GGUFHeader) -> tuple[Config, dict[str, str]]:
    """config.json values from a header's metadata; provenance names the GGUF key (or fact) behind each."""
    arch = header.architecture
    if arch not in MODEL_TYPES:
        raise CheckpointError(header.source, f"architecture '{arch}' has no config mapping; known: "
                                             f"{', '.join(sorted(MODEL_TYPES))}")
    config, provenance = _metadata_values(header, arch)
    config["model_type"], provenance["model_type"] = MODEL_TYPES[arch], "general.architecture"
    if "head_dim" not in config:  # Llama files carry no key_length: transformers' own default, hidden / heads
        config["head_dim"] = int(config["hidden_size"]) // int(config["num_attention_heads"])
        provenance["head_dim"] = f"{provenance['hidden_size']} / {provenance['num_attention_heads']}"
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, tuple):
        raise CheckpointError(header.source, "metadata has no token list 'tokenizer.ggml.tokens' (for vocab_size)")
    config["vocab_size"], provenance["vocab_size"] = len(tokens), "length of tokenizer.ggml.tokens"
    tied = not any(t.name == "output.weight" for t in header.tensors)
    config["tie_word_embeddings"] = tied
    provenance["tie_word_embeddings"] = ("no output.weight tensor: the head reuses token_embd.weight" if tied
                                         else "output.weight tensor stored")
    return dict(sorted(config.items())), dict(sorted(provenance.items()))


def _metadata_values(header: GGUFHeader, arch: str) -> tuple[Config, dict[str, str]]:
    """The values read directly from metadata keys; a missing required key is an error naming it."""
    required = {k: f"{arch}.{v}" for k, v in _REQUIRED_KEYS.items()}
    optional = {**{k: f"{arch}.{v}" for k, v in _OPTIONAL_KEYS.items()}, **_TOKEN_KEYS}
    config: Config = {}
    provenance: dict[str, str] = {}
    for key, gguf_key in {**required, **optional}.items():
        value = header.metadata.get(gguf_key)
        if value is None and key in required:
            raise CheckpointError(header.source, f"metadata has no '{gguf_key}' (for {key})")
        if value is not None:
            config[key], provenance[key] = _config_value(value, gguf_key, header.source), gguf_key
            _check_kind(key, config[key], gguf_key, header.source)
    return config, provenance


_FLOAT_KEYS = {"rms_norm_eps", "rope_theta"}
_TOKEN_IDS = set(_TOKEN_KEYS)


def _check_kind(key: str, value: Any, gguf_key: str, source: str) -> None:
    """Sizes are positive integers, token ids non-negative ones, eps and rope base positive finite numbers:
    a string or 0 head count used to end in a traceback (issue 18)."""
    if key in _FLOAT_KEYS:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        expected = "a positive finite number"
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= (0 if key in _TOKEN_IDS else 1)
        expected = "a non-negative integer" if key in _TOKEN_IDS else "a positive integer"
    if not ok:
        raise CheckpointError(source, f"key '{gguf_key}' (for {key}): expected {expected}, got {value!r:.60}")


def config_differences(config: Config, provenance: dict[str, str], published: Mapping[str, Any]) -> list[str]:
    """One line per value from the GGUF metadata that the content config lacks or states differently.

    Floats are compared as the float32 GGUF stores (content's 1e-05 is GGUF's 9.99999974737875e-06).
    """
    lines = []
    for key, value in config.items():
        if key not in published:
            lines.append(f"key '{key}': GGUF {provenance[key]} gives {value!r}; the content config lacks it")
        elif not _same_value(value, published[key]):
            lines.append(f"key '{key}': GGUF {provenance[key]} gives {value!r}, the content config {published[key]!r}")
    return lines


def _same_value(a: Any, b: Any) -> bool:
    import numpy as np

    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return bool(np.float32(a) == np.float32(b))
    return type(a) is type(b) and a == b


def _config_value(value: Value, key: str, source: str) -> int | float | bool | str:
    if isinstance(value, float):
        # GGUF stores these as float32; the shortest decimal that rounds to the same float32 is the value
        # the converter read from config.json (1e-05, not 9.999999747378752e-06).
        import numpy as np

        return float(str(np.float32(value)))
    if isinstance(value, tuple):
        raise CheckpointError(source, f"key '{key}': expected a single value, got an array")
    return value


# ---------------------------------------------------------------------------------------- real weights

def dequantize_layer(path: Path, layer: int = 0, llama_cpp_rows: bool = False,
                     header: GGUFHeader | None = None) -> dict[str, torch.Tensor]:
    """One Llama decoder layer's weights from a GGUF file, as float32 tensors under transformers' names.

    Dequantizes with the gguf package's own dequantizer and reads only that layer's bytes. q_proj and k_proj
    come back in transformers' row order (see unpermute_rotary_rows), or as stored with llama_cpp_rows.
    `header`: the file's header where the caller has read it already (a vocabulary takes 0.4 s to parse).
    """
    header = header or read_gguf_header(path)
    if header.architecture != "llama":
        raise CheckpointError(str(path), f"architecture '{header.architecture}': only llama layers are dequantized")
    config, _ = config_from_header(header)
    heads = {"attn_q": int(config["num_attention_heads"]), "attn_k": int(config["num_key_value_heads"])}
    prefix = f"blk.{layer}."
    tensors = [t for t in header.tensors if t.name.startswith(prefix)]
    if not tensors:
        raise CheckpointError(str(path), f"no tensors for layer {layer} (names starting '{prefix}')")
    out = {}
    for t in tensors:
        weight = _dequantize(path, header, t)
        stem = t.name.removeprefix(prefix).split(".")[0]
        if stem in heads and not llama_cpp_rows:
            weight = unpermute_rotary_rows(weight, heads[stem])
        name = reference_name(t.name, "llama")
        assert name is not None
        out[name] = weight
    return dict(sorted(out.items()))


def dequantize_tensor(path: Path, gguf_name: str, header: GGUFHeader | None = None) -> torch.Tensor:
    """One tensor of a GGUF file by llama.cpp's name, dequantized to float32, in the reference's shape order."""
    header = header or read_gguf_header(path)
    found = [t for t in header.tensors if t.name == gguf_name]
    if not found:
        raise CheckpointError(str(path), f"no tensor '{gguf_name}'")
    return _dequantize(path, header, found[0])


def _dequantize(path: Path, header: GGUFHeader, t: GGUFTensor) -> torch.Tensor:
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, dequantize

    raw = _tensor_bytes(path, header, t)
    # rows of raw bytes: [..., ne1, bytes per row]; dequantize expands the last axis to ne0 values
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(*reversed(t.dims[1:]), -1)
    return torch.from_numpy(dequantize(rows, GGMLQuantizationType[t.ggml_type]).copy())


def _tensor_bytes(path: Path, header: GGUFHeader, t: GGUFTensor) -> bytes:
    start = header.data_offset + t.offset
    try:
        with path.open("rb") as f:
            f.seek(start)
            raw = f.read(t.nbytes)
    except OSError as e:
        raise CheckpointError(str(path), f"cannot read tensor '{t.name}': {e.strerror or e}") from e
    if len(raw) != t.nbytes:
        raise CheckpointError(str(path), f"truncated: tensor '{t.name}' needs bytes {start:,}–{start + t.nbytes:,}, "
                                         f"the file has {start + len(raw):,}")
    return raw


def unpermute_rotary_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of a Llama q_proj or k_proj weight's rows, head by head.

    Why it exists: transformers' Llama rotates dimension i of a head with dimension i + d/2 (rotate_half),
    llama.cpp's default rope rotates adjacent dimensions 2i and 2i + 1. Its converter therefore interleaves the
    two halves of each head's rows (stored row 2i is row i, stored row 2i + 1 is row i + d/2), so that both
    rotations compute the same attention. Reading the stored rows as [heads, d/2, 2] and swapping the last two
    axes restores transformers' order. k_proj uses the key-value head count.
    """
    out_features = weight.shape[0]
    d_head = out_features // n_heads
    pairs = weight.reshape(n_heads, d_head // 2, 2, *weight.shape[1:])  # [heads, d/2, 2, in]
    return pairs.transpose(1, 2).reshape(weight.shape)  # [heads, 2, d/2, in] -> [heads * d, in]
