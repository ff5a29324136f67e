"""Independent work on every core: a pool of forked workers that inherit the parent's memory.

Tasks are zero-argument callables. Only a task's number crosses to a worker (the worker finds the task in the
memory it inherited), and only its result comes back, pickled; results arrive in task order, whichever worker
finishes first, so output never depends on scheduling."""

from __future__ import annotations

import gc
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

_tasks: list[Callable[[], Any]] = []
"""The tasks of the pool being run, as its workers inherit them at the fork."""


@contextmanager
def started_in_order(tasks: Sequence[Callable[[], Any]], workers: int,
                     initializer: Callable[[], None] | None = None) -> Iterator[Iterator[Any]]:
    """Start the tasks on `workers` forked workers now; the body runs alongside them and iterates their results,
    in task order. With no workers the tasks run here, as the body iterates."""
    global _tasks
    if workers <= 0 or not tasks:
        yield (task() for task in tasks)
        return
    if _tasks:
        raise RuntimeError("pools of tasks do not nest")
    _tasks = list(tasks)
    # The collector in a worker would walk every object inherited at the fork, writing to their pages and so
    # copying them; frozen objects are left alone (and freed with the worker).
    gc.freeze()
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(tasks)), initializer) as pool:
            yield pool.imap(_run, range(len(tasks)))  # handed to the workers at once, not as they are iterated
    finally:
        _tasks = []
        gc.unfreeze()


def run_in_order(tasks: Sequence[Callable[[], Any]], jobs: int, initializer: Callable[[], None] | None = None,
                 costs: Sequence[float] | None = None) -> Iterator[Any]:
    """Each task's result, in task order, from `jobs` processes (one: this one); iterate to the end (the pool
    lives as long). With `costs` (estimates, any unit), the costliest tasks are handed out first, so that no
    long task starts last while the other workers have nothing left to do."""
    order = sorted(range(len(tasks)), key=lambda i: -costs[i]) if costs else list(range(len(tasks)))
    workers = jobs if jobs > 1 and len(tasks) > 1 else 0
    with started_in_order([tasks[i] for i in order], workers, initializer) as results:
        waiting: dict[int, Any] = {}
        following = 0
        for i, result in zip(order, results):
            waiting[i] = result
            while following in waiting:
                yield waiting.pop(following)
                following += 1


def _run(i: int) -> Any:
    return _tasks[i]()
