"""Resolve citations against real files at build time: never typed-in excerpts.

Sources: the installed, pinned transformers package (always offline); the checkpoint's own modeling code and
config.json at the pinned revision, through huggingface_hub's cache (or the Hub when reachable). Python
symbols are located by parsing (ast), so a recorded line range that no longer holds its symbol is an error.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from huggingface_hub import try_to_load_from_cache

from explorer.checkpoint.hub import MAX_HUB_FILE_BYTES, fetch_hub_file
from explorer.checkpoint.safetensors_headers import load_json
from explorer.content.json_lines import key_lines
from explorer.content.model_content import ModelContent
from explorer.errors import CheckpointError, ContentError, did_you_mean
from explorer.model.transformers_files import transformers_file, transformers_version
from explorer.spec.types import Citation, ModelSpec, path_key, walk

TRANSFORMERS_REPO_URL = "https://github.com/huggingface/transformers/blob/v{version}/src/transformers/{path}"
HUB_FILE_URL = "https://huggingface.co/{repo}/blob/{revision}/{path}"
UNPINNED_BRANCH = "main"
"""What a citation of a checkpoint recorded without a Hub revision links to: the repository's current file."""


Origin = Literal["package", "cache", "regenerated", "absent"]
"""Where a cited file's text came from: the installed package, the local Hugging Face cache, regenerated from
the recorded config values (their sha256 matches the published file's), or nowhere (not available offline)."""


@dataclass(frozen=True, slots=True)
class ResolvedCitation:
    """A claim with the exact lines that back it, and their text when the file is at hand."""

    claim: str
    source: str
    """Repository or package the file belongs to: "moonshotai/Kimi-K2-Instruct", "transformers"."""
    file: str
    revision: str
    """Pinned revision (a commit) or package version."""
    first: int
    last: int
    """The cited lines: the symbol's, or the part of them the citation names."""
    lines: tuple[str, ...] | None
    """The cited lines, or None when the file is not available offline."""
    url: str
    symbol: str
    origin: Origin = "package"
    symbol_lines: tuple[int, int] = (0, 0)
    """The whole symbol's lines, which the cited lines lie within."""


def locate_symbol(text: str, qualname: str) -> tuple[int, int] | None:
    """Return (first, last) line of a module-level class/function or a method ("Class.method")."""
    return _symbol_lines(text).get(qualname)


@functools.lru_cache(maxsize=16)
def _symbol_lines(text: str) -> dict[str, tuple[int, int]]:
    """Lines of every class and function by qualname, from one parse per file text (a model cites one
    transformers file some sixty times)."""
    try:
        body: list[ast.stmt] = ast.parse(text).body
    except SyntaxError:
        return {}
    out: dict[str, tuple[int, int]] = {}
    _index_symbols(body, "", out)
    return out


def _index_symbols(statements: list[ast.stmt], prefix: str, out: dict[str, tuple[int, int]]) -> None:
    for n in statements:
        # the first definition of a name wins, and only its body is searched (as a lookup part by part would)
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and prefix + n.name not in out:
            out[prefix + n.name] = (n.lineno, n.end_lineno or n.lineno)
            _index_symbols(n.body, f"{prefix}{n.name}.", out)


def defined_symbols(text: str) -> list[str]:
    """Every class, function and method qualname in a module (for "did you mean")."""
    out: list[str] = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            out.append(node.name)
            if isinstance(node, ast.ClassDef):
                out += [f"{node.name}.{n.name}" for n in node.body if isinstance(n, ast.FunctionDef)]
    return out


def hub_text(repo_id: str, revision: str, filename: str, fetch: bool) -> str | None:
    """A file's text at a pinned revision from the local HF cache, or from the Hub (read with a byte cap and a
    deadline) when fetch is set; None if absent or unreachable."""
    cached = try_to_load_from_cache(repo_id, filename, revision=revision)
    if isinstance(cached, str):
        path = Path(cached)
        if path.stat().st_size > MAX_HUB_FILE_BYTES:
            raise CheckpointError(str(path), f"larger than the {MAX_HUB_FILE_BYTES:,}-byte cap for a cited file")
        return decode_text(path.read_bytes(), str(path))
    if not fetch or os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    try:
        data = fetch_hub_file(repo_id, revision, filename)
    except CheckpointError:
        return None
    return decode_text(data, f"{repo_id}@{revision}/{filename}")


def verified_text(text: str | None, sha256: str, source: str, key: str) -> str | None:
    """The text if its bytes hash to the recorded sha256; else None (nothing is quoted from it) and one warning
    line: a served or cached file with other bytes (another revision, an edited copy) was quoted as "read from
    the pinned file" beside numbers computed from the recorded values (issue 37)."""
    if text is None:
        return None
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest == sha256:
        return text
    why = f"its sha256 {digest[:12]}… is not the recorded {key} ({sha256[:12]}…)" if sha256 else \
        f"no {key} is recorded to check it against"
    print(f"  warning: {source}: {why}; not quoted", file=sys.stderr, flush=True)
    return None


def decode_text(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(source, f"not UTF-8 at byte {e.start}: {e.reason}") from None


class _Resolver:
    """Resolves every citation of one model, collecting problems instead of stopping at the first."""

    def __init__(self, content: ModelContent, fetch: bool) -> None:
        self.content = content
        self.model_file = content.folder / "model.toml"
        self.problems: list[str] = []
        self._texts: dict[Path, str] = {}
        ref = content.checkpoint
        modeling = hub_text(ref.repo_id, ref.revision, ref.modeling_file, fetch) if ref.modeling_file else None
        config_json = hub_text(ref.repo_id, ref.revision, "config.json", fetch)
        # a file found in the cache or served by the Hub is quoted as the pinned file only if it is that file
        self.modeling = verified_text(modeling, ref.modeling_sha256, f"{ref.repo_id}@{ref.revision[:7]}/"
                                      f"{ref.modeling_file}", "checkpoint.modeling_sha256")
        self.config_json = verified_text(config_json, ref.config_sha256, f"{ref.repo_id}@{ref.revision[:7]}/"
                                         "config.json", "checkpoint.config_sha256")
        self.config_regenerated = regenerate_config(content) if self.config_json is None else None

    def _text(self, path: Path) -> str:
        if path not in self._texts:
            self._texts[path] = path.read_text(encoding="utf-8")
        return self._texts[path]

    def resolve(self, cit: Citation, where: str = "") -> ResolvedCitation | None:
        if cit.source == "transformers":
            found = self._transformers(cit)
        elif cit.source == "checkpoint":
            found = self._checkpoint(cit)
        else:
            found = self._config(cit)
        return self._narrow(found, cit, where) if found is not None and cit.lines is not None else found

    def _transformers(self, cit: Citation) -> ResolvedCitation | None:
        path = transformers_file(cit.path)
        text = self._text(path)
        where = locate_symbol(text, cit.symbol)
        if where is None:
            self.problems.append(f"{path}: symbol '{cit.symbol}': not found{did_you_mean(cit.symbol, defined_symbols(text))}")
            return None
        version = transformers_version()
        first, last = trim_blank_end(text, *where)
        return ResolvedCitation(
            cit.claim, "transformers", path.name, version, first, last, _lines(text, first, last),
            TRANSFORMERS_REPO_URL.format(version=version, path=cit.path) + f"#L{first}-L{last}", cit.symbol,
            "package", (first, last))

    def _checkpoint(self, cit: Citation) -> ResolvedCitation | None:
        ref = self.content.checkpoint
        if not ref.modeling_file:
            return None
        return self._pinned(cit, "source_lines", ref.source_lines, ref.modeling_file, self.modeling, "cache",
                            locate_symbol)

    def _config(self, cit: Citation) -> ResolvedCitation | None:
        ref = self.content.checkpoint
        text: str | None = self.config_regenerated
        origin: Origin = "regenerated"
        if self.config_json is not None:
            text, origin = self.config_json, "cache"
        return self._pinned(cit, "config_lines", ref.config_lines, "config.json", text, origin, key_lines)

    def _pinned(self, cit: Citation, table: str, ranges: dict[str, tuple[int, int]], filename: str,
                text: str | None, origin: Origin, locate: Callable[[str, str], tuple[int, int] | None],
                ) -> ResolvedCitation | None:
        """A range recorded in content for a file of the checkpoint repo; verified when the file is at hand."""
        ref = self.content.checkpoint
        key = f"checkpoint.{table}.{cit.symbol}"
        if cit.symbol not in ranges:
            self.problems.append(f"{self.model_file}: key '{key}': missing (a line range [first, last] of "
                                 f"{filename} at {ref.revision[:7]})")
            return None
        first, last = ranges[cit.symbol]
        lines = None
        if text is not None:
            found = locate(text, cit.symbol)
            if found != (first, last):
                actual = f"lines {found[0]}–{found[1]}" if found else "no such symbol"
                self.problems.append(f"{self.model_file}: key '{key}': [{first}, {last}] does not hold "
                                     f"'{cit.symbol}' in {filename} at {ref.revision[:7]} (found: {actual})")
                return None
            lines = _lines(text, first, last)
        # no commit to link for a config recorded without one: the file as the repository holds it now
        at = ref.revision if ref.pinned else UNPINNED_BRANCH
        url = HUB_FILE_URL.format(repo=ref.repo_id, revision=at, path=filename) + f"#L{first}-L{last}"
        return ResolvedCitation(cit.claim, ref.repo_id, filename, ref.revision, first, last, lines, url, cit.symbol,
                                origin if text is not None else "absent", (first, last))

    def _narrow(self, found: ResolvedCitation, cit: Citation, where: str) -> ResolvedCitation | None:
        """The part of a symbol a citation names: inside the symbol, and not starting or ending on a blank line."""
        assert cit.lines is not None
        first, last = cit.lines
        whole = f"{found.first}–{found.last}"
        if not found.first <= first <= last <= found.last:
            self.problems.append(f"{where}: citation of '{cit.symbol}' in {found.file}: lines [{first}, {last}] do "
                                 f"not lie inside the symbol's lines {whole}")
            return None
        lines = None
        if found.lines is not None:
            lines = found.lines[first - found.first:last - found.first + 1]
            if not lines[0].strip() or not lines[-1].strip():
                self.problems.append(f"{where}: citation of '{cit.symbol}' in {found.file}: lines [{first}, {last}] "
                                     "start or end on a blank line")
                return None
        url = found.url.rsplit("#", 1)[0] + f"#L{first}-L{last}"
        return dataclasses.replace(found, first=first, last=last, lines=lines, url=url)


def trim_blank_end(text: str, first: int, last: int) -> tuple[int, int]:
    """The range without trailing blank lines, so an excerpt ends at the symbol's last line of code."""
    lines = text.splitlines()
    while last > first and not lines[last - 1].strip():
        last -= 1
    return first, last


def regenerate_config(content: ModelContent) -> str | None:
    """config.json rebuilt from the recorded values, as transformers writes it (two-space indent), in the published
    key order where one is recorded, else sorted, with nested tables in their recorded order or sorted, with or
    without a final newline; only a text whose sha256 is the recorded one is returned."""
    ref = content.checkpoint
    orders = [dict(sorted(content.config.items()))]
    if sorted(ref.config_order) == sorted(content.config):
        orders.insert(0, {k: content.config[k] for k in ref.config_order})
    for values in orders:
        for sort_nested in (False, True):
            text = json.dumps(values if not sort_nested else _sorted_nested(values), indent=2, ensure_ascii=False)
            for ending in ("\n", ""):
                if hashlib.sha256((text + ending).encode()).hexdigest() == ref.config_sha256:
                    return text + ending
    return None


def _sorted_nested(values: dict[str, Any]) -> dict[str, Any]:
    return {k: dict(sorted(v.items())) if isinstance(v, dict) else v for k, v in values.items()}


def config_values_digest(config: dict[str, Any]) -> str:
    """sha256 of a config's values as canonical JSON (sorted keys, no spaces): the same for any layout of the same
    values. Nulls inside nested tables are left out: TOML has no null, and content records only top-level ones
    (checkpoint.config_nulls)."""
    def without_nested_nulls(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: without_nested_nulls(v) for k, v in value.items() if v is not None}
        return [without_nested_nulls(v) for v in value] if isinstance(value, list | tuple) else value

    values = {k: without_nested_nulls(v) if isinstance(v, dict) else v for k, v in config.items()}
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=list)
    # surrogatepass: a lone surrogate is refused where the text is written (one line), not here with a traceback
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def check_recorded_config(content: ModelContent, stated_by_checkpoint: bool = False) -> None:
    """Raise ContentError unless the [config] values are the published ones: they serialise back to the config.json
    whose sha256 is recorded, or their digest is the recorded config_values_sha256. A value edited in model.toml
    after recording would otherwise be built and published (issue 18). An empty config_sha256 with no
    config_values_sha256 is refused too (issue 37: it used to turn the check off), except where the checkpoint's
    own files state the values (`stated_by_checkpoint`: a GGUF header's, recorded in checkpoint.toml and compared
    with [config] by every build)."""
    ref = content.checkpoint
    if ref.config_values_sha256 and config_values_digest(content.config) == ref.config_values_sha256:
        return
    if ref.config_sha256 and regenerate_config(content) is not None:
        return
    model_file = content.folder / "model.toml"
    if not ref.config_sha256.strip() and not ref.config_values_sha256:
        if stated_by_checkpoint:
            return
        raise ContentError([f"{model_file}: key 'checkpoint.config_sha256': empty, so nothing shows that [config] "
                            "holds the published values; record the config with build.py --add-model (which hashes "
                            "its bytes) or give checkpoint.config_values_sha256 (an empty hash is allowed only where "
                            "the model's checkpoint.toml states the config values, as a GGUF header's)"])
    if not ref.config_sha256.strip():
        raise ContentError([f"{model_file}: key 'config': the recorded values no longer hash to "
                            f"checkpoint.config_values_sha256 ({ref.config_values_sha256[:12]}…), so a value was "
                            "changed after it was recorded (or a key added or removed); restore the published "
                            "value, or record the config again with build.py --add-model"])
    where = f"{model_file}: key 'config"
    published = verified_text(hub_text(ref.repo_id, ref.revision, "config.json", fetch=False) if ref.pinned else None,
                              ref.config_sha256, f"{ref.repo_id}@{ref.revision[:7]}/config.json",
                              "checkpoint.config_sha256")
    if published is not None:  # the file itself is at hand (the local Hugging Face cache): name the keys
        values = load_json(published.encode(), "config.json", "config.json")
        if isinstance(values, dict) and (keys := _value_differences(values, content.config)):
            raise ContentError([f"{where}.{key}': {difference}" for key, difference in keys])
    raise ContentError([f"{where}': the recorded values no longer serialise "
                        f"to the config.json whose sha256 is checkpoint.config_sha256 "
                        f"({content.checkpoint.config_sha256[:12]}…), so a value was changed after it was recorded "
                        "(or a key added or removed); restore the published value, or record the config again with "
                        "build.py --add-model"])


def _lines(text: str, first: int, last: int) -> tuple[str, ...]:
    return tuple(text.splitlines()[first - 1:last])


def resolve_citations(spec: ModelSpec, content: ModelContent, fetch: bool = False,
                      ) -> dict[str, tuple[ResolvedCitation, ...]]:
    """Resolve every citation of a model's components, by component path; ContentError lists all problems."""
    resolver = _Resolver(content, fetch)
    cited = {c.symbol for _, comp in walk(spec.root) for c in comp.citations if c.source == "checkpoint"}
    for symbol in sorted(set(content.checkpoint.source_lines) - cited):
        resolver.problems.append(f"{resolver.model_file}: key 'checkpoint.source_lines.{symbol}': not cited by "
                                 f"the {spec.family} family{did_you_mean(symbol, cited)}")
    out: dict[str, tuple[ResolvedCitation, ...]] = {}
    for ancestors, comp in walk(spec.root):
        path = path_key(ancestors, comp)
        where = f"{spec.family} family, component '{path or 'model'}'"
        resolved = (resolver.resolve(c, where) for c in comp.citations)
        out[path] = tuple(r for r in resolved if r is not None)
    if resolver.problems:
        raise ContentError(sorted(set(resolver.problems)))
    return out


def absent_files(citations: dict[str, tuple[ResolvedCitation, ...]]) -> list[str]:
    """Cited files that are not at hand offline ("modeling_deepseek.py at fd1984e"), for the build log."""
    return sorted({f"{c.file} at {c.revision[:7] if len(c.revision) == 40 else c.revision}"  # not "unpinne"
                   for cits in citations.values() for c in cits if c.origin == "absent"})


def published_config_matches(data: bytes, content: ModelContent, source: str = "config.json") -> list[str]:
    """Compare a downloaded config.json with the recorded sha256 and values; return the differences."""
    problems = []
    digest = hashlib.sha256(data).hexdigest()
    if digest != content.checkpoint.config_sha256:
        problems.append(f"sha256 {digest} differs from the recorded {content.checkpoint.config_sha256}")
    published = load_json(data, source, "config.json")
    if not isinstance(published, dict):
        return problems + [f"not a JSON object but {type(published).__name__}"]
    return problems + [f"key '{key}': {difference}" for key, difference in _value_differences(published, content.config)]


def _value_differences(published: dict[str, Any], recorded: dict[str, Any]) -> list[tuple[str, str]]:
    return [(key, f"published {published.get(key)!r}, recorded {recorded.get(key)!r}")
            for key in sorted(set(published) | set(recorded)) if published.get(key) != recorded.get(key)]


def verify_published_config(content: ModelContent) -> list[str]:
    """Fetch config.json at the pinned revision (capped in bytes and time) and compare; raise when unreachable."""
    ref = content.checkpoint
    return published_config_matches(fetch_hub_file(ref.repo_id, ref.revision, "config.json"), content,
                                    f"{ref.repo_id}@{ref.revision}/config.json")
