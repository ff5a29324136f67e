"""Independent work on every core: a pool of forked workers that inherit the parent's memory.

Tasks are zero-argument callables. Only a task's number crosses to a worker (the worker finds the task in the
memory it inherited), and only its result comes back, pickled; results arrive in task order, whichever worker
finishes first, so output never depends on scheduling."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

_tasks: list[Callable[[], Any]] = []
"""The tasks of the pool being run, as its workers inherit them at the fork."""


def run_in_order(tasks: Sequence[Callable[[], Any]], jobs: int,
                 initializer: Callable[[], None] | None = None) -> Iterator[Any]:
    """Each task's result, in task order; `jobs` workers (one: run here, in this process). Iterate to the end:
    the pool lives as long as the iteration."""
    global _tasks
    jobs = min(jobs, len(tasks))
    if jobs <= 1:
        yield from (task() for task in tasks)
        return
    if _tasks:
        raise RuntimeError("run_in_order does not nest")
    _tasks = list(tasks)
    try:
        with multiprocessing.get_context("fork").Pool(jobs, initializer) as pool:
            yield from pool.imap(_run, range(len(tasks)))
    finally:
        _tasks = []


def _run(i: int) -> Any:
    return _tasks[i]()
