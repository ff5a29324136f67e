"""Every family's first model with one config value made hostile (negative, zero, huge, the wrong type, removed),
read the way `--add-model` and the build read it: a one-line ContentError or a spec, never another exception
(issue 37: tracebacks on bad input). The cases found by the sweep run in the default tier, each failing on the
code before its fix; the whole sweep (about 10,000 cases) in the slow tier."""

from __future__ import annotations

import copy

import pytest
from conftest import ROOT

from explorer.content.model_content import load_all_models
from explorer.errors import ContentError
from explorer.model.families import FAMILIES

VALUES = (-1, 0, 10**12, "x", None, 1.5, [], {}, True, -10**9)
"""None removes the key (it then takes the reference default)."""


def first_models() -> dict:
    out: dict = {}
    for content in load_all_models(ROOT / "content"):
        out.setdefault(content.meta.family, content)
    return out


def mutated(config: dict, path: tuple[str, ...], value) -> dict:
    raw = copy.deepcopy(dict(config))
    table = raw
    for key in path[:-1]:
        table = table[key]
    if value is None:
        table.pop(path[-1], None)
    else:
        table[path[-1]] = value
    return raw


def outcome(family: str, raw: dict) -> str:
    """'refused', 'built', or the exception that escaped."""
    try:
        FAMILIES[family].build_spec("hostile", raw, "hostile/model.toml")
    except ContentError as e:
        assert all("\n" not in p for p in e.problems)
        return "refused"
    except Exception as e:  # noqa: BLE001  (the point: nothing else may escape)
        return f"{type(e).__name__}: {e}"
    return "built"


FOUND = [  # (family, key path, value): each raised ValueError, ZeroDivisionError or TypeError before
    ("deepseek_v3", ("rope_scaling", "beta_fast"), 0), ("deepseek_v3", ("rope_scaling", "beta_slow"), -1),
    ("deepseek_v3", ("rope_scaling", "original_max_position_embeddings"), 0),
    ("deepseek_v4", ("compress_rope_theta",), 0), ("deepseek_v4", ("hc_eps",), -1),
    ("gemma3", ("text_config", "query_pre_attn_scalar"), 0), ("gemma4", ("vision_soft_tokens_per_image",), 0),
    ("gemma4", ("vision_soft_tokens_per_image",), -1), ("llama4", ("text_config", "interleave_moe_layer_step"), 0),
    ("kimi_k25", ("text_config", "rope_scaling", "beta_fast"), -1), ("gpt_oss", ("rope_scaling", "beta_fast"), 0),
    ("qwen3_5", ("text_config", "intermediate_size"), None),
]


@pytest.mark.parametrize("family,path,value", FOUND)
def test_a_value_the_sweep_found_gives_one_line_not_a_traceback(family, path, value):
    assert outcome(family, mutated(first_models()[family].config, path, value)) in ("refused", "built")


def _paths(table: dict, prefix: tuple[str, ...] = ()):
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _paths(value, prefix + (key,))
        else:
            yield prefix + (key,)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_single_hostile_value_escapes_as_a_traceback(family):
    content = first_models()[family]
    escaped = [(".".join(p), v, result) for p in _paths(dict(content.config)) for v in VALUES
               if (result := outcome(family, mutated(content.config, p, v))) not in ("refused", "built")]
    assert escaped == []
