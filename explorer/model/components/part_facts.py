"""What a library part declares about itself for the stages after the model: the one place a part's program name
is tied to a fact, so no later-stage module switches on a part's name.

A part declares its facts in its own module, beside its program, with `declare(program, **facts)` or as keywords of
`@program(name, role=..., **facts)` (explorer/model/components/base.py); a later stage asks `facts(comp.program)` and
reads a field. A fact not declared keeps its default, so a part declares only what is true of it. The extension
points (every field of `PartFacts`):

- `role` (declared as `@program(name, role=...)`, kept in base.COMPARISON_ROLES): the compare pages' row that
  counts the part's parameters (explorer/figures/compare_roles.py ROLES).
- `token_mixer`: the part mixes tokens (an attention, a linear attention, a state space): the compare pages'
  "attention kind" lists it (explorer/figures/compare_facts.py).
- `picture`: how the whole-model picture draws a layer holding this part, as `(css, label)` or a function of the
  block (a `BlockView`) returning one; `picture_rank` orders the rules where a block holds several
  (explorer/views/model_picture.py).
- `gated_output`, `positions_from_child`, `reads_chunk`, `rotary`: what the picture's plain-attention wording reads
  ("(gated)", NoPE when no rotary part is inside, "chunked").
- `dense_mlp`, `hashed_router`, `beside_dense_mlp`: how the picture's feed-forward bar reads the block.
- `layout`: the name of the data-flow layout that draws the part's children (explorer/views/flows.py LAYOUTS).
- `vision`: the part turns an image into tokens (a tower, a projector): run once per image, drawn beside the token
  embedding (explorer/figures/model_figures.py, explorer/views/flows.py, explorer/views/component_page.py).
- `mtp`: the part is the multi-token prediction module (figures, the model flow, the picture).
- `routed_experts`: the key of the child that holds a mixture of experts' routed experts: "expert" for one expert
  component repeated, "experts" for all of them in one component (explorer/figures/model_figures.py).
- `whole_model`: the part's program addresses weights by full checkpoint name (it spans several layers)
  (explorer/execute/executor.py).
- `quantized_linear`: the part is a Linear whose weight a quantized checkpoint stores in its quantized format
  (explorer/model/quantization.py).
- `mask_pattern`: a function of the part's component returning its `MaskSpec` (window, chunk, sinks, the tokens or
  compressed entries a selection keeps, at the model's own sizes): the figures stage evaluates the executor's mask
  functions at small sizes for that spec and the part's page draws the grid (explorer/figures/attention_patterns.py,
  explorer/views/attention_grid.py).
- `ffn_heading`: the heading a block's step list gives the part when it is the block's feed-forward; a part with
  one is a feed-forward a block runs (explorer/model/components/blocks.py).

The other facts a part declares have registries of their own, each filled by a decorator in the part's module:
`@program` (base.PROGRAMS), `@reference_call` (base.REFERENCE_CALLS), `@worked_example` (base.EXAMPLES),
`@layer_memory` (serving.LAYER_MEMORY: its cache or state rule), and its step terms and symbols
(step_terms_mixers.py, step_terms_ffn.py, explorer/model/notation.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

PictureKind = tuple[str, str]
"""(css class, legend label) of the whole-model picture."""


@dataclass(frozen=True, slots=True)
class BlockView:
    """What a picture rule reads about one block: the programs inside it and its options."""

    programs: frozenset[str]
    option: Callable[[str], Any]
    """The first non-empty value of an options field inside the block (a window, a ratio, a top-k)."""


PictureRule = Callable[[BlockView], PictureKind]


@dataclass(frozen=True, slots=True)
class MaskSpec:
    """Which keys an attention's mask lets a query read, at the model's own sizes (0 or None: not this kind)."""

    window: int | None = None
    """Sliding window: the `window` most recent keys, the query's own included."""
    chunk: int | None = None
    """Chunked: the earlier keys of the query's own chunk of `chunk` positions."""
    sinks: bool = False
    """A learned sink logit per head joins every row of the softmax (takes probability, gives no value)."""
    selected_tokens: int | None = None
    """DeepSeek Sparse Attention: the indexer keeps this many of the causal keys per query."""
    entry_ratio: int | None = None
    """DeepSeek-V4: one compressed key-value entry per `entry_ratio` positions, readable once its window closed."""
    selected_entries: int | None = None
    """DeepSeek-V4's compressed sparse attention: its indexer keeps this many of the closed entries per query."""


MaskRule = Callable[[Any], MaskSpec]
"""The part's component (a spec Component) -> its mask."""


@dataclass(frozen=True, slots=True)
class PartFacts:
    """Every fact a part may declare for later stages (the module docstring says who reads each)."""

    token_mixer: bool = False
    picture: PictureKind | PictureRule | None = None
    picture_rank: int = 0
    gated_output: bool = False
    positions_from_child: bool = False
    reads_chunk: bool = False
    rotary: bool = False
    dense_mlp: bool = False
    hashed_router: bool = False
    beside_dense_mlp: bool = False
    layout: str = ""
    vision: bool = False
    mtp: bool = False
    routed_experts: str = ""
    whole_model: bool = False
    ffn_heading: str = ""
    mask_pattern: MaskRule | None = None
    quantized_linear: bool = False

    def picture_kind(self, block: BlockView) -> PictureKind | None:
        return self.picture(block) if callable(self.picture) else self.picture


NONE = PartFacts()
PART_FACTS: dict[str, PartFacts] = {}
FACT_NAMES = frozenset(f.name for f in fields(PartFacts))


def declare(program: str, **declared: Any) -> None:
    """Record facts of the part whose program is `program`; a fact declared twice with two values is a bug (two
    parts sharing a name, or a stale copy)."""
    unknown = set(declared) - FACT_NAMES
    if unknown:
        raise TypeError(f"{program}: no part fact {sorted(unknown)} (facts: {sorted(FACT_NAMES)})")
    before = PART_FACTS.get(program, NONE)
    clash = {k: v for k, v in declared.items() if getattr(before, k) not in (getattr(NONE, k), v)}
    if clash:
        raise RuntimeError(f"{program}: part facts {sorted(clash)} declared twice with different values")
    PART_FACTS[program] = replace(before, **declared)


def facts(program: str) -> PartFacts:
    """The facts of a program (the defaults for one that declared none)."""
    return PART_FACTS.get(program, NONE)


def programs_where(fact: str) -> frozenset[str]:
    """Every program that declares `fact` (with a value other than its default)."""
    return frozenset(p for p, f in PART_FACTS.items() if getattr(f, fact) != getattr(NONE, fact))
