"""Issue 19 item 5: `--add-model` takes every config the reference config class takes, for every family.

For one model of each family, its recorded config is written back out as a config.json, with two keys no config
class defines (a string and a nested table) and, where the family predicts quantized layouts, a quantization block;
`--add-model` records it into a scratch content folder, and the model then builds (every stage that needs no torch:
spec, ledger, citations with the config line ranges derived at add time, the recorded-config check, the predicted
stored layout) with the original model's parameter total. Keys the family does not read are recorded as
published, listed in checkpoint.config_unused and shown on the model page; a key the family reads, or one the
reference reads but the family does not model, is never taken for an unused one.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT

from explorer.checkpoint.sources import regenerate_config
from explorer.commands.add_model import add_model
from explorer.content.model_content import ModelContent, load_all_models, load_model_content
from explorer.errors import ContentError
from explorer.model.account import account
from explorer.model.families import FAMILIES, load_model_spec
from explorer.pipeline import prepare_model
from explorer.spec.types import walk

UNKNOWN = {"x_published_note": "not read by any config class", "x_published_null": None,
           "x_published_table": {"mode": "offline", "limits": {"depth": 3, "names": ["a", "b"]}}}
"""Keys no transformers config class defines: a string, a null (TOML has none: listed in config_nulls too) and a
nested table."""
FP8_BLOCK = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
"""A block-wise FP8 quantization_config as DeepSeek-V3 publishes it."""


@cache
def originals() -> dict[str, ModelContent]:
    """The first model of each family, in content order."""
    out: dict[str, ModelContent] = {}
    for content in load_all_models(ROOT / "content"):
        out.setdefault(content.meta.family, content)
    return out


def published(content: ModelContent) -> dict:
    """The model's config.json as recorded: regenerated from content where its sha256 allows, else its values."""
    text = regenerate_config(content)
    return json.loads(text) if text is not None else dict(content.config)


def added(tmp_path: Path, config: dict, slug: str = "added") -> ModelContent:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    toml = add_model(tmp_path / "content", slug, path, "org/added", "unpinned")
    return load_model_content(toml.parent)


def quiet(message: str) -> None:
    pass


def test_every_family_has_a_model():
    assert set(originals()) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_config_with_unknown_keys_adds_and_builds_with_the_same_totals(tmp_path, family):
    original = originals()[family]
    content = added(tmp_path, {**published(original), **UNKNOWN})
    assert content.checkpoint.config_unused == tuple(sorted(UNKNOWN))
    assert {k: content.config[k] for k in UNKNOWN} == UNKNOWN  # recorded as published
    assert "x_published_null" in content.checkpoint.config_nulls
    prepared = prepare_model(content, progress=quiet)  # the recorded-config check, citations, predicted layout
    assert prepared.ledger.total == account(load_model_spec(original)).total
    written = (tmp_path / "config.json").read_text(encoding="utf-8")
    assert regenerate_config(content) == written  # the unknown keys are in the regenerated config.json, exactly


QUANTIZED = {family: c.slug for family, c in originals().items()
             if "quantization_config" in c.config or "quantization_config" in (c.config.get("text_config") or {})}
"""Families whose first model publishes a quantization block (its own kind: FP8 blocks, MXFP4, compressed-tensors
INT4, a GGUF mix): test_a_config_with_unknown_keys_adds_and_builds... adds and builds it as published."""
FP8_FAMILIES = ("ernie4_5_moe", "gemma3", "gemma4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "kimi_linear", "llama", "llama4",
                "minimax_m3", "mixtral", "nemotron_h", "olmo2", "phi3", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_moe",
                "qwen3_next", "qwen3_vl", "qwen3_vl_moe", "smollm3", "step3p7")
"""Families that read a block-wise FP8 quantization_config although their first model publishes none (their stored
layouts checked against transformers' FP8 quantizer in test_fp8_every_family.py)."""
FP8_BLOCKS = {"nemotron_h": {**FP8_BLOCK, "modules_to_not_convert": ["lm_head", r"model\.layers\.\d+\.mixer\.experts"]}}
"""Where a family needs more than the bare block: transformers loads Nemotron-H in FP8 only with its experts kept."""
NO_FP8 = ("gpt2",)
"""Families in which transformers' FP8 quantizer converts nothing (GPT-2's Conv1D projections): the block is refused."""


def test_every_family_reads_a_quantization_block_or_refuses_it():
    assert set(QUANTIZED) | set(FP8_FAMILIES) | set(NO_FP8) == set(FAMILIES)


def test_the_quantized_families_are_the_expected_ones():
    assert sorted(QUANTIZED) == ["deepseek_v3", "deepseek_v32", "deepseek_v4", "gemma3_text", "gpt_oss", "kimi_k25",
                                 "mimo_v2_flash", "minimax_m2"]


def stored(content: ModelContent) -> dict[str, int]:
    """Predicted stored elements by role, for a model with no recorded checkpoint listing."""
    prepared = prepare_model(content, progress=quiet)
    assert prepared.predicted is not None and prepared.predicted.balanced
    totals = prepared.predicted.totals
    return {"parameters": sum(t.parameters for t in totals if t.role == "parameter"),
            "scale elements": sum(t.elements for t in totals if t.role == "quant_scale"),
            "bytes": sum(t.bytes for t in totals)}


def without_quantization(config: dict) -> dict:
    """The config less its quantization block, at the top level or in text_config (Kimi K2.5)."""
    out = {k: v for k, v in config.items() if k != "quantization_config"}
    if isinstance(config.get("text_config"), dict):
        out["text_config"] = {k: v for k, v in config["text_config"].items() if k != "quantization_config"}
    return out


@pytest.mark.parametrize("family", sorted(QUANTIZED) + list(FP8_FAMILIES))
def test_a_quantization_block_adds_and_the_predicted_layout_uses_it(tmp_path, family):
    config = {**published(originals()[family]), **UNKNOWN}
    if family in FP8_FAMILIES:
        config["quantization_config"] = FP8_BLOCKS.get(family, FP8_BLOCK)
    quantized = stored(added(tmp_path / "q", config))
    if family == "gemma3_text":
        return  # a GGUF mix: its blocks hold their scales inline, and its unquantized tensors are F32, not BF16
    dense = stored(added(tmp_path / "d", without_quantization(config)))
    assert quantized["parameters"] == dense["parameters"]  # the same weights, stored otherwise
    assert quantized["scale elements"] > dense["scale elements"]  # (DeepSeek-V4's FP4 experts keep theirs)
    assert quantized["bytes"] < dense["bytes"]


@pytest.mark.parametrize("family", [*NO_FP8, "nemotron_h"])
def test_a_family_that_predicts_no_quantized_layout_refuses_the_block_in_one_line(tmp_path, family):
    """GPT-2 refuses any FP8 block; Nemotron-H one that would convert its experts (transformers cannot)."""
    config = {**published(originals()[family]), "quantization_config": FP8_BLOCK}
    with pytest.raises(ContentError) as info:
        added(tmp_path, config)
    assert len(info.value.problems) == 1
    assert "key 'quantization_config" in info.value.problems[0] and "\n" not in info.value.problems[0]
    assert not (tmp_path / "content" / "models" / "added").exists()


# ----------------------------------------------------------------------------------- what is never unused

def test_a_key_the_family_reads_cannot_be_listed_as_unused(tmp_path):
    content = added(tmp_path, {**published(originals()["llama"]), **UNKNOWN})
    toml = content.folder / "model.toml"
    text = toml.read_text(encoding="utf-8")
    toml.write_text(text.replace('config_unused = ["x_published_note"', 'config_unused = ["hidden_size", '
                                 '"x_published_note"'), encoding="utf-8")
    with pytest.raises(ContentError) as info:
        load_model_spec(load_model_content(content.folder))
    assert "key 'checkpoint.config_unused': 'hidden_size' is read by the llama family" in str(info.value)


def test_an_unused_key_must_be_in_the_recorded_config(tmp_path):
    content = added(tmp_path, {**published(originals()["llama"]), **UNKNOWN})
    toml = content.folder / "model.toml"
    text = toml.read_text(encoding="utf-8")
    toml.write_text(re.sub(r'\nx_published_note = .*\n', "\n", text), encoding="utf-8")
    with pytest.raises(ContentError) as info:
        load_model_content(content.folder)
    assert "key 'checkpoint.config_unused': 'x_published_note' is not in [config]" in str(info.value)


def test_a_key_the_reference_reads_but_the_family_does_not_model_is_refused(tmp_path):
    """Qwen3Config defines layer_types (which layers slide); the qwen3 family does not model it, so it is refused,
    not taken for unused."""
    assert "layer_types" not in FAMILIES["qwen3"].config_class.__dataclass_fields__
    config = published(originals()["qwen3"])
    with pytest.raises(ContentError) as info:
        added(tmp_path, {**config, "layer_types": ["full_attention"] * config["num_hidden_layers"]})
    assert len(info.value.problems) == 1
    assert "key 'layer_types': transformers reads it" in info.value.problems[0]
    assert "the qwen3 family does not model it" in info.value.problems[0]


def test_an_unknown_key_not_listed_as_unused_is_still_refused(tmp_path):
    content = added(tmp_path, {**published(originals()["llama"]), **UNKNOWN})
    toml = content.folder / "model.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace(
        'config_unused = ["x_published_note", ', 'config_unused = ['),
        encoding="utf-8")
    with pytest.raises(ContentError) as info:
        load_model_spec(load_model_content(content.folder))
    assert "key 'x_published_note': unknown" in str(info.value)


# ------------------------------------------------------------------------------------ derived line ranges

def test_the_config_line_ranges_are_derived_from_the_given_file(tmp_path):
    """DeepSeek-V3's quantization citation needs the block's lines: derived at add time, checked at build."""
    config = {**published(originals()["deepseek_v3"]), **UNKNOWN}
    content = added(tmp_path, config)
    text = (tmp_path / "config.json").read_text(encoding="utf-8").splitlines()
    first, last = content.checkpoint.config_lines["quantization_config"]
    assert text[first - 1].startswith('  "quantization_config": {') and text[last - 1] == "  },"
    toml = content.folder / "model.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace(f"quantization_config = [{first}, {last}]",
                                                             f"quantization_config = [{first}, {last + 1}]"),
                    encoding="utf-8")
    with pytest.raises(ContentError) as info:  # a wrong range fails the build, naming the key
        prepare_model(load_model_content(content.folder), progress=quiet)
    assert "checkpoint.config_lines.quantization_config" in str(info.value)


def test_nested_line_ranges_are_derived_for_a_nested_citation(tmp_path):
    """Kimi K2.5 cites text_config.quantization_config: its lines inside text_config, from a file of any indent."""
    config = published(originals()["kimi_k25"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    toml = add_model(tmp_path / "content", "k", path, "org/k", "unpinned")
    lines = load_model_content(toml.parent).checkpoint.config_lines["text_config.quantization_config"]
    text = path.read_text(encoding="utf-8").splitlines()
    assert text[lines[0] - 1].strip().startswith('"quantization_config": {') and text[lines[0] - 1].startswith(" " * 8)
    assert text[lines[1] - 1] == " " * 8 + "},"


# ------------------------------------------------------------------------------------------ the model page

def test_gpt2_medium_keys_build_in_full_and_the_model_page_lists_them(tmp_path):
    """The published gpt2-medium config carries n_special and predict_special_tokens, which GPT2Config does not
    define: the model builds in full (reference on meta, executed checks) and its page shows both as published."""
    from explorer.pipeline import build_model
    from explorer.render.site_writer import environment, render_page
    from explorer.views.component_page import component_page

    content = added(tmp_path, {**published(originals()["gpt2"]), "n_special": 0, "predict_special_tokens": True,
                               "x_published_null": None})
    assert content.checkpoint.config_unused == ("n_special", "predict_special_tokens", "x_published_null")
    mb = build_model(content, progress=quiet)
    assert mb.reference.balanced and mb.ledger.total == account(load_model_spec(originals()["gpt2"])).total
    html = render_page(environment(ROOT / "templates"), component_page(mb, (), mb.spec.root, (), frozenset()))
    section = html[html.index('<section id="unused"'):]
    section = section[:section.index("</section>")]
    assert "Published keys not read" in section and "GPT2Config" in section
    assert re.findall(r"<tr><td><code>([^<]+)</code></td><td><code>([^<]+)</code>", section) == [
        ("n_special", "0"), ("predict_special_tokens", "true"), ("x_published_null", "null")]


@pytest.mark.parametrize("family", ["gemma3", "kimi_k25", "qwen3_5", "qwen3_vl", "qwen3_vl_moe"])
def test_unknown_keys_inside_a_nested_config_are_recorded_dotted(tmp_path, family):
    """A multimodal config's text_config and vision_config are config classes of their own, which take unknown keys
    as the top-level class does."""
    original = originals()[family]
    config = published(original)
    config["text_config"] = {**config["text_config"], "x_text_note": "published"}
    config["vision_config"] = {**config["vision_config"], "x_vision_table": {"a": 1}}
    content = added(tmp_path, {**config, **UNKNOWN})
    assert content.checkpoint.config_unused == ("text_config.x_text_note", "vision_config.x_vision_table",
                                                *sorted(UNKNOWN))
    assert prepare_model(content, progress=quiet).ledger.total == account(load_model_spec(original)).total
    assert regenerate_config(content) == (tmp_path / "config.json").read_text(encoding="utf-8")


def test_an_unknown_key_inside_a_quantization_block_is_refused(tmp_path):
    """Inside quantization_config any key may change how weights are stored: never taken for unused."""
    config = published(originals()["deepseek_v3"])
    config["quantization_config"] = {**config["quantization_config"], "x_pack_order": "reversed"}
    with pytest.raises(ContentError) as info:
        added(tmp_path, config)
    assert len(info.value.problems) == 1 and "key 'quantization_config.x_pack_order'" in info.value.problems[0]


def test_add_model_names_the_key_a_misspelled_unused_one_is_nearest_to(tmp_path, capsys):
    """transformers takes a misspelled key silently; `--add-model` records it as unused and says which key the
    family reads it is nearest to, so a typo in a hand-written config does not pass unseen."""
    from build import main as build_main

    (tmp_path / "content" / "models").mkdir(parents=True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**published(originals()["llama"]), "hidden_sise": 3}, indent=2), encoding="utf-8")
    code = build_main(["--content", str(tmp_path), "--add-model", "m", "--config", str(path), "--repo", "o/m",
                       "--revision", "unpinned"])
    assert code == 0
    out = capsys.readouterr().out
    assert "hidden_sise: recorded as published and not read (checkpoint.config_unused); did you mean 'hidden_size'?" \
        in out


def test_modules_a_dense_fp8_config_leaves_out_stay_in_the_models_dtype(tmp_path):
    """modules_to_not_convert names modules kept unquantized (as transformers matches them: from the start, as a
    regular expression, up to a module boundary): with the attention left out, only the MLP's three projections
    per layer are FP8, each with one scale per 128 × 128 block; "self_attn" alone names nothing."""
    original = originals()["llama"]
    attention = r"model\.layers\.\d+\.self_attn"
    c = config = {**published(original), "quantization_config": {**FP8_BLOCK, "modules_to_not_convert": [attention]}}
    spec = load_model_spec(added(tmp_path, config))
    fp8 = {t.template for _, comp in walk(spec.root) for t in comp.tensors if t.dtype == "F8_E4M3"}
    assert fp8 == {f"model.layers.{{layer}}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    blocks = lambda a, b: -(-a // 128) * -(-b // 128)  # noqa: E731
    per_layer = 2 * blocks(c["intermediate_size"], c["hidden_size"]) + blocks(c["hidden_size"], c["intermediate_size"])
    assert stored(load_model_content(tmp_path / "content/models/added"))["scale elements"] == \
        per_layer * c["num_hidden_layers"]


# ------------------------------------------------------------------------------------------ json_lines

def test_key_lines_are_the_lines_a_reader_sees_in_any_layout():
    from explorer.content.json_lines import key_lines

    text = '{\n  "a": "}{ ][",\n  "b": {\n    "c": [1,\n      {"d": "x\\"]"}],\n    "e": null\n  },\n  "f": 2}'
    assert key_lines(text, "a") == (2, 2)  # brackets inside a string count for nothing
    assert key_lines(text, "b") == (3, 7) and key_lines(text, "b.c") == (4, 5) and key_lines(text, "b.e") == (6, 6)
    assert key_lines(text, "f") == (8, 8) and key_lines(text, "b.d") is None and key_lines(text, "g") is None
    assert key_lines(json.dumps({"a": {"b": 1}}), "a.b") == (1, 1)  # minified: one line
    assert key_lines("[1, 2]", "a") is None and key_lines('{"a": }', "a") is None
