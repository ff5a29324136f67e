"""A figure a lab published about its model (content/models/SLUG/model.toml's [[published]] tables), as content
records it, and the checks that make each record well formed; explorer/figures/published_claims.py reconciles them
with the site's counts."""

from __future__ import annotations

import re
from dataclasses import dataclass

FIGURES = ("total", "active")
ROUNDINGS = ("nearest", "down")
CLAIM = re.compile(r"(?P<number>[0-9]{1,6}(?:\.(?P<decimals>[0-9]{1,3}))?)(?P<unit>[TBM])")
"""A published figure as written: "1T", "32B", "12.9B", "135M"."""
UNITS = {"T": 1e12, "B": 1e9, "M": 1e6}


@dataclass(frozen=True, slots=True)
class PublishedClaim:
    """One figure a lab published, as content records it."""

    figure: str
    """"total" (every parameter) or "active" (per token)."""
    claim: str
    """As published: "40B", "1T", "36.6B"."""
    source: str
    """Where it is published, with its words: "model card (zai-org/GLM-5): 744B parameters (40B active)"."""
    lab_counts: str = ""
    """What the lab says the figure counts (with or without the embedding), in its words; "" where it does not say."""
    rounding: str = "nearest"
    """"nearest": the lab rounds to its last digit; "down": it cuts to it (the lab's own words show which)."""
    difference: str = ""
    """Where no convention reproduces the claim: what differs (a component, a convention), with its evidence."""


def claim_problems(claims: list[PublishedClaim], where: str) -> list[str]:
    """One line per malformed claim, naming its file and key."""
    out = []
    for i, c in enumerate(claims):
        key = f"{where}: key 'published[{i}]"
        if c.figure not in FIGURES:
            out.append(f"{key}.figure': must be one of {', '.join(FIGURES)}, got {c.figure!r}")
        if not CLAIM.fullmatch(c.claim):
            out.append(f"{key}.claim': expected a figure as published, e.g. \"32B\" or \"1T\", got {c.claim[:40]!r}")
        if c.rounding not in ROUNDINGS:
            out.append(f"{key}.rounding': must be one of {', '.join(ROUNDINGS)}, got {c.rounding!r}")
        if not c.source.strip():
            out.append(f"{key}.source': missing (where the lab published the figure)")
    return out
