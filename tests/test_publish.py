"""The output folder (issue 13): --out never replaces someone's data, a published site exists at every instant
of a swap, killed builds leave nothing behind, and concurrent builds fail with one line. The swap and lock
cases run as real processes that are killed or race, as a user's would."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, build_main, run_build

from explorer.errors import OutputError
from explorer.project import Protected
from explorer.render.publish import MARKER, check_output, claim_output, lock_path, publish, stage


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The build failed as expected: exit 1, a single 'error:' line, no traceback."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("  ")]  # progress lines
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_pointed_at_the_project_deletes_nothing(project_copy):
    """Issue 13, reproduction 1: `--content DIR --out DIR` used to leave only the site in DIR."""
    before = snapshot(project_copy)
    line = one_error_line(run_build("--content", str(project_copy), "--out", str(project_copy)))
    assert line == (f"error: {project_copy}: the output folder would replace the project ({project_copy}); "
                    "choose another --out")
    assert snapshot(project_copy) == before


def test_out_pointed_at_the_content_folder_deletes_nothing(project_copy):
    """Issue 13, reproduction 1: `--out DIR/content` used to delete model.toml."""
    before = snapshot(project_copy)
    line = one_error_line(build_main("--content", str(project_copy), "--out", str(project_copy / "content")))
    assert "the output folder would replace the content" in line
    assert snapshot(project_copy) == before


def protected(root: Path) -> tuple[Protected, ...]:
    from explorer.pipeline import Project

    return Project(root).protected


@pytest.mark.parametrize("rel, reason", [
    ("", "would replace the project"),
    ("content", "would replace the content"),
    ("content/models/kimi-k2/site", "lies inside the content"),
    ("templates", "would replace the templates"),
    (".cache", "would replace the cache"),
    (".cache/execute/site", "lies inside the cache"),
    ("..", "would replace the project"),
])
def test_out_may_not_equal_hold_or_lie_inside_the_inputs(project_copy, rel, reason):
    with pytest.raises(OutputError, match=reason):
        check_output(project_copy / rel, protected(project_copy))


def test_out_holding_someone_elses_files_is_refused(tmp_path):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(OutputError) as info:
        check_output(out)
    assert str(info.value) == (f"{out}: the output folder is not empty and was not written by explorer (no {MARKER} "
                               "file); empty it or choose another --out")
    assert (out / "holiday.jpg").exists()


def test_out_that_is_a_file_or_a_root_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        check_output(tmp_path / "notes.txt")
    with pytest.raises(OutputError, match="cannot be a filesystem root"):
        check_output(Path("/"))


def test_empty_new_and_marked_folders_may_be_replaced(project_copy, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / MARKER).write_text("")
    (tmp_path / "ours" / "index.html").write_text("old site")
    for name in ("empty", "new", "ours"):
        assert check_output(tmp_path / name, protected(project_copy)) == tmp_path / name
    assert check_output(project_copy / "site", protected(project_copy)) == project_copy / "site"


@pytest.mark.parametrize("make_out, reason", [
    (lambda tmp: tmp / "notes.txt" / "site", "notes.txt is a file, so the output folder cannot be made there"),
    (lambda tmp: tmp / ("x" * 300), "cannot use as the output folder: File name too long"),
])
def test_impossible_out_is_one_line(tmp_path, make_out, reason):
    """Issue 13, reproduction 7: an impossible --out used to end in a traceback."""
    (tmp_path / "notes.txt").write_text("mine")
    line = one_error_line(build_main("--out", str(make_out(tmp_path))))
    assert reason in line


def test_unwritable_out_is_one_line(tmp_path):
    """Issue 13, reproduction 7 (unwritable): the lock file cannot be created, under root too."""
    with pytest.raises(OutputError, match="cannot create the output folder's parent"):
        with claim_output(Path("/proc/explorer-site/site")):
            pass


def test_empty_models_folder_keeps_the_published_site(project_copy, tmp_path):
    """Issue 13, reproduction 8: an empty content/models used to publish an empty site, exit 0."""
    out = tmp_path / "site"
    out.mkdir()
    (out / MARKER).write_text("")
    (out / "index.html").write_text("published")
    shutil.rmtree(project_copy / "content" / "models")
    (project_copy / "content" / "models").mkdir()
    line = one_error_line(build_main("--content", str(project_copy), "--out", str(out)))
    assert line == (f"error: {project_copy / 'content' / 'models'}: no model folders; an empty site would replace "
                    "the published one")
    assert (out / "index.html").read_text() == "published"


# ------------------------------------------------------------------------------------ real processes

PUBLISH_FOREVER = """
import itertools, sys
from pathlib import Path
from explorer.render.publish import claim_output, publish, stage
out = Path(sys.argv[1])
for i in itertools.count():
    with claim_output(out) as o:
        tmp = stage(o)
        (tmp / "page.html").write_text(str(i))
        (tmp / "index.html").write_text(str(i))
        publish(tmp, o)
"""

HOLD = """
import sys, time
from pathlib import Path
from explorer.render.publish import claim_output, stage
with claim_output(Path(sys.argv[1])) as o:
    print(stage(o) if sys.argv[2] == "stage" else "held", flush=True)
    time.sleep(120)
"""


def start(script: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE, text=True)


def publish_once(out: Path, text: str) -> None:
    with claim_output(out) as o:
        tmp = stage(o)
        (tmp / "index.html").write_text(text)
        publish(tmp, o)


def test_killed_swaps_never_leave_the_folder_without_a_site(tmp_path):
    """Issue 13, reproduction 8: a kill between two renames used to leave no site/. Here a process swapping in
    new sites as fast as it can is killed at random moments while a reader keeps opening index.html."""
    out = tmp_path / "site"
    publish_once(out, "first")
    misses: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if not os.path.exists(out / "index.html"):
                misses.append(time.monotonic())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for delay in (0.4, 0.55, 0.7, 0.85):
            child = start(PUBLISH_FOREVER, str(out))
            time.sleep(delay)
            child.send_signal(signal.SIGKILL)
            child.wait()
    finally:
        stop.set()
        watcher.join()
    assert misses == []
    assert int((out / "index.html").read_text()) > 0  # the children did publish
    publish_once(out, "last")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # leftovers and lock file gone
    assert (out / MARKER).exists()


def test_a_killed_build_leaves_nothing_behind_after_the_next(tmp_path):
    """Issue 13, reproduction 8: every killed build used to leave a complete .site.tmp-* folder behind."""
    out = tmp_path / "site"
    publish_once(out, "first")
    child = start(HOLD, str(out), "stage")
    staged = Path(child.stdout.readline().strip())
    (staged / "index.html").write_text("half-written")
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".site.lock", staged.name, "site"]
    publish_once(out, "second")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]
    assert (out / "index.html").read_text() == "second"


def test_a_concurrent_build_fails_with_one_line(tmp_path):
    """Issue 13, reproduction 8: concurrent builds into one folder used to fail with tracebacks."""
    out = tmp_path / "site"
    publish_once(out, "published")
    holder = start(HOLD, str(out), "hold")
    try:
        assert holder.stdout.readline().strip() == "held"
        line = one_error_line(run_build("--out", str(out)))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert line == (f"error: {out}: another build (pid {holder.pid}) is writing this folder; wait for it to finish "
                    "or choose another --out")
    assert (out / "index.html").read_text() == "published"
    publish_once(out, "after")  # the dead holder's lock is free again
    assert not lock_path(out).exists()


def test_the_site_folder_is_readable_by_others(tmp_path):
    """Issue 25: site/ was created 0700 (mkdtemp's mode), so a web server running as another user got 403."""
    from explorer.render.publish import stage

    old = os.umask(0o022)
    try:
        staged = stage(tmp_path / "site")
    finally:
        os.umask(old)
    assert staged.stat().st_mode & 0o777 == 0o755


def test_an_old_site_that_cannot_be_removed_is_named_not_left_silently(tmp_path, monkeypatch, capsys):
    """Issue 37 (low): a previous site the build cannot delete (read-only media, another owner's files) stays beside
    the new one; the build says where, in one line, and the new site is in place."""
    out = tmp_path / "site"
    publish_once(out, "first")
    from explorer.render import publish as publish_module

    monkeypatch.setattr(publish_module.shutil, "rmtree", lambda *a, **k: None)  # nothing can be deleted
    monkeypatch.setattr(publish_module, "_exchange", lambda staged, out: False)  # the two-rename path
    publish_once(out, "second")
    assert (out / "index.html").read_text() == "second"
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "could not be removed" in warning[0] and ".site.old" in warning[0]
