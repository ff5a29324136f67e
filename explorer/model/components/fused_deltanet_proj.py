"""Gated DeltaNet's input projections fused in two matrices, grouped per key head (Qwen3-Next).

Qwen3.5 projects a token's features with four matrices: in_proj_qkv (queries, keys and values side by side),
in_proj_z (the output gate), in_proj_b (one write-strength logit per value head) and in_proj_a (one decay input per
value head). Qwen3-Next holds the same numbers in two matrices, in_proj_qkvz and in_proj_ba, and orders their
output rows by key head: with r = H_v / H_k value heads per key head, key head i's slice of in_proj_qkvz's output
is [q_i; k_i; v_i; g_i] (d_k + d_k + r·d_v + r·d_v features: the query and key of head i, then the values and
gates of the r value heads that read it), and its slice of in_proj_ba's is [β^raw_i; α^raw_i] (r + r: their
write-strength logits, then their decay inputs). The layer reassembles what the rest of the mixer reads, as the
reference's fix_query_key_value_ordering does:

    ξ = [q_1; …; q_Hk; k_1; …; k_Hk; v_1; …; v_Hk],  g = [g_1; …; g_Hk],
    β^raw = [β^raw_1; …; β^raw_Hk],  α^raw = [α^raw_1; …; α^raw_Hk],

so value head (i − 1)·r + j (j = 1..r) takes the values, gate, write strength and decay input from key head i's
group: the head that the delta rule's repeated queries and keys assign it (head h reads key head ⌈h / r⌉). After
this part the layer is Qwen3.5's Gated DeltaNet, step for step (explorer/model/components/gated_deltanet.py).

The parameter count is the four matrices' sum, d × (2·H_k·d_k + 2·H_v·d_v) + d × 2·H_v; only the order of rows
differs. One property follows from the layout (the reference does not state a reason for it): cutting the fused rows
into equal contiguous shards at group boundaries, as column-parallel sharding does, gives every shard the q, k, v, z,
b and a of the same heads.

References: "Gated Delta Networks: Improving Mamba2 with Delta Rule" (arXiv:2412.06464); transformers'
models/qwen3_next/modeling_qwen3_next.py (Qwen3NextGatedDeltaNet.fix_query_key_value_ordering) for how the
reference splits the fused projections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import Ctx, Run, k, options, program, q, reference_call, run_child, v
from explorer.model.components.gated_deltanet import PROJECTIONS_KEY, DeltaNetOptions
from explorer.model.components.linear import linear
from explorer.model.components.step_terms import Term, registers
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Step


@dataclass(frozen=True, slots=True)
class FusedProjOptions:
    """The head counts and widths that cut the fused rows into key-head groups."""

    k_heads: int
    v_heads: int
    d_k: int
    d_v: int

    @property
    def ratio(self) -> int:
        """Value heads per key head (r)."""
        return self.v_heads // self.k_heads

    @property
    def group_width(self) -> int:
        """One key head's slice of in_proj_qkvz's output: q, k (d_k each), then r values and r gates (d_v each)."""
        return 2 * self.d_k + 2 * self.ratio * self.d_v

    @classmethod
    def of(cls, o: DeltaNetOptions) -> FusedProjOptions:
        return cls(o.k_heads, o.v_heads, o.d_k, o.d_v)


# ----------------------------------------------------------------------------------------------- the numbers

def split_qkvz(o: FusedProjOptions, mixed: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """in_proj_qkvz's output [B, T, H_k·(2d_k + 2r·d_v)] -> q, k [B, T, H_k, d_k] and v, z [B, T, H_k, r·d_v]:
    each key head's group of consecutive features, cut into its query, key, values and gates."""
    grouped = mixed.reshape(*mixed.shape[:-1], o.k_heads, o.group_width)
    rd = o.ratio * o.d_v
    return tuple(torch.split(grouped, [o.d_k, o.d_k, rd, rd], dim=-1))


def split_ba(o: FusedProjOptions, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """in_proj_ba's output [B, T, 2·H_v] -> b, a [B, T, H_k, r]: each key head's r write strengths, then its r
    decay inputs."""
    grouped = mixed.reshape(*mixed.shape[:-1], o.k_heads, 2 * o.ratio)
    b, a = torch.split(grouped, [o.ratio, o.ratio], dim=-1)
    return b, a


def heads_in_order(x: torch.Tensor) -> torch.Tensor:
    """[B, T, H_k, n] -> [B, T, H_k·n]: the groups one after another, key head 1's first."""
    return x.reshape(*x.shape[:-2], -1)


# --------------------------------------------------------------------------------------------------- spec

def fused_deltanet_proj(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: DeltaNetOptions,
                        citations: tuple[Citation, ...]) -> Component:
    """The two fused projections and the regrouping: makes ξ, z, b and a as Qwen3.5's four projections do;
    `prefix` is the DeltaNet layer's module ("...linear_attn.")."""
    f = FusedProjOptions.of(o)
    Hk, Hv = ctx.sym("linear_num_key_heads"), ctx.sym("linear_num_value_heads")
    Dk, Dv = ctx.sym("linear_key_head_dim"), ctx.sym("linear_value_head_dim")
    r, d = f.ratio, ctx.size("hidden_size")
    qkvz_dim, ba_dim = Dim("qkvz", o.k_heads * f.group_width), Dim("ba", 2 * o.v_heads)
    kh, vh = Dim("k_heads", o.k_heads), Dim("v_heads", o.v_heads)
    pi, rho = r"\pi^{\mathrm{qkvz}}", r"\pi^{\mathrm{ba}}"

    def proj(key: str, title: str, d_out, out_dim: Dim, latex: str, what: str) -> Component:
        return linear(ctx, key, title, weight=prefix + key + ".weight", ranges=ranges, d_in="hidden_size",
                      d_out=d_out, out_dim=out_dim, x=x, y=Port(latex, ctx.tokens(out_dim), key),
                      equation=rf"{latex}={x.latex}W_{{{key.removeprefix('in_proj_')}}}",
                      description=f"Project {d:,} features to {what}.", code=f"self.{key}(hidden_states)")

    children = (
        proj("in_proj_qkvz", "Fused query, key, value and gate projection", 2 * Hk * Dk + 2 * Hv * Dv, qkvz_dim, pi,
             f"{o.k_heads} groups of {f.group_width:,} (one per key head: its query and key of {o.d_k}, then the "
             f"values and output gates of its {r} value heads, {r * o.d_v:,} each), {qkvz_dim.size:,} in all"),
        proj("in_proj_ba", "Fused write-strength and decay projection", 2 * Hv, ba_dim, rho,
             f"{o.k_heads} groups of {2 * r} (one per key head: its {r} value heads' write-strength logits, then "
             f"their decay inputs), {ba_dim.size:,} in all"),
    )
    rd = rf"{r}\cdot{o.d_v}"
    qi, ki, vi = q("q") + "_i", k("k") + "_i", v("v") + "_i"
    b_raw, a_raw = r"\beta^{\mathrm{raw}}", r"\alpha^{\mathrm{raw}}"
    each = rf"\quad\text{{for each of the {o.k_heads} key heads}}\ i"
    steps = (
        children[0].steps[0], children[1].steps[0],
        Step(rf"{qi},\ {ki},\ {vi},\ g_i=\operatorname{{split}}({pi}_i;\ {o.d_k},{o.d_k},{rd},{rd}){each}",
             ctx.tokens(kh, Dim("qkvz_group", f.group_width)), "key-groups"),
        Step(rf"{b_raw}_i,\ {a_raw}_i=\operatorname{{split}}({rho}_i;\ {r},{r}){each}",
             ctx.tokens(kh, Dim("ba_group", 2 * r)), "ba-groups"),
        Step(rf"\xi=[{q('q')}_1;\dots;{q('q')}_{{{o.k_heads}}};{k('k')}_1;\dots;{k('k')}_{{{o.k_heads}}};"
             rf"{v('v')}_1;\dots;{v('v')}_{{{o.k_heads}}}]", ctx.tokens(Dim("conv_channels", o.conv_dim)),
             "regroup"),
        Step(r"g=[g_1;\dots;g_{" + str(o.k_heads) + r"}]", ctx.tokens(Dim("v_heads·d_v", o.value_dim)), "gate-heads"),
        Step(rf"{b_raw}=[{b_raw}_1;\dots;{b_raw}_{{{o.k_heads}}}],\quad {a_raw}=[{a_raw}_1;\dots;"
             rf"{a_raw}_{{{o.k_heads}}}]:\ \text{{value head}}\ (i-1)\cdot{r}+j\ \text{{of key head}}\ i",
             ctx.tokens(vh), "write-decay"),
    )
    return Component(
        key=PROJECTIONS_KEY, title="Fused input projections", crumb="Fused projections", kind="learned",
        code="self.fix_query_key_value_ordering(self.in_proj_qkvz(hidden_states), self.in_proj_ba(hidden_states))",
        description=f"Two matrices in place of four: in_proj_qkvz and in_proj_ba, their outputs grouped per key head "
                    f"({o.k_heads} groups, each with the {r} value heads that read it), then reassembled into the "
                    "queries, keys and values the convolution takes, the output gate, and the write-strength and "
                    "decay inputs.",
        inputs=(x,), outputs=(Port(r"\xi", ctx.tokens(Dim("conv_channels", o.conv_dim)), "c"),
                              Port("g", ctx.tokens(Dim("v_heads·d_v", o.value_dim)), "z"),
                              Port(r"\beta^{\mathrm{raw}}", ctx.tokens(vh), "b"),
                              Port(r"\alpha^{\mathrm{raw}}", ctx.tokens(vh), "a")),
        equations=steps[2:4], steps=steps, children=children, citations=citations, program="fused_deltanet_proj",
        options=f,
        extras=(("key-head group", f"{o.d_k} + {o.d_k} + {r}×{o.d_v} + {r}×{o.d_v} = {f.group_width:,} features"),
                ("value heads per key head", f"{r}")),
        notes=("The fused matrices hold exactly the rows of Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b and "
               "in_proj_a, reordered: the parameter count is the same, only the grouping per key head differs.",
               "Cut into equal contiguous shards at group boundaries (as column-parallel sharding cuts rows), the "
               "fused matrices give every shard the q, k, v, z, b and a of the same heads."),
    )


# ----------------------------------------------------------------------------------------------- program

@program("fused_deltanet_proj")
def run_fused_deltanet_proj(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    """ξ [B, T, 2·H_k·d_k + H_v·d_v], z [B, T, H_v·d_v], b and a [B, T, H_v], from the two fused projections."""
    o = options(comp, FusedProjOptions)
    q_, k_, v_, z = split_qkvz(o, run_child(comp, "in_proj_qkvz", run, x))
    run.rec("key-groups", torch.cat([q_, k_, v_, z], dim=-1))
    b, a = split_ba(o, run_child(comp, "in_proj_ba", run, x))
    run.rec("ba-groups", torch.cat([b, a], dim=-1))
    c = run.rec("regroup", torch.cat([heads_in_order(t) for t in (q_, k_, v_)], dim=-1))
    z = run.rec("gate-heads", heads_in_order(z))
    b, a = heads_in_order(b), heads_in_order(a)
    run.rec("write-decay", a)
    run.rec("_b", b)
    return [c, z, b, a]


@reference_call("fused_deltanet_proj")
def call_fused_deltanet_proj(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference layer's own projections and fix_query_key_value_ordering; ξ, z, b and a compared side by
    side (q, k, v flattened per head and concatenated, as its forward does before the convolution)."""
    (x,) = inputs
    q_, k_, v_, z, b, a = ref.fix_query_key_value_ordering(ref.in_proj_qkvz(x), ref.in_proj_ba(x))
    flat = [t.reshape(*t.shape[:2], -1) for t in (q_, k_, v_, z)]
    theirs = torch.cat([*flat, b, a], dim=-1)
    mine = torch.cat([ours, run.recorded[run.prefix + "gate-heads"], run.recorded[run.prefix + "_b"],
                      run.recorded[run.prefix + "write-decay"]], dim=-1)
    return mine, theirs, "ξ, z, b and a side by side, against fix_query_key_value_ordering"


@registers(FusedProjOptions)
def _fused_proj(o: FusedProjOptions) -> tuple[Term, ...]:
    """The head counts and widths cut the fused rows: each shows in the groups' step."""
    return (Term("k_heads", "key-groups", rf"each of the {o.k_heads} key heads"),
            Term("d_k", "key-groups", rf"{o.d_k},{o.d_k},"), Term("d_v", "key-groups", rf"{o.ratio}\cdot{o.d_v}"),
            Term("v_heads", "write-decay", rf"(i-1)\cdot{o.ratio}+j"))


__all__ = ["FusedProjOptions", "fused_deltanet_proj", "split_qkvz", "split_ba"]
