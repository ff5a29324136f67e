"""What each serving engine allocates, as data: one module per engine (llama_cpp.py, vllm.py, sglang.py), its rules
with the engine version and the file and function each was read from, evaluated on the layer kinds of
explorer/model/components/serving.py; rule.py holds what they share. llama.cpp's names are re-exported here, where
the calculator, the JSON twin and the tests have always read them."""

from explorer.figures.engines.llama_cpp import (
    F16,
    F32,
    FLASH_ATTN,
    KV_UNIFIED,
    LLAMA_CPP_RULES,
    LLAMA_CPP_VERSION,
    N_UBATCH,
    PAD,
    SWA_FULL,
    cell_elements,
    cells,
    kind_bytes,
    pad,
    state_row,
    total_bytes,
    unsupported,
)
from explorer.figures.engines.rule import Rule

__all__ = ["F16", "F32", "FLASH_ATTN", "KV_UNIFIED", "LLAMA_CPP_RULES", "LLAMA_CPP_VERSION", "N_UBATCH", "PAD",
           "SWA_FULL", "Rule", "cell_elements", "cells", "kind_bytes", "pad", "state_row", "total_bytes",
           "unsupported"]
