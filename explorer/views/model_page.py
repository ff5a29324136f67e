"""Model-level view models: the tensor ledger, the headline figures, a router's worked example, the published
variants, the config's defaulted and unused keys, the equation check lines and the index card. They only format:
the numbers come from the stages that own them (account, figures, variants, execution)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from explorer.figures.model_build import ModelBuild
from explorer.figures.published_claims import HEADLINE_CONVENTION, ClaimRow
from explorer.model.families import FAMILIES
from explorer.spec.results import RealWeightCheck
from explorer.spec.types import path_key, walk
from explorer.views.basics import Link, fmt, page_href
from explorer.views.diagrams import budget_svg


@dataclass(frozen=True, slots=True)
class DefaultView:
    """A config key the published config omits: the value the model is built with, and whose default it is."""

    key: str
    value: str
    source: str


@dataclass(frozen=True, slots=True)
class UnusedKeyView:
    """A published config key nothing reads, with its value as published."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class CheckView:
    """The equation check line: what the step program was compared with, and the error measured."""

    status: str
    text: str
    link: Link | None
    config: Link | None = None
    """Where the tiny test configuration is described (once per model, on its overview page)."""
    tail: str = ""
    """What follows the configuration: the verdict and tolerance."""
    measured: str = ""
    """The max |Δ| this machine measured: its last digits depend on the CPU's kernels, so it is marked as such on
    the page (golden texts leave it out, issue 18)."""
    after: str = ""
    """What follows the measured value."""


@dataclass(frozen=True, slots=True)
class RealCheckView:
    """A real-weight check line: the verdict, the measured max |Δ| (machine-dependent digits) and the rest."""

    text: str
    measured: str
    after: str


@dataclass(frozen=True, slots=True)
class RoutingCellView:
    text: str
    selected: bool


@dataclass(frozen=True, slots=True)
class RoutingView:
    """A router's worked example: one token's values per expert, from the executed check."""

    caption: str
    experts: tuple[RoutingCellView, ...]
    rows: tuple[tuple[str, tuple[RoutingCellView, ...]], ...]
    summary: str


@dataclass(frozen=True, slots=True)
class LedgerRowView:
    role: str
    dtype: str
    tensors: str
    parameters: str
    """Logical parameters the row's tensors carry ("—" for scales and buffers)."""
    elements: str
    bytes: str


@dataclass(frozen=True, slots=True)
class LedgerView:
    source: str
    rows: tuple[LedgerRowView, ...]
    total_tensors: str
    total_parameters: str
    total_elements: str
    total_bytes: str
    parameters: str
    scales: str
    buffers: str
    status: str
    balanced: bool
    reference: str
    predicted: bool = False
    """The rows are the storage schemes' prediction, not a reconciled listing."""
    release_summary: str = ""
    """What the release layout below is and how it was predicted ("" where the release keeps the reference's names)."""
    release: tuple[tuple[str, str, str, str, str], ...] = ()
    """(name pattern, tensors, dtype, shape, bytes each) of the release's own tensors, grouped."""


@dataclass(frozen=True, slots=True)
class VariantView:
    """A published variant's "Stored as" section: where it is, how it stores the weights, and its numbers."""

    name: str
    repo_url: str
    revision: str
    storage: str
    rows: tuple[LedgerRowView, ...]
    tensors: tuple[tuple[str, str, str, str], ...]
    """(name pattern, dtype, shape, bytes per tensor)."""
    tensors_summary: str
    parameters: str
    header_elements: str
    bytes: str
    reason: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FigureRowView:
    label: str
    value: str
    readable: str
    """The value in words a reader scans ("32.9 billion", "9.2 GB"); the exact integer stays beside it."""
    formula: str
    definition: str


@dataclass(frozen=True, slots=True)
class ClaimRowView:
    """One published figure: the lab's, its source, the site's under each convention, and what reproduces it."""

    figure: str
    claim: str
    source: str
    lab_counts: str
    conventions: tuple[tuple[str, str, bool], ...]
    """(convention, the site's figure, whether it reproduces the claim), the headline's first."""
    verdict: str
    reproduced: bool


@dataclass(frozen=True, slots=True)
class FiguresView:
    rows: tuple[FigureRowView, ...]
    claims: tuple[ClaimRowView, ...] = ()
    convention: str = HEADLINE_CONVENTION
    """The headline's convention, in the same words on every model."""


ROLE_NAMES = {"parameter": "parameters", "quant_scale": "FP8 block scales", "buffer": "stored buffers"}
STORED_AS = {("parameter", "U8"): "MXFP4 blocks: packed FP4 values, two per byte",
             ("quant_scale", "U8"): "MXFP4 scales: one E8M0 exponent per 32 values",
             ("parameter", "I32"): "INT4 packed words: eight 4-bit values per int32 (compressed-tensors)",
             ("quant_scale", "BF16"): "INT4 group scales: one per group of input values",
             ("quant_scale", "I64"): "shapes of the packed weights (weight_shape, two integers each)",
             ("quant_scale", "F8_E4M3"): "NVFP4 block scales: one FP8 E4M3 per 16 values",
             ("parameter", "I8"): "FP4 values: two E2M1 per int8 byte (DeepSeek-V4's experts)"}
"""Ledger row labels where a dtype says what the bytes hold (U8 stores MXFP4, the only U8 scheme)."""


FP4_ROW_SCALES = "E8M0 scales: one per FP8 block, and one per 32 four-bit values of an expert's row"
"""The E8M0 scales row where four-bit experts (I8) share the dtype with the FP8 weights' block scales."""


def ledger_view(mb: ModelBuild) -> LedgerView:
    rec = mb.checkpoint or mb.predicted or mb.reference
    labels = dict(STORED_AS)
    if any((t.role, t.dtype) == ("parameter", "I8") for t in rec.totals):
        labels[("quant_scale", "F8_E8M0")] = FP4_ROW_SCALES
    rows = tuple(LedgerRowView(labels.get((t.role, t.dtype), ROLE_NAMES[t.role]), t.dtype, fmt(t.tensors),
                               fmt(t.parameters) if t.parameters else "—", fmt(t.elements), fmt(t.bytes))
                 for t in rec.totals)
    problems = (f"{len(rec.unowned)} unowned, {len(rec.owned_twice)} owned twice, {len(rec.missing)} missing, "
                f"{len(rec.shape_mismatch)} shape mismatches, {len(rec.dtype_mismatch)} dtype mismatches")
    if rec is mb.predicted:
        problems = "Predicted, not read: with no listing to compare against, nothing here is reconciled"
    ref = reference_sentence(mb)
    if mb.checkpoint_index is not None:
        source = (f"Checkpoint headers of {mb.content.checkpoint.at}, "
                  f"from the recorded manifest ({mb.checkpoint_index.provenance})")
    else:
        source = ("No checkpoint tensor listing is recorded for this model: the stored layout below is predicted "
                  "from the config (each weight's storage scheme, from torch_dtype and any quantization_config, "
                  "gives its stored tensors' names, shapes and dtypes), not read from the checkpoint. Its "
                  "parameters are checked against the reference implementation.")
    return LedgerView(
        source=source, rows=rows, total_tensors=fmt(sum(t.tensors for t in rec.totals)),
        total_parameters=fmt(sum(t.parameters for t in rec.totals)),
        total_elements=fmt(sum(t.elements for t in rec.totals)), total_bytes=fmt(sum(t.bytes for t in rec.totals)),
        parameters=fmt(rec.role_total("parameter")[1]), scales=fmt(rec.role_total("quant_scale")[1]),
        buffers=fmt(rec.role_total("buffer")[1]), status=problems, balanced=rec.balanced, reference=ref,
        predicted=rec is mb.predicted, **_release(mb))


def _release(mb: ModelBuild) -> dict:
    """The release's own names, one row per group, where the spec uses the reference's (DeepSeek-V4, Kimi Linear)."""
    r = mb.release
    if r is None:
        return {}
    groups = r.index.groups
    bytes_total = sum(g.nbytes * g.count for g in groups)
    mtp = (f"; the multi-token-prediction layer the config declares is under {r.mtp_prefix} (transformers skips "
           "it by that prefix)" if r.mtp_prefix else "")
    summary = (f"The release's own layout, predicted: {fmt(r.index.tensor_count)} tensors, {fmt(bytes_total)} bytes, "
               f"under the lab's own names, one tensor per routed expert and projection{mtp}. It is the table above "
               "restated by undoing transformers' loading rules for the family (its renames, and the tensors it "
               "merges or concatenates as it loads), and a test loads it through those rules.")
    rows = tuple((g.name, fmt(g.count), g.dtype, "[" + ", ".join(f"{d:,}" for d in g.shape) + "]", fmt(g.nbytes))
                 for g in groups)
    return {"release_summary": summary, "release": rows}


def reference_sentence(mb: ModelBuild) -> str:
    """The reference's own count (its parameters and persistent buffers, as it classifies them), whether the
    tensors balance, and where the ledger counts one of its buffers as a parameter, that difference itemised."""
    rc = mb.reference_count
    assert rc is not None
    text = (f"Against the reference implementation ({mb.reference_label}): {fmt(rc.parameter_tensors)} parameter "
            f"tensors, {fmt(rc.parameters)} elements, "
            + (f"and {fmt(rc.buffer_tensors)} persistent buffers of {fmt(rc.buffers)} elements beside them, "
               if rc.buffer_tensors else "")
            + ("balanced" if mb.reference.balanced else "NOT balanced"))
    if rc.held_as_buffers:
        held = "; ".join(f"{h.name} ({fmt(h.tensors)} tensors, {fmt(h.elements)} elements)" for h in rc.held_as_buffers)
        text += (f". The ledger counts {fmt(rc.ledger_parameters)} parameters for these tensors: it also counts as "
                 f"parameters what the reference holds as buffers, as a listing of the checkpoint's tensors lists "
                 f"them beside the weights: {held}")
    return text + (f"; modules it does not build: {', '.join(mb.reference_skips)}." if mb.reference_skips else ".")


def readable(value: int, unit: str) -> str:
    """1,026,408,232,448 -> "1.03 trillion"; bytes -> "9.21 GB" (decimal units)."""
    if unit == "bytes":
        for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if value >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value} bytes"
    for scale, name in ((1e15, "quadrillion"), (1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
        if value >= scale:
            return f"{value / scale:.3g} {name}"
    return fmt(value)


def figures_view(mb: ModelBuild) -> FiguresView:
    rows = tuple(FigureRowView(f.label, fmt(f.value), readable(f.value, "bytes" if "bytes" in f.key else ""),
                               f.formula, f.definition) for f in mb.figures.figures)
    return FiguresView(rows, tuple(claim_row_view(r) for r in mb.claims))


def claim_row_view(r: ClaimRow) -> ClaimRowView:
    c = r.claim
    rounding = "cut down to the lab's last digit" if c.rounding == "down" else "rounded to the lab's last digit"
    if r.reproduced_by:
        verdict = f"Reproduced ({rounding}) by: {'; '.join(r.reproduced_by)}. {r.headline_difference}".strip()
    else:
        verdict = f"No convention reproduces it ({rounding}). Where the difference lies: {c.difference}"
    return ClaimRowView(c.figure, c.claim, c.source, c.lab_counts or "the lab does not say what the figure counts",
                        tuple((v.label, fmt(v.value), v.reproduces) for v in r.conventions), verdict,
                        bool(r.reproduced_by))


def routing_view(mb: ModelBuild, path: str) -> RoutingView | None:
    """The worked example a router's executed check recorded, formatted per expert."""
    example = mb.checks[path].example
    if example is None:
        return None
    chosen = set(example.selected)
    n = len(example.rows[0][1])
    experts = tuple(RoutingCellView(f"expert {i}", i in chosen) for i in range(n))
    rows = tuple((label, tuple(RoutingCellView(f"{v:.4f}", i in chosen) for i, v in enumerate(values)))
                 for label, values in example.rows)
    names = ", ".join(str(i) for i in example.selected)  # counted from 0, as the experts' tensor names
    return RoutingView(
        caption=f"Routing of one token ({example.token}) in the executed check, {mb.checks[path].config}.",
        experts=experts, rows=rows,
        summary=f"Selected: expert{'s' if len(chosen) > 1 else ''} {names} (highlighted; experts counted from 0, as "
                f"their tensor names); transformers' router "
                f"selected the same experts with the same gates, within the tolerance {mb.checks[path].tolerance:g}.")


VARIANT_STORED_AS = {
    "NVFP4": {("parameter", "U8"): "NVFP4 values: two FP4 (E2M1) per byte",
              ("quant_scale", "F32"): "per-tensor scales (weight_scale_2, input_scale)"},
    "FP8PerTensor": {("quant_scale", "F32"): "per-tensor scales (weight_scale, input_scale)"},
}
"""Row labels where a variant's scheme says what a dtype holds (U8 is NVFP4 here, not MXFP4)."""


def variant_views(mb: ModelBuild) -> tuple[VariantView, ...]:
    """Each published variant's predicted layout and numbers, formatted (explorer/checkpoint/variants.py computes them)."""
    out = []
    for s in mb.variants:
        m = s.variant.meta
        names = {**STORED_AS, **VARIANT_STORED_AS.get(s.scheme, {})}
        rows = tuple(LedgerRowView(names.get((r.role, r.dtype), ROLE_NAMES[r.role]), r.dtype, fmt(r.tensors),
                                   fmt(r.parameters) if r.parameters else "—", fmt(r.elements), fmt(r.bytes))
                     for r in s.rows)
        tensors = tuple((name, dtype, "[" + ", ".join(f"{d:,}" for d in shape) + "]", fmt(nbytes))
                        for name, dtype, shape, nbytes in s.tensors)
        revision = m.revision if m.revision != "unpinned" else f"revision not pinned: {m.revision_note}"
        out.append(VariantView(m.name, f"https://huggingface.co/{m.repo_id}", revision, s.storage_label, rows, tensors,
                               f"Every stored tensor ({len(tensors)} name patterns)", fmt(s.parameters), fmt(s.header_elements), fmt(s.bytes), s.naive_count_reason,
                               s.notes))
    return tuple(out)


def defaults_view(mb: ModelBuild) -> tuple[DefaultView, ...]:
    """Each defaulted key with the value the spec was built with and the reference config class it comes from."""
    family = FAMILIES[mb.spec.family]
    recorded = mb.content.checkpoint.config_defaulted  # every omitted key, where --add-model recorded them
    if recorded:
        return tuple(DefaultView(key, config_display(family.defaulted_value(mb.spec.config, key)),
                                 family.default_source(key)) for key in recorded)
    return tuple(DefaultView(key, config_display(_config_value(mb.spec.config, key)), family.default_source(key))
                 for key in mb.spec.defaulted)


def unused_view(mb: ModelBuild) -> tuple[UnusedKeyView, ...]:
    """Each published key recorded as unused, with its value as config.json writes it."""
    out = []
    for key in mb.content.checkpoint.config_unused:
        value: object = mb.content.config
        for part in key.split("."):  # "text_config.some_key": a key inside a nested table
            value = value[part]  # type: ignore[index]
        written = value is None or isinstance(value, (dict, list))  # published null is null, not "unset"
        shown = json.dumps(value, ensure_ascii=False) if written else config_display(value)
        out.append(UnusedKeyView(key, shown))
    return tuple(out)


def _config_value(config: object, key: str) -> object:
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def config_display(value: object) -> str:
    """A config value as config.json writes it (true, null, 1e-06)."""
    if value is None:
        return "null (unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, dict, list, tuple)):
        return json.dumps(value)
    return repr(value) if isinstance(value, (int, float)) else str(value)


def check_view(mb: ModelBuild, path: str) -> CheckView:
    """The check line; the tiny configuration is spelled out on the model page only, and linked from the rest."""
    check = mb.checks[path]
    if check.status == "checked":
        detail = f"; {check.detail}" if check.detail else ""
        lead = f"Equations executed and checked against {check.reference} on the"
        return CheckView("checked", lead, None, Link("tiny test configuration", "index.html#tiny-config"),
                         f": within the tolerance {check.tolerance:g} (max |Δ| = ", measured(check.max_abs_error),
                         f" on the machine that built this page){detail}.")
    if check.status == "part":
        title = _title_of(mb, check.part_of)
        return CheckView("part", f"Equations executed and checked as part of {title}: its step program runs "
                         "these steps and matches the reference there.", Link(title, page_href(check.part_of)))
    return CheckView("unchecked", f"Equations traced but not checked against a reference: {check.detail}.", None)


def tiny_config(mb: ModelBuild) -> str:
    """The model page's one description of the configuration every equation check runs on."""
    configs = sorted({c.config for c in mb.checks.values() if c.config})
    if not configs:
        return ""
    return ("Every equation check on these pages runs the page's step program and the reference implementation "
            f"on the same input, at the family's {'; '.join(configs)}. Small widths keep a check fast; the "
            "routing, scaling and rotary settings are the model's own.")


def real_check_view(c: RealWeightCheck) -> RealCheckView:
    return RealCheckView(
        f"Checked on the checkpoint’s real weights: block {c.layer} run with the weights stored in {c.source} "
        f"and compared with {c.reference}: within the tolerance {c.tolerance:g} (max |Δ| = ",
        measured(c.max_abs_error), f" on the machine that built this page); {c.detail}.")


def measured(error: float) -> str:
    """A measured max |Δ| as the page prints it."""
    return f"{error:.1e}"


def _title_of(mb: ModelBuild, path: str) -> str:
    for anc, comp in walk(mb.spec.root):
        if path_key(anc, comp) == path:
            return comp.title if path else mb.content.meta.name
    return path


def budget_preview(mb: ModelBuild) -> str:
    """Index preview: the share of parameters in each top-level part of the model."""
    segments = []
    for ch in mb.spec.root.children:
        acc = mb.ledger.accounts[ch.key]
        if ch.children and ch.kind == "group":
            for sub in ch.children:
                sub_acc = mb.ledger.accounts[f"{ch.key}.{sub.key}"]
                segments.append((sub.crumb or sub.title, sub_acc.total))
        elif acc.total:
            segments.append((ch.title, acc.total))
    return budget_svg(mb.content.meta.name, segments)
