"""The build's worker pools (explorer/parallel.py): results in task order whatever finishes first, work that
runs while the caller does something else, and no pool where one process is asked for."""

from __future__ import annotations

import os
import time

import pytest

from explorer.parallel import run_in_order, started_in_order


def _sleep_then(value: int, seconds: float) -> tuple[int, int]:
    time.sleep(seconds)
    return value, os.getpid()


def test_results_come_in_task_order_whichever_finishes_first():
    tasks = [lambda: _sleep_then(0, 0.3), lambda: _sleep_then(1, 0.0), lambda: _sleep_then(2, 0.1)]
    results = list(run_in_order(tasks, 2))
    assert [value for value, _ in results] == [0, 1, 2]
    assert len({pid for _, pid in results}) == 2 and os.getpid() not in {pid for _, pid in results}


def test_one_job_runs_here():
    assert {pid for _, pid in run_in_order([lambda: _sleep_then(0, 0)] * 3, 1)} == {os.getpid()}


def _mark(path) -> int:
    path.write_text("started")
    return os.getpid()


def test_started_tasks_run_before_the_caller_asks_for_them(tmp_path):
    """What lets the build import torch while the first pool works: the tasks run as soon as they are started."""
    marks = [tmp_path / f"task-{i}" for i in range(2)]
    with started_in_order([lambda m=m: _mark(m) for m in marks], 2) as results:
        deadline = time.monotonic() + 30
        while not all(m.exists() for m in marks) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(m.exists() for m in marks)  # before a single result was asked for
        assert os.getpid() not in set(results)
    with started_in_order([lambda: _mark(tmp_path / "here")], 0) as results:
        assert not (tmp_path / "here").exists()  # no workers: the task runs as the caller iterates
        assert list(results) == [os.getpid()]


def test_a_failing_task_raises_in_the_caller():
    def fails() -> None:
        raise ValueError("task 1 failed")

    with pytest.raises(ValueError, match="task 1 failed"):
        list(run_in_order([lambda: 0, fails], 2))
    assert list(run_in_order([lambda: 5, lambda: 6], 2)) == [5, 6]  # and the next pool starts clean


def test_costliest_tasks_are_handed_out_first_and_results_stay_in_task_order():
    ran: list[str] = []

    def task(name: str) -> str:
        ran.append(name)
        return name

    tasks = [lambda: task("small"), lambda: task("large"), lambda: task("medium")]
    assert list(run_in_order(tasks, 1, costs=[1, 30, 5])) == ["small", "large", "medium"]
    assert ran == ["large", "medium", "small"]
    assert list(run_in_order(tasks, 2, costs=[1, 30, 5])) == ["small", "large", "medium"]
