"""The recorded manifest, content/models/<slug>/checkpoint.toml: an index written as grouped names with its
provenance (and any hyper-parameters the checkpoint's own files state), and read back with every count checked
before a name is expanded.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from explorer.checkpoint.index import MAX_TENSORS, CheckpointIndex, TensorGroup, check_index
from explorer.checkpoint.tensor_names import pattern_box, pattern_size, shared_name
from explorer.content.guarded_write import toml_string, write_content_file
from explorer.errors import CheckpointError, ContentError
from explorer.spec.storage import known_dtype, storage_block

MANIFEST_FILE = "checkpoint.toml"


@dataclass(frozen=True, slots=True)
class ManifestGroup:
    """Tensors that share shape, dtype and shard, named with index ranges ("layers.1-60.experts.0-383")."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    shard: str = ""


def manifest_text(index: CheckpointIndex) -> str:
    """The checkpoint.toml text of an index: grouped names, with its provenance."""
    lines = [
        "# Stored tensors of the checkpoint, written by `python build.py --record-checkpoint`.",
        "# A name like model.layers.1-60.mlp.experts.0-383.down_proj.weight stands for one tensor per index;",
        "# a name segment starting with a backslash is taken literally.",
        "",
        "[manifest]",
        f"repo_id = {_toml_string(index.repo_id)}",
        f"revision = {_toml_string(index.revision)}",
        f"provenance = {_toml_string(index.provenance)}",
        f"tensor_count = {index.tensor_count}",
        "",
    ]
    if index.config:  # hyper-parameters the files state, checked against the content config by the build
        lines += ["[config]"] + [f"{k} = {_toml_scalar(v)}" for k, v in sorted(index.config.items())] + [""]
        lines += ["[config_provenance]"] + [f"{k} = {_toml_string(v)}" for k, v in
                                            sorted(index.config_provenance.items())] + [""]
    for g in index.groups:
        lines += ["[[tensor]]", f"name = {_toml_string(g.name)}", f"shape = {list(g.shape)}",
                  f"dtype = {_toml_string(g.dtype)}"]
        if g.shard:
            lines.append(f"shard = {_toml_string(g.shard)}")
        lines.append("")
    return "\n".join(lines)


def _toml_scalar(value: Any) -> str:
    """A config value (string, number or boolean) as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return _toml_string(value) if isinstance(value, str) else json.dumps(value)


def _toml_string(text: str) -> str:
    """A TOML basic string, as every content file spells one (explorer/content/guarded_write.py)."""
    return toml_string(text)


def write_manifest(index: CheckpointIndex, path: Path, replace: bool = True) -> None:
    """Record an index as content/models/<slug>/checkpoint.toml, atomically and only once the text written
    reads back as exactly this index; an existing manifest is replaced only with `replace` (--replace)."""
    _write_guarded(path, checked_manifest_text(index, path).encode("utf-8"), replace)


def checked_manifest_text(index: CheckpointIndex, path: Path) -> str:
    """The manifest text of an index, once it is known to read back as exactly this index (path names it in
    errors)."""
    check_index(index, str(path))
    text = manifest_text(index)
    back = manifest_index(tomllib.loads(text), str(path))
    if not _reads_back_as(back, index):
        raise CheckpointError(str(path), "the manifest would not read back as the index recorded; nothing written")
    return text


def _write_guarded(path: Path, data: bytes, replace: bool) -> None:
    """Through the one guarded writer (no link followed, whole or nothing, an existing manifest replaced only
    with `replace`), relative to the models folder the manifest's model lives in."""
    try:
        write_content_file(path.parent.parent, (path.parent.name, path.name), data, replace=replace)
    except ContentError as e:
        raise CheckpointError(str(path), e.problems[0].removeprefix(f"{path}: ")) from None


def _reads_back_as(back: CheckpointIndex, index: CheckpointIndex) -> bool:
    """Whether a manifest read back states the index, group by group: a grouped name stands for exactly one set
    of names (tensor_names.py), so equal groups are equal tensors, compared without listing a million names (nor
    a million rows at once)."""
    if (back.repo_id, back.revision, back.provenance, back.config, len(back.groups)) != (
            index.repo_id, index.revision, index.provenance, index.config, len(index.groups)):
        return False
    return all((a.name, a.shape, a.dtype, a.shard) == (b.name, b.shape, b.dtype, b.shard)
               for a, b in zip(back.groups, index.groups))


@dataclass(frozen=True, slots=True)
class _ManifestHead:
    repo_id: str
    revision: str
    provenance: str
    tensor_count: int


def read_manifest(path: Path) -> CheckpointIndex:
    """Read a recorded manifest back into a full index; ContentError names the file and key."""
    from explorer.content.model_content import load_toml

    return manifest_index(load_toml(path), str(path))


def manifest_index(data: dict[str, Any], path: str) -> CheckpointIndex:
    """Expand a parsed manifest, checking every count against tensor_count and MAX_TENSORS before expanding."""
    from explorer.content.model_content import parse_table

    problems: list[str] = []
    head = parse_table(data.get("manifest", {}), _ManifestHead, f"{path}: table 'manifest'", problems)
    tables = data.get("tensor", [])
    if not isinstance(tables, list):
        problems.append(f"{path}: key 'tensor': expected an array of tables ([[tensor]])")
        tables = []
    groups = [parse_table(t, ManifestGroup, f"{path}: tensor {i + 1}", problems) for i, t in enumerate(tables)]
    sizes = []
    for g in groups:
        if g is None:
            continue
        if not known_dtype(g.dtype):
            problems.append(f"{path}: tensor '{g.name}': key 'dtype': unknown dtype {g.dtype!r}")
        elif g.shape and g.shape[-1] % storage_block(g.dtype)[0]:
            problems.append(f"{path}: tensor '{g.name}': key 'shape': last dimension {g.shape[-1]} is not a "
                            f"multiple of {g.dtype}'s block of {storage_block(g.dtype)[0]}")
        if not all(s >= 0 for s in g.shape):
            problems.append(f"{path}: tensor '{g.name}': key 'shape': sizes must be >= 0, got {list(g.shape)}")
        try:
            sizes.append(pattern_size(g.name))
        except ValueError as e:
            problems.append(f"{path}: tensor '{g.name}': key 'name': {e}")
    problems += _stated_config_problems(data, path)
    if problems:
        raise ContentError(problems)
    _check_counts(head.tensor_count, sum(sizes), path)
    stored = stored_groups([g for g in groups if g is not None])
    if isinstance(stored, str):
        raise ContentError([f"{path}: tensor '{stored}' is listed twice"])
    return CheckpointIndex(stored, source=path, repo_id=head.repo_id, revision=head.revision,
                           provenance=head.provenance, config=dict(data.get("config", {})),
                           config_provenance=dict(data.get("config_provenance", {})))


def _stated_config_problems(data: dict[str, Any], path: str) -> list[str]:
    """The manifest's [config] (values a GGUF header states) holds numbers, booleans and strings, each with its
    source in [config_provenance]: a key without one used to end in a traceback (issue 18)."""
    config, provenance = data.get("config", {}), data.get("config_provenance", {})
    for name, table in (("config", config), ("config_provenance", provenance)):
        if not isinstance(table, dict):
            return [f"{path}: table '{name}': expected a table"]
    problems = [f"{path}: key 'config.{k}': expected a number, boolean or string, got {type(v).__name__}"
                for k, v in sorted(config.items()) if not isinstance(v, int | float | str)]
    problems += [f"{path}: key 'config_provenance.{k}': missing (the GGUF key or fact that states config.{k})"
                 for k in sorted(set(config) - {k for k, v in provenance.items() if isinstance(v, str)})]
    return problems


def stored_groups(groups: list[ManifestGroup]) -> tuple[TensorGroup, ...] | str:
    """The groups of a manifest or listing whose sizes were checked against MAX_TENSORS, or the first name two
    of them list."""
    out = tuple(TensorGroup(pattern_box(g.name, MAX_TENSORS), g.dtype, g.shape, g.shard) for g in groups)
    twice = shared_name(g.box for g in out)
    return twice if twice is not None else out


def _check_counts(declared: int, expands_to: int, path: str) -> None:
    if not 0 <= declared <= MAX_TENSORS:
        raise ContentError([f"{path}: key 'manifest.tensor_count': {declared:,} is outside 0..{MAX_TENSORS:,}, "
                            "the limit on tensors in a checkpoint"])
    if expands_to != declared:
        raise ContentError([f"{path}: key 'manifest.tensor_count': {declared:,} but the groups stand for "
                            f"{expands_to:,} tensors"])
