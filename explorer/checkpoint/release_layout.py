"""Release layouts (issue 35): the tensors a checkpoint holds, where its release names them otherwise than the
reference (and the spec), predicted by undoing what transformers' loader does to them; a family declares its rules
on its reference binding (release_names, release_splits). Kimi Linear's release keeps Moonshot's names: the MoE
block as block_sparse_moe, its experts' w1, w3 and w2, the KDA convolution as q_conv1d, k_conv1d and v_conv1d
(concatenated when loaded), the forget gate's tensors on the attention module.

DeepSeek-V4: the spec, and the layout its storage schemes predict, use the reference's names and its fused
experts; the release keeps DeepSeek's own names (layers.N.attn.wq_a.weight, embed.weight, hc_head_fn), one tensor
per routed expert and projection (ffn.experts.E.w1.weight), FP8 weights with their block scales under `.scale`, and
four-bit experts packed two to a byte (int8) with one E8M0 scale per 32 values of a row.

Its renames (the DeepSeek-V4 binding's) invert transformers' conversion rules for the family (conversion_mapping.py's
"deepseek_v4" table, the FP8 quantizer's `.scale` -> `.weight_scale_inv`, and the expert merge: w1 and w3
concatenated into gate_up_proj, w2 stacked into down_proj); tests/test_release_layout.py runs transformers' own
rules over every name predicted here and requires each to land on a tensor the reference holds. Where two release
names load into one reference name (the forward rule `.norm.` -> `.kv_norm.` also leaves `kv_norm` alone), the
release's is the one DeepSeek's inference code gives the module: the compressor's norm is `norm`, attention's
`kv_norm`. The multi-token-prediction layer the config declares is stored under mtp.0., which transformers' loader
skips by that prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from explorer.checkpoint.index import CheckpointIndex, TensorInfo
from explorer.checkpoint.reconcile import predicted_index
from explorer.model.families import FAMILIES
from explorer.spec.types import ModelSpec

_EXPERTS = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)(?P<scale>_scale_inv)?$")
_MTP_LAYER = re.compile(r"^model\.layers\.(?P<layer>\d+)\.")


@dataclass(frozen=True, slots=True)
class ReleaseLayout:
    """The release's predicted tensors, and where the stored figure's MTP layer lives among them."""

    index: CheckpointIndex
    mtp_prefix: str
    """The prefix the release stores the multi-token-prediction layer under ("mtp.0."; "" where there is none)."""


@dataclass(frozen=True, slots=True)
class ReleaseRules:
    """A family's release naming, from its reference binding (ReferenceBinding.release_names, release_splits)."""

    names: tuple[tuple[str, str], ...]
    splits: tuple[tuple[str, tuple[str, ...]], ...] = ()


def release_name(reference: str, rules: ReleaseRules) -> str:
    """A reference tensor name as the release stores it."""
    name = reference.removeprefix("model.")
    for pattern, replacement in rules.names:
        name = re.sub(pattern, replacement, name)
    return name


def release_tensors(t: TensorInfo, rules: ReleaseRules) -> list[TensorInfo]:
    """The release's tensors for one predicted tensor: renamed; a fused expert tensor (values or scales, stacked
    over experts) split into one per expert and projection (gate_up_proj's rows into w1 then w3, down_proj into w2);
    a tensor the loader concatenates (a split's pattern) cut into its equal parts along the first axis."""
    m = _EXPERTS.match(t.name)
    if m is None:
        return _split(TensorInfo(release_name(t.name, rules), t.dtype, t.shape), rules)
    experts, rows, width = t.shape
    prefix, leaf = release_name(m["prefix"], rules), "scale" if m["scale"] else "weight"
    projections = (("w1", rows // 2), ("w3", rows // 2)) if m["kind"] == "gate_up_proj" else (("w2", rows),)
    return [TensorInfo(f"{prefix}.{e}.{w}.{leaf}", t.dtype, (n, width)) for e in range(experts) for w, n in projections]


def _split(t: TensorInfo, rules: ReleaseRules) -> list[TensorInfo]:
    for pattern, parts in rules.splits:
        if re.search(pattern, t.name):
            rows, *rest = t.shape
            return [TensorInfo(re.sub(pattern, part, t.name), t.dtype, (rows // len(parts), *rest)) for part in parts]
    return [t]


def release_layout(predicted: CheckpointIndex, mtp: CheckpointIndex | None, main_layers: int,
                   rules: ReleaseRules) -> ReleaseLayout:
    """Every tensor the release holds: the predicted main model's, and the declared MTP layer's (its decoder layer,
    predicted at index main_layers, its own tensors under mtp.), stored under mtp.0."""
    tensors = [r for t in predicted.tensors.values() for r in release_tensors(t, rules)]
    prefix = "mtp.0." if mtp is not None else ""
    for t in (mtp.tensors.values() if mtp is not None else ()):
        layer = _MTP_LAYER.match(t.name)
        if layer is not None and int(layer["layer"]) == main_layers:
            name = prefix + t.name[layer.end():]
        else:
            name = prefix + t.name.removeprefix("mtp.")
        tensors += release_tensors(TensorInfo(name, t.dtype, t.shape), rules)
    return ReleaseLayout(CheckpointIndex.of({t.name: t for t in tensors}, SOURCE), prefix)


SOURCE = "predicted from the reference's layout by undoing transformers' loading rules for the family"


def release_rules(spec: ModelSpec) -> ReleaseRules | None:
    """The family's release naming, where its release names its tensors otherwise than the spec (None elsewhere:
    the spec uses the checkpoint's names already)."""
    binding = FAMILIES[spec.family].reference
    return ReleaseRules(binding.release_names, binding.release_splits) if binding.release_names else None


def predicted_release(spec: ModelSpec, predicted: CheckpointIndex) -> ReleaseLayout | None:
    """The release's layout for a model of such a family with no listing recorded (None for the others)."""
    rules = release_rules(spec)
    if rules is None:
        return None
    d = spec.declared_mtp
    mtp = None
    if d is not None:  # the module alone, as a tree's only child, predicted by the same storage schemes
        mtp = predicted_index(replace(spec, root=replace(spec.root, children=(d.module,)), declared_mtp=None))
    return release_layout(predicted, mtp, int(spec.config.num_hidden_layers), rules)  # type: ignore[attr-defined]
