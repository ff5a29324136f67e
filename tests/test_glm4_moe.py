"""GLM-4.7 (glm4_moe) and GLM-4.7-Flash (glm4_moe_lite), issue 33: totals equal transformers' on the meta device,
with the routers' persistent correction biases listed by name; the executed checks at tiny configs of the same
structure (a dense block before an MoE block, partial rotary, MLA with adjacent-pair rotation) pass, and each
deliberately wrong program fails (the shared expert dropped, every feature rotated, the other rotary pairing, the
correction bias ignored, the dense prefix off by one, QK-norm skipped); the recorded configs are trimmed, so every
key they omit is recorded by --add-model in checkpoint.config_defaulted, each with the reference config class's
own default, and an edited list is refused."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest
from conftest import ROOT

from explorer.checkpoint.reconcile import predicted_index, reconcile
from explorer.commands.add_model import add_model
from explorer.content.model_content import load_model_content
from explorer.errors import ContentError, ExecutionError
from explorer.execute.executor import check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index
from explorer.model.account import account
from explorer.model.components import moe
from explorer.model.families import FAMILIES, load_model_spec
from explorer.spec.types import Component, ModelSpec

TOTALS = {"glm-4.7": (352_796_472_320, 89 * 160), "glm-4.7-flash": (29_943_390_976, 46 * 64)}
"""Parameters, and persistent buffers (e_score_correction_bias of every MoE layer: 89 × 160 and 46 × 64)."""
CONFIG_CLASS = {"glm-4.7": "Glm4MoeConfig", "glm-4.7-flash": "Glm4MoeLiteConfig"}


def content_of(slug: str):
    return load_model_content(ROOT / "content/models" / slug)


def spec_of(slug: str) -> ModelSpec:
    return load_model_spec(content_of(slug))


@pytest.fixture(scope="module")
def tiny() -> dict[str, tuple[ModelSpec, ModelSpec]]:
    return {slug: (spec_of(slug), tiny_spec(spec_of(slug))) for slug in TOTALS}


def fails(spec: ModelSpec, tiny_: ModelSpec, where: str) -> None:
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, tiny_)
    assert where in str(info.value), str(info.value)


def changed(spec: ModelSpec, path: str, change) -> ModelSpec:
    """The spec with the component at `path` ("blocks.moe.moe") replaced by change(component)."""
    def walk(comp: Component, keys: list[str]) -> Component:
        if not keys:
            return change(comp)
        return replace(comp, children=tuple(walk(c, keys[1:]) if c.key == keys[0] else c for c in comp.children))
    return replace(spec, root=walk(spec.root, path.split(".")))


# ------------------------------------------------------------------------------------------------- totals

@pytest.mark.parametrize("slug", list(TOTALS))
def test_totals_equal_transformers_on_meta_and_buffers_are_named(slug):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    params, buffers = TOTALS[slug]
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == params
    state = model.state_dict()
    persistent = {n: b.numel() for n, b in model.named_buffers() if n in state}
    assert sum(persistent.values()) == buffers and all(n.endswith("mlp.gate.e_score_correction_bias") for n in persistent)
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)
    by_role = {t.role: t for t in reconcile(spec, predicted_index(spec)).totals}
    assert by_role["buffer"].elements == buffers and by_role["buffer"].parameters == 0


def test_the_dense_prefix_is_the_configs():
    """GLM-4.7's first three blocks are dense (first_k_dense_replace); GLM-4.7-Flash's first one (mlp_layer_types by
    default). One block off does not balance against the reference."""
    spec = spec_of("glm-4.7")
    blocks = {b.key: b for b in spec.root.child("blocks").children}
    assert blocks["dense"].repeat == 3 and blocks["moe"].repeat == 89
    flash = {b.key: b.repeat for b in spec_of("glm-4.7-flash").root.child("blocks").children}
    assert flash == {"dense": 1, "moe": 46}
    family = FAMILIES["glm4_moe"]
    wrong = family.build_spec("bad", {**content_of("glm-4.7").config, "first_k_dense_replace": 2}, "test")
    rec = reconcile(wrong, reference_index(spec).index, reference=True)
    assert not rec.balanced
    assert any(".layers.2.mlp." in name for name in rec.missing + rec.unowned), rec.differences(5)


def test_partial_rotary_and_grouped_query_shapes():
    spec = spec_of("glm-4.7")
    attn = spec.root.child("blocks").child("moe").child("attn")
    rope = attn.child("rope").options
    assert (rope.dim, rope.head_width, rope.unrotated_tail, rope.pairing) == (64, 128, 64, "half")
    assert account(spec).accounts["blocks.moe.attn.q_proj"].per_instance == 5120 * 96 * 128
    assert account(spec).accounts["blocks.moe.attn.k_proj"].per_instance == 5120 * 8 * 128
    flash = spec_of("glm-4.7-flash").root.child("blocks").child("moe").child("attn").child("rope").options
    assert (flash.dim, flash.pairing) == (64, "interleaved")


# ------------------------------------------------------------------------------------------ executed checks

@pytest.mark.parametrize("slug", list(TOTALS))
def test_tiny_checks_pass(tiny, slug):
    _, small = tiny[slug]
    assert [b.key for b in small.root.child("blocks").children] == ["dense", "moe"]
    checks = check_equations(*tiny[slug])
    for path in ("", "blocks.dense.attn", "blocks.moe.attn", "blocks.moe.moe", "blocks.moe.moe.router",
                 "blocks.moe.moe.shared", "blocks.dense.mlp"):
        assert checks[path].status == "checked", (path, checks[path])


@pytest.mark.parametrize("slug", list(TOTALS))
def test_dropping_the_shared_expert_fails(tiny, slug):
    spec, small = tiny[slug]
    bad = changed(small, "blocks.moe.moe", lambda c: replace(c, options=replace(c.options, shared=False)))
    fails(spec, bad, "blocks.moe.moe: max |Δ|")


def test_rotating_every_feature_fails(tiny):
    """GLM-4.7 rotates the first half of each head (partial_rotary_factor 0.5); rotating all of it fails."""
    spec, small = tiny["glm-4.7"]
    rope = small.root.child("blocks").child("moe").child("attn").child("rope").options
    assert rope.unrotated_tail == rope.dim == 8

    def whole(c):
        return replace(c, options=replace(c.options, dim=c.options.head_width, unrotated_tail=0))
    fails(spec, changed(small, "blocks.moe.attn.rope", whole), "blocks.moe.attn: max |Δ|")


def test_the_flash_rotary_pairing_matters(tiny):
    """GLM-4.7-Flash's MLA rotates adjacent pairs (rope_interleave); the two halves instead fail."""
    spec, small = tiny["glm-4.7-flash"]
    bad = changed(small, "blocks.moe.attn.rope", lambda c: replace(c, options=replace(c.options, pairing="half")))
    fails(spec, bad, "blocks.moe.attn: max |Δ|")


@pytest.mark.parametrize("slug", list(TOTALS))
def test_ignoring_the_correction_bias_fails(tiny, monkeypatch, slug):
    spec, small = tiny[slug]
    real = moe.route
    monkeypatch.setattr(moe, "route", lambda run, o, x: real(run, replace(o, correction_bias=False), x))
    fails(spec, small, "moe.router")


def glm45_like(**change) -> dict:
    """GLM-4.7's recorded keys with the ones GLM-4.5-style configs publish beside them (QK-norm, attention biases,
    a rotary base of 10^6, half the head rotated), at 4 layers."""
    raw = {**content_of("glm-4.7").config, "num_hidden_layers": 4, "use_qk_norm": True, "attention_bias": True,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5}}
    return {**raw, **change}


def test_qk_norm_and_attention_biases_are_built_and_checked(monkeypatch):
    """With use_qk_norm and attention_bias set, the q_norm/k_norm gains and the q, k, v biases are counted as the
    reference builds them, and the executed check passes; skipping the QK-norm in the program fails it."""
    family = FAMILIES["glm4_moe"]
    spec = family.build_spec("glm45", glm45_like(), "test")
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced
    attn = account(spec).accounts
    assert attn["blocks.moe.attn.q_norm"].per_instance == 128
    assert attn["blocks.moe.attn.q_proj"].per_instance == 5120 * 96 * 128 + 96 * 128
    small = tiny_spec(spec)
    assert check_equations(spec, small)["blocks.moe.attn"].status == "checked"
    no_norm = changed(small, "blocks.moe.attn", lambda c: replace(c, options=replace(c.options, qk_norm=None)))
    fails(spec, no_norm, "blocks.moe.attn: max |Δ|")


def test_the_prose_deltas_for_qk_norm_and_biases():
    """The GLM-4.7 page says what setting use_qk_norm and attention_bias would add at full size: 92 layers × 2 × 128
    norm gains, and 92 × (96 + 8 + 8) × 128 biases (the mechanism is checked against the reference above)."""
    family, raw = FAMILIES["glm4_moe"], content_of("glm-4.7").config
    base = account(spec_of("glm-4.7")).total
    norm = account(family.build_spec("n", {**raw, "use_qk_norm": True}, "test")).total - base
    bias = account(family.build_spec("b", {**raw, "attention_bias": True}, "test")).total - base
    assert (norm, bias) == (92 * 2 * 128, 92 * (96 + 8 + 8) * 128) == (23_552, 1_318_912)
    prose = (ROOT / "content/models/glm-4.7/prose/index.md").read_text(encoding="utf-8")
    assert f"{norm + bias:,} more parameters ({norm:,} norm gains and {bias:,} biases" in prose.replace("\n", " ")


# ------------------------------------------------------------------------------ keys that took the default

@pytest.mark.parametrize("slug", list(TOTALS))
def test_every_omitted_key_is_recorded_with_the_reference_default(slug):
    """The trimmed file omits the rotary, QK-norm, bias and MTP keys: config_defaulted lists every key the family
    reads that the file omits, and each value the page shows is the one the reference config class ends up with."""
    import transformers

    content = content_of(slug)
    family = FAMILIES[content.meta.family]
    recorded = content.checkpoint.config_defaulted
    assert recorded == family.defaulted_keys(content.config) and "rope_parameters" in recorded
    assert not set(recorded) & set(content.config)
    cls = getattr(transformers, CONFIG_CLASS[slug])
    assert family.reference.config_class == cls.__name__
    published = {k: v for k, v in content.config.items() if k != "architectures"}
    reference = cls(**published)
    spec = spec_of(slug)
    for key in recorded:
        if key == "quantization_config":  # a storage block, no field of the config class: none means unquantized
            assert spec.config.quantization_config is None and not hasattr(reference, key)
            continue
        ours = family.defaulted_value(spec.config, key)
        theirs = getattr(reference, key)
        assert (list(ours) if isinstance(ours, tuple) else ours) == theirs, key


def test_glm47_defaults_include_what_changes_the_count():
    """The defaults that decide the model here: no QK-norm, no attention biases, rope_theta 10^4, half the head
    rotated, one MTP layer declared (not built by transformers: counted apart from the config, issue 35)."""
    content = content_of("glm-4.7")
    family = FAMILIES["glm4_moe"]
    spec = spec_of("glm-4.7")
    shown = {k: family.defaulted_value(spec.config, k) for k in content.checkpoint.config_defaulted}
    assert shown["use_qk_norm"] is False and shown["attention_bias"] is False
    assert shown["rope_parameters"] == {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"}
    assert shown["num_nextn_predict_layers"] == 1
    assert spec.declared_mtp is not None and spec.declared_mtp.count == 1
    assert "whether it stores them is not settled here" in spec.declared_mtp.basis


def test_add_model_records_the_defaulted_keys_and_an_edited_list_is_refused(tmp_path):
    raw = glm45_like()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    toml = add_model(tmp_path / "content", "glm45", path, "org/glm45", "unpinned")
    content = load_model_content(toml.parent)
    family = FAMILIES["glm4_moe"]
    assert content.checkpoint.config_defaulted == family.defaulted_keys(raw)
    assert "use_qk_norm" not in content.checkpoint.config_defaulted  # published here
    assert "n_group" in content.checkpoint.config_defaulted
    load_model_spec(content)
    edited = dataclasses.replace(content, checkpoint=dataclasses.replace(
        content.checkpoint, config_defaulted=tuple(k for k in content.checkpoint.config_defaulted if k != "n_group")))
    with pytest.raises(ContentError) as info:
        load_model_spec(edited)
    assert len(info.value.problems) == 1 and "key 'checkpoint.config_defaulted'" in info.value.problems[0]


def test_flash_refuses_a_first_k_dense_replace_the_reference_ignores():
    """Glm4MoeLiteConfig reads the dense layers from mlp_layer_types, not first_k_dense_replace: a config whose
    first_k_dense_replace disagrees would be drawn with dense blocks the reference does not build."""
    family = FAMILIES["glm4_moe_lite"]
    raw = content_of("glm-4.7-flash").config
    with pytest.raises(ContentError) as info:
        family.validate({**raw, "first_k_dense_replace": 2}, "flash")
    assert "key 'first_k_dense_replace'" in info.value.problems[0]
    with pytest.raises(ContentError) as info:
        family.validate({**raw, "head_dim": 32}, "flash")
    assert "key 'head_dim'" in info.value.problems[0]
    two = family.validate({**raw, "first_k_dense_replace": 2,
                           "mlp_layer_types": ["dense", "dense"] + ["sparse"] * 45}, "flash")
    spec = family.build_spec("two", {**raw, "first_k_dense_replace": 2,
                                     "mlp_layer_types": ["dense", "dense"] + ["sparse"] * 45}, "test")
    assert two.first_k_dense_replace == 2
    assert {b.key: b.repeat for b in spec.root.child("blocks").children} == {"dense": 2, "moe": 45}
    assert account(spec).total == sum(p.numel() for p in build_reference_model(spec).parameters())


@pytest.mark.parametrize("slug", list(TOTALS))
def test_the_model_page_lists_every_defaulted_key(built_site, slug):
    """The page's "Configuration defaults" table has a row per recorded key, and says the checkpoint may differ."""
    import re

    page = (built_site / "models" / slug / "index.html").read_text(encoding="utf-8")
    section = re.search(r'<section id="defaults".*?</section>', page, flags=re.S)
    assert section is not None
    rows = re.findall(r"<tr><td><code>([^<]+)</code></td>", section.group(0))
    assert tuple(rows) == content_of(slug).checkpoint.config_defaulted
    assert "may set any of them otherwise" in section.group(0)
    assert "<td><code>rope_parameters</code></td><td><code>{&#34;rope_theta&#34;: 10000.0" in section.group(0)
