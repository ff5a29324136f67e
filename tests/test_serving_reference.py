"""The theoretical cache (issue 34) against what transformers 5.23.0 holds: for every layer kind, a tiny config of
a model that has it runs the reference with its own cache objects, and the elements those objects hold are the
formula's, after a prefill and after decode steps past every window, chunk and compression ratio.

What is measured, per cache layer, after the forward pass of the token at position C:
- a key/value layer: the keys and values its `update` returned to attention for that token (a sliding or chunked
  layer stores window − 1 positions between steps and attends over window: the token's own key joins them); one
  tensor where keys and values are the same storage (DeepSeek-V4's compressed layers);
- every other state the layer keeps: a compressor's pooled entries, pending values and gates and carried overlap
  (DeepSeek-V4), a recurrent layer's conv and recurrent states (Gated DeltaNet, Mamba-2), an indexer's keys.
The formula's side is `LayerKind.cache_elements(C)` plus each recurrent kind's state elements, at batch 1.

The kinds the figures counted as the reference holds them before issue 34 run in the slow tier; the four it fixed
(Gemma 4's global layers, Qwen3.5's conv state, DeepSeek-V4's value copy and compressor buffers, Llama 4's chunked
layers) and the mutations showing that a wrong formula fails run in the default suite.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.execute.executor import tiny_spec
from explorer.execute.reference import tiny_reference_model
from explorer.figures.model_figures import layer_kinds
from explorer.model.account import account
from explorer.model.components import serving
from explorer.pipeline import load_model_spec

SLOW = pytest.mark.slow  # kinds the figures always counted as the reference holds them: checked in the slow tier
KINDS = [  # one model per layer kind the site has
    pytest.param("llama-3.1-8b", marks=SLOW, id="llama-3.1-8b: full attention (GQA)"),
    pytest.param("gpt-oss-20b", marks=SLOW, id="gpt-oss-20b: sliding window beside full attention, sinks"),
    pytest.param("gemma-3-270m", marks=SLOW, id="gemma-3-270m: sliding and global layers"),
    pytest.param("mimo-v2-flash", marks=SLOW, id="mimo-v2-flash: value heads narrower than query/key heads, sliding"),
    pytest.param("nemotron-3-nano-30b-a3b", marks=SLOW, id="nemotron: Mamba-2 (conv and SSM state) beside attention"),
    pytest.param("gpt2", marks=SLOW, id="gpt2: fused attention, learned positions"),
    pytest.param("minimax-m2.5", marks=SLOW, id="minimax-m2.5: shaped attention, QK-norm across heads"),
    pytest.param("kimi-k2", marks=SLOW, id="kimi-k2: multi-head latent attention (the latent and rotary key)"),
    pytest.param("deepseek-v3.2", marks=SLOW, id="deepseek-v3.2: MLA with the lightning indexer's keys"),
    pytest.param("gemma-4-26b-a4b", id="gemma-4: sliding layers, global layers whose keys double as values"),
    pytest.param("llama-4-scout-17b-16e", id="llama-4-scout: chunked layers beside global NoPE layers"),
    pytest.param("qwen3.5-27b", id="qwen3.5-27b: Gated DeltaNet (conv and recurrent state) beside gated attention"),
    pytest.param("deepseek-v4-flash", id="deepseek-v4-flash: compressed streams, indexer keys, sliding-only layers"),
    pytest.param("glm-5.2", id="glm-5.2: DSA layers that reuse the previous selection and cache no indexer keys"),
    pytest.param("minimax-m3", marks=SLOW, id="minimax-m3: block-sparse layers with their index keys beside full ones"),
    pytest.param("step-3.7-flash", marks=SLOW, id="step-3.7-flash: sliding layers with their own head count"),
    pytest.param("kimi-linear-48b-a3b", marks=SLOW, id="kimi-linear: KDA states beside MLA that encodes no position"),
]


@cache
def tiny(slug: str):
    t = tiny_spec(load_model_spec(load_model_content(ROOT / "content" / "models" / slug)))
    return t, tuple(layer_kinds(t, account(t)))


def formula_elements(kinds, context: int) -> int:
    """The site's cache at `context` for one sequence: every cached kind's elements and every fixed state's."""
    return sum(k.cache_elements(context) for k in kinds) + sum(k.layers * sum(p.elements for p in k.state)
                                                              for k in kinds)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class Measured:
    """Wraps every cache layer's `update` to keep what it returned to attention for the last token."""

    def __init__(self, cache) -> None:
        self.cache = cache
        self.returned: dict[int, tuple[torch.Tensor, ...]] = {}
        for i, layer in enumerate(cache.layers):
            if hasattr(layer, "update"):  # a recurrent layer has no keys: its states are read from it
                self._wrap(i, layer)

    def _wrap(self, i: int, layer) -> None:
        original = layer.update

        def update(*args, **kwargs):
            out = original(*args, **kwargs)
            self.returned[i] = out
            return out
        layer.update = update

    def elements(self) -> int:
        total = 0
        for i, layer in enumerate(self.cache.layers):
            seen: set[int] = set()
            held = list(self.returned.get(i, ()))
            for name, value in vars(layer).items():
                if name in ("keys", "values", "update") or name.startswith("_"):
                    continue
                held += _tensors(value)
            for t in held:
                if t.data_ptr() in seen and t.numel():
                    continue  # keys and values are one tensor (DeepSeek-V4's compressed layers)
                seen.add(t.data_ptr())
                total += t.numel()
        return total


@cache
def measure(slug: str, prefill: int, steps: int) -> tuple[tuple[int, int], ...]:
    """(context, elements the reference's cache holds) after each decode step following a `prefill`-token prompt."""
    from transformers import DynamicCache

    model = reference(slug)
    ids = torch.randint(0, 50, (1, prefill + steps), generator=torch.Generator().manual_seed(0))
    out = []
    with torch.no_grad():
        cache_ = DynamicCache(config=model.config)
        measured = Measured(cache_)
        model(input_ids=ids[:, :prefill], past_key_values=cache_, use_cache=True)
        for step in range(steps):
            c = prefill + step + 1
            model(input_ids=ids[:, c - 1:c], past_key_values=cache_, use_cache=True)
            out.append((c, measured.elements()))
    return tuple(out)


@cache
def reference(slug: str):
    return tiny_reference_model(tiny(slug)[0])


def decoded(slug: str) -> tuple[tuple[int, int], ...]:
    """Both prompts' measurements: one inside every window decoded past them all (every residue of every ratio
    met), one past them, decoded to twice the largest."""
    cap = caps(tiny(slug)[1])
    return measure(slug, 1, cap + 2) + measure(slug, cap + 1, cap)


def caps(kinds) -> int:
    """The largest window, chunk or ratio of a model's kinds: decoding goes past it twice."""
    return max([k.window or 0 for k in kinds] + [k.chunk or 0 for k in kinds] + [k.ratio for k in kinds] + [1])


@pytest.mark.parametrize("slug", KINDS)
def test_theoretical_cache_equals_what_the_reference_holds(slug):
    _, kinds = tiny(slug)
    assert caps(kinds) > 1 or not any(k.window or k.chunk or k.ratio > 1 for k in kinds)
    for context, held in decoded(slug):
        assert formula_elements(kinds, context) == held, (slug, context)


def test_a_wrong_formula_fails_against_the_reference():
    """Mutations: Gemma 4's global keys counted once, Qwen3.5's conv state at kernel − 1, DeepSeek-V4's pending
    buffers or overlap left out, a chunked layer growing past its chunk: each differs from what the reference holds."""
    cases = {
        "gemma-4-26b-a4b": lambda k: serving.LayerKind(**{**_fields(k), "per_token": k.per_token // 2})
        if not k.window else k,
        "qwen3.5-27b": lambda k: _conv_minus_one(k) if k.state else k,
        "deepseek-v4-flash": lambda k: serving.LayerKind(**{**_fields(k), "pending": 0}) if k.pending else k,
        "llama-4-scout-17b-16e": lambda k: serving.LayerKind(**{**_fields(k), "chunk": None}) if k.chunk else k,
    }
    for slug, mutate in cases.items():
        _, kinds = tiny(slug)
        wrong = tuple(mutate(k) for k in kinds)
        assert wrong != kinds
        got = decoded(slug)
        assert all(formula_elements(kinds, c) == held for c, held in got)
        assert any(formula_elements(wrong, c) != held for c, held in got), slug
    _, kinds = tiny("deepseek-v4-flash")
    no_overlap = tuple(serving.LayerKind(**{**_fields(k), "overlap": 0}) if k.overlap else k for k in kinds)
    no_copy = tuple(serving.LayerKind(**{**_fields(k), "per_token": k.per_token // 2})
                    if k.stream == "window" and "copy" in k.formula else k for k in kinds)
    assert no_copy != kinds
    for wrong in (no_overlap, no_copy):
        assert any(formula_elements(wrong, c) != held for c, held in decoded("deepseek-v4-flash"))


def _fields(k: serving.LayerKind) -> dict:
    return {f: getattr(k, f) for f in serving.LayerKind.__dataclass_fields__}


def _conv_minus_one(k: serving.LayerKind) -> serving.LayerKind:
    state, conv = k.state
    kernel = tiny("qwen3.5-27b")[0].values["linear_conv_kernel_dim"]
    wrong = serving.StatePart(conv.name, conv.elements // kernel * (kernel - 1), conv.dtype, conv.bytes, conv.formula)
    return serving.LayerKind(**{**_fields(k), "state": (state, wrong)})

