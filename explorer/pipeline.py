"""The build: compute everything for every model, then write (MkDocs' build(), in stages)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from explorer.checkpoint.index import CheckpointIndex
from explorer.checkpoint.manifest import MANIFEST_FILE, read_manifest
from explorer.checkpoint.reconcile import expected_groups, predicted_index, reconcile, reference_count
from explorer.checkpoint.release_layout import predicted_release
from explorer.checkpoint.sources import absent_files, check_recorded_config, resolve_citations
from explorer.checkpoint.variants import load_variants, stored_as
from explorer.content.model_content import ModelContent, check_prose_paths, load_all_models, read_content_text
from explorer.errors import ContentError, ReconciliationError
from explorer.execute import cache
from explorer.execute.picture_routing import picture_routing
from explorer.figures.attention_patterns import attention_patterns
from explorer.figures.block_figures import block_figures
from explorer.figures.model_build import ModelBuild, PreparedModel, TorchResults
from explorer.figures.model_figures import derive
from explorer.figures.published_claims import reconcile_claims
from explorer.model.account import account
from explorer.model.families import FAMILIES, load_model_spec
from explorer.parallel import run_in_order, started_in_order
from explorer.project import Project
from explorer.render.site_writer import write_site
from explorer.spec.results import RealWeightCheck
from explorer.spec.types import ModelSpec, path_key, walk
from explorer.views import highlight_cache, mathml_cache
from explorer.views.api import api_file
from explorer.views.compare_pages import compare_data_file
from explorer.views.evidence import Excerpt, highlight_citations, remember_highlights
from explorer.views.search import search_script
from explorer.views.site import site_page_groups

Progress = Callable[[str], None]
__all__ = ["Project", "build_all", "build_model", "build_site", "check_failures"]


def stderr_progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def build_model(content: ModelContent, fetch_sources: bool = False, cache_dir: Path | None = None,
                progress: Progress = stderr_progress) -> ModelBuild:
    """Run the compute stages for one model: spec, accounts, citations, torch stages, tensor checks."""
    prepared = prepare_model(content, fetch_sources, progress)
    return finish_model(prepared, torch_stages(prepared.spec, content, cache_dir, progress))


def prepare_model(content: ModelContent, fetch_sources: bool = False,
                  progress: Progress = stderr_progress) -> PreparedModel:
    """The model's stages that need no torch: spec, ledger, citations, the checkpoint's checks and the figures."""
    spec = load_model_spec(content)
    manifest = content.folder / MANIFEST_FILE
    index = read_manifest(manifest) if manifest.exists() else None
    # after the family's checks, whose messages say more about a bad key; values a GGUF header states are
    # compared with [config] below (stated_config_differences)
    check_recorded_config(content, stated_by_checkpoint=index is not None and bool(index.config))
    check_prose_paths(content, (path_key(a, c) for a, c in walk(spec.root)))
    ledger = account(spec)
    citations = resolve_citations(spec, content, fetch=fetch_sources)
    for missing in absent_files(citations):
        progress(f"{spec.slug}: {missing} is not in the local Hugging Face cache, so its pages give line ranges "
                 "and links without excerpts; build with --fetch-sources where the Hub is reachable to quote it")
    if index is not None and (index.repo_id, index.revision) != (content.checkpoint.repo_id, content.checkpoint.revision):
        raise ContentError([f"{manifest}: key 'manifest.revision': {index.repo_id}@{index.revision} does not match "
                            f"model.toml's {content.checkpoint.repo_id}@{content.checkpoint.revision}"])
    expected = expected_groups(spec)  # once, for the checkpoint's check or the predicted layout's
    ckpt_check = reconcile(spec, index, expected=expected) if index is not None else None
    figures = derive(spec, ledger, ckpt_check)
    # a claim nothing reproduces is reported with the tensors' differences (check_failures), which come first:
    # a changed config value breaks both, and the tensors say why
    claims, claim_problems = reconcile_claims(content.published, spec, ledger, figures,
                                              str(content.folder / "model.toml"))
    layout = predicted_index(spec, expected) if index is None else None
    predicted = reconcile(spec, layout, expected=expected) if layout is not None else None
    release = predicted_release(spec, layout) if layout is not None else None
    family = FAMILIES[spec.family]
    variants = tuple(stored_as(spec, v, family.variant_module_name, family.fp8_kept_modules)
                     for v in load_variants(content.folder))
    return PreparedModel(content, spec, ledger, citations, ckpt_check, index, figures, predicted,
                         stated_config_differences(index, content), variants, claims=claims,
                         claim_problems=tuple(claim_problems), release=release,
                         block_figures=block_figures(spec, ledger))


def torch_stages(spec: ModelSpec, content: ModelContent, cache_dir: Path | None,
                 progress: Progress = stderr_progress) -> TorchResults:
    """The reference index, trace and equation checks (from the cache where current) and real-weight checks."""
    cached = cache.load(cache_dir, spec)
    if cached is not None:
        progress(f"{spec.slug}: reference tensors, shape trace and equation checks from cache")
        ref, execution = cached
    else:
        progress(f"{spec.slug}: building the reference on meta, tracing at full size, checking equations")
        from explorer.execute.executor import execute  # torch is imported only when something must run
        from explorer.execute.reference import reference_index

        _one_torch_thread()
        ref, execution = reference_index(spec), execute(spec, FAMILIES[spec.family].reference.not_built)
        cache.save(cache_dir, spec, ref, execution)
    return TorchResults(ref, execution, real_weight_checks(content, spec, cache_dir, progress),
                        picture_routing(spec, cache_dir), attention_patterns(spec, cache_dir))


def finish_model(p: PreparedModel, torch: TorchResults) -> ModelBuild:
    """The model's build: the prepared stages, the torch stages, and the spec checked against the reference."""
    skips = FAMILIES[p.spec.family].reference.not_built
    ref_check = reconcile(p.spec, torch.reference.index, reference=True, skip_owners=skips)
    return ModelBuild(p.content, p.spec, p.ledger, p.citations, ref_check, torch.reference.label, skips, p.checkpoint,
                      p.index, torch.execution.trace, torch.execution.checks, p.figures, p.predicted,
                      real_checks=torch.real_checks, config_differences=p.config_differences, variants=p.variants,
                      picture_routing=torch.routing, claims=p.claims, claim_problems=p.claim_problems,
                      reference_count=reference_count(p.spec, torch.reference.index, torch.reference.buffers),
                      release=p.release, attention_patterns=torch.attention_patterns,
                      block_figures=p.block_figures)


def real_weight_checks(content: ModelContent, spec: ModelSpec, cache_dir: Path | None,
                       progress: Progress) -> tuple[RealWeightCheck, ...]:
    """The model's checks on its checkpoint's real weights, where content names a weights file (cached)."""
    if not content.checkpoint.real_weights:
        return ()
    from explorer.execute.real_weights import weights_file

    path = weights_file(content.checkpoint.real_weights, f"{content.folder / 'model.toml'}: key "
                                                         "'checkpoint.real_weights'")
    cached = cache.load_real(cache_dir, spec, path)
    if cached is not None:
        return cached
    progress(f"{spec.slug}: running block 1 on the real weights of {path.name}")
    from explorer.execute.real_weights import block_check

    checks = (block_check(spec, path),)
    cache.save_real(cache_dir, spec, path, checks)
    return checks


def stated_config_differences(index: CheckpointIndex | None, content: ModelContent) -> tuple[str, ...]:
    """Values the checkpoint's own files state (a GGUF header's metadata, recorded in the manifest) that the content
    config lacks or contradicts."""
    if index is None or not index.config:
        return ()
    from explorer.checkpoint.gguf import config_differences

    return tuple(config_differences(index.config, index.config_provenance, content.config))


def build_all(project: Project, progress: Progress = stderr_progress, fetch_sources: bool = False,
              use_cache: bool = True, jobs: int | None = None) -> list[ModelBuild]:
    """Load and compute every model, `jobs` at a time (default: the available cores), in content order;
    ContentError lists content problems of all models together."""
    contents = load_all_models(project.content)
    cache_dir = project.cache if use_cache else None
    jobs = default_jobs(jobs)
    if jobs > 1 and len(contents) > 1 and not all(cache.has_entry(cache_dir, c) for c in contents):
        return _build_running_torch(contents, fetch_sources, cache_dir, jobs, progress)
    tasks = [partial(_stage, build_model, _first_message(content), content, fetch_sources, cache_dir)
             for content in contents]
    return _successes(run_in_order(tasks, jobs, _one_torch_thread), progress)


def _build_running_torch(contents: list[ModelContent], fetch_sources: bool, cache_dir: Path | None, jobs: int,
                         progress: Progress) -> list[ModelBuild]:
    """build_all where torch stages will run. Importing torch and transformers' model code costs 3.5 s of CPU;
    this process imports them once, for a second pool's workers to inherit, while a first pool runs every
    model's stages that need no torch."""
    prepare = [partial(_stage, _prepare_and_highlight, _first_message(content), content, fetch_sources)
               for content in contents]
    with started_in_order(prepare, jobs - 1) as outcomes:  # this process takes the remaining core
        _one_torch_thread()
        import transformers.modeling_utils  # noqa: F401
        prepared_and_highlighted = _successes(outcomes, progress)
    prepared = [p for p, _ in prepared_and_highlighted]
    for _, highlighted in prepared_and_highlighted:
        remember_highlights(highlighted)  # for the page writers this process forks later
    stages = [partial(_stage, torch_stages, "", p.spec, p.content, cache_dir) for p in prepared]
    costs = [torch_cost(p) for p in prepared]
    torch = _successes(run_in_order(stages, jobs, _one_torch_thread, costs), progress)
    return [finish_model(p, t) for p, t in zip(prepared, torch)]


def _prepare_and_highlight(content: ModelContent, fetch_sources: bool,
                           progress: Progress) -> tuple[PreparedModel, dict[Excerpt, str]]:
    """prepare_model, and the excerpts its pages will quote highlighted, in a worker that would otherwise wait
    for the parent's import of torch."""
    prepared = prepare_model(content, fetch_sources, progress)
    return prepared, highlight_citations(prepared.citations)


def torch_cost(p: PreparedModel) -> int:
    """A guess at the time a model's torch stages take, for ordering work (measured: a few milliseconds per
    component, and most of a second to read, dequantize and run a block of real weights)."""
    return len(walk(p.spec.root)) + (150 if p.content.checkpoint.real_weights else 0)


def default_jobs(jobs: int | None) -> int:
    """Processes to use: as asked, or one per available core."""
    return jobs or len(os.sched_getaffinity(0))


T = TypeVar("T")
Outcome = tuple[T | None, tuple[str, ...], list[str]]
"""A stage's result (None where it found content problems), those problems (plain strings cross the process
boundary intact), and the progress messages it gave (a pool worker's messages are shown by the parent)."""


def _first_message(content: ModelContent) -> str:
    return f"{content.slug}: spec, accounting, citations and checkpoint checks"


def _stage(stage: Callable[..., T], message: str, *args: Any) -> Outcome[T]:
    messages = [message] if message else []
    try:
        return stage(*args, progress=messages.append), (), messages
    except ContentError as e:
        return None, e.problems, messages


def _successes(outcomes: Iterable[Outcome[T]], progress: Progress) -> list[T]:
    """Each stage's result, its messages shown as they come; or ContentError with every model's problems."""
    results: list[T | None] = []
    problems: list[str] = []
    for result, found, messages in outcomes:
        for message in messages:
            progress(message)
        results.append(result)
        problems += found
    if problems:
        raise ContentError(problems)
    return results  # type: ignore[return-value]  # no problems: no None


def _one_torch_thread() -> None:
    """Pin torch to one thread, in pool workers and wherever the torch stages run: the pool already uses
    every core; threads fight over them on the tiny equation checks (Kimi K2's: 3.5 s with two threads,
    0.02 s with one); and a reduction split over threads rounds differently, so a printed max |Δ| would
    depend on the machine's core count."""
    os.environ["OMP_NUM_THREADS"] = "1"  # read when torch is first imported in this worker
    if "torch" in sys.modules:  # inherited from a parent that had imported it
        sys.modules["torch"].set_num_threads(1)


def check_failures(builds: list[ModelBuild], limit: int | None = 20) -> list[str]:
    """Differences between spec, reference and checkpoint, prefixed by model (at most `limit` per kind)."""
    out = []
    for mb in builds:
        out += [f"{mb.slug} (reference): {d}" for d in mb.reference.differences(limit)]
        if mb.checkpoint is not None:
            out += [f"{mb.slug} (checkpoint): {d}" for d in mb.checkpoint.differences(limit)]
        out += [f"{mb.slug} (checkpoint metadata): {d}" for d in mb.config_differences]
    for mb in builds:  # after every model's tensors: a claim fails because a count changed, which they explain
        out += [f"{mb.slug} (published claims): {d}" for d in mb.claim_problems]
    return out


def build_site(project: Project, out_dir: Path, progress: Progress = stderr_progress,
               fetch_sources: bool = False, use_cache: bool = True, jobs: int | None = None,
               site_url: str = "") -> list[ModelBuild]:
    """Compute everything, refuse to publish unbalanced numbers, then write the site atomically (with a sitemap
    when `site_url` says where it will be served).

    The caller holds the output folder (publish.claim_output), checked before the minutes of computing."""
    how_to_read = read_content_text(project.content / "how-to-read.md", project.content)
    glossary = read_content_text(project.content / "glossary.md", project.content)
    builds = build_all(project, progress, fetch_sources, use_cache, jobs)
    failures = check_failures(builds)
    if failures:
        raise ReconciliationError("stored tensors and spec disagree:\n" + "\n".join(failures))
    highlight_cache.prime(project.highlights if use_cache else None, builds)  # before the page writers fork
    pages = site_page_groups(builds, how_to_read, glossary)
    # the search index reads every page's text: about a page's work per model (measured), handed out early
    files = [partial(search_file, builds), *(partial(api_file, mb) for mb in builds),
             *(partial(compare_data_file, mb) for mb in builds)]
    progress(f"writing the pages of {len(builds)} models to {out_dir}")
    mathml_cache.load(project.mathml if use_cache else None)
    formulas = write_site(pages, files, out_dir, project.templates, project.static, progress, default_jobs(jobs),
                          site_url, file_costs=(len(builds),))
    mathml_cache.save(project.mathml if use_cache else None, formulas)
    return builds


def search_file(builds: list[ModelBuild]) -> dict[str, str]:
    return {"search-index.js": search_script(builds)}
