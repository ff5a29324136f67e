"""Published variants of a model: quantized checkpoints of the same weights (NVFP4, FP8, INT4 releases by the lab
or by a third party), each predicted from its quantization config and explained in a "Stored as" section.

A variant lives beside its base model, content/models/<base>/variants/<name>.toml, written by
`build.py --add-variant BASE --quant-config PATH --repo OWNER/NAME --revision REV` (or by hand): where it is
published, and its quantization config as recorded (ModelOpt's hf_quant_config.json "quantization" table, or a
config.json "quantization_config" of compressed-tensors or of block-wise FP8, quant_method "fp8"). Pointing the
explorer at a new variant is that one file. A block-wise FP8 variant is laid out by the base model's family, which
reads that quantization_config in its own configs (its layout checked against transformers' FP8 quantizer).

What a variant's section states, all computed here from the base model's spec and the variant's config:
- the predicted tensor layout: every stored tensor (name pattern, dtype, shape, bytes) with the exclude or ignore
  list applied, layer by layer, to the base model's projections and, for ModelOpt, to its fused experts (exported
  one projection per expert); a ModelOpt export starts from the weights in the variant's dtype, so whatever the
  base checkpoint quantized itself (DeepSeek's FP8 blocks) is not carried over;
- the bytes on disk, and the logical parameters it stores, which equal the base model's (tested);
- what a count of header elements would report, and why it differs;
- notes on what differs from the base checkpoint and what the layout leaves out (the KV-cache scales).

tests/test_nvfp4_variants.py reconciles synthetic NVFP4 and FP8 files, written as ModelOpt lays them out, with
the prediction. `weight_format_bytes` gives the memory calculator each format's stored bytes per parameter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from explorer.checkpoint.reconcile import expected_groups, predicted_index, reconcile
from explorer.content.model_content import SLUG, parse_table
from explorer.errors import ContentError
from explorer.model.families.block_fp8 import FP8QuantizationConfig, fp8_block_storage, fp8_problems, naming_any
from explorer.model.quantization import (
    CompressedTensorsConfig,
    compressed_tensors_problems,
    dequantized,
    excluded,
    ignored,
    quantize_linears,
)
from explorer.spec.storage import (
    DTYPE_BYTES,
    MXFP4,
    NVFP4,
    BlockFP8,
    Dense,
    FP8PerTensor,
    PackQuantized,
    SchemeError,
    Storage,
    bytes_per_parameter,
)
from explorer.spec.types import Citation, ModelSpec, TensorSpec, walk

VARIANTS_DIR = "variants"


@dataclass(frozen=True, slots=True)
class ModelOptQuantization:
    """hf_quant_config.json's "quantization" table as ModelOpt writes it."""

    quant_algo: str
    """"NVFP4" or "FP8"."""
    group_size: int = 16
    exclude_modules: tuple[str, ...] = ()
    kv_cache_quant_algo: str | None = None


@dataclass(frozen=True, slots=True)
class VariantMeta:
    name: str
    repo_id: str
    revision: str
    revision_note: str = ""
    producer: str = ""
    """Who wrote the quantized files ("modelopt 0.43.0", "compressed-tensors")."""
    weight_dtype: str = "BF16"
    """Dtype of the tensors the config leaves unquantized."""


@dataclass(frozen=True, slots=True)
class PublishedVariant:
    slug: str
    meta: VariantMeta
    modelopt: ModelOptQuantization | None = None
    compressed_tensors: CompressedTensorsConfig | None = None
    block_fp8: FP8QuantizationConfig | None = None
    """A config.json quantization_config of quant_method "fp8" (weight_block_size, modules_to_not_convert)."""


@dataclass(frozen=True, slots=True)
class StoredRow:
    """One group of stored tensors of a role and dtype."""

    role: str
    dtype: str
    tensors: int
    elements: int
    bytes: int
    parameters: int


@dataclass(frozen=True, slots=True)
class StoredAs:
    """A variant's predicted layout and the numbers its section states."""

    variant: PublishedVariant
    scheme: str
    """The storage scheme's class name ("NVFP4", "FP8PerTensor", "PackQuantized")."""
    storage_label: str
    rows: tuple[StoredRow, ...]
    tensors: tuple[tuple[str, str, tuple[int, ...], int], ...]
    """(name pattern, dtype, shape, bytes per tensor) of every stored tensor family."""
    parameters: int
    header_elements: int
    bytes: int
    notes: tuple[str, ...] = ()
    """What the layout differs from the base checkpoint in, and what it leaves out, in words."""

    @property
    def naive_count_reason(self) -> str:
        packed = [r for r in self.rows if r.role == "parameter" and r.parameters != r.elements]
        scales = sum(r.elements for r in self.rows if r.role == "quant_scale")
        words = ", ".join(f"{r.dtype} holds {r.parameters // max(r.elements, 1)} values per element" for r in packed)
        return (f"A count of header elements reports {self.header_elements:,}, not {self.parameters:,}: "
                + (f"packed tensors count one element per storage unit ({words}), " if packed else "")
                + f"and {scales:,} scale and shape elements count as if they were weights.")


# ------------------------------------------------------------------------------------------------ content

def load_variants(model_folder: Path) -> tuple[PublishedVariant, ...]:
    """Every variants/*.toml of a model, sorted by name; ContentError names each bad file and key. The folder and
    its files go through the content checks: no link out of the model's folder, UTF-8 TOML, each value in form."""
    folder = model_folder / VARIANTS_DIR
    if folder.is_symlink():
        raise ContentError([f"{folder}: is a link; a model's variants folder may not link out of it"])
    if not folder.is_dir():
        return ()
    problems: list[str] = []
    variants = []
    for path in sorted(folder.glob("*.toml")):
        try:
            variants.append(load_variant(path, model_folder))
        except ContentError as e:
            problems += e.problems
    if problems:
        raise ContentError(problems)
    return tuple(variants)


def load_variant(path: Path, model_folder: Path | None = None) -> PublishedVariant:
    from explorer.content.model_content import load_toml

    if not SLUG.fullmatch(path.stem):
        raise ContentError([f"{path}: not a variant name (lowercase letters, digits, '-' and '.'); rename the file"])
    if path.is_symlink():
        raise ContentError([f"{path}: is a link; variant files are read only where they are"])
    return variant_from_toml(load_toml(path, model_folder or path.parent.parent), path)


def variant_from_toml(raw: dict[str, Any], path: Path) -> PublishedVariant:
    """A variant file's tables checked completely: every key known and typed, the repository and revision in
    form, the quantization a scheme the library predicts with numbers within the scheme's definition, and every
    pattern bounded; ContentError lists each problem with the file and key."""
    problems: list[str] = []
    meta = parse_table(raw.get("variant"), VariantMeta, f"{path}: table 'variant'", problems)
    modelopt = (parse_table(raw["quantization"], ModelOptQuantization, f"{path}: table 'quantization'", problems)
                if "quantization" in raw else None)
    table = raw.get("quantization_config")
    fp8 = isinstance(table, dict) and table.get("quant_method") == "fp8"
    where = f"{path}: table 'quantization_config'"
    ct = (parse_table(table, CompressedTensorsConfig, where, problems) if "quantization_config" in raw and not fp8
          else None)
    block = parse_table(table, FP8QuantizationConfig, where, problems) if fp8 else None
    unknown = sorted(set(raw) - {"variant", "quantization", "quantization_config"})
    problems += [f"{path}: table '{k}': unknown (a variant has [variant] and one quantization table)" for k in unknown]
    if sum(q is not None for q in (modelopt, ct, block)) != 1 and not problems:
        problems.append(f"{path}: expected one of table 'quantization' (ModelOpt) or 'quantization_config' "
                        "(compressed-tensors, or block-wise FP8)")
    problems += [f"{path}: {p}" for p in fp8_problems(block)]
    if modelopt is not None and modelopt.quant_algo not in ("NVFP4", "FP8"):
        problems.append(f"{path}: key 'quantization.quant_algo': must be 'NVFP4' or 'FP8', got {modelopt.quant_algo!r}")
    problems += [f"{path}: {p}" for p in compressed_tensors_problems(ct, "quantization_config")]
    problems += _meta_problems(meta, path)
    if problems:
        raise ContentError(problems)
    variant = PublishedVariant(path.stem, meta, modelopt, ct, block)
    try:  # the scheme's own rule on every number it takes (group_size), as every family's storage is held to
        variant_storage(variant)
    except SchemeError as e:
        table = "quantization" if modelopt is not None else "quantization_config.config_groups.weights"
        raise ContentError([f"{path}: {p.replace(chr(39), chr(39) + table + '.', 1)}" for p in e.problems]) from None
    return variant


MAX_NOTE = 1000
"""Longest revision note of a variant (it is printed beside the variant's section)."""


def _meta_problems(meta: VariantMeta | None, path: Path) -> list[str]:
    """The [variant] values whose form the type alone does not fix (as content.py checks a model's)."""
    from explorer.content.model_content import MAX_TEXT, REPO, REVISION, UNPINNED

    if meta is None:
        return []
    where = f"{path}: key 'variant."
    out = [f"{where}{k}': longer than {MAX_TEXT} characters" for k in ("name", "producer", "weight_dtype")
           if len(getattr(meta, k)) > MAX_TEXT]
    if len(meta.revision_note) > MAX_NOTE:
        out.append(f"{where}revision_note': longer than {MAX_NOTE} characters")
    if not REPO.fullmatch(meta.repo_id):
        out.append(f"{where}repo_id': expected OWNER/NAME, got {meta.repo_id[:80]!r}")
    if not REVISION.fullmatch(meta.revision) and meta.revision != UNPINNED:
        out.append(f"{where}revision': expected a 40-hex-digit commit or '{UNPINNED}', got {meta.revision[:80]!r}")
    if meta.revision == UNPINNED and not meta.revision_note.strip():
        out.append(f"{where}revision_note': missing (required with revision = \"{UNPINNED}\": say why)")
    if meta.weight_dtype not in DTYPE_BYTES:
        out.append(f"{where}weight_dtype': unknown dtype {meta.weight_dtype[:40]!r}")
    return out


def variant_storage(v: PublishedVariant) -> NVFP4 | FP8PerTensor | PackQuantized | BlockFP8:
    if v.block_fp8 is not None:
        storage = fp8_block_storage(v.block_fp8)
        assert isinstance(storage, BlockFP8)
        return storage
    if v.modelopt is not None:
        return NVFP4(v.modelopt.group_size) if v.modelopt.quant_algo == "NVFP4" else FP8PerTensor()
    assert v.compressed_tensors is not None
    w = next(iter(v.compressed_tensors.config_groups.values())).weights
    assert w is not None and w.group_size is not None
    return PackQuantized(w.num_bits, w.group_size, v.meta.weight_dtype)


def variant_spec(base: ModelSpec, v: PublishedVariant, module_name=lambda n: n,
                 fp8_kept: tuple[str, ...] = ()) -> ModelSpec:
    """The base model's spec with the variant's storage on every projection its config does not exclude. A
    block-wise FP8 variant of a family that reads such a quantization_config itself is laid out by the family;
    of one that does not (DeepSeek's own FP8 scheme), every Linear but those modules_to_not_convert and `fp8_kept`
    (the family's fp8_kept_modules, which transformers' FP8 quantizer never converts) name."""
    if v.block_fp8 is not None and _reads_block_fp8(base):
        return _block_fp8_spec(base, v)
    storage = variant_storage(v)
    root, fused = base.root, None
    if v.modelopt is not None:
        globs = v.modelopt.exclude_modules
        skip = lambda name: excluded(name, globs)  # noqa: E731
        source = f"hf_quant_config.json of {v.meta.repo_id}"
        # ModelOpt exports from the weights in the variant's dtype: what it leaves out is stored in that dtype,
        # whatever scheme the base checkpoint used (DeepSeek's FP8 blocks), and fused experts are split per expert
        root, fused = dequantized(root, Dense(v.meta.weight_dtype)), base.values
    elif v.block_fp8 is not None:
        skip = naming_any((*(v.block_fp8.modules_to_not_convert or ()), *fp8_kept))
        source = f"quantization_config of {v.meta.repo_id}"
        # as the ModelOpt export: from the weights in the variant's dtype, the experts stored one per file tensor
        root, fused = dequantized(root, Dense(v.meta.weight_dtype)), base.values
    else:
        patterns = v.compressed_tensors.ignore  # type: ignore[union-attr]
        skip = lambda name: ignored(name, patterns)  # noqa: E731
        source = f"quantization_config of {v.meta.repo_id}"
    citation = Citation(f"{v.meta.name} stores these weights {storage.stored_as} ({source}).", "config",
                        "quantization_config")
    return replace(base, root=quantize_linears(root, storage, skip, citation, module_name, fused))


def _reads_block_fp8(base: ModelSpec) -> bool:
    """Whether the base model's family types its quantization_config as block-wise FP8 (FP8QuantizationConfig)."""
    typed: Any = base.config  # a family's frozen dataclass of config keys
    field = next((f for f in dataclasses.fields(typed) if f.name == "quantization_config"), None)
    return field is not None and "FP8QuantizationConfig" in str(field.type)


def _block_fp8_spec(base: ModelSpec, v: PublishedVariant) -> ModelSpec:
    """The base model built by its family with the variant's quantization_config in its config: the layout the
    family predicts for its own FP8 checkpoints, modules_to_not_convert applied as transformers applies it."""
    from explorer.model.families import FAMILIES

    typed: Any = base.config  # a family's frozen dataclass of config keys
    family = FAMILIES[base.family]
    config = replace(typed, quantization_config=v.block_fp8)
    problems = family.check(config)  # a family may refuse the block (GPT-2: transformers converts nothing)
    if problems:
        raise ContentError([f"variant {v.slug}: {p}" for p in problems])
    return replace(base, config=config, root=family.build(config, dict(base.values)))


def stored_as(base: ModelSpec, v: PublishedVariant, module_name=lambda n: n,
              fp8_kept: tuple[str, ...] = ()) -> StoredAs:
    """The variant's predicted layout, its bytes, its logical parameters and its header count."""
    spec = variant_spec(base, v, module_name, fp8_kept)
    _group_divides_widths(spec, variant_storage(v), v)
    expected = expected_groups(spec)
    rec = reconcile(spec, predicted_index(spec, expected), expected=expected)
    rows = tuple(StoredRow(t.role, t.dtype, t.tensors, t.elements, t.bytes, t.parameters) for t in rec.totals)
    tensors = tuple(sorted({(g.box.pattern, g.dtype, tuple(g.shape or ()), _nbytes(g.dtype, g.shape))
                            for g in expected}))
    storage = variant_storage(v)
    return StoredAs(v, type(storage).__name__, storage.label, rows, tensors, sum(r.parameters for r in rows),
                    sum(r.elements for r in rows), sum(r.bytes for r in rows), _notes(base, spec, v, module_name))


def _group_divides_widths(spec: ModelSpec, storage: Storage, v: PublishedVariant) -> None:
    """A group of inputs per scale must divide the input width of every weight it is applied to: the scale count
    is width / group, and a group that does not divide it describes no file a quantizer writes."""
    from explorer.model.account import evaluate

    group = getattr(storage, "group_size", None) or getattr(storage, "group", None)
    if not group:
        return
    for _, comp in walk(spec.root):
        for t in comp.tensors:
            if t.storage == storage and t.shape:
                width = evaluate(t.shape[-1], spec.values)
                if width % group:
                    key = "quantization.group_size" if v.modelopt is not None else \
                        "quantization_config.config_groups.weights.group_size"
                    raise ContentError([f"variant {v.slug}: key '{key}': {group} does not divide the input width "
                                        f"{width:,} of {t.template}"])


def _notes(base: ModelSpec, spec: ModelSpec, v: PublishedVariant, module_name) -> tuple[str, ...]:
    """The sentences a reader needs beside the numbers: tensors renamed or re-stored relative to the base
    checkpoint, names the published files spell otherwise, and what the prediction leaves out."""
    def tensors(s: ModelSpec) -> dict[str, TensorSpec]:
        return {t.template: t for _, c in walk(s.root) for t in c.tensors}

    before, after = tensors(base), tensors(spec)
    notes = []
    split = sorted({t.rsplit(".experts.", 1)[1] for t in after.keys() - before.keys() if ".experts.{expert}." in t})
    if split:
        notes.append("The base checkpoint's fused experts (one tensor for all experts) are exported one projection "
                     f"per expert ({', '.join('experts.{e}.' + n.removeprefix('{expert}.') for n in split)}), "
                     "each quantized like a Linear, as ModelOpt exports fused experts.")
    if any(not isinstance(t.storage, Dense) for t in before.values()) and v.modelopt is not None:
        notes.append(f"The base checkpoint's own quantization is not in it: the export starts from "
                     f"{v.meta.weight_dtype} weights, so what the exclude list leaves is stored in {v.meta.weight_dtype}.")
    renamed = next(((t.first_name, module_name(t.first_name)) for t in after.values()
                    if module_name(t.first_name) != t.first_name), None)
    if renamed:
        notes.append(f"Names are shown as transformers names the modules; the exclude list and the published files "
                     f"use the original names ({renamed[0]} is {renamed[1]} there).")
    if v.modelopt is not None and v.modelopt.kv_cache_quant_algo:
        notes.append(f"The config also quantizes the KV cache to {v.modelopt.kv_cache_quant_algo}: the export adds a "
                     "few F32 key and value scales per attention layer, which this layout does not list.")
    return tuple(notes)


def _nbytes(dtype: str, shape: Any) -> int:
    from explorer.spec.storage import DTYPE_BYTES

    n = DTYPE_BYTES.get(dtype, 0)
    for s in shape or ():
        n *= s
    return n


# ------------------------------------------------------------------------------------- for the memory calculator

WEIGHT_FORMATS: dict[str, Storage] = {
    "BF16": Dense("BF16"),
    "FP8, one scale per 128 × 128 block": BlockFP8("F8_E4M3", (128, 128)),
    "FP8, one scale per tensor": FP8PerTensor(),
    "MXFP4": MXFP4(),
    "NVFP4": NVFP4(16),
    "INT4, group 32 (compressed-tensors)": PackQuantized(4, 32, "BF16"),
}
"""The weight formats published checkpoints use, each as the storage scheme the explorer predicts layouts with."""


def weight_format_bytes(shape: tuple[int, ...] = (4096, 4096)) -> dict[str, float]:
    """Format label -> bytes per logical parameter as stored, scales included, for a weight of `shape` (per-tensor
    scalars and shape vectors make a small weight cost a little more per parameter than a large one)."""
    return {label: bytes_per_parameter(scheme, shape) for label, scheme in WEIGHT_FORMATS.items()}
