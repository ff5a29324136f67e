"""The serving calculator: weights, cache by layer kind, total, tokens that fit and FLOPs for a reader's context,
batch and dtypes, evaluated from the layer kinds the figures stage derived (explorer/model/components/serving.py).

`evaluate` is the one definition of every number the calculator shows, with its equation. The page carries the same
layer kinds as data (`page_data`) and static/calc.js evaluates them with the same integer arithmetic, so a reader
who changes an input sees what `evaluate` would say; tests/test_calculator.py drives the page in a browser and
compares every displayed number with `evaluate`'s, exactly. Without JavaScript the page shows `evaluate` at the
contexts of `TABLE_CONTEXTS` (never beyond the model's maximum). Beside the theory: what llama.cpp, vLLM and SGLang
allocate, by their rules as data in explorer/figures/engines/, at settings the reader can change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from explorer.figures import engines
from explorer.figures import fits as fits_mod
from explorer.figures.engines import sglang, vllm
from explorer.figures.engines.rule import FP8_DS_MLA, FP8_DS_MLA_LATENT, ratio_text
from explorer.figures.model_figures import Serving, kind_flops_decode, kind_flops_prefill, mla_absorbed
from explorer.model.components.serving import LayerKind

KV_DTYPES = (("BF16", 4), ("FP8", 2), ("FP4", 1))
"""Cache dtypes the reader can choose, with their size in half-bytes (FP4 stores two numbers per byte)."""
ENGINE_BLOCK = 16
"""Tokens per block of a paged engine's cache (vLLM's default block size): each layer's cache is rounded up to it."""
TABLE_CONTEXTS = (4_096, 32_768, 131_072)
"""Contexts of the table shown without JavaScript, besides the model's maximum."""
GB = 10 ** 9
"""The GPU memory input's unit: decimal gigabytes, the family every byte count on the site reads in (kB, MB, GB, TB,
as the model pages' figures read), so no page mixes GB with GiB."""
SIZE_UNITS = ("bytes", "kB", "MB", "GB", "TB", "PB")


@dataclass(frozen=True, slots=True)
class Line:
    """One displayed figure: what it is, its value in bytes or FLOPs, and the equation that gives it."""

    key: str
    """Stable name the page and the browser test use ("weights", "kind-0", "total")."""
    label: str
    value: int
    equation: str


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Every number the calculator shows for one set of inputs."""

    lines: tuple[Line, ...]
    fits: int | None
    """Tokens of context per sequence that fit in the GPU memory given (None: no GPU memory given)."""
    fits_text: str
    note: str = ""
    """What the inputs were clamped to, where a reader's value lay outside what the model allows ("" otherwise)."""

    def get(self, key: str) -> Line:
        return next(line for line in self.lines if line.key == key)

    def keys(self) -> tuple[str, ...]:
        return tuple(line.key for line in self.lines)


def evaluate(s: Serving, context: int, batch: int = 1, kv_dtype: str = "BF16", weights: str = "as stored",
             gpu_gb: int | None = None, swa_full: bool = engines.SWA_FULL, n_ubatch: int = engines.N_UBATCH,
             gpu: str = "", vllm_settings: vllm.Settings = vllm.DEFAULTS,
             sglang_settings: sglang.Settings = sglang.DEFAULTS, flash_attn: bool = engines.FLASH_ATTN,
             kv_unified: bool = engines.KV_UNIFIED) -> Evaluation:
    """The calculator's figures at `context` tokens for `batch` sequences; the context is capped at the maximum
    and both are at least 1, each clamp said in the note. Each engine's settings default to the engine's own."""
    note = clamp_note(s, context, batch)
    context, batch = max(1, min(context, s.max_context)), max(1, batch)
    half = dict(KV_DTYPES)[kv_dtype]
    weight_bytes = dict(s.weights)[weights]
    vllm_settings, sglang_settings = vllm.clamped(vllm_settings), sglang.clamped(sglang_settings)
    lines = [Line("weights", f"Weights ({weights})", weight_bytes, f"{fmt(weight_bytes)} bytes")]
    lines += [_kind_line(i, k, context, batch, half) for i, k in enumerate(s.kinds)]
    cache = sum(line.value for line in lines[1:])
    engine = sum(_kind_bytes(k, context, batch, half, ENGINE_BLOCK) for k in s.kinds)
    per_token = sum(k.layers * k.per_token for k in s.kinds if k.grows)
    fixed = sum(k.fixed_elements(s.max_context) for k in s.kinds)
    state = sum(k.layers * k.state_bytes for k in s.kinds)
    decode = [kind_flops_decode(k, context) for k in s.kinds]
    absorbed = [kind_flops_decode(k, context) for k in mla_absorbed(s.kinds)]
    mla = any(k.absorbed_flops_per_key for k in s.kinds)
    prefill = [kind_flops_prefill(k, context) for k in s.kinds]
    lines += [
        Line("per-token", f"Cache growth per added token, all layers ({kv_dtype})", _bytes(per_token, half),
             f"{fmt(per_token)} elements × {_size(half)}"),
        Line("fixed", f"Fixed part per sequence once full: windows, chunks, buffers and states ({kv_dtype} cache)",
             _bytes(fixed, half) + state, f"{fmt(fixed)} elements × {_size(half)} + {fmt(state)} bytes of state"),
        Line("cache", f"Cache, all layer kinds ({batch} × {fmt(context)} tokens)", cache,
             " + ".join(fmt(line.value) for line in lines[1:len(s.kinds) + 1]) or "0"),
        Line("total", "Total: weights + cache", weight_bytes + cache, f"{fmt(weight_bytes)} + {fmt(cache)}"),
        Line("engine", f"Engine view: cache in blocks of {ENGINE_BLOCK} tokens per layer", engine,
             f"each layer's cached entries rounded up to a multiple of {ENGINE_BLOCK}"),
        Line("engine-total", "Engine view: weights + block-rounded cache", weight_bytes + engine,
             f"{fmt(weight_bytes)} + {fmt(engine)}"),
        Line("decode", f"FLOPs per token, decode at {fmt(context)} context" + (MLA_UNABSORBED if mla else ""),
             2 * s.matmul + sum(decode), f"2 × {fmt(s.matmul)} + " + (" + ".join(fmt(v) for v in decode) or "0")),
        *([Line("decode-absorbed", f"FLOPs per token, decode at {fmt(context)} context{MLA_ABSORBED}",
                2 * s.matmul + sum(absorbed), f"2 × {fmt(s.matmul)} + " + " + ".join(fmt(v) for v in absorbed))]
          if mla else []),
        Line("prefill", f"FLOPs, prefill of {fmt(context)} tokens (one sequence)",
             context * 2 * s.matmul + sum(prefill),
             f"{fmt(context)} × 2 × {fmt(s.matmul)} + " + (" + ".join(fmt(v) for v in prefill) or "0")),
    ]
    ll = LlamaCpp(max(1, n_ubatch), swa_full, flash_attn, kv_unified)
    lines += llama_cpp_lines(s, context, batch, ll)
    lines += vllm_lines(s, context, batch, half, vllm_settings) + sglang_lines(s, context, batch, half, sglang_settings)
    preset = fits_mod.gpu(gpu)
    if (gpu_gb is None or gpu_gb < 1) and preset is not None:  # as the page reads an empty or zero field
        gpu_gb = preset.memory // GB
    if gpu_gb is not None:
        lines += fit_lines(s, context, half, weights, gpu_gb, ll)
        lines += engine_fit_lines(s, context, half, weights, gpu_gb, vllm_settings, sglang_settings)
    if preset is not None:
        lines += bound_lines(s, preset, context, batch, half, weights,
                             next(line.value for line in lines if line.key == "prefill"))
    fits = None if gpu_gb is None else tokens_that_fit(s, batch, half, weight_bytes, gpu_gb * GB)
    return Evaluation(tuple(lines), fits, _fits_text(s, fits, gpu_gb, batch), note)


@dataclass(frozen=True, slots=True)
class LlamaCpp:
    """llama.cpp's context parameters as the reader set them (llama_context_default_params' by default)."""

    n_ubatch: int = engines.N_UBATCH
    swa_full: bool = engines.SWA_FULL
    flash_attn: bool = engines.FLASH_ATTN
    kv_unified: bool = engines.KV_UNIFIED

    def total(self, kinds: tuple[LayerKind, ...], context: int, sequences: int) -> int:
        return engines.total_bytes(kinds, context, sequences, self.n_ubatch, self.swa_full, self.flash_attn,
                                   self.kv_unified) or 0

    def text(self) -> str:
        on = {True: "on", False: "off"}
        return (f"swa_full {on[self.swa_full]}, n_ubatch {fmt(self.n_ubatch)}, flash_attn {on[self.flash_attn]}, "
                f"kv_unified {on[self.kv_unified]}")


def llama_cpp_lines(s: Serving, context: int, batch: int, ll: LlamaCpp) -> list[Line]:
    """What llama.cpp allocates for `batch` sequences of `context` tokens, each kind's term in the equation: layers
    × elements per cell × cells × 2 bytes, or a recurrent kind's layers × row elements × rows × 4 bytes."""
    if engines.unsupported(s.kinds):
        return []
    parts = []
    for k in s.kinds:
        if k.state:
            parts.append(f"{k.layers} × {fmt(engines.state_row(k))} × {max(1, batch)} × {engines.F32}")
        else:
            cells = engines.cells(k, context, batch, ll.n_ubatch, ll.swa_full, ll.kv_unified)
            parts.append(f"{k.layers} × {fmt(engines.cell_elements(k, s.kinds, ll.flash_attn))} × {fmt(cells)} × "
                         f"{engines.F16}")
    states = " and recurrent states at F32" if any(k.state for k in s.kinds) else ""
    return [Line("llama-cpp", f"llama.cpp allocates: K and V at F16 in cells padded to {engines.PAD}{states} "
                              f"({batch} × {fmt(context)} tokens, {ll.text()})",
                 ll.total(s.kinds, context, batch), " + ".join(parts))]


def fit_lines(s: Serving, context: int, half: int, weights: str, gpu_gb: int, ll: LlamaCpp) -> list[Line]:
    """What fits in `gpu_gb` GB: the longest context of one sequence and the most sequences at `context`, in theory
    and, where its rules are modelled, as llama.cpp allocates."""
    memory, w = gpu_gb * GB, dict(s.weights)[weights]
    def theory(c: int, n: int) -> int:
        return sum(_kind_bytes(k, c, n, half) for k in s.kinds)
    def llama(c: int, n: int) -> int:
        return ll.total(s.kinds, c, n)
    budget = f"{fmt(gpu_gb)} GB"
    out = [Line("fits-context", f"Longest context of one sequence in {budget}, theory (weights + cache only)",
                fits_mod.max_context(theory, w, memory, s.max_context),
                f"largest C ≤ {fmt(s.max_context)} with {fmt(w)} + cache(C, 1) ≤ {fmt(memory)}"),
           Line("fits-sequences", f"Most sequences of {fmt(context)} tokens in {budget}, theory",
                fits_mod.max_sequences(theory, w, memory, context),
                f"largest B with {fmt(w)} + cache({fmt(context)}, B) ≤ {fmt(memory)}")]
    if not engines.unsupported(s.kinds):
        out += [Line("fits-llama-context", f"Longest context of one sequence in {budget}, llama.cpp's allocation",
                     fits_mod.max_context(llama, w, memory, s.max_context),
                     f"largest C ≤ {fmt(s.max_context)} with {fmt(w)} + llama.cpp's allocation(C, 1) ≤ {fmt(memory)}"),
                Line("fits-llama-sequences", f"Most sequences of {fmt(context)} tokens in {budget}, llama.cpp's "
                     "allocation", fits_mod.max_sequences(llama, w, memory, context),
                     f"largest n_seq with {fmt(w)} + llama.cpp's allocation({fmt(context)}, n_seq) ≤ {fmt(memory)}")]
    return out


def vllm_lines(s: Serving, context: int, batch: int, half: int, vs: vllm.Settings) -> list[Line]:
    """vLLM's pages for `batch` requests of `context` tokens (max_model_len = context), and its attention block."""
    if vllm.unsupported(s.kinds, half):
        return []
    lay = vllm.layout(s.kinds, half, vs)
    parts = [f"{vllm.slots(lay, sp)} × {fmt(vllm.pages(sp, context, vs))} × {fmt(sp.page)} × {batch}"
             for sp in lay.specs]
    states = [vllm.state_bytes(k) for k in s.kinds if k.state]
    attention = [vllm.token_bytes(k, half) for k in s.kinds if not k.state]
    align = max(vllm.KERNEL_ALIGNMENT, vs.block_size)
    block = f"max({vs.block_size}, {align} × cdiv({fmt(max(states))}, {align} × {fmt(attention[0])}))" \
        if states and attention else f"block_size {vs.block_size}"
    return [Line("count-vllm-block", "vLLM's attention block, tokens (block_size, grown where a recurrent state page shares the pool)",
                 lay.block, block),
            Line("vllm", f"vLLM allocates: pages per layer ({batch} × {fmt(context)} tokens, block_size "
                         f"{vs.block_size}, max_num_batched_tokens {fmt(vs.max_num_batched_tokens)})",
                 vllm.total_bytes(s.kinds, context, batch, half, vs) or 0,
                 " + ".join(parts) + " (layers × pages × page bytes × requests)")]


def sglang_lines(s: Serving, context: int, batch: int, half: int, gs: sglang.Settings) -> list[Line]:
    """The smallest budget whose SGLang pools admit `batch` requests of `context` tokens, and those pools."""
    if sglang.unsupported(s.kinds, half):
        return []
    c = sglang.cells(s.kinds, half)
    need = sglang.total_bytes(s.kinds, context, batch, half, gs) or 0
    return [Line("sglang", f"SGLang: the smallest KV budget whose pools admit {batch} × {fmt(context)} tokens "
                           f"(swa_full_tokens_ratio {ratio_text(gs.swa_ratio)}, mamba_full_memory_ratio "
                           f"{ratio_text(gs.mamba_ratio)})", need, _pools_equation(c, sglang.pools(c, need, gs), need))]


def _pools_equation(c: sglang.Cells, p: sglang.Pools, budget: int) -> str:
    """How a budget splits into SGLang's pools, in bytes per cell and cells."""
    parts = [f"{fmt(p.full_tokens)} full cells × {fmt(c.full)}"] if c.full else []
    parts += [f"{fmt(p.swa_tokens)} sliding cells × {fmt(c.swa)}"] if c.swa else []
    parts += [f"{fmt(p.state_slots + 1)} state slots × {fmt(c.state)}"] if c.state else []
    return " + ".join(parts) + f" ≤ {fmt(budget)}"


def engine_fit_lines(s: Serving, context: int, half: int, weights: str, gpu_gb: int, vs: vllm.Settings,
                     gs: sglang.Settings) -> list[Line]:
    """What fits in `gpu_gb` GB as vLLM and SGLang allocate, where their rules are modelled for these kinds."""
    memory, w = gpu_gb * GB, dict(s.weights)[weights]
    budget, out = f"{fmt(gpu_gb)} GB", []
    if not vllm.unsupported(s.kinds, half):
        usable = vllm.budget(memory, vs)
        def paged(c: int, n: int) -> int:
            return vllm.total_bytes(s.kinds, c, n, half, vs) or 0
        cap = f"{fmt(w)} + vLLM's pages(%s) ≤ {fmt(memory)} × {vs.utilization} / 1000 = {fmt(usable)}"
        out += [Line("fits-vllm-context", f"Longest context of one sequence in {budget}, vLLM's pages",
                     fits_mod.max_context(paged, w, usable, s.max_context), f"largest C ≤ {fmt(s.max_context)} with "
                     + cap % "C, 1"),
                Line("fits-vllm-sequences", f"Most sequences of {fmt(context)} tokens in {budget}, vLLM's pages",
                     fits_mod.max_sequences(paged, w, usable, context), "largest B with " + cap % f"{fmt(context)}, B")]
    if not sglang.unsupported(s.kinds, half):
        c, rest = sglang.cells(s.kinds, half), max(memory - w, 0)
        p = sglang.pools(c, rest, gs)
        split = f"pools of {fmt(memory)} − {fmt(w)}: " + _pools_equation(c, p, rest)
        out += [Line("count-sglang-full", f"SGLang's full-pool tokens in {budget} less the weights", p.full_tokens,
                     split),
                *([Line("count-sglang-swa", f"SGLang's sliding-pool tokens in {budget} less the weights "
                        f"({ratio_text(gs.swa_ratio)} of the full pool's)", p.swa_tokens,
                        f"⌊{fmt(p.full_tokens)} × {gs.swa_ratio} / 1000⌋")] if c.swa else []),
                *([Line("count-sglang-requests", f"SGLang's requests the state slots allow in {budget} (slots ÷ "
                        f"{sglang.STATE_SLOTS_PER_REQUEST})", p.max_requests or 0,
                        f"⌊{fmt(p.state_slots)} / {sglang.STATE_SLOTS_PER_REQUEST}⌋")] if c.state else []),
                Line("fits-sglang-context", f"Longest context of one sequence in {budget}, SGLang's pools",
                     sglang.max_context(s.kinds, rest, s.max_context, half, gs),
                     f"largest C ≤ {fmt(s.max_context)} the pools admit"),
                Line("fits-sglang-sequences", f"Most sequences of {fmt(context)} tokens in {budget}, SGLang's pools",
                     sglang.max_sequences(s.kinds, rest, context, half, gs),
                     f"largest B the pools admit at {fmt(context)} tokens")]
    return out


def cache_read(s: Serving, context: int, half: int) -> int:
    """Bytes one decoded token reads of its sequence's cache: the entries its attention reads (a window, a chunk's
    part, a sparse top-k) at the cache dtype, and every fixed state whole (an indexer's keys left out: fewer bytes
    keep the bound a bound)."""
    return sum(k.layers * k.state_bytes if k.state else _bytes(k.layers * k.entry_elements * k.keys_read(context), half)
               for k in s.kinds)


def bound_lines(s: Serving, g: fits_mod.Gpu, context: int, batch: int, half: int, weights: str, prefill: int
                ) -> list[Line]:
    """Speed bounds on `g` from its datasheet figures: decode per sequence and for the batch, prefill time."""
    read, cache = dict(s.read)[weights], cache_read(s, context, half)
    bw = f"{fmt(g.bandwidth)} bytes/s"
    out = [Line("bound-decode", f"Bound: decode tokens/s of one sequence at {fmt(context)} context on {g.name} "
                "(at most)", fits_mod.decode_bound(g.bandwidth, read, cache, 1),
                f"{bw} ÷ ({fmt(read)} weights read + {fmt(cache)} cache read) bytes"),
           Line("bound-aggregate", f"Bound: decode tokens/s of {fmt(batch)} sequences together on {g.name} (at most)",
                fits_mod.decode_bound(g.bandwidth, read, cache, batch),
                f"{fmt(batch)} × {bw} ÷ ({fmt(read)} + {fmt(batch)} × {fmt(cache)}) bytes")]
    stored = fits_mod.stored_compute(dict(s.read)["as stored"], dict(s.read)["BF16"] // 2)
    pk = fits_mod.peak(g, fits_mod.compute_dtype(weights, stored))
    if pk is not None:
        out.append(Line("bound-prefill", f"Bound: prefill of {fmt(context)} tokens on {g.name}, microseconds (at "
                         f"least, {pk[0]} dense peak)", fits_mod.prefill_bound_us(prefill, pk[1]),
                        f"{fmt(prefill)} FLOPs × 10⁶ ÷ {fmt(pk[1])} FLOP/s"))
    return out


def plan(s: Serving) -> list[dict]:
    """What fits and the speed bounds on every GPU preset, for site/api/SLUG.json: one sequence of
    min(4,096, maximum) tokens, the weights as stored, a BF16 cache, each engine's defaults; each figure with its
    equation (SGLang's pools and vLLM's block among them)."""
    context = min(TABLE_CONTEXTS[0], s.max_context)
    out = []
    for g in fits_mod.GPUS:
        e = evaluate(s, context, gpu=g.name)
        out.append({"gpu": g.name, "source": g.source, "memory_bytes": g.memory, "bandwidth_bytes_per_s": g.bandwidth,
                    "peak_flops_dense": dict(g.peak), "context": context, "weights": "as stored", "kv_dtype": "BF16",
                    "figures": [{"key": line.key, "label": line.label, "value": line.value, "equation": line.equation}
                                for line in e.lines if line.key.startswith(("fits", "bound", "count"))]})
    return out


def clamp_note(s: Serving, context: int, batch: int) -> str:
    """The visible note when an input lies outside what is evaluated: a context past the maximum or below one token,
    a batch below one sequence."""
    notes = []
    if context > s.max_context:
        notes.append(f"Context {fmt(context)} is beyond this model's maximum: evaluated at {fmt(s.max_context)} tokens.")
    elif context < 1:
        notes.append(f"Context {fmt(context)} is below one token: evaluated at 1.")
    if batch < 1:
        notes.append(f"Batch {fmt(batch)} is below one sequence: evaluated at 1.")
    return " ".join(notes)


MLA_UNABSORBED = ", MLA unabsorbed (per-head keys and values)"
MLA_ABSORBED = ", MLA absorbed (scores and sums over the cached latent)"
"""The two forms of MLA's decode cost (explorer/model/components/mla.py's decode_costs), named in the lines' labels."""


def tokens_that_fit(s: Serving, batch: int, half: int, weight_bytes: int, memory: int) -> int:
    """The longest context (≤ the maximum) whose weights and cache for `batch` sequences fit in `memory` bytes;
    0 when the weights and fixed state alone do not. The cache never shrinks as the context grows, so bisect."""
    def fits(c: int) -> bool:
        return weight_bytes + sum(_kind_bytes(k, c, batch, half) for k in s.kinds) <= memory
    lo, hi = 0, s.max_context
    if fits(hi):
        return hi
    while lo < hi - 1:  # fits(lo) or lo == 0; not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def page_data(s: Serving) -> str:
    """The layer kinds and weights as the JSON the page's script evaluates (short keys: it ships on every page)."""
    data = {
        "max": s.max_context, "matmul": s.matmul, "block": ENGINE_BLOCK, "gb": GB, "units": list(SIZE_UNITS),
        "kv": [list(d) for d in KV_DTYPES], "weights": [list(w) for w in s.weights],
        "kinds": [{"t": k.title, "n": k.layers, "p": k.per_token, "e": k.entry_elements if k.per_token or k.entry else 0,
                   "r": k.ratio, "w": k.window or 0, "c": k.chunk or 0, "k": k.topk or 0, "q": k.flops_per_key,
                   "x": k.index_flops_per_key, "s": k.state_bytes, "f": kind_formula(k),
                   "a": k.absorbed_flops_per_key, "g": int(k.grows), "fx": k.fixed_elements(s.max_context),
                   "b": k.pending, "o": k.overlap, "sv": vllm.state_bytes(k), "ix": k.indexer, "v": k.values,
                   "lr": engines.state_row(k)} for k in s.kinds],
        "mla": [MLA_UNABSORBED, MLA_ABSORBED],
        "ll": {"pad": engines.PAD, "bytes": engines.F16, "rb": engines.F32, "why": engines.unsupported(s.kinds),
               "ubatch": engines.N_UBATCH},
        "vl": {"bs": vllm.BLOCK_SIZE, "mnbt": vllm.MAX_NUM_BATCHED_TOKENS, "ut": vllm.DEFAULTS.utilization,
               "al": vllm.KERNEL_ALIGNMENT, "iq": vllm.INDEXER_QUANT_BLOCK, "ds": FP8_DS_MLA, "dsw": FP8_DS_MLA_LATENT,
               "why": {name: vllm.unsupported(s.kinds, half) for name, half in KV_DTYPES}},
        "sg": {"sr": sglang.DEFAULTS.swa_ratio, "mr": sglang.DEFAULTS.mamba_ratio, "pg": sglang.PAGE_SIZE,
               "spr": sglang.STATE_SLOTS_PER_REQUEST, "iq": sglang.INDEXER_QUANT_BLOCK,
               "why": {name: sglang.unsupported(s.kinds, half) for name, half in KV_DTYPES}},
        "rd": [list(r) for r in s.read], "gpus": [[g.name, g.memory, g.bandwidth, dict(g.peak)] for g in fits_mod.GPUS],
        "cd": dict(fits_mod.COMPUTE), "wd": dict(fits_mod.WIDER),
        "sc": fits_mod.stored_compute(dict(s.read)["as stored"], dict(s.read)["BF16"] // 2),
    }
    return json.dumps(data, ensure_ascii=True, separators=(",", ":")).replace("<", "\\u003c")


def kind_formula(k: LayerKind) -> str:
    """How one kind's bytes follow from the inputs, in config keys and the reader's symbols C, B and bytes."""
    if k.state:
        return " + ".join(f"{p.formula} × {p.bytes} ({p.dtype})" for p in k.state) + ", per layer and sequence"
    kept = f"min(C, {fmt(k.window)})" if k.window else f"min(C, {fmt(k.chunk)})" if k.chunk else "C"
    if k.ratio > 1:
        pending = f" + {k.pending} × (C mod {k.ratio})" if k.pending else ""
        overlap = f" + {k.overlap} once C ≥ {k.ratio}" if k.overlap else ""
        return f"({k.entry_elements} × ⌊{kept} / {k.ratio}⌋{pending}{overlap}) × bytes × B ({k.formula} per token)"
    return f"({k.formula}) × {kept} × bytes × B"


def _kind_line(i: int, k: LayerKind, context: int, batch: int, half: int) -> Line:
    value = _kind_bytes(k, context, batch, half)
    if k.state:
        return Line(f"kind-{i}", f"{k.title}: fixed state ({layers(k.layers)})", value,
                    f"{k.layers} × {fmt(k.state_bytes)} × {batch}")
    buffered = k.buffered(context)
    held = f"({fmt(k.entry_elements)} × {fmt(k.entries(context))} + {fmt(buffered)} buffered)" if buffered else \
        f"{fmt(k.entry_elements)} × {fmt(k.entries(context))}"
    return Line(f"kind-{i}", f"{k.title} ({layers(k.layers)})", value,
                f"{k.layers} × {held} × {_size(half)} × {batch}")


def _kind_bytes(k: LayerKind, context: int, batch: int, half: int, block: int = 1) -> int:
    """Bytes all layers of one kind hold for `batch` sequences of `context` tokens: the cache at `half` half-bytes
    per element (rounded up to whole bytes), entries rounded up to `block`, or the fixed state at its own dtypes."""
    if k.state:
        return k.layers * k.state_bytes * batch
    entries = -(-k.entries(context) // block) * block
    return _bytes(k.layers * (k.entry_elements * entries + k.buffered(context)) * batch, half)


def _bytes(elements: int, half: int) -> int:
    return -(-elements * half // 2)


def _size(half: int) -> str:
    return {4: "2 bytes", 2: "1 byte", 1: "0.5 byte"}[half]


def _fits_text(s: Serving, fits: int | None, gpu_gb: int | None, batch: int) -> str:
    if fits is None:
        return "Give a GPU memory size to see how many tokens fit."
    if fits == 0:
        return f"Nothing fits in {fmt(gpu_gb or 0)} GB: the weights and fixed state alone exceed it."
    whole = " (the maximum context)" if fits == s.max_context else ""
    return f"{fmt(fits)} tokens per sequence{whole} fit in {fmt(gpu_gb or 0)} GB for {fmt(batch)} sequence(s)."


def layers(n: int) -> str:
    return f"{n} layer{'s' if n != 1 else ''}"


def fmt(n: int) -> str:
    return f"{n:,}"


def size(n: int) -> str:
    """Bytes in the largest decimal unit they fill at least once, two decimals truncated ("466.00 kB", "1.21 GB";
    under 1,000: "512 bytes"), in integer arithmetic as the page's scripts do; negative for a difference."""
    if n < 0:
        return "−" + size(-n)
    power = 0
    while power + 1 < len(SIZE_UNITS) and n >= 1000 ** (power + 1):
        power += 1
    if power == 0:
        return f"{n:,} bytes"
    hundredths = n * 100 // 1000 ** power
    return f"{hundredths // 100:,}.{hundredths % 100:02d} {SIZE_UNITS[power]}"


# ------------------------------------------------------------------------------------------------ the page

@dataclass(frozen=True, slots=True)
class CalculatorView:
    """The calculator section of a model page, finished: the form's choices, the data its script evaluates, and
    the table a reader without JavaScript sees."""

    max_context: str
    """"131,072"."""
    max_key: str
    """The config key the maximum comes from."""
    context_default: int
    context_max: int
    kv_dtypes: tuple[str, ...]
    weight_formats: tuple[str, ...]
    data_json: str
    kinds: tuple[tuple[str, str], ...]
    """(title with layers, formula) per layer kind."""
    table_head: tuple[str, ...]
    table_rows: tuple[tuple[str, ...], ...]
    decode_forms: tuple[tuple[str, str, str], ...] = ()
    """MLA only: (form, FLOPs per cached position per layer, its formula) for the unabsorbed form the decode line
    counts and the absorbed form the latent cache implies."""
    engine_version: str = engines.LLAMA_CPP_VERSION
    engine_rules: tuple[tuple[str, str], ...] = tuple((r.text, r.source) for r in engines.LLAMA_CPP_RULES)
    """(rule, the file and function it is read from) of llama.cpp's allocation."""
    engine_defaults: tuple[int, bool, bool, bool] = (engines.N_UBATCH, engines.SWA_FULL, engines.FLASH_ATTN,
                                                     engines.KV_UNIFIED)
    """n_ubatch, swa_full, flash attention (auto, counted on) and kv_unified as llama_context_default_params sets
    them."""
    engine_note: str = ""
    """Why llama.cpp's allocation is not modelled for this model ("" where it is)."""
    gpus: tuple[tuple[str, str], ...] = tuple((g.name, g.source) for g in fits_mod.GPUS)
    """(preset, its datasheet figures and where they are stated)."""
    vllm_version: str = vllm.VLLM_VERSION
    vllm_rules: tuple[tuple[str, str], ...] = tuple((r.text, r.source) for r in vllm.VLLM_RULES)
    vllm_defaults: tuple[int, int, str] = (vllm.BLOCK_SIZE, vllm.MAX_NUM_BATCHED_TOKENS,
                                           ratio_text(vllm.DEFAULTS.utilization))
    """block_size, max_num_batched_tokens and gpu_memory_utilization as vLLM sets them."""
    vllm_note: str = ""
    """Why vLLM's pages are not modelled for this model at a BF16 cache ("" where they are)."""
    sglang_version: str = sglang.SGLANG_VERSION
    sglang_rules: tuple[tuple[str, str], ...] = tuple((r.text, r.source) for r in sglang.SGLANG_RULES)
    sglang_defaults: tuple[str, str] = (ratio_text(sglang.DEFAULTS.swa_ratio), ratio_text(sglang.DEFAULTS.mamba_ratio))
    """swa_full_tokens_ratio and mamba_full_memory_ratio as SGLang sets them."""
    sglang_note: str = ""


def calculator_view(s: Serving, max_key: str) -> CalculatorView:
    contexts = sorted({c for c in TABLE_CONTEXTS if c < s.max_context} | {s.max_context})
    head = ("Context", *(f"{k.title} ({layers(k.layers)})" for k in s.kinds), "Cache", "Weights (as stored)", "Total",
            "Engine view total", "llama.cpp allocates", "vLLM pages", "SGLang budget")
    rows = []
    for c in contexts:
        e = evaluate(s, c)
        kinds = (fmt(e.get(f"kind-{i}").value) for i in range(len(s.kinds)))
        rows.append((f"{fmt(c)}" + (" (maximum)" if c == s.max_context else ""), *kinds,
                     *(fmt(e.get(k).value) for k in ("cache", "weights", "total", "engine-total")),
                     *(fmt(e.get(k).value) if k in e.keys() else "not modelled"
                       for k in ("llama-cpp", "vllm", "sglang"))))
    return CalculatorView(fmt(s.max_context), max_key, min(TABLE_CONTEXTS[0], s.max_context), s.max_context,
                          tuple(n for n, _ in KV_DTYPES), tuple(n for n, _ in s.weights), page_data(s),
                          tuple((f"{k.title} ({layers(k.layers)})", kind_formula(k)) for k in s.kinds), head,
                          tuple(rows), _decode_forms(s), engine_note=engines.unsupported(s.kinds),
                          vllm_note=vllm.unsupported(s.kinds), sglang_note=sglang.unsupported(s.kinds))


def _decode_forms(s: Serving) -> tuple[tuple[str, str, str], ...]:
    mla = next((k for k in s.kinds if k.absorbed_flops_per_key), None)
    if mla is None:
        return ()
    return (("unabsorbed: per-head keys and values (the decode line)", fmt(mla.flops_per_key), mla.decode_forms[0]),
            ("absorbed: scores and sums over the cached latent (the absorbed decode line)",
             fmt(mla.absorbed_flops_per_key), mla.decode_forms[1]))
