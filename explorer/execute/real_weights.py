"""Checks on a checkpoint's real weights: one decoder block of a model run with the weights its GGUF file stores.

Our side: the layer's tensors dequantized by the gguf package (llama.cpp's reader) with our own undoing of
llama.cpp's rotary row order (gguf.unpermute_rotary_rows), run through the block's step programs. The reference:
the same stored rows put back in order by transformers' own GGUF tensor processor (the code behind
from_pretrained(..., gguf_file=...)), loaded into transformers' decoder layer built from the same config. Both run
on the file's own embeddings of a few token ids, so the max |Δ| measures our equations and our reading of the rows
together, on weights that were trained. (tests/test_gguf.py checks the whole layer's dequantized weights against a
full from_pretrained(gguf_file=...) load.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from explorer.errors import ContentError, ExecutionError
from explorer.spec.results import RealWeightCheck
from explorer.spec.types import Component, ModelSpec

REAL_TOLERANCE = 1e-4
"""Largest |Δ| accepted between our block and the reference's on real weights (float32 on both sides)."""
TOKENS = 5
"""Positions the block is run on (as the executor's T)."""
ROTARY_STEMS = {"self_attn.q_proj.": ".attn_q.", "self_attn.k_proj.": ".attn_k."}
"""transformers module -> llama.cpp stem, for the tensors whose rows llama.cpp reorders."""


def weights_file(spec_text: str, where: str) -> Path:
    """A file inside an installed Python package, "package/relative/path"; ContentError when it is not installed."""
    package, _, rest = spec_text.partition("/")
    found = importlib.util.find_spec(package) if package.isidentifier() else None
    if found is None or not found.submodule_search_locations or not rest:
        raise ContentError([f"{where}: {spec_text!r}: package {package!r} is not installed (scripts/setup.sh installs "
                            "the real checkpoints used by the build)"])
    path = Path(list(found.submodule_search_locations)[0]) / rest
    if not path.is_file():
        raise ContentError([f"{where}: {spec_text!r}: no such file in the installed package ({path})"])
    return path


def reference_weights(spec: ModelSpec, path: Path, layer: int, header: Any = None) -> dict[str, Any]:
    """The layer's stored rows, put in transformers' order by transformers' own GGUF tensor processor."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from explorer.checkpoint.gguf import dequantize_layer

    heads = {"num_attention_heads": spec.values["num_attention_heads"],
             "num_key_value_heads": spec.values["num_key_value_heads"]}
    processor = LlamaTensorProcessor(config=heads)
    out = {}
    for name, stored in dequantize_layer(path, layer, llama_cpp_rows=True, header=header).items():
        stem = next((s for m, s in ROTARY_STEMS.items() if m in name), ".other.")
        out[name] = type(stored)(processor.process(stored.numpy(), f"blk.{layer}{stem}weight").weights.copy())
    return out


def reference_layer(spec: ModelSpec, weights: dict[str, Any], layer: int) -> Any:
    """transformers' model of this config (float32, eager), with the layer's weights loaded into its decoder layer."""
    import torch

    from explorer.execute.reference import _classes, instantiate, transformers_config

    config_class, model_class = _classes(spec)
    config = config_class(**{**transformers_config(spec), "num_hidden_layers": layer + 1})
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = instantiate(spec, model_class, config)  # a text model gets the binding's head, as everywhere
    prefix = f"model.layers.{layer}."
    block = model.get_submodule(prefix.rstrip("."))
    block.to_empty(device="cpu")
    block.load_state_dict({n.removeprefix(prefix): w for n, w in weights.items()})
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers, on the CPU
    return model.eval()


def block_check(spec: ModelSpec, path: Path, layer: int = 0) -> RealWeightCheck:
    """Run block `layer` of the model on the file's weights and compare with the reference's decoder layer."""
    import torch
    import transformers

    from explorer.checkpoint.gguf import dequantize_layer, dequantize_tensor, read_gguf_header
    from explorer.model.components import PROGRAMS, REFERENCE_CALLS, Run
    from explorer.model.components.base import tensor_prefix
    from explorer.model.components.blocks import angles_for, causal_mask, layer_order

    header = read_gguf_header(path)
    ours = dequantize_layer(path, layer, header=header)
    theirs_w = reference_weights(spec, path, layer, header)
    model = reference_layer(spec, theirs_w, layer)
    block = dict(layer_order(spec.root.child("blocks")))[layer]
    ids = torch.randint(0, int(spec.values["vocab_size"]), (1, TOKENS), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        x = dequantize_tensor(path, "token_embd.weight", header)[ids]
        inputs = (x, angles_for(block, torch.arange(TOKENS)), causal_mask(TOKENS, x.device))
        run = Run(ours, module=tensor_prefix(block).format(layer=layer))
        (out,) = PROGRAMS[block.program](block, run, *inputs)
        ref = model.get_submodule(tensor_prefix(block).format(layer=layer).rstrip("."))
        mine, theirs, _ = REFERENCE_CALLS[block.program](block, ref, model, inputs, run, out)
    error = float((mine - theirs).abs().max())
    weights_error = max(float((w - theirs_w[n]).abs().max()) for n, w in ours.items())
    check = RealWeightCheck(
        path=_path_of(spec.root, block), layer=layer, source=path.name,
        reference=f"transformers {transformers.__version__} {type(ref).__name__} loaded with the same stored rows, "
                  f"ordered by transformers' GGUF tensor processor",
        max_abs_error=error, tolerance=REAL_TOLERANCE,
        detail=f"our weights: the gguf package's dequantization of {len(ours)} layer-{layer} tensors and our "
               f"undoing of llama.cpp's q/k row order, max |Δ| {weights_error:.1e} from transformers' ordering; "
               f"input: the file's embeddings of {TOKENS} token ids")
    if not (error == error and error <= REAL_TOLERANCE):
        raise ExecutionError(f"{spec.slug} › {check.path} on real weights",
                             f"max |Δ| {error:.3g} against {check.reference} exceeds the tolerance {REAL_TOLERANCE:g}")
    return check


def _path_of(root: Component, target: Component) -> str:
    for child in root.children:
        if child is target:
            return child.key
        inner = _path_of(child, target)
        if inner:
            return f"{child.key}.{inner}"
    return ""
