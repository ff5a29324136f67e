"""Issue 32 item 1: the reference config class is the contract for keys a published config omits, spells the other
way (dtype / torch_dtype) or carries for every model (the base config's generic keys).

The defaults are read from the config classes' source (explorer/model/config_defaults.py, no torch at build time); the
oracle here is the installed transformers classes themselves, and the reference models built from them.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import pytest
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.commands.add_model import add_model
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.execute.reference import reference_index, tiny_reference_model
from explorer.model.config_defaults import class_defaults
from explorer.model.families import FAMILIES
from explorer.model.published_keys import GENERIC_KEYS, classify


@cache
def site_config(slug: str) -> dict:
    return dict(load_model_content(ROOT / "content/models" / slug).config)


def reference_classes() -> list[str]:
    names = {f.reference.config_class for f in FAMILIES.values()}
    names |= {f.default_source(k) for f in FAMILIES.values() for k in ("text_config.x", "vision_config.x")}
    return sorted(names)


def real_defaults(name: str) -> dict:
    import transformers

    out = {}
    for f in dataclasses.fields(getattr(transformers, name)):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def as_json(value):
    return [as_json(v) for v in value] if isinstance(value, (list, tuple)) else value


@pytest.mark.parametrize("name", reference_classes())
def test_defaults_read_from_source_are_the_config_classes(name):
    """Every default read from a reference config class's source is the installed class's own (inherited ones
    included); the few it cannot read (a computed default, 4096 * 32) are left out, never guessed."""
    read, real = class_defaults(name), real_defaults(name)
    assert {k: v for k, v in read.items() if as_json(real.get(k, KeyError)) != v} == {}
    assert len(read) >= len(real) - 2 and "dtype" in read  # inherited from PreTrainedConfig


def test_a_subclass_default_overrides_its_base():
    """Read base first: PreTrainedConfig's tie_word_embeddings is overridden where a class sets its own."""
    assert class_defaults("Gemma3TextConfig")["tie_word_embeddings"] == real_defaults("Gemma3TextConfig")[
        "tie_word_embeddings"]


def test_an_omitted_key_takes_the_reference_class_default():
    """Nemotron-H-56B's file has no head_dim: NemotronHConfig's default (128) is the one transformers builds; the page
    lists it as a default; a default read wrong (64) would unbalance the reference check."""
    import transformers

    family = FAMILIES["nemotron_h"]
    raw = {k: v for k, v in site_config("nemotron-3-nano-30b-a3b").items() if k != "head_dim"}
    spec = family.build_spec("no-head-dim", raw, "test")
    assert spec.values["head_dim"] == transformers.NemotronHConfig().head_dim == 128
    assert "head_dim" in spec.defaulted
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced
    wrong = family.build_spec("wrong", {**raw, "head_dim": 64}, "test")
    assert not reconcile(wrong, reference_index(spec).index, reference=True).balanced


def test_a_key_the_class_gives_no_literal_default_is_still_missing():
    """DeepseekV3Config has no rope_theta field (it reads rope_parameters): a config without one is refused, naming it."""
    raw = {k: v for k, v in site_config("deepseek-v3").items() if k != "rope_theta"}
    with pytest.raises(ContentError, match="key 'rope_theta': missing"):
        FAMILIES["deepseek_v3"].validate(raw, "test")


def test_dtype_is_read_as_torch_dtype_and_back():
    """A config saved by current transformers says dtype: the MiniMax-M2 family (which names torch_dtype) stores its
    weights in it; Qwen3.5's text config (which names dtype) reads an older file's torch_dtype."""
    family = FAMILIES["minimax_m2"]
    raw = {k: v for k, v in site_config("minimax-m2.5").items() if k not in ("torch_dtype", "quantization_config")}
    f16 = family.build_spec("f16", {**raw, "dtype": "float16"}, "test")
    assert f16.config.torch_dtype == "float16"
    assert f16.root.child("embed").tensors[0].storage.dtype == "F16"
    q = site_config("qwen3.5-27b")
    text = {k: v for k, v in q["text_config"].items() if k != "dtype"}
    old = FAMILIES["qwen3_5"].validate({**q, "text_config": {**text, "torch_dtype": "float16"}}, "test")
    assert old.text_config.dtype == "float16"


def test_both_dtype_spellings_must_agree():
    raw = {**site_config("minimax-m2.5"), "dtype": "float16", "torch_dtype": "bfloat16"}
    with pytest.raises(ContentError, match="key 'dtype': 'float16' differs from torch_dtype 'bfloat16'"):
        FAMILIES["minimax_m2"].validate(raw, "test")


def test_dtype_needs_no_unused_entry_where_the_family_names_the_other_spelling():
    raw = {k: v for k, v in site_config("minimax-m2.5").items() if k != "torch_dtype"}
    assert classify(FAMILIES["minimax_m2"], {**raw, "dtype": "bfloat16"}, "test") == ()


GENERIC_VALUES = {"transformers_version": "9.9.9", "_name_or_path": "somewhere/else", "_commit_hash": "abc",
                  "architectures": ["SomethingElse"], "output_hidden_states": True, "output_attentions": True,
                  "chunk_size_feed_forward": 3, "is_encoder_decoder": True,
                  "id2label": {"0": "a", "1": "b", "2": "c"}, "label2id": {"a": 0, "b": 1, "c": 2}, "num_labels": 3,
                  "problem_type": "regression", "bos_token_id": 5, "eos_token_id": [6, 7], "pad_token_id": 8,
                  "sep_token_id": 9, "decoder_start_token_id": 10, "use_cache": False}
"""A value other than the default for each generic key but the dtype (which is the storage layout, modelled)."""


def test_every_generic_key_is_the_base_config_classes():
    """Each is named by the base config class's file, or is a token id (each model's config class defines them)."""
    from explorer.checkpoint.sources import transformers_file

    base = transformers_file("configuration_utils.py").read_text(encoding="utf-8")
    assert [k for k in GENERIC_KEYS if k not in base and not k.endswith("_token_id")] == []
    assert set(GENERIC_VALUES) == set(GENERIC_KEYS) - {"dtype", "torch_dtype"}


@pytest.mark.parametrize("family,slug", [("gemma4", "gemma-4-26b-a4b"), ("qwen3_5", "qwen3.5-27b"),
                                         ("llama", "llama-3.1-8b")])
def test_generic_keys_are_recorded_for_every_family(family, slug, tmp_path):
    """The base config's keys, where the family's config has no field for them (Gemma 4's top-level eos_token_id,
    a wrapper's top-level dtype, NVIDIA's _name_or_path), are recorded as published, not refused."""
    extra = {"_name_or_path": "x/y", "transformers_version": "5.0.0", "eos_token_id": 1, "dtype": "bfloat16"}
    config = {**site_config(slug), **extra}
    if family == "llama":
        config.pop("torch_dtype")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    (tmp_path / "models").mkdir()
    written = add_model(tmp_path, "m", path, "a/b", "unpinned")
    unused = load_model_content(written.parent).checkpoint.config_unused
    assert set(unused) <= set(extra) and "_name_or_path" in unused


def test_a_key_the_reference_reads_is_still_refused():
    raw = {**site_config("minimax-m2.5"), "rope_parameters": {"rope_type": "default", "rope_theta": 5e6}}
    with pytest.raises(ContentError, match="key 'rope_parameters': transformers reads it"):
        classify(FAMILIES["minimax_m2"], raw, "test")


def tiny_logits(family: str, slug: str, extra: dict):
    """The parameter shapes and logits of the family's tiny reference model with `extra` set on its config."""
    import torch

    fam = FAMILIES[family]
    base = fam.build_spec(slug, site_config(slug), "test")
    tiny = fam.build_spec("tiny", fam.tiny_config(base.config), "tiny")
    from explorer.execute import reference

    original = reference.transformers_config
    reference.transformers_config = lambda spec: {**original(spec), **extra}
    try:
        model = tiny_reference_model(tiny)
    finally:
        reference.transformers_config = original
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        out = model(input_ids=ids)
    return {n: tuple(t.shape) for n, t in model.state_dict().items()}, out.logits


@pytest.mark.parametrize("family,slug", [("llama", "llama-3.1-8b"), ("nemotron_h", "nemotron-3-nano-30b-a3b")])
def test_the_generic_keys_change_no_tensor_and_no_output(family, slug):
    """Every generic key set away from its default at once: the tiny reference model has the same tensors and the
    same logits; vocab_size set the same way (a key that does change the model) fails both."""
    import torch

    shapes, logits = tiny_logits(family, slug, {})
    varied_shapes, varied = tiny_logits(family, slug, GENERIC_VALUES)
    assert varied_shapes == shapes
    assert torch.equal(varied, logits)
    changed_shapes, _ = tiny_logits(family, slug, {"vocab_size": 300})
    assert changed_shapes != shapes


def test_legacy_layer_kinds_are_read_as_the_base_class_renames_them():
    """Nemotron 3 Ultra's layers_block_type says "mamba" and "attention", which the base config class renames to
    linear_attention and full_attention on reading: the family reads them so and balances against transformers;
    a kind neither name knows is still refused."""
    family = FAMILIES["nemotron_h"]
    spec = family.build_spec("nano", site_config("nemotron-3-nano-30b-a3b"), "test")
    tiny = {**family.tiny_config(spec.config), "hybrid_override_pattern": None,
            "layers_block_type": ["mamba", "moe", "attention", "mamba"]}
    legacy = family.build_spec("legacy", tiny, "test")
    assert reconcile(legacy, reference_index(legacy).index, reference=True).balanced
    spelled = family.build_spec("pattern", family.tiny_config(spec.config), "test")  # "ME*M": the same layers
    assert reconcile(legacy, reference_index(spelled).index, reference=True).balanced
    with pytest.raises(ContentError, match="key 'layers_block_type': symbol 'mambo'"):
        family.validate({**tiny, "layers_block_type": ["mambo", "moe", "attention", "mamba"]}, "test")
