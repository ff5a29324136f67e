"""The whole-model picture (issue 25, item 4): every layer numbered, each layer's attention kind as its config's
layer pattern says (read here from the config, or the reference config class, not from the spec), dense or MoE,
the shared expert, the vision tower, MTP, and experts lit by a real run of the router program."""

from __future__ import annotations

import dataclasses
import re
import tomllib

import pytest
from conftest import ROOT, write_cache_entry

from explorer.content.model_content import load_model_content
from explorer.execute.picture_routing import route_example, seeded_router
from explorer.model.families import load_model_spec
from explorer.views.model_picture import describe, draw

CELL = re.compile(r'<g class="layer ([a-z ]+)"><title>layer (\d+): ')
ROW = re.compile(r'class="rowlabel">(\d+)(?:–(\d+))?</text>')


def content(slug: str):
    return load_model_content(ROOT / "content/models" / slug)


def config(slug: str) -> dict:
    return tomllib.loads((ROOT / "content/models" / slug / "model.toml").read_text())["config"]


def cells(svg: str) -> dict[int, str]:
    """Layer number (from 0, as the tensor names) -> the attention kind its cell is drawn as."""
    found = [(int(n), css) for css, n in CELL.findall(svg)]
    assert len(found) == len(dict(found)), "each layer is drawn once"
    return dict(found)


def gemma3_expected() -> list[str]:
    from transformers import Gemma3TextConfig

    types = Gemma3TextConfig(**{k: v for k, v in config("gemma-3-27b")["text_config"].items()
                                if k in ("num_hidden_layers", "sliding_window")}).layer_types
    return ["sliding" if t == "sliding_attention" else "global" for t in types]


def llama4_expected() -> list[str]:
    from transformers import Llama4TextConfig

    # no_rope_layers[i] is 1 where layer i uses RoPE (a chunked layer), 0 where it is a global NoPE layer
    flags = Llama4TextConfig(num_hidden_layers=config("llama-4-scout-17b-16e")["text_config"]["num_hidden_layers"],
                             attention_chunk_size=8192).no_rope_layers
    return ["chunked" if f else "nope" for f in flags]


EXPECTED = {
    "gemma-3-27b": gemma3_expected,
    "qwen3.5-27b": lambda: ["linear" if t == "linear_attention" else "full"
                            for t in config("qwen3.5-27b")["text_config"]["layer_types"]],
    "nemotron-3-nano-30b-a3b": lambda: [{"M": "mamba", "E": "none", "*": "nope", "-": "none"}[c]
                                        for c in config("nemotron-3-nano-30b-a3b")["hybrid_override_pattern"]],
    "llama-4-scout-17b-16e": llama4_expected,
    # one ratio per layer (and one for the MTP layer after them): 0 a plain window, 4 compressed and sparse, 128
    # heavily compressed
    "deepseek-v4-flash": lambda: [{0: "sliding", 4: "csa", 128: "hca"}[r] for r in
                                  config("deepseek-v4-flash")["compress_ratios"][:43]],
    "kimi-k2": lambda: ["mla"] * 61,
}


def mismatches(svg: str, expected: list[str]) -> list[int]:
    """Layers (counted from 0, as the tensor names) whose cell's kind differs from the expected one."""
    drawn = cells(svg)
    assert sorted(drawn) == list(range(len(expected))), "every layer number once, none missing"
    return [n for n, kind in enumerate(expected) if drawn[n] != kind]


@pytest.mark.parametrize("slug", EXPECTED)
def test_every_layer_is_numbered_and_drawn_as_its_config_says(slug):
    svg = draw(describe(load_model_spec(content(slug)), slug))
    expected = EXPECTED[slug]()
    assert mismatches(svg, expected) == []
    covered = [n for a, b in ROW.findall(svg) for n in range(int(a), int(b or a) + 1)]
    assert covered == list(range(len(expected))), "row labels give every layer number, in order, once"
    for n in range(len(expected)):
        assert f'class="num">{n}</text>' in svg


def test_a_wrong_layer_pattern_shows_in_the_picture():
    """Swap two layers' types in Qwen3.5's config: the picture follows the spec built from it, so the check
    against the published pattern finds exactly those two layers."""
    c = content("qwen3.5-27b")
    text = dict(c.config["text_config"])
    types = list(text["layer_types"])
    types[0], types[3] = types[3], types[0]
    text["layer_types"] = types
    wrong = dataclasses.replace(c, config={**c.config, "text_config": text})
    svg = draw(describe(load_model_spec(wrong), "Qwen3.5-27B"))
    assert mismatches(svg, EXPECTED["qwen3.5-27b"]()) == [0, 3]


def test_dense_moe_shared_vision_and_mtp_are_shown():
    kimi = describe(load_model_spec(content("kimi-k2.5")), "Kimi K2.5")
    svg = draw(kimi)
    # one bar per layer, plus one in the legend
    assert svg.count('class="ffn dense"') == 1 + 1 and svg.count('class="ffn moe"') == 60 + 1
    assert "MoonViT vision tower" in svg and 'class="expert lit shared"' in svg
    assert "Images enter through: MoonViT vision tower" in kimi.caption
    v3 = draw(describe(load_model_spec(content("deepseek-v3")), "DeepSeek-V3"))
    assert "Multi-token prediction module" in v3 and svg.count("vision") > v3.count("vision")
    llama = draw(describe(load_model_spec(content("llama-3.1-8b")), "Llama"))
    assert 'class="expert' not in llama and "vision" not in llama and llama.count('class="ffn dense"') == 32 + 1


def grouped_selection_problems(selected: tuple[int, ...], experts: int, groups: int, kept: int, k: int) -> list[str]:
    """What a grouped top-k (DeepSeek-V3's router: k experts from the best `kept` of `groups` groups) cannot give."""
    out = []
    if len(set(selected)) != k:
        out.append(f"{len(set(selected))} experts, not {k}")
    if len({e // (experts // groups) for e in selected}) > kept:
        out.append(f"experts from {len({e // (experts // groups) for e in selected})} groups, more than {kept}")
    return out


def test_lit_experts_are_a_real_routing_by_the_models_rule():
    spec = load_model_spec(content("deepseek-v3"))
    r = config("deepseek-v3")
    routing = route_example(spec)
    assert routing is not None and routing.experts == r["n_routed_experts"] == 256
    assert grouped_selection_problems(routing.selected, 256, r["n_group"], r["topk_group"],
                                      r["num_experts_per_tok"]) == []
    # the old picture's evenly spread "example" lit one expert in each of the 8 groups: no grouped router gives that
    assert grouped_selection_problems(tuple(range(0, 256, 32)), 256, 8, 4, 8) == ["experts from 8 groups, more than 4"]
    picture = describe(spec, "DeepSeek-V3", routing)
    routed = [c for c in re.findall(r'class="(expert[a-z ]*)"', draw(picture)) if "shared" not in c]
    assert len(routed) == 256 and tuple(i for i, c in enumerate(routed) if "lit" in c) == routing.selected
    assert "seeded random router weights" in picture.caption and f"in layer {routing.layer} for" in picture.caption
    assert route_example(spec) == routing, "deterministic: the same seed selects the same experts"


def test_the_lit_experts_are_those_transformers_router_selects_on_the_same_weights():
    """The routing is the model's rule run at full size: transformers' DeepseekV3TopkRouter, built from Kimi K2's
    config (384 experts, top 8, sigmoid with a correction bias), given the same seeded weights and hidden state,
    selects the same experts for the same token."""
    import torch
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    spec = load_model_spec(content("kimi-k2"))
    c = config("kimi-k2")
    seeded = seeded_router(spec)
    reference = DeepseekV3TopkRouter(DeepseekV3Config(
        hidden_size=c["hidden_size"], n_routed_experts=c["n_routed_experts"], num_experts_per_tok=c["num_experts_per_tok"],
        n_group=c["n_group"], topk_group=c["topk_group"], norm_topk_prob=c["norm_topk_prob"],
        routed_scaling_factor=c["routed_scaling_factor"]))
    prefix = f"model.layers.{seeded.layer}.mlp.gate."
    reference.load_state_dict({"weight": seeded.weights[prefix + "weight"],
                               "e_score_correction_bias": seeded.weights[prefix + "e_score_correction_bias"]})
    (x,) = seeded.inputs
    with torch.no_grad():
        _, _, indices = reference(x)
    last = indices.view(*x.shape[:-1], -1)[0, -1]  # the first sequence's last token, as the picture shows
    assert route_example(spec).selected == tuple(sorted(int(i) for i in last))


def test_layer_lists_count_from_zero_as_tensor_names_and_name_a_regular_spacing():
    """The caption's layer numbers, written by hand: they count as model.layers.N does (layers 5, 11, 17, 23 are
    the 6th, 12th, 18th and 24th), so a reader finds each listed layer's tensors under the number shown."""
    from explorer.views.model_picture import layer_list

    assert layer_list((5, 11, 17, 23), 24) == "layers 5, 11, …, 23 (every 6th)"
    assert layer_list(tuple(i for i in range(24) if i % 6 != 5), 24) == "every layer except 5, 11, …, 23 (every 6th)"
    assert layer_list((1, 3, 5, 7), 8) == "layers 1, 3, …, 7 (every 2nd)"
    assert layer_list((0, 21, 42, 63), 64) == "layers 0, 21, …, 63 (every 21st)"
    assert layer_list((0, 11, 22, 33), 34) == "layers 0, 11, …, 33 (every 11th)"
    assert layer_list((0, 1, 2, 6), 10) == "layers 0–2, 6"  # not evenly spaced: runs
    assert layer_list((3,), 10) == "layer 3"


def test_gemma3_caption_names_its_global_layers():
    """Gemma 3 27B: 62 layers, every 6th global (the reference config's layer_types), the rest sliding."""
    picture = describe(load_model_spec(content("gemma-3-27b")), "Gemma 3 27B")
    assert "layers 5, 11, …, 59 (every 6th)." in picture.caption
    assert "every layer except 5, 11, …, 59 (every 6th)." in picture.caption


def test_the_routing_is_cached_and_read_back_and_a_damaged_entry_is_rerun(tmp_path, monkeypatch):
    """The build reads the picture's routing from the cache beside the torch stages: the entry written is the one read
    back (no rerun), a damaged entry is run again, and a dense model's "no routing" is cached too."""
    from explorer.execute import picture_routing as pr

    spec = load_model_spec(content("deepseek-v3"))
    routing = pr.picture_routing(spec, tmp_path)
    (entry,) = tmp_path.glob("deepseek-v3-picture-*.json")

    def must_not_run(_spec):
        raise AssertionError("read from the cache, not run")

    with monkeypatch.context() as m:
        m.setattr(pr, "route_example", must_not_run)
        assert pr.picture_routing(spec, tmp_path) == routing
    write_cache_entry(entry, {"layer": 3})  # damaged (though sealed): no experts, no selection
    assert pr.picture_routing(spec, tmp_path) == routing
    dense = load_model_spec(content("llama-3.1-8b"))
    assert pr.picture_routing(dense, tmp_path) is None
    with monkeypatch.context() as m:
        m.setattr(pr, "route_example", must_not_run)
        assert pr.picture_routing(dense, tmp_path) is None
