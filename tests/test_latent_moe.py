"""The latent mixture of experts (explorer/model/components/latent_moe.py) of Nemotron 3 Super and Ultra (issue 32):
their totals equal transformers' on the meta device tensor by tensor; a layer's parameters follow the part's formula,
counted here from the config alone; the part's program equals transformers' NemotronHMoE on a tiny config, and each
deliberately wrong latent MoE (a projection dropped, the router reading the latent token) fails; a family that ignores moe_latent_size is unbalanced; MTP modules, which transformers does not build, are
noted and not counted."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import ROOT

from explorer.checkpoint.reconcile import reconcile
from explorer.content.model_content import load_model_content
from explorer.errors import ExecutionError
from explorer.execute.executor import check_equations, tiny_spec
from explorer.execute.reference import build_reference_model, reference_index, reference_state, tiny_reference_model
from explorer.model.account import account
from explorer.model.components import PROGRAMS, Run, latent_moe
from explorer.model.components.check_words import OWN_ROUTING
from explorer.model.families import FAMILIES, load_model_spec
from explorer.model.families.nemotron_h import pattern_of
from explorer.spec.types import ModelSpec

SUPER, ULTRA = "nemotron-3-super-120b-a12b", "nemotron-3-ultra-550b-a55b"
FAMILY = FAMILIES["nemotron_h"]


def spec_of(slug: str) -> ModelSpec:
    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


@pytest.fixture(scope="module")
def super_tiny() -> tuple[ModelSpec, ModelSpec]:
    spec = spec_of(SUPER)
    return spec, tiny_spec(spec)


def moe_of(spec: ModelSpec):
    return spec.root.child("blocks").child("moe").child("moe")


# ------------------------------------------------------------------------------------------------- totals

@pytest.mark.parametrize("slug,total,buffers", [(SUPER, 120_668_687_360, 40 * 512), (ULTRA, 549_308_968_960, 48 * 512)])
def test_totals_equal_transformers_on_meta(slug, total, buffers):
    spec = spec_of(slug)
    model = build_reference_model(spec)
    assert account(spec).total == sum(p.numel() for p in model.parameters()) == total
    assert sum(b.numel() for b in model.buffers()) == buffers  # the routers' correction biases
    rec = reconcile(spec, reference_index(spec).index, reference=True)
    assert rec.balanced, rec.differences(5)


@pytest.mark.parametrize("slug", [SUPER, ULTRA])
def test_a_latent_moe_layer_follows_the_formula(slug):
    """Per MoE layer, from the config alone: the router E·d, both latent projections d·ℓ, E experts of 2·ℓ·I and the
    shared expert 2·d·I_sh; the reference's own module holds as many."""
    spec = spec_of(slug)
    c = spec.config
    d, lat, inter, E = c.hidden_size, c.moe_latent_size, c.moe_intermediate_size, c.n_routed_experts
    expected = E * d + 2 * d * lat + E * 2 * lat * inter + 2 * d * c.moe_shared_expert_intermediate_size
    assert account(spec).accounts["blocks.moe.moe"].per_instance == expected
    layer = pattern_of(c).indices("moe")[0]
    module = build_reference_model(spec).model.layers[layer].mixer
    assert sum(p.numel() for p in module.parameters()) == expected
    assert tuple(module.experts.up_proj.shape) == (E, inter, lat)


def test_active_parameters_count_the_latent_projections_for_every_token():
    """Only the experts a token does not pick are left out: the latent projections run for every token."""
    from explorer.figures.model_figures import derive

    spec = spec_of(SUPER)
    c = spec.config
    got = {f.key: f.value for f in derive(spec, account(spec), None).figures}
    idle = pattern_of(c).count("moe") * (c.n_routed_experts - c.num_experts_per_tok) * 2 * c.moe_latent_size \
        * c.moe_intermediate_size
    assert got["active_parameters"] == 120_668_687_360 - idle == 12_770_216_960
    assert got["active_parameters_no_embedding"] == 12_770_216_960 - c.vocab_size * c.hidden_size


def test_mtp_modules_are_counted_apart_not_built():
    """Ultra's one MTP module (attention, MoE) is declared beside the tree, never in it or in the reference, and
    holds this family's own attention and MoE layers plus enorm, hnorm, eh_proj (2 × hidden_size → hidden_size)
    and a final RMSNorm: one main layer of each kind plus 2·d² + 3·d."""
    spec = spec_of(ULTRA)
    assert spec.config.num_nextn_predict_layers == 1
    assert not any("mtp" in c.key for c in spec.root.children)
    assert not any(n.startswith("mtp") for n in build_reference_model(spec).state_dict())
    d = spec.declared_mtp
    assert d is not None and d.count == 1 and [b.key for b in d.module.children[3:5]] == ["attention", "moe"]
    reference = {n: p.numel() for n, p in build_reference_model(spec).named_parameters()}
    layer_of = {k: next(i for i, t in enumerate(pattern_of(spec.config).kinds) if t == k) for k in ("attention", "moe")}
    one_each = sum(v for n, v in reference.items() for i in layer_of.values() if n.startswith(f"model.layers.{i}."))
    h = spec.config.hidden_size
    assert account(spec).declared_mtp == one_each + 2 * h * h + 3 * h


def test_an_mtp_module_without_its_own_tensors_fails():
    """The same module without eh_proj does not hold what the layout gives."""
    spec = spec_of(ULTRA)
    d = spec.declared_mtp
    assert d is not None
    without = replace(d, module=replace(d.module, children=tuple(c for c in d.module.children if c.key != "eh_proj")))
    assert account(replace(spec, declared_mtp=without)).declared_mtp != account(spec).declared_mtp


def test_the_mtp_pattern_leaves_the_reference_tree_unchanged(super_tiny):
    """mtp_hybrid_override_pattern (not handed to the reference): NemotronHConfig builds the same tree whatever it
    says, as transformers builds no MTP module."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    from explorer.execute.reference import transformers_config

    _, tiny = super_tiny
    config = transformers_config(tiny)
    assert config["num_nextn_predict_layers"] == 1
    shapes = []
    for extra in ({}, {"mtp_hybrid_override_pattern": "*E"}, {"mtp_hybrid_override_pattern": "*E-M"}):
        with torch.device("meta"):
            model = NemotronHForCausalLM(NemotronHConfig(**config, **extra))
        shapes.append({n: tuple(t.shape) for n, t in model.state_dict().items()})
    assert shapes[0] == shapes[1] == shapes[2]


# ------------------------------------------------------------------------------------------ executed checks

def test_the_latent_moe_is_checked_against_transformers(super_tiny):
    spec, tiny = super_tiny
    assert 0 < tiny.values["moe_latent_size"] < tiny.values["hidden_size"]
    checks = check_equations(spec, tiny)
    for path in ("blocks.moe.moe", "blocks.moe.moe.fc1_latent_proj", "blocks.moe.moe.fc2_latent_proj",
                 "blocks.moe.moe.router", "blocks.moe.moe.shared"):
        assert checks[path].status == "checked", path
    assert checks["blocks.moe.moe.expert"].status == "part"
    assert checks["blocks.moe.moe"].detail == OWN_ROUTING  # no expert choice handed to either side


def test_the_program_equals_the_reference_module(super_tiny):
    """Over 13 positions and two sequences, against NemotronHMoE directly."""
    _, tiny = super_tiny
    model = tiny_reference_model(tiny)
    weights = reference_state(tiny, model)
    layer = pattern_of(tiny.config).indices("moe")[0]
    x = torch.randn(2, 13, tiny.values["hidden_size"], generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        (ours,) = PROGRAMS["latent_relu2_moe"](moe_of(tiny), Run(weights, module=f"backbone.layers.{layer}.mixer."), x)
        theirs = model.model.layers[layer].mixer(x)
    assert theirs.abs().max() > 1e-2
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name, wrong", [
    ("into_latent", lambda comp, run, x: x[..., :48]),  # the first 48 features instead of the projection
    ("out_of_latent", lambda comp, run, y: torch.nn.functional.pad(y, (0, 16))),  # zero-padded back to 64
])
def test_a_latent_moe_without_a_projection_fails(super_tiny, monkeypatch, name, wrong):
    spec, tiny = super_tiny
    assert tiny.values["moe_latent_size"] == 48 and tiny.values["hidden_size"] == 64
    monkeypatch.setattr(latent_moe, name, wrong)
    with pytest.raises(ExecutionError, match="blocks.moe"):
        check_equations(spec, tiny)


def test_a_router_reading_the_latent_token_fails(super_tiny, monkeypatch):
    """Routing on the projected token (as some descriptions put it) is not what the reference computes: with the
    router's weight cut to the latent width it selects other experts, and the check fails."""
    spec, tiny = super_tiny
    original = latent_moe.route

    def route_on_latent(run, o, x):
        x_lat = torch.nn.functional.linear(x, run.weights[run.module.replace("gate.", "fc1_latent_proj.weight")])
        w = run.weights[run.module + "weight"][:, :x_lat.shape[-1]]
        view = Run({**run.weights, run.module + "weight": w}, run.recorded, run.prefix, run.module)
        return original(view, o, x_lat)

    monkeypatch.setattr(latent_moe, "route", route_on_latent)
    with pytest.raises(ExecutionError, match="blocks.moe"):
        check_equations(spec, tiny)


# ------------------------------------------------------------------------------------------ the family

def test_a_family_that_ignores_the_latent_width_is_unbalanced():
    """Built as if moe_latent_size were null (experts at hidden_size, no projections), the tree no longer matches
    transformers' tensor by tensor, at full size."""
    spec = spec_of(SUPER)
    raw = {**load_model_content(ROOT / "content/models" / SUPER).config}
    ignoring = FAMILY.build_spec("ignoring", {**raw, "moe_latent_size": None}, "test")
    rec = reconcile(ignoring, reference_index(spec).index, reference=True)
    assert not rec.balanced
    assert any("fc1_latent_proj" in n for n in rec.unowned)


def test_a_non_positive_latent_width_is_refused_naming_the_key():
    from explorer.errors import ContentError

    raw = {**load_model_content(ROOT / "content/models" / SUPER).config, "moe_latent_size": 0}
    with pytest.raises(ContentError, match="key 'moe_latent_size': must be an integer in 1..1,000,000, got 0"):
        FAMILY.validate(raw, "test")


def test_nano_with_an_mtp_module_and_no_latent_width_builds_as_nano():
    """Nemotron-3.5-Lightning-30B-A3B's recorded config is Nano's architecture with a null moe_latent_size, one MTP
    module (attention, MoE) and 1,048,576 positions: the same 31,577,937,344 parameters as transformers counts, the
    MTP module counted apart and not built."""
    raw = {**load_model_content(ROOT / "content/models/nemotron-3-nano-30b-a3b").config, "moe_latent_size": None,
           "num_nextn_predict_layers": 1, "mtp_layers_block_type": ["attention", "moe"],
           "max_position_embeddings": 1_048_576}
    spec = FAMILY.build_spec("lightning", raw, "test")
    assert account(spec).total == sum(p.numel() for p in build_reference_model(spec).parameters()) == 31_577_937_344
    assert spec.declared_mtp is not None and spec.declared_mtp.count == 1
    assert reconcile(spec, reference_index(spec).index, reference=True).balanced
