"""Published claims reconciled (issue 35): each parameter figure a lab published (content/models/SLUG/model.toml's
[[published]] tables, with where it was published), beside the site's figure under every counting convention the
site computes (with and without the input embedding; the main model without its multi-token-prediction module),
and which conventions reproduce it at the precision the lab writes.

A claim no convention reproduces must say where the difference lies (its `difference`): the build refuses one that
does not, so no page disagrees with a lab silently.
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.content.published_claims import CLAIM, UNITS, PublishedClaim
from explorer.figures.model_figures import DerivedFigures
from explorer.figures.stored import mtp_parameters
from explorer.model.account import Ledger
from explorer.spec.types import ModelSpec

HEADLINE_CONVENTION = ("The site's headline figures (Parameters stored, Active parameters per token) count the input "
                       "embedding, the same on every model; the table gives each figure the lab published beside the "
                       "site's under every convention, and which one reproduces it.")
"""Stated once on every model page, in the same words."""
def parse(claim: str) -> tuple[float, float]:
    """"32B" -> (32e9, 1e9): the value and the unit of its last digit; "36.6B" -> (36.6e9, 1e8)."""
    m = CLAIM.fullmatch(claim)
    assert m is not None, claim
    scale = UNITS[m["unit"]]
    return float(m["number"]) * scale, scale / 10 ** len(m["decimals"] or "")


def states(value: int, claim: str, rounding: str) -> bool:
    """Whether a lab writing `value` at the claim's precision writes the claim."""
    stated, unit = parse(claim)
    return stated <= value < stated + unit if rounding == "down" else abs(value - stated) <= unit / 2


@dataclass(frozen=True, slots=True)
class Convention:
    """The site's figure counted one way."""

    label: str
    value: int
    reproduces: bool


@dataclass(frozen=True, slots=True)
class ClaimRow:
    """A published figure reconciled: the site's figure under each convention, the headline's first."""

    claim: PublishedClaim
    conventions: tuple[Convention, ...]

    @property
    def reproduced_by(self) -> tuple[str, ...]:
        return tuple(c.label for c in self.conventions if c.reproduces)

    @property
    def headline_difference(self) -> str:
        """Where the headline's figure and the reproducing one differ, itemised ("" where the headline reproduces
        the claim or nothing does)."""
        head, *others = self.conventions
        match = next((c for c in others if c.reproduces), None)
        if head.reproduces or match is None:
            return ""
        return (f"The headline ({head.label}) counts {head.value - match.value:,} more than the convention that "
                f"reproduces the claim ({match.label}).")


def conventions(figure: str, spec: ModelSpec, ledger: Ledger, figures: DerivedFigures) -> tuple[Convention, ...]:
    """(label, value) of the site's figure under each convention, the headline's first."""
    active, no_embed = figures.get("active_parameters").value, figures.get("active_parameters_no_embedding").value
    embed = active - no_embed
    if figure == "active":  # the main forward pass: an MTP module is never active
        return (Convention("with the input embedding", active, False),
                Convention("without the input embedding", no_embed, False))
    total = figures.get("total_parameters").value
    mtp = mtp_parameters(spec, ledger)
    out = [Convention("every stored parameter, with the input embedding", total, False),
           Convention("without the input embedding", total - embed, False)]
    if mtp:
        out += [Convention("main model, without the MTP module", total - mtp, False),
                Convention("main model, without the MTP module and the input embedding", total - mtp - embed, False)]
    return tuple(out)


def reconcile_claims(claims: tuple[PublishedClaim, ...], spec: ModelSpec, ledger: Ledger, figures: DerivedFigures,
                     where: str) -> tuple[tuple[ClaimRow, ...], list[str]]:
    """Every claim reconciled, and one problem line for each that no convention reproduces and that does not say
    where the difference lies."""
    rows, problems = [], []
    for i, c in enumerate(claims):
        found = tuple(Convention(v.label, v.value, states(v.value, c.claim, c.rounding))
                      for v in conventions(c.figure, spec, ledger, figures))
        rows.append(ClaimRow(c, found))
        if not any(v.reproduces for v in found) and not c.difference.strip():
            site = "; ".join(f"{v.label} {v.value:,}" for v in found)
            problems.append(f"{where}: key 'published[{i}].difference': missing: {c.claim} ({c.figure}) is reproduced "
                            f"by no convention ({site}); say where the difference lies")
    return tuple(rows), problems
