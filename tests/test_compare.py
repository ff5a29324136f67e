"""Models side by side: rows by role whose deltas sum exactly to the totals' difference, for every pair."""

from __future__ import annotations

import itertools

from test_build import text_of

from explorer.compare import compare_roles, role_totals


def test_role_totals_partition_every_models_parameters(builds):
    for mb in builds.values():
        totals = role_totals(mb.spec, mb.ledger)
        assert sum(totals.values.values()) == mb.ledger.total, mb.slug
        assert totals.values["Other"] == 0, mb.slug  # every stored parameter has a named role


def test_rows_sum_to_the_totals_difference_for_every_pair(builds):
    totals = {slug: role_totals(mb.spec, mb.ledger) for slug, mb in builds.items()}
    for a, b in itertools.combinations(sorted(builds), 2):
        rows = compare_roles(totals[a], totals[b])
        assert sum(r.delta for r in rows) == builds[b].ledger.total - builds[a].ledger.total, (a, b)


def test_kimi_k2_vs_deepseek_v3_page(built_site):
    text = text_of(built_site / "compare/deepseek-v3-vs-kimi-k2.html")
    assert "1,026,408,232,448" in text and "684,489,845,504" in text
    assert "+341,918,386,944" in text  # 1,026,408,232,448 − 684,489,845,504
    assert "Mixture of experts 656,569,547,264 1,017,493,608,960 +360,924,061,696" in text
    assert "n_routed_experts differs 256 384" in text


def test_every_pair_is_reachable_from_the_compare_index_and_model_pages(built_site, builds):
    index = (built_site / "compare/index.html").read_text()
    for a, b in itertools.combinations(sorted(builds), 2):
        assert f'href="../compare/{a}-vs-{b}.html"' in index
        assert (built_site / f"compare/{a}-vs-{b}.html").exists()
    model = (built_site / "models/kimi-k2/index.html").read_text()
    assert 'href="../../compare/deepseek-v3-vs-kimi-k2.html"' in model


def test_component_pages_link_the_same_library_part_in_other_models(built_site):
    router = (built_site / "models/kimi-k2/blocks.moe.moe.router.html").read_text()
    assert 'href="../deepseek-v3/blocks.moe.moe.router.html">DeepSeek-V3: Router</a>' in router
    attn = (built_site / "models/llama-3.1-8b/blocks.block.attn.html").read_text()
    assert "llama-3.1-70b/blocks.block.attn.html" in attn and "kimi-k2" not in attn.split('class="same-part"')[1][:400]
