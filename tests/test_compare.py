"""Models side by side: rows by role whose deltas sum exactly to the totals' difference, for every pair."""

from __future__ import annotations

import html
import itertools
import json

from test_build import text_of

from explorer.figures.compare_roles import compare_roles, role_totals
from explorer.views.compare_pages import compare_rows


def test_role_totals_partition_every_models_parameters(builds):
    for mb in builds.values():
        totals = role_totals(mb.spec, mb.ledger)
        # what is stored, the declared multi-token-prediction layers included (issue 35)
        assert sum(totals.values.values()) == mb.ledger.stored_total == mb.figures.get("total_parameters").value, mb.slug
        assert totals.values["Other"] == 0, mb.slug  # every stored parameter has a named role


def test_a_part_declares_its_row_beside_its_program(builds):
    """A new part names its compare row where its program is registered, so no table elsewhere can forget it."""
    from dataclasses import replace

    from explorer.figures.compare_roles import ROLES, role_of
    from explorer.model.components.base import COMPARISON_ROLES, PROGRAMS, program

    assert set(COMPARISON_ROLES.values()) <= set(ROLES)
    part = replace(next(iter(builds.values())).spec.root, program="a_new_part")
    assert role_of((), part) == "Other"
    try:
        program("a_new_part", role="Norms")(lambda comp, run, x: [x])
        assert role_of((), part) == "Norms"
    finally:
        PROGRAMS.pop("a_new_part", None)
        COMPARISON_ROLES.pop("a_new_part", None)


def test_rows_sum_to_the_totals_difference_for_every_pair(builds):
    totals = {slug: role_totals(mb.spec, mb.ledger) for slug, mb in builds.items()}
    for a, b in itertools.combinations(sorted(builds), 2):
        rows = compare_roles(totals[a], totals[b])
        assert sum(r.delta for r in rows) == builds[b].ledger.stored_total - builds[a].ledger.stored_total, (a, b)


def test_kimi_k2_vs_deepseek_v3_page(built_site):
    text = text_of(built_site / "compare/deepseek-v3-vs-kimi-k2.html")
    assert "1,026,408,232,448" in text and "684,489,845,504" in text
    assert "+341,918,386,944" in text  # 1,026,408,232,448 − 684,489,845,504
    assert "Mixture of experts 656,569,547,264 1,017,493,608,960 +360,924,061,696" in text
    assert "n_routed_experts differs 256 384" in text


def test_static_comparisons_are_the_pairs_content_names_and_the_picker_lists_every_model(built_site, builds):
    """Issue 26: a page per pair grew with the square of the model count; static pages are kept only for the pairs
    content names (model.follows), and the picker page offers every model."""
    index = (built_site / "compare/index.html").read_text()
    follows = {(mb.content.meta.follows, slug) for slug, mb in builds.items() if mb.content.meta.follows}
    assert ("deepseek-v3", "kimi-k2") in follows
    pages = {p.name for p in (built_site / "compare").glob("*-vs-*.html")}
    assert pages == {"{}-vs-{}.html".format(*sorted(pair)) for pair in follows}
    for name in pages:
        assert f'href="../compare/{name}"' in index
    for slug, mb in builds.items():
        assert f'<option value="{slug}">{html.escape(mb.content.meta.name)}</option>' in index
        assert (built_site / f"compare/data/{slug}.js").exists()
    model = (built_site / "models/kimi-k2/index.html").read_text()
    assert 'href="../../compare/deepseek-v3-vs-kimi-k2.html"' in model
    assert 'href="../../compare/index.html#a=kimi-k2"' in model


def test_picker_data_holds_the_numbers_the_static_page_subtracts(built_site, builds):
    """The picker subtracts what the data files hold; Python's rows from the same data sum to the totals' Δ."""
    data = {}
    for slug in builds:
        text = (built_site / f"compare/data/{slug}.js").read_text()
        data[slug] = json.loads(text[text.index("=", text.index("]")) + 1:].rstrip().rstrip(";"))
        assert data[slug]["total"] == str(builds[slug].ledger.stored_total)
    for a, b in itertools.combinations(sorted(builds), 2):
        left = {**data[a], "roles": [[r, int(v)] for r, v in data[a]["roles"]]}
        right = {**data[b], "roles": [[r, int(v)] for r, v in data[b]["roles"]]}
        roles, _ = compare_rows(left, right)
        assert sum(r - l for _, l, r in roles) == builds[b].ledger.stored_total - builds[a].ledger.stored_total, (a, b)


def test_component_pages_link_their_library_part_page(built_site):
    """Issue 26: a component page links one page per library part, not every other model with it."""
    router = (built_site / "models/kimi-k2/blocks.moe.moe.router.html").read_text()
    assert '<a href="../../parts/router.router.html">every model built from this part →</a>' in router
    part = (built_site / "parts/router.router.html").read_text()
    assert 'href="../models/deepseek-v3/blocks.moe.moe.router.html">Router</a>' in part
    assert 'href="../models/gpt-oss-20b/' in part
    attn = (built_site / "parts/attention.attn.html").read_text()
    assert "llama-3.1-70b/blocks.block.attn.html" in attn and "kimi-k2/" not in attn


def test_deepseek_v3_to_v32_shows_the_correction_bias_convention_as_buffers(builds):
    """DeepSeek-V3 counts its routers' e_score_correction_bias with the parameters (its checkpoint listing does);
    V3.2 follows transformers, which holds them as buffers. The compare rows show −14,848 in the experts' row and
    the buffers row shows where they went: 256 experts × 58 MoE layers + 256 in the MTP layer (config:
    n_routed_experts 256, num_hidden_layers 61, first_k_dense_replace 3, num_nextn_predict_layers 1)."""
    figures = {slug: {f.key: f.value for f in builds[slug].figures.figures} for slug in ("deepseek-v3", "deepseek-v3.2")}
    assert figures["deepseek-v3"]["stored_buffers"] == 0
    assert figures["deepseek-v3.2"]["stored_buffers"] == 256 * (61 - 3) + 256
    rows = {r.role: r.delta for r in compare_roles(role_totals(builds["deepseek-v3"].spec, builds["deepseek-v3"].ledger),
                                                   role_totals(builds["deepseek-v3.2"].spec,
                                                               builds["deepseek-v3.2"].ledger))}
    assert rows["Mixture of experts"] == -256 * (61 - 3)


def test_the_buffers_row_says_which_models_count_correction_biases_as_parameters(builds):
    """DeepSeek-V3's definition names its 256 × 58 + 256 correction biases; V3.2, which holds them as buffers, none."""
    definitions = {slug: next(f.definition for f in builds[slug].figures.figures if f.key == "stored_buffers")
                   for slug in ("deepseek-v3", "deepseek-v3.2")}
    assert f"correction biases ({256 * (61 - 3) + 256:,} elements) with its parameters" in definitions["deepseek-v3"]
    assert "This model counts" not in definitions["deepseek-v3.2"]
