"""Storage schemes: how one logical weight is laid out in a checkpoint.

A scheme expands a weight (its name and logical shape) into the tensors a checkpoint stores for it, each with
its dtype, element count and bytes, so the ledger, the pages and the API read the same numbers.

- Dense: the weight itself, in one dtype (BF16, F32, ...).
- BlockFP8: the weight in FP8 plus one F32 scale per block (DeepSeek-V3's `weight_scale_inv`,
  quantization_config.weight_block_size).
- MXFP4: the weight replaced by `_blocks` (two 4-bit values per byte, 32 values per block) and `_scales`
  (one shared 8-bit exponent per block), as gpt-oss stores its experts (OCP Microscaling Formats spec v1.0).
- GGUFQuant: llama.cpp's block quantization types (Q4_1, Q8_0, Q4_K, ...), whose tensors keep their element
  count and take a fixed number of bytes per block of values.
- GGUFMix: a llama.cpp file type that mixes such types (Q4_K_M): each tensor takes one of a known set.
- PackQuantized: compressed-tensors' "pack-quantized" integers (Kimi K2.5's INT4 experts): `weight_packed` (I32,
  32 / num_bits values per word), `weight_scale` (one per group of the input axis), `weight_shape` (I64 [2]).
- NVFP4: NVIDIA ModelOpt's export: `weight` (U8, two FP4 E2M1 values per byte), `weight_scale` (F8_E4M3, one per
  16 values), `weight_scale_2` and `input_scale` (F32 scalars).
- FP8PerTensor: FP8 values with one static F32 scale for the whole weight (and one for its input).

Each scheme's `header_elements` is what a count of the checkpoint header's elements would report for the weight:
packed codes count as their words or bytes, not as the values they hold, and scales count as if they were
parameters; `parameters` of the tensors it returns keeps the logical count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Literal

from explorer.errors import ContentError

Role = Literal["parameter", "quant_scale", "buffer"]
"""parameter: a learned value (packed or not); quant_scale: quantization metadata; buffer: stored non-trained."""

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}
"""Bytes per element of each safetensors dtype."""

TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
"""config.json torch_dtype -> safetensors dtype."""


class SchemeError(ContentError):
    """A storage scheme given a number outside its definition (a block of 0, a group of -16): raised when the scheme
    is made, so that no family and no variant can build one, whichever config supplied the number (issue 37). The
    one problem reads "key 'NAME': ...", NAME the config key that supplies the number; the caller adds the file."""


MAX_BLOCK = 16_384
"""Largest block side or group the library takes from a config: published ones are 16 to 128, and a larger one
would group more inputs than any projection has."""


def _whole(value: object, low: int = 1, high: int = MAX_BLOCK) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _power_of_two(value: object) -> bool:
    return _whole(value) and value & (value - 1) == 0  # type: ignore[operator]


def _refuse(key: str, message: str) -> None:
    raise SchemeError([f"key '{key}': {message}"])


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor a checkpoint stores for a logical weight."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: Role
    parameters: int
    """Logical parameters this tensor carries (0 for scales and buffers)."""
    nbytes: int
    """Bytes it takes in the checkpoint."""
    also: tuple[str, ...] = ()
    """Other dtypes the scheme accepts for this tensor (a mixed GGUF file type picks one per tensor)."""

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


def _stored(name: str, shape: tuple[int, ...], dtype: str, role: Role, parameters: int) -> StoredTensor:
    """A tensor of a plain dtype: elements × bytes per element."""
    return StoredTensor(name, shape, dtype, role, parameters, math.prod(shape) * DTYPE_BYTES.get(dtype, 0))


@dataclass(frozen=True, slots=True)
class Dense:
    """Stored as is."""

    dtype: str

    @property
    def label(self) -> str:
        return self.dtype

    def expand(self, name: str, shape: tuple[int, ...], role: Role = "parameter") -> tuple[StoredTensor, ...]:
        return (_stored(name, shape, self.dtype, role, math.prod(shape) if role == "parameter" else 0),)


@dataclass(frozen=True, slots=True)
class BlockFP8:
    """FP8 values and one scale per block of `block` (rows × columns), ceiling division at the edges."""

    dtype: str
    block: tuple[int, ...]
    scale_dtype: str = "F32"
    scale_suffix: str = "_scale_inv"
    scale_fmt: str = ""
    """quantization_config.scale_fmt where published: "ue8m0" rounds every scale to a power of two (an unsigned
    8-bit exponent's worth), still written in scale_dtype."""
    swap_last: bool = False
    """The checkpoint holds the weight with its last two axes swapped: Llama 4's stacked experts, [E, in, out] in
    BF16, are [E, out, in] in FP8, as transformers' FP8Experts holds them."""

    def __post_init__(self) -> None:
        """A block is rows × columns of whole positive sizes (quantization_config.weight_block_size)."""
        if not (len(self.block) == 2 and all(_whole(b) for b in self.block)):
            _refuse("weight_block_size", f"must be two integers in 1..{MAX_BLOCK:,} (rows, columns of a block), got "
                                         f"{list(self.block)}")

    @property
    def label(self) -> str:
        return (f"{self.dtype}, one {self.scale_dtype} scale per {' × '.join(map(str, self.block))} block"
                + self._fmt_text)

    @property
    def stored_as(self) -> str:
        """"in FP8 (e4m3) with one scale per 128 × 128 block", as the seed pages say it."""
        fmt = self.dtype.removeprefix("F8_").lower()
        return f"in FP8 ({fmt}) with one scale per {' × '.join(map(str, self.block))} block" + self._fmt_text

    @property
    def _fmt_text(self) -> str:
        return f", each scale a power of two ({self.scale_fmt})" if self.scale_fmt == "ue8m0" else ""

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """[7168, 18432] with 128 × 128 blocks -> [56, 144]; leading axes (experts stacked in one tensor) are kept:
        [16, 16384, 5120] -> [16, 128, 40]."""
        lead = len(shape) - len(self.block)
        return tuple(shape[:lead]) + tuple(-(-s // b) for s, b in zip(shape[lead:], self.block))

    def expand(self, name: str, shape: tuple[int, ...], role: Role = "parameter") -> tuple[StoredTensor, ...]:
        if self.swap_last:
            shape = (*shape[:-2], shape[-1], shape[-2])
        return (_stored(name, shape, self.dtype, "parameter", math.prod(shape)),
                _stored(name + self.scale_suffix, self.scale_shape(shape), self.scale_dtype, "quant_scale", 0))


@dataclass(frozen=True, slots=True)
class MXFP4:
    """32 E2M1 values per block packed two per byte (U8), one E8M0 exponent per block (U8); the last logical
    axis is the packed one."""

    block: int = 32

    def __post_init__(self) -> None:
        if self.block != 32:  # OCP Microscaling Formats v1.0: k = 32 values share one exponent
            _refuse("block", f"MXFP4 blocks hold 32 values (OCP MX v1.0), got {self.block!r}")

    @property
    def stored_as(self) -> str:
        return f"in MXFP4 ({self.block} four-bit values and one shared exponent per block)"

    @property
    def label(self) -> str:
        return f"MXFP4: {self.block} four-bit values per block, two per byte, one shared 8-bit exponent per block"

    def expand(self, name: str, shape: tuple[int, ...], role: Role = "parameter") -> tuple[StoredTensor, ...]:
        *outer, cols = shape
        groups = -(-cols // self.block)
        return (_stored(name + "_blocks", (*outer, groups, self.block // 2), "U8", "parameter", math.prod(shape)),
                _stored(name + "_scales", (*outer, groups), "U8", "quant_scale", 0))


@dataclass(frozen=True, slots=True)
class FP4Rows:
    """Four-bit E2M1 values packed two to an int8 byte along the last axis, and one scale per `group` values of a
    row, stored as the weight's name and `_scale_inv`: the layout transformers' fine-grained FP8 integration holds
    DeepSeek-V4's four-bit experts in (its expert_dtype "fp4": weight_k_div 2, sf_gran_n 1, sf_gran_k 32)."""

    scale_dtype: str = "F8_E8M0"
    group: int = 32

    @property
    def stored_as(self) -> str:
        return f"in FP4 (E2M1, two values a byte) with one scale per {self.group} values of a row"

    @property
    def label(self) -> str:
        return f"FP4: two E2M1 values per int8 byte, one {self.scale_dtype} scale per {self.group} values of a row"

    def expand(self, name: str, shape: tuple[int, ...], role: Role = "parameter") -> tuple[StoredTensor, ...]:
        *outer, cols = shape
        return (_stored(name, (*outer, -(-cols // 2)), "I8", "parameter", math.prod(shape)),
                _stored(name + "_scale_inv", (*outer, -(-cols // self.group)), self.scale_dtype, "quant_scale", 0))


@dataclass(frozen=True, slots=True)
class GGUFQuant:
    """A llama.cpp quantization type: `block_size` values in `type_size` bytes; the element count is kept."""

    dtype: str
    block_size: int
    type_size: int

    @property
    def label(self) -> str:
        return f"GGUF {self.dtype}: {self.block_size} values in {self.type_size} bytes"

    def expand(self, name: str, shape: tuple[int, ...], role: Role = "parameter") -> tuple[StoredTensor, ...]:
        blocks = -(-math.prod(shape) // self.block_size)
        return (StoredTensor(name, shape, self.dtype, role, math.prod(shape) if role == "parameter" else 0,
                             blocks * self.type_size),)


@dataclass(frozen=True, slots=True)
class GGUFMix:
    """A llama.cpp file type that mixes quantization types: the quantizer gives each tensor one of `types` (by
    layer, and falling back from a K-quant when a row is not a whole number of 256-value super-blocks), so which
    one a tensor got is read from the recorded manifest, and any type outside the set is a mismatch."""

    file_type: str
    """llama.cpp's name of the file type, e.g. "Q4_K_M"."""
    types: tuple[str, ...]

    @property
    def dtype(self) -> str:
        return self.types[0]

    @property
    def label(self) -> str:
        return f"GGUF {self.file_type}: one of {', '.join(self.types)} per tensor"

    @property
    def stored_as(self) -> str:
        return f"in llama.cpp's {self.file_type} mix ({', '.join(self.types)}, chosen per tensor)"

    def expand(self, name: str, shape: tuple[int, ...], role: Role = "parameter") -> tuple[StoredTensor, ...]:
        """Bytes as the nominal (first) type would take them; the manifest has each tensor's own type and bytes."""
        block, block_bytes = GGML_BLOCKS[self.types[0]]
        return (StoredTensor(name, shape, self.types[0], role, math.prod(shape) if role == "parameter" else 0,
                             -(-math.prod(shape) // block) * block_bytes, self.types[1:]),)


GGML_BLOCKS = {"Q4_K": (256, 144), "Q5_0": (32, 22), "Q6_K": (256, 210), "Q8_0": (32, 34)}
"""Values per block and bytes per block of the GGML types a mix names (ggml's type traits)."""

GGUF_MIXES = {"Q4_K_M": ("Q4_K", "Q5_0", "Q6_K", "Q8_0")}
"""Types llama.cpp's mixed file types give 2-D weights (llama.cpp src/llama-quant.cpp): Q4_K_M uses Q4_K, Q6_K
for some layers' attn_v/ffn_down and for the output (or a tied token embedding), with Q5_0 and Q8_0 as the
fallbacks where a row is not a multiple of 256 values."""

@dataclass(frozen=True, slots=True)
class PackQuantized:
    """compressed-tensors' pack-quantized format (compressors/pack_quantized, CompressionFormat "pack-quantized"):
    integer codes of `num_bits` packed densely into int32 words along the input axis (code i of a row at bits
    num_bits·i of the row's bit string, offset by 2^(num_bits-1) so they are unsigned), one scale per
    `group_size` inputs (symmetric: no zero point is stored), and the logical shape as an int64 vector."""

    num_bits: int = 4
    group_size: int = 32
    scale_dtype: str = "BF16"
    """The scale keeps the dtype of the weight it was computed from (the model's torch_dtype)."""

    def __post_init__(self) -> None:
        """Codes pack whole into 32-bit words; a group is a power of two of inputs (the group sizes GPTQ, AWQ and
        compressed-tensors' presets use), which must also divide the width it groups (explorer/checkpoint/variants.py)."""
        if self.num_bits not in (2, 4, 8):
            _refuse("num_bits", f"must be 2, 4 or 8 (codes packed whole into 32-bit words), got {self.num_bits!r}")
        if not _power_of_two(self.group_size):
            _refuse("group_size", f"must be a power of two in 1..{MAX_BLOCK:,} (inputs per scale), got "
                                  f"{self.group_size!r}")

    @property
    def label(self) -> str:
        return (f"compressed-tensors pack-quantized INT{self.num_bits}: {32 // self.num_bits} values per I32 word, "
                f"one {self.scale_dtype} scale per {self.group_size} values, the shape as I64")

    @property
    def stored_as(self) -> str:
        return (f"as compressed-tensors pack-quantized INT{self.num_bits} (symmetric, one scale per group of "
                f"{self.group_size} inputs)")

    def expand(self, name: str, shape: tuple[int, ...], role: Role = "parameter") -> tuple[StoredTensor, ...]:
        base = name.removesuffix("weight")
        *outer, cols = shape
        words = -(-cols * self.num_bits // 32)
        return (_stored(base + "weight_packed", (*outer, words), "I32", "parameter", math.prod(shape)),
                _stored(base + "weight_scale", (*outer, -(-cols // self.group_size)), self.scale_dtype,
                        "quant_scale", 0),
                _stored(base + "weight_shape", (len(shape),), "I64", "quant_scale", 0))


@dataclass(frozen=True, slots=True)
class NVFP4:
    """NVFP4 as NVIDIA ModelOpt exports it (hf_quant_config.json quant_algo "NVFP4"): the weight's FP4 E2M1 codes
    two per byte under the weight's own name (element 2j in the low nibble), an FP8 E4M3 scale per `group` inputs,
    an F32 second-level scale for the whole weight and the F32 static scale of the layer's input."""

    group: int = 16

    def __post_init__(self) -> None:
        if self.group != 16:  # NVFP4 is defined with one E4M3 scale per 16 FP4 values (ModelOpt writes group_size 16)
            _refuse("group_size", f"NVFP4 stores one FP8 scale per 16 values, so group_size must be 16, got "
                                  f"{self.group!r}")

    @property
    def label(self) -> str:
        return (f"NVFP4: two FP4 E2M1 values per U8, one F8_E4M3 scale per {self.group} values, an F32 global "
                "weight scale and an F32 input scale")

    @property
    def stored_as(self) -> str:
        return f"in NVFP4 (FP4 values, one FP8 scale per {self.group} and an FP32 scale per tensor)"

    def expand(self, name: str, shape: tuple[int, ...], role: Role = "parameter") -> tuple[StoredTensor, ...]:
        base = name.removesuffix("weight")
        *outer, cols = shape
        return (_stored(base + "weight", (*outer, -(-cols // 2)), "U8", "parameter", math.prod(shape)),
                _stored(base + "weight_scale", (*outer, -(-cols // self.group)), "F8_E4M3", "quant_scale", 0),
                _stored(base + "weight_scale_2", (), "F32", "quant_scale", 0),
                _stored(base + "input_scale", (), "F32", "quant_scale", 0))


@dataclass(frozen=True, slots=True)
class FP8PerTensor:
    """FP8 values and one static F32 scale per weight (and, with `input_scale`, one for its input activations).
    Names default to ModelOpt's and compressed-tensors' (weight_scale, input_scale); transformers' own FP8 layer
    calls them weight_scale_inv and activation_scale. Scalars are stored with `scale_shape` ([] or [1])."""

    dtype: str = "F8_E4M3"
    scale_name: str = "weight_scale"
    input_name: str = "input_scale"
    input_scale: bool = True
    scale_shape: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.dtype}, one F32 scale per tensor" + (" and one for its input" if self.input_scale else "")

    @property
    def stored_as(self) -> str:
        return f"in FP8 ({self.dtype.removeprefix('F8_').lower()}) with one static scale per tensor"

    def expand(self, name: str, shape: tuple[int, ...], role: Role = "parameter") -> tuple[StoredTensor, ...]:
        base = name.removesuffix("weight")
        out = (_stored(name, shape, self.dtype, "parameter", math.prod(shape)),
               _stored(base + self.scale_name, self.scale_shape, "F32", "quant_scale", 0))
        return out + ((_stored(base + self.input_name, self.scale_shape, "F32", "quant_scale", 0),)
                      if self.input_scale else ())


def header_elements(tensors: tuple[StoredTensor, ...] | list[StoredTensor]) -> int:
    """What a count of a safetensors header's elements reports for these tensors: every stored element once,
    packed words and bytes as one element each, scales and shape vectors included."""
    return sum(t.elements for t in tensors)


Storage = Dense | BlockFP8 | MXFP4 | FP4Rows | GGUFQuant | GGUFMix | PackQuantized | NVFP4 | FP8PerTensor


def bytes_per_parameter(scheme: Storage, shape: tuple[int, ...] = (4096, 4096)) -> float:
    """Bytes a weight of `shape` takes stored as `scheme`, per logical parameter: its values with every scale,
    per-tensor scalar and shape vector the scheme stores beside them (what a memory figure should multiply)."""
    return sum(t.nbytes for t in scheme.expand("w.weight", shape)) / math.prod(shape)


@cache
def ggml_blocks() -> dict[str, tuple[int, int]]:
    """GGUF (llama.cpp) types by name: (elements per block, bytes per block), from the gguf package's table."""
    from gguf import GGML_QUANT_SIZES

    return {t.name: sizes for t, sizes in GGML_QUANT_SIZES.items()}


def known_dtype(dtype: str) -> bool:
    """A safetensors dtype or a GGUF (llama.cpp) type name (gguf, and its numpy, imported only for the latter)."""
    return dtype in DTYPE_BYTES or dtype in ggml_blocks()


def storage_block(dtype: str) -> tuple[int, int]:
    """Elements per block and bytes per block of a stored dtype: (1, size) for safetensors dtypes; quantized
    GGUF types store whole blocks (Q4_1: 32 values in 20 bytes)."""
    return (1, DTYPE_BYTES[dtype]) if dtype in DTYPE_BYTES else ggml_blocks()[dtype]
