"""The torch executor: trace every component's shapes at full size on the meta device (no weights
allocated), and check every executable equation against transformers at a tiny config on CPU.

Trace: each component's step program (programs.py) runs on meta tensors of the model's real sizes, with
B = 2 and T = 5 standing in for the free dimensions; every recorded shape must match the spec's named
shape, or the build fails naming the model, component and step. Checks: the same programs run on CPU with
the weights of a randomly initialised tiny transformers model of the same family, and their outputs are
compared with the corresponding transformers module's.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .account import evaluate
from .errors import ExecutionError
from .execution import TOLERANCE, ComponentTrace, EquationCheck, Execution, ShapeTrace
from .programs import PROGRAMS, WHOLE_MODEL_PROGRAMS, Run, causal_mask, rotary_angles
from .reference import stacked_state, transformers_config
from .spec.types import Component, ModelSpec, Port, Shape, path_key, walk

FREE_SIZES = {"B": 2, "T": 5}
"""Sizes that stand in for the free dimensions while tracing (distinct, so a swapped axis is caught)."""


# --------------------------------------------------------------------------------------------- weights

def module_prefix(comp: Component, layer: int | None = None) -> str:
    """The reference module a component maps to: the common dotted prefix of its tensors' names."""
    templates = [t.template for _, c in walk(comp) for t in c.tensors]
    if not templates:
        return ""
    parts = [t.split(".") for t in templates]
    common = []
    for segments in zip(*parts):
        if len(set(segments)) != 1:
            break
        common.append(segments[0])
    if len(templates) == 1:
        common = common[:-1]  # a leaf's module, not its weight
    prefix = ".".join(common)
    if layer is not None:
        prefix = prefix.replace("{layer}", str(layer))
    return prefix + "." if prefix else ""


def first_layer(comp: Component) -> int | None:
    for _, c in walk(comp):
        for t in c.tensors:
            for r in t.ranges:
                if r.var == "layer":
                    return r.values[0]
    return None


def model_weights(spec: ModelSpec, device: str, generator: torch.Generator | None = None,
                  dtype: torch.dtype = torch.float32, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every parameter by checkpoint name (those under prefix), routed experts stacked: on meta (free) or random
    on a real device."""
    weights: dict[str, torch.Tensor] = {}
    for _, comp in walk(spec.root):
        for t in comp.tensors:
            if t.role != "parameter" or t.shape is None:
                continue
            shape = [evaluate(s, spec.values) for s in t.shape]
            experts = [r for r in t.ranges if r.var == "expert"]
            if experts:
                shape = [len(experts[0].values), *shape]
            for layer in _layer_values(t):
                name = t.template.replace("{expert}.", "").format(layer=layer)
                if name.startswith(prefix):
                    weights[name] = _tensor(shape, name, device, generator, dtype)
    return weights


def _layer_values(t) -> tuple[int | None, ...]:
    layers = [r for r in t.ranges if r.var == "layer"]
    return layers[0].values if layers else (None,)


def _tensor(shape: list[int], name: str, device: str, generator: torch.Generator | None,
            dtype: torch.dtype) -> torch.Tensor:
    if device == "meta":
        return torch.empty(shape, device="meta", dtype=dtype)
    values = torch.randn(shape, generator=generator, device=device, dtype=dtype) * 0.1
    return values + 1.0 if name.endswith("norm.weight") else values


# ---------------------------------------------------------------------------------------------- inputs

def port_tensor(port: Port, spec: ModelSpec, device: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """A tensor for one input port, with the free dimensions at FREE_SIZES."""
    shape = [FREE_SIZES[d.symbol] if d.size is None else d.size for d in port.shape.dims]
    if port.name in ("input_ids", "next_ids"):
        vocab = spec.values["vocab_size"]
        return (torch.randint(0, int(vocab), shape, generator=generator) if device == "cpu"
                else torch.zeros(shape, dtype=torch.long, device=device))
    if port.name == "positions":
        return torch.arange(shape[0], device=device)
    if port.name == "mask":
        return causal_mask(shape[0], torch.device(device))
    if port.name == "R":
        return rotary_angles(Run(spec.config, {}), torch.arange(shape[0], device=device))  # type: ignore[arg-type]
    if device == "meta":
        return torch.empty(shape, device="meta")
    return torch.randn(shape, generator=generator)


# ----------------------------------------------------------------------------------------------- trace

def label(traced: tuple[int, ...], shape: Shape, free: dict[str, int] = FREE_SIZES) -> str | None:
    """None when a traced shape agrees with the spec's named shape, else what disagrees."""
    if len(traced) != len(shape.dims):
        return f"rank {len(traced)} traced, {len(shape.dims)} in the spec"
    for size, dim in zip(traced, shape.dims):
        want = free[dim.symbol] if dim.size is None else dim.size
        if size != want:
            return f"dimension {dim.display!r} is {size} in the trace"
    return None


def run_component(spec: ModelSpec, ancestors: tuple[Component, ...], comp: Component, weights: dict,
                  inputs: list[torch.Tensor]) -> tuple[Run, list[torch.Tensor]]:
    """Run one component's program; an error names model › component › the step after the last recorded."""
    module = "" if comp.program in WHOLE_MODEL_PROGRAMS else module_prefix(comp, first_layer(comp))
    if "{expert}" in module:  # one routed expert: the first slice of the stacked expert weights
        module = module.replace("experts.{expert}.", "experts.")
        weights = {k: v[0] for k, v in weights.items() if k.startswith(module)}
    run = Run(spec.config, weights, module=module)  # type: ignore[arg-type]
    where = f"{spec.slug} › {path_key(ancestors, comp) or 'model'}"
    try:
        with torch.no_grad():
            outputs = PROGRAMS[comp.program](comp, run, *inputs)
    except Exception as e:
        done = tuple(n for n in run.recorded if not n.startswith("_"))
        after = _next_step(comp, done)
        raise ExecutionError(f"{where} › {after}", f"{type(e).__name__}: {e}", done) from e
    return run, outputs


def _next_step(comp: Component, done: tuple[str, ...]) -> str:
    names = [s.name for s in (comp.steps or comp.equations) if not s.heading]
    pending = [n for n in names if n not in done]
    return f"step '{pending[0]}'" if pending else "after its last step"


def trace(spec: ModelSpec) -> ShapeTrace:
    """Run every component at full size on the meta device and check each recorded shape against the spec."""
    weights = model_weights(spec, "meta")
    components = {}
    for ancestors, comp in walk(spec.root):
        inputs = [port_tensor(p, spec, "meta") for p in comp.inputs]
        run, outputs = run_component(spec, ancestors, comp, weights, inputs)
        components[path_key(ancestors, comp)] = _check_shapes(spec, ancestors, comp, run, inputs, outputs)
    return ShapeTrace("meta", dict(FREE_SIZES), components)


def _check_shapes(spec: ModelSpec, ancestors: tuple[Component, ...], comp: Component, run: Run,
                  inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> ComponentTrace:
    where = f"{spec.slug} › {path_key(ancestors, comp) or 'model'}"
    steps = {}
    for step in comp.steps + comp.equations:
        if step.heading or step.shape is None:
            continue
        if step.name not in run.recorded:
            raise ExecutionError(f"{where} › step '{step.name}'", "the program records no such step",
                                 tuple(run.recorded))
        traced = tuple(run.recorded[step.name].shape)
        problem = label(traced, step.shape)
        if problem:
            raise ExecutionError(f"{where} › step '{step.name}'", f"spec shape {step.shape.display}, but {problem}")
        steps[step.name] = traced
    for port, tensor in zip(comp.outputs, outputs):
        problem = label(tuple(tensor.shape), port.shape)
        if problem:
            raise ExecutionError(f"{where} › output {port.name}", f"spec shape {port.shape.display}, but {problem}")
    return ComponentTrace(tuple(tuple(t.shape) for t in inputs), tuple(tuple(t.shape) for t in outputs), steps)


# ---------------------------------------------------------------------------------------------- checks

def tiny_hyperparameters(config) -> dict:
    """A tiny config of the same family that keeps the routing structure (groups, top-k, scaling, YaRN)."""
    per_group = max(2, math.ceil(config.num_experts_per_tok / config.topk_group))
    raw = dataclasses.asdict(config)
    raw.update(
        vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=min(config.first_k_dense_replace, 1) + 1, first_k_dense_replace=min(config.first_k_dense_replace, 1),
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=config.n_group * per_group,
        num_nextn_predict_layers=min(config.num_nextn_predict_layers, 1),
        max_position_embeddings=int(64 * config.rope_scaling.factor), bos_token_id=0, eos_token_id=1,
        rope_scaling={**raw["rope_scaling"], "original_max_position_embeddings": 64},
    )
    return raw


def tiny_label(spec: ModelSpec) -> str:
    c = spec.config
    return (f"tiny config: d {c.hidden_size}, {c.num_attention_heads} heads, {c.n_routed_experts} experts in "  # type: ignore[attr-defined]
            f"{c.n_group} group{'s' if c.n_group > 1 else ''}, top {c.num_experts_per_tok}, {c.num_hidden_layers} "  # type: ignore[attr-defined]
            f"blocks, float32 random weights")


def _tiny_reference(spec: ModelSpec):
    """A randomly initialised tiny transformers model of the family, float32, eager attention."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # the tiny config trips warnings about token ids and context length
    torch.manual_seed(0)
    config = DeepseekV3Config(**transformers_config(spec))
    config._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1 + (1.0 if name.endswith("norm.weight") else 0.0))
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):  # a non-zero bias, so "bias steers selection only" is exercised
                layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(layer.mlp.gate.e_score_correction_bias.shape,
                                                                         generator=generator) * 0.05)
    return model


def check_equations(spec: ModelSpec, tiny: ModelSpec, not_built: tuple[str, ...] = ()) -> dict[str, EquationCheck]:
    """Compare each component's program with transformers at the tiny config, by component path.

    Components under not_built (modules transformers does not implement) are reported unchecked.
    """
    import transformers

    model = _tiny_reference(tiny)
    weights = stacked_state(model)
    version = transformers.__version__
    label_text = tiny_label(tiny)
    checks: dict[str, EquationCheck] = {}
    failures: list[str] = []
    enclosing: list[tuple[str, str]] = []
    for ancestors, comp in walk(tiny.root):
        path = path_key(ancestors, comp)
        enclosing = [(p, s) for p, s in enclosing if path.startswith(p + ".") or p == ""]
        if any(path == n or path.startswith(n + ".") for n in not_built):
            checks[path] = EquationCheck("unchecked", detail="transformers does not implement this module; the "
                                         "same step programs are checked on the main blocks")
            continue
        try:
            result = _check_one(tiny, model, weights, ancestors, comp)
        except _Mismatch as e:
            failures.append(f"{path or 'model'}: {e}")
            continue
        if result is None:
            parent = next((p for p, status in reversed(enclosing) if status == "checked"), None)
            result = (EquationCheck("part", part_of=parent) if parent is not None else
                      EquationCheck("unchecked", detail="no transformers module computes it on its own"))
        else:
            error, detail, module = result
            if error > TOLERANCE:
                failures.append(f"{path or 'model'}: max |Δ| {error:.3g} against transformers {module} exceeds "
                                f"the tolerance {TOLERANCE:g}")
            result = EquationCheck("checked", f"transformers {version} {module}", label_text, error, TOLERANCE, detail)
        enclosing.append((path, result.status))
        checks[path] = result
    if failures:
        raise ExecutionError(f"{spec.slug} › equation checks", "\n  " + "\n  ".join(failures))
    return checks


class _Mismatch(Exception):
    """A comparison that is not a number: the router selected different experts."""


def _check_one(tiny: ModelSpec, model, weights: dict, ancestors: tuple[Component, ...], comp: Component):
    """(max |Δ|, detail, reference class) for one component, or None when no module stands for it alone."""
    module_path = _reference_path(comp)
    if module_path is None:
        return None
    try:
        ref = model.get_submodule(module_path.rstrip(".")) if module_path else model
    except AttributeError:
        return None
    generator = torch.Generator().manual_seed(2)
    inputs = [port_tensor(p, tiny, "cpu", generator) for p in comp.inputs]
    run, outputs = run_component(tiny, ancestors, comp, weights, inputs)
    with torch.no_grad():
        ours, theirs, detail = _call_reference(comp, ref, model, inputs, run, outputs[0])
    error = float((ours.float() - theirs.float()).abs().max())
    return error, detail, type(ref).__name__


def _reference_path(comp: Component) -> str | None:
    if comp.program in ("scores", "stack", "mtp"):
        return None
    if comp.program == "rope":
        return "model.rotary_emb"
    prefix = module_prefix(comp, first_layer(comp))
    return None if "{expert}" in prefix else prefix


def _call_reference(comp: Component, ref, model, inputs: list[torch.Tensor], run: Run, ours: torch.Tensor):
    """Call the transformers module the way its parent does; return (ours, theirs, detail) to compare."""
    kind = comp.program
    if kind in ("attention", "block"):
        x, _, M = inputs
        T = x.shape[1]
        cos, sin = model.model.rotary_emb(x, torch.arange(T)[None].expand(x.shape[0], T))
        kwargs = {"position_embeddings": (cos, sin), "attention_mask": M[None, None]}
        out = ref(hidden_states=x, **kwargs) if kind == "attention" else ref(x, **kwargs)
        return ours, out[0] if isinstance(out, tuple) else out, "rotary angles from our YaRN program"
    if kind == "rope":
        (positions,) = inputs
        cos, sin = ref(torch.zeros(1, positions.shape[0], 1), positions[None])
        pairs = cos.shape[-1] // 2
        theirs = torch.cat([cos[0, :, :pairs], sin[0, :, :pairs]], dim=-1)
        return torch.cat([ours.cos(), ours.sin()], dim=-1), theirs, f"cos and sin of {positions.shape[0]} × {pairs} angles"
    if kind == "router":
        (x,) = inputs
        _, their_weights, their_idx = ref(x)
        ours_sel = run.recorded["select"].reshape(-1, run.recorded["select"].shape[-1])
        their_sel = torch.zeros_like(ours_sel).scatter(-1, their_idx, 1.0)
        if not torch.equal(ours_sel, their_sel):
            raise _Mismatch("step 'select' selects different experts from transformers' DeepseekV3TopkRouter")
        gates = torch.zeros_like(ours_sel).scatter(-1, their_idx, their_weights)
        return ours.reshape(gates.shape), gates, f"same experts selected for all {ours_sel.shape[0]} tokens"
    if kind == "model":
        (ids,) = inputs
        return ours, ref(ids).logits, "logits of the whole model"
    (x,) = inputs
    return ours, ref(x), ""


def execute(spec: ModelSpec, not_built: tuple[str, ...] = ()) -> Execution:
    """Trace the model at full size on meta, then check its equations at a tiny config on CPU."""
    from .spec import FAMILIES

    tiny_raw = tiny_hyperparameters(spec.config)
    tiny = FAMILIES[spec.family].build_spec(spec.slug, tiny_raw, f"{spec.slug}: tiny config")
    return Execution(trace(spec), check_equations(spec, tiny, not_built))
