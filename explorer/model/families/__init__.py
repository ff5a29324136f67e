"""Model families: each composes library components into a model's tree and binds its reference implementation."""

from __future__ import annotations

import dataclasses
import fnmatch

from explorer.content.model_content import ModelContent
from explorer.errors import ContentError, did_you_mean
from explorer.model import published_keys
from explorer.model.families.base import Family
from explorer.model.families.deepseek_v3 import FAMILY as DEEPSEEK_V3
from explorer.model.families.deepseek_v4 import FAMILY as DEEPSEEK_V4
from explorer.model.families.deepseek_v32 import FAMILY as DEEPSEEK_V32
from explorer.model.families.ernie4_5_moe import FAMILY as ERNIE4_5_MOE
from explorer.model.families.gemma3 import FAMILY as GEMMA3
from explorer.model.families.gemma3 import TEXT_FAMILY as GEMMA3_TEXT
from explorer.model.families.gemma4 import FAMILY as GEMMA4
from explorer.model.families.glm4_moe import FAMILY as GLM4_MOE
from explorer.model.families.glm4_moe_lite import FAMILY as GLM4_MOE_LITE
from explorer.model.families.glm_moe_dsa import FAMILY as GLM_MOE_DSA
from explorer.model.families.gpt2 import FAMILY as GPT2
from explorer.model.families.gpt_oss import FAMILY as GPT_OSS
from explorer.model.families.kimi_k25 import FAMILY as KIMI_K25
from explorer.model.families.kimi_linear import FAMILY as KIMI_LINEAR
from explorer.model.families.llama import FAMILY as LLAMA
from explorer.model.families.llama4 import FAMILY as LLAMA4
from explorer.model.families.mimo_v2_flash import FAMILY as MIMO_V2_FLASH
from explorer.model.families.minimax_m2 import FAMILY as MINIMAX_M2
from explorer.model.families.minimax_m3 import FAMILY as MINIMAX_M3
from explorer.model.families.mixtral import FAMILY as MIXTRAL
from explorer.model.families.nemotron_h import FAMILY as NEMOTRON_H
from explorer.model.families.olmo2 import FAMILY as OLMO2
from explorer.model.families.phi3 import FAMILY as PHI3
from explorer.model.families.qwen3 import FAMILY as QWEN3
from explorer.model.families.qwen3_5 import FAMILY as QWEN3_5
from explorer.model.families.qwen3_5 import MOE_FAMILY as QWEN3_5_MOE
from explorer.model.families.qwen3_moe import FAMILY as QWEN3_MOE
from explorer.model.families.qwen3_next import FAMILY as QWEN3_NEXT
from explorer.model.families.qwen3_vl import FAMILY as QWEN3_VL
from explorer.model.families.qwen3_vl_moe import FAMILY as QWEN3_VL_MOE
from explorer.model.families.smollm3 import FAMILY as SMOLLM3
from explorer.model.families.step3p7 import FAMILY as STEP3P7
from explorer.spec.storage import DTYPE_BYTES, Dense, GGUFQuant, Storage, ggml_blocks
from explorer.spec.types import Component, ModelSpec

FAMILIES: dict[str, Family] = {f.name: f for f in (DEEPSEEK_V3, LLAMA, QWEN3, GPT2, GEMMA3_TEXT, GEMMA3, MIXTRAL,
                                                    QWEN3_MOE, GPT_OSS, DEEPSEEK_V32, GLM_MOE_DSA, KIMI_K25,
                                                    MINIMAX_M2, MIMO_V2_FLASH, LLAMA4, GEMMA4, DEEPSEEK_V4, NEMOTRON_H,
                                                    QWEN3_5, QWEN3_5_MOE, KIMI_LINEAR, GLM4_MOE, GLM4_MOE_LITE, OLMO2, PHI3, QWEN3_NEXT,
                                                    STEP3P7, MINIMAX_M3, QWEN3_VL, QWEN3_VL_MOE, SMOLLM3,
                                                    ERNIE4_5_MOE)}
"""Family name (content's model.family) -> family."""


def family_for(config: dict, where: str) -> Family:
    """The family that reads a config.json, from its model_type (or architectures)."""
    model_type = config.get("model_type", "")
    for family in FAMILIES.values():
        if isinstance(model_type, str) and model_type in family.model_types:
            return family
    architectures = config.get("architectures")  # null or a lone string in some configs: no traceback
    for family in FAMILIES.values():
        if isinstance(architectures, list) and family.reference.model_class in architectures:
            return family
    known = sorted(t for f in FAMILIES.values() for t in f.model_types)
    raise ContentError([f"{where}: key 'model_type': unknown model type {model_type!r}{did_you_mean(str(model_type), known)}"
                        f" (known: {', '.join(known)})"])


def load_model_spec(content: ModelContent) -> ModelSpec:
    """Build the component tree of one model from its content; ContentError on bad config."""
    family = FAMILIES.get(content.meta.family)
    if family is None:
        raise ContentError([f"{content.folder / 'model.toml'}: key 'model.family': unknown family "
                            f"{content.meta.family!r}{did_you_mean(content.meta.family, FAMILIES)}"])
    unused = published_keys.unused_problems(family, content.checkpoint.config_unused, content.config,
                                            str(content.folder / "model.toml"))
    if unused:
        raise ContentError(unused)
    spec = family.build_spec(content.slug, family_config(content), f"{content.folder / 'model.toml'}: table 'config'")
    recorded = content.checkpoint.config_defaulted
    if recorded and recorded != (own := family.defaulted_keys(content.config)):
        raise ContentError([f"{content.folder / 'model.toml'}: key 'checkpoint.config_defaulted': must list the keys "
                            f"the recorded config omits, {list(own)}, got {list(recorded)}"])
    if not content.checkpoint.storage:
        return spec
    rules, evidence = content.checkpoint.storage, content.checkpoint.storage_evidence
    mtp = spec.declared_mtp
    return dataclasses.replace(spec, root=with_storage(spec.root, rules, evidence), declared_mtp=mtp and dataclasses.replace(
        mtp, module=with_storage(mtp.module, rules, evidence)))


def family_config(content: ModelContent) -> dict:
    """The recorded config as the family reads it: without the keys recorded as published and unused."""
    return published_keys.without_unused(content.config, content.checkpoint.config_unused)


def storage_for(name: str, rules: dict[str, str]) -> Storage | None:
    """The storage of the longest pattern matching a tensor name (None: no pattern matches)."""
    matches = [p for p in rules if fnmatch.fnmatchcase(name, p)]
    if not matches:
        return None
    dtype = rules[max(matches, key=lambda p: (len(p), p))]
    if dtype in DTYPE_BYTES:
        return Dense(dtype)
    block, block_bytes = ggml_blocks()[dtype]
    return GGUFQuant(dtype, block, block_bytes)


def with_storage(comp: Component, rules: dict[str, str], evidence: dict[str, str] | None = None) -> Component:
    """The tree with each tensor stored as content's checkpoint.storage says (per tensor-name pattern); a tensor
    taken out of the config's quantization scheme loses that scheme's citation and gains a note with the evidence."""
    tensors = tuple(dataclasses.replace(t, storage=storage_for(t.template, rules) or t.storage) for t in comp.tensors)
    children = tuple(with_storage(c, rules, evidence) for c in comp.children)
    notes, citations = comp.notes, comp.citations
    for before, after in zip(comp.tensors, tensors):
        if before.storage == after.storage or (evidence or {}).get(_pattern_for(before.template, rules)) is None:
            continue
        notes += (f"{after.pattern} is stored in {after.dtype}, not as the config's quantization_config would store "
                  f"it: {evidence[_pattern_for(before.template, rules)]}",)  # type: ignore[index]
    if notes != comp.notes and all(isinstance(t.storage, Dense) for t in tensors):
        citations = tuple(c for c in citations if c.symbol != "quantization_config")
    return dataclasses.replace(comp, tensors=tensors, children=children, notes=notes, citations=citations)


def _pattern_for(name: str, rules: dict[str, str]) -> str:
    """The pattern of `rules` that decides a tensor name's storage (the longest that matches)."""
    return max((p for p in rules if fnmatch.fnmatchcase(name, p)), key=lambda p: (len(p), p), default="")
