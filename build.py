#!/usr/bin/env python3
"""Build the explorer site: `python build.py` writes site/; see --help for the other commands."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

from explorer.errors import ContentError, ExplorerError, printable

ROOT = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "site", help="output folder (default: site/)")
    parser.add_argument("--content", type=Path, default=None, help="project root holding content/ (default: here)")
    parser.add_argument("--check", action="store_true",
                        help="verify every model against its checkpoint manifest and the reference; write nothing")
    parser.add_argument("--record-checkpoint", metavar="SLUG",
                        help="write content/models/SLUG/checkpoint.toml from --from-folder, --from-gguf, --from-hub "
                             "or --from-listing")
    parser.add_argument("--from-folder", type=Path, help="local checkpoint folder (headers only)")
    parser.add_argument("--from-gguf", type=Path, help="local GGUF file, or its first split part (header only)")
    parser.add_argument("--from-hub", nargs="?", const=True, default=None, metavar="OWNER/NAME",
                        help="with --record-checkpoint (no value): the Hub at the model's pinned revision (headers "
                             "only); with --add-model OWNER/NAME and --revision SHA: the repository's config.json "
                             "and safetensors headers at that commit")
    parser.add_argument("--from-listing", type=Path, help="a grouped JSON listing of the checkpoint's tensors")
    parser.add_argument("--add-model", metavar="SLUG",
                        help="write content/models/SLUG/ from --config PATH (a config.json), --repo and --revision")
    parser.add_argument("--config", type=Path, help="with --add-model: the published config.json")
    parser.add_argument("--repo", help="with --add-model: the Hub repository, OWNER/NAME")
    parser.add_argument("--revision", help="with --add-model: the pinned commit (40 hex digits), or 'unpinned' when "
                                           "no commit is known (say why in config_provenance)")
    parser.add_argument("--released", default="", help="with --add-model: release month, YYYY-MM")
    parser.add_argument("--add-variant", metavar="BASE",
                        help="record a published quantized variant of model BASE (with --quant-config, --repo, "
                             "--revision): content/models/BASE/variants/NAME.toml")
    parser.add_argument("--quant-config", type=Path, help="with --add-variant: hf_quant_config.json, or a config.json "
                                                           "with a compressed-tensors quantization_config")
    parser.add_argument("--replace", action="store_true",
                        help="with --add-variant or --record-checkpoint: replace the file if it exists (discarding "
                             "any edits made to it); without it an existing file is never replaced")
    parser.add_argument("--verify-hub", action="store_true",
                        help="fetch each model's config.json at its pinned revision and compare hash and values")
    parser.add_argument("--no-cache", action="store_true",
                        help="recompute everything instead of reading .cache (torch stages, highlighted excerpts, MathML)")
    parser.add_argument("--fetch-sources", action="store_true",
                        help="download cited checkpoint files at their pinned revision when the Hub is reachable")
    parser.add_argument("--site-url", default="",
                        help="the address the site will be served from (https://…/); writes sitemap.xml with "
                             "absolute URLs, which a sitemap needs (without it no sitemap is written)")
    parser.add_argument("--jobs", type=_positive, default=None,
                        help="processes computing models in parallel (default: the available cores)")
    args = parser.parse_args(argv)
    # The build allocates a few hundred thousand long-lived objects (tensor listings); collecting young
    # objects every 700 allocations re-walks them for nothing: a quarter of a warm build's CPU time.
    gc.set_threshold(100_000, 50, 1000)
    from explorer.project import Project

    project = Project(args.content.resolve() if args.content else ROOT)
    try:
        if not project.content.is_dir():
            raise ContentError([f"{project.content}: no content folder (--content names the folder that holds "
                                "content/)"])
        if args.add_model is not None:  # an empty slug is refused, not taken for a plain build
            return add(project, args)
        if args.add_variant is not None:  # an empty name is refused, not taken for a plain build
            from explorer.commands.add_variant import add_variant

            path = add_variant(project.content, args.add_variant, args.quant_config, args.repo, args.revision,
                               replace=args.replace)
            print(f"wrote {path}")
            return 0
        if args.record_checkpoint is not None:
            return record(project, args)
        if args.check:
            return check(project, args.jobs)
        if args.verify_hub:
            return verify_hub(project)
        return build(project, args.out, args.fetch_sources, not args.no_cache, args.jobs, args.site_url)
    except ExplorerError as e:
        print(printable(f"error: {e}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # one line, not a traceback per process (the workers ignore Ctrl-C)
        print("error: interrupted; nothing was published", file=sys.stderr)
        return 130


MAX_JOBS = 64
"""Most worker processes --jobs may ask for: each holds a model's torch stage (a few hundred MB), so a thousand
would exhaust any machine's memory long before they helped."""


def _positive(text: str) -> int:
    """argparse type for --jobs: a whole number of processes, 1 to MAX_JOBS."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: expected a whole number of processes, at least 1 "
                                         f"and at most {MAX_JOBS}")
    return value


def build(project, out: Path, fetch_sources: bool, use_cache: bool, jobs: int | None = None, site_url: str = "") -> int:
    from explorer.digest import input_digest, up_to_date, write_marker
    from explorer.render.publish import claim_output

    start = time.perf_counter()
    with claim_output(out, project.protected) as out:  # refused before minutes of computing, not after
        inputs = input_digest(project)  # before reading anything: an input edited during the build is seen next time
        if site_url:  # the sitemap's addresses are an input too
            inputs += f" {site_url}"
        # --no-cache and --fetch-sources ask for work (recompute, download) that the inputs cannot show is done.
        if use_cache and not fetch_sources and up_to_date(out, inputs):
            print(f"{out} is up to date: no input changed since it was built ({time.perf_counter() - start:.2f}s)")
            return 0
        from explorer.pipeline import build_site

        builds = build_site(project, out, fetch_sources=fetch_sources, use_cache=use_cache, jobs=jobs,
                            site_url=site_url)
        write_marker(out, inputs)
    totals = ", ".join(f"{mb.slug} {mb.ledger.total:,} parameters" for mb in builds)
    print(f"built {out} in {time.perf_counter() - start:.1f}s: {totals}")
    return 0


def check(project, jobs: int | None = None) -> int:
    from explorer.pipeline import build_all, check_failures

    builds = build_all(project, jobs=jobs)
    failures = check_failures(builds)
    for mb in builds:
        rec = mb.checkpoint or mb.reference
        against = "checkpoint manifest" if mb.checkpoint is not None else "reference implementation only"
        tensors = sum(t.tensors for t in rec.totals)
        print(f"{mb.slug}: {tensors:,} tensors against the {against}; parameters "
              f"{rec.role_total('parameter')[1]:,}, scales {rec.role_total('quant_scale')[1]:,}, buffers "
              f"{rec.role_total('buffer')[1]:,}; {'balanced' if rec.balanced else 'NOT balanced'}")
    for line in failures:
        print(printable(line))
    return 1 if failures else 0


def verify_hub(project) -> int:
    from explorer.checkpoint.hub import hub_unreachable
    from explorer.checkpoint.sources import verify_published_config
    from explorer.content.model_content import load_all_models
    from explorer.errors import CheckpointError

    failed = False
    models = load_all_models(project.content)
    for i, content in enumerate(models):
        ref = content.checkpoint
        if not ref.pinned:
            print(f"{content.slug}: no pinned revision ({ref.revision_note}); nothing to fetch")
            continue
        try:
            problems = verify_published_config(content)
        except CheckpointError as e:  # one model's file missing (404): the others are still checked
            print(printable(f"error: {e}"), file=sys.stderr)
            failed = True
            if hub_unreachable(e):  # the Hub itself is down: every other model would wait out the same timeout
                rest = sum(m.checkpoint.pinned for m in models[i + 1:])
                if rest:
                    print(f"error: the Hub cannot be reached; stopped, {rest} more pinned model(s) not verified",
                          file=sys.stderr)
                return 1
            continue
        print(f"{content.slug}: config.json at {ref.repo_id}@{ref.revision[:7]}: "
              + ("matches the recorded sha256 and values" if not problems else f"{len(problems)} differences"))
        for problem in problems:
            print(printable(f"  {problem}"))
        failed = failed or bool(problems)
    return 1 if failed else 0


def add(project, args) -> int:
    from explorer.commands.add_model import add_model

    if args.from_hub is not None:
        return add_hub(project, args)
    missing = [flag for flag, value in (("--config", args.config), ("--repo", args.repo), ("--revision", args.revision))
               if not value]
    if missing:
        print(f"error: --add-model needs {', '.join(missing)}", file=sys.stderr)
        return 1
    path = add_model(project.content, args.add_model, args.config, args.repo, args.revision, args.released)
    print(f"wrote {path}")
    return report_unused(path)


def add_hub(project, args) -> int:
    from explorer.commands.add_from_hub import add_from_hub

    problems = [f"--add-model --from-hub: {why}" for why, bad in (
        ("needs the repository, --from-hub OWNER/NAME", args.from_hub is True),
        ("needs --revision SHA, the commit to read", not args.revision),
        ("takes no --config (the config.json is the repository's)", args.config is not None),
        ("takes no --repo (the repository is --from-hub's)", args.repo is not None)) if bad]
    if problems:
        print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
        return 1
    model, manifest, tensors = add_from_hub(project.content, args.add_model, args.from_hub, args.revision,
                                            args.released)
    print(f"wrote {model}\nwrote {manifest}: {tensors:,} tensors, reconciled against the config's layout")
    return report_unused(model)


def report_unused(path: Path) -> int:
    from explorer.content.model_content import load_model_content
    from explorer.model.families import FAMILIES
    from explorer.model.published_keys import unused_report

    content = load_model_content(path.parent)
    for line in unused_report(FAMILIES[content.meta.family], content.checkpoint.config_unused):
        print(printable(f"  {line}"))
    return 0


def record(project, args) -> int:
    from dataclasses import replace

    from explorer.checkpoint.hub import read_hub_checkpoint
    from explorer.checkpoint.listing import read_listing
    from explorer.checkpoint.manifest import MANIFEST_FILE, write_manifest
    from explorer.checkpoint.safetensors_headers import read_local_checkpoint
    from explorer.content.model_content import load_model_content, model_folder

    content = load_model_content(model_folder(project.content, args.record_checkpoint))
    ref = content.checkpoint
    if args.from_folder:
        index, provenance = read_local_checkpoint(args.from_folder), f"headers of a local copy ({args.from_folder.name})"
    elif args.from_gguf:
        from explorer.checkpoint.gguf import gguf_config, read_gguf_checkpoint

        config, config_provenance = gguf_config(args.from_gguf)
        index = replace(read_gguf_checkpoint(args.from_gguf), config=config, config_provenance=config_provenance)
        provenance = f"GGUF header of {args.from_gguf.name}, llama.cpp names mapped to the reference's"
    elif args.from_hub is not None:
        if args.from_hub is not True:
            print(f"error: --record-checkpoint --from-hub takes no repository ({args.from_hub!r}): it reads the "
                  "model's own repository at its pinned revision", file=sys.stderr)
            return 1
        index, provenance = read_hub_checkpoint(ref.repo_id, ref.revision), "headers read from the Hub with range requests"
    elif args.from_listing:
        index = read_listing(args.from_listing)
        provenance = index.provenance or f"grouped listing {args.from_listing.name}"
    else:
        print("error: --record-checkpoint needs --from-folder, --from-gguf, --from-hub or --from-listing",
              file=sys.stderr)
        return 1
    index = replace(index, repo_id=ref.repo_id, revision=ref.revision, provenance=provenance)
    path = content.folder / MANIFEST_FILE
    write_manifest(index, path, replace=args.replace)
    print(f"wrote {path}: {index.tensor_count:,} tensors")
    return 0


def exit_now(code: int) -> None:
    """Exit without tearing the interpreter down: with torch and transformers loaded, Python's shutdown (module
    by module, object by object) takes a second of wall and CPU time after the work is done. By now every file
    is written and closed, the output lock released and the workers joined; only the console streams need
    flushing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
