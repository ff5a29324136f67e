"""The per-model results of the compute stages: those that need no torch and those that do (computed in
separate workers where torch must be imported), and the whole, handed to the view stage as one value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from explorer.checkpoint.index import CheckpointIndex
from explorer.checkpoint.reconcile import Reconciliation, ReferenceCount
from explorer.checkpoint.release_layout import ReleaseLayout
from explorer.checkpoint.sources import ResolvedCitation
from explorer.content.model_content import ModelContent
from explorer.execute.picture_routing import PictureRouting
from explorer.execute.reference import ReferenceModel
from explorer.figures.attention_patterns import AttentionPattern
from explorer.figures.block_figures import BlockFigure
from explorer.figures.model_figures import DerivedFigures
from explorer.figures.published_claims import ClaimRow
from explorer.model.account import Ledger
from explorer.spec.results import EquationCheck, Execution, RealWeightCheck, ShapeTrace
from explorer.spec.types import ModelSpec


@dataclass(frozen=True, slots=True)
class PreparedModel:
    """A model's stages that need no torch: spec, ledger, citations and the checkpoint's checks."""

    content: ModelContent
    spec: ModelSpec
    ledger: Ledger
    citations: dict[str, tuple[ResolvedCitation, ...]]
    checkpoint: Reconciliation | None
    index: CheckpointIndex | None
    figures: DerivedFigures
    predicted: Reconciliation | None
    config_differences: tuple[str, ...]
    variants: tuple[Any, ...] = ()
    picture_routing: PictureRouting | None = None
    """Published quantized variants' StoredAs (explorer/checkpoint/variants.py)."""
    claims: tuple[ClaimRow, ...] = ()
    """Every figure the lab published, reconciled with the site's under each convention."""
    claim_problems: tuple[str, ...] = ()
    """Claims no convention reproduces that do not say where the difference lies (the build refuses them)."""
    release: ReleaseLayout | None = None
    """Where the release names its tensors otherwise than the reference and no listing is recorded: the layout
    the release holds, predicted by undoing transformers' loading rules (explorer/checkpoint/release_layout.py)."""
    block_figures: tuple[BlockFigure, ...] = ()
    """Each block kind's parts in order, in residual branches, with their parameters (explorer/figures/block_figures.py)."""


@dataclass(frozen=True, slots=True)
class TorchResults:
    """A model's torch stages, run or read from the cache: the reference's tensors, the full-size trace and
    the equation checks, and the checks on real weights."""

    reference: ReferenceModel
    execution: Execution
    real_checks: tuple[RealWeightCheck, ...]
    routing: PictureRouting | None = None
    """One token routed at full size for the whole-model picture (explorer/execute/picture_routing.py)."""
    attention_patterns: tuple[AttentionPattern, ...] = ()
    """Each attention component's mask at small sizes (explorer/figures/attention_patterns.py)."""


@dataclass(frozen=True, slots=True)
class ModelBuild:
    """Everything computed for one model: spec, accounts, citations and the checks of its tensors."""

    content: ModelContent
    spec: ModelSpec
    ledger: Ledger
    citations: dict[str, tuple[ResolvedCitation, ...]]
    reference: Reconciliation
    """Spec against the reference implementation on the meta device."""
    reference_label: str
    reference_skips: tuple[str, ...]
    """Component paths the reference implementation does not build."""
    checkpoint: Reconciliation | None
    """Spec against the recorded checkpoint manifest, where one exists."""
    checkpoint_index: CheckpointIndex | None
    trace: ShapeTrace
    """Shapes of every component, traced at full size on the meta device."""
    checks: dict[str, EquationCheck]
    """Each component's step program compared with transformers at a tiny config."""
    figures: DerivedFigures
    """Active parameters, KV cache, FLOPs and memory, derived from the spec and the ledger."""
    predicted: Reconciliation | None = None
    """Where no checkpoint listing is recorded: the stored layout the spec's storage schemes predict."""
    real_checks: tuple[RealWeightCheck, ...] = ()
    """Components run on the checkpoint's real weights and compared with the reference on the same weights."""
    config_differences: tuple[str, ...] = ()
    """Hyper-parameters the checkpoint's files state (GGUF metadata) that the content config contradicts."""
    variants: tuple[Any, ...] = ()
    picture_routing: PictureRouting | None = None
    """Published quantized variants of the model, each predicted and explained (explorer/checkpoint/variants.py)."""
    claims: tuple[ClaimRow, ...] = ()
    """Every figure the lab published, reconciled with the site's under each convention."""
    claim_problems: tuple[str, ...] = ()
    """Claims no convention reproduces that do not say where the difference lies (the build refuses them)."""
    reference_count: ReferenceCount | None = None
    """The reference's own count of its parameters and buffers, beside the ledger's roles for them."""
    release: ReleaseLayout | None = None
    """The release's own layout where it names its tensors otherwise than the reference (PreparedModel.release)."""
    attention_patterns: tuple[AttentionPattern, ...] = ()
    """Each attention component's mask at small sizes, drawn on its page (explorer/figures/attention_patterns.py)."""
    block_figures: tuple[BlockFigure, ...] = ()
    """Each block kind's parts in order, in residual branches, with their parameters (explorer/figures/block_figures.py)."""

    @property
    def slug(self) -> str:
        return self.spec.slug

    @property
    def check_phrase(self) -> str:
        if self.checkpoint is not None:
            return "parameter count checked against the checkpoint’s tensor headers"
        return "parameter count checked against the reference implementation only"

    def checked_against(self, path: str) -> str:
        """What one component's count was checked against."""
        ref = self.content.checkpoint
        if self.checkpoint is not None:
            return (f"checkpoint headers at {ref.at} "
                    f"({self.checkpoint_index.tensor_count:,} tensors, recorded manifest)")  # type: ignore[union-attr]
        if any(path == s or path.startswith(s + ".") for s in self.reference_skips):
            return ("the configuration only: the reference implementation does not build this module and no "
                    "checkpoint tensor listing is recorded for this model")
        return f"the reference implementation only ({self.reference_label}); no checkpoint tensor listing is recorded"
