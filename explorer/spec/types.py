"""The spec layer's plain data: a model is a tree of Components with shapes, equations and tensors.

Parameter formulas and tensor shapes are sympy expressions in config symbols (named as in config.json),
so the accounting stage can show both the formula and its value, and a changed config changes both.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

import sympy

from explorer.spec.storage import Dense, Storage

Kind = Literal["learned", "computed", "buffer", "group"]
"""learned: owns trained weights; computed: no weights (RoPE, scores); buffer: stored non-trained
tensor; group: a container such as the stack of blocks."""

TensorRole = Literal["parameter", "buffer"]

Layout = Literal["out_in", "in_out"]
"""How a stored matrix orders its axes: [out, in] as nn.Linear holds it, or [in, out] as GPT-2's Conv1D does."""


@dataclass(frozen=True, slots=True)
class Dim:
    """One named dimension: a fixed size with its short name (7168 d) or a free one (B batch)."""

    label: str
    size: int | None = None
    symbol: str = ""
    """Free dimensions only: the letter shown before the label (B, T)."""

    @property
    def display(self) -> str:
        return f"{self.symbol} {self.label}" if self.size is None else f"{self.size} {self.label}"


@dataclass(frozen=True, slots=True)
class Shape:
    """A tensor shape with named dimensions, shown as [B batch, T positions, 7168 d]."""

    dims: tuple[Dim, ...]

    @property
    def display(self) -> str:
        return "[" + ", ".join(d.display for d in self.dims) + "]"


@dataclass(frozen=True, slots=True)
class Port:
    """An input or output of a component: its symbol in the equations and its shape."""

    latex: str
    shape: Shape
    name: str
    """Identifier used by the executor and the trace (e.g. "x", "h")."""


@dataclass(frozen=True, slots=True)
class Step:
    """One equation step (LaTeX), or a section heading when `heading` is set."""

    latex: str
    shape: Shape | None = None
    """Shape of the step's result."""
    name: str = ""
    """Stable anchor id within its page (e.g. "q-down")."""
    heading: bool = False


@dataclass(frozen=True, slots=True)
class IndexRange:
    """One index of a tensor-name template ({layer}, {expert}) and the values it takes."""

    var: str
    values: tuple[int, ...]

    @property
    def display(self) -> str:
        return compress_indices(self.values)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A family of checkpoint tensors this component owns, one per combination of its index values."""

    template: str
    """Name with placeholders, e.g. "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"."""
    shape: tuple[sympy.Expr, ...] | None
    """Symbolic shape; None for a stored buffer whose length the config does not determine."""
    ranges: tuple[IndexRange, ...] = ()
    role: TensorRole = "parameter"
    storage: Storage = Dense("")
    """How the checkpoint stores it (dtype, block scales, packed values); chosen by the family from the config's
    torch_dtype and quantization_config."""
    optional: bool = False
    """Expected only where the checkpoint stores it (buffers the modeling code does not load)."""
    tied_to: str = ""
    """Name of the tensor this one shares its values with (a tied LM head): stored and counted once, there."""
    layout: Layout = "out_in"
    """Matrices only: the stored axis order, so tables can show input × output whatever the storage."""
    reference_holds: bool = True
    """False for a tensor the checkpoint stores that the reference implementation neither builds nor loads (GPT-2's
    causal-mask buffers h.N.attn.bias): the stored layout has it, the comparison with the reference leaves it out."""

    @property
    def dtype(self) -> str:
        return getattr(self.storage, "dtype", "")

    @property
    def is_parameter(self) -> bool:
        """Counted in the parameter total: learned, shaped by the config, and not a tied alias."""
        return self.role == "parameter" and self.shape is not None and not self.tied_to

    @property
    def pattern(self) -> str:
        """Name with each index shown as its range, as in the checkpoint listing: layers.1-60.experts.0-383."""
        return self.template.format(**{r.var: r.display for r in self.ranges})

    @property
    def count(self) -> int:
        n = 1
        for r in self.ranges:
            n *= len(r.values)
        return n

    @property
    def first_name(self) -> str:
        """The name at every index's first value (without expanding them all)."""
        return self.template.format(**{r.var: r.values[0] for r in self.ranges})

    def names(self) -> list[str]:
        """Every concrete tensor name, in index order."""
        combos = itertools.product(*(r.values for r in self.ranges))
        return [self.template.format(**dict(zip((r.var for r in self.ranges), c))) for c in combos]


@dataclass(frozen=True, slots=True)
class Citation:
    """A claim backed by a symbol in a source file (checkpoint code, transformers, config.json)."""

    claim: str
    source: Literal["checkpoint", "transformers", "config"]
    symbol: str
    """Qualified name in a Python file ("DeepseekV3MLP", "DeepseekV3DecoderLayer.forward") or a
    top-level config.json key."""
    path: str = ""
    """transformers only: file path inside the package."""
    lines: tuple[int, int] | None = None
    """The lines of the file that make the point, (first, last) inclusive, when they are a part of the symbol
    (as the seed cites modeling_deepseek.py 1152-1166 of DeepseekV3DecoderLayer.__init__); they must lie inside
    the symbol's lines, and are re-checked against the file whenever it is at hand."""


@dataclass(frozen=True, slots=True)
class Component:
    """One node of a model's tree: a model, a block, a module, a projection or a computed step."""

    key: str
    """Path segment (unique among siblings), e.g. "down_proj"."""
    title: str
    kind: Kind
    code: str
    """The reference code expression that builds or runs it."""
    description: str
    repeat: int = 1
    """Independent instances inside one instance of the parent."""
    repeat_label: str = ""
    """Plural noun for the instances, e.g. "MoE blocks"."""
    repeat_formula: str = ""
    """Where repeat comes from, e.g. "n_routed_experts"."""
    inputs: tuple[Port, ...] = ()
    outputs: tuple[Port, ...] = ()
    equations: tuple[Step, ...] = ()
    """The headline equations."""
    steps: tuple[Step, ...] = ()
    """Every step, in order (for composites, the children's steps spliced in)."""
    tensors: tuple[TensorSpec, ...] = ()
    children: tuple[Component, ...] = ()
    citations: tuple[Citation, ...] = ()
    notes: tuple[str, ...] = ()
    crumb: str = ""
    """Breadcrumb text, e.g. "61 transformer blocks" or "SwiGLU" (default: title)."""
    row_label: str = ""
    """Label of this component's row in its parent's accounting table (default: title)."""
    program: str = ""
    """Name of the executable step program that computes this component (explorer/model/components/)."""
    options: object = None
    """The program's settings (a frozen dataclass of the component's library module: eps, heads, window...)."""
    reference: str = ""
    """Module path in the reference model when it is not the tensors' common prefix ("model.rotary_emb"), or
    "-" when no reference module computes this component alone."""
    extras: tuple[tuple[str, str], ...] = field(default=())
    """Further facts shown in the component's header, (label, value)."""


    def child(self, key: str) -> Component:
        """The child with this key (programs address children by key, never by position)."""
        for c in self.children:
            if c.key == key:
                return c
        raise KeyError(f"{self.key or 'model'} has no child {key!r} (children: {[c.key for c in self.children]})")


@dataclass(frozen=True, slots=True)
class DeclaredMTP:
    """Multi-token-prediction layers a config declares that the reference does not build (transformers skips their
    stored tensors when it loads): one module built with the family's own builders, counted `count` times in what the
    checkpoint stores and shown apart from the main model. Not part of the tree: no reference runs it, so it is
    never traced, checked or given a page of its own."""

    key: str
    """The config key that declares them: "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"."""
    count: int
    module: Component
    """One module (repeat 1): `count` multiplies it."""
    basis: str
    """What one module holds and on what evidence (the family's words), with what is assumed."""


class Hyperparameters:
    """Base of every family's typed config dataclass (config.json keys, named as published)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A whole model: its tree, the config symbols' values and what it was built from."""

    slug: str
    family: str
    root: Component
    values: dict[str, int | float]
    """Config symbol -> value, for evaluating formulas."""
    config: Hyperparameters
    """The family's typed config dataclass."""
    facts: tuple[tuple[str, str], ...] = ()
    """(label, value) for the index card, chosen by the family."""
    defaulted: tuple[str, ...] = ()
    """Config keys the published config.json omits, whose values are the reference config class's defaults."""
    declared_mtp: DeclaredMTP | None = None
    """Multi-token-prediction layers the config declares and the reference does not build (Family.declared_mtp)."""


def compress_indices(values: tuple[int, ...]) -> str:
    """Show sorted indices as runs: (0,1,2,5) -> "0-2,5"."""
    runs: list[str] = []
    for _, group in itertools.groupby(enumerate(values), key=lambda p: p[1] - p[0]):
        items = [v for _, v in group]
        runs.append(str(items[0]) if len(items) == 1 else f"{items[0]}-{items[-1]}")
    return ",".join(runs)


def walk(component: Component, path: tuple[Component, ...] = ()) -> list[tuple[tuple[Component, ...], Component]]:
    """Every (ancestors, component) pair in depth-first order, the root first."""
    out = [(path, component)]
    for child in component.children:
        out.extend(walk(child, path + (component,)))
    return out


def path_key(ancestors: tuple[Component, ...], component: Component) -> str:
    """Dotted path of a component below the root ("" for the root), e.g. "blocks.moe.mlp.router"."""
    return ".".join(c.key for c in ancestors[1:] + (component,)) if ancestors else ""
