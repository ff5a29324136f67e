"""Spec layer: the plain data of a model's component tree (types.py) and how weights are stored (storage.py).
Families (explorer/families/) build trees from the component library (explorer/components/)."""

from __future__ import annotations

from .types import ModelSpec

__all__ = ["ModelSpec"]
