"""Storage schemes of issue 24: compressed-tensors pack-quantized INT4, ModelOpt NVFP4 and FP8 with per-tensor static
scales. Each packs and unpacks by round trip on random tensors, and each scheme's predicted tensors (names, dtypes,
shapes) are the ones its packer writes."""

from __future__ import annotations

import pytest
import torch

from explorer.checkpoint.formats import fp8_tensor, int4_pack, nvfp4
from explorer.spec.storage import NVFP4, FP8PerTensor, PackQuantized, header_elements

DTYPES = {torch.int32: "I32", torch.int64: "I64", torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8",
          torch.float8_e4m3fn: "F8_E4M3"}


def layout(stored: dict[str, torch.Tensor], module: str = "m.") -> dict[str, tuple[tuple[int, ...], str]]:
    return {module + k: (tuple(v.shape), DTYPES[v.dtype]) for k, v in stored.items()}


def predicted(scheme, shape: tuple[int, ...]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {t.name: (t.shape, t.dtype) for t in scheme.expand("m.weight", shape)}


# ------------------------------------------------------------------------------------------------------ INT4

def test_int4_bit_layout_is_compressed_tensors():
    """Codes −8 … 7 twice: offset to 0 … 15 and laid 8 to a word from the low bits, the words are 0x76543210 and
    0xFEDCBA98 (read as int32), as compressed-tensors 0.20's pack_to_int32 writes them."""
    codes = torch.arange(-8, 8, dtype=torch.int8).repeat(2)[None]
    assert int4_pack.pack(codes).tolist() == [[0x76543210, 0xFEDCBA98 - (1 << 32)] * 2]


def test_int4_pack_unpack_round_trip():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(-8, 8, (3, 5, 64), generator=g, dtype=torch.int8)
    assert torch.equal(int4_pack.unpack(int4_pack.pack(codes), 64), codes)


def test_int4_weight_round_trip_within_half_a_step():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 96, generator=g)
    stored = int4_pack.pack_weight(w)
    back = int4_pack.unpack_weight(stored)
    step = stored["weight_scale"].repeat_interleave(32, dim=-1)
    assert (back - w).abs().le(step / 2 + 1e-6).all()
    codes, scale = int4_pack.quantize(w)
    assert torch.equal(int4_pack.unpack(stored["weight_packed"], 96), codes) and torch.equal(stored["weight_scale"], scale)
    assert codes.min() >= -8 and codes.max() <= 7 and codes.abs().max() >= 7  # the group's largest value uses the range
    assert stored["weight_shape"].tolist() == [16, 96]


def test_int4_predicted_tensors_are_the_packed_ones():
    w = torch.randn(24, 64).to(torch.bfloat16)
    stored = int4_pack.pack_weight(w)
    assert layout(stored) == predicted(PackQuantized(4, 32, "BF16"), (24, 64))
    # transformers' loader rebuilds the width from the packed words when weight_shape is absent: words × 8
    assert stored["weight_packed"].shape[1] * (32 // 4) == 64


# ----------------------------------------------------------------------------------------------------- NVFP4

def test_nvfp4_nibble_order_and_round_trip():
    assert nvfp4.pack(torch.tensor([[1, 2, 15, 0]])).tolist() == [[0x21, 0x0F]]
    codes = torch.randint(0, 16, (4, 32), generator=torch.Generator().manual_seed(2))
    assert torch.equal(nvfp4.unpack(nvfp4.pack(codes)), codes)


def test_nvfp4_weight_round_trip():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(8, 64, generator=g) * 0.02
    stored = nvfp4.quantize(w)
    back = nvfp4.dequantize(stored)
    block = (stored["weight_scale"].float() * stored["weight_scale_2"]).repeat_interleave(16, dim=-1)
    assert (back - w).abs().le(block * 1.0 + 1e-9).all()  # E2M1's widest gap (4 to 6) is 2: half of it is 1
    again = nvfp4.quantize(back)
    assert torch.equal(again["weight"], stored["weight"])
    assert torch.allclose(nvfp4.dequantize(again), back)


def test_nvfp4_predicted_tensors_are_the_exported_ones():
    stored = {**nvfp4.quantize(torch.randn(32, 48)), "input_scale": nvfp4.global_scale(torch.tensor(3.0))}
    assert layout(stored) == predicted(NVFP4(), (32, 48))


# ------------------------------------------------------------------------------------------------------- FP8

def test_fp8_per_tensor_round_trip():
    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(4))
    stored = fp8_tensor.quantize(w)
    back = fp8_tensor.dequantize(stored)
    normal = w.abs() > 2 ** -6 * stored["weight_scale"]
    assert ((back - w).abs() <= w.abs() * 2 ** -4)[normal].all()
    assert torch.equal(fp8_tensor.quantize(back)["weight"].view(torch.uint8), stored["weight"].view(torch.uint8))


def test_fp8_predicted_tensors():
    stored = {**fp8_tensor.quantize(torch.randn(8, 16)), "input_scale": fp8_tensor.scale_of(torch.randn(4, 16))}
    assert layout(stored) == predicted(FP8PerTensor(), (8, 16))
    names = predicted(FP8PerTensor(scale_name="weight_scale_inv", input_name="activation_scale"), (8, 16))
    assert set(names) == {"m.weight", "m.weight_scale_inv", "m.activation_scale"}  # transformers' FP8Linear names


# ---------------------------------------------------------------------------------------- what a header count says

@pytest.mark.parametrize("scheme, elements", [
    (PackQuantized(4, 32, "BF16"), 2048 * 7168 // 8 + 2048 * 7168 // 32 + 2),
    (NVFP4(), 2048 * 7168 // 2 + 2048 * 7168 // 16 + 2),
    (FP8PerTensor(), 2048 * 7168 + 2),
])
def test_header_elements_are_not_parameters(scheme, elements):
    stored = scheme.expand("m.weight", (2048, 7168))
    assert sum(t.parameters for t in stored) == 2048 * 7168
    assert header_elements(stored) == elements


def test_fp8_per_tensor_matches_transformers_fp8_linear():
    """transformers' own FP8 layer without weight_block_size and with static activations holds exactly the tensors
    the scheme predicts under its names: an F8_E4M3 weight and two F32 scalars."""
    from transformers.integrations.finegrained_fp8 import FP8Linear

    with torch.device("meta"):
        layer = FP8Linear(16, 8, block_size=None, activation_scheme="static")
    held = {f"m.{n}": (tuple(p.shape), DTYPES[p.dtype]) for n, p in layer.named_parameters()}
    assert held == predicted(FP8PerTensor(scale_name="weight_scale_inv", input_name="activation_scale"), (8, 16))


def test_memory_formats_count_their_scales():
    """The memory figures' bytes per parameter are what each scheme stores for a weight, scales included."""
    from explorer.figures.model_figures import QUANT_FORMATS
    from explorer.spec.storage import MXFP4

    schemes = {"mxfp4": MXFP4(), "nvfp4": NVFP4(), "int4_g32": PackQuantized(4, 32, "BF16")}
    for _, key, size, _ in QUANT_FORMATS:
        stored = schemes[key].expand("m.weight", (4096, 4096))
        per_tensor = sum(t.nbytes for t in stored if t.elements <= 2)  # the scalars and the shape vector
        assert sum(t.nbytes for t in stored) - per_tensor == 4096 * 4096 * size, key


def test_block_fp8_scales_block_the_last_two_axes():
    """Stacked experts [E, out, in] get one scale per block of each expert's matrix (transformers' FP8Experts):
    16 experts of 2 × 8,192 rows by 5,120 columns -> [16, 128, 40]; a matrix keeps its ceil-divided [rows, cols]."""
    from explorer.spec.storage import BlockFP8

    scheme = BlockFP8("F8_E4M3", (128, 128))
    assert scheme.scale_shape((16, 16384, 5120)) == (16, 128, 40)
    assert scheme.scale_shape((7168, 18432)) == (56, 144) and scheme.scale_shape((129, 1)) == (2, 1)
    swapped = BlockFP8("F8_E4M3", (128, 128), swap_last=True).expand("gate_up_proj", (16, 5120, 16384))
    assert [(t.name, t.shape) for t in swapped] == [("gate_up_proj", (16, 16384, 5120)),
                                                    ("gate_up_proj_scale_inv", (16, 128, 40))]
    assert swapped[0].parameters == 16 * 5120 * 16384
