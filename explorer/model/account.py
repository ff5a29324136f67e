"""Parameter accounting: symbolic formulas (sympy, in config symbols) evaluated into exact rows and totals.

Every total is the sum of its rows, and every row is either one stored tensor family of the component or one
child component times its repeat count, so a page's table adds up by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import sympy

from explorer.spec.storage import StoredTensor
from explorer.spec.types import Component, ModelSpec, TensorSpec, path_key, walk


@dataclass(frozen=True, slots=True)
class TensorAccount:
    """One tensor family a component owns, evaluated: its shape, count, elements and what its storage stores."""

    spec: TensorSpec
    shape: tuple[int, ...] | None
    """None for a buffer whose length the config does not determine."""
    elements: int | None
    """Over all `spec.count` tensors of the family."""
    stored: tuple[StoredTensor, ...]
    """What the checkpoint stores for the family's first tensor (the value, then scales or packed parts)."""


@dataclass(frozen=True, slots=True)
class AccountRow:
    """One row of "Exact per-instance accounting"."""

    label: str
    formula: str
    """Symbolic, in config names: "intermediate_size × hidden_size"."""
    factors: tuple[int, ...]
    """The evaluated factors whose product is value (one factor for a sum over components)."""
    value: int
    child: str = ""
    """Path of the child component this row stands for ("" for the component's own tensors)."""
    across_children: bool = False
    """The row is a child's total over its own components (shown as "N across its components")."""
    tensors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ComponentAccount:
    """Exact parameters of one component: per instance, how many instances, and the model-wide total."""

    path: str
    rows: tuple[AccountRow, ...]
    per_instance: int
    instances: int
    """Independent instances in the model: the product of repeat counts from the root down."""
    instances_label: str
    """Plural noun for them, e.g. "MoE blocks"."""
    instances_factors: tuple[tuple[int, str], ...]
    """(repeat, label) of each ancestor-or-self that repeats, outermost first."""
    formula: str
    tensors: tuple[TensorAccount, ...] = ()
    """The component's own tensor families."""

    @property
    def total(self) -> int:
        return self.per_instance * self.instances


@dataclass(frozen=True, slots=True)
class Ledger:
    """Accounts of every component of a model, by path."""

    slug: str
    accounts: dict[str, ComponentAccount]
    declared: dict[str, ComponentAccount] = field(default_factory=dict)
    """Accounts of the multi-token-prediction layers the config declares and the reference does not build
    (ModelSpec.declared_mtp), by path under "mtp": outside the tree, so `total` leaves them out."""

    @property
    def total(self) -> int:
        """Every parameter of the tree: what the reference builds, and an MTP module the family describes."""
        return self.accounts[""].per_instance

    @property
    def declared_mtp(self) -> int:
        """Parameters of the declared, unbuilt MTP layers (0 where there are none)."""
        return self.declared["mtp"].total if self.declared else 0

    @property
    def stored_total(self) -> int:
        """Every parameter the checkpoint stores (explorer/figures/model_figures.py's STORED_DEFINITION): the tree's
        and the declared MTP layers'."""
        return self.total + self.declared_mtp


def evaluate(expr: sympy.Expr, values: dict[str, int | float]) -> int:
    """Substitute config values (by symbol name) into a size formula."""
    expr = sympy.sympify(expr)
    return _evaluate(expr, tuple(sorted((s.name, values[s.name]) for s in expr.free_symbols)))


@lru_cache(maxsize=4096)
def _evaluate(expr: sympy.Expr, values: tuple[tuple[str, int | float], ...]) -> int:
    named = dict(values)
    # xreplace rebuilds the tree with numbers in place (and the numbers fold as it goes): eight times faster than
    # subs, which also tries to match sub-expressions that a plain symbol-for-number replacement never needs.
    return int(expr.xreplace({sym: named[sym.name] for sym in expr.free_symbols}))


def _product(shape: tuple[sympy.Expr, ...]) -> sympy.Expr:
    out: sympy.Expr = sympy.Integer(1)
    for s in shape:
        out = out * s
    return out


def param_formula(component: Component, memo: dict[int, sympy.Expr] | None = None) -> sympy.Expr:
    """Symbolic parameter count of one instance: own parameter tensors plus children times repeats. `memo` (by
    id, for components that outlive it) keeps each subtree's formula: account asks for every component's, and
    building them again at every level was a quarter of its time."""
    if memo is not None and id(component) in memo:
        return memo[id(component)]
    own = sum((_product(t.shape) for t in component.tensors if t.is_parameter and t.shape is not None),
              sympy.Integer(0))
    formula = own + sum((child.repeat * param_formula(child, memo) for child in component.children), sympy.Integer(0))
    if memo is not None:
        memo[id(component)] = formula
    return formula


@lru_cache(maxsize=4096)
def show_formula(expr: sympy.Expr) -> str:
    """Readable formula in config names: "n_routed_experts × hidden_size"."""
    return str(expr).replace("**", "^").replace("*", " × ")


def tensor_label(t: TensorSpec) -> str:
    """Row label for one stored tensor family, from its last name segment and rank."""
    leaf = t.template.rsplit(".", 1)[-1]
    if leaf == "weight":
        rank = len(t.shape) if t.shape is not None else 0
        # a convolution's kernel (Qwen3.5's depthwise conv1d, a patch embedding's Conv2d/Conv3d) is neither
        return "Weight matrix" if rank == 2 else ("Convolution kernel" if rank > 2 else "Gain vector")
    return leaf.replace("_", " ").capitalize()


def _tensor_row(t: TensorSpec, values: dict[str, int | float]) -> AccountRow:
    # Matrices are shown input by output, as in y = xW, whichever order the checkpoint stores them in.
    assert t.shape is not None  # only parameters, whose shapes the config determines, get rows
    shape = tuple(reversed(t.shape)) if len(t.shape) == 2 and t.layout == "out_in" else t.shape
    factors = tuple(evaluate(s, values) for s in shape)
    value = 1
    for f in factors:
        value *= f
    return AccountRow(tensor_label(t), " × ".join(show_formula(s) for s in shape), factors, value,
                      tensors=(t.pattern,))


def _child_row(child: Component, ancestors_path: str, values: dict[str, int | float],
               memo: dict[int, sympy.Expr] | None = None) -> AccountRow:
    expr = param_formula(child, memo)
    per = evaluate(expr, values)
    path = f"{ancestors_path}.{child.key}" if ancestors_path else child.key
    label = child.row_label or child.title
    if child.repeat > 1:
        return AccountRow(label, f"{child.repeat_formula or child.repeat} × ({show_formula(expr)})",
                          (child.repeat, per), child.repeat * per, child=path)
    has_rows = bool(child.children) or sum(1 for t in child.tensors if t.is_parameter) > 1
    return AccountRow(label, show_formula(expr), (per,), per, child=path, across_children=has_rows)


def account_component(ancestors: tuple[Component, ...], component: Component, values: dict[str, int | float],
                      memo: dict[int, sympy.Expr] | None = None) -> ComponentAccount:
    """Rows, per-instance total and instance count of one component."""
    path = path_key(ancestors, component)
    rows = [_tensor_row(t, values) for t in component.tensors if t.is_parameter]
    rows += [_child_row(ch, path, values, memo) for ch in component.children if param_formula(ch, memo) != 0]
    chain = ancestors + (component,)
    factors = tuple((c.repeat, c.repeat_label) for c in chain if c.repeat_label)
    instances = 1
    for c in chain:
        instances *= c.repeat
    label = next((c.repeat_label for c in reversed(chain) if c.repeat_label), "instances")
    return ComponentAccount(
        path=path, rows=tuple(rows), per_instance=sum(r.value for r in rows), instances=instances,
        instances_label=label, instances_factors=factors, formula=show_formula(param_formula(component, memo)),
        tensors=tuple(tensor_account(t, values) for t in component.tensors),
    )


def tensor_account(t: TensorSpec, values: dict[str, int | float]) -> TensorAccount:
    if t.shape is None:
        return TensorAccount(t, None, None, ())
    shape = tuple(evaluate(s, values) for s in t.shape)
    elements = t.count
    for s in shape:
        elements *= s
    return TensorAccount(t, shape, elements, t.storage.expand(t.first_name, shape, "buffer" if t.role == "buffer" else "parameter"))


def account(spec: ModelSpec) -> Ledger:
    """Return the exact accounting of every component of a model."""
    memo: dict[int, sympy.Expr] = {}  # the spec holds every component while it is used
    accounts = {path_key(anc, comp): account_component(anc, comp, spec.values, memo) for anc, comp in walk(spec.root)}
    return Ledger(spec.slug, accounts, _declared_accounts(spec, memo))


def _declared_accounts(spec: ModelSpec, memo: dict[int, sympy.Expr]) -> dict[str, ComponentAccount]:
    """The declared MTP module's accounts, under the root as if it were its child "mtp", repeated `count` times."""
    d = spec.declared_mtp
    if d is None:
        return {}
    module = replace(d.module, key="mtp", repeat=d.count, repeat_formula=d.key,
                     repeat_label="MTP modules" if d.count != 1 else "MTP module")
    return {path_key(anc, comp): account_component(anc, comp, spec.values, memo)
            for anc, comp in walk(module, (spec.root,))}
