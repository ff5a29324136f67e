"""The reference implementation as an oracle: transformers' model built from the same config on the meta
device (no weights allocated), its tensors mapped to the checkpoint's names.

transformers fuses each layer's routed experts into 3-D tensors (experts.gate_up_proj [E, 2·I, d],
experts.down_proj [E, d, I]); we split them back into the checkpoint's per-expert gate/up/down weights.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .checkpoint import CheckpointIndex, TensorInfo
from .spec.types import ModelSpec

_FUSED = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)$")
NOT_IN_REFERENCE = {"deepseek_v3": ("mtp",)}
"""Component paths the reference does not build (transformers skips the stored MTP layer on load)."""


@dataclass(frozen=True, slots=True)
class ReferenceModel:
    """Name and version of the reference, and its tensors under checkpoint names."""

    label: str
    index: CheckpointIndex


def transformers_config(spec: ModelSpec) -> dict:
    """The config.json keys transformers needs (quantization is a storage format, not architecture)."""
    skip = {"quantization_config", "auto_map", "architectures"}
    return {k: v for k, v in dataclasses.asdict(spec.config).items() if k not in skip}  # type: ignore[call-overload]


def build_reference_model(spec: ModelSpec):  # -> transformers PreTrainedModel on meta
    """Instantiate transformers' DeepseekV3ForCausalLM for this config on the meta device."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(**transformers_config(spec))
    with torch.device("meta"):
        return DeepseekV3ForCausalLM(config)


def stacked_state(model) -> dict:
    """The reference's state dict with its fused experts split into the checkpoint's gate/up/down weights,
    stacked over experts: experts.gate_up_proj [E, 2·I, d] -> experts.gate_proj.weight and
    experts.up_proj.weight [E, I, d]; experts.down_proj [E, d, I] -> experts.down_proj.weight."""
    out = {}
    for name, tensor in model.state_dict().items():
        match = _FUSED.match(name)
        if match is None:
            out[name] = tensor
        elif match["kind"] == "down_proj":
            out[f"{match['prefix']}.down_proj.weight"] = tensor
        else:
            gate, up = tensor.chunk(2, dim=1)
            out[f"{match['prefix']}.gate_proj.weight"], out[f"{match['prefix']}.up_proj.weight"] = gate, up
    return out


def reference_index(spec: ModelSpec) -> ReferenceModel:
    """Every parameter and persistent buffer of the reference model, under checkpoint tensor names."""
    import transformers

    model = build_reference_model(spec)
    tensors: dict[str, TensorInfo] = {}
    for name, tensor in stacked_state(model).items():
        shape = tuple(tensor.shape)
        prefix, _, leaf = name.partition(".experts.")
        names = [f"{prefix}.experts.{e}.{leaf}" for e in range(shape[0])] if leaf else [name]
        for split_name in names:
            tensors[split_name] = TensorInfo(split_name, "F32", shape[1:] if leaf else shape)
    label = f"transformers {transformers.__version__} {type(model).__name__} on the meta device"
    return ReferenceModel(label, CheckpointIndex(dict(sorted(tensors.items())), source=label))
