"""The torch executor: full-size shape traces on meta that must agree with the spec, executable equations
that must agree with transformers, errors that name model, component and step, and the cache."""

from __future__ import annotations

import dataclasses
import resource

import pytest
import torch
from conftest import ROOT, seal_config_values

from explorer.errors import ExecutionError
from explorer.execute.executor import check_equations, execute, model_weights, tiny_spec, trace
from explorer.model.components import mla, moe
from explorer.spec.types import Shape, walk


@pytest.fixture(scope="module")
def specs(builds):
    return {slug: mb.spec for slug, mb in builds.items()}


def test_full_size_trace_records_every_step_with_the_spec_shapes(specs):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    traced = trace(specs["kimi-k2"])
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 500  # a 1T-parameter model traced without allocating its 2 TB of float32 weights
    moe = traced.components["blocks.moe"]
    assert moe.steps["softmax"] == (2, 64, 5, 5)
    assert moe.steps["expert-gate_proj"] == (2, 5, 2048)
    assert moe.steps["q-concat"] == (2, 5, 64, 192)
    assert traced.components[""].outputs == ((2, 5, 163840),)
    steps_in_spec = {(p, s.name) for p, c in _paths(specs["kimi-k2"]) for s in c.steps if s.shape and not s.heading}
    steps_traced = {(p, n) for p, t in traced.components.items() for n in t.steps}
    assert steps_in_spec <= steps_traced


def _paths(spec):
    from explorer.spec.types import path_key

    return [(path_key(a, c), c) for a, c in walk(spec.root)]


def test_deepseek_v3_trace_includes_the_mtp_module(specs):
    traced = trace(specs["deepseek-v3"])
    assert traced.components["mtp"].steps["eh_proj"] == (2, 5, 7168)
    assert traced.components["blocks.moe"].steps["softmax"] == (2, 128, 5, 5)


def test_meta_weights_are_the_reference_models_tensors(builds):
    """The weights the programs run on have the reference's names and shapes (experts stacked), not only its count."""
    from explorer.execute.reference import build_reference_model, reference_state

    mb = builds["kimi-k2"]
    weights = model_weights(mb.spec, "meta")
    assert all(w.is_meta for w in weights.values())
    reference = reference_state(mb.spec, build_reference_model(mb.spec))
    ours = {n: tuple(w.shape) for n, w in weights.items()}
    theirs = {n: tuple(t.shape) for n, t in reference.items()}
    assert ours == theirs


def test_spec_shape_that_the_trace_contradicts_fails(specs):
    spec = specs["kimi-k2"]
    wrong = Shape(spec.root.children[1].children[1].steps[-1].shape.dims[:-1])  # drop the feature dimension
    moe_block = spec.root.children[1].children[1]
    steps = tuple(dataclasses.replace(s, shape=wrong) if s.name == "residual-ffn" else s for s in moe_block.steps)
    bad = _replace_child(spec, "blocks", "moe", dataclasses.replace(moe_block, steps=steps))
    with pytest.raises(ExecutionError) as info:
        trace(bad)
    assert str(info.value) == ("kimi-k2 › blocks.moe › step 'residual-ffn': spec shape [B batch, T positions], "
                               "but rank 3 traced, 2 in the spec")


def _replace_child(spec, group_key, child_key, new_child):
    root = spec.root
    group = next(c for c in root.children if c.key == group_key)
    new_group = dataclasses.replace(group, children=tuple(new_child if c.key == child_key else c
                                                          for c in group.children))
    new_root = dataclasses.replace(root, children=tuple(new_group if c.key == group_key else c for c in root.children))
    return dataclasses.replace(spec, root=new_root)


def test_executor_failure_names_model_component_step_and_what_ran(specs, monkeypatch):
    def broken(*args):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(moe.torch, "einsum", broken)  # the routed experts' einsum, inside every MoE block
    with pytest.raises(ExecutionError) as info:
        trace(specs["kimi-k2"])
    err = info.value
    assert str(err) == ("kimi-k2 › model › step 'blocks': RuntimeError: simulated kernel failure (after: embed)")
    assert err.executed == ("embed",)
    assert isinstance(err.__cause__, RuntimeError)


@pytest.fixture(scope="module")
def tiny_specs(specs):
    return {slug: tiny_spec(spec) for slug, spec in specs.items()}


@pytest.mark.parametrize("slug", ["kimi-k2", "deepseek-v3"])
def test_equations_agree_with_transformers(specs, tiny_specs, slug):
    checks = check_equations(specs[slug], tiny_specs[slug], ("mtp",))
    checked = {p: c for p, c in checks.items() if c.status == "checked"}
    for path in ["", "blocks.moe", "blocks.moe.attn", "blocks.moe.moe", "blocks.moe.moe.router",
                 "blocks.dense.mlp", "blocks.moe.attn.rope", "blocks.dense.attn_norm"]:
        assert path in checked, path
        assert checked[path].max_abs_error < 1e-5, (path, checked[path])
    assert checked["blocks.moe.moe.router"].detail.startswith("same 4 of ")
    assert checks["blocks.moe.attn.scores"].status == "part"
    assert checks["blocks.moe.attn.scores"].part_of == "blocks.moe.attn"
    assert checks["blocks.moe.moe.expert.down_proj"].part_of == "blocks.moe.moe"


def test_tiny_config_keeps_the_routing_structure(tiny_specs):
    """Top-k strictly below the experts, and more groups than topk_group, so selection is really tested."""
    ds = tiny_specs["deepseek-v3"].config
    assert (ds.n_group, ds.topk_group, ds.num_experts_per_tok, ds.routed_scaling_factor) == (4, 2, 4, 2.5)
    assert ds.n_routed_experts == 12 and ds.num_experts_per_tok < ds.topk_group * ds.n_routed_experts // ds.n_group
    kimi = tiny_specs["kimi-k2"].config
    assert (kimi.n_group, kimi.num_experts_per_tok, kimi.routed_scaling_factor) == (1, 4, 2.827)
    assert kimi.n_routed_experts > kimi.num_experts_per_tok


def test_router_that_weights_by_the_bias_is_caught(specs, tiny_specs, monkeypatch):
    """If the correction bias also weighted the experts (a plausible misreading), the check must fail."""
    original = moe.route

    def biased(run, o, x):
        gates, picked = original(run, o, x)
        return gates + run.w("e_score_correction_bias") * (gates > 0), picked

    monkeypatch.setattr(moe, "route", biased)
    with pytest.raises(ExecutionError) as info:
        check_equations(specs["deepseek-v3"], tiny_specs["deepseek-v3"], ("mtp",))
    message = str(info.value)
    assert message.startswith("deepseek-v3 › equation checks: ")
    assert "\n  blocks.moe.moe.router: max |Δ|" in message and "against transformers DeepseekV3TopkRouter" in message
    assert "\n  blocks.moe.moe: max |Δ|" in message and "\n  blocks.moe.moe.shared" not in message


def test_router_without_group_limit_selects_different_experts(specs, tiny_specs, monkeypatch):
    """Ignoring DeepSeek-V3's group limit changes which experts are selected: the check names the step."""
    tiny = tiny_specs["deepseek-v3"]

    def route_ignoring_groups(run, o, x):
        return original(run, dataclasses.replace(o, n_group=1, topk_group=1), x)

    original = moe.route
    monkeypatch.setattr(moe, "route", route_ignoring_groups)
    with pytest.raises(ExecutionError) as info:
        check_equations(specs["deepseek-v3"], tiny, ("mtp",))
    assert ("\n  blocks.moe.moe.router: step 'select' selects different experts from transformers' "
            "DeepseekV3TopkRouter") in str(info.value)


def test_rope_on_half_split_pairs_is_caught(specs, tiny_specs, monkeypatch):
    """Rotating (x_j, x_j+d/2) instead of DeepSeek's adjacent pairs changes attention outputs."""
    def half_split(x, angles, o):
        return original(x, angles, dataclasses.replace(o, pairing="half"))

    original = mla.rotate
    monkeypatch.setattr(mla, "rotate", half_split)
    with pytest.raises(ExecutionError) as info:
        check_equations(specs["kimi-k2"], tiny_specs["kimi-k2"], ("mtp",))
    message = str(info.value)
    assert "\n  blocks.dense.attn: max |Δ|" in message and "against transformers DeepseekV3Attention" in message
    assert "blocks.dense.attn.rope" not in message  # the angles themselves are right; the pairing is not


def test_mtp_is_traced_but_reported_unchecked(builds):
    checks = builds["deepseek-v3"].checks
    assert checks["mtp"].status == "unchecked"
    assert "transformers does not implement this module" in checks["mtp.block.moe"].detail


def test_cache_skips_torch_and_a_changed_config_reruns_only_its_model(bare_project_copy, monkeypatch):
    import re
    import shutil

    from explorer.execute import executor as execute_module
    from explorer.pipeline import Project, build_all

    project_copy = bare_project_copy
    for folder in (project_copy / "content/models").iterdir():  # two models show it; each one more costs torch time
        if folder.name not in ("kimi-k2", "deepseek-v3"):
            shutil.rmtree(folder)
    project = Project(project_copy)
    models = 2
    messages: list[str] = []
    build_all(project, progress=messages.append, jobs=1)
    assert sum("building the reference on meta" in m for m in messages) == models

    def forbidden(*args, **kwargs):
        raise AssertionError("torch stages ran despite a warm cache")

    monkeypatch.setattr(execute_module, "execute", forbidden)
    messages.clear()
    build_all(project, progress=messages.append, jobs=1)
    assert sum("from cache" in m for m in messages) == models

    toml = project_copy / "content/models/kimi-k2/model.toml"
    toml.write_text(re.sub(r"^rope_theta = 50000.0", "rope_theta = 60000.0", toml.read_text(), flags=re.M))
    seal_config_values(toml.parent)  # else refused as an edited value (#18)
    monkeypatch.undo()
    messages.clear()
    build_all(project, progress=messages.append, jobs=1)
    assert "kimi-k2: building the reference on meta, tracing at full size, checking equations" in messages
    assert "deepseek-v3: reference tensors, shape trace and equation checks from cache" in messages


def test_execute_returns_trace_and_checks_for_every_component(specs):
    result = execute(specs["kimi-k2"], ("mtp",))
    paths = {p for p, _ in _paths(specs["kimi-k2"])}
    assert set(result.trace.components) == paths == set(result.checks)


def test_cache_key_covers_every_module_of_the_package(specs, tmp_path, monkeypatch):
    """Issue 14: a change to any module of the package, not only to a listed few, reruns the torch stages."""
    import shutil

    from explorer import digest
    from explorer.execute import cache

    package = tmp_path / "explorer"
    shutil.copytree(digest.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(digest, "PACKAGE", package)
    key = cache.execution_key(specs["kimi-k2"])
    for module in ("views.py", "spec/types.py", "a_new_module.py"):
        path = package / module
        path.write_text((path.read_text() if path.exists() else "") + "\n# changed\n")
        assert cache.execution_key(specs["kimi-k2"]) != key, module
        key = cache.execution_key(specs["kimi-k2"])



def test_checks_pass_and_agree_with_one_and_two_torch_threads(specs, tiny_specs):
    """Issue 18: a reduction split over two threads rounds differently from one; every check must still pass, select
    the same experts and say the same thing, so that nothing a page states but the measured digits depends on it."""
    before = torch.get_num_threads()
    statements = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            checks = check_equations(specs["kimi-k2"], tiny_specs["kimi-k2"], ("mtp",))
            assert all(c.max_abs_error <= c.tolerance for c in checks.values()), threads
            statements.append({p: (c.status, c.reference, c.config, c.detail, c.example and c.example.selected)
                               for p, c in checks.items()})
    finally:
        torch.set_num_threads(before)
    assert statements[0] == statements[1]


def _content_spec(slug: str):
    from explorer.content.model_content import load_model_content
    from explorer.model.families import load_model_spec

    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


ALL_MODELS = sorted(p.name for p in (ROOT / "content/models").iterdir() if (p / "model.toml").exists())


@pytest.mark.parametrize("slug", ["deepseek-v3.2", "nemotron-3-nano-30b-a3b", "qwen3.5-35b-a3b", "gpt-oss-20b"])
def test_a_trace_reusing_runs_inside_parents_equals_each_component_run_alone(slug):
    """The trace reuses a component's run inside its parent where the inputs had its port shapes: every recorded
    shape, input and output must be what running each component alone gives (MLA with sparse attention and MTP,
    Mamba-2, Gated DeltaNet with a vision tower, sinks)."""
    spec = _content_spec(slug)
    assert trace(spec) == trace(spec, reuse_child_runs=False)


@pytest.mark.slow
@pytest.mark.parametrize("slug", ALL_MODELS)
def test_every_models_trace_reusing_runs_equals_each_component_run_alone(slug):
    spec = _content_spec(slug)
    assert trace(spec) == trace(spec, reuse_child_runs=False)


def test_the_trace_reuses_runs_and_checks_what_they_recorded(specs, monkeypatch):
    """Most components are not run a second time; and what a reused run recorded is what the trace checks: a record
    that kept nothing of its own makes the trace fail at the first reused component."""
    import explorer.execute.executor as execute_module
    from explorer.model.components import base

    ran = []
    alone = execute_module.run_component
    monkeypatch.setattr(execute_module, "run_component", lambda *a: ran.append(a[2].key) or alone(*a))
    trace(specs["kimi-k2"])
    components = len(walk(specs["kimi-k2"].root))
    assert len(ran) < components / 2, (len(ran), components)  # 19 of 45: norms and rotary run by helpers, not programs
    monkeypatch.setattr(base._Tee, "__setitem__", lambda self, name, t: self.parent.__setitem__(self.prefix + name, t))
    with pytest.raises(ExecutionError, match="the program records no such step"):
        trace(specs["kimi-k2"])


@pytest.mark.parametrize("slug", ["gpt2", "kimi-k2", "gemma-4-26b-a4b"])
def test_the_reference_built_without_random_fills_is_the_same_reference(slug, monkeypatch):
    """Module constructors' random fills are skipped on meta: every name and shape, tied head included (GPT-2's and
    Gemma 4's heads share the embedding; transformers' no_init_weights would have skipped that tie), is what the
    model built with them gives."""
    from contextlib import nullcontext

    from explorer.execute import reference

    spec = _content_spec(slug)
    unfilled = reference.reference_index(spec)
    monkeypatch.setattr(reference, "_no_random_fill", nullcontext)
    assert unfilled == reference.reference_index(spec)


def test_random_fills_are_restored_after_a_reference_is_built_even_when_it_fails(monkeypatch):
    from explorer.execute import reference

    before = {name: getattr(torch.nn.init, name) for name in reference._FILLS}
    with pytest.raises(RuntimeError, match="config refused"), reference._no_random_fill():
        assert torch.nn.init.kaiming_uniform_ is reference._unfilled
        raise RuntimeError("config refused")
    assert {name: getattr(torch.nn.init, name) for name in reference._FILLS} == before
    weight = torch.nn.Linear(3, 2).weight
    assert weight.abs().sum() > 0  # constructors on CPU fill again


def test_a_child_its_parent_ran_with_other_inputs_is_traced_alone(monkeypatch):
    """A captured run is reused only for inputs of the shapes and dtypes the child's ports make: here GPT-2's
    attention gets float64 at its ports while its block ran it on float32, so the trace runs it alone."""
    import explorer.execute.executor as execute_module

    spec = _content_spec("gpt2")
    made, alone = execute_module.port_tensor, execute_module.run_component

    def float64_for_attention(port, spec, comp, device, generator=None):
        tensor = made(port, spec, comp, device, generator)
        return tensor.double() if comp.key == "attn" and tensor.is_floating_point() else tensor

    ran = []
    monkeypatch.setattr(execute_module, "port_tensor", float64_for_attention)
    monkeypatch.setattr(execute_module, "run_component", lambda *a: ran.append(a[2].key) or alone(*a))
    trace(spec)
    assert "attn" in ran and "c_attn" not in ran  # its own children were captured in its run and reused
