"""Independent work on every core: a pool of forked workers that inherit the parent's memory.

Tasks are zero-argument callables. Only a task's number crosses to a worker (the worker finds the task in the
memory it inherited), and only its result comes back, pickled; results arrive in task order, whichever worker
finishes first, so output never depends on scheduling.

A task's error reaches the caller as it was raised (or, where it cannot cross the process boundary, as one of the
same kind carrying its message), and a worker that dies ends the pool with WorkerError: concurrent.futures
notices a dead worker or an unreadable result, where multiprocessing.Pool waited for them forever (issue 18)."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any

from explorer.errors import ExplorerError, WorkerError

_PR_SET_PDEATHSIG = 1
_parent = os.getpid()
"""The process that forks the workers (updated at each pool's start)."""
_tasks: list[Callable[[], Any]] = []
"""The tasks of the pool being run, as its workers inherit them at the fork."""


@contextmanager
def started_in_order(tasks: Sequence[Callable[[], Any]], workers: int,
                     initializer: Callable[[], None] | None = None) -> Iterator[Iterator[Any]]:
    """Start the tasks on `workers` forked workers now; the body runs alongside them and iterates their results,
    in task order. With no workers the tasks run here, as the body iterates."""
    global _tasks, _parent
    if workers <= 0 or not tasks:
        yield (task() for task in tasks)
        return
    if _tasks:
        raise RuntimeError("pools of tasks do not nest")
    _tasks = list(tasks)
    _parent = os.getpid()
    # The collector in a worker would walk every object inherited at the fork, writing to their pages and so
    # copying them; frozen objects are left alone (and freed with the worker).
    gc.freeze()
    pool = ProcessPoolExecutor(min(workers, len(tasks)), multiprocessing.get_context("fork"), _start_worker,
                               (initializer,))
    finished = False
    try:
        futures = [pool.submit(_run, i) for i in range(len(tasks))]  # handed to the workers at once
        yield _results(futures)
        finished = True
    finally:
        _tasks = []
        gc.unfreeze()
        _close(pool, finished)


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


def _results(futures: list[Any]) -> Iterator[Any]:
    for i, future in enumerate(futures):
        try:
            yield future.result()
        except BrokenProcessPool as e:
            raise WorkerError(f"a build worker process ended abruptly (killed, or out of memory?) with task {i + 1} "
                              f"of {len(futures)} unfinished; --jobs 1 runs every task in this process "
                              f"({e.__cause__ or e})") from e


def _close(pool: ProcessPoolExecutor, finished: bool) -> None:
    """Wait for the workers where every result was read; otherwise (an error, Ctrl-C) stop them now rather than
    let them finish work nobody will read."""
    if finished:
        pool.shutdown(wait=True)
        return
    processes = list((pool._processes or {}).values())  # no public way to stop running tasks; shutdown forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:  # reaped, so none outlives the build holding its output pipes or lock
        process.join()


def _start_worker(initializer: Callable[[], None] | None) -> None:
    # Ctrl-C reaches every process of the terminal's group: the parent alone reports it and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if initializer is not None:
        initializer()


def _die_with_parent() -> None:
    """Have Linux kill this worker when the build process dies (SIGKILL included), so that no orphan goes on
    working, holding the output lock and the terminal's pipes (issue 18)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != _parent:  # the parent died before the request took effect
        os._exit(1)


def _run(i: int) -> Any:
    try:
        return _tasks[i]()
    except Exception as e:
        raise _portable(e) from None


def _portable(e: Exception) -> Exception:
    """The error itself where it survives pickling; otherwise one the parent can rebuild, with its message."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        kind = ExplorerError if isinstance(e, ExplorerError) else RuntimeError
        return kind(f"{type(e).__name__}: {e}" if kind is RuntimeError else str(e))
