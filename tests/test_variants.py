"""Published variants (issue 24 item 2): a quantized release of a base model, recorded from its quantization config,
gets a predicted layout with the exclude list applied, the base model's logical parameters, and the header count a
naive tool would report. Shown on Qwen3 8B with an NVFP4 and an FP8 config written here (none is recorded yet)."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import ROOT

from explorer.checkpoint.variants import load_variants, stored_as, variant_spec
from explorer.commands.add_variant import add_variant
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.model.account import account
from explorer.model.families import load_model_spec
from explorer.spec.storage import NVFP4
from explorer.spec.types import walk

BASE = "qwen3-8b"


@pytest.fixture(scope="module")
def base():
    return load_model_spec(load_model_content(ROOT / "content/models" / BASE))


def _content(tmp_path):
    shutil.copytree(ROOT / "content/models" / BASE, tmp_path / "models" / BASE)
    return tmp_path


def _modelopt(tmp_path, algo: str, exclude: list[str]):
    path = tmp_path / f"hf_quant_config_{algo}.json"
    path.write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.43.0"},
                                "quantization": {"quant_algo": algo, "kv_cache_quant_algo": "FP8", "group_size": 16,
                                                 "exclude_modules": exclude}}))
    return path


def test_nvfp4_variant_keeps_the_base_parameters_and_explains_its_header(tmp_path, base):
    content = _content(tmp_path)
    exclude = ["lm_head", "model.layers.*.self_attn*"]
    out = add_variant(content, BASE, _modelopt(tmp_path, "NVFP4", exclude), "nvidia/Qwen3-8B-NVFP4", "unpinned",
                      "not published at a known commit")
    (variant,) = load_variants(content / "models" / BASE)
    assert out.name == "qwen3-8b-nvfp4.toml" and variant.modelopt.exclude_modules == tuple(exclude)
    spec = variant_spec(base, variant)
    storages = {t.template: t.storage for _, c in walk(spec.root) for t in c.tensors}
    assert storages["model.layers.{layer}.mlp.up_proj.weight"] == NVFP4(16)
    assert not isinstance(storages["model.layers.{layer}.self_attn.q_proj.weight"], NVFP4)  # excluded by its glob
    assert not isinstance(storages["lm_head.weight"], NVFP4)
    s = stored_as(base, variant)
    assert s.parameters == account(base).total
    v = base.values
    mlp = 3 * v["hidden_size"] * v["intermediate_size"] * 36  # the NVFP4 weights: 36 layers' MLPs
    dense = account(base).total - mlp
    assert s.header_elements == dense + mlp // 2 + mlp // 16 + 3 * 36 * 2  # + weight_scale_2 and input_scale each
    assert s.bytes == 2 * dense + mlp // 2 + mlp // 16 + 3 * 36 * 2 * 4
    names = {name for name, *_ in s.tensors}
    assert "model.layers.0-35.mlp.down_proj.weight_scale_2" in names
    assert "model.layers.0-35.self_attn.q_proj.weight_scale" not in names
    assert "U8 holds 2 values per element" in s.naive_count_reason


def test_fp8_variant(tmp_path, base):
    content = _content(tmp_path)
    add_variant(content, BASE, _modelopt(tmp_path, "FP8", ["lm_head"]), "nvidia/Qwen3-8B-FP8", "unpinned", "x")
    (variant,) = load_variants(content / "models" / BASE)
    s = stored_as(base, variant)
    assert s.parameters == account(base).total
    assert {r.dtype for r in s.rows if r.role == "parameter"} == {"F8_E4M3", "BF16"}


def test_an_algorithm_the_library_cannot_predict_is_refused(tmp_path):
    content = _content(tmp_path)
    with pytest.raises(ContentError, match="quant_algo.*must be 'NVFP4' or 'FP8'"):
        add_variant(content, BASE, _modelopt(tmp_path, "W4A8_AWQ", []), "x/Qwen3-8B-AWQ", "unpinned", "x")


def test_model_page_and_api_show_each_variant(tmp_path, base):
    """A base model whose folder records a variant gets a "Stored as" section and an API entry for it."""
    from explorer.pipeline import build_model
    from explorer.render.site_writer import environment, render_page
    from explorer.views.api import model_api
    from explorer.views.component_page import component_page

    content = _content(tmp_path)
    add_variant(content, BASE, _modelopt(tmp_path, "NVFP4", ["lm_head"]), "nvidia/Qwen3-8B-NVFP4", "unpinned",
                "not published at a known commit")
    mb = build_model(load_model_content(content / "models" / BASE), progress=lambda _: None)
    (entry,) = model_api(mb)["published_variants"]
    assert entry["logical_parameters"] == account(base).total and entry["header_elements"] < entry["logical_parameters"]
    html = render_page(environment(ROOT / "templates"), component_page(mb, (), mb.spec.root))
    assert "Stored as: <a href=\"https://huggingface.co/nvidia/Qwen3-8B-NVFP4\">Qwen3-8B-NVFP4</a>" in html
    assert f"{account(base).total:,}" in html and "revision not pinned: not published at a known commit" in html


def test_nvfp4_rows_are_not_called_mxfp4(tmp_path, base):
    from types import SimpleNamespace

    from explorer.views.model_page import variant_views

    content = _content(tmp_path)
    add_variant(content, BASE, _modelopt(tmp_path, "NVFP4", ["lm_head"]), "nvidia/Qwen3-8B-NVFP4", "unpinned", "x")
    (variant,) = load_variants(content / "models" / BASE)
    (view,) = variant_views(SimpleNamespace(variants=(stored_as(base, variant),)))  # type: ignore[arg-type]
    labels = {r.dtype: r.role for r in view.rows}
    assert labels["U8"] == "NVFP4 values: two FP4 (E2M1) per byte"
    assert labels["F8_E4M3"] == "NVFP4 block scales: one FP8 E4M3 per 16 values"


def test_build_py_add_variant_writes_the_file(tmp_path):
    from conftest import build_main

    project = tmp_path / "project"
    _content(project / "content")
    config = _modelopt(tmp_path, "NVFP4", ["lm_head"])
    result = build_main("--content", str(project), "--add-variant", BASE, "--quant-config", str(config),
                        "--repo", "nvidia/Qwen3-8B-NVFP4", "--revision", "unpinned")
    assert result.returncode == 0, result.stderr
    (variant,) = load_variants(project / "content/models" / BASE)
    assert variant.meta.revision_note == f"{config.name} was recorded without the Hub revision it was read at"
    assert variant.meta.producer == "modelopt 0.43.0"
