"""--add-variant: record a published quantized variant of a model (content/models/BASE/variants/NAME.toml) from its
hf_quant_config.json, or a config.json with a compressed-tensors or block-wise FP8 quantization_config, through the
guarded writer."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from explorer.checkpoint.variants import VARIANTS_DIR, PublishedVariant, stored_as, variant_from_toml
from explorer.commands.add_model import read_config_text
from explorer.content.guarded_write import toml_key, toml_value, write_content_file
from explorer.content.model_content import REPO, REVISION, SLUG, UNPINNED
from explorer.errors import ContentError

MAX_QUANT_CONFIG_BYTES = 4_000_000
"""Largest --quant-config read (hf_quant_config.json files are a few kB; a config.json with a long ignore list
a few hundred kB)."""


def add_variant(content_dir: Path, base: str, quant_config: Path, repo: str, revision: str,
                revision_note: str = "", replace: bool = False) -> Path:
    """Record a published variant of `base` from its hf_quant_config.json (or a config.json with a
    compressed-tensors quantization_config): content/models/BASE/variants/NAME.toml. Everything is checked
    before anything is written (the arguments, the file read with a size bound, the text read back as a variant,
    and its layout predicted from the base model); the file is written by the guarded writer, and an existing
    one (another owner's variant of the same name, or a hand-edited one) is replaced only with `replace`."""

    problems = []
    if not SLUG.fullmatch(base):
        problems.append(f"--add-variant: model {base!r}: not a model name (lowercase letters, digits, '-' and '.')")
    if not isinstance(repo, str) or not REPO.fullmatch(repo):
        problems.append(f"--repo: {repo!r}: expected OWNER/NAME")
    if not isinstance(revision, str) or (not REVISION.fullmatch(revision) and revision != UNPINNED):
        problems.append(f"--revision: {revision!r}: expected a 40-hex-digit commit, or '{UNPINNED}'")
    if quant_config is None:
        problems.append("--add-variant: needs --quant-config PATH (hf_quant_config.json, or a config.json)")
    if problems:
        raise ContentError(problems)
    name = re.sub(r"[^a-z0-9.]+", "-", repo.split("/")[-1].lower()).strip("-.")
    name = re.sub(r"\.{2,}", ".", name)
    folder = content_dir / "models" / base
    if not SLUG.fullmatch(name):
        raise ContentError([f"--repo: {repo!r}: its name does not make a variant file name"])
    if folder.is_symlink() or not (folder / "model.toml").is_file():
        raise ContentError([f"--add-variant: no model {base!r} in {content_dir / 'models'}"])
    if revision == UNPINNED and not revision_note:
        revision_note = f"{quant_config.name} was recorded without the Hub revision it was read at"
    data, _, _ = read_config_text(quant_config, MAX_QUANT_CONFIG_BYTES, "--quant-config")
    text = variant_toml(data, quant_config, repo, revision, revision_note)
    out = folder / VARIANTS_DIR / f"{name}.toml"
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # the one writer escapes every key and value: this is a bug, said in a line
        raise ContentError([f"{quant_config}: could not be recorded as TOML ({e}); nothing written"]) from None
    variant = variant_from_toml(raw, out)
    _predictable(folder, variant, out)
    return write_content_file(content_dir, ("models", base, VARIANTS_DIR, out.name), text.encode("utf-8"),
                              replace=replace, create_folders=1)


def variant_toml(data: dict[str, Any], quant_config: Path, repo: str, revision: str, revision_note: str) -> str:
    """The variant file's text, every key and value spelled by the one TOML writer (explorer/content/guarded_write.py)."""
    producer = data.get("producer", {})
    words = " ".join(str(v) for v in producer.values()) if isinstance(producer, dict) else str(producer)
    lines = ["[variant]", f"name = {toml_value(repo.split('/')[-1])}", f"repo_id = {toml_value(repo)}",
             f"revision = {toml_value(revision)}", f"revision_note = {toml_value(revision_note)}",
             f"producer = {toml_value(words)}", ""]
    if "quantization" in data:
        table, q = "quantization", data["quantization"]
    else:
        table = "quantization_config"
        text_config = data.get("text_config")
        q = data.get("quantization_config") or (text_config.get("quantization_config")
                                                if isinstance(text_config, dict) else None)
        if q is None:
            raise ContentError([f"{quant_config}: no 'quantization' or 'quantization_config' table"])
    if not isinstance(q, dict):
        raise ContentError([f"{quant_config}: key '{table}': expected a JSON object"])
    lines += [f"[{table}]"] + [f"{toml_key(k)} = {toml_value(v)}" for k, v in sorted(q.items()) if v is not None]
    return "\n".join(lines) + "\n"


def _predictable(folder: Path, variant: PublishedVariant, where: Path) -> None:
    """The variant's layout predicted from the base model as the build will predict it: a config the library
    cannot lay out on this model (a group that does not divide a width) is refused before anything is written."""
    from explorer.content.model_content import load_model_content
    from explorer.model.families import FAMILIES, load_model_spec

    base = load_model_spec(load_model_content(folder))
    try:
        family = FAMILIES[base.family]
        stored_as(base, variant, family.variant_module_name, family.fp8_kept_modules)
    except ContentError as e:
        raise ContentError([p if p.startswith(str(where)) else f"{where}: {p}" for p in e.problems]) from None


# ---------------------------------------------------------------------------------------------- predicting
