"""Evidence view models: a component page's citations and the excerpts of pinned source they cite, highlighted by
Pygments (memoised per process, and handed from the worker that highlights a model to the page writers)."""

from __future__ import annotations

from dataclasses import dataclass

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import JsonLexer, PythonLexer

from explorer.checkpoint.sources import UNPINNED_BRANCH, ResolvedCitation
from explorer.content.model_content import UNPINNED
from explorer.figures.model_build import ModelBuild
from explorer.spec.types import Component, path_key
from explorer.views.basics import Link


@dataclass(frozen=True, slots=True)
class ExcerptView:
    """One cited range of one file, shown once per page however many claims cite it."""

    anchor: str
    """Id of the excerpt on its page ("code-1"), which the claims citing it link to."""
    file: str
    lines: str
    source: str
    revision_short: str
    url: str
    html: str
    """Highlighted lines, each with its own line number, or "" when the file is not at hand."""
    note: str
    """How the text was obtained, or why it is not shown, in reader terms ("" for an installed package)."""
    note_link: Link | None = None
    """Where to read lines that are not shown (the pinned file on Hugging Face)."""


@dataclass(frozen=True, slots=True)
class CitationView:
    claim: str
    scope: str
    source: str
    file: str
    revision_short: str
    url: str
    lines: str
    excerpt: Link
    """The excerpt on this page that holds the cited lines (its caption and anchor)."""
    pin: str
    """What the link is: "Pinned revision", or the current file of a checkpoint recorded without one."""


Excerpt = tuple[tuple[str, ...], int, str]
"""Cited lines, the number of the first, and the file's name."""
_highlighted: dict[Excerpt, str] = {}
"""highlight_lines' results in this process; a build adds those a worker made (highlight_citations)."""


def highlight_lines(lines: tuple[str, ...], first: int, file: str) -> str:
    """Pygments HTML, one element per line holding its own line number, so numbers cannot drift from lines."""
    key = (lines, first, file)
    if key not in _highlighted:
        _highlighted[key] = _highlight(*key)
    return _highlighted[key]


def highlight_citations(citations: dict[str, tuple[ResolvedCitation, ...]]) -> dict[Excerpt, str]:
    """The excerpts of a model's citations, highlighted as its pages will show them: made where a core is idle
    and handed to remember_highlights in the process that forks the page writers (highlighting is a third of
    the time pages take)."""
    return {(c.lines, c.first, c.file): highlight_lines(c.lines, c.first, c.file)
            for cits in citations.values() for c in cits if c.lines is not None}


def remember_highlights(highlighted: dict[Excerpt, str]) -> None:
    _highlighted.update(highlighted)


def _highlight(lines: tuple[str, ...], first: int, file: str) -> str:
    lexer = JsonLexer() if file.endswith(".json") else PythonLexer()
    body = highlight("\n".join(lines) + "\n", lexer, HtmlFormatter(nowrap=True))
    # HtmlFormatter closes every token's span at a line end, so each split line is well-formed on its own
    rows = body.rstrip("\n").split("\n")
    numbered = "".join(f'<span class="line"><span class="ln" aria-hidden="true">{first + i}</span>{row}</span>'
                       for i, row in enumerate(rows))
    return f'<pre class="code"><code>{numbered}</code></pre>'


def _revision_short(cit: ResolvedCitation) -> str:
    if cit.source == "transformers":
        return "v" + cit.revision
    return cit.revision[:12] if cit.revision != UNPINNED else "revision not pinned"


def pin_label(cit: ResolvedCitation) -> str:
    """What the citation's link is: the installed package's version, a checkpoint's pinned revision, or its
    repository's current file (no revision recorded)."""
    if cit.source == "transformers":
        return "Installed version"
    return "Pinned revision" if cit.revision != UNPINNED else "No pinned revision; current file"


def excerpt_note(cit: ResolvedCitation, config_sha256: str) -> str:
    """Where the excerpt's text comes from, or why it is not shown, for the reader."""
    if cit.origin == "regenerated":
        recorded = f"for {cit.revision[:7]}" if cit.revision != UNPINNED else "(revision not pinned)"
        return (f"Regenerated from the configuration values recorded {recorded}, and verified: the "
                f"regenerated file's sha256 ({config_sha256[:12]}…) equals the recorded hash of the published file.")
    if cit.origin == "absent" and cit.revision == UNPINNED:
        return "The file is not bundled with this site, and no revision of it is pinned; read"
    if cit.origin == "absent":
        return "The pinned file is not bundled with this site; read"
    if cit.origin == "cache":
        return f"Read from the pinned file at {cit.revision[:7]}."
    return ""


def excerpt_views(mb: ModelBuild, cits: list[tuple[ResolvedCitation, str]]) -> tuple[ExcerptView, ...]:
    """Each distinct cited range once: the checkpoint's own files first, then transformers."""
    ordered = sorted({(c.source == "transformers", c.file, c.first, c.last): c for c, _ in cits}.items())
    sha = mb.content.checkpoint.config_sha256
    return tuple(ExcerptView(f"code-{i}", c.file, f"{c.first}–{c.last}", c.source, _revision_short(c), c.url,
                             highlight_lines(c.lines, c.first, c.file) if c.lines is not None else "",
                             excerpt_note(c, sha), _read_at(c))
                 for i, (_, c) in enumerate(ordered, 1))


def _read_at(cit: ResolvedCitation) -> Link | None:
    if cit.origin != "absent":
        return None
    at = f"at {cit.revision[:7]}" if cit.revision != UNPINNED else f"in the current {UNPINNED_BRANCH} branch"
    return Link(f"lines {cit.first}–{cit.last} {at} on Hugging Face ↗", cit.url)


def citation_views(cits: list[tuple[ResolvedCitation, str]], excerpts: tuple[ExcerptView, ...],
                   ) -> tuple[CitationView, ...]:
    """The claims, each linked to the excerpt that holds its lines."""
    by_range = {(e.file, e.lines): e for e in excerpts}
    out = []
    for c, scope in cits:
        lines = f"{c.first}–{c.last}"
        ex = by_range[(c.file, lines)]
        out.append(CitationView(c.claim, scope, c.source, c.file, _revision_short(c), c.url, lines,
                                Link(f"{c.file} {lines}", f"#{ex.anchor}"), pin_label(c)))
    return tuple(out)


# --------------------------------------------------------------------------------------------- evidence

def evidence(mb: ModelBuild, ancestors: tuple[Component, ...], comp: Component,
             ) -> list[tuple[ResolvedCitation, str]]:
    """The component's own citations, then the nearest ancestor's (the module that defines it), with scopes."""
    path = path_key(ancestors, comp)
    found = [(c, comp.key or "model") for c in mb.citations.get(path, ())]
    chain = list(ancestors)
    while chain and len(found) < 2:
        parent = chain.pop()
        parent_path = path_key(tuple(chain), parent)
        found += [(c, parent.key or "model") for c in mb.citations.get(parent_path, ())]
    return found
