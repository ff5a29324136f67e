"""Words true of each model (issue 35): a page of a model whose config was recorded without a Hub revision never
calls its configuration, files or revision pinned, and links no commit named "unpinned"."""

from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path

import pytest
from conftest import ROOT

from explorer.content.model_content import load_model_content

NEGATED = re.compile(r"\b(?:no|none|not)\b(?:[^.;,:()]|\.(?=\S)){0,60}?\bpinned\b", re.IGNORECASE)
"""A "pinned" negated within its clause ("revision not pinned", "No pinned revision", "no commit of a/b is
pinned"); every other "pinned" on an unpinned model's page is false."""
PINNED = re.compile(r"\bpinned\b", re.IGNORECASE)
TAG = re.compile(r"<[^>]+>")


def unpinned_slugs() -> list[str]:
    return sorted(p.name for p in (ROOT / "content/models").iterdir()
                  if (p / "model.toml").is_file() and not load_model_content(p).checkpoint.pinned)


def false_pinned_words(page: str) -> list[str]:
    """Each place a page's text says "pinned" without negating it, with its context; also a link to a commit
    named "unpinned" (there is none)."""
    text = NEGATED.sub("", html.unescape(TAG.sub(" ", page)))
    found = [text[max(0, m.start() - 60):m.end() + 20] for m in PINNED.finditer(text)]
    return found + re.findall(r'href="[^"]*/(?:blob|tree)/unpinned/[^"]*"', page)


def test_the_unpinned_models_are_the_recorded_ones():
    # the third-party configs of the issue are among them; a pinned model's pages may still say pinned
    assert {"kimi-k2.5", "minimax-m2.5", "mimo-v2-flash", "deepseek-v4-flash"} <= set(unpinned_slugs())
    assert "kimi-k2" not in unpinned_slugs()


def test_the_check_finds_the_words_it_forbids():
    # what the pages said before issue 35: each is caught, and the negated forms pass
    assert false_pinned_words('<p class="check">Derived from the pinned configuration; checked</p>')
    assert false_pinned_words("<p>Every number … derived from a pinned configuration and checked</p>")
    assert false_pinned_words('<p class="pin">Pinned revision <a href="https://huggingface.co/a/b/blob/unpinned/'
                              'config.json#L1-L2">unpinned</a></p>')
    assert false_pinned_words("<p>The pinned file is not bundled with this site</p>")
    assert false_pinned_words("<p>no learned parameters. Derived from the pinned configuration</p>")
    assert not false_pinned_words("<p><strong>No pinned revision:</strong> so no commit of a/b-C is pinned; "
                                  "a/b @ revision not pinned</p>")


@pytest.mark.parametrize("slug", unpinned_slugs())
def test_no_unpinned_model_page_says_pinned(built_site: Path, slug: str):
    pages = sorted((built_site / "models" / slug).glob("*.html"))
    assert pages
    wrong = {p.name: w for p in pages if (w := false_pinned_words(p.read_text(encoding="utf-8")))}
    assert not wrong, next(iter(wrong.items()))


def test_a_pinned_model_page_names_its_commit(built_site: Path):
    page = (built_site / "models/kimi-k2/index.html").read_text(encoding="utf-8")
    ref = load_model_content(ROOT / "content/models/kimi-k2").checkpoint
    assert f"configuration pinned at {ref.repo_id}@{ref.revision[:7]}" in page


# ------------------------------------------------------------------------------------------------------ τ

TEX = re.compile(r'<annotation encoding="application/x-tex">(.*?)</annotation>', re.S)
STEP_LIST = re.compile(r'<ol class="([a-z-]+)">(.*?)</ol>', re.S)
USES_TAU = re.compile(r"\\tau(?![A-Za-z}])")
"""τ as the softmax scale (Llama 4's Q^{τ}, queries scaled by a temperature, is another symbol)."""
GIVES_TAU = re.compile(r"\\tau\s*=")


def tau_without_value(tex: list[str]) -> bool:
    """Whether these formulas use τ and none of them gives its value."""
    uses = any(USES_TAU.search(t.replace(r"^{\tau}", "")) for t in tex)
    return uses and not any(GIVES_TAU.search(t) for t in tex)


def test_the_tau_check_finds_a_softmax_without_its_scale():
    softmax = r"A_h=\operatorname{softmax}\!\left(\tau\,Q_hK_h^{\top}+M\right)"
    assert tau_without_value([softmax])
    assert not tau_without_value([r"\tau=1/\sqrt{128}=0.088388", softmax])
    assert not tau_without_value([r"Q^{\tau}_t=Q_t(1+\beta\log t)"])


def test_every_step_list_and_page_that_uses_tau_gives_it(built_site: Path):
    missing, using = [], 0
    for page in sorted(built_site.rglob("*.html")):
        if page.name == "glossary.html":  # the notation page defines τ in words, for every model
            continue
        text = page.read_text(encoding="utf-8")
        tex = [html.unescape(t) for t in TEX.findall(text)]
        using += any(USES_TAU.search(t) for t in tex)
        if tau_without_value(tex):
            missing.append(str(page.relative_to(built_site)))
        for cls, body in STEP_LIST.findall(text):
            if cls != "headline" and tau_without_value([html.unescape(t) for t in TEX.findall(body)]):
                missing.append(f"{page.relative_to(built_site)} ({cls})")
    assert using > 100  # every attention and block page of the site's attention kinds
    assert not missing, missing[:10]


def test_kimi_k2_block_gives_tau_with_yarn_mscale(built_site: Path):
    # τ = mscale² / √192 with mscale = 0.1 ln 32 + 1 (rope_scaling.factor 32): 0.130861, 1.81 × 1/√192
    text = html.unescape((built_site / "models/kimi-k2/blocks.dense.html").read_text(encoding="utf-8"))
    steps = STEP_LIST.search(text[text.index('<ol class="steps">'):])
    assert steps is not None
    tex = TEX.findall(steps.group(2))
    scale = next(t for t in tex if GIVES_TAU.search(t))
    assert r"a_{\mathrm{YaRN}}=0.1\ln 32+1=1.3466" in scale and r"\tau=0.130861" in scale


def _with_scale(comp, factor: float):
    """The component with every scores child's softmax scale multiplied by factor."""
    from explorer.model.components.attention import ScoresOptions

    children = tuple(_with_scale(c, factor) for c in comp.children)
    o = comp.options
    if comp.program == "scores" and isinstance(o, ScoresOptions):
        return dataclasses.replace(comp, children=children, options=dataclasses.replace(o, scale=o.scale * factor))
    return dataclasses.replace(comp, children=children)


@pytest.mark.parametrize(("slug", "path"), [("llama-3.1-8b", "blocks.block.attn"), ("kimi-k2", "blocks.dense.attn")])
def test_a_wrong_tau_fails_the_equation_check(builds, slug: str, path: str):
    """τ scaled by 1/1.81 (Kimi K2's τ without YaRN's mscale², the 1/√d a reader would assume) fails the check."""
    from explorer.errors import ExecutionError
    from explorer.execute.executor import check_equations, tiny_spec

    spec = builds[slug].spec
    tiny = tiny_spec(spec)
    checks = check_equations(spec, tiny, ("mtp",))
    assert checks[path].status == "checked"
    wrong = dataclasses.replace(tiny, root=_with_scale(tiny.root, 1 / 1.8133))
    with pytest.raises(ExecutionError) as info:
        check_equations(spec, wrong, ("mtp",))
    assert f"\n  {path}: max |Δ|" in str(info.value)


# ------------------------------------------------------------------------- the reference's own count, buffers

def test_kimi_k2_reference_line_gives_the_references_own_count(builds, built_site: Path):
    """transformers holds Kimi K2's 60 routers' e_score_correction_bias as buffers: its count is 1,026,408,209,408
    parameters and 23,040 buffer elements, which the ledger's 1,026,408,232,448 parameters sums."""
    rc = builds["kimi-k2"].reference_count
    assert (rc.parameters, rc.buffer_tensors, rc.buffers) == (1_026_408_209_408, 60, 23_040)
    assert rc.ledger_parameters == builds["kimi-k2"].ledger.total == 1_026_408_232_448
    assert [(h.name, h.tensors, h.elements) for h in rc.held_as_buffers] == [
        ("model.layers.1-60.mlp.gate.e_score_correction_bias", 60, 23_040)]
    text = html.unescape(TAG.sub(" ", (built_site / "models/kimi-k2/index.html").read_text(encoding="utf-8")))
    assert "69,915 parameter tensors, 1,026,408,209,408 elements, and 60 persistent buffers of 23,040 elements" in text
    assert "The ledger counts 1,026,408,232,448 parameters for these tensors" in text


@pytest.mark.parametrize("slug", ["kimi-k2", "gpt2", "deepseek-v4-flash"])
def test_reference_count_is_what_transformers_counts(builds, slug: str):
    """The oracle counted directly: named_parameters (a tied head once) and the state dict's buffers."""
    from explorer.execute.reference import build_reference_model

    model = build_reference_model(builds[slug].spec)
    params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    state = model.state_dict()
    buffers = [n for n, _ in model.named_buffers() if n in state]
    rc = builds[slug].reference_count
    assert (rc.parameters, rc.buffers) == (params, sum(state[n].numel() for n in buffers))
    assert rc.buffer_tensors == len(buffers)


def test_stored_buffers_figure_is_the_checkpoint_ledgers(builds):
    """Kimi K2's listing stores 61 BF16 rotary tables (3,416 elements): the figure says so, not 0."""
    for slug, mb in builds.items():
        if mb.checkpoint is not None:
            assert mb.figures.get("stored_buffers").value == mb.checkpoint.role_total("buffer")[1], slug
    kimi = builds["kimi-k2"].checkpoint
    assert [(t.dtype, t.tensors, t.elements) for t in kimi.totals if t.role == "buffer"] == [("BF16", 61, 3_416)]
    assert builds["kimi-k2"].figures.get("stored_buffers").value == 3_416
