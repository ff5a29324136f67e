"""Load and validate content/: model metadata, published config values, line maps and prose.

Everything in content/ is parsed into frozen dataclasses here, at the edge; every problem in every file is
collected and reported in one ContentError, each naming the file, the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import markdown
import nh3

from explorer.content.published_claims import PublishedClaim, claim_problems
from explorer.errors import ContentError, did_you_mean

SLUG = re.compile(r"^(?=.{1,64}$)[a-z0-9]+(?:[.-][a-z0-9]+)*$")
"""A model folder's name: it becomes a URL and a file name, so never a path (nor "..", nor a trailing dot)."""
RELEASED = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
REVISION = re.compile(r"^[0-9a-f]{40}$")
"""A Hub commit, in full."""
REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")
"""A Hub repository, OWNER/NAME."""


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """Display metadata of one model."""

    name: str
    lab: str
    released: str
    """Release month, "YYYY-MM"."""
    tagline: str
    family: str
    """Key of the family spec that builds this model's component tree (e.g. "deepseek_v3")."""
    order: int = 0
    """Position on the index page among models of one release month and lineage."""
    lineage: str = ""
    """The series the model belongs to within its lab ("Llama 3.1", "Qwen3.5"), by which the index groups it; where
    empty, that of the model it follows in the same lab, else its own name."""
    follows: str = ""
    """The model this one follows (its predecessor in a lineage, or the smaller sibling it scales up), by slug: the
    site keeps a static comparison of the two, which readers without JavaScript can open (any other pair is
    compared on the picker page)."""


UNPINNED = "unpinned"
"""The revision of a checkpoint whose commit is not known (a file from the package index): pages say so, with
checkpoint.revision_note, and nothing is fetched at it."""


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """Where the published checkpoint lives, pinned, and facts recorded about its files."""

    repo_id: str
    revision: str
    """A 40-hex commit, or UNPINNED where none is known (revision_note then says why)."""
    config_sha256: str
    config_provenance: str
    config_nulls: tuple[str, ...] = ()
    """config.json keys published as null (TOML has no null): the family reads them as None."""
    config_unused: tuple[str, ...] = ()
    """config.json keys the family does not read and no file of the reference names (explorer/model/published_keys.py):
    recorded in [config] as published, so the recorded values still serialise to the published bytes, but left
    out of the config the family reads and the reference config class is built from; the model page lists them."""
    config_defaulted: tuple[str, ...] = ()
    """Keys of the family's config that the recorded config.json omits, so that the model is built with the
    reference config class's defaults for them (Family.defaulted_keys), as --add-model computed them; the model page
    lists each with the value it took. Empty in content written before the field: the page then lists only the
    defaulted keys that appear in formulas. A recorded list must be the family's own (an edited one could hide a
    default)."""
    modeling_file: str = ""
    """The checkpoint's own modeling code (empty: it ships none that we cite)."""
    source_lines: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """Line map of modeling_file at revision: qualified symbol -> (first, last) line, inclusive."""
    modeling_sha256: str = ""
    """sha256 of modeling_file's bytes at revision, recorded where its lines are cited: a copy found in the local
    Hugging Face cache or fetched is quoted only when its bytes hash to it (empty: the file is cited by line range
    and link, never quoted)."""
    config_lines: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """Line ranges of top-level keys in the published config.json."""
    config_values_sha256: str = ""
    """sha256 of the published config's values, whatever its layout (explorer.checkpoint.sources.config_values_digest): every
    build checks the recorded [config] against it, so an edited value fails even where the published bytes (whose
    sha256 is config_sha256) cannot be regenerated from the values (another indent, key order or float spelling)."""
    config_order: tuple[str, ...] = ()
    """The published config.json's top-level keys in its own order, where that is not sorted, so the recorded
    values serialise back to its exact bytes. Only a hint: the regenerated text is used only when its sha256 is
    config_sha256, so a wrong or stale order means no regenerated excerpt, never a wrong one."""
    real_weights: str = ""
    """A GGUF file inside an installed package, "package/path/in/it": the build runs the model's first block on
    the weights it stores and compares with transformers reading the same file (empty: no real-weight check)."""
    revision_note: str = ""
    """Why no revision is pinned (required with revision = "unpinned"; shown on every page of the model)."""
    storage: dict[str, str] = dataclasses.field(default_factory=dict)
    """Stored dtype by tensor-name pattern (fnmatch; the longest matching pattern wins), for a checkpoint that does
    not store every weight in one dtype (a GGUF file's per-tensor types), or keeps some weights out of the scheme
    its quantization_config names (DeepSeek-V3's multi-token-prediction eh_proj, stored in BF16 with no scale)."""
    storage_evidence: dict[str, str] = dataclasses.field(default_factory=dict)
    """checkpoint.storage pattern -> what shows the checkpoint stores it so, shown beside each tensor it changes;
    required for every pattern of a model with no recorded manifest (checkpoint.toml), which is otherwise the
    evidence."""

    @property
    def pinned(self) -> bool:
        """False when the checkpoint's commit is not known (revision = "unpinned"; revision_note says why)."""
        return self.revision != UNPINNED

    @property
    def revision_short(self) -> str:
        return self.revision[:7] if self.pinned else "revision not pinned"

    @property
    def at(self) -> str:
        """"owner/name@abc1234", or "owner/name (revision not pinned)"."""
        return f"{self.repo_id}@{self.revision[:7]}" if self.pinned else f"{self.repo_id} (revision not pinned)"

    @property
    def repo_url(self) -> str:
        base = f"https://huggingface.co/{self.repo_id}"
        return f"{base}/tree/{self.revision}" if self.pinned else base


@dataclass(frozen=True, slots=True)
class ModelContent:
    """One content/models/<slug>/ folder, validated except for its config (the family validates that)."""

    slug: str
    folder: Path
    meta: ModelMeta
    checkpoint: CheckpointRef
    config: dict[str, Any]
    prose: dict[str, str]
    """Component path ("" for the model page) -> Markdown source."""
    published: tuple[PublishedClaim, ...] = ()
    """The parameter figures the lab published ([[published]]), each with its source."""


def read_content_text(path: Path, root: Path) -> str:
    """Read one content file as UTF-8; it must resolve inside `root`, so a symlink out of content/ is refused."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ContentError([f"{path}: resolves to {resolved}, outside {root}; content files may not link out of "
                            "their folder"])
    try:
        data = resolved.read_bytes()
    except FileNotFoundError:
        raise ContentError([f"{path}: file is missing"]) from None
    except OSError as e:
        raise ContentError([f"{path}: cannot read: {e.strerror or e}"]) from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ContentError([f"{path}: not UTF-8 at byte {e.start}: {e.reason}"]) from None


def load_toml(path: Path, root: Path | None = None) -> dict[str, Any]:
    """Parse one TOML file inside `root` (default: its folder), turning every failure into a ContentError."""
    text = read_content_text(path, path.parent if root is None else root)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ContentError([f"{path}: not valid TOML: {e}"]) from e


def parse_table(table: Any, cls: type, where: str, problems: list[str]) -> Any:
    """Build dataclass `cls` from a TOML table, appending one message per problem; None when any."""
    if not isinstance(table, dict):
        problems.append(f"{where}: expected a table, got {_type_name(table)}")
        return None
    hints = _type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    before = len(problems)
    for key in sorted(set(table) - set(fields)):
        shown = key if key.isprintable() else repr(key)[1:-1]  # a newline in a key would end the line
        problems.append(f"{where}: key '{shown}': unknown{did_you_mean(key, fields)}")
    values: dict[str, Any] = {}
    for name, field in fields.items():
        if name not in table:
            has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
            if not has_default:
                problems.append(f"{where}: key '{name}': missing (expected {_hint_name(hints[name])})")
            continue
        values[name] = _coerce(table[name], hints[name], f"{where}: key '{name}'", problems)
    if len(problems) > before:
        return None
    return cls(**values)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A dataclass's resolved field types, once per class: resolving them evaluates every annotation's text, the
    most of parsing a table when a manifest holds thousands of [[tensor]] tables."""
    return typing.get_type_hints(cls)


def _coerce(value: Any, hint: Any, where: str, problems: list[str]) -> Any:
    """Check one value against a type hint, converting TOML arrays to tuples and tables to dataclasses."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for alternative in inner[:-1]:  # the first that fits (an integer, or an array of them: eos_token_id)
            tentative: list[str] = []
            result = _coerce(value, alternative, where, tentative)
            if not tentative:
                return result
        return _coerce(value, inner[-1], where, problems) if len(inner) == 1 else _one_of(value, inner, where, problems)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return parse_table(value, hint, where.replace(": key '", ": table '"), problems)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            problems.append(f"{where}: expected {_hint_name(hint)}, got {_type_name(value)}")
            return None
        item_hints = [args[0]] * len(value) if args[-1] is Ellipsis else list(args)
        if len(item_hints) != len(value):
            problems.append(f"{where}: expected {_hint_name(hint)}, got {len(value)} items")
            return None
        return tuple(_coerce(v, h, f"{where}[{i}]", problems) for i, (v, h) in enumerate(zip(value, item_hints)))
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{where}: expected a table, got {_type_name(value)}")
            return None
        return {k: _coerce(v, args[1], f"{where}.{k}", problems) for k, v in sorted(value.items())}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is Any or (isinstance(value, hint) and not (hint is int and isinstance(value, bool))):
        return value
    problems.append(f"{where}: expected {_hint_name(hint)}, got {_type_name(value)} {value!r}")
    return None


def _one_of(value: Any, hints: list[Any], where: str, problems: list[str]) -> Any:
    tentative: list[str] = []
    result = _coerce(value, hints[-1], where, tentative)
    if not tentative:
        return result
    problems.append(f"{where}: expected {' or '.join(_hint_name(h) for h in hints)}, got {_type_name(value)} {value!r}")
    return None


def _hint_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is tuple:
        args = typing.get_args(hint)
        plural = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(args[0], "values")
        if args and args[-1] is Ellipsis:
            return f"an array of {plural}"
        return f"an array of {len(args)} {plural}"
    if dataclasses.is_dataclass(hint):
        return "a table"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return names.get(hint, str(hint))


def _type_name(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "a table"}
    return names.get(type(value), type(value).__name__)


MODEL_FILE = "model.toml"
_MODEL_TABLES = {"model", "checkpoint", "config", "published"}


def load_model_content(folder: Path) -> ModelContent:
    """Load content/models/<slug>/: model.toml and its prose; raise ContentError listing every problem."""
    path = folder / MODEL_FILE
    data = load_toml(path)
    problems: list[str] = []
    for key in sorted(set(data) - _MODEL_TABLES):
        problems.append(f"{path}: table '{key}': unknown{did_you_mean(key, _MODEL_TABLES)}")
    meta = parse_table(_without_retired(data.get("model", {}), path, problems), ModelMeta, f"{path}: table 'model'",
                       problems)
    checkpoint = parse_table(data.get("checkpoint", {}), CheckpointRef, f"{path}: table 'checkpoint'", problems)
    if "config" not in data:
        problems.append(f"{path}: table 'config': missing (the published config.json values)")
    elif not isinstance(data["config"], dict):
        problems.append(f"{path}: table 'config': expected a table, got {_type_name(data['config'])}")
        data["config"] = {}
    for table in ("source_lines", "config_lines"):
        for symbol, (first, last) in sorted((getattr(checkpoint, table) if checkpoint else {}).items()):
            if not 0 < first <= last:
                problems.append(f"{path}: key 'checkpoint.{table}.{symbol}': expected first <= last, "
                                f"got [{first}, {last}]")
    problems += _revision_problems(path, checkpoint) + _storage_problems(path, checkpoint)
    problems += _text_problems(path, meta, checkpoint)
    problems += _storage_evidence_problems(path, checkpoint, (folder / "checkpoint.toml").exists())
    recorded = {**data.get("config", {}), **{k: None for k in (checkpoint.config_nulls if checkpoint else ())}}
    for key in (checkpoint.config_unused if checkpoint else ()):
        if not _has_key(recorded, key):
            problems.append(f"{path}: key 'checkpoint.config_unused': '{key}' is not in [config] (list only keys "
                            "recorded as published)")
    for key in sorted(set(checkpoint.config_nulls if checkpoint else ()) & set(data.get("config", {}))):
        problems.append(f"{path}: key 'checkpoint.config_nulls': '{key}' is listed as null but has a value in [config]")
    published = _published(data.get("published", []), path, problems)
    if meta is not None and meta.released and not RELEASED.fullmatch(meta.released):
        problems.append(f"{path}: key 'model.released': expected a month as \"YYYY-MM\" (or \"\" if not recorded), "
                        f"got {meta.released!r}")
    if problems:
        raise ContentError(problems)
    return ModelContent(
        slug=folder.name, folder=folder, meta=meta, checkpoint=checkpoint,
        config={**data["config"], **{k: None for k in checkpoint.config_nulls}},
        prose=load_prose(folder / "prose", folder), published=published,
    )


RETIRED_CLAIM_KEYS = ("active_claim", "active_claim_source", "active_claim_definition", "active_claim_rounding",
                      "active_claim_evidence")
"""[model] keys of the single active claim, folded into the [[published]] tables (issue 35): one mechanism."""


def _without_retired(table: Any, path: Path, problems: list[str]) -> Any:
    """The [model] table less the retired claim keys, with one line saying what to write instead where any is set."""
    if not isinstance(table, dict):
        return table
    found = [k for k in RETIRED_CLAIM_KEYS if k in table]
    if found:
        problems.append(f"{path}: key 'model.{found[0]}': retired; write the figure as a [[published]] table "
                        f"instead: figure = \"active\", claim, source (lab_counts, rounding and difference where they "
                        f"apply){'; also remove ' + ', '.join(found[1:]) if found[1:] else ''}")
    return {k: v for k, v in table.items() if k not in RETIRED_CLAIM_KEYS}


def _published(tables: Any, path: Path, problems: list[str]) -> tuple[PublishedClaim, ...]:
    """The [[published]] tables: each a figure the lab published, checked (explorer/figures/published_claims.py)."""
    if not isinstance(tables, list):
        problems.append(f"{path}: table 'published': expected an array of tables ([[published]]), got "
                        f"{_type_name(tables)}")
        return ()
    claims = [parse_table(t, PublishedClaim, f"{path}: table 'published[{i}]'", problems) for i, t in enumerate(tables)]
    found = [c for c in claims if c is not None]
    problems += claim_problems(found, str(path))
    return tuple(found)


def _has_key(config: dict[str, Any], dotted: str) -> bool:
    """Whether a config table holds the key `dotted` ("text_config.some_key")."""
    head, dot, rest = dotted.partition(".")
    if not dot:
        return head in config
    return isinstance(config.get(head), dict) and _has_key(config[head], rest)


MODELING_FILE = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*(/[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*)*\.py")
"""A file inside the checkpoint's repository: relative, no '..' or '.' segment."""
MAX_TEXT = 300
"""Longest name, lab or tagline (each is printed on many pages: a 5 MB name made a 5.9 GB site)."""


def _text_problems(path: Path, meta: ModelMeta | None, ref: CheckpointRef | None) -> list[str]:
    """Values whose form the type alone does not fix, each checked before anything reads them (issue 18)."""
    problems = []
    if meta is not None:
        for key in ("name", "lab", "tagline"):
            if len(getattr(meta, key)) > MAX_TEXT:
                problems.append(f"{path}: key 'model.{key}': longer than {MAX_TEXT} characters")
    if ref is not None and ref.modeling_file and not MODELING_FILE.fullmatch(ref.modeling_file):
        problems.append(f"{path}: key 'checkpoint.modeling_file': expected a .py file's path inside the repository "
                        f"(no '..', not absolute), got {ref.modeling_file[:80]!r}")
    return problems




def _revision_problems(path: Path, ref: CheckpointRef | None) -> list[str]:
    """An unpinned revision says why; a pinned one has no such note."""
    if ref is None:
        return []
    if not ref.pinned and not ref.revision_note.strip():
        return [f"{path}: key 'checkpoint.revision_note': missing (required with revision = \"{UNPINNED}\": say why "
                "no commit is pinned)"]
    if ref.pinned and ref.revision_note:
        return [f"{path}: key 'checkpoint.revision_note': only for revision = \"{UNPINNED}\" (the revision is "
                f"pinned to {ref.revision!r})"]
    return []


def _storage_problems(path: Path, ref: CheckpointRef | None) -> list[str]:
    from explorer.spec.storage import DTYPE_BYTES, ggml_blocks, known_dtype

    if ref is None:
        return []
    unknown = [(pattern, dtype) for pattern, dtype in sorted(ref.storage.items()) if not known_dtype(dtype)]
    known = sorted(set(DTYPE_BYTES) | set(ggml_blocks())) if unknown else []
    return [f"{path}: key 'checkpoint.storage.\"{pattern}\"': unknown dtype {dtype!r}{did_you_mean(dtype, known)}"
            for pattern, dtype in unknown]


def _storage_evidence_problems(path: Path, ref: CheckpointRef | None, manifest: bool) -> list[str]:
    """Each storage exception says what shows it, unless a recorded manifest does; evidence names a pattern."""
    if ref is None:
        return []
    out = [f"{path}: key 'checkpoint.storage_evidence.\"{p}\"': no such pattern in checkpoint.storage"
           f"{did_you_mean(p, sorted(ref.storage))}" for p in sorted(set(ref.storage_evidence) - set(ref.storage))]
    if not manifest:
        out += [f"{path}: key 'checkpoint.storage_evidence.\"{p}\"': missing (no checkpoint.toml is recorded, so say "
                "what shows the checkpoint stores these tensors so)" for p in sorted(ref.storage)
                if not ref.storage_evidence.get(p, "").strip()]
    return out


def load_prose(folder: Path, root: Path) -> dict[str, str]:
    """Read <component path>.md files (index.md is the model page); sorted for determinism."""
    if not folder.is_dir():
        return {}
    prose = {}
    for path in sorted(folder.glob("*.md")):
        key = "" if path.stem == "index" else path.stem
        prose[key] = read_content_text(path, root)
    return prose


def check_prose_paths(content: ModelContent, paths: Iterable[str]) -> None:
    """A prose file must name a component of the model; a misspelled one would silently show nowhere."""
    known = set(paths)
    problems = [f"{content.folder / 'prose' / (key + '.md')}: no component '{key}' in {content.slug}"
                f"{did_you_mean(key, known - {''})}"
                for key in sorted(content.prose) if key not in known]
    if problems:
        raise ContentError(problems)


# Tags and attributes Markdown itself produces, plus a few inline ones authors use; everything else raw HTML
# could carry (script, style, iframe, on* attributes, javascript: URLs) is dropped by nh3 (the Ammonia sanitizer).
_PROSE_TAGS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "a", "em", "strong", "code", "pre",
               "blockquote", "hr", "br", "table", "thead", "tbody", "tr", "th", "td", "img", "sub", "sup", "kbd",
               "abbr", "del"}
_PROSE_ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}, "abbr": {"title"},
                     "th": {"style"}, "td": {"style"}}


@functools.cache
def _markdown() -> markdown.Markdown:
    """One converter per process, reset between documents: building one (its extensions and their patterns)
    cost more than converting a model's prose."""
    return markdown.Markdown(extensions=["tables", "fenced_code"], output_format="html")


def render_markdown(source: str) -> str:
    """Render prose Markdown to HTML (tables and fenced code allowed), sanitised to an allow-list of tags."""
    html = _markdown().reset().convert(source)
    return nh3.clean(html, tags=_PROSE_TAGS, clean_content_tags={"script", "style"}, attributes=_PROSE_ATTRIBUTES,
                     url_schemes={"http", "https", "mailto"}, filter_style_properties={"text-align"},
                     link_rel=None)


def model_folder(content_dir: Path, slug: str) -> Path:
    """The folder of one model named on the command line: a checked name, never a path."""
    models = content_dir / "models"
    if not SLUG.fullmatch(slug):
        raise ContentError([f"model '{slug}': not a model name (lowercase letters, digits, '-' and '.')"])
    if not (models / slug).is_dir():
        existing = sorted(p.name for p in models.iterdir() if p.is_dir()) if models.is_dir() else []
        raise ContentError([f"{models / slug}: no such model{did_you_mean(slug, existing)}"])
    return models / slug


def load_all_models(content_dir: Path) -> list[ModelContent]:
    """Load every model folder under content/models, collecting problems across all of them."""
    models_dir = content_dir / "models"
    if not models_dir.is_dir():
        raise ContentError([f"{models_dir}: folder is missing (--content names the folder that holds content/)"])
    models: list[ModelContent] = []
    problems: list[str] = []
    folders = sorted(p for p in models_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    for folder in folders:
        try:
            _check_model_folder(folder, models_dir)
            models.append(load_model_content(folder))
        except ContentError as e:
            problems.extend(e.problems)
    if not folders:
        problems.append(f"{models_dir}: no model folders; an empty site would replace the published one")
    problems += _lineage_problems(models)
    if problems:
        raise ContentError(problems)
    return sorted(models, key=lambda m: (m.meta.order, m.slug))


def _lineage_problems(models: list[ModelContent]) -> list[str]:
    """model.follows names another model of the site."""
    slugs = {m.slug for m in models}
    problems = []
    for m in models:
        where = f"{m.folder / 'model.toml'}: key 'model.follows'"
        if m.meta.follows == m.slug:
            problems.append(f"{where}: names the model itself; name the model it follows, or leave the key out")
        elif m.meta.follows and m.meta.follows not in slugs:
            problems.append(f"{where}: no model {m.meta.follows!r} in content/models"
                            f"{did_you_mean(m.meta.follows, slugs)}")
    return problems


def _check_model_folder(folder: Path, models_dir: Path) -> None:
    if not SLUG.fullmatch(folder.name):
        raise ContentError([f"{folder}: not a model name (lowercase letters, digits, '-' and '.'); rename the folder"])
    if not folder.resolve().is_relative_to(models_dir.resolve()):
        raise ContentError([f"{folder}: resolves to {folder.resolve()}, outside {models_dir}; model folders may "
                            "not link out of it"])
