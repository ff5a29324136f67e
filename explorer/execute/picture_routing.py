"""The lit experts of the whole-model picture: one example token routed by the model's own router program, at full
size (every expert, the real k, groups, biases and scoring), on the CPU, for one layer.

The checkpoint's router weights are not loaded (the site reads tensor headers, not weights), so the router runs on
seeded random weights and a seeded random hidden state: the picture shows how many experts, and by which rule, a
token gets, not which ones the trained model would choose, and says so. A router whose program has no worked
example (or needs a token-id table, as hash routing does) is skipped; a model with none gets no routing, and the
picture then lights nothing rather than pretend. Cached beside the torch stages, keyed as they are.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from explorer.execute import cache
from explorer.execute.cache_seal import unsealed
from explorer.spec.types import Component, ModelSpec, path_key, walk

SEED = 0


@dataclass(frozen=True, slots=True)
class PictureRouting:
    """One token's routing at full size in one layer."""

    layer: int
    """The layer routed (0-based)."""
    path: str
    """The router's page (component path)."""
    experts: int
    selected: tuple[int, ...]
    """The experts selected (0-based, in index order)."""


def picture_routing(spec: ModelSpec, cache_dir: Path | None) -> PictureRouting | None:
    """The routing the picture lights, from the cache where current, else run (imports torch)."""
    path = cache_dir / f"{spec.slug}-picture-{cache.execution_key(spec)}.json" if cache_dir is not None else None
    text = unsealed(path, cache.ENTRY_LIMIT) if path is not None else None
    if text is not None:  # else absent, or not as the build wrote it (an edited selection): recomputed
        try:
            data = json.loads(text)
            cached = None if data is None else PictureRouting(int(data["layer"]), str(data["path"]),
                                                              int(data["experts"]),
                                                              tuple(int(i) for i in data["selected"]))
            if cached == _expected_shape(spec, cached):
                return cached
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            pass  # a damaged or edited entry is recomputed
    routing = route_example(spec)
    if path is not None:
        cache.write_sealed(path, json.dumps(asdict(routing) if routing else None, sort_keys=True),
                           f"{spec.slug}-picture-*.json", lambda name: name != path.name)
    return routing


def _expected_shape(spec: ModelSpec, cached: PictureRouting | None) -> PictureRouting | None:
    """The cached routing where it agrees with everything the spec states without running torch: the first
    routed layer and its router's page, the router's expert count, and a selection of distinct experts in range,
    in index order, no more than its k; else a routing that differs from it, so that the entry is recomputed (an
    edited entry published "layer 99" or expert 10,000 of 384, issue 37)."""
    routers = _routers(spec, _first_layer)
    if not routers:
        return None
    layer, ancestors, router = routers[0]
    experts, k = getattr(router.options, "experts", None), getattr(router.options, "k", None)
    if cached is None:
        return PictureRouting(layer, path_key(ancestors, router), -1, ())  # a routed model cached as unrouted
    from explorer.model.account import evaluate

    experts, k = (int(evaluate(v, spec.values)) if v is not None else None for v in (experts, k))
    selected = cached.selected
    ok = (list(selected) == sorted(set(selected)) and all(0 <= i < (experts or 0) for i in selected)
          and 0 < len(selected) <= (k if k is not None else len(selected)))
    return PictureRouting(layer, path_key(ancestors, router), experts if experts is not None else -1,
                          selected if ok else (-1,))


def _first_layer(comp: Component) -> int | None:
    """execute.first_layer, without importing torch: the first layer a component's tensors are stored at."""
    return next((r.values[0] for _, c in walk(comp) for t in c.tensors for r in t.ranges if r.var == "layer"),
                None)


def is_router(comp: Component) -> bool:
    """Whether the component is a router: its one output is the gates over every expert (its options' `experts`)."""
    return [p.name for p in comp.outputs] == ["gates"] and hasattr(comp.options, "experts")


def _routers(spec: ModelSpec, first_layer=None) -> list[tuple[int, tuple[Component, ...], Component]]:
    """(first layer, ancestors, router) for each router of the layer stack, by layer, that computes its gates from
    the hidden state alone (a hash router also reads token ids, from a table that random weights cannot stand in
    for)."""
    if first_layer is None:
        from explorer.execute.executor import first_layer

    found = []
    for ancestors, comp in walk(spec.root):
        if is_router(comp) and len(comp.inputs) == 1 and any(a.key == "blocks" for a in ancestors):
            layer = first_layer(comp)
            if layer is not None:
                found.append((layer, ancestors, comp))
    return sorted(found, key=lambda f: f[0])


@dataclass(frozen=True, slots=True)
class SeededRouter:
    """The router run for the picture, and the seeded weights and input it runs on."""

    layer: int
    ancestors: tuple[Component, ...]
    router: Component
    weights: dict[str, Any]
    """Checkpoint name -> tensor, the router's own tensors only."""
    inputs: list[Any]


def seeded_router(spec: ModelSpec) -> SeededRouter | None:
    """The first routed layer's router with seeded random weights and hidden state (None for a dense model)."""
    routers = _routers(spec)
    if not routers:
        return None
    import torch

    from explorer.execute.executor import port_tensor
    from explorer.model.account import evaluate

    layer, ancestors, router = routers[0]
    generator = torch.Generator().manual_seed(SEED)
    weights = {}
    for t in router.tensors:  # the router's own tensors only: its module may hold the experts too (MiniMax-M2)
        if t.shape is not None and t.role in ("parameter", "buffer"):
            shape = [int(evaluate(d, spec.values)) for d in t.shape]
            weights[t.template.format(layer=layer)] = torch.randn(shape, generator=generator) * 0.1
    inputs = [port_tensor(p, spec, router, "cpu", generator) for p in router.inputs]
    return SeededRouter(layer, ancestors, router, weights, inputs)


def route_example(spec: ModelSpec) -> PictureRouting | None:
    """Run the first routed layer's router program on seeded weights and input; the last token's selection."""
    seeded = seeded_router(spec)
    if seeded is None:
        return None
    from explorer.execute.executor import run_component

    _, outputs = run_component(spec, seeded.ancestors, seeded.router, seeded.weights, seeded.inputs)
    gates = outputs[0][0, -1]  # the last token of the first sequence: [experts]
    return PictureRouting(seeded.layer, path_key(seeded.ancestors, seeded.router), int(gates.shape[-1]),
                          tuple(int(i) for i in gates.nonzero().flatten()))
