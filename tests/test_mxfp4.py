"""MXFP4 (issue 10 item 4): the explorer's own equations against transformers' MXFP4 dequantizer, exactly; a
wrong nibble order or exponent bias fails; quantization round trips; stored shapes, dtypes and bytes as gpt-oss
stores its experts, checked against transformers' MXFP4 expert module."""

from __future__ import annotations

import pytest
import torch

from explorer.checkpoint.formats import mxfp4
from explorer.checkpoint.formats.mxfp4 import dequantize, e2m1_value, mxfp4_storage, quantize


def transformers_dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """transformers' loader, back in the stored [E, out, in] order (it returns GptOssExperts' [E, in, out])."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)


def random_packed(seed: int, low: int = 0, high: int = 255) -> tuple[torch.Tensor, torch.Tensor]:
    """Every byte value in the blocks, scales drawn from [low, high)."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (3, 8, 4, 16), generator=g, dtype=torch.uint8)  # [E, out, in/32, 16]
    blocks.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    return blocks, torch.randint(low, high, (3, 8, 4), generator=g, dtype=torch.uint8)


def test_e2m1_codes_decode_to_the_spec_values():
    assert e2m1_value(torch.arange(16)).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_dequantize_equals_transformers_on_every_byte_and_scale():
    blocks, scales = random_packed(0)  # scales 0-254: 2^-127 to 2^127, float32 subnormals included
    ours, theirs = dequantize(blocks, scales), transformers_dequantize(blocks, scales)
    assert ours.shape == theirs.shape == (3, 8, 128) and ours.dtype == torch.float32
    assert torch.equal(ours, theirs)
    assert ours.abs().min() == 0 and 0 < ours[ours != 0].abs().min() < torch.finfo(torch.float32).tiny


def test_pack_a_random_weight_and_dequantize_both_ways():
    weight = torch.randn(4, 24, 96, generator=torch.Generator().manual_seed(1)) * 0.02  # [E, out, in]
    blocks, scales = quantize(weight)
    assert (blocks.shape, scales.shape, blocks.dtype, scales.dtype) == (
        (4, 24, 3, 16), (4, 24, 3), torch.uint8, torch.uint8)
    ours = dequantize(blocks, scales)
    assert torch.equal(ours, transformers_dequantize(blocks, scales))
    # the error bound at each block's scale X: half the widest E2M1 step (4 to 6) is X; saturating a block's
    # largest value (below 8 X) to 6 X costs at most 2 X
    x = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=-1)
    error = (ours.double() - weight.double()).abs()
    assert (error <= 2 * x).all() and (error > x / 4).any()
    again = quantize(ours)  # dequantized values pack to the same bytes
    assert torch.equal(again[0], blocks) and torch.equal(again[1], scales)


def test_wrong_nibble_order_fails(monkeypatch):
    blocks, scales = random_packed(2, 120, 135)

    def high_nibble_first(b: torch.Tensor) -> torch.Tensor:
        return torch.stack(((b >> 4).long(), (b & 0x0F).long()), dim=-1).flatten(-2)

    monkeypatch.setattr(mxfp4, "unpack_nibbles", high_nibble_first)
    assert not torch.equal(dequantize(blocks, scales), transformers_dequantize(blocks, scales))


@pytest.mark.parametrize("bias", [126, 128])
def test_wrong_exponent_bias_fails(monkeypatch, bias):
    blocks, scales = random_packed(3, 120, 135)
    monkeypatch.setattr(mxfp4, "E8M0_BIAS", bias)
    assert not torch.equal(dequantize(blocks, scales), transformers_dequantize(blocks, scales))


def test_quantize_follows_the_spec_scale_and_rounding():
    # max |V| = 5 -> floor(log2 5) - 2 = 0 -> scale byte 127; 5 and 0.75 are ties: to the even codes 4 and 1
    row = torch.tensor([5.0, -0.75, 0.25, 1.25, 7.9] + [0.0] * 27)
    blocks, scales = quantize(row)
    assert scales.tolist() == [127]
    assert dequantize(blocks, scales)[:5].tolist() == [4.0, -1.0, 0.0, 1.0, 6.0]
    assert dequantize(*quantize(torch.zeros(32))).abs().max() == 0
    assert dequantize(*quantize(row * 2.0**-20))[:5].tolist() == [4.0 * 2**-20, -(2.0**-20), 0.0, 2.0**-20,
                                                                  6.0 * 2**-20]
    assert torch.isnan(dequantize(blocks, torch.tensor([255], dtype=torch.uint8))).all()  # E8M0's NaN


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="not a multiple of the 32-element block"):
        quantize(torch.zeros(4, 48))
    with pytest.raises(ValueError, match=r"blocks \(2, 16\) and scales \(3,\)"):
        dequantize(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="experts.down_proj: input dimension 2896 is not"):
        mxfp4_storage("experts.down_proj", (32, 64, 2880 + 16))


def test_gpt_oss_20b_expert_storage():
    """gpt-oss-20b: 32 experts, hidden 2,880, expert intermediate 2,880 (config.json)."""
    experts, d, inter = 32, 2880, 2880
    gate_up = mxfp4_storage("model.layers.0.mlp.experts.gate_up_proj", (experts, 2 * inter, d))
    down = mxfp4_storage("model.layers.0.mlp.experts.down_proj", (experts, d, inter))
    assert (gate_up.blocks.name, gate_up.blocks.shape, gate_up.blocks.dtype) == (
        "model.layers.0.mlp.experts.gate_up_proj_blocks", (32, 5760, 90, 16), "U8")
    assert (gate_up.scales.name, gate_up.scales.shape, gate_up.scales.dtype) == (
        "model.layers.0.mlp.experts.gate_up_proj_scales", (32, 5760, 90), "U8")
    assert (down.blocks.shape, down.scales.shape) == ((32, 2880, 90, 16), (32, 2880, 90))
    assert gate_up.parameters == 530_841_600
    assert (gate_up.blocks.nbytes, gate_up.scales.nbytes, gate_up.nbytes) == (265_420_800, 16_588_800, 282_009_600)
    assert gate_up.nbytes * 8 / gate_up.parameters == 4.25


def test_storage_agrees_with_transformers_mxfp4_experts():
    """transformers' MXFP4 expert module holds the blocks as [E, out, in/2] bytes, its dequantized module the
    weights as [E, in, out]; ours are the same bytes and the transposed logical shapes."""
    from transformers import GptOssConfig
    from transformers.integrations.mxfp4 import Mxfp4GptOssExperts
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    config = GptOssConfig(hidden_size=64, intermediate_size=96, num_local_experts=4)
    with torch.device("meta"):
        packed, plain = Mxfp4GptOssExperts(config), GptOssExperts(config)
    for proj in ("gate_up_proj", "down_proj"):
        logical = tuple(getattr(plain, proj).transpose(1, 2).shape)
        storage = mxfp4_storage(f"experts.{proj}", logical)
        stored = getattr(packed, proj)
        assert stored.dtype == torch.uint8
        assert storage.blocks.shape[:-2] == tuple(stored.shape[:-1])
        assert storage.blocks.nbytes == stored.numel()
        blocks, scales = quantize(torch.randn(logical))
        assert (tuple(blocks.shape), tuple(scales.shape)) == (storage.blocks.shape, storage.scales.shape)
