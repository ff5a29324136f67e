"""Where a build's inputs live; kept apart from the pipeline so the up-to-date check imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Protected:
    """A folder of the project that the output folder may not equal or contain."""

    label: str
    path: Path
    may_hold_output: bool = False
    """Whether the output folder may lie inside it (the project root holds site/ by default)."""


@dataclass(frozen=True, slots=True)
class Project:
    """Where the inputs live (the repository root by default)."""

    root: Path

    @property
    def content(self) -> Path:
        return self.root / "content"

    @property
    def templates(self) -> Path:
        return self.root / "templates"

    @property
    def static(self) -> Path:
        return self.root / "static"

    @property
    def cache(self) -> Path:
        return self.root / ".cache" / "execute"

    @property
    def mathml(self) -> Path:
        """Formulas converted to MathML kept between builds (explorer/views/mathml_cache.py)."""
        return self.root / ".cache" / "mathml"

    @property
    def highlights(self) -> Path:
        """Highlighted excerpts kept between builds (explorer/views/highlight_cache.py)."""
        return self.root / ".cache" / "highlight"

    @property
    def protected(self) -> tuple[Protected, ...]:
        """Folders an output folder may not replace (it may lie inside the project, as site/ does)."""
        return (Protected("the project", self.root, may_hold_output=True), Protected("the content", self.content),
                Protected("the templates", self.templates), Protected("the static files", self.static),
                Protected("the cache", self.cache), Protected("the cache", self.highlights))
