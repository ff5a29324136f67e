"""The offline search index: concepts, config keys and values, tensor and code names, each pointing to the pages
that use them and weighted so that the page defining a thing comes before the pages that merely contain it.

Nothing here is declared per family. A page's concepts come from its component (title, breadcrumb, key, step
program, the title's acronym: "Multi-head latent attention" gives "MLA"); a config key is tied to the
components whose own cited code or own text names it or whose own equations show its value. SYNONYMS holds
general vocabulary only (a reader's "KV cache" is an attention concept). Matching is by whole words, never
substrings, so "KV cache" does not find use_cache. The index is written as a script so it loads from file://.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import sympy

from explorer.figures.model_build import ModelBuild
from explorer.spec.types import Component, path_key, walk
from explorer.views.basics import crumb_texts, page_href
from explorer.views.compare_pages import compare_path, static_pairs

SYNONYMS: dict[str, tuple[str, ...]] = {
    "kv cache": ("latent attention", "attention"),
    "key-value cache": ("latent attention", "attention"),
    "routing": ("router",), "gating": ("router",), "top-k": ("router",), "expert selection": ("router",),
    "silu": ("swiglu", "gated mlp"), "swish": ("swiglu", "gated mlp"), "feed-forward": ("swiglu", "mlp"),
    "ffn": ("swiglu", "mlp"), "gelu": ("mlp",),
    "rope": ("rotary position embedding",), "rotary": ("rotary position embedding",),
    "positional encoding": ("rotary position embedding",), "yarn": ("rotary position embedding",),
    "softmax": ("scores",), "attention scores": ("scores",),
    "layernorm": ("rmsnorm",), "normalization": ("rmsnorm",), "norm": ("rmsnorm",),
    "unembedding": ("lm head",), "logits": ("lm head",), "output head": ("lm head",),
    "residual": ("block",), "residual stream": ("block",), "layer": ("block",),
    "multi-token prediction": ("mtp",), "mixture-of-experts": ("mixture of experts",),
    "sinkhorn": ("hyper-connection",), "sinkhorn-knopp": ("hyper-connection",),
}
"""Reader vocabulary -> concepts a component page declares, best first (general terms, for every family)."""

GENERIC_WORDS = {"of", "the", "a", "and", "module", "block", "layer"}
"""Words an acronym skips ("Multi-token prediction module" -> MTP); "of" keeps its letter in lower case (MoE)."""

W_OWN_CODE, W_OWN_TEXT, W_OWN_TENSOR, W_VALUE, W_ANCESTOR, W_TEXT = 40, 30, 50, 30, 4, 2
"""Weights of a term on a page: named in the component's own cited code, in its own text (description, claims,
notes, extras), a name in its own tensors, its value in its own equations; on an enclosing page; any word."""

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d[\d,]*(?:\.\d+)?")


def acronyms(title: str) -> set[str]:
    """Acronyms of a title, with and without splitting hyphenated words ("Multi-head latent attention" -> mla); a
    parenthetical qualifier is not part of the name ("Routed experts (clamped SwiGLU)" -> none, not "re(s")."""
    out = set()
    title = re.sub(r"\s*\([^)]*\)", "", title)
    for words in (title.split(), title.replace("-", " ").split()):
        letters = "".join(w[0].lower() for w in words if w.lower() not in GENERIC_WORDS)
        if len(letters) >= 3:
            out.add(letters)
        with_of = "".join(w[0] for w in words if w.lower() not in GENERIC_WORDS - {"of"})
        if " of " in f" {title.lower()} " and len(with_of) >= 3:
            out.add(with_of.lower())
    return out


def tokens(text: str) -> set[str]:
    """Whole words, identifiers and numbers of a text, lower-cased; numbers also without thousands separators."""
    out = set()
    for t in _TOKEN.findall(text):
        out.add(t.lower())
        if "," in t:
            out.add(t.replace(",", ""))
    return out


def config_terms(config: dict[str, Any]) -> dict[str, set[str]]:
    """Config key -> the forms its value takes on a page; ambiguous values (shared by two keys, or small
    integers) are left out, so only a distinctive value ties a page to a key."""
    forms: dict[str, set[str]] = {}
    for key, value in config.items():
        if isinstance(value, bool) or isinstance(value, (dict, list)):
            forms[key] = set()
        elif isinstance(value, float):
            forms[key] = {f"{value:g}", repr(value)}
        elif isinstance(value, int):
            forms[key] = {str(value), f"{value:,}"} if value >= 10 else set()
        else:
            forms[key] = {str(value).lower()}
    counts: dict[str, int] = defaultdict(int)
    for f in forms.values():
        for v in f:
            counts[v] += 1
    return {k: {v for v in f if counts[v] == 1} for k, f in forms.items()}


def _own_text(comp: Component) -> str:
    parts = [comp.title, comp.description, comp.code, *comp.notes, *(c.claim for c in comp.citations)]
    parts += [f"{label} {value}" for label, value in comp.extras]
    return " ".join(parts)


def _own_math(comp: Component) -> str:
    """The component's own equations (not its children's), where config values appear as numbers."""
    child_steps = {s.latex for ch in comp.children for s in ch.steps + ch.equations}
    own = [s.latex for s in comp.steps + comp.equations if s.latex not in child_steps]
    return re.sub(r"\\[A-Za-z]+", " ", " ".join(own))


def term_weights(mb: ModelBuild, path: str, comp: Component, values: dict[str, set[str]]) -> dict[str, int]:
    """Every term a page is found by, with how strongly the page is about it."""
    w: dict[str, int] = defaultdict(int)
    code = tokens(" ".join(line for c in mb.citations.get(path, ()) for line in (c.lines or ())))
    text, math = tokens(_own_text(comp)), tokens(_own_math(comp)) | tokens(" ".join(v for _, v in comp.extras))
    for word in text:
        w[word] += W_TEXT
    own_tensors: set[str] = set()
    for spec in comp.tensors:
        parts = [part.lower() for part in spec.template.split(".") if not part.startswith("{")]
        # identifiers (kv_b_proj, e_score_correction_bias) name the page; plain path words ("experts", "mlp")
        # stand in many models' tensor names and only count as text
        own_tensors |= {part for part in parts if "_" in part or part == parts[-1]}
        for part in set(parts) - own_tensors:
            w[part] += W_TEXT
        own_tensors |= {str(s) for dim in (spec.shape or ()) for s in sympy.sympify(dim).free_symbols}
    for name in own_tensors:
        w[name] += W_OWN_TENSOR
    for key, forms in values.items():
        score = (W_OWN_CODE if key in code else 0) + (W_OWN_TEXT if key in text else 0)
        score += W_VALUE if forms & (math | text) else 0
        score += W_OWN_TENSOR if key in own_tensors else 0
        if score:
            for term in {key, *forms}:
                w[term] += score
    for c in comp.citations:
        w[c.symbol.lower()] += W_OWN_TEXT
    return w


def concepts(comp: Component, title: str) -> tuple[list[str], list[str]]:
    """Names that a page defines, lower-cased: its title and acronyms; then (a little weaker, since an enclosing
    block may share them) its breadcrumb, key and step program."""
    names = sorted({title.lower()} | acronyms(title))
    aliases = {comp.crumb, comp.key, comp.key.replace("_", " "), comp.program, comp.program.replace("_", " ")}
    return names, sorted({a.lower() for a in aliases if a} - set(names))


def search_entries(builds: list[ModelBuild]) -> list[dict[str, Any]]:
    """Entries in site order: {t: title, m: model, p: crumb path, u: URL, n: concepts, a: aliases,
    w: {term: weight}}."""
    entries: list[dict[str, Any]] = []
    for mb in builds:
        name = mb.content.meta.name
        values = config_terms(mb.content.config)
        pages = [(anc, comp, path_key(anc, comp)) for anc, comp in walk(mb.spec.root)]
        weights = {path: term_weights(mb, path, comp, values) for _, comp, path in pages}
        for path, w in weights.items():  # an enclosing page is found too, after the page itself
            for parent in _ancestors(path):
                for term, score in w.items():
                    if score > W_TEXT:
                        weights[parent][term] = max(weights[parent].get(term, 0), W_ANCESTOR)
        for key in values:  # every config key finds at least the model overview
            weights[""][key] = max(weights[""].get(key, 0), 1)
        for anc, comp, path in pages:
            title = comp.title if path else name
            crumbs = " › ".join(crumb_texts(anc[1:]))
            names, aliases = concepts(comp, title)
            if not path:  # the overview carries the derived figures (active parameters, FLOPs, memory)
                aliases = sorted(set(aliases) | FIGURE_ALIASES)
            entries.append({"t": title, "m": name, "p": crumbs, "u": f"models/{mb.slug}/{page_href(path)}",
                            "n": names, "a": aliases, "w": dict(sorted(weights[path].items()))})
        entries.append(kv_cache_entry(mb))
    return entries + compare_entries(builds)


KV_CACHE_NAMES = ("kv cache", "key-value cache", "kv-cache", "cache per token")
"""What a reader calls the per-token cache: the overview's figures give its size for every attention kind."""


def kv_cache_entry(mb: ModelBuild) -> dict[str, Any]:
    """The model's KV cache figure as an entry of its own: a reader asking for "KV cache" wants its size per token
    and how it is counted (the overview's figures), before any one attention page. Named by alias, one level below
    a concept's own name, so that within a model its own attention (MLA) comes next, before other models' figures."""
    return {"t": "KV cache", "m": mb.content.meta.name, "p": "Per token figures",
            "u": f"models/{mb.slug}/{page_href('')}#figures", "n": [], "a": list(KV_CACHE_NAMES), "w": {}}


FIGURE_ALIASES = {"active parameters", "activated parameters", "flops", "weight memory", "per token"}
"""What a reader asks of a model's overview page, where its derived figures are."""


def compare_entries(builds: list[ModelBuild]) -> list[dict[str, Any]]:
    """The picker page, and one entry per static comparison, found by the two model names ("kimi deepseek")."""
    entries = [{"t": "Compare any two models", "m": "Compare", "p": "", "u": "compare/index.html",
                "n": ["compare models"], "a": ["compare", "comparison", "side by side", "vs"], "w": {}}]
    for a, b in static_pairs(builds):
        title = f"{a.content.meta.name} vs {b.content.meta.name}"
        words = tokens(f"{a.content.meta.name} {b.content.meta.name} {a.slug} {b.slug}")
        entries.append({"t": title, "m": "Compare", "p": "", "u": compare_path(a.slug, b.slug),
                        "n": [title.lower()], "a": ["compare", "comparison", "side by side"],
                        "w": dict.fromkeys(sorted(words), W_OWN_TEXT)})
    return entries


def _ancestors(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[:i]) for i in range(len(parts))]


def search_script(builds: list[ModelBuild]) -> str:
    """search-index.js: assigns the entries to window.EXPLORER_SEARCH and the synonyms to EXPLORER_SYNONYMS."""
    data = json.dumps(search_entries(builds), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    synonyms = json.dumps(SYNONYMS, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return f"window.EXPLORER_SEARCH={data};\nwindow.EXPLORER_SYNONYMS={synonyms};\n"
