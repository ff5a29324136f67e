"""torch and torch.nn.functional, imported the first time one of their attributes is read.

Each component module holds a part's spec builder (sympy; every build runs it) beside its torch program (run only
when the torch stages are not cached). Importing torch takes about 1.3 s of CPU, a third of a warm build that
finds every torch stage in the cache, so the component modules bind `torch` and `F` to these stand-ins; the type
checker sees the real modules (they are imported under TYPE_CHECKING there)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _OnFirstUse:
    """Stands for a module until an attribute is read, then imports it and hands out its attributes."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


torch: Any = _OnFirstUse("torch")
F: Any = _OnFirstUse("torch.nn.functional")
