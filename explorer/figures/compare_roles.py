"""Models side by side: each model's parameters partitioned by role (embedding, attention, feed-forward or
experts, norms, head, ...), so that for any two models the rows' deltas sum exactly to the totals' difference.

Each stored parameter tensor belongs to exactly one component, and each component to the role of its nearest
classified ancestor-or-self, so a model's role totals add up to its ledger total by construction; the multi-token-prediction layers a config
declares beside the tree (ModelSpec.declared_mtp) are that role's too, so the roles add up to what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.model import families  # noqa: F401  (imports every library part, so each registers its role)
from explorer.model.account import Ledger
from explorer.model.components.base import COMPARISON_ROLES
from explorer.spec.types import Component, ModelSpec, path_key, walk

ROLES = ("Token embedding", "Position embedding", "Attention", "Linear attention (Gated DeltaNet)",
         "Linear attention (KDA)", "State space (Mamba-2)", "Feed-forward (dense)", "Mixture of experts",
         "Hyper-connections", "Norms", "LM head", "Multi-token prediction", "Vision tower and projector", "Other")
_BY_PROGRAM = COMPARISON_ROLES
"""Program -> role, registered beside each program (`@program(name, role=...)` in explorer/model/components/); importing
the families imports every part. moe_beside_mlp (Gemma 4) has none: its dense MLP, norms, router and experts take
their own roles."""
if not set(_BY_PROGRAM.values()) <= set(ROLES):
    raise RuntimeError(f"@program roles outside compare.ROLES: {sorted(set(_BY_PROGRAM.values()) - set(ROLES))}")


@dataclass(frozen=True, slots=True)
class RoleTotals:
    """One model's parameters by role; `values` sums to `total`."""

    slug: str
    values: dict[str, int]
    total: int
    mechanisms: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Role -> the titles of its outermost components, in model order ("Chunked attention", "NoPE attention"),
    so a compare row can name what differs, not only how many parameters."""


def role_of(ancestors: tuple[Component, ...], comp: Component) -> str:
    """The role of the outermost classified component on the path (a norm inside attention is attention's)."""
    for c in (*ancestors, comp):
        role = _BY_PROGRAM.get(c.program)
        if role is not None:
            return role
    return "Other"


def role_totals(spec: ModelSpec, ledger: Ledger) -> RoleTotals:
    values = dict.fromkeys(ROLES, 0)
    mechanisms: dict[str, dict[str, None]] = {}
    for ancestors, comp in walk(spec.root):
        own = sum(ta.elements or 0 for ta in ledger.accounts[path_key(ancestors, comp)].tensors if ta.spec.is_parameter)
        if own:
            values[role_of(ancestors, comp)] += own
        role = _BY_PROGRAM.get(comp.program)
        if role in NAMED_ROLES and not any(_BY_PROGRAM.get(a.program) for a in ancestors):
            mechanisms.setdefault(role, {})[comp.title] = None
    values["Multi-token prediction"] += ledger.declared_mtp  # declared, not built: outside the tree, one role
    return RoleTotals(spec.slug, values, ledger.stored_total, {r: tuple(t) for r, t in mechanisms.items()})


NAMED_ROLES = ("Attention", "Feed-forward (dense)", "Mixture of experts", "LM head")
"""Roles whose rows name their mechanisms where the two models differ."""


@dataclass(frozen=True, slots=True)
class RoleRow:
    role: str
    left: int
    right: int

    @property
    def delta(self) -> int:
        return self.right - self.left


def compare_roles(left: RoleTotals, right: RoleTotals) -> tuple[RoleRow, ...]:
    """Rows for the roles either model has; their deltas sum to right.total − left.total."""
    return tuple(RoleRow(r, left.values[r], right.values[r]) for r in ROLES if left.values[r] or right.values[r])


def config_differences(left: dict, right: dict) -> tuple[tuple[str, str, str, bool], ...]:
    """(key, left value, right value, differs) over the union of top-level config keys, sorted."""
    rows = []
    for key in sorted(set(left) | set(right)):
        a, b = left.get(key, "—"), right.get(key, "—")
        # compared as config.json writes them, as the picker page (static/compare.js) compares them
        rows.append((key, _show(a), _show(b), _show(a) != _show(b)))
    return tuple(rows)


def _show(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_show(v)}" for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
