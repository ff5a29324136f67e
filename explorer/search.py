"""The offline search index: one entry per page, with the words a reader might type (component titles,
code symbols, config keys, checkpoint tensor names), written as a script so it loads from file:// too."""

from __future__ import annotations

import json
from typing import Any

import sympy

from .account import param_formula
from .model_build import ModelBuild
from .spec.types import path_key, walk
from .views import page_href


def search_entries(builds: list[ModelBuild]) -> list[dict[str, Any]]:
    """Entries in site order: {t: title, m: model, p: crumb path, u: URL from the site root, k: keywords}."""
    entries: list[dict[str, Any]] = []
    for mb in builds:
        name = mb.content.meta.name
        config_words = [f"{k} {v}" for k, v in sorted(mb.content.config.items()) if not isinstance(v, dict)]
        for ancestors, comp in walk(mb.spec.root):
            path = path_key(ancestors, comp)
            words = {comp.key, path, comp.code, comp.crumb}
            for t in comp.tensors:
                words.add(t.pattern)
                words.update(part for part in t.template.split(".") if not part.startswith("{"))
            words.update(str(s) for s in sympy.sympify(param_formula(comp)).free_symbols)
            words.update(c.symbol for c in comp.citations)
            if not path:
                words.update(config_words)
            crumbs = " › ".join(a.crumb or a.title for a in ancestors[1:])
            entries.append({"t": comp.title if path else name, "m": name, "p": crumbs,
                            "u": f"models/{mb.slug}/{page_href(path)}",
                            "k": " ".join(sorted(w for w in words if w))})
    return entries


def search_script(builds: list[ModelBuild]) -> str:
    """search-index.js: assigns the entries to window.EXPLORER_SEARCH."""
    data = json.dumps(search_entries(builds), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return f"window.EXPLORER_SEARCH={data};\n"
