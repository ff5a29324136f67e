"""Issue 24: the published NVFP4 variants (DeepSeek-V3.2, Gemma 4 26B-A4B, Nemotron 3 Nano) predicted from their
hf_quant_config.json, and synthetic checkpoints in NVFP4 and FP8-per-tensor form read back from safetensors headers
and reconciled with the prediction.

No ModelOpt writer is installed (nvidia-modelopt is not in the environment), so the synthetic files are written the
way ModelOpt's export lays them out: every nn.Linear of the tiny reference model that exclude_modules leaves, and
every fused experts tensor split per expert (ModelOpt's `_export_fused_experts`), quantized with explorer.checkpoint.formats.nvfp4 /
explorer.checkpoint.formats.fp8_tensor; the modules to quantize are found on the torch model, not read from the prediction."""

from __future__ import annotations

import fnmatch
import json

import pytest
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.checkpoint.variants import PublishedVariant, load_variant, load_variants, stored_as, variant_spec
from explorer.content.model_content import load_model_content
from explorer.model.account import account
from explorer.model.families import FAMILIES, load_model_spec
from explorer.spec.storage import NVFP4, BlockFP8, Dense
from explorer.spec.types import walk

RECORDED = {"deepseek-v3.2": "deepseek-v3.2-nvfp4", "gemma-4-26b-a4b": "gemma-4-26b-a4b-nvfp4",
            "nemotron-3-nano-30b-a3b": "nemotron-3-nano-30b-a3b-nvfp4"}


def _base(slug: str):
    content = load_model_content(ROOT / "content/models" / slug)
    spec = load_model_spec(content)
    (variant,) = load_variants(content.folder)
    assert variant.slug == RECORDED[slug]
    return spec, variant


def _layout(spec, variant):
    """template pattern -> storage of the variant's spec, and its StoredAs."""
    module_name = FAMILIES[spec.family].variant_module_name
    vspec = variant_spec(spec, variant, module_name)
    storages = {t.pattern: t.storage for _, c in walk(vspec.root) for t in c.tensors}
    return storages, stored_as(spec, variant, module_name)


def _numbers(spec, s, quantized: int, tensors: int):
    """What the section must state, computed from the base's account: `quantized` logical parameters in NVFP4
    over `tensors` weights, everything else as the base's dense tensors."""
    total = account(spec).total
    buffers = sum(r.elements for r in s.rows if r.role == "buffer")
    buffer_bytes = sum(r.bytes for r in s.rows if r.role == "buffer")
    dense_bytes = sum(r.bytes for r in s.rows if r.role == "parameter" and r.dtype != "U8")
    assert sum(r.elements for r in s.rows if r.role == "parameter" and r.dtype != "U8") == total - quantized
    header = total - quantized + quantized // 2 + quantized // 16 + 2 * tensors + buffers
    nbytes = dense_bytes + quantized // 2 + quantized // 16 + 2 * 4 * tensors + buffer_bytes
    return total, header, nbytes


@pytest.mark.parametrize("slug", sorted(RECORDED))
def test_recorded_variant_is_unpinned_and_says_so(slug):
    _, variant = _base(slug)
    assert variant.meta.revision == "unpinned" and "without a Hub revision" in variant.meta.revision_note
    assert variant.modelopt.quant_algo == "NVFP4" and variant.modelopt.group_size == 16
    assert variant.meta.producer.startswith("modelopt ")


def test_gemma4_fused_experts_are_stored_per_expert_and_nothing_else_is_quantized():
    spec, variant = _base("gemma-4-26b-a4b")
    storages, s = _layout(spec, variant)
    c = load_model_content(ROOT / "content/models/gemma-4-26b-a4b").config["text_config"]
    layers, experts, inter, hidden = c["num_hidden_layers"], c["num_experts"], c["moe_intermediate_size"], c["hidden_size"]
    quantized_patterns = {p for p, st in storages.items() if isinstance(st, NVFP4)}
    assert {p.rsplit(".experts.", 1)[1] for p in quantized_patterns} == {
        f"0-{experts - 1}.gate_proj.weight", f"0-{experts - 1}.up_proj.weight", f"0-{experts - 1}.down_proj.weight"}
    assert not any(p.endswith("gate_up_proj") for p in storages)  # the fused tensors are gone from the layout
    names = {n: (d, shape) for n, d, shape, _ in s.tensors}
    gate = next(n for n in names if n.endswith(f"experts.0-{experts - 1}.gate_proj.weight"))
    assert names[gate] == ("U8", (inter, hidden // 2))
    assert names[gate.replace("weight", "weight_scale")] == ("F8_E4M3", (inter, hidden // 16))
    assert names[gate.replace("weight", "weight_scale_2")] == ("F32", ())
    assert not any("vision" in p or ".mlp." in p or "router" in p or "self_attn" in p for p in quantized_patterns)
    quantized = layers * experts * 3 * inter * hidden
    total, header, nbytes = _numbers(spec, s, quantized, layers * experts * 3)
    assert s.parameters == total and s.header_elements == header and s.bytes == nbytes
    assert f"{header:,}" in s.naive_count_reason and f"{total:,}" in s.naive_count_reason
    assert any("fused experts" in n and "experts.{e}.gate_proj.weight" in n for n in s.notes)


def test_nemotron_excludes_in_proj_at_some_mamba_layers_only():
    spec, variant = _base("nemotron-3-nano-30b-a3b")
    storages, s = _layout(spec, variant)
    in_proj = {p: st for p, st in storages.items() if p.endswith("mixer.in_proj.weight")}
    assert len(in_proj) == 2  # one family per set of layers
    excluded = next(p for p, st in in_proj.items() if isinstance(st, Dense))
    assert excluded == "backbone.layers.4,11,18,25,32,41.mixer.in_proj.weight"  # as the globs name them
    assert not any(isinstance(st, NVFP4) for p, st in storages.items()
                   if any(f".mixer.{x}_proj." in p for x in "qkvo") or p.startswith("lm_head"))
    assert isinstance(storages[next(p for p in storages if ".experts." in p and "up_proj" in p)], NVFP4)
    mamba = [r for p in in_proj for r in p.split(".")[2].split(",")]
    assert len(mamba) >= 20  # every Mamba layer, in one family or the other
    assert s.parameters == account(spec).total
    assert not any("original names" in n for n in s.notes)  # the layout names tensors as the published files do


def test_deepseek_v32_keeps_no_fp8_blocks_and_leaves_excluded_attention_and_mtp_in_bf16():
    spec, variant = _base("deepseek-v3.2")
    storages, s = _layout(spec, variant)
    assert not any(isinstance(st, BlockFP8) for st in storages.values())  # the base's FP8 blocks are not in it
    assert not any(n.endswith("weight_scale_inv") for n, *_ in s.tensors)
    quantized = {p for p, st in storages.items() if isinstance(st, NVFP4)}
    # the globs name q_a, q_b, kv_a, kv_b and the indexer of every layer, and all of layer 61 (the MTP layer):
    # o_proj is the one attention projection in NVFP4
    assert {p.split(".", 3)[3] for p in quantized if "self_attn" in p} == {"self_attn.o_proj.weight"}
    assert not any(p.startswith("model.layers.61.") or "lm_head" in p for p in quantized)
    assert "model.layers.3-60.mlp.experts.0-255.gate_proj.weight" in quantized
    assert "model.layers.0-2.mlp.down_proj.weight" in quantized
    c = load_model_content(ROOT / "content/models/deepseek-v3.2").config
    dense, moe_layers = c["first_k_dense_replace"], c["num_hidden_layers"] - c["first_k_dense_replace"]  # MTP: BF16
    hidden, moe, inter, experts = c["hidden_size"], c["moe_intermediate_size"], c["intermediate_size"], c["n_routed_experts"]
    per_layer = experts + c["n_shared_experts"]  # one shared expert of the routed experts' width
    layers, o_proj = c["num_hidden_layers"], hidden * c["num_attention_heads"] * c["v_head_dim"]
    quantized_params = moe_layers * per_layer * 3 * moe * hidden + dense * 3 * inter * hidden + layers * o_proj
    total, header, nbytes = _numbers(spec, s, quantized_params, moe_layers * per_layer * 3 + dense * 3 + layers)
    assert s.parameters == total and s.header_elements == header and s.bytes == nbytes
    assert any("stored in BF16" in n for n in s.notes)


@pytest.mark.parametrize("slug", sorted(RECORDED))
def test_api_entry_and_section_of_each_recorded_variant(slug):
    from types import SimpleNamespace

    from explorer.views.api import _variant
    from explorer.views.model_page import variant_views

    spec, variant = _base(slug)
    _, s = _layout(spec, variant)
    entry = _variant(s)
    assert entry["logical_parameters"] == account(spec).total
    assert entry["header_elements"] < entry["logical_parameters"] and entry["bytes"] == s.bytes
    assert entry["header_count_reason"].startswith("A count of header elements reports")
    assert any(t["dtype"] == "U8" and t["bytes_each"] > 0 for t in entry["tensors"])
    assert any("KV cache to FP8" in n for n in entry["notes"])  # what the layout leaves out, said
    (view,) = variant_views(SimpleNamespace(variants=(s,)))  # type: ignore[arg-type]
    assert view.rows and view.notes == s.notes


# ------------------------------------------------------------------------------------- synthetic checkpoints

def _variant_file(tmp_path, algo: str, exclude: list[str]) -> PublishedVariant:
    path = tmp_path / "v.toml"
    path.write_text("[variant]\nname = \"t\"\nrepo_id = \"test/t\"\nrevision = \"unpinned\"\n"
                    "revision_note = \"a synthetic variant\"\n\n[quantization]\n"
                    f"quant_algo = \"{algo}\"\ngroup_size = 16\nexclude_modules = {json.dumps(exclude)}\n")
    return load_variant(path)


def _write(tiny, folder, exclude: list[str], quantize, mutate=None, dense=None, module_name=lambda n: n):
    """The tiny reference model saved as ModelOpt exports it: each nn.Linear not excluded, and each fused experts
    tensor split into one projection per expert, stored by `quantize` (weight -> its stored tensors, by suffix),
    with a static input scale; everything else in `dense(name)` (None: as held, float32). Globs are matched
    against `module_name(module)`, the name the quantizer saw."""
    import torch
    from safetensors.torch import save_file

    from explorer.execute.reference import reference_state, tiny_reference_model

    model = tiny_reference_model(tiny)
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    skip = lambda module: any(fnmatch.fnmatchcase(module_name(module), g) for g in exclude)  # noqa: E731
    tensors = {}

    def store(module: str, weight):
        tensors.update({f"{module}.{k}": v for k, v in quantize(weight).items()})
        tensors[f"{module}.input_scale"] = torch.tensor(0.01, dtype=torch.float32)

    for name, value in reference_state(tiny, model, stored_once=True).items():
        owner, _, leaf = name.rpartition(".experts.")
        parts = {"gate_up_proj": ("gate_proj", "up_proj"), "up_proj": ("up_proj",),
                 "down_proj": ("down_proj",)}.get(leaf.removesuffix(".weight"))  # stacked: experts.up_proj.weight
        if parts and value.dim() == 3 and not skip(f"{owner}.experts.0.{parts[0]}"):
            for e in range(value.shape[0]):
                for p, w in zip(parts, value[e].chunk(len(parts), dim=0)):
                    store(f"{owner}.experts.{e}.{p}", w)
        elif (name.endswith(".weight") and FAMILIES[tiny.family].reference_module(name[:-7]) in linears
              and not skip(name[:-7])):
            store(name.removesuffix(".weight"), value)
        else:
            dtype = dense(name) if callable(dense) else dense
            tensors[name] = value if dtype is None else value.to(dtype)
    if mutate:
        mutate(tensors)
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


GEMMA_EXCLUDE = ["lm_head", "model.vision_tower*", "model.embed_vision*", "model.language_model.layers.*.mlp*",
                 "model.language_model.layers.*.router*", "model.language_model.layers.*.self_attn*",
                 "model.language_model.layers.1.experts*"]
"""As the published Gemma 4 variant excludes (every layer's attention, dense MLP and router), and the experts of
layer 1 too, so the fused form and the per-expert form meet in one file."""


@pytest.fixture(scope="module")
def gemma_tiny():
    from explorer.execute.executor import tiny_spec

    return tiny_spec(load_model_spec(load_model_content(ROOT / "content/models/gemma-4-26b-a4b")))


def _nvfp4(weight):
    from explorer.checkpoint.formats import nvfp4

    return nvfp4.quantize(weight)


def test_synthetic_nvfp4_checkpoint_reconciles_and_a_broken_one_names_the_tensor(gemma_tiny, tmp_path):
    import torch

    from explorer.checkpoint.safetensors_headers import read_local_checkpoint

    variant = _variant_file(tmp_path, "NVFP4", GEMMA_EXCLUDE)
    spec = variant_spec(gemma_tiny, variant)
    good = read_local_checkpoint(_write(gemma_tiny, tmp_path / "good", GEMMA_EXCLUDE, _nvfp4))
    rec = reconcile(spec, good)
    assert rec.balanced, rec.differences(5)
    assert {t.dtype for t in rec.totals if t.role == "quant_scale"} == {"F8_E4M3", "F32"}
    assert "model.language_model.layers.1.experts.gate_up_proj" in good.tensors  # excluded: still fused
    assert sum(t.parameters for t in rec.totals) == account(gemma_tiny).total

    scale = "model.language_model.layers.0.experts.3.down_proj.weight_scale"
    packed = "model.language_model.layers.2.experts.1.up_proj.weight"

    def break_it(tensors):
        del tensors[scale]
        rows, cols = tensors[packed].shape
        tensors[packed] = torch.zeros(rows, cols + 1, dtype=torch.uint8)

    bad = reconcile(spec, read_local_checkpoint(_write(gemma_tiny, tmp_path / "bad", GEMMA_EXCLUDE, _nvfp4,
                                                       break_it)))
    assert not bad.balanced
    text = "\n".join(bad.differences(20))
    assert scale in text and packed in text


def test_without_the_fused_experts_split_the_real_layout_does_not_reconcile(gemma_tiny, tmp_path, monkeypatch):
    """The mechanism, mutated: left fused, the prediction misses every per-expert tensor ModelOpt writes."""
    from explorer.checkpoint.safetensors_headers import read_local_checkpoint
    from explorer.model import quantization

    variant = _variant_file(tmp_path, "NVFP4", GEMMA_EXCLUDE)
    good = read_local_checkpoint(_write(gemma_tiny, tmp_path / "good", GEMMA_EXCLUDE, _nvfp4))
    monkeypatch.setattr(quantization, "FUSED_EXPERTS", {})
    rec = reconcile(variant_spec(gemma_tiny, variant), good)
    assert not rec.balanced and "model.language_model.layers.0.experts.0.gate_proj.weight" in str(rec.unowned)


def test_synthetic_fp8_per_tensor_checkpoint_reconciles_and_a_broken_one_names_the_tensor(tmp_path):
    import torch

    from explorer.checkpoint.formats import fp8_tensor
    from explorer.checkpoint.safetensors_headers import read_local_checkpoint
    from explorer.execute.executor import tiny_spec

    tiny = tiny_spec(load_model_spec(load_model_content(ROOT / "content/models/qwen3-8b")))
    exclude = ["lm_head", "model.layers.0.self_attn*"]
    spec = variant_spec(tiny, _variant_file(tmp_path, "FP8", exclude))
    rec = reconcile(spec, read_local_checkpoint(_write(tiny, tmp_path / "good", exclude, fp8_tensor.quantize,
                                                             dense=torch.bfloat16)))
    assert rec.balanced, rec.differences(5)
    assert {t.dtype for t in rec.totals if t.role == "parameter"} == {"F8_E4M3", "BF16"}
    assert {t.dtype for t in rec.totals if t.role == "quant_scale"} == {"F32"}
    assert sum(t.parameters for t in rec.totals) == account(tiny).total

    scale = "model.layers.1.mlp.up_proj.weight_scale"
    weight = "model.layers.1.self_attn.o_proj.weight"

    def break_it(tensors):
        del tensors[scale]
        rows, cols = tensors[weight].shape
        tensors[weight] = torch.zeros(rows, cols + 1).to(torch.float8_e4m3fn)

    bad = reconcile(spec, read_local_checkpoint(_write(tiny, tmp_path / "bad", exclude, fp8_tensor.quantize,
                                                       break_it, torch.bfloat16)))
    assert not bad.balanced
    text = "\n".join(bad.differences(20))
    assert scale in text and weight in text


def test_record_checkpoint_from_folder_reads_the_nvfp4_file(gemma_tiny, tmp_path):
    """build.py --record-checkpoint --from-folder is read_local_checkpoint plus a manifest: the U8 and F8_E4M3
    tensors come back with the shapes the export wrote."""
    from explorer.checkpoint.safetensors_headers import read_local_checkpoint

    index = read_local_checkpoint(_write(gemma_tiny, tmp_path / "f", GEMMA_EXCLUDE, _nvfp4))
    w = index.tensors["model.language_model.layers.0.experts.0.gate_proj.weight"]
    s = index.tensors["model.language_model.layers.0.experts.0.gate_proj.weight_scale"]
    assert (w.dtype, s.dtype, s.shape[1] * 8) == ("U8", "F8_E4M3", w.shape[1])


# ------------------------------------------------------------------------------------- for the memory calculator

def test_weight_format_bytes_count_scales_and_scalars():
    """Bytes per parameter as stored: values, one scale per group or block, and the per-tensor scalars, worked
    out here by hand for a 4096 × 4096 weight."""
    from explorer.checkpoint.variants import weight_format_bytes

    n = 4096 * 4096
    expected = {"BF16": 2.0, "FP8, one scale per 128 × 128 block": 1 + 4 / 128 ** 2,
                "FP8, one scale per tensor": 1 + 8 / n, "MXFP4": 0.5 + 1 / 32,
                "NVFP4": 0.5 + 1 / 16 + 8 / n, "INT4, group 32 (compressed-tensors)": 0.5 + 2 / 32 + 16 / n}
    got = weight_format_bytes()
    assert got.keys() == expected.keys()
    assert all(got[k] == pytest.approx(v, rel=1e-12) for k, v in expected.items())
    small = weight_format_bytes((16, 32))  # the scalars weigh more on a small weight
    assert small["NVFP4"] == pytest.approx(0.5 + 1 / 16 + 8 / (16 * 32), rel=1e-12)


def test_synthetic_nemotron_nvfp4_checkpoint_with_exclusions_at_some_layers(tmp_path):
    """Nemotron-H as ModelOpt exported it: globs over the published backbone.* names, in_proj and out_proj
    excluded at one Mamba layer and not at the other, attention excluded, per-expert up and down projections."""
    import torch

    from explorer.checkpoint.safetensors_headers import read_local_checkpoint
    from explorer.execute.executor import tiny_spec

    tiny = tiny_spec(load_model_spec(load_model_content(ROOT / "content/models/nemotron-3-nano-30b-a3b")))
    exclude = ["lm_head", "backbone.layers.3.mixer.in_proj", "backbone.layers.3.mixer.out_proj",
               *(f"backbone.layers.2.mixer.{x}_proj" for x in "qkvo"), "backbone.layers.*.mixer.conv1d"]
    dense = lambda n: torch.float32 if n.endswith("e_score_correction_bias") else torch.bfloat16  # noqa: E731
    variant = _variant_file(tmp_path, "NVFP4", exclude)
    spec = variant_spec(tiny, variant, FAMILIES["nemotron_h"].variant_module_name)
    index = read_local_checkpoint(_write(tiny, tmp_path / "good", exclude, _nvfp4, dense=dense))
    assert index.tensors["backbone.layers.0.mixer.in_proj.weight"].dtype == "U8"
    assert index.tensors["backbone.layers.3.mixer.in_proj.weight"].dtype == "BF16"
    rec = reconcile(spec, index)
    assert rec.balanced, rec.differences(5)
    assert sum(t.parameters for t in rec.totals) == account(tiny).total

    # globs matched against transformers' model.* module names: nothing is excluded
    monkey = variant_spec(tiny, variant, FAMILIES["nemotron_h"].reference_module)
    assert not reconcile(monkey, index).balanced


@pytest.mark.parametrize("slug", ["gemma-4-26b-a4b", "nemotron-3-nano-30b-a3b"])
def test_recorded_exclude_lists_on_the_tiny_model_reconcile(slug, tmp_path):
    """The recorded variant's own exclude list, applied to the tiny model of the same family (its globs name
    layers 0-29 or 0-51, so they reach the tiny model's few layers too): every module the writer quantizes, found
    on the torch model, is one the prediction quantizes, and no other."""
    import torch

    from explorer.checkpoint.safetensors_headers import read_local_checkpoint
    from explorer.execute.executor import tiny_spec

    spec, variant = _base(slug)
    tiny = tiny_spec(spec)
    family = FAMILIES[spec.family]
    dense = None if slug.startswith("gemma") else (
        lambda n: torch.float32 if n.endswith("e_score_correction_bias") else torch.bfloat16)
    folder = _write(tiny, tmp_path / "f", list(variant.modelopt.exclude_modules), _nvfp4, dense=dense,
                    module_name=family.variant_module_name)
    rec = reconcile(variant_spec(tiny, variant, family.variant_module_name), read_local_checkpoint(folder))
    assert rec.balanced, rec.differences(5)
    assert any(t.dtype == "U8" for t in rec.totals)
