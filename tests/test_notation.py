"""Steps that read as computed, and one notation site-wide (issue 25, items 1 and 2).

Every step of every component reads only what a port brings in or an earlier step computed, in the form the step
before produced it (rotated, normed, clamped); every symbol any step uses is in the Notation registry, with one
kind and one meaning. The expected parses below are written from the LaTeX by hand, not produced by the parser.
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT

from explorer.model.families import load_model_spec
from explorer.model.notation import undefined_reads, unread_inputs
from explorer.model.step_symbols import parse_step, symbols_of
from explorer.spec.types import Port, walk


@pytest.fixture(scope="module")
def all_specs():
    from explorer.content.model_content import load_all_models

    return [load_model_spec(m) for m in load_all_models(ROOT / "content")]


def spec_of(slug: str):
    from explorer.content.model_content import load_model_content

    return load_model_spec(load_model_content(ROOT / "content/models" / slug))


# ------------------------------------------------------------------------------------------- the parser

@pytest.mark.parametrize("latex, defines, reads", [
    (r"{\color{stream-q}{Q^{R}_t}}=\operatorname{RoPE}({\color{stream-q}{\hat Q}}_t,{\color{stream-context}{R_t}})",
     {"Q^{R}"}, {r"\hat Q", "R"}),
    (r"x_{\mathrm{attn}}=\frac{x_n}{\sqrt{\operatorname{mean}((x_n)^2)+10^{-6}}}\odot \gamma",
     {r"x_{\mathrm{attn}}"}, {"x", r"\gamma"}),
    (r"\hat c^{{\color{stream-q}{Q}}}=\operatorname{RMSNorm}({\color{stream-q}{c^{Q}}})", {r"\hat c^{Q}"}, {"c^{Q}"}),
    (r"E_i=m_{i}W_{2,i}", {"E"}, {"m", "W"}),
    (r"[{\color{stream-k}{k^{C}}};{\color{stream-v}{v}}]=\hat c^{KV}[W_{UK};W_{UV}]", {"k^{C}", "v"},
     {r"\hat c^{KV}", "W_{UK}", "W_{UV}"}),
    (r"\hat g=\min(g,7),\quad \hat u=\operatorname{clamp}(u,-7,7)", {r"\hat g", r"\hat u"}, {"g", "u"}),
    (r"G_i=\frac{e^{z_i}E^{\mathrm{sel}}_i}{\sum_j e^{z_j}E^{\mathrm{sel}}_j}", {"G"}, {"z", r"E^{\mathrm{sel}}"}),
    (r"{\color{stream-k}{K}}={\color{stream-v}{V}}=[{\color{stream-k}{k_1}};\dots;{\color{stream-k}{k_T}}]",
     {"K", "V"}, {"k"}),
    (r"x_t,\ B_t,\ C_t=\operatorname{split}(\tilde\xi_t;\ 4096,1024,1024)", {"x", "B", "C"}, {r"\tilde \xi"}),
    (r"{\color{stream-v}{V}}\leftarrow 0.707\,{\color{stream-v}{V}}", {"V"}, {"V"}),
])
def test_a_step_defines_its_left_side_and_reads_its_right(latex, defines, reads):
    parsed = parse_step(latex)
    assert parsed.defines == defines
    assert parsed.reads == reads


def test_index_scripts_are_indices_not_reads():
    parsed = parse_step(r"y^{\mathrm{routed}}=\sum_{e=1}^{128}G_e\,E_e")
    assert parsed.reads == {"G", "E"}
    assert "e" in parsed.indices
    assert parse_step(r"[g\,u]_e=x_{\mathrm{moe}}W^{gu}_e,\quad g_e=[g\,u]_{e,:I}").reads == {
        r"x_{\mathrm{moe}}", "W^{gu}"}


def test_ports_name_their_symbols():
    assert symbols_of(r"[{\color{stream-k}{k^{C}}};{\color{stream-v}{v}}]") == ["k^{C}", "v"]
    assert symbols_of(r"x'_n") == ["x'"]


# ------------------------------------------------------------------- steps read what the steps before produced

KNOWN_GAPS: set[str] = set()
"""Known gaps, by library part: kept exact, so that fixing one (or adding one) updates this list."""


def test_every_step_reads_what_a_port_or_an_earlier_step_gives(all_specs):
    found = {f"{comp.program}: {p}" for spec in all_specs for _, comp in walk(spec.root) for p in undefined_reads(comp)}
    assert found - KNOWN_GAPS == set()
    assert KNOWN_GAPS - found == set()


def test_every_input_a_page_lists_is_read_by_a_step(all_specs):
    """Issue 36: Llama 4's NoPE attention listed the rotary angles R as an input no step used; DeepSeek-V4's
    score-routed blocks and MoEs listed the token ids, and its HCA compressor the query latent, which only a
    table router and an indexer read."""
    found = {f"{spec.slug} {comp.program}: {p}" for spec in all_specs for _, comp in walk(spec.root)
             for p in unread_inputs(comp)}
    assert found == set()


def test_an_input_no_step_reads_is_found():
    attn = _attention("llama-3.1-8b")
    assert unread_inputs(attn) == []
    planted = dataclasses.replace(attn, inputs=(*attn.inputs, Port("Z", attn.inputs[0].shape, "z")))
    assert unread_inputs(planted) == ["input z (Z) is read by no step"]


def _attention(slug: str):
    spec = spec_of(slug)
    return next(c for _, c in walk(spec.root) if c.program == "attention")


@pytest.mark.parametrize("slug", ["llama-3.1-8b", "qwen3-8b", "gpt-oss-20b", "mixtral-8x7b"])
def test_grouped_query_scores_read_the_rotated_queries_and_keys(slug):
    """Issue 25: the scores step used the raw Q and K after the steps had rotated (and QK-normed) them."""
    attn = _attention(slug)
    softmax = next(s for s in attn.steps if s.name == "softmax")
    assert "Q^{R}" in parse_step(softmax.latex).reads
    repeat = [s for s in attn.steps if s.name == "repeat"]
    assert all("K^{R}" in parse_step(s.latex).reads for s in repeat)
    scores = attn.child("scores")
    assert [p.latex for p in scores.inputs[:2]] == [r"{\color{stream-q}{Q^{R}}}", r"{\color{stream-k}{K^{R}}}"]
    assert undefined_reads(attn) == []


def _with_step(comp, name: str, latex: str):
    return dataclasses.replace(comp, steps=tuple(dataclasses.replace(s, latex=latex) if s.name == name else s
                                                 for s in comp.steps))


def test_a_step_that_reads_the_raw_tensor_fails():
    attn = _attention("qwen3-8b")
    softmax = next(s for s in attn.steps if s.name == "softmax")
    raw = _with_step(attn, "softmax", softmax.latex.replace("Q^{R}_h", "Q_h"))
    assert raw.steps != attn.steps
    assert any("reads Q, superseded by" in p for p in undefined_reads(raw))
    normed_only = _with_step(attn, "softmax", softmax.latex.replace("Q^{R}_h", r"\hat Q_h"))
    assert any(r"reads \hat Q, superseded by Q^{R}" in p for p in undefined_reads(normed_only))


def test_streams_mixed_by_weights_from_their_normed_copy_read_as_computed():
    """Hyper-connections norm the flattened streams X into \\hat X only to compute mixing weights, then mix X itself by
    them: that read is as computed (it was a known gap). Reading X where \\hat X belongs, or mixing X by weights
    made from anything else, still fails."""
    hc = next(c for _, c in walk(spec_of("deepseek-v4-flash").root) if c.program == "hyper_connection")
    proj = next(s for s in hc.steps if s.name == "hc-proj")
    collapse = next(s for s in hc.steps if s.name == "hc-collapse")
    assert undefined_reads(hc) == []
    raw_proj = _with_step(hc, "hc-proj", proj.latex.replace(r"=\hat X\,", "=X_n\\,"))
    assert raw_proj.steps != hc.steps
    # and the weights are no longer made from \\hat X, so the collapse that mixes X by them fails too
    assert undefined_reads(raw_proj) == [r"step 'hc-proj' reads X, superseded by \hat X",
                                         r"step 'hc-collapse' reads X, superseded by \hat X"]
    by_a_parameter = _with_step(hc, "hc-collapse", collapse.latex.replace(r"\pi^{\mathrm{pre}}_i", r"\zeta_1"))
    assert by_a_parameter.steps != hc.steps
    assert undefined_reads(by_a_parameter) == [r"step 'hc-collapse' reads X, superseded by \hat X"]


def test_weights_from_another_tensors_form_do_not_excuse_a_raw_read():
    """The scores read K^{R}, made from the keys' form, not the queries': reading Q there still skips Q^{R}."""
    attn = _attention("llama-3.1-8b")
    softmax = next(s for s in attn.steps if s.name == "softmax")
    raw = _with_step(attn, "softmax", softmax.latex.replace("Q^{R}_h", "Q_h"))
    assert raw.steps != attn.steps
    assert undefined_reads(raw) == ["step 'softmax' reads Q, superseded by Q^{R}"]


def test_a_step_that_reads_what_nothing_computed_fails():
    mlp = next(c for _, c in walk(spec_of("kimi-k2").root) if c.program == "gated_mlp")
    down = next(s for s in mlp.steps if s.name == "down_proj")
    assert undefined_reads(mlp) == []
    bad = _with_step(mlp, "down_proj", down.latex.replace("=m", r"=\hat m"))
    assert bad.steps != mlp.steps
    assert undefined_reads(bad) != []


# ------------------------------------------------------------------------------------------ one notation

def test_every_symbol_any_step_or_port_uses_is_in_the_registry(all_specs):
    from explorer.model.notation import unregistered

    missing = {f"{comp.program}: {s}" for spec in all_specs for _, comp in walk(spec.root) for s in unregistered(comp)}
    assert missing == set()


def test_the_registry_gives_each_symbol_one_entry_and_one_anchor():
    from explorer.model.notation import SYMBOLS
    from explorer.views.notation_page import symbol_anchor

    latex = [s.latex for s in SYMBOLS]
    assert len(latex) == len(set(latex))
    assert len({symbol_anchor(x) for x in latex}) == len(latex)
    assert all(s.meaning for s in SYMBOLS)


def test_an_unregistered_symbol_fails():
    from explorer.model.notation import unregistered

    mlp = next(c for _, c in walk(spec_of("kimi-k2").root) if c.program == "gated_mlp")
    product = next(s for s in mlp.steps if s.name == "product")
    assert unregistered(mlp) == []
    assert unregistered(_with_step(mlp, "product", product.latex.replace("m=", r"\upsilon="))) == [r"\upsilon"]


def test_an_index_letter_used_as_a_tensor_fails():
    """Issue 25: s meant a key position, the router's scores and gpt-oss's sink logits; the sinks are κ_h now, and
    writing them s_h again is caught (s is registered as the key-position index)."""
    attn = _attention("gpt-oss-20b")
    softmax = next(s for s in attn.steps if s.name == "softmax")
    assert r"\kappa_h" in softmax.latex
    overloaded = _with_step(attn, "softmax", softmax.latex.replace(r"\kappa_h", "s_h"))
    assert any("writes s with an index, registered as an index" in p for p in undefined_reads(overloaded))


def test_a_step_that_computes_a_parameter_fails():
    """γ is a norm's learned gain: a step that computes a γ gives it a second meaning."""
    norm = next(c for _, c in walk(spec_of("kimi-k2").root) if c.program == "norm")
    step = norm.steps[0]
    assert undefined_reads(norm) == []
    bad = _with_step(norm, step.name, step.latex + r",\quad \gamma=x_n")
    assert any(r"computes \gamma, registered as a parameter" in p for p in undefined_reads(bad))


def test_a_step_that_defines_the_sigmoid_fails():
    """σ is the sigmoid on every page (seed 000: s = σ(z)); LayerNorm's variance, once σ², is written out."""
    norm = next(c for _, c in walk(spec_of("gpt2").root) if c.program == "norm")
    step = norm.steps[0]
    assert undefined_reads(norm) == []
    assert r"\operatorname{mean}((x_n-\mu)^2)" in step.latex
    as_sigma = _with_step(norm, step.name, step.latex.replace(r"\operatorname{mean}((x_n-\mu)^2)", r"\sigma^2")
                          + r",\ \sigma^2=\operatorname{var}(x_n)")
    assert as_sigma.steps != norm.steps
    assert undefined_reads(as_sigma) == [rf"step '{step.name}' computes \sigma, registered as a function"]


def test_the_notation_page_renders_every_symbol_as_mathml_with_where_it_is_defined(all_specs):
    from explorer.model.notation import SYMBOLS
    from explorer.views.notation_page import notation_page

    page = notation_page(all_specs, "<p>intro</p>")
    entries = [e for sec in page.sections for e in sec.entries]
    assert len(entries) == len(SYMBOLS)
    assert all(e.mathml.startswith("<math ") for e in entries)
    by_anchor = {e.anchor: e for e in entries}
    # Kimi K2's router affinity: defined by the router's scores step (its own page, the leaf)
    rho = by_anchor["sym-rho"].where
    assert rho is not None and rho.href == "models/kimi-k2/blocks.moe.moe.router.html#step-scores"
    assert rho.text == "defined on kimi-k2 › blocks.moe.moe.router"
    # a learned matrix is not computed: its link says where it is first used
    assert by_anchor["sym-W"].where.text.startswith("first used on ")
    unused = [e.anchor for e in entries if e.where is None]
    assert unused == []


def test_the_seed_004_page_names_its_input_m_in_equation_and_box(all_specs):
    """Kimi K2 › dense block › SwiGLU › down projection: the equation and the in/out box use one symbol, m."""
    spec = next(s for s in all_specs if s.slug == "kimi-k2")
    down = next(c for anc, c in walk(spec.root) if c.key == "down_proj" and [a.key for a in anc[-2:]] == ["dense", "mlp"])
    assert [p.latex for p in down.inputs] == ["m"]
    assert parse_step(down.equations[0].latex).reads == {"m", "W"}
    mlp = next(c for anc, c in walk(spec.root) if c.program == "gated_mlp" and anc[-1].key == "dense")
    product = next(s for s in mlp.steps if s.name == "product")
    assert parse_step(product.latex).defines == {"m"}


KNOWN_OVERLOADS: set[str] = set()
"""Symbols the steps still write for a second thing, each stated on the Notation page: kept exact, so that a
rename removes one here and a new double use must be declared."""


def test_each_symbol_has_one_meaning_but_the_declared_overloads():
    from explorer.model.notation import BY_LATEX, SYMBOLS

    assert {s.latex for s in SYMBOLS if s.also} == KNOWN_OVERLOADS
    # issue 25 named these: s was sigmoid scores, softmax scores and sink logits; h a head and a SwiGLU product;
    # v the values and a vision output
    assert not {"s", "h", "v", r"\rho", r"\kappa", "m", "z", r"\psi_{\mathrm{out}}"} & KNOWN_OVERLOADS
    assert [BY_LATEX[x].kind for x in ("s", "h", r"\rho", r"\kappa", "m", "v")] == [
        "index", "index", "computed", "parameter", "computed", "computed"]
    # renamed since: γ was also DeltaNet's chunk decay and a head group, λ also a layer scalar, B also a window bias,
    # c also a patch column, e also the vision output, p also a patch
    assert not {r"\gamma", r"\lambda", "B", "c", "e", "p", "u", r"\hat u", "A", "S", "I", "P", "C",
                r"\Delta"} & KNOWN_OVERLOADS
    assert [BY_LATEX[x].kind for x in (r"\gamma", r"\lambda", "e", r"s_{\mathrm{layer}}")] == [
        "parameter", "computed", "index", "parameter"]
    # and since: z was also the vision patch stream (ψ now), t also the token ids (t^{id}), σ² LayerNorm's variance
    # (written out as the mean square deviation)
    assert [BY_LATEX[x].kind for x in ("z", r"\psi", "t", r"t^{\mathrm{id}}", r"\sigma")] == [
        "computed", "computed", "index", "constant", "function"]


def _bases(comp) -> set[str]:
    """The bare letters comp's steps and ports write (\\hat \\psi^{\\mathrm{grp}} -> \\psi)."""
    used = {s for p in (*comp.inputs, *comp.outputs) for s in symbols_of(p.latex)}
    for step in comp.steps:
        if not step.heading:
            parsed = parse_step(step.latex)
            used |= parsed.defines | parsed.reads
    return {s.split(" ")[-1].split("_")[0].split("^")[0].rstrip("'") for s in used}


def _patch_stream_clashes(comps) -> list[str]:
    """Each component that writes the router's z next to the patch stream ψ, or a z no router matrix makes."""
    out = [c.program for c in comps if {"z", r"\psi"} <= _bases(c)]
    for comp in comps:
        for step in comp.steps:
            parsed = parse_step(step.latex) if not step.heading else None
            if parsed and "z" in parsed.defines and "W_{r}" not in parsed.reads:
                out.append(f"{comp.program}: step '{step.name}' makes z without the router matrix")
    return out


def test_z_is_the_routers_logits_and_the_patch_stream_is_psi(all_specs):
    """Issue 25: z was the router's logits (seed 000: s = σ(z)) and the vision towers' patch stream."""
    comps = [c for spec in all_specs for _, c in walk(spec.root)]
    assert _patch_stream_clashes(comps) == []
    towers = [c for c in comps if c.program.endswith("_tower") and "vision" in c.title.lower() + c.key]
    assert len({c.program for c in towers}) >= 3
    assert all(r"\psi" in _bases(c) and "z" not in _bases(c) for c in towers)
    # a vision block that writes its stream z again is caught
    block = next(c for c in comps if c.program == "vision_block")
    res = next(s for s in block.steps if s.name == "residual-attn")
    as_z = _with_step(block, "residual-attn", res.latex.replace(r"\psi'_n", "z'_n", 1).replace(r"\psi_n", "z_n"))
    assert as_z.steps != block.steps
    assert _patch_stream_clashes([as_z]) == ["vision_block"]
    embed = next(c for c in comps if c.program == "patch_embed")
    patches = next(s for s in embed.steps if s.name == "patches")
    made = _patch_stream_clashes([_with_step(embed, "patches", patches.latex.replace(r"\psi_i", "z_i"))])
    assert made == ["patch_embed", "patch_embed: step 'patches' makes z without the router matrix"]
