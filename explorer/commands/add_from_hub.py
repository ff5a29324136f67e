"""`build.py --add-model SLUG --from-hub OWNER/NAME --revision SHA`: a model straight from its Hub repository.

Everything is read first, then checked, then written, so a refused or failed step leaves nothing behind:
1. config.json at the pinned revision (huggingface_hub's URL building, session and HF_ENDPOINT; a size cap and a
   deadline, explorer/checkpoint/hub.py), and whether the repository holds an hf_quant_config.json;
2. every safetensors header of the checkpoint at that revision, with range requests (a few MB for 1 TB);
3. the config validated and built by its family, as `--add-model --config` does, and the headers reconciled
   against that build's stored layout, tensor by tensor: a checkpoint whose tensors differ from what its config
   describes is refused with the differences, before anything is written;
4. model.toml and checkpoint.toml (the headers as the checkpoint's manifest, which every later build and `--check`
   reconciles again) written through the one guarded writer.

A quantized export (ModelOpt's hf_quant_config.json beside the config) stores other tensors than its config
describes: it is refused with the command that records it as a variant of the model it was exported from.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from explorer.checkpoint.hub import fetch_hub_file, read_hub_checkpoint
from explorer.checkpoint.manifest import MANIFEST_FILE, checked_manifest_text
from explorer.checkpoint.reconcile import reconcile
from explorer.commands.add_model import prepare_model, write_model
from explorer.content.model_content import REVISION
from explorer.errors import CheckpointError, ContentError

QUANT_CONFIG = "hf_quant_config.json"
SHOWN_DIFFERENCES = 8
"""Reconciliation differences printed per kind when a checkpoint's headers do not match its config's layout."""


def add_from_hub(content_dir: Path, slug: str, repo: str, revision: str, released: str = "",
                 endpoint: str | None = None) -> tuple[Path, Path, int]:
    """Record model SLUG from OWNER/NAME at a pinned commit: (model.toml, checkpoint.toml, tensors recorded)."""
    if not REVISION.fullmatch(revision):  # a branch name would move under the recorded hash
        raise ContentError([f"--revision: {revision!r}: with --from-hub, the 40-hex-digit commit to read the "
                            "repository at"])
    config = fetch_hub_file(repo, revision, "config.json", endpoint=endpoint)
    if _has_file(repo, revision, QUANT_CONFIG, endpoint):
        raise ContentError([f"{repo}@{revision}/{QUANT_CONFIG}: a quantized export, whose stored tensors its "
                            "config.json does not describe; add the model it was exported from, then record this "
                            f"one with --add-variant BASE --quant-config {QUANT_CONFIG} --repo {repo} "
                            f"--revision {revision}"])
    index = read_hub_checkpoint(repo, revision, endpoint=endpoint)
    with tempfile.TemporaryDirectory(prefix="explorer-hub-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_bytes(config)
        record = prepare_model(content_dir, slug, path, repo, revision, released,
                               provenance=f"config.json of {repo} fetched from the Hub at revision {revision} by "
                                          "--add-model --from-hub; sha256 of its bytes recorded")
    check = reconcile(record.spec, index)
    if not check.balanced:
        raise ContentError([f"{repo}@{revision}: its safetensors headers do not match the stored layout its "
                            f"config.json describes ({record.spec.family} family); nothing written",
                            *(f"  {line}" for line in check.differences(limit=SHOWN_DIFFERENCES))])
    index = replace(index, provenance="headers read from the Hub with range requests by --add-model --from-hub")
    text = checked_manifest_text(index, record.folder / MANIFEST_FILE)
    model = write_model(content_dir, record, {MANIFEST_FILE: text.encode("utf-8")})
    return model, model.parent / MANIFEST_FILE, index.tensor_count


def _has_file(repo: str, revision: str, filename: str, endpoint: str | None) -> bool:
    """Whether the repository holds `filename` at the revision (read whole: it is a few kB); a missing file is an
    answer, any other failure (the Hub unreachable, a hostile answer) an error."""
    try:
        fetch_hub_file(repo, revision, filename, endpoint=endpoint)
    except CheckpointError as e:
        if e.reason == "file not found (404)":
            return False
        raise
    return True
