"""Run by tests/test_llama_cpp_oracle.py in a process of its own, so that an abort inside llama.cpp (a GGML_ASSERT
on a tensor it did not expect) fails one check with the engine's last words instead of ending the test run:
    python tests/llama_cpp_allocate.py MODEL.gguf '[{"context": ..., "sequences": ..., ...}, ...]'
loads the model once per setting, creates a context with those parameters (everything else as
llama_context_default_params leaves it) and frees both. Everything llama.cpp logs meanwhile is written to stdout as
JSON lines, {"i": setting index, "text": ...}, then {"i": ..., "done": true} once the setting's context was made."""

from __future__ import annotations

import ctypes
import json
import sys

import llama_cpp as lib

CURRENT = [0]


@lib.llama_log_callback
def _forward(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    print(json.dumps({"i": CURRENT[0], "text": text.decode("utf-8", "replace")}), flush=True)


def allocate(path: str, s: dict) -> None:
    model = lib.llama_model_load_from_file(path.encode(), lib.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp did not load {path}")
    p = lib.llama_context_default_params()
    p.n_ctx, p.n_seq_max = s["context"] * s["sequences"], s["sequences"]
    p.n_ubatch, p.swa_full, p.kv_unified = s["n_ubatch"], s["swa_full"], s["kv_unified"]
    if s["flash_attn"] is not None:
        p.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if s["flash_attn"] else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = lib.llama_init_from_model(model, p)
    if not ctx:
        raise SystemExit(f"llama.cpp made no context for {path} at {s}")
    lib.llama_free(ctx)
    lib.llama_model_free(model)


def main() -> None:
    path, settings = sys.argv[1], json.loads(sys.argv[2])
    lib.llama_log_set(_forward, ctypes.c_void_p(0))
    for i, s in enumerate(settings):
        CURRENT[0] = i
        allocate(path, s)
        print(json.dumps({"i": i, "done": True}), flush=True)


if __name__ == "__main__":
    main()
