"""Error hierarchy: every expected failure names the file, the key and what would be valid."""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable


class ExplorerError(Exception):
    """An expected failure: build.py prints it without a traceback and exits 1.

    Each subclass with its own constructor defines __reduce__ from the arguments it was built with: a build
    worker's error is pickled to reach the parent, and Exception's default rebuilds it from `args` (the one
    formatted message), which such a constructor cannot take, so the parent could not unpickle it and the pool
    would wait forever (issue 18)."""


class ContentError(ExplorerError):
    """One or more problems in content/ (or in what content cites), reported all at once."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))

    def __reduce__(self) -> tuple[type, tuple[tuple[str, ...]]]:
        return type(self), (self.problems,)


class CheckpointError(ExplorerError):
    """A checkpoint header, index or Hub request could not be read; names the file or URL."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.source, self.reason)


class ReconciliationError(ExplorerError):
    """The stored tensors and the spec disagree."""


class ExecutionError(ExplorerError):
    """A component failed to run; names model, component and step, and what ran before it."""

    def __init__(self, where: str, reason: str, executed: tuple[str, ...] = ()) -> None:
        self.where = where
        self.reason = reason
        self.executed = tuple(executed)
        after = f" (after: {', '.join(executed[-5:])})" if executed else ""
        super().__init__(f"{where}: {reason}{after}")

    def __reduce__(self) -> tuple[type, tuple[str, str, tuple[str, ...]]]:
        return type(self), (self.where, self.reason, self.executed)


class OutputError(ExplorerError):
    """The output folder cannot be used: it holds someone's data, another build is writing it, or it cannot be
    written; names the folder and what to do instead."""


class WorkerError(ExplorerError):
    """A build worker process ended without returning its task's result or error (killed, out of memory)."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return "; did you mean 'x'?" for the closest choice, or "" when none is close."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def printable(text: str) -> str:
    """Escape control and format characters (ANSI escapes, bidi overrides) so a tensor or file name from a
    checkpoint cannot drive the terminal it is printed to; newlines between messages are kept."""
    return "\n".join("".join(_escape(c) for c in line) for line in text.split("\n"))


def _escape(c: str) -> str:
    if unicodedata.category(c) not in ("Cc", "Cf"):
        return c
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
