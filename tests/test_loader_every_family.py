"""Issue 35 item 3: every family's predicted stored layout, as a checkpoint, loads through transformers' own loader.

For each family (discovered from the registry, so a new family is covered at once) the tiny config's predicted
layout (names, shapes, dtypes; the release's own names where the family restates them, explorer/checkpoint/
release_layout.py) is written as a safetensors file beside the reference config, and the reference class's
from_pretrained loads it with output_loading_info: no key may be missing, unexpected or mismatched in size except a
family's stated gap below, and every gap stated must still occur (a ledger that fails when an entry starts passing).

Quantized storage, where the tiny config has one:
- block-wise FP8 (DeepSeek-V3, V3.2) and MXFP4 (gpt-oss): the config.json carries the quantization_config, so the
  reference is built with transformers' own quantizer; on a CPU both dequantize to BF16 as they load (their
  converters read each weight with its scales, so a scale grid that does not fit its weight fails the load);
- four-bit rows (DeepSeek-V4's tiny experts, FP4Rows: the tiny config sets expert_dtype "fp4" with no
  quantization_config, so no quantizer reads them): dequantized here by transformers' own FP8 dequantizer
  (Fp8Dequantize._dequantize_one, two E2M1 values a byte times one scale per 32), then written dense;
- compressed-tensors pack-quantized INT4 (Kimi K2.5): the compressed-tensors package is not installed, so the
  codes are unpacked here by its rules (8 codes a little-endian int32 word along the input axis, offset by 8, one
  scale per group, the logical width from weight_shape) and written dense.
Where nothing is quantized and the spec's names are the release's, the loaded state is also turned back into
checkpoint names by the family's renames and must equal what was written, tensor for tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import pytest
from conftest import ROOT

from explorer.checkpoint.index import CheckpointIndex, TensorInfo
from explorer.checkpoint.reconcile import predicted_index
from explorer.checkpoint.release_layout import predicted_release
from explorer.checkpoint.tensor_names import template_boxes
from explorer.content.model_content import load_all_models
from explorer.model.account import evaluate
from explorer.model.families import FAMILIES, load_model_spec
from explorer.spec.storage import MXFP4, BlockFP8, Dense, FP4Rows, PackQuantized
from explorer.spec.types import ModelSpec, walk

pytestmark = pytest.mark.slow

TORCH_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F8_E4M3": "float8_e4m3fn",
                "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "I64": "int64", "I32": "int32", "I8": "int8",
                "U8": "uint8"}
"""safetensors dtype -> torch dtype name."""
QUANTIZER = (BlockFP8, MXFP4)
"""Schemes transformers' quantizer reads on a CPU (dequantizing as it loads)."""
DEQUANTIZED_HERE = (FP4Rows, PackQuantized)
"""Schemes no quantizer here reads for the tiny config, dequantized by the test before writing."""


@dataclass(frozen=True, slots=True)
class ExpectedGap:
    """Keys the loader is known to report for a family, and why; each must still be reported."""

    why: str
    unexpected: str = ""
    """A pattern every unexpected key reported must match ("mtp": the layer after the main model's)."""


GAPS: dict[str, ExpectedGap] = {
    "deepseek_v32": ExpectedGap("the loader skips the MTP layer by the full model's index (model.layers.61, "
                                "_keys_to_ignore_on_load_unexpected), so at the tiny config's index it is reported "
                                "unexpected", unexpected="mtp"),
    "glm_moe_dsa": ExpectedGap("the loader skips the MTP layer by the full model's index (model.layers.78), so at the "
                               "tiny config's index it is reported unexpected", unexpected="mtp"),
}
"""Per family: what the loader reports that the predicted layout is right to hold."""

LOADER_RULES = {"minimax_m3": "minimax_m3_vl"}
"""Families whose reference text class has no conversion mapping of its own, loaded with the one transformers
registers for the release's model type (MiniMax-M3's names are minimax_m3_vl's, without the language_model. prefix
of the multimodal checkpoint), registered for the text class as register_checkpoint_conversion_mapping allows."""


def gap_pattern(spec: ModelSpec) -> str:
    """The family's stated pattern of unexpected keys."""
    gap = GAPS.get(spec.family, ExpectedGap(""))
    if gap.unexpected == "mtp":
        return rf"^model\.layers\.{int(spec.config.num_hidden_layers)}\."  # type: ignore[attr-defined]
    return gap.unexpected


@cache
def first_models() -> dict:
    out: dict = {}
    for content in load_all_models(ROOT / "content"):
        out.setdefault(content.meta.family, content)
    return out


@cache
def tiny_of(family: str) -> ModelSpec:
    from explorer.execute.executor import tiny_spec

    return tiny_spec(load_model_spec(first_models()[family]))


def schemes(spec: ModelSpec) -> set[type]:
    return {type(t.storage) for _, c in walk(spec.root) for t in c.tensors}


def quantized_here(spec: ModelSpec) -> dict[str, tuple[object, tuple[int, ...]]]:
    """Logical weight name -> (its scheme, logical shape) for every weight the test dequantizes."""
    out: dict[str, tuple[object, tuple[int, ...]]] = {}
    for _, comp in walk(spec.root):
        for t in comp.tensors:
            if isinstance(t.storage, DEQUANTIZED_HERE) and t.shape is not None:
                shape = tuple(evaluate(s, spec.values) for s in t.shape)
                ranges = {r.var: r.values for r in t.ranges}
                out |= {n: (t.storage, shape) for box in template_boxes(t.template, ranges) for n in box.names()}
    return out


def filled(t: TensorInfo, generator, logical: dict[str, tuple[object, tuple[int, ...]]]):
    """A tensor of t's dtype and shape with values the loader can carry through: random, an 8-bit float a small
    power of two, a pack-quantized weight_shape its logical shape."""
    import torch

    dtype = getattr(torch, TORCH_DTYPES[t.dtype])
    if t.name.endswith("weight_shape"):
        return torch.tensor(logical[t.name.removesuffix("_shape")][1], dtype=dtype)
    if dtype.is_floating_point and dtype.itemsize == 1:  # FP8 values, E8M0 scales
        return (2.0 ** torch.randint(-2, 2, tuple(t.shape), generator=generator).float()).to(dtype)
    if dtype.is_floating_point:
        return torch.randn(tuple(t.shape), generator=generator).to(dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 256, tuple(t.shape), generator=generator, dtype=torch.int32).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -2**31), min(info.max, 2**31 - 1), tuple(t.shape), generator=generator,
                         dtype=torch.int64).to(dtype)


def unpack_int32(packed, num_bits: int, columns: int):
    """compressed-tensors' unpack_from_int32: code i of a row at bits num_bits·i of its little-endian int32 words,
    unsigned, less 2^(num_bits-1)."""
    import torch

    shifts = torch.arange(32 // num_bits, dtype=torch.int64) * num_bits
    codes = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)  # [..., words, per word]
    return codes.reshape(*packed.shape[:-1], -1)[..., :columns] - (1 << (num_bits - 1))


def dequantized(name: str, scheme: object, stored: dict):
    """One weight dequantized from its stored tensors by its scheme (the stored tensors removed from `stored`)."""
    import torch
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    if isinstance(scheme, FP4Rows):
        values, scales = stored.pop(name), stored.pop(name + "_scale_inv")
        return Fp8Dequantize(None)._dequantize_one(values, scales, torch.bfloat16)
    assert isinstance(scheme, PackQuantized)
    base = name.removesuffix("weight")
    packed, scales, logical = (stored.pop(base + k) for k in ("weight_packed", "weight_scale", "weight_shape"))
    codes = unpack_int32(packed, scheme.num_bits, int(logical[-1]))
    per_input = scales.float().repeat_interleave(scheme.group_size, -1)[..., :codes.shape[-1]]
    return (codes.float() * per_input).to(torch.bfloat16)


def written_layout(spec: ModelSpec) -> tuple[dict, bool]:
    """The tensors to write (name -> torch tensor), and whether the loaded state must give them back: the predicted
    layout as it stands (nothing quantized), in the names the family's renames give the reference's state."""
    import torch

    generator = torch.Generator().manual_seed(0)
    logical = quantized_here(spec)
    stored = {n: filled(t, generator, logical) for n, t in predicted_index(spec).tensors.items()}
    for name, (scheme, _) in logical.items():
        stored[name] = dequantized(name, scheme, stored)
    index = CheckpointIndex.of({n: TensorInfo(n, _dtype_name(t), tuple(t.shape)) for n, t in stored.items()}, "test")
    release = predicted_release(spec, index)
    if release is None:
        return stored, schemes(spec) == {Dense}
    return {n: filled(t, generator, {}) for n, t in release.index.tensors.items()}, False


def _dtype_name(t) -> str:
    return next(k for k, v in TORCH_DTYPES.items() if str(t.dtype) == f"torch.{v}")


def loaded(spec: ModelSpec, folder, tensors: dict):
    """from_pretrained over the written folder: (model, loading info)."""
    import torch
    from safetensors.torch import save_file
    from transformers.utils import logging

    from explorer.execute.reference import _classes, loadable_class, transformers_config
    from explorer.model.families.base import as_published

    logging.set_verbosity_error()
    config_class, model_class = _classes(spec)
    keys = transformers_config(spec)
    if schemes(spec) & set(QUANTIZER):
        keys["quantization_config"] = as_published(spec.config.quantization_config)  # type: ignore[attr-defined]
    config_class(**keys).save_pretrained(folder)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cls = loadable_class(spec, model_class)
    if spec.family in LOADER_RULES:
        _register_rules(cls.__name__, LOADER_RULES[spec.family])
    # the config read back as a loader reads it (its quantization_config parsed), of the binding's own config class
    config = config_class.from_pretrained(folder)
    return cls.from_pretrained(folder, config=config, output_loading_info=True, dtype=torch.float32,
                               ignore_mismatched_sizes=True)


def _register_rules(class_name: str, model_type: str) -> None:
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )

    register_checkpoint_conversion_mapping(class_name, get_checkpoint_conversion_mapping(model_type), overwrite=True)


def problems(spec: ModelSpec, info: dict) -> list[str]:
    """What the loader reported beyond the family's stated gap, and a stated gap it no longer reports."""
    gap, pattern = GAPS.get(spec.family, ExpectedGap("")), gap_pattern(spec)
    out = [f"missing: {k}" for k in sorted(info["missing_keys"])]
    out += [f"size mismatch: {k}: written {tuple(a)}, the reference holds {tuple(b)}"
            for k, a, b in sorted(info["mismatched_keys"])]
    out += [f"unexpected: {k}" for k in sorted(info["unexpected_keys"]) if not (pattern and re.search(pattern, k))]
    if pattern and not any(re.search(pattern, k) for k in info["unexpected_keys"]):
        out.append(f"stated gap no longer reported: {pattern} ({gap.why})")
    return out + [f"error: {e}" for e in info.get("error_msgs", [])]


def round_trip_problems(spec: ModelSpec, model, written: dict) -> list[str]:
    """Written tensors the loaded state, renamed back to checkpoint names by the family, does not give back."""
    import torch

    from explorer.execute.reference import reference_state

    back, pattern = reference_state(spec, model), gap_pattern(spec)
    out = []
    for name, tensor in sorted(written.items()):
        if name not in back or (pattern and re.search(pattern, name)):
            continue  # a stated gap; a name absent from the state is reported by problems()
        if back[name].shape != tensor.shape or not torch.equal(back[name].to(tensor.dtype), tensor):
            out.append(f"{name}: loads as other values (or laid out otherwise) than written")
    return out


def check(family: str, tmp_path) -> list[str]:
    spec = tiny_of(family)
    written, as_predicted = written_layout(spec)
    try:
        model, info = loaded(spec, tmp_path, written)
    except RuntimeError as e:  # a converter that cannot gather its sources stops the load
        return [f"the loader refused the file: {str(e).splitlines()[0]}"]
    found = problems(spec, info)
    return found + (round_trip_problems(spec, model, written) if as_predicted and not found else [])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_predicted_layout_loads_through_the_reference_loader(family: str, tmp_path):
    assert check(family, tmp_path) == []


def test_every_family_has_a_model_and_every_scheme_a_way_to_load():
    assert set(first_models()) == set(FAMILIES)
    assert set(GAPS) | set(LOADER_RULES) <= set(FAMILIES)
    assert all(s in (Dense, *QUANTIZER, *DEQUANTIZED_HERE) for f in FAMILIES for s in schemes(tiny_of(f)))


def test_a_wrong_release_rename_fails(tmp_path, monkeypatch):
    """Kimi Linear's release rules with the experts' up projection left under the reference's name (up_proj, not
    w3): the loader's merge of w1 and w3 finds no w3, and the load stops."""
    from dataclasses import replace

    family = FAMILIES["kimi_linear"]
    names = tuple(r for r in family.reference.release_names if "w3" not in r[1])
    monkeypatch.setattr(family, "reference", replace(family.reference, release_names=names))
    assert check("kimi_linear", tmp_path) == [
        "the loader refused the file: We encountered some issues during automatic conversion of the weights. For "
        "details look at the `CONVERSION` entries of the above report!"]


def test_a_rename_that_swaps_values_fails(tmp_path, monkeypatch):
    """MiniMax-M3's renames with the dense MLP's gate and up swapped: the names still load (the loader sees only the
    file), but the loaded state renamed back no longer gives the written tensors."""
    from dataclasses import replace

    family = FAMILIES["minimax_m3"]
    renames = family.reference.renames
    assert renames is not None

    def swapped(state: dict) -> dict:
        swap = {".mlp.gate_proj.": ".mlp.up_proj.", ".mlp.up_proj.": ".mlp.gate_proj."}
        return {next((n.replace(a, b) for a, b in swap.items() if a in n), n): t for n, t in renames(state).items()}

    monkeypatch.setattr(family, "reference", replace(family.reference, renames=swapped))
    assert "model.layers.0.mlp.gate_proj.weight: loads as other values (or laid out otherwise) than written" in check(
        "minimax_m3", tmp_path)
