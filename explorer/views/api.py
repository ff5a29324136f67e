"""site/api/<slug>.json: the component tree with parameters, shapes, tensors, evidence and the ledger."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from explorer.checkpoint.reconcile import Reconciliation
from explorer.figures import calculator, engines
from explorer.figures.engines import sglang, vllm
from explorer.figures.model_build import ModelBuild
from explorer.figures.published_claims import HEADLINE_CONVENTION, ClaimRow
from explorer.figures.stored import STORED_DEFINITION
from explorer.model.components.serving import LayerKind
from explorer.spec.types import Component, path_key, walk


def api_file(mb: ModelBuild) -> dict[str, str]:
    """The model's JSON twin as the file api/<slug>.json holds it."""
    text = json.dumps(model_api(mb), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return {f"api/{mb.slug}.json": text + "\n"}


def model_api(mb: ModelBuild) -> dict[str, Any]:
    """A JSON-ready description of one model, for other tools."""
    ref = mb.content.checkpoint
    return {
        "slug": mb.slug,
        "name": mb.content.meta.name,
        "family": mb.spec.family,
        "checkpoint": {"repo_id": ref.repo_id, "revision": ref.revision, "config_sha256": ref.config_sha256},
        "total_parameters": mb.figures.get("total_parameters").value,
        "stored_definition": STORED_DEFINITION,
        "figures": [{"key": f.key, "label": f.label, "value": f.value, "formula": f.formula, "definition": f.definition}
                    for f in mb.figures.figures],
        "kv_cache_per_layer": [{"block": c.block, "layers": c.layers, "elements_per_token": c.cache_per_token,
                                "mha_elements_per_token": c.mha_per_token, "window": c.window,
                                # sparse attention: the keys a query reads at most, and what a token's entry holds
                                **({"attended_keys": c.topk, "makeup": c.note} if c.topk else {})}
                               for c in mb.figures.attention],
        "max_context": mb.figures.serving.max_context,
        "layer_kinds": [_layer_kind(k, mb.figures.serving.max_context) for k in mb.figures.serving.kinds],
        "engines": {"llama.cpp": _llama_cpp(mb.figures.serving.kinds, mb.figures.serving.max_context),
                    "vLLM": _vllm(mb.figures.serving.kinds, mb.figures.serving.max_context),
                    "SGLang": _sglang(mb.figures.serving.kinds, mb.figures.serving.max_context)},
        "what_fits_and_speed_bounds": calculator.plan(mb.figures.serving),
        "published_claims": {"headline_convention": HEADLINE_CONVENTION, "claims": [_claim(r) for r in mb.claims]},
        "components": [_component(mb, anc, comp) for anc, comp in walk(mb.spec.root)],
        "ledger": _ledger(mb.checkpoint, f"checkpoint headers of {ref.repo_id}@{ref.revision}, recorded in "
                                         f"content/models/{mb.slug}/checkpoint.toml")
        if mb.checkpoint is not None else None,
        "published_variants": [_variant(s) for s in mb.variants],
        "predicted_storage": _ledger(mb.predicted, "predicted from the config by each weight's storage scheme; "
                                                   "no checkpoint tensor listing is recorded")
        if mb.predicted is not None else None,
        "release_layout": None if mb.release is None else {
            "source": mb.release.index.source, "tensors": mb.release.index.tensor_count,
            "groups": [{"name": g.name, "tensors": g.count, "dtype": g.dtype, "shape": list(g.shape)}
                       for g in mb.release.index.groups]},
        "reference_check": {"reference": mb.reference_label, "skipped": list(mb.reference_skips),
                            **_ledger(mb.reference, mb.reference_label), **_reference_count(mb)},
    }


def _claim(r: ClaimRow) -> dict[str, Any]:
    c = r.claim
    return {"figure": c.figure, "claim": c.claim, "source": c.source, "lab_counts": c.lab_counts or None,
            "rounding": c.rounding, "conventions": [{"convention": v.label, "value": v.value, "reproduces": v.reproduces}
                                                    for v in r.conventions],
            "reproduced_by": list(r.reproduced_by), "headline_difference": r.headline_difference or None,
            "difference": c.difference or None}


def _reference_count(mb: ModelBuild) -> dict[str, Any]:
    """The reference's own count (by_role_and_dtype above takes the ledger's roles for the same tensors)."""
    rc = mb.reference_count
    assert rc is not None
    return {"reference_parameters": {"tensors": rc.parameter_tensors, "elements": rc.parameters},
            "reference_buffers": {"tensors": rc.buffer_tensors, "elements": rc.buffers},
            "ledger_parameters_the_reference_holds_as_buffers": [
                {"name": h.name, "tensors": h.tensors, "elements": h.elements} for h in rc.held_as_buffers]}


def _component(mb: ModelBuild, ancestors: tuple[Component, ...], comp: Component) -> dict[str, Any]:
    path = path_key(ancestors, comp)
    acc = mb.ledger.accounts[path]
    return {
        "path": path, "title": comp.title, "kind": comp.kind, "parent": path_key(ancestors[:-1], ancestors[-1])
        if ancestors else None,
        "repeat": comp.repeat, "instances": acc.instances, "instances_label": acc.instances_label,
        "parameters_per_instance": acc.per_instance, "parameters_total": acc.total, "formula": acc.formula,
        "rows": [{"label": r.label, "formula": r.formula, "factors": list(r.factors), "value": r.value,
                  "child": r.child or None} for r in acc.rows],
        "shapes": {"inputs": [{"name": p.name, "latex": p.latex, "shape": p.shape.display} for p in comp.inputs],
                   "outputs": [{"name": p.name, "latex": p.latex, "shape": p.shape.display} for p in comp.outputs],
                   "steps": [{"name": s.name, "latex": s.latex, "shape": s.shape.display if s.shape else None}
                             for s in comp.steps if not s.heading]},
        "tensors": [{"pattern": ta.spec.pattern, "count": ta.spec.count, "role": ta.spec.role,
                     "dtype": ta.spec.dtype or None, "storage": ta.spec.storage.label, "tied_to": ta.spec.tied_to or None,
                     "optional": ta.spec.optional, "shape": list(ta.shape) if ta.shape is not None else None,
                     "elements": ta.elements,
                     "stored": [{"name": st.name, "shape": list(st.shape), "dtype": st.dtype, "role": st.role}
                                for st in ta.stored]}
                    for ta in acc.tensors],
        "checked_against": mb.checked_against(path),
        "trace": {"device": mb.trace.device, "free_sizes": mb.trace.free,
                  "inputs": [list(t) for t in mb.trace.components[path].inputs],
                  "outputs": [list(t) for t in mb.trace.components[path].outputs],
                  "steps": {k: list(v) for k, v in sorted(mb.trace.components[path].steps.items())}},
        "equation_check": dataclasses.asdict(mb.checks[path]),
        "evidence": [{"claim": c.claim, "source": c.source, "file": c.file, "revision": c.revision,
                      "lines": [c.first, c.last], "symbol": c.symbol, "symbol_lines": list(c.symbol_lines),
                      "text_from": c.origin, "excerpt_available": c.lines is not None}
                     for c in mb.citations.get(path, ())],
    }


def _ledger(rec: Reconciliation, source: str) -> dict[str, Any]:
    """source: what the tensors were read from, in words that do not depend on where the site was built."""
    return {
        "source": source, "balanced": rec.balanced,
        "by_role_and_dtype": [{"role": t.role, "dtype": t.dtype, "tensors": t.tensors, "elements": t.elements,
                               "bytes": t.bytes, "parameters": t.parameters} for t in rec.totals],
        "unowned": list(rec.unowned), "owned_twice": list(rec.owned_twice), "missing": list(rec.missing),
        "shape_mismatch": [m.name for m in rec.shape_mismatch], "dtype_mismatch": [m.name for m in rec.dtype_mismatch],
    }


def _variant(s) -> dict[str, Any]:
    """A published variant's predicted layout and numbers (explorer/checkpoint/variants.py)."""
    m = s.variant.meta
    return {"name": m.name, "repo_id": m.repo_id, "revision": m.revision, "revision_note": m.revision_note,
            "storage": s.storage_label, "logical_parameters": s.parameters, "header_elements": s.header_elements,
            "header_count_reason": s.naive_count_reason, "bytes": s.bytes, "notes": list(s.notes),
            "totals": [{"role": r.role, "dtype": r.dtype, "tensors": r.tensors, "elements": r.elements,
                        "bytes": r.bytes, "parameters": r.parameters} for r in s.rows],
            "tensors": [{"name": n, "dtype": d, "shape": list(shape), "bytes_each": b} for n, d, shape, b in s.tensors]}


def _llama_cpp(kinds: tuple[LayerKind, ...], maximum: int) -> dict[str, Any]:
    """llama.cpp's allocation rules with their sources, its defaults, and the KV bytes at the calculator's table
    contexts for one sequence (explorer/figures/engines/llama_cpp.py); where a kind is not modelled, why."""
    contexts = _table_contexts(maximum)
    why = engines.unsupported(kinds)
    return {"version": engines.LLAMA_CPP_VERSION,
            "rules": [{"rule": r.text, "source": r.source} for r in engines.LLAMA_CPP_RULES],
            "defaults": {"n_ubatch": engines.N_UBATCH, "swa_full": engines.SWA_FULL, "pad": engines.PAD,
                         "type_k": "f16", "type_v": "f16", "flash_attn": engines.FLASH_ATTN,
                         "kv_unified": engines.KV_UNIFIED, "type_r": "f32", "type_s": "f32"},
            "not_modelled": why or None,
            "kv_bytes_one_sequence": None if why else
            [{"context": c, "bytes": engines.total_bytes(kinds, c, 1)} for c in contexts]}


def _table_contexts(maximum: int) -> list[int]:
    return sorted({c for c in calculator.TABLE_CONTEXTS if c < maximum} | {maximum})


def _vllm(kinds: tuple[LayerKind, ...], maximum: int) -> dict[str, Any]:
    """vLLM's rules with their sources and defaults, the specs its pages are made of at a BF16 cache, and the bytes
    of one request's pages at the calculator's table contexts (max_model_len = the context)."""
    why = vllm.unsupported(kinds)
    lay = None if why else vllm.layout(kinds, 4, vllm.DEFAULTS)
    return {"version": vllm.VLLM_VERSION, "rules": [{"rule": r.text, "source": r.source} for r in vllm.VLLM_RULES],
            "defaults": {"block_size": vllm.BLOCK_SIZE, "max_num_batched_tokens": vllm.MAX_NUM_BATCHED_TOKENS,
                         "gpu_memory_utilization": vllm.GPU_MEMORY_UTILIZATION, "kv_cache_dtype": "bf16",
                         "kernel_block_alignment": vllm.KERNEL_ALIGNMENT},
            "not_modelled": why or None,
            "attention_block_tokens": lay.block if lay else None,
            "group_size": lay.group_size if lay else None,
            "specs": [{"class": sp.cls, "layers": sp.layers, "page_bytes": sp.page, "block_tokens": sp.block,
                       "window_or_chunk": sp.span or None} for sp in lay.specs] if lay else None,
            "bytes_one_sequence": [{"context": c, "bytes": vllm.total_bytes(kinds, c, 1)}
                                   for c in _table_contexts(maximum)] if lay else None}


def _sglang(kinds: tuple[LayerKind, ...], maximum: int) -> dict[str, Any]:
    """SGLang's rules with their sources and defaults, the bytes per cell of each pool at a BF16 cache, and the
    smallest budget whose pools admit one request at the calculator's table contexts."""
    why = sglang.unsupported(kinds)
    c = None if why else sglang.cells(kinds, 4)
    return {"version": sglang.SGLANG_VERSION,
            "rules": [{"rule": r.text, "source": r.source} for r in sglang.SGLANG_RULES],
            "defaults": {"swa_full_tokens_ratio": sglang.SWA_FULL_TOKENS_RATIO,
                         "mamba_full_memory_ratio": sglang.MAMBA_FULL_MEMORY_RATIO, "page_size": sglang.PAGE_SIZE,
                         "state_slots_per_request": sglang.STATE_SLOTS_PER_REQUEST, "kv_cache_dtype": "bf16"},
            "not_modelled": why or None,
            "cell_bytes": {"full": c.full, "sliding": c.swa, "window": c.window or None, "state_per_request": c.state}
            if c else None,
            "smallest_budget_one_sequence": [{"context": n, "bytes": sglang.total_bytes(kinds, n, 1)}
                                             for n in _table_contexts(maximum)] if c else None}


def _layer_kind(k: LayerKind, max_context: int) -> dict[str, Any]:
    """One layer kind's serving memory and attention cost (explorer/model/components/serving.py), as the calculator
    evaluates it."""
    return {"block": k.block, "title": k.title, "layers": k.layers, "elements_per_token": k.per_token,
            "formula": k.formula, "window": k.window, "chunk": k.chunk, "ratio": k.ratio,
            "entry_elements": k.entry_elements if k.per_token or k.entry else 0, "topk": k.topk,
            "flops_per_key": k.flops_per_key, "index_flops_per_key": k.index_flops_per_key,
            # the headline's convention: a kind grows per added token, or is part of the fixed part once full
            "grows_per_token": k.grows, "pending_elements_per_position": k.pending, "overlap_elements": k.overlap,
            "fixed_elements": k.fixed_elements(max_context),
            "fixed_state": [{"name": p.name, "elements": p.elements, "dtype": p.dtype, "bytes_per_element": p.bytes,
                             "formula": p.formula} for p in k.state]}
