"""What every library component shares: the build context a family hands it, the run a program records into,
and the registry of programs and reference calls.

A library component is a function `ctx, ... -> Component` (the spec: equations, named shapes, tensors with
their storage, the parameter formula through the tensors' sympy shapes, citations), a program registered
under the component's `program` name (`@program("rmsnorm")`, the same equations in torch, one recorded tensor
per step), and, where the reference computes it with a module of its own, a reference call
(`@reference_call("rmsnorm")`) saying how to call that module and what to compare.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import sympy

from explorer.model.components.part_facts import declare
from explorer.spec.storage import Dense, Storage
from explorer.spec.types import Citation, Component, Dim, IndexRange, Layout, Port, Shape, Step, TensorSpec

if TYPE_CHECKING:
    import torch

B = Dim("batch", symbol="B")
T = Dim("positions", symbol="T")


@dataclass(frozen=True, slots=True)
class Reference:
    """Where the reference implementation of a family lives, for citations ("LlamaRMSNorm" in its file)."""

    file: str
    """Path inside the transformers package, e.g. "models/llama/modeling_llama.py"."""
    prefix: str
    """Class-name prefix, e.g. "Llama"."""

    def cite(self, claim: str, symbol: str, prefixed: bool = True) -> Citation:
        """A transformers citation of `{prefix}{symbol}` ("RMSNorm" -> "LlamaRMSNorm") in the family's file; with
        prefixed=False, a module-level function named as is ("repeat_kv")."""
        return Citation(claim, "transformers", (self.prefix if prefixed else "") + symbol, self.file)


class Ctx:
    """One model's sizes and storage policy, handed by the family to every library component it composes."""

    def __init__(self, values: dict[str, int | float], labels: dict[str, str], reference: Reference,
                 dtype: str, quantized: Storage | None = None,
                 citations: dict[str, tuple[Citation, ...]] | None = None) -> None:
        self.values = values
        """Config symbol -> value (every symbol a formula may use)."""
        self.labels = labels
        """Config symbol -> the short name shown in shapes ("hidden_size" -> "d")."""
        self.reference = reference
        self.dtype = dtype
        """Stored dtype of unquantized weights (from torch_dtype)."""
        self.quantized = quantized
        """Storage of the weights the checkpoint quantizes (None: nothing is)."""
        self.part_citations = citations or {}
        """Library part -> the citations a family gives every instance of it (e.g. its own checkpoint code)."""
        self.symbols = {name: sympy.Symbol(name, positive=True, integer=True) for name in values}

    def citations(self, part: str, default: tuple[Citation, ...]) -> tuple[Citation, ...]:
        """The family's citations for a library part, or the part's default ones."""
        return self.part_citations.get(part, default)

    def sym(self, name: str) -> sympy.Symbol:
        return self.symbols[name]

    def size(self, expr: sympy.Expr | int | str) -> int:
        """The value of a size formula (or a symbol name) under this config."""
        if isinstance(expr, str):
            expr = self.sym(expr)
        expr = sympy.sympify(expr)
        return int(expr.xreplace({s: self.values[s.name] for s in expr.free_symbols}))  # see account._evaluate

    def dim(self, name: str) -> Dim:
        return Dim(self.labels[name], int(self.values[name]))

    def shape(self, *dims: Dim | str) -> Shape:
        return Shape(tuple(self.dim(d) if isinstance(d, str) else d for d in dims))

    def tokens(self, *dims: Dim | str) -> Shape:
        """[B batch, T positions, ...]."""
        return self.shape(B, T, *dims)

    def tensor(self, template: str, ranges: tuple[IndexRange, ...], shape: tuple[sympy.Expr, ...],
               quantize: bool = False, tied_to: str = "", layout: Layout = "out_in") -> TensorSpec:
        """A parameter tensor, stored dense in the model's dtype unless the checkpoint quantizes it."""
        storage = self.quantized if quantize and self.quantized is not None else Dense(self.dtype)
        return TensorSpec(template, shape, ranges, storage=storage, tied_to=tied_to, layout=layout)


# ---------------------------------------------------------------------------------------------- notation

def stream(name: str, s: str) -> str:
    """Colour a symbol by its stream (q, k, v, context) in the page's equations."""
    return r"{\color{stream-" + name + "}{" + s + "}}"


def q(s: str) -> str:
    return stream("q", s)


def k(s: str) -> str:
    return stream("k", s)


def v(s: str) -> str:
    return stream("v", s)


def ctx_colour(s: str) -> str:
    return stream("context", s)


def fmt_num(x: float) -> str:
    """A decimal for equations: integers plain, others with 4 significant digits (2.827, 0.1309)."""
    return str(int(x)) if float(x).is_integer() else f"{x:.4g}"


def fmt_eps(eps: float) -> str:
    """1e-06 -> 10^{-6}; 0.001 -> 0.001."""
    if eps >= 1e-4:
        return fmt_num(eps)
    exponent = math.log10(eps)
    return f"10^{{{int(round(exponent))}}}" if abs(exponent - round(exponent)) < 1e-9 else f"{eps:.3g}"


def prefixed(steps: tuple[Step, ...], prefix: str) -> tuple[Step, ...]:
    """Steps spliced into a parent's list keep unique anchors: "expert-gate_proj", "shared-gate_proj"."""
    return tuple(replace(s, name=prefix + s.name) for s in steps)


def layers(indices: tuple[int, ...]) -> tuple[IndexRange, ...]:
    return (IndexRange("layer", indices),)


def layer_label(indices: tuple[int, ...]) -> str:
    """Block numbers counted from 0, as the tensor names count them (model.layers.0 is the first): "block 0",
    "blocks 1–60", "10 blocks"."""
    if not indices:
        return "no blocks"
    if len(indices) == 1:
        return f"block {indices[0]}"
    contiguous = indices == tuple(range(indices[0], indices[-1] + 1))
    return f"blocks {indices[0]}–{indices[-1]}" if contiguous else f"{len(indices)} blocks"


def plural(n: int, noun: str, nouns: str = "") -> str:
    return f"{n:,} {noun if n == 1 else (nouns or noun + 's')}"


def leaf(key: str, title: str, code: str, description: str, x: Port | tuple[Port, ...], y: Port,
         step: Step, program: str, **kw: Any) -> Component:
    """A component whose single step is its headline equation."""
    inputs = x if isinstance(x, tuple) else (x,)
    return Component(key=key, title=title, kind=kw.pop("kind", "learned"), code=code, description=description,
                     inputs=inputs, outputs=(y,), equations=(step,), steps=(step,), program=program, **kw)


# ------------------------------------------------------------------------------------------------- runs

@dataclass
class Run:
    """One execution: the weights, and the steps recorded so far (in order)."""

    weights: dict[str, torch.Tensor]
    recorded: dict[str, torch.Tensor] = field(default_factory=dict)
    prefix: str = ""
    """Prepended to recorded names (a parent splicing a child's steps, e.g. "expert-")."""
    module: str = ""
    """Prefix of weight names for the current component ("model.layers.3.self_attn.")."""

    def rec(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        self.recorded[self.prefix + name] = tensor
        return tensor

    def w(self, name: str) -> torch.Tensor:
        return self.weights[self.module + name]

    def has(self, name: str) -> bool:
        return self.module + name in self.weights

    def child(self, module: str = "", prefix: str = "") -> Run:
        """A view for a sub-module: same record, deeper weight prefix, optional step-name prefix."""
        return Run(self.weights, self.recorded, self.prefix + prefix, self.module + module)


Program = Callable[..., list[Any]]
ReferenceCall = Callable[..., tuple[Any, Any, str]]
"""(component, reference module, whole reference model, inputs, run, our output) -> (ours, theirs, detail)."""

PROGRAMS: dict[str, Program] = {}
REFERENCE_CALLS: dict[str, ReferenceCall] = {}
EXAMPLES: dict[str, Callable[[Component, Run], Any]] = {}
"""Program name -> what a checked run of it shows as a worked example (a router's routing of one token)."""


def _registered(registry: dict[str, Any], name: str, fn: Any) -> Any:
    """Add fn under name; a second part that takes a name already taken is a bug that would silently replace the
    first part's program everywhere it is used (two parts once both named theirs "gated_rmsnorm")."""
    if name in registry and registry[name] is not fn:
        raise RuntimeError(f"program name {name!r} is registered twice ({registry[name].__module__} and "
                           f"{fn.__module__}); give one part another name")
    registry[name] = fn
    return fn


COMPARISON_ROLES: dict[str, str] = {}
"""Program name -> the row of the compare pages (explorer/figures/compare_roles.py ROLES) that counts the parameters of components
running it and of everything inside them; a program without one counts in its nearest such ancestor's row."""


def program(name: str, role: str | None = None, **part_facts: Any) -> Callable[[Program], Program]:
    """Register the torch program that computes components whose `program` is `name`, and the compare row (`role`)
    of a part that is a whole mechanism (an attention, an MLP, a norm), declared here so no part is left out; any
    other keyword is a fact the part declares for later stages (explorer/model/components/part_facts.py).
    The function registered (and returned, for programs that call each other by name) keeps each component's
    first run while capturing_children is on."""
    if role is not None:
        COMPARISON_ROLES[name] = role
    if part_facts:
        declare(name, **part_facts)

    def register(fn: Program) -> Program:
        @functools.wraps(fn)
        def run_program(comp: Component, run: Run, *inputs: Any) -> list[Any]:
            if _captured is None or id(comp) in _captured:
                return fn(comp, run, *inputs)
            own = Run(run.weights, _Tee(run.recorded, run.prefix), "", run.module)
            outputs = fn(comp, own, *inputs)
            _captured[id(comp)] = CapturedRun(inputs, own, outputs)
            return outputs

        return _registered(PROGRAMS, name, run_program)

    return register


def reference_call(name: str) -> Callable[[ReferenceCall], ReferenceCall]:
    """Register how to call the reference module of components whose `program` is `name`."""
    return lambda fn: _registered(REFERENCE_CALLS, name, fn)


def worked_example(name: str) -> Callable[[Callable[[Component, Run], Any]], Callable[[Component, Run], Any]]:
    """Register what the executed check of components whose `program` is `name` keeps as a worked example."""
    return lambda fn: _registered(EXAMPLES, name, fn)


def tensor_prefix(comp: Component) -> str:
    """The module a component maps to: the common dotted prefix of its tensors' name templates
    ("model.layers.{layer}.self_attn."); a single tensor's module, not the tensor itself."""
    templates = [t.template for c in _descendants(comp) for t in c.tensors]
    if not templates:
        return ""
    common: list[str] = []
    for segments in zip(*(t.split(".") for t in templates)):
        if len(set(segments)) != 1:
            break
        common.append(segments[0])
    if len(templates) == 1 or len(common) == len(templates[0].split(".")):
        common = common[:len(templates[0].split(".")) - 1]  # a leaf's module, not its weight
    return ".".join(common) + "." if common else ""


def _descendants(comp: Component) -> list[Component]:
    out = [comp]
    for c in comp.children:
        out += _descendants(c)
    return out


def relative_module(parent: Component, child: Component) -> str:
    """The child's module below its parent's ("model.layers.{layer}.mlp." below "model.layers.{layer}." -> "mlp.")."""
    outer, inner = tensor_prefix(parent), tensor_prefix(child)
    return inner[len(outer):] if inner.startswith(outer) else inner


def first_steps(children: tuple[Component, ...], *keys: str) -> tuple[Step, ...]:
    """The first step of each child named, in the order named: a builder assembles its steps by child key, so adding
    a projection shifts nothing."""
    by_key = {c.key: c for c in children}
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise KeyError(f"no child {missing} (children: {list(by_key)})")
    return tuple(by_key[k].steps[0] for k in keys)


def run_child(comp: Component, key: str, run: Run, *inputs: Any, prefix: str = "") -> Any:
    """Run the child `key` of `comp` with its own program, on the weights of its own module."""
    child = comp.child(key)
    (out,) = PROGRAMS[child.program](child, run.child(relative_module(comp, child), prefix), *inputs)
    return out


@dataclass(frozen=True, slots=True)
class CapturedRun:
    """A component's first run (inside its parent's): its inputs, what it recorded as a run of its own would record,
    and its outputs."""

    inputs: tuple[Any, ...]
    run: Run
    outputs: list[Any]


_captured: dict[int, CapturedRun] | None = None
"""While the full-size trace runs (capturing_children), each component's first run, by the id of the component."""


class _Tee(dict):  # type: ignore[type-arg]
    """A child's record: what it records goes to its parent's record (under the parent's prefix, as before) and to
    a record of its own, with the names a run of its own would give them."""

    def __init__(self, parent: dict[str, Any], prefix: str) -> None:
        super().__init__()
        self.parent, self.prefix = parent, prefix

    def __setitem__(self, name: str, tensor: Any) -> None:
        super().__setitem__(name, tensor)
        self.parent[self.prefix + name] = tensor


@contextmanager
def capturing_children() -> Iterator[dict[int, CapturedRun]]:
    """Keep every component's first run by its program while the body runs. The full-size trace runs each component
    on its own at its port shapes; on the meta device a run's shapes depend only on its inputs' shapes, so a child
    run inside its parent with inputs of the same shapes and dtypes need not run again (the trace checks that)."""
    global _captured
    _captured = {}
    try:
        yield _captured
    finally:
        _captured = None


def options(comp: Component, cls: type) -> Any:
    """The component's options, checked to be of the type its program expects."""
    if not isinstance(comp.options, cls):
        raise TypeError(f"{comp.key}: program {comp.program!r} needs {cls.__name__} options, got "
                        f"{type(comp.options).__name__}")
    return comp.options


__all__ = ["B", "T", "Citation", "Component", "Dim", "IndexRange", "Port", "Shape", "Step", "TensorSpec"]
