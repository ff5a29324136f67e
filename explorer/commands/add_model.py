"""Write content/models/SLUG/ from a published config.json: `build.py --add-model SLUG --config PATH --repo OWNER/NAME
--revision SHA`. The family comes from the config's model_type (or architectures); the config is validated by
the family before anything is written; keys published as null are listed in `checkpoint.config_nulls` (TOML has
no null), keys nothing reads in `checkpoint.config_unused` (explorer/model/published_keys.py), keys the family reads that the file
omits (so that they take the reference config class's defaults) in `checkpoint.config_defaulted`, the line ranges of the keys
the family's pages cite in `checkpoint.config_lines`, and the config's sha256 is recorded so that its bytes can be
verified later.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from explorer.checkpoint.hub import MAX_HUB_FILE_BYTES
from explorer.checkpoint.safetensors_headers import read_capped
from explorer.checkpoint.sources import config_values_digest
from explorer.content.guarded_write import toml_key, toml_string, toml_value, write_content_file
from explorer.content.json_lines import key_lines
from explorer.content.model_content import MODEL_FILE, REPO, REVISION, SLUG, UNPINNED
from explorer.errors import CheckpointError, ContentError
from explorer.model.families import family_for
from explorer.model.published_keys import classify, without_unused
from explorer.spec.types import ModelSpec, walk


def read_config_text(path: Path, cap: int = MAX_HUB_FILE_BYTES,
                     what: str = "config.json") -> tuple[dict[str, Any], str, str]:
    """The config's keys (duplicate keys refused), the sha256 of its bytes and its text, read with a size bound."""
    try:
        data = read_capped(path, cap, what)
    except CheckpointError as e:
        raise ContentError([str(e)]) from None
    except OSError as e:
        raise ContentError([f"{path}: cannot read ({e.strerror})"]) from None

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(pairs)
        if len(found) < len(pairs):  # counted once, not per key: 80,000 keys took 104 s (issue 18)
            dupes = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
            raise ContentError([f"{path}: key '{dupes[0]}': appears more than once"])
        return found

    try:
        config = json.loads(data.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, or an integer of over 4,300 digits
        reason = "an integer of over 4,300 digits" if "digits" in str(e) else f"{type(e).__name__}: {e}"
        raise ContentError([f"{path}: not a JSON config ({reason})"]) from None
    if not isinstance(config, dict):
        raise ContentError([f"{path}: expected a JSON object"])
    return config, hashlib.sha256(data).hexdigest(), data.decode("utf-8")


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """What --add-model will write, every check passed: the model.toml text and the spec it builds."""

    folder: Path
    text: str
    spec: ModelSpec


def add_model(content_dir: Path, slug: str, config_path: Path, repo: str, revision: str, released: str = "") -> Path:
    """Validate everything, then write content/models/SLUG/model.toml; ContentError lists every problem."""
    record = prepare_model(content_dir, slug, config_path, repo, revision, released)
    return write_model(content_dir, record, {})


def argument_problems(content_dir: Path, slug: str, repo: str, revision: str, released: str) -> list[str]:
    """One line per bad argument of --add-model, naming the flag."""
    problems = []
    if not SLUG.fullmatch(slug):
        problems.append(f"--add-model: slug {slug!r}: use lowercase letters, digits, '.' and '-' (a name, not a path)")
    if not REPO.fullmatch(repo):
        problems.append(f"--repo: {repo!r}: expected OWNER/NAME")
    if not REVISION.fullmatch(revision) and revision != UNPINNED:
        problems.append(f"--revision: {revision!r}: expected a 40-hex-digit commit, or '{UNPINNED}' when the "
                        "commit is not known (then say why in config_provenance)")
    if released and not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", released):
        problems.append(f"--released: {released!r}: expected YYYY-MM")
    folder = content_dir / "models" / slug
    if SLUG.fullmatch(slug) and folder.exists():
        problems.append(f"{folder}: already exists (choose another slug or remove it)")
    return problems


def prepare_model(content_dir: Path, slug: str, config_path: Path, repo: str, revision: str, released: str = "",
                  provenance: str = "") -> ModelRecord:
    """Every check of --add-model, nothing written: the arguments, the config read with a size bound, the family's
    validation and build of its spec. `provenance` replaces the default config_provenance sentence."""
    problems = argument_problems(content_dir, slug, repo, revision, released)
    if problems:
        raise ContentError(problems)
    config, sha256, source = read_config_text(config_path)
    family = family_for(config, str(config_path))
    unused = classify(family, config, str(config_path))  # keys nothing reads; raises on one something does
    nulls = sorted(k for k, v in config.items() if v is None)
    published = {k: v for k, v in config.items() if v is not None}
    spec = family.build_spec(slug, without_unused(config, unused), str(config_path))  # raises on a bad config
    text = model_toml(slug, family.name, published, nulls, sha256, repo, revision, released, config_path.name,
                      order=list(config), values_sha256=config_values_digest(config), unused=recorded(config, unused),
                      config_lines=cited_config_lines(spec, source, str(config_path)),
                      defaulted=family.defaulted_keys(config), provenance=provenance)
    return ModelRecord(content_dir / "models" / slug, text, spec)


def write_model(content_dir: Path, record: ModelRecord, more: dict[str, bytes]) -> Path:
    """Write model.toml, then each of `more` (file name → bytes) beside it, through the one guarded writer (no link
    followed, the folder and files new, each file whole or not at all). A failure leaves nothing behind: the files
    written before it and the new folder are removed."""
    files = {MODEL_FILE: record.text.encode("utf-8"), **more}  # encoded before the folder exists
    written: list[Path] = []
    try:
        if not content_dir.exists():  # a new project (build.py itself refuses a missing content folder)
            try:
                content_dir.mkdir(parents=True)
            except OSError as e:
                raise ContentError([f"{content_dir}: cannot create ({e.strerror or e})"]) from None
        for name, data in files.items():
            written.append(write_content_file(content_dir, ("models", record.folder.name, name), data,
                                              create_folders=2 if not written else 0))
    except ContentError:  # a full disk: no half-recorded model, nor an empty folder to block the next try
        if not (content_dir / "models").is_symlink():
            for path in written:
                with contextlib.suppress(OSError):
                    path.unlink()
            with contextlib.suppress(OSError):
                record.folder.rmdir()
        raise
    return record.folder / MODEL_FILE


def cited_config_lines(spec: ModelSpec, text: str, where: str) -> dict[str, tuple[int, int]]:
    """The line range in the given config.json of every key the family's pages cite from it (the quantization
    block), as checkpoint.config_lines records them; ContentError where the file does not hold a cited key."""
    symbols = sorted({c.symbol for _, comp in walk(spec.root) for c in comp.citations if c.source == "config"})
    lines = {s: key_lines(text, s) for s in symbols}
    missing = [s for s, found in lines.items() if found is None]
    if missing:
        raise ContentError([f"{where}: key '{s}': cited by the {spec.family} family, but not found in the file"
                            for s in missing])
    return lines  # type: ignore[return-value]  # none is None


def recorded(config: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, ...]:
    """The keys of `keys` that content records: a null inside a nested table is not written (TOML has no null, and
    only top-level nulls are listed in config_nulls), so an unused nested key published as one is not listed either;
    a top-level key is recorded whatever its value (a null one in config_nulls)."""
    def holds(table: Any, dotted: str) -> bool:
        head, dot, rest = dotted.partition(".")
        if not isinstance(table, dict) or table.get(head) is None:
            return False
        return holds(table[head], rest) if dot else True
    return tuple(k for k in keys if "." not in k or holds(config, k))


def model_toml(slug: str, family: str, config: dict[str, Any], nulls: list[str], sha256: str, repo: str,
               revision: str, released: str, source: str, order: list[str] | None = None,
               values_sha256: str = "", unused: tuple[str, ...] = (),
               config_lines: dict[str, tuple[int, int]] | None = None, defaulted: tuple[str, ...] = (),
               provenance: str = "") -> str:
    """The model.toml text. Nested tables keep the published key order, and the top-level order is recorded
    where it is not sorted, so that the values serialise back to the published bytes (the build checks them
    against config_sha256). Keys nothing reads are recorded with the rest and listed in config_unused; keys the
    family reads that the file omits (taking the reference config class's defaults) in config_defaulted."""
    owner, name = repo.split("/", 1)
    order = order or sorted(config)
    source = toml_string(source)[1:-1]  # a newline in the file's name would end the comment and inject TOML
    lines = [f"# {name}: content for explorer, written by `build.py --add-model` from {source}.", "",
             "[model]", f"name = {toml_value(name)}", f"lab = {toml_value(owner)}", f"released = {toml_value(released)}",
             f"tagline = {toml_value('')}", f"family = {toml_value(family)}", "",
             "[checkpoint]", f"repo_id = {toml_value(repo)}", f"revision = {toml_value(revision)}"]
    if revision == UNPINNED:  # required with an unpinned revision; without it the model added but did not build
        note = f"{source} was given to --add-model without a commit of {repo}; which revision it comes from is not known"
        lines.append(f"revision_note = {toml_value(note)}")
    lines += [
             f"config_sha256 = {toml_value(sha256)}",
             f"config_values_sha256 = {toml_value(values_sha256)}",
             f"config_provenance = {toml_value(provenance or f'{source} as given to --add-model; sha256 of its bytes recorded')}",
             f"config_nulls = {toml_value(nulls)}"]
    if unused:  # each is in [config] below, as published; the family and the reference config class read none
        lines += ["# Published keys no config class reads (explorer/model/published_keys.py): kept in [config] as published.",
                  f"config_unused = {toml_value(list(unused))}"]
    if defaulted:  # not in [config]: the family and the reference config class take their defaults
        lines += ["# Keys the file omits, built with the reference config class's defaults (listed on the model page).",
                  f"config_defaulted = {toml_value(list(defaulted))}"]
    if order != sorted(order):
        lines.append(f"config_order = {toml_value(order)}")
    if config_lines:
        lines += ["", "[checkpoint.config_lines]"]
        lines += [f"{toml_key(k)} = {toml_value(list(v))}" for k, v in sorted(config_lines.items())]
    lines += ["", "[config]"]
    tables = {k: v for k, v in sorted(config.items()) if isinstance(v, dict)}
    lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in sorted(config.items()) if k not in tables]
    for key, table in tables.items():
        lines += ["", f"[config.{toml_key(key)}]"]
        lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"
