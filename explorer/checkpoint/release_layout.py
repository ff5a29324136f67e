"""DeepSeek-V4's release layout (issue 35): the tensors its checkpoint holds, predicted by undoing what transformers'
loader does to them. The spec, and the layout its storage schemes predict, use the reference's names and its fused
experts; the release keeps DeepSeek's own names (layers.N.attn.wq_a.weight, embed.weight, hc_head_fn), one tensor
per routed expert and projection (ffn.experts.E.w1.weight), FP8 weights with their block scales under `.scale`, and
four-bit experts packed two to a byte (int8) with one E8M0 scale per 32 values of a row.

The renames below are the inverse of transformers' conversion rules for the family (conversion_mapping.py's
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
from explorer.spec.types import ModelSpec

RELEASE_NAMES: tuple[tuple[str, str], ...] = (
    (r"^embed_tokens\.weight$", "embed.weight"),
    (r"^lm_head\.weight$", "head.weight"),
    (r"^hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"\.hc_head\.hc_(fn|base|scale)$", r".hc_head_\1"),
    (r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1"),
    (r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1"),
    (r"\.input_layernorm\.", ".attn_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
    (r"\.self_attn\.compressor\.indexer\.scorer\.weights_proj\.", ".attn.indexer.weights_proj."),
    (r"\.self_attn\.compressor\.indexer\.q_b_proj\.", ".attn.indexer.wq_b."),
    (r"\.self_attn\.compressor\.indexer\.", ".attn.indexer.compressor."),
    (r"\.self_attn\.", ".attn."),
    (r"\.mlp\.", ".ffn."),
    (r"\.compressor\.kv_norm\.", ".compressor.norm."),
    (r"\.position_bias$", ".ape"),
    (r"\.sinks$", ".attn_sink"),
    (r"\.shared_experts\.gate_proj\.", ".shared_experts.w1."),
    (r"\.shared_experts\.down_proj\.", ".shared_experts.w2."),
    (r"\.shared_experts\.up_proj\.", ".shared_experts.w3."),
    (r"\.q_a_proj\.", ".wq_a."),
    (r"\.q_b_proj\.", ".wq_b."),
    (r"\.kv_proj\.", ".wkv."),
    (r"\.gate_proj\.", ".wgate."),
    (r"\.o_a_proj\.", ".wo_a."),
    (r"\.o_b_proj\.", ".wo_b."),
    (r"\.q_a_norm\.", ".q_norm."),
    (r"\.gate\.e_score_correction_bias$", ".gate.bias"),
    (r"\.weight_scale_inv$", ".scale"),
)
"""Reference name (without the model. prefix) -> release name, applied in order."""

_EXPERTS = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)(?P<scale>_scale_inv)?$")
_MTP_LAYER = re.compile(r"^model\.layers\.(?P<layer>\d+)\.")


@dataclass(frozen=True, slots=True)
class ReleaseLayout:
    """The release's predicted tensors, and where the stored figure's MTP layer lives among them."""

    index: CheckpointIndex
    mtp_prefix: str
    """The prefix the release stores the multi-token-prediction layer under ("mtp.0."; "" where there is none)."""


def release_name(reference: str) -> str:
    """A reference tensor name as the release stores it."""
    name = reference.removeprefix("model.")
    for pattern, replacement in RELEASE_NAMES:
        name = re.sub(pattern, replacement, name)
    return name


def release_tensors(t: TensorInfo) -> list[TensorInfo]:
    """The release's tensors for one predicted tensor: renamed, and a fused expert tensor (values or scales, stacked
    over experts) split into one per expert and projection (gate_up_proj's rows into w1 then w3, down_proj into w2)."""
    m = _EXPERTS.match(t.name)
    if m is None:
        return [TensorInfo(release_name(t.name), t.dtype, t.shape)]
    experts, rows, width = t.shape
    prefix, leaf = release_name(m["prefix"]), "scale" if m["scale"] else "weight"
    projections = (("w1", rows // 2), ("w3", rows // 2)) if m["kind"] == "gate_up_proj" else (("w2", rows),)
    return [TensorInfo(f"{prefix}.{e}.{w}.{leaf}", t.dtype, (n, width)) for e in range(experts) for w, n in projections]


def release_layout(predicted: CheckpointIndex, mtp: CheckpointIndex | None, main_layers: int) -> ReleaseLayout:
    """Every tensor the release holds: the predicted main model's, and the declared MTP layer's (its decoder layer,
    predicted at index main_layers, its own tensors under mtp.), stored under mtp.0."""
    tensors = [r for t in predicted.tensors.values() for r in release_tensors(t)]
    prefix = "mtp.0." if mtp is not None else ""
    for t in (mtp.tensors.values() if mtp is not None else ()):
        layer = _MTP_LAYER.match(t.name)
        if layer is not None and int(layer["layer"]) == main_layers:
            name = prefix + t.name[layer.end():]
        else:
            name = prefix + t.name.removeprefix("mtp.")
        tensors += release_tensors(TensorInfo(name, t.dtype, t.shape))
    return ReleaseLayout(CheckpointIndex.of({t.name: t for t in tensors}, SOURCE), prefix)


SOURCE = "predicted from the reference's layout by undoing transformers' loading rules for the family"
FAMILIES_WITH_RELEASE_NAMES = ("deepseek_v4",)
"""Families whose release names its tensors otherwise than the reference, and whose predicted layout is therefore
restated in the release's names (the others' specs use the checkpoint's names already)."""


def predicted_release(spec: ModelSpec, predicted: CheckpointIndex) -> ReleaseLayout | None:
    """The release's layout for a model of such a family with no listing recorded (None for the others)."""
    if spec.family not in FAMILIES_WITH_RELEASE_NAMES:
        return None
    d = spec.declared_mtp
    mtp = None
    if d is not None:  # the module alone, as a tree's only child, predicted by the same storage schemes
        mtp = predicted_index(replace(spec, root=replace(spec.root, children=(d.module,)), declared_mtp=None))
    return release_layout(predicted, mtp, int(spec.config.num_hidden_layers))  # type: ignore[attr-defined]
