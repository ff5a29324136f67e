"""State-update FLOPs of the delta-rule layers (issue 35): Gated DeltaNet's and KDA's one-token update (the conv
window; per head the decay, Sᵀk, the correction, the rank-1 write and Sᵀq) counted in their own layer_memory with its
formula in config keys, and shown among the model's figures; the expected values are worked by hand from the
published sizes, and a count that leaves the decay out fails them."""

from __future__ import annotations

from conftest import ROOT

from explorer.content.model_content import load_model_content
from explorer.figures.model_figures import derive
from explorer.model.account import account
from explorer.model.components.gated_deltanet import DeltaNetOptions
from explorer.model.families import load_model_spec

QWEN3_NEXT = 153_649_152
"""Qwen3-Next 80B-A3B, 36 Gated DeltaNet layers of 16 key heads, 32 value heads, d_k = d_v = 128, kernel 4:
conv (2·16·128 + 32·128)·4 = 32,768; state 32·128·128 = 524,288, four passes over it 2,097,152; correction 32·128 =
4,096; 2 × 2,134,016 = 4,268,032 per layer, × 36."""
KIMI_LINEAR = 90_316_800
"""Kimi Linear 48B-A3B, 21 KDA layers of 32 heads of 128, kernel 4: conv 3·32·128·4 = 49,152; state 32·128·128 =
524,288, four passes 2,097,152; correction 4,096; 2 × 2,150,400 = 4,300,800 per layer, × 21."""


def update_figure(slug: str):
    spec = load_model_spec(load_model_content(ROOT / "content/models" / slug))
    return derive(spec, account(spec), None).get("state_update_flops_per_token")


def test_deltanet_state_update_flops_by_hand():
    figure = update_figure("qwen3-next-80b-a3b")
    assert figure.value == QWEN3_NEXT
    assert figure.formula.startswith("36 × 2 × ((2 × linear_num_key_heads × linear_key_head_dim + "
                                     "linear_num_value_heads × linear_value_head_dim) × linear_conv_kernel_dim + 4 × ")
    assert "Gated DeltaNet" in figure.label


def test_kda_state_update_flops_by_hand():
    figure = update_figure("kimi-linear-48b-a3b")
    assert figure.value == KIMI_LINEAR
    assert figure.formula.startswith("21 × 2 × (3 × linear_num_heads × linear_head_dim × linear_conv_kernel_dim + 4 × ")
    assert "KDA" in figure.label


def test_decay_left_out_of_the_count_fails(monkeypatch):
    terms = DeltaNetOptions.update_terms.fget
    monkeypatch.setattr(DeltaNetOptions, "update_terms",
                        property(lambda o: tuple(t for t in terms(o) if t[0] != "decay")))
    assert update_figure("qwen3-next-80b-a3b").value != QWEN3_NEXT
    assert update_figure("kimi-linear-48b-a3b").value != KIMI_LINEAR
