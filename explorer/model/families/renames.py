"""Reference state-dict renames shared by families: the reference's tensor names -> the checkpoint's."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_FUSED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)$")


def split_fused_experts(state: dict[str, Any]) -> dict[str, Any]:
    """transformers fuses each layer's routed experts into 3-D tensors (experts.gate_up_proj [E, 2·I, d],
    experts.down_proj [E, d, I]); split them back into the checkpoint's gate/up/down weights, stacked over
    experts: experts.gate_proj.weight and experts.up_proj.weight [E, I, d], experts.down_proj.weight [E, d, I]."""
    out = {}
    for name, tensor in state.items():
        match = _FUSED.match(name)
        if match is None:
            out[name] = tensor
        elif match["kind"] == "down_proj":
            out[f"{match['prefix']}.down_proj.weight"] = tensor
        else:
            gate, up = tensor.chunk(2, dim=1)
            out[f"{match['prefix']}.gate_proj.weight"], out[f"{match['prefix']}.up_proj.weight"] = gate, up
    return out


def transpose_fused_experts(state: dict[str, Any]) -> dict[str, Any]:
    """transformers holds each layer's fused experts as experts.gate_up_proj [E, 2·I, d] and experts.down_proj
    [E, d, I]; a checkpoint that stores them input axis first (Qwen3-VL-MoE's: [E, d, 2·I] and [E, I, d]) is what
    its loader's Transpose(1, 2) undoes, so transpose the last two axes back."""
    return {name: tensor.transpose(1, 2) if _FUSED.match(name) else tensor for name, tensor in state.items()}


def strip_prefix(prefix: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Names as a checkpoint stores them where the reference nests the model under `prefix` (GPT-2's file names
    its tensors "h.0.attn.c_attn.weight", transformers "transformer.h.0.attn.c_attn.weight")."""
    def renames(state: dict[str, Any]) -> dict[str, Any]:
        return {name.removeprefix(prefix): tensor for name, tensor in state.items()}
    return renames
