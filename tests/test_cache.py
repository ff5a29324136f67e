"""The torch stages' cache and the tolerance test (issue 13): a check never passes on NaN, and a cached result is
re-validated when read, so a tampered, stale or oddly shaped entry is recomputed instead of published."""

from __future__ import annotations

import json
import math

import pytest
from conftest import ROOT

from explorer.checkpoint.index import CheckpointIndex, TensorInfo
from explorer.content.model_content import load_model_content
from explorer.execute import cache
from explorer.execute.cache_seal import SEAL_KEY, sealed
from explorer.execute.reference import ReferenceModel
from explorer.model.families import load_model_spec
from explorer.spec.results import TOLERANCE, ComponentTrace, EquationCheck, Execution, ShapeTrace, within_tolerance


@pytest.mark.parametrize("error, passes", [
    (0.0, True), (3e-6, True), (TOLERANCE, True),
    (2e-4, False), (math.nan, False), (math.inf, False), (-math.inf, False), (-1.0, False),
])
def test_within_tolerance_fails_non_finite_errors(error, passes):
    """Issue 13, reproduction 4: `error > TOLERANCE` is False for NaN, so NaN used to pass."""
    assert within_tolerance(error) is passes


@pytest.fixture(scope="module")
def spec():
    return load_model_spec(load_model_content(ROOT / "content/models/kimi-k2"))


@pytest.fixture
def entry(tmp_path, spec):
    """A small valid cache entry for the real spec's key, and its path."""
    ref = ReferenceModel("transformers test", CheckpointIndex.of({"w": TensorInfo("w", "F32", (2, 3))}, "test"))
    cache.save(tmp_path, spec, ref, consistent_execution(spec))
    (path,) = tmp_path.glob("*.json")
    return path


def consistent_execution(spec) -> Execution:
    """An execution that agrees with the spec (every component, each shape as the spec names it), as the
    executor would have recorded it; the model's own check passes at 3e-6, the others are unchecked."""
    import importlib.metadata

    from explorer.spec.results import FREE_SIZES
    from explorer.spec.types import path_key, walk

    def concrete(shape) -> tuple[int, ...]:
        return tuple(FREE_SIZES[d.symbol] if d.size is None else d.size for d in shape.dims)

    components, checks = {}, {}
    for ancestors, comp in walk(spec.root):
        path = path_key(ancestors, comp)
        steps = {s.name: concrete(s.shape) for s in comp.steps + comp.equations if not s.heading and s.shape}
        components[path] = ComponentTrace(tuple(concrete(p.shape) for p in comp.inputs),
                                          tuple(concrete(p.shape) for p in comp.outputs), steps)
        checks[path] = EquationCheck("unchecked", detail="not checked in this test")
    version = importlib.metadata.version("transformers")
    checks[""] = EquationCheck("checked", f"transformers {version} Model", "tiny", 3e-6, TOLERANCE, "detail")
    return Execution(ShapeTrace("meta", dict(FREE_SIZES), components), checks)


def tamper(path, change, reseal: bool = True) -> None:
    """Edit an entry's data; resealed (as only a forger holding the cache's key could), so that the checks made on
    reading, behind the seal, are what is tested."""
    head, _, text = path.read_text().partition("\n")
    data = json.loads(text)
    change(data)
    text = json.dumps(data)
    path.write_text(sealed(path.parent, path.name, text) if reseal else f"{head}\n{text}")


def test_valid_entry_is_read_back(tmp_path, spec, entry):
    ref, execution = cache.load(tmp_path, spec)
    assert execution.checks[""].max_abs_error == 3e-6 and ref.index.tensors["w"].shape == (2, 3)


@pytest.mark.parametrize("change", [
    lambda d: d["checks"][""].update(max_abs_error=123.0),          # reproduction 4: published as checked
    lambda d: d["checks"][""].update(max_abs_error=math.nan),
    lambda d: d["checks"][""].update(tolerance=1e9),
    lambda d: d["checks"][""].update(status="passed"),
    lambda d: d.update(checks=[]),                                   # reproduction 7: unexpected shape
    lambda d: d["trace"]["components"][""].update(inputs="[2, 5, 8]"),
    lambda d: d["trace"]["components"][""].update(steps={"x": [2, -5]}),
    lambda d: d["reference"].update(groups=[["w", [2.5]]]),
    lambda d: d["reference"].update(groups=[["w.0-3", [2]], ["w.3", [2]]]),     # one tensor listed twice
    lambda d: d["reference"].update(groups=[["w.0-99999999", [2]]]),            # past MAX_TENSORS
    lambda d: d["trace"].update(free={"B": True}),
])
def test_tampered_or_misshapen_entry_is_recomputed(tmp_path, spec, entry, change):
    """Issue 13, reproductions 4 and 7: a cache entry with max |Δ| 123 was published as checked; one with an
    unexpected shape raised a traceback. Either is now discarded (load returns None: recompute)."""
    tamper(entry, change)
    assert cache.load(tmp_path, spec) is None


def test_deeply_nested_entry_is_recomputed(tmp_path, spec, entry):
    entry.write_text(sealed(tmp_path, entry.name, "[" * 100_000 + "]" * 100_000))
    assert cache.load(tmp_path, spec) is None


@pytest.mark.parametrize("change", [
    lambda d: d["checks"][""].update(max_abs_error=0.0),             # still passes every check made on reading
    lambda d: d["checks"][""].update(detail="edited"),
    lambda d: d["trace"].update(device="cpu"),
])
def test_an_entry_edited_without_its_seal_is_recomputed(tmp_path, spec, entry, change):
    """Issue 37: an edit that every check on reading accepts (a smaller error, another detail) was published as
    computed; the seal over the entry's text refuses it."""
    tamper(entry, lambda d: None, reseal=False)  # rewritten as it was: the seal still holds
    assert cache.load(tmp_path, spec) is not None
    tamper(entry, change, reseal=False)
    assert cache.load(tmp_path, spec) is None


def test_a_seal_holds_only_for_its_own_name_and_its_folders_key(tmp_path, spec, entry):
    """An entry sealed for one name does not open under another (another model's or config's entry copied over);
    a missing, damaged or linked key opens nothing, and the next write makes a new key."""
    text = entry.read_text()
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / entry.name).write_text(text)
    assert cache.load(other, spec) is None  # no key there
    key = (tmp_path / SEAL_KEY).read_text()
    assert len(key.strip()) == 64 and (tmp_path / SEAL_KEY).stat().st_mode & 0o077 == 0
    (other / SEAL_KEY).write_text(key)
    assert cache.load(other, spec) is not None  # the same key and name: as written
    renamed = tmp_path / entry.name.replace(spec.slug, "qwen3-8b", 1)
    renamed.write_text(text)
    from explorer.execute.cache_seal import unsealed
    assert unsealed(renamed, 2**20) is None and unsealed(entry, 2**20) is not None
    (tmp_path / SEAL_KEY).write_text("0" * 63)
    assert cache.load(tmp_path, spec) is None
    (tmp_path / SEAL_KEY).unlink()
    (tmp_path / SEAL_KEY).symlink_to(other / SEAL_KEY)
    assert cache.load(tmp_path, spec) is None  # a key is never read through a link
    ref, execution = cache.load(other, spec)
    cache.save(tmp_path, spec, ref, execution)  # replaces the link with a key of its own
    assert not (tmp_path / SEAL_KEY).is_symlink() and (other / SEAL_KEY).read_text() == key
    assert cache.load(tmp_path, spec) is not None


def test_the_build_knows_from_content_alone_whether_an_entry_is_current(tmp_path, spec, entry):
    """Issue 14: whether to import torch at all is decided before any spec is built; the guess must agree with
    the entry the model's build will look up."""
    import dataclasses

    content = load_model_content(ROOT / "content/models/kimi-k2")
    assert cache.has_entry(tmp_path, content) and cache.load(tmp_path, spec) is not None
    changed = dataclasses.replace(content, config={**content.config, "rope_theta": 60000.0})
    assert not cache.has_entry(tmp_path, changed)
    assert not cache.has_entry(None, content)
    broken = dataclasses.replace(content, config={**content.config, "hidden_size": -1})
    assert not cache.has_entry(tmp_path, broken)  # its build reports the config; no torch is imported for it


def test_too_many_cached_tensors_are_refused_before_any_is_listed(tmp_path, spec, entry, monkeypatch):
    """A tampered entry of a thousand groups of five million tensors each: counted from their names, refused,
    and no set of indices built (that would take gigabytes)."""
    tamper(entry, lambda d: d["reference"].update(groups=[[f"w{i}.0-4999999", [2]] for i in range(1000)]))

    def listed(*args):
        raise AssertionError("a box was built before the count was checked")

    monkeypatch.setattr(cache, "pattern_box", listed)
    assert cache.load(tmp_path, spec) is None


WRITER = """
import pickle, sys, time
from pathlib import Path
from explorer.execute import cache
folder, payload, go, rounds, me = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
specs, references, execution = pickle.loads(payload.read_bytes())
while not go.exists():
    time.sleep(0.005)
for r in range(rounds):
    cache.save(folder, specs[(r + me) % len(specs)], references[(3 * r + me) % len(references)], execution)
"""
"""One concurrent build's writes: the entries of two models, each round with another (complete, valid) content."""


def test_concurrent_writers_never_expose_a_missing_torn_or_temporary_entry(tmp_path, spec):
    """Issue 18 (concurrent cache writes): processes writing the same entry and other models' entries at once,
    many rounds, while a reader loads both; every load finds a complete entry that one writer wrote, the entries
    of a model whose slug extends another's survive, and no temporary file is left. Writing used to delete the
    entry it was about to replace, so a concurrent reader found none in between."""
    import dataclasses
    import pickle
    import subprocess
    import sys
    import time

    folder = tmp_path / "cache"
    specs = (spec, dataclasses.replace(spec, slug=f"{spec.slug}-variant"))  # a slug that extends the other's
    references = [ReferenceModel(f"writer content {i}", CheckpointIndex.of(
        {f"w.{j}": TensorInfo(f"w.{j}", "F32", (i + 1, j + 1)) for j in range(200)}, "test")) for i in range(5)]
    execution = consistent_execution(spec)
    stale = folder / f"{spec.slug}-{'0' * 32}.json"  # an entry for inputs that changed: replaced by the first write
    folder.mkdir()
    stale.write_text("{}")
    for s in specs:
        cache.save(folder, s, references[0], execution)
    assert not stale.exists()
    (tmp_path / "payload").write_bytes(pickle.dumps((specs, references, execution)))
    go = tmp_path / "go"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(tmp_path / "payload"), str(go), "150",
                                 str(me)], cwd=ROOT) for me in range(3)]
    labels = {r.label for r in references}
    try:
        time.sleep(0.5)  # most of the writers' imports done; the rest overlaps the first reads
        go.touch()
        reads = 0
        started = time.monotonic()
        while any(w.poll() is None for w in writers) and time.monotonic() - started < 300:  # a hang guard only
            for s in specs:
                found = cache.load(folder, s)
                assert found is not None, f"{s.slug}: no complete entry readable after {reads} reads"
                assert found[0].label in labels and found[1] == execution
                reads += 1
        assert [w.wait(timeout=60) for w in writers] == [0, 0, 0]
    finally:
        for w in writers:
            w.kill()
    assert sorted(p.name for p in folder.iterdir()) == sorted([SEAL_KEY] + [
        cache._entry(folder, s.slug, cache.execution_key(s)).name for s in specs])
