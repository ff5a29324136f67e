"""What fits in a memory budget, and the speed bounds a GPU's datasheet sets: the calculator's last lines
(explorer/figures/calculator.py builds them from these functions; static/calc.js mirrors them).

- What fits: the longest context one sequence can have, and the most sequences at a given context, such that the
  weights and the cache fit the budget, in theory (the cache as the reference holds it) and as llama.cpp allocates
  it, vLLM its pages and SGLang its pools (explorer/figures/engines/). Weights and cache only: activations, the
  runtime's context and an engine's reserve are not counted, so the true figures are at most these.
- Speed bounds, bounds and not predictions: decode tokens/s per sequence ≤ bandwidth ÷ bytes one token reads
  (weights it multiplies at their format, explorer/figures/weights_read.py, plus the cache entries its attention
  reads and any fixed state); aggregate ≤ batch × bandwidth ÷ (weights + batch × cache read), the weights read once
  for the batch; prefill time ≥ prefill FLOPs ÷ the datasheet's dense peak at the format's compute dtype.

Every GPU figure is the vendor's, as its datasheet states it, with the datasheet named; where a datasheet gives
Tensor Core throughput with 2:4 sparsity only, the dense figure is half of it, and the source says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

TERA = 10 ** 12
GB = 10 ** 9


@dataclass(frozen=True, slots=True)
class Gpu:
    """One memory budget and its speed figures, from the vendor's datasheet."""

    name: str
    memory: int
    """Bytes (decimal GB × 10⁹, as the datasheet's GB)."""
    bandwidth: int
    """Memory bandwidth, bytes per second."""
    peak: tuple[tuple[str, int], ...]
    """(compute dtype, dense FLOP/s); a dtype the GPU's tensor cores lack is absent."""
    source: str


GPUS = (
    Gpu("NVIDIA H100 SXM 80GB", 80 * GB, 3_350 * GB, (("BF16", 989_500 * GB), ("FP8", 1_979 * TERA)),
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80 GB, 3.35 TB/s, BF16 1,979 and FP8 3,958 TFLOPS "
        "with sparsity (dense: half)"),
    Gpu("NVIDIA H200 SXM 141GB", 141 * GB, 4_800 * GB, (("BF16", 989_500 * GB), ("FP8", 1_979 * TERA)),
        "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141 GB HBM3e, 4.8 TB/s, BF16 1,979 and FP8 3,958 TFLOPS "
        "with sparsity (dense: half)"),
    Gpu("NVIDIA B200 (DGX B200, per GPU)", 180 * GB, 8_000 * GB,
        (("BF16", 2_250 * TERA), ("FP8", 4_500 * TERA), ("FP4", 9_000 * TERA)),
        "NVIDIA DGX B200 datasheet, 8 GPUs: 1,440 GB, 64 TB/s, FP8 72 and FP4 144 PFLOPS with sparsity (per GPU: "
        "÷ 8; dense: half; BF16 half of FP8)"),
    Gpu("NVIDIA A100 SXM 40GB", 40 * GB, 1_555 * GB, (("BF16", 312 * TERA),),
        "NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM: 40 GB HBM2, 1,555 GB/s, BF16 312 TFLOPS (dense)"),
    Gpu("NVIDIA A100 SXM 80GB", 80 * GB, 2_039 * GB, (("BF16", 312 * TERA),),
        "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: 80 GB HBM2e, 2,039 GB/s, BF16 312 TFLOPS (dense)"),
    Gpu("NVIDIA GeForce RTX 4090 24GB", 24 * GB, 1_008 * GB, (("BF16", 165_200 * GB), ("FP8", 660_600 * GB)),
        "NVIDIA Ada GPU Architecture whitepaper, GeForce RTX 4090: 24 GB GDDR6X, 1,008 GB/s, BF16 165.2 TFLOPS "
        "(FP32 accumulate) and FP8 660.6 TFLOPS (FP16 accumulate), dense"),
    Gpu("NVIDIA GeForce RTX 5090 32GB", 32 * GB, 1_792 * GB,
        (("BF16", 209_500 * GB), ("FP8", 838 * TERA), ("FP4", 1_676 * TERA)),
        "NVIDIA RTX Blackwell GPU Architecture whitepaper, GeForce RTX 5090: 32 GB GDDR7, 1,792 GB/s, BF16 209.5 "
        "TFLOPS (FP32 accumulate), FP8 838 and FP4 1,676 TFLOPS, dense"),
    Gpu("Apple M4 Max 128GB (unified memory)", 128 * GB, 546 * GB, (),
        "Apple MacBook Pro (M4 Max) technical specifications: up to 128 GB unified memory, 546 GB/s; Apple "
        "publishes no peak FLOPs, so no prefill bound"),
)

COMPUTE = (("BF16", "BF16"), ("FP8", "FP8"))
"""Weight format -> the compute dtype whose peak bounds its prefill; every other named format (4-bit, MXFP4,
NVFP4, INT4) runs at FP4 at best, and "as stored" at the dtype its bytes per parameter read name
(`stored_compute`)."""
WIDER = (("FP4", "FP8"), ("FP8", "BF16"))
"""A GPU without a dtype's tensor cores computes it at the next wider one it has."""


def gpu(name: str) -> Gpu | None:
    return next((g for g in GPUS if g.name == name), None)


def stored_compute(read: int, params: int) -> str:
    """The compute dtype of weights stored at `read` bytes for `params` parameters: FP4 under 0.75 bytes each, FP8
    under 1.5, BF16 otherwise (F32 weights bound at BF16, a faster peak: the time stays a lower bound)."""
    return "FP4" if 4 * read < 3 * params else "FP8" if 2 * read < 3 * params else "BF16"


def compute_dtype(weights: str, stored: str) -> str:
    return stored if weights == "as stored" else dict(COMPUTE).get(weights, "FP4")


def peak(g: Gpu, dtype: str) -> tuple[str, int] | None:
    """(dtype used, dense FLOP/s) for computing at `dtype` on `g`: the dtype itself or the next wider it has."""
    peaks, wider = dict(g.peak), dict(WIDER)
    while dtype not in peaks:
        if dtype not in wider:
            return None
        dtype = wider[dtype]
    return dtype, peaks[dtype]


def largest(ok: Callable[[int], bool], top: int) -> int:
    """The largest n in 1..top with ok(n), ok true up to some point and false after; 0 when ok(1) is false."""
    lo, hi = 0, top
    if ok(hi):
        return hi
    while lo < hi - 1:  # ok(lo) or lo == 0; not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def max_context(cache: Callable[[int, int], int], weights: int, memory: int, maximum: int) -> int:
    """Longest context (≤ the maximum) of one sequence whose weights and cache(context, 1) fit `memory`."""
    return largest(lambda c: weights + cache(c, 1) <= memory, maximum)


def max_sequences(cache: Callable[[int, int], int], weights: int, memory: int, context: int) -> int:
    """Most sequences of `context` tokens whose weights and cache(context, n) fit `memory` (each sequence holds
    at least one byte, so never more than the memory's bytes)."""
    return largest(lambda n: weights + cache(context, n) <= memory, max(1, memory))


def decode_bound(bandwidth: int, weights_read: int, cache_read: int, batch: int) -> int:
    """Tokens per second, all `batch` sequences together, at most: each step reads the weights once and every
    sequence's cache (rounded down)."""
    return bandwidth * batch // (weights_read + batch * cache_read)


def prefill_bound_us(flops: int, peak_flops: int) -> int:
    """Microseconds a prefill of `flops` takes at least (rounded up)."""
    return -(-flops * 10 ** 6 // peak_flops)
