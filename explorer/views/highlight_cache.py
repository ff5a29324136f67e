"""Highlighted excerpts kept between builds (.cache/highlight/): Pygments was a sixth of a warm build's time, spent
again by every build (and by each page-writing process) on cited lines that rarely change.

The entries live in one file named by a hash of the package's modules and the Pygments version, so a change to
the highlighting code or the library starts a new file. The cache is not trusted: an entry is used only if it is
Pygments' class spans and views' line markup around exactly the cited text, so an edited cache can neither add
markup to a page nor change a quoted line; anything else is highlighted again."""

from __future__ import annotations

import hashlib
import html
import json
import re
from collections.abc import Iterable
from pathlib import Path

from explorer.execute.cache import read_strings, strings_file, write_strings
from explorer.figures.model_build import ModelBuild
from explorer.views.evidence import Excerpt, highlight_lines, remember_highlights

FORMAT = 1
_OPEN, _CLOSE = '<pre class="code"><code>', "</code></pre>"
_TAG = re.compile(r'<span class="[A-Za-z0-9_ -]+"(?: aria-hidden="true")?>|</span>')


def prime(folder: Path | None, builds: Iterable[ModelBuild]) -> None:
    """Make every excerpt the pages quote known to views.highlight_lines before the page writers fork: from the
    cache in `folder` where an entry holds, the rest highlighted here and the cache rewritten with exactly the
    excerpts of this build (None: no cache, as with --no-cache)."""
    wanted = {_key(ex): ex for ex in {(c.lines, c.first, c.file) for mb in builds for cits in mb.citations.values()
                                      for c in cits if c.lines is not None}}
    path = strings_file(folder, "highlight", FORMAT, "pygments") if folder is not None else None
    stored = read_strings(path) if path is not None else {}
    remember_highlights({ex: stored[key] for key, ex in wanted.items() if key in stored and holds(ex, stored[key])})
    entries = {key: highlight_lines(*ex) for key, ex in wanted.items()}  # the remembered ones are looked up
    if path is None or entries == stored:
        return
    write_strings(path, entries)


def holds(excerpt: Excerpt, markup: str) -> bool:
    """Whether `markup` is spans around exactly the excerpt's numbered lines (what views._highlight writes)."""
    lines, first, _ = excerpt
    if not (markup.startswith(_OPEN) and markup.endswith(_CLOSE)):
        return False
    text = _TAG.sub("", markup[len(_OPEN):-len(_CLOSE)])
    return "<" not in text and ">" not in text and html.unescape(text) == "".join(
        f"{first + i}{line}" for i, line in enumerate(lines))


def _key(excerpt: Excerpt) -> str:
    return hashlib.sha256(json.dumps(excerpt).encode()).hexdigest()
