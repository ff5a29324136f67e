"""DeepSeek-V4's release layout (issue 35), checked with transformers' own loading code: every predicted release name,
run through the family's conversion rules (conversion_mapping.py's "deepseek_v4" table, updated by the FP8
quantizer as it loads a pre-quantized checkpoint), lands on a tensor the quantized reference holds; no release name
is a name only the reference uses; each fused expert tensor gathers one release tensor per expert and projection,
and their shapes stack to the shape transformers allocates for it; the MTP layer is what the loader skips."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

import pytest
from conftest import ROOT

from explorer.checkpoint.index import CheckpointIndex, TensorInfo
from explorer.checkpoint.reconcile import expected_groups, predicted_index
from explorer.checkpoint.release_layout import ReleaseLayout, predicted_release, release_layout, release_rules
from explorer.content.model_content import load_model_content
from explorer.model.families import load_model_spec

SLUGS = ("deepseek-v4-flash", "deepseek-v4-pro")


@cache
def spec_of(slug: str):
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@cache
def reference_names(slug: str) -> frozenset[str]:
    """The parameters and buffers the FP8-quantized reference holds: the reference's own names (the spec's logical
    tensors), with the scale each FP8 weight carries beside it under the quantizer's names."""
    logical = {n for g in expected_groups(spec_of(slug), logical=True) for n in g.box.names()}
    scales = {n.removesuffix("weight") + "weight_scale_inv" for n in logical if n.endswith(".weight")}
    experts = {n + "_scale_inv" for n in logical if n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    return frozenset(logical | scales | experts)


def loading_rules(slug: str):
    """transformers' rules for the family, as its FP8 quantizer updates them for a pre-quantized checkpoint."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer
    from transformers.utils.quantization_config import FineGrainedFP8Config

    q = spec_of(slug).config.quantization_config
    quantizer = FineGrainedFP8HfQuantizer(FineGrainedFP8Config(weight_block_size=tuple(q.weight_block_size),
                                                               scale_fmt=q.scale_fmt), pre_quantized=True)

    class Model:  # what update_weight_conversions reads of the model: its parameter names
        def named_parameters(self):
            return ((n, None) for n in sorted(reference_names(slug)))

    rules = quantizer.update_weight_conversions(get_checkpoint_conversion_mapping("deepseek_v4"), Model())
    return ([r for r in rules if not isinstance(r, WeightConverter)], [r for r in rules if isinstance(r, WeightConverter)])


def loaded_names(slug: str, layout: ReleaseLayout) -> dict[str, tuple[str, str | None]]:
    """Each release tensor's name as transformers loads it, and the converter pattern that took it (or None)."""
    from transformers.core_model_loading import rename_source_key

    renamings, converters = loading_rules(slug)
    meta = dict.fromkeys(reference_names(slug), True)
    return {n: rename_source_key(n, renamings, converters, "model", meta) for n in layout.index.tensors
            if not n.startswith(layout.mtp_prefix or "\0")}


def reference_only_segments(slug: str) -> frozenset[str]:
    """Names the rules write that no rule reads ("q_a_proj" from ".wq_a." -> ".q_a_proj."): a release name holding
    one as a segment is the reference's, half converted. Attention's own kv_norm is the exception: the rule
    ".norm." -> ".kv_norm." renames the compressor's norm, and attention's is kv_norm in both."""
    renamings, _ = loading_rules(slug)
    words = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
    written = {w for r in renamings for t in r.target_patterns for w in words.findall(t)}
    read = {w for r in renamings for t in r.source_patterns for w in words.findall(t)}
    return frozenset(written - read - {"kv_norm"})


def ignored_by_the_loader(name: str) -> bool:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4PreTrainedModel

    return any(re.search(p, name) for p in DeepseekV4PreTrainedModel._keys_to_ignore_on_load_unexpected)


def layout_of(slug: str) -> ReleaseLayout:
    return layout_of_uncached(slug)


def layout_of_uncached(slug: str) -> ReleaseLayout:
    spec = spec_of(slug)
    layout = predicted_release(spec, predicted_index(spec))
    assert layout is not None
    return layout


def problems(slug: str, layout: ReleaseLayout) -> list[str]:
    """Where the release layout breaks transformers' loading rules."""
    out, names = [], reference_names(slug)
    loaded = loaded_names(slug, layout)
    for release, (ref, _) in sorted(loaded.items()):
        if ref not in names:
            out.append(f"{release}: loads as {ref}, which the reference does not hold")
        elif release not in ("norm.weight",) and ref.removeprefix("model.") == release.removeprefix("model."):
            out.append(f"{release}: a name only the reference uses (no rule converts it)")
    reference_only = reference_only_segments(slug)
    for release in sorted(loaded):
        if found := sorted(set(release.split(".")) & reference_only):
            out.append(f"{release}: holds the reference's {', '.join(found)}")
    gathered = Counter(ref for ref, pattern in loaded.values() if pattern is not None)
    experts = int(spec_of(slug).values["n_routed_experts"])
    for ref in sorted(n for n in names if n.endswith(("experts.gate_up_proj", "experts.down_proj"))):
        for suffix in ("", "_scale_inv"):
            want = experts * (2 if "gate_up" in ref else 1)
            if gathered[ref + suffix] != want:
                out.append(f"{ref + suffix}: gathers {gathered[ref + suffix]} release tensors, not {want}")
    for name in layout.index.tensors:
        if ignored_by_the_loader(name) != name.startswith(layout.mtp_prefix or "\0"):
            out.append(f"{name}: the loader {'skips' if ignored_by_the_loader(name) else 'loads'} it")
    return out


@pytest.mark.parametrize("slug", SLUGS)
def test_every_release_name_loads_into_the_reference(slug: str):
    assert problems(slug, layout_of(slug)) == []


def test_a_reference_name_or_a_fused_expert_in_the_release_fails():
    layout = layout_of("deepseek-v4-flash")
    tensors = dict(layout.index.tensors)
    wq_a = tensors.pop("layers.0.attn.wq_a.weight")
    tensors["model.layers.0.self_attn.q_a_proj.weight"] = TensorInfo("model.layers.0.self_attn.q_a_proj.weight",
                                                                    wq_a.dtype, wq_a.shape)
    fused = {n: t for n, t in tensors.items() if not re.match(r"layers\.3\.ffn\.experts\.\d+\.w1\.", n)}
    fused["layers.3.ffn.experts.w1.weight"] = TensorInfo("layers.3.ffn.experts.w1.weight", "I8", (256, 2048, 2048))
    found = problems("deepseek-v4-flash", ReleaseLayout(CheckpointIndex.of(fused, "test"), layout.mtp_prefix))
    assert any("a name only the reference uses" in p for p in found), found
    assert any("layers.3.mlp.experts.gate_up_proj: gathers 256 release tensors, not 512" in p for p in found), found


def test_a_rename_left_out_of_the_inverse_table_fails(monkeypatch):
    from dataclasses import replace

    from explorer.model.families import FAMILIES

    family = FAMILIES["deepseek_v4"]
    names = tuple(r for r in family.reference.release_names if r[1] != ".wq_a.")
    monkeypatch.setattr(family, "reference", replace(family.reference, release_names=names))
    found = problems("deepseek-v4-flash", layout_of_uncached("deepseek-v4-flash"))
    assert "layers.0.attn.q_a_proj.weight: holds the reference's q_a_proj" in found, found[:5]


def test_four_bit_experts_stack_to_what_transformers_allocates():
    """One int8 tensor per expert and projection, two E2M1 values a byte, one E8M0 scale per 32 values of a row:
    stacked over experts (w1 and w3 concatenated) they are the shapes transformers' FP8 integration allocates."""
    import torch
    from transformers.integrations.finegrained_fp8 import _alloc_expert_proj

    spec = spec_of("deepseek-v4-flash")
    E, I_, d = (int(spec.values[k]) for k in ("n_routed_experts", "moe_intermediate_size", "hidden_size"))
    t = layout_of("deepseek-v4-flash").index.tensors
    w1, s1, w2 = t["layers.3.ffn.experts.7.w1.weight"], t["layers.3.ffn.experts.7.w1.scale"], t["layers.3.ffn.experts.7.w2.weight"]
    assert (w1.dtype, s1.dtype) == ("I8", "F8_E8M0")
    with torch.device("meta"):
        gate_up, gate_up_sf = _alloc_expert_proj(E, 2 * I_, d, torch.int8, torch.float8_e8m0fnu, weight_k_div=2,
                                                 sf_gran_n=1, sf_gran_k=32, min_sf_out=2)
        down, _ = _alloc_expert_proj(E, d, I_, torch.int8, torch.float8_e8m0fnu, weight_k_div=2, sf_gran_n=1,
                                     sf_gran_k=32)
    predicted = predicted_index(spec).tensors  # in the reference's names: the fused tensors themselves
    assert predicted["model.layers.3.mlp.experts.gate_up_proj"].shape == tuple(gate_up.shape)
    assert predicted["model.layers.3.mlp.experts.gate_up_proj_scale_inv"].shape == tuple(gate_up_sf.shape)
    assert (E, 2 * w1.shape[0], w1.shape[1]) == tuple(gate_up.shape)
    assert (E, 2 * s1.shape[0], s1.shape[1]) == tuple(gate_up_sf.shape)
    assert (E, *w2.shape) == tuple(down.shape)


def test_the_release_counts_and_holds_the_stored_mtp_layer():
    layout = layout_of("deepseek-v4-flash")
    assert layout.mtp_prefix == "mtp.0."
    mtp = [t for n, t in layout.index.tensors.items() if n.startswith("mtp.0.")]
    # the logical parameters of its value tensors (two four-bit values a byte) are the declared module's
    values = sum(t.elements * (2 if t.dtype == "I8" else 1) for t in mtp
                 if not t.name.endswith((".scale", ".gate.bias")))  # scales and the correction-bias buffer
    assert values == 6_610_048_635
    assert layout.index.tensor_count == 69_187  # 43 layers, 256 experts × 3 projections × 2 tensors each, and MTP


def test_no_mtp_layer_no_mtp_prefix():
    spec = spec_of("deepseek-v4-flash")
    rules = release_rules(spec)
    assert rules is not None
    assert release_layout(predicted_index(spec), None, 43, rules).mtp_prefix == ""
