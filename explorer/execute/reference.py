"""The reference implementation as an oracle: transformers' model built from the same config, on the meta device
(no weights allocated) for the tensor-by-tensor check and at a tiny config on CPU for the executed equations.

Which classes to build and how their tensor names map to the checkpoint's come from the family's reference
binding (explorer/model/families/); nothing here names a family.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from explorer.checkpoint.index import CheckpointIndex, IndexedTensor, group_indexed
from explorer.checkpoint.tensor_names import split_name
from explorer.model.families import FAMILIES
from explorer.model.families.base import reference_config
from explorer.spec.types import ModelSpec


@dataclass(frozen=True, slots=True)
class ReferenceModel:
    """Name and version of the reference, and its tensors under checkpoint names."""

    label: str
    index: CheckpointIndex
    buffers: frozenset[str] = frozenset()
    """Names (as index.groups name their boxes) of the groups the reference holds as persistent buffers, not
    parameters (a router's e_score_correction_bias): its own count (reconcile.reference_count) splits by them."""


def transformers_config(spec: ModelSpec) -> dict[str, Any]:
    """The config.json keys the reference config class takes (quantization is a storage format, not architecture)."""
    binding = FAMILIES[spec.family].reference
    config = getattr(spec.config, binding.config_key) if binding.config_key else spec.config
    return reference_config(config, binding.config_skip, binding.skip_when_unset)


def _classes(spec: ModelSpec):
    import transformers

    binding = FAMILIES[spec.family].reference
    return getattr(transformers, binding.config_class), getattr(transformers, binding.model_class)


def build_reference_model(spec: ModelSpec):  # -> transformers PreTrainedModel on meta
    """Instantiate the family's transformers model for this config on the meta device."""
    import torch

    config_class, model_class = _classes(spec)
    config = config_class(**transformers_config(spec))
    with torch.device("meta"), _no_random_fill():
        return instantiate(spec, model_class, config)


def instantiate(spec: ModelSpec, model_class, config):
    """The binding's model: model_class itself, or (a binding with a head) the text model under "model" beside an
    untied LM head, as the checkpoint names them."""
    return loadable_class(spec, model_class)(config)


def loadable_class(spec: ModelSpec, model_class):
    """The class transformers' from_pretrained builds for the binding: model_class itself, or where the binding adds
    a head, a model class wrapping it (built from the config alone, as from_pretrained builds any model class)."""
    head = FAMILIES[spec.family].reference.head
    return _with_head(model_class, head) if head else model_class


def _with_head(body_class, head: str):
    """A model class of the text model's own pretrained base holding body_class(config) as "model" and a bias-free
    Linear hidden_size -> vocab_size as `head`, untied, whose call returns the logits (as a ForCausalLM's output has
    them); transformers' quantizers and its loader see it as they see any of its models."""
    import types

    import torch
    from transformers import PreTrainedModel

    base = next(c for c in body_class.__mro__[1:] if issubclass(c, PreTrainedModel))

    class WithHead(base):  # type: ignore[misc, valid-type]
        def __init__(self, config) -> None:
            super().__init__(config)
            self.model = body_class(config)
            setattr(self, head, torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False))
            self.post_init()

        def get_output_embeddings(self):
            return getattr(self, head)

        def forward(self, input_ids, **kwargs):  # a cache and use_cache, as generation passes them, go to the body
            out = self.model(input_ids=input_ids, **kwargs)
            return types.SimpleNamespace(logits=getattr(self, head)(out.last_hidden_state),
                                         past_key_values=getattr(out, "past_key_values", None))

    WithHead.__name__ = WithHead.__qualname__ = f"{body_class.__name__} + {head}"  # what the check lines name
    return WithHead


_FILLS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
          "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")
"""torch.nn.init's functions that fill a tensor in place (each returns the tensor)."""


@contextmanager
def _no_random_fill() -> Iterator[None]:
    """Module constructors fill their new weights (nn.Linear's kaiming_uniform_); on meta there is nothing to fill, but
    the calls still run torch's Python decompositions, a fifth of building a reference model. Within this context
    they return the tensor untouched (as transformers' no_init_weights does for a model whose weights will be loaded;
    that one also skips init_weights, which ties the head to the embedding, so it is not used here)."""
    import torch.nn.init as init

    originals = {name: getattr(init, name) for name in _FILLS}
    try:
        for name in _FILLS:
            setattr(init, name, _unfilled)
        yield
    finally:
        for name, fill in originals.items():
            setattr(init, name, fill)


def _unfilled(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


def tiny_reference_model(tiny: ModelSpec):
    """A randomly initialised tiny reference model, float32, eager attention; non-zero biases and norm gains near 1."""
    import torch
    from transformers.utils import logging

    logging.set_verbosity_error()  # the tiny config trips warnings about token ids and context length
    torch.manual_seed(0)
    config_class, model_class = _classes(tiny)
    config = config_class(**transformers_config(tiny))
    config._attn_implementation = "eager"
    model = instantiate(tiny, model_class, config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1 + (1.0 if name.endswith("norm.weight") else 0.0))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # non-zero, so "the bias steers selection only" is exercised
                buffer.copy_(torch.randn(buffer.shape, generator=generator) * 0.05)
            if name.endswith("tid2eid"):  # a hash-routing table: distinct experts per token id, as a real one holds
                experts = model.config.num_local_experts
                table = torch.rand(buffer.shape[0], experts, generator=generator).argsort(-1)[:, :buffer.shape[1]]
                buffer.copy_(table)
            elif name.endswith(("layer_scalar", "std_bias", "std_scale")):  # stored buffers a program must apply
                buffer.copy_(torch.randn(buffer.shape, generator=generator) * 0.1
                             + (0.0 if name.endswith("std_bias") else 1.0))
    return model


def reference_state(spec: ModelSpec, model, stored_once: bool = False) -> dict[str, Any]:
    """The reference's state dict under checkpoint names (routed experts stacked over a leading dimension).

    stored_once drops tied aliases (the state dict lists a tied head under its own name too): as a checkpoint
    stores a tied tensor once, under the first name the model registered for it (the token embedding).
    """
    renames = FAMILIES[spec.family].reference.renames
    state = dict(model.state_dict())
    if stored_once:
        own = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        state = {n: t for n, t in state.items() if n in own}
    return renames(state) if renames is not None else state


def reference_index(spec: ModelSpec) -> ReferenceModel:
    """Every parameter and persistent buffer of the reference model, under checkpoint tensor names."""
    import transformers

    model = build_reference_model(spec)
    tensors: list[IndexedTensor] = []
    state = reference_state(spec, model, stored_once=True)
    buffer_names = _buffer_names(spec, model)
    for name, tensor in state.items():
        shape = tuple(tensor.shape)
        prefix, _, leaf = name.partition(".experts.")
        if leaf and "." in leaf:  # experts.gate_proj.weight [E, ...]: one tensor per expert in the checkpoint
            skeleton, values = split_name(f"{prefix}.experts.0.{leaf}")
            slot = len(split_name(prefix)[1])  # the expert's index follows the prefix's indices
            tensors += [(skeleton, (*values[:slot], e, *values[slot + 1:]), shape[1:], "F32", "")
                        for e in range(shape[0])]
        else:
            tensors.append((*split_name(name), shape, "F32", ""))
    label = f"transformers {transformers.__version__} {type(model).__name__} on the meta device"
    groups = tuple(group_indexed(tensors))
    buffers = frozenset(g.name for g in groups if any(n in buffer_names for n in g.box.names()))
    return ReferenceModel(label, CheckpointIndex(groups, source=label), buffers)


def _buffer_names(spec: ModelSpec, model) -> set[str]:
    """The checkpoint names of the reference's persistent buffers (those its state dict holds)."""
    state = model.state_dict()
    buffers = {n: state[n] for n, _ in model.named_buffers() if n in state}
    renames = FAMILIES[spec.family].reference.renames
    return set(renames(buffers) if renames is not None else buffers)
