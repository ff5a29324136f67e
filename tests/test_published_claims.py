"""Published claims reconciled (issue 35): every figure a lab published, with its source, beside the site's figure
under each convention; a claim no convention reproduces says where the difference lies, or the build refuses it."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.errors import ContentError
from explorer.figures.published_claims import HEADLINE_CONVENTION, PublishedClaim, reconcile_claims, states

NONE_RECORDED = {"step-3.7-flash": "no parameter figure of StepFun's is recorded offline: the aiconfigurator-core "
                                    "README and the config it holds carry none",
                 **{slug: "recorded from NVIDIA's NVFP4 repack config alone; no figure of the lab's is recorded offline "
                          "and the name carries none" for slug in ("kimi-k2.6", "kimi-k2.7-code")},
                 **{slug: "no figure of Z.ai's for this release is recorded offline; the config carries none"
                    for slug in ("glm-5.2", "glm-5.3")}}
"""Models whose lab's figures are recorded nowhere this project can read: no claim is written from memory, and the
page says none is recorded."""

ISSUE_CLAIMS = [("glm-5", "active", "40B"), ("deepseek-v4-flash", "active", "13B"), ("minimax-m2.5", "active", "10B"),
                ("deepseek-v3.2", "active", "37B"), ("deepseek-v3", "active", "37B"), ("deepseek-v3", "active", "36.6B"),
                ("kimi-k2", "active", "32B")]
"""The claims the audit found mapped to the with-embedding count or not reconciled at all: each is reproduced by
the site's figure without the input embedding."""


def test_rounding_is_to_the_last_digit_the_lab_writes():
    assert states(36_625_618_432, "36.6B", "nearest") and states(36_625_618_432, "37B", "nearest")
    assert not states(37_552_297_472, "37B", "nearest") and states(37_552_297_472, "37B", "down")
    assert states(1_026_408_232_448, "1T", "nearest") and not states(1_026_408_232_448, "1.1T", "nearest")


@pytest.mark.parametrize(("slug", "figure", "claim"), ISSUE_CLAIMS)
def test_the_issues_claims_are_reproduced_without_the_embedding(builds, slug: str, figure: str, claim: str):
    row = next(r for r in builds[slug].claims if (r.claim.figure, r.claim.claim) == (figure, claim))
    assert row.reproduced_by == ("without the input embedding",)
    assert "The headline (with the input embedding) counts" in row.headline_difference


def test_qwen35_35b_a3b_3b_is_reproduced_both_ways(builds):
    row = next(r for r in builds["qwen3.5-35b-a3b"].claims if r.claim.claim == "3B")
    assert row.reproduced_by == ("with the input embedding", "without the input embedding")


def test_kimi_k2_total_and_deepseek_v3_main_model(builds):
    kimi = {r.claim.claim: r for r in builds["kimi-k2"].claims}
    assert "every stored parameter, with the input embedding" in kimi["1T"].reproduced_by
    v3 = {r.claim.claim: r for r in builds["deepseek-v3"].claims}
    assert v3["671B"].reproduced_by == ("main model, without the MTP module",)  # 671,026,419,200


def test_every_claim_is_reproduced_or_its_difference_itemised(builds):
    listed = 0
    for slug, mb in builds.items():
        for r in mb.claims:
            listed += 1
            assert r.reproduced_by or r.claim.difference.strip(), (slug, r.claim.claim)
            assert r.claim.source.strip(), (slug, r.claim.claim)
    # every model has one, save those whose lab's figures are recorded nowhere readable here
    assert [s for s, mb in builds.items() if not mb.claims] == sorted(s for s in NONE_RECORDED if s in builds)
    assert listed >= 40


def test_a_claim_no_convention_reproduces_is_refused_without_a_difference(builds):
    mb = builds["glm-5"]
    wrong = (PublishedClaim("active", "44B", "test source"),)
    rows, problems = reconcile_claims(wrong, mb.spec, mb.ledger, mb.figures, "content/models/glm-5/model.toml")
    assert not rows[0].reproduced_by
    assert problems == [
        "content/models/glm-5/model.toml: key 'published[0].difference': missing: 44B (active) is reproduced by no "
        "convention (with the input embedding 41,784,709,632; without the input embedding 40,833,126,912); say where "
        "the difference lies"]
    explained = (dataclasses.replace(wrong[0], difference="a test difference"),)
    assert reconcile_claims(explained, mb.spec, mb.ledger, mb.figures, "x")[1] == []


def test_a_malformed_claim_names_its_file_and_key(tmp_path: Path):
    folder = tmp_path / "kimi-k2"
    folder.mkdir()
    text = (ROOT / "content/models/kimi-k2/model.toml").read_text(encoding="utf-8")
    (folder / "model.toml").write_text(text + '\n[[published]]\nfigure = "activ"\nclaim = "32 billion"\n'
                                              'source = "x"\n', encoding="utf-8")
    with pytest.raises(ContentError) as info:
        load_model_content(folder)
    message = str(info.value)
    assert "key 'published[2].figure': must be one of total, active, got 'activ'" in message
    assert "key 'published[2].claim': expected a figure as published" in message


@pytest.mark.parametrize("slug", sorted(p.name for p in (ROOT / "content/models").iterdir()))
def test_every_model_page_and_api_has_the_table(built_site: Path, slug: str):
    page = html.unescape((built_site / "models" / slug / "index.html").read_text(encoding="utf-8"))
    assert page.count(HEADLINE_CONVENTION) == 1
    if slug in NONE_RECORDED:
        assert "Published claims: none recorded for this model" in page
        return
    assert "<caption>Published claims</caption>" in page
    data = json.loads((built_site / "api" / f"{slug}.json").read_text(encoding="utf-8"))
    claims = data["published_claims"]
    assert claims["headline_convention"] == HEADLINE_CONVENTION
    for c in claims["claims"]:
        assert c["source"] and (c["reproduced_by"] or c["difference"])
        assert re.search(re.escape(c["claim"]) + r" " + c["figure"], page)


def test_the_build_refuses_a_claim_it_cannot_reproduce(small_project_copy):
    """A lab figure that no convention reproduces, with no difference stated, fails the check with its key named
    (after the tensors' differences, which come first)."""
    from conftest import run_build

    project = small_project_copy("kimi-k2", "deepseek-v3")
    toml = project / "content/models/kimi-k2/model.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace('claim = "32B"', 'claim = "35B"'), encoding="utf-8")
    result = run_build("--check", "--content", str(project))
    assert result.returncode == 1
    assert ("kimi-k2 (published claims): " + str(toml) + ": key 'published[0].difference': missing: 35B (active) is "
            "reproduced by no convention") in result.stdout
