"""Spec layer: the plain data of a model's component tree (types.py) and how weights are stored (storage.py).
Families (explorer/model/families/) build trees from the component library (explorer/model/components/)."""

from __future__ import annotations

from explorer.spec.types import ModelSpec

__all__ = ["ModelSpec"]
