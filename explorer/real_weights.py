"""Checks on a checkpoint's real weights: one decoder block of a model run with the weights its GGUF file stores.

Our side: the layer's tensors dequantized by the gguf package (llama.cpp's reader) with our own undoing of
llama.cpp's rotary row order (gguf.unpermute_rotary_rows), run through the block's step programs. The reference:
transformers reads the same file itself (from_pretrained(..., gguf_file=...), its own dequantization and row
order) and runs its decoder layer. Both see the same input, the file's own embeddings of a few token ids, so the
max |Δ| measures our equations and our reading of the file together, on weights that were trained.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
from pathlib import Path
from typing import Any

from .errors import ContentError, ExecutionError
from .execution import RealWeightCheck
from .spec.types import Component, ModelSpec

REAL_TOLERANCE = 1e-4
"""Largest |Δ| accepted between our block and the reference's on real weights (float32 on both sides)."""
TOKENS = 5
"""Positions the block is run on (as the executor's T)."""


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


@functools.lru_cache(maxsize=1)
def reference_from_gguf(path: Path) -> Any:
    """transformers' model of the file, read by transformers itself, float32, eager attention (kept for the next
    check of the same file in this process: reading it dequantizes every tensor)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    with contextlib.redirect_stderr(io.StringIO()):  # its GGUF loader draws a tqdm bar of its own
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                    attn_implementation="eager").eval()


def block_check(spec: ModelSpec, path: Path, reference: Any = None, layer: int = 0) -> RealWeightCheck:
    """Run block `layer` of the model on the file's weights and compare with the reference's decoder layer."""
    import torch
    import transformers

    from .components import PROGRAMS, REFERENCE_CALLS, Run
    from .components.base import tensor_prefix
    from .components.blocks import angles_for, causal_mask, layer_order
    from .gguf import dequantize_layer

    model = reference if reference is not None else reference_from_gguf(path)
    ours = dequantize_layer(path, layer)
    block = dict(layer_order(spec.root.child("blocks")))[layer]
    ids = torch.randint(0, int(spec.values["vocab_size"]), (1, TOKENS), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        x = model.get_input_embeddings()(ids)
        mask = causal_mask(TOKENS, x.device)
        inputs = (x, angles_for(block, torch.arange(TOKENS)), mask)
        run = Run(ours, module=tensor_prefix(block).format(layer=layer))
        (out,) = PROGRAMS[block.program](block, run, *inputs)
        ref = model.get_submodule(tensor_prefix(block).format(layer=layer).rstrip("."))
        mine, theirs, _ = REFERENCE_CALLS[block.program](block, ref, model, inputs, run, out)
    error = float((mine - theirs).abs().max())
    weights_error = max(float((w - model.state_dict()[n]).abs().max()) for n, w in ours.items())
    check = RealWeightCheck(
        path=_path_of(spec.root, block), layer=layer, source=path.name,
        reference=f"transformers {transformers.__version__} {type(ref).__name__}, weights read by transformers "
                  f"from the same file (gguf_file=)",
        max_abs_error=error, tolerance=REAL_TOLERANCE,
        detail=f"our weights: the gguf package's dequantization of {len(ours)} layer-{layer} tensors and our "
               f"undoing of llama.cpp's q/k row order, max |Δ| {weights_error:.1e} from transformers' reading; input: "
               f"the file's embeddings of {TOKENS} token ids")
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
