"""Which symbols a step's LaTeX defines and which it reads.

A deliberately small tokenizer over the LaTeX the components write, not a TeX parser: a step is clauses separated by
\\quad or ",\\ ", each "LHS = RHS" (or "LHS \\leftarrow RHS", an update) or a bare expression. A symbol is a base
(a Latin letter, a Greek letter, \\ell, \\mathcal X) with its accent (\\hat, \\tilde, \\bar), primes, and the scripts
that name it: a superscript of letters or \\mathrm{...} (c^{KV}, Q^{R}, y^{\\mathrm{routed}}) and the \\mathrm{...}
parts of a subscript (x_{\\mathrm{attn}}, g_{\\mathrm{sh}}). Every other script is an index or an exponent (Q_h, x_n,
O_{64}, W_{1,i}, K^{\\top}, x^2) and is not part of the symbol; what it reads is read. \\operatorname{...} names a
function, with its scripts; \\text{...} is prose; stream colours are dropped.

What each symbol is (a tensor a step computes, a learned parameter, a constant, an index) is not guessed here: the
Notation registry (explorer/model/notation.py) declares it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

GREEK = frozenset({
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "pi", "rho", "sigma", "varsigma", "tau", "upsilon", "phi", "varphi", "chi", "psi",
    "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Phi", "Psi", "Omega", "ell", "varnothing",
})
ACCENTS = frozenset({"hat", "tilde", "bar"})
_FUNCTION_ARG = frozenset({"operatorname", "text", "texttt", "mathrm", "mathbb", "mathbf", "begin", "end"})
"""Commands whose braced argument is a name, not maths: skipped with the argument (and, for a function, its
scripts)."""
_SPACES = frozenset({",", " ", "!", ";", ":", "quad", "qquad"})
_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[A-Za-z]|\d+(?:\.\d+)?|\s+|.", re.S)
_COLOR = re.compile(r"\\color\{[^{}]*\}")
_IN_INDEX = "\x00"
"""Marks a symbol found inside an index script while scanning (read wherever it stands)."""
_INDEXED = "\x01"
"""Marks an extra entry for a symbol that carries an index subscript (Q_h, s_h): a tensor with an axis."""


@dataclass(frozen=True, slots=True)
class StepSymbols:
    """What one step's LaTeX defines and what it reads."""

    defines: frozenset[str]
    reads: frozenset[str]
    """Symbols the step reads that it does not define itself, outside index scripts."""
    indices: frozenset[str] = frozenset()
    """Symbols read only inside index scripts (the i of G_i, the t, h of O_{t,h}): positions, heads, experts."""
    subscripted: frozenset[str] = frozenset()
    """Symbols the step writes with an index subscript (Q_h, G_i): tensors, never indices themselves."""


def tokens(latex: str) -> list[str]:
    """The LaTeX's tokens, stream colours and whitespace dropped."""
    return [t for t in _TOKEN.findall(_COLOR.sub("", latex)) if not t.isspace()]


def _group_end(toks: list[str], i: int) -> int:
    """Index just past the group opening at toks[i] ("{"), or past the single token there."""
    if i >= len(toks) or toks[i] != "{":
        return i + 1
    depth = 0
    for j in range(i, len(toks)):
        depth += {"{": 1, "}": -1}.get(toks[j], 0)
        if depth == 0:
            return j + 1
    return len(toks)


def _inner(toks: list[str], i: int, end: int) -> list[str]:
    return toks[i + 1:end - 1] if toks[i] == "{" else toks[i:end]


INDICES = frozenset("hijtnesmcpwrlLT")
"""Letters that, alone or together in a script (M_{ts}, O_{t,h}), index a symbol rather than name it."""


NAMED_BY_SCRIPT = frozenset({"W", "b"})
"""Bases whose every letter script names which one (W_{w}, b_{q}, b_r): weights and biases are not indexed by
letters."""


_RUNNING = frozenset("eijhnts")
"""The indices a weight's or bias's subscript can carry (W^{d}_e, W_{2,i}); its other letters name it (W_{q}, b_r)."""


def _script_name(inner: list[str], sup: str) -> str:
    """The parts of a script that name the symbol (\\mathrm{...}, or letters that are not all index letters:
    W_{DQ}, W_{qkv}, c^{KV}); "" for an index or an exponent (Q_h, O_{64}, K^{\\top}, x^2)."""
    names, part = [], []
    for t in [*inner, ","]:
        if t != ",":
            part.append(t)
            continue
        if part == ["\\log"]:  # A_{\\log}: the log of A, stored
            names.append("\\log")
        elif part and part[0] == "\\mathrm":
            names.append(r"\mathrm{" + "".join(x for x in part[1:] if x not in "{}") + "}")
        else:
            letters = [x for x in part if x not in "{}" and x != "\\top"]
            word = "".join(letters)
            if letters and all(re.fullmatch(r"[A-Za-z]+", x) or (sup == "sup" and x[1:] in GREEK) for x in letters) and (
                    sup == "sup" or set(word) - (INDICES if not sup else _RUNNING)):
                names.append(word)
        part = []
    return ",".join(names)


def _symbol(toks: list[str], i: int, found: list[str]) -> int:
    """Read the symbol starting at toks[i] into found (with the reads inside its index scripts); return the index
    past it."""
    accent = ""
    if toks[i][1:] in ACCENTS:
        accent = toks[i] + " "
        i += 1
        if toks[i] == "{":  # \hat{x}: the accent's group holds the base
            end = _group_end(toks, i)
            inner_found: list[str] = []
            scan(_inner(toks, i, end), inner_found)
            found += [accent + s for s in inner_found]
            return _scripts(toks, end, "", found)
    if toks[i] == "e" and i + 1 < len(toks) and toks[i + 1] == "^":  # the exponential: its exponent is read
        end = _group_end(toks, i + 2)
        scan(_inner(toks, i + 2, end), found)
        return end
    if toks[i] == "\\mathcal":
        end = _group_end(toks, i + 1)
        base = r"\mathcal{" + "".join(t for t in _inner(toks, i + 1, end) if t not in "{}") + "}"
        i = end
    else:
        base = toks[i]
        i += 1
    return _scripts(toks, i, accent + base, found)


def _scripts(toks: list[str], i: int, base: str, found: list[str]) -> int:
    primes, sup, sub, indexed = "", "", "", False
    while i < len(toks) and toks[i] in ("'", "_", "^"):
        if toks[i] == "'":
            primes += "'"
            i += 1
            continue
        end = _group_end(toks, i + 1)
        inner = _inner(toks, i + 1, end)
        name = _script_name(inner, "sup" if toks[i] == "^" else "weight" if base in NAMED_BY_SCRIPT else "")
        if toks[i] == "^":
            sup = sup or name
        else:
            sub = sub or name
        if not name:  # an index expression: what it reads is read, even on a left side
            indexed = indexed or toks[i] == "_"
            inside: list[str] = []
            scan(inner, inside)
            found += [s if s.startswith(_IN_INDEX) else _IN_INDEX + s for s in inside]
        i = end
    if base:
        key = base + primes + (f"^{{{sup}}}" if sup else "") + (f"_{{{sub}}}" if sub else "")
        found += [key, _INDEXED + key] if indexed else [key]
    return i


def scan(toks: list[str], found: list[str]) -> None:
    """Append every symbol in toks to found, in order."""
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.startswith("\\") and t[1:] in _FUNCTION_ARG:
            i = _group_end(toks, i + 1)
            while t == "\\operatorname" and i < len(toks) and toks[i] in ("_", "^"):  # RoPE_{2D}, top_{8}: part
                i = _group_end(toks, i + 1)                                          # of the function's name
        elif t in ("_", "^"):  # a script on a bracket or a function ([g\\,u]_{e,:I}, \\max(u,0)^{2}): an index or exponent
            i = _scripts(toks, i, "", found)
        elif (len(t) == 1 and t.isalpha()) or (t.startswith("\\") and (t[1:] in GREEK or t[1:] in ACCENTS
                                                                         or t == "\\mathcal")):
            i = _symbol(toks, i, found)
        else:
            i += 1


def symbols_of(latex: str) -> list[str]:
    """Every symbol in a LaTeX fragment outside its index scripts, in order of appearance."""
    found: list[str] = []
    scan(tokens(latex), found)
    return [s for s in found if not s.startswith((_IN_INDEX, _INDEXED))]


_DEPTH = {"{": 1, "}": -1, "\\left": 1, "\\right": -1, "\\begin": 1, "\\end": -1}
"""How a token changes the nesting depth: a clause is split, and its = found, only at depth 0."""


def _clauses(toks: list[str]) -> list[list[str]]:
    """The step's top-level clauses, split at \\quad and at a comma followed by a space command."""
    out: list[list[str]] = [[]]
    depth = 0
    for j, t in enumerate(toks):
        depth += _DEPTH.get(t, 0)
        at_top = depth == 0
        if at_top and (t in ("\\quad", "\\qquad") or (t == "," and j + 1 < len(toks) and toks[j + 1] in ("\\ ",))):
            out.append([])
        else:
            out[-1].append(t)
    merged: list[list[str]] = []
    for clause in (c for c in out if c):
        if merged and _is_bare_symbol(merged[-1]):
            merged[-1] = [*merged[-1], ",", *clause]
        else:
            merged.append(clause)
    return merged


def _is_bare_symbol(clause: list[str]) -> bool:
    """Symbols and commas only: the head of a list of symbols that a later clause defines together
    (x_t,\\ B_t,\\ C_t=\\operatorname{split}(...))."""
    found: list[str] = []
    scan(clause, found)
    return len(found) >= 1 and all(len(t) == 1 and (t.isalnum() or t in "_^{}',") or t[1:] in GREEK | ACCENTS
                                   or t in ("\\mathrm", "\\ ", "\\,") for t in clause)


def _top_level(toks: list[str], wanted: tuple[str, ...]) -> int:
    depth = 0
    for j, t in enumerate(toks):
        depth += _DEPTH.get(t, 0)
        if depth == 0 and t in wanted:
            return j
    return -1


@lru_cache(maxsize=None)  # immutable result; the same step recurs in every model of a family and on many pages
def parse_step(latex: str) -> StepSymbols:
    """What a step defines (the left sides of its clauses) and reads (the rest, less what it defines)."""
    defines: list[str] = []
    reads: list[str] = []
    updated: list[str] = []
    for clause in _clauses(tokens(latex)):
        at = _top_level(clause, ("=", "\\leftarrow"))
        if at < 0:
            scan(clause, reads)
            continue
        lhs: list[str] = []
        scan(clause[:at], lhs)
        rest = clause[at + 1:]
        more = _top_level(rest, ("=",))
        while more >= 0 and _is_bare_symbol(rest[:more]):  # K = V = [...]: both defined
            scan(rest[:more], lhs)
            rest = rest[more + 1:]
            more = _top_level(rest, ("=",))
        (updated if clause[at] == "\\leftarrow" else defines).extend(s for s in lhs if not s.startswith(_IN_INDEX))
        reads += [s for s in lhs if s.startswith(_IN_INDEX)]
        scan(rest, reads)
    marks = {s.replace(_IN_INDEX, "").replace(_INDEXED, "") for s in (*defines, *reads, *updated) if _INDEXED in s}
    defines, reads, updated = ([s for s in group if _INDEXED not in s] for group in (defines, reads, updated))
    own = set(defines)
    plain = {r for r in reads if not r.startswith(_IN_INDEX)} - own
    indexed = {r.lstrip(_IN_INDEX) for r in reads if r.startswith(_IN_INDEX)} - own - plain
    return StepSymbols(frozenset(own | {u.lstrip(_IN_INDEX) for u in updated}), frozenset(plain),
                       frozenset(indexed), frozenset(marks))
