"""Gated DeltaNet: linear attention whose fixed-size state is corrected by the delta rule and decayed by a gate.

Per layer: projections to q, k, v (one fused matrix), an output gate z, a write strength b and a decay input a; a
short causal depthwise convolution (SiLU) over q, k, v whose last kernel − 1 inputs are the decoding "conv state";
L2-normalised queries and keys; per value head a state S of d_k × d_v numbers updated once per token,

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,     o_t = S_tᵀ q_t / √d_k,

with α_t = exp(−exp(A_log) · softplus(a_t + dt_bias)) and β_t = σ(b_t); a gated RMSNorm (RMSNorm(o) ⊙ SiLU(z)) and
the output projection. The state is stored keys by values, as the reference holds it: [heads, d_k, d_v], the
transpose of the paper's S ∈ R^{d_v×d_k} (whose update reads S_{t−1}(α_t(I − β_t k_t k_tᵀ)) + β_t v_t k_tᵀ).

Two forms of the same computation: the recurrent form runs one token at a time from the conv state and the
recurrent state (decoding); the chunked form splits a sequence into chunks of 64 positions, solves each chunk's
delta-rule updates at once (a unit lower-triangular system, the "UT transform") and carries the state from chunk
to chunk (prefill). The program runs both and the executed check compares both with the reference module.

References: "Gated Delta Networks: Improving Mamba2 with Delta Rule" (Yang, Kautz, Hatamizadeh; arXiv:2412.06464);
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length" (arXiv:2406.06484) for the chunked
form; transformers' models/qwen3_5/modeling_qwen3_5.py (Qwen3_5GatedDeltaNet, torch_chunk_gated_delta_rule,
torch_recurrent_gated_delta_rule) for how the reference computes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import (
    PROGRAMS,
    B,
    Ctx,
    Run,
    ctx_colour,
    fmt_eps,
    k,
    options,
    program,
    q,
    reference_call,
    relative_module,
    run_child,
    v,
)
from explorer.model.components.blocks import run_block
from explorer.model.components.decode_check import decode_comparison, decode_detail, reference_decode
from explorer.model.components.linear import linear
from explorer.model.components.serving import LayerKind, StatePart, layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step

CHUNK = 64
"""Positions per chunk of the chunked form (the reference's chunk_size)."""
L2_EPS = 1e-6
"""The epsilon inside the queries' and keys' L2 norm (the reference's l2norm)."""
PROJECTIONS_KEY = "in_proj"
"""The key of a part that makes c, z, b and a in one run, given in place of the four projections (Qwen3-Next's
fused pair, explorer/model/components/fused_deltanet_proj.py)."""
FOUR_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")


@dataclass(frozen=True, slots=True)
class DeltaNetOptions:
    k_heads: int
    v_heads: int
    d_k: int
    d_v: int
    conv_kernel: int
    eps: float
    """The gated RMSNorm's epsilon."""
    chunk: int = CHUNK
    state_dtype: str = "float32"
    """The recurrent state's cache dtype (Qwen3.5's config names it mamba_ssm_dtype)."""
    state_bytes: int = 4
    conv_dtype: str = "bfloat16"
    """The conv state's cache dtype: the model's, as the inputs it holds."""
    conv_bytes: int = 2

    @property
    def state_elements(self) -> int:
        """Numbers in one layer's recurrent state: a d_k × d_v matrix per value head."""
        return self.v_heads * self.d_k * self.d_v

    @property
    def conv_elements(self) -> int:
        """Numbers in one layer's conv state: the last `kernel` inputs of every channel, as the reference's cache holds
        them (LinearAttentionLayer keeps conv_kernel_size columns; the next step's convolution reads kernel − 1 of
        them beside the new input). Mamba-2's conv state is counted the same way."""
        return self.conv_dim * self.conv_kernel

    @property
    def update_terms(self) -> tuple[tuple[str, int], ...]:
        """Multiply-adds of the one-token state update (recurrent_step, conv_step), term by term, for one layer and
        one token: the convolution over its window, then per value head the decay of S, the prediction Sᵀk, the
        correction β(v − Sᵀk), the rank-1 write k ⊗ correction and the read Sᵀq. KDA's decay is per key channel
        (a row of S each) and DeltaNet's per head: d_k × d_v multiplies either way."""
        S = self.state_elements
        return (("conv window", self.conv_elements), ("decay", S), ("Sᵀk", S),
                ("correction", self.value_dim), ("rank-1 write", S), ("Sᵀq", S))

    @property
    def update_flops(self) -> int:
        """2 FLOPs per multiply-add of `update_terms`, beside the projections (as Mamba-2's update is counted)."""
        return 2 * sum(n for _, n in self.update_terms)

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.d_k

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.d_v

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    @property
    def groups(self) -> int:
        """Value heads per query/key head."""
        return self.v_heads // self.k_heads


# ----------------------------------------------------------------------------------------------- the numbers

def causal_conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """SiLU of a depthwise causal convolution over positions: x [B, T, C], w [C, K]; position t sees t−K+1..t."""
    K = w.shape[-1]
    padded = F.pad(x.transpose(1, 2), (K - 1, 0))                                   # [B, C, K−1+T]
    return F.silu(F.conv1d(padded, w[:, None, :], groups=w.shape[0])).transpose(1, 2)


def conv_step(state: torch.Tensor, x_t: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the convolution from the conv state (the previous K−1 inputs, [B, C, K−1]): the output and
    the state shifted by one position, oldest input dropped."""
    window = torch.cat([state, x_t[..., None]], dim=-1)                             # [B, C, K]
    return F.silu((window * w).sum(-1)), window[..., 1:]


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def log_decay(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """log α_t = −exp(A_log) · softplus(a_t + dt_bias), per token and value head (≤ 0, so α_t ∈ (0, 1])."""
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias)


def write_strength(b: torch.Tensor) -> torch.Tensor:
    """β_t = σ(b_t): how much of the delta-rule correction is written."""
    return torch.sigmoid(b)


def recurrent_step(S: torch.Tensor, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, g_t: torch.Tensor,
                   beta_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: S [B, H, d_k, d_v] decays by α_t, the value it predicts for k_t is corrected toward v_t by β_t,
    and q_t reads the new state. q_t, k_t [B, H, d_k]; v_t [B, H, d_v]; g_t, beta_t [B, H]."""
    S = S * decay_factor(g_t)[..., None, None]
    predicted = (S * k_t[..., None]).sum(-2)                                        # Sᵀk: [B, H, d_v]
    correction = (v_t - predicted) * beta_t[..., None]
    S = S + k_t[..., None] * correction[..., None, :]                               # + k (β(v − Sᵀk))ᵀ
    return S, (S * q_t[..., None]).sum(-2)                                          # Sᵀq: [B, H, d_v]


def decay_factor(g: torch.Tensor) -> torch.Tensor:
    """α = exp(log α): the factor every entry of the state is multiplied by before the token is written."""
    return g.exp()


def recurrent_delta_rule(q_: torch.Tensor, k_: torch.Tensor, v_: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form over a sequence, token by token: q, k [B, T, H, d_k] (normalised, q scaled), v
    [B, T, H, d_v], g and beta [B, T, H]; S the state [B, H, d_k, d_v]. Returns o [B, T, H, d_v] and the state."""
    outs = []
    for t in range(q_.shape[1]):
        S, o_t = recurrent_step(S, q_[:, t], k_[:, t], v_[:, t], g[:, t], beta[:, t])
        outs.append(o_t)
    return torch.stack(outs, dim=1), S


def chunked_delta_rule(q_: torch.Tensor, k_: torch.Tensor, v_: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       S: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence, a chunk of positions at a time (shapes as recurrent_delta_rule's).

    Within a chunk, with Γ_ij = exp(Σ_{j<s≤i} log α_s) the decay from position j to i: the writes u (what each
    position actually adds, after the earlier positions of the chunk and the incoming state are subtracted) solve
    (I + tril(diag(β) (Γ ⊙ K Kᵀ), −1)) U = diag(β) (V − diag(γ) K S₀), where γ_i = Γ_i0 is the decay since the chunk
    began; the outputs are diag(γ) Q S₀ + tril(Γ ⊙ Q Kᵀ) U, and the state leaving the chunk is
    γ_C S₀ + (diag(γ_C/γ) K)ᵀ U."""
    Bn, Tn, H, _ = q_.shape
    pad = (-Tn) % chunk
    q_, k_, v_ = (F.pad(x.transpose(1, 2), (0, 0, 0, pad)) for x in (q_, k_, v_))   # [B, H, T', d]
    g, beta = (F.pad(x.transpose(1, 2), (0, pad)) for x in (g, beta))                # [B, H, T']
    n = (Tn + pad) // chunk
    q_, k_, v_ = (x.reshape(Bn, H, n, chunk, -1) for x in (q_, k_, v_))             # [B, H, n, C, d]
    g, beta = (x.reshape(Bn, H, n, chunk) for x in (g, beta))                       # [B, H, n, C]
    cum = g.cumsum(-1)                                                               # log γ_i
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=q_.device).triu(1)
    gamma_pairs = (cum[..., :, None] - cum[..., None, :]).masked_fill(future, float("-inf")).exp()  # Γ [.., C, C]
    kb, vb = k_ * beta[..., None], v_ * beta[..., None]
    system = (kb @ k_.transpose(-1, -2)) * gamma_pairs                               # diag(β)(Γ ⊙ KKᵀ), diag = β
    lower = torch.eye(chunk, device=q_.device) + system.tril(-1)                     # I + strictly lower part
    writes_v = torch.linalg.solve_triangular(lower, vb, upper=False, unitriangular=True)
    writes_k = torch.linalg.solve_triangular(lower, kb * cum.exp()[..., None], upper=False, unitriangular=True)
    attn = ((q_ @ k_.transpose(-1, -2)) * gamma_pairs)                               # tril(Γ ⊙ QKᵀ)
    out = torch.zeros_like(writes_v)
    for c in range(n):
        U = writes_v[:, :, c] - writes_k[:, :, c] @ S                                # [B, H, C, d_v]
        out[:, :, c] = (q_[:, :, c] * cum[:, :, c].exp()[..., None]) @ S + attn[:, :, c] @ U
        to_end = (cum[:, :, c, -1:] - cum[:, :, c]).exp()[..., None]                 # γ_C / γ_i
        S = S * cum[:, :, c, -1].exp()[..., None, None] + (k_[:, :, c] * to_end).transpose(-1, -2) @ U
    return out.reshape(Bn, H, n * chunk, -1)[:, :, :Tn].transpose(1, 2), S


def gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over each head's d_v features with gain w, times SiLU(z) (the output gate)."""
    of = o.float()
    normed = w * (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(o.dtype)
    return (normed * F.silu(z.float())).to(o.dtype)


# --------------------------------------------------------------------------------------------------- spec

def _dims(o: DeltaNetOptions) -> tuple[Dim, Dim, Dim, Dim]:
    return Dim("k_heads", o.k_heads), Dim("v_heads", o.v_heads), Dim("d_k", o.d_k), Dim("d_v", o.d_v)


def gated_rmsnorm_component(ctx: Ctx, o: DeltaNetOptions, *, weight: str, ranges: tuple[IndexRange, ...],
                            citations: tuple[Citation, ...], code: str = "") -> Component:
    """RMSNorm(o) ⊙ γ ⊙ SiLU(z) per value head, one gain of d_v shared by every head."""
    _, vh, _, dv = _dims(o)
    shape = ctx.tokens(vh, dv)
    step = Step(rf"\hat o=\frac{{{ctx_colour('o')}}}{{\sqrt{{\operatorname{{mean}}({ctx_colour('o')}^2)+"
                rf"{fmt_eps(o.eps)}}}}}\odot\gamma\odot\operatorname{{SiLU}}(g)", shape, "gated-norm")
    return Component(
        key="norm", title="Gated RMSNorm", kind="learned", code=code or f"{ctx.reference.prefix}RMSNormGated(head_v_dim, eps=rms_norm_eps)",
        description=f"Normalise each head's {o.d_v} outputs to unit root mean square, scale by a learned gain shared "
                    "by the heads, and multiply by SiLU of the output gate g.",
        inputs=(Port(ctx_colour("o"), shape, "o"), Port("g", shape, "z")), outputs=(Port(r"\hat o", shape, "o_hat"),),
        equations=(step,), steps=(step,), tensors=(ctx.tensor(weight, ranges, (ctx.sym("linear_value_head_dim"),)),),
        citations=citations, program="gated_rmsnorm", options=o,
        notes=("The gain is one vector of d_v, initialised to ones (not the 1 + w of the block's RMSNorms).",),
    )


def conv_component(ctx: Ctx, o: DeltaNetOptions, *, weight: str, ranges: tuple[IndexRange, ...], shape: tuple,
                   citations: tuple[Citation, ...]) -> Component:
    """The short causal depthwise convolution over q, k and v, with SiLU; its last K−1 inputs are the conv state."""
    channels = Dim("conv_channels", o.conv_dim)
    K_ = o.conv_kernel
    step = Step(rf"\tilde\xi_t=\operatorname{{SiLU}}\!\left(\textstyle\sum_{{j=0}}^{{{K_ - 1}}} w_{{j}}\odot "
                rf"\xi_{{t-{K_ - 1}+j}}\right),\quad \xi_{{<1}}=\text{{conv state}}", ctx.tokens(channels), "conv")
    return Component(
        key="conv1d", title="Causal convolution", kind="learned", code="nn.Conv1d(conv_dim, conv_dim, kernel_size, "
        "groups=conv_dim, padding=kernel_size - 1, bias=False)",
        description=f"Mix each of the {o.conv_dim:,} q, k, v channels with its own previous {K_ - 1} positions "
                    f"({K_} taps per channel), then SiLU. Decoding reads the last {K_ - 1} inputs "
                    f"beside the new one; the reference's cache holds the last {K_} (the full kernel), as this site "
                    "counts the conv state of every recurrent layer.",
        inputs=(Port(r"\xi", ctx.tokens(channels), "c"),), outputs=(Port(r"\tilde\xi", ctx.tokens(channels), "c_conv"),),
        equations=(step,), steps=(step,), tensors=(ctx.tensor(weight, ranges, shape),), citations=citations,
        program="causal_conv", reference="-",
        notes=("Depthwise: one kernel of linear_conv_kernel_dim taps per channel, stored [channels, 1, kernel], "
               "without a bias.",),
    )


def decay_component(ctx: Ctx, o: DeltaNetOptions, *, prefix: str, ranges: tuple[IndexRange, ...],
                    citations: tuple[Citation, ...]) -> Component:
    """The decay gate α_t = exp(−exp(A_log)·softplus(a_t + dt_bias)), one per token and value head."""
    vh = Dim("v_heads", o.v_heads)
    step = Step(r"\alpha_t=\exp\!\left(-e^{A_{\log}}\operatorname{softplus}(\alpha^{\mathrm{raw}}_t+b_{dt})\right)", ctx.tokens(vh),
                "decay")
    Hv = ctx.sym("linear_num_value_heads")
    return Component(
        key="decay", title="Decay gate", kind="learned", code="-self.A_log.float().exp() * F.softplus(a + self.dt_bias)",
        description=f"Turn each token's decay input into a factor in (0, 1] for each of the {o.v_heads} value heads: "
                    "the share of the state kept before the token writes.",
        inputs=(Port(r"\alpha^{\mathrm{raw}}", ctx.tokens(vh), "a"),), outputs=(Port(r"\log\alpha", ctx.tokens(vh), "log_alpha"),),
        equations=(step,), steps=(step,),
        tensors=(ctx.tensor(prefix + "A_log", ranges, (Hv,)), ctx.tensor(prefix + "dt_bias", ranges, (Hv,))),
        citations=citations, program="decay_gate", reference="-",
        notes=("A_log and dt_bias are one number per value head: the decay rate exp(A_log) and the bias added to the "
               "decay input before the softplus; both are parameters of the layer module itself.",),
    )


def gated_deltanet(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: DeltaNetOptions,
                   citations: tuple[Citation, ...], projections: Component | None = None,
                   norm_code: str = "") -> Component:
    """The whole Gated DeltaNet layer (the token mixer of a linear-attention block). `projections`: a part keyed
    PROJECTIONS_KEY that makes c, z, b and a from x, in place of the four projections (its steps replace theirs);
    `norm_code`: how the reference builds the gated norm (default: the reference prefix's RMSNormGated)."""
    kh, vh, dk, dv = _dims(o)
    Hk, Hv = ctx.sym("linear_num_key_heads"), ctx.sym("linear_num_value_heads")
    Dk, Dv, K = ctx.sym("linear_key_head_dim"), ctx.sym("linear_value_head_dim"), ctx.sym("linear_conv_kernel_dim")
    d = ctx.size("hidden_size")
    conv_dim = Dim("conv_channels", o.conv_dim)

    def proj(key: str, title: str, d_out, out_dim: Dim, latex: str, what: str) -> Component:
        return linear(ctx, key, title, weight=prefix + key + ".weight", ranges=ranges, d_in="hidden_size",
                      d_out=d_out, out_dim=out_dim, x=x, y=Port(latex, ctx.tokens(out_dim), key),
                      equation=rf"{latex}={x.latex}W_{{{key.removeprefix('in_proj_')}}}",
                      description=f"Project {d:,} features to {what}.", code=f"self.{key}(hidden_states)")

    children = (
        proj("in_proj_qkv", "Query, key and value projection", 2 * Hk * Dk + Hv * Dv, conv_dim, r"\xi",
             f"queries and keys ({o.k_heads} heads of {o.d_k} each) and values ({o.v_heads} heads of {o.d_v}), "
             f"{o.conv_dim:,} channels in all"),
        proj("in_proj_z", "Output-gate projection", Hv * Dv, Dim("v_heads·d_v", o.value_dim), "g",
             f"the output gate, {o.value_dim:,} features"),
        proj("in_proj_b", "Write-strength projection", Hv, vh, r"\beta^{\mathrm{raw}}",
             "one write-strength logit per value head"),
        proj("in_proj_a", "Decay projection", Hv, vh, r"\alpha^{\mathrm{raw}}", "one decay input per value head"),
        conv_component(ctx, o, weight=prefix + "conv1d.weight", ranges=ranges, shape=(2 * Hk * Dk + Hv * Dv, 1, K),
                       citations=citations[1:2]),
        decay_component(ctx, o, prefix=prefix, ranges=ranges, citations=citations[1:2]),
        gated_rmsnorm_component(ctx, o, weight=prefix + "norm.weight", ranges=ranges, citations=citations[:1],
                                code=norm_code),
        linear(ctx, "out_proj", "Output projection", weight=prefix + "out_proj.weight", ranges=ranges, d_in=Hv * Dv,
               d_out="hidden_size", out_dim=ctx.dim("hidden_size"),
               x=Port(r"\hat o", ctx.tokens(Dim("v_heads·d_v", o.value_dim)), "o_hat"),
               y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
               equation=r"\Delta_{\mathrm{attn}}=[\hat o_1;\dots;\hat o_{" + str(o.v_heads) + r"}]W_{\mathrm{out}}",
               description=f"Mix the {o.v_heads} heads' gated outputs ({o.value_dim:,} features) back to {d:,}.",
               code="self.out_proj(core_attn_out)"),
    )
    state = Shape((B, vh, dk, dv))
    qn, kn = q(r"\hat q"), k(r"\hat k")
    S = ctx_colour("S")
    repeat = (rf"{qn}_h,{kn}_h\ \text{{of key head}}\ \lceil h/{o.groups}\rceil" if o.groups > 1 else "")
    made = (projections,) if projections is not None else children[:4]  # what makes c, z, b and a
    mixing = children[4:]  # conv1d, decay, norm, out_proj
    children = (*made, *mixing)
    steps = [
        *(s for c in made for s in c.steps), mixing[0].steps[0],
        Step(rf"[{q('q')};{k('k')};{v('v')}]=\tilde\xi\ \text{{split into}}\ {o.key_dim}+{o.key_dim}+{o.value_dim}"
             rf"\text{{, viewed as heads}}", ctx.tokens(vh, dv), "split"),
        Step(rf"{qn}=\frac{{{q('q')}}}{{\sqrt{{{o.d_k}}}\,\lVert {q('q')}\rVert}},\quad {kn}=\frac{{{k('k')}}}"
             rf"{{\lVert {k('k')}\rVert}}", ctx.tokens(kh, dk), "l2norm"),
        Step(r"\beta_t=\sigma(\beta^{\mathrm{raw}}_t)", ctx.tokens(vh), "beta"),
        mixing[1].steps[0],
    ]
    if o.groups > 1:
        steps.append(Step(repeat, ctx.tokens(vh, dk), "repeat"))
    steps += [
        Step(r"\text{Recurrent form (decoding):}", heading=True, name="recurrent-form"),
        Step(rf"{S}_t=\alpha_t\left(\mathbf{{I}}-\beta_t {kn}_t {kn}_t^{{\top}}\right){S}_{{t-1}}+\beta_t {kn}_t {v('v')}_t^{{\top}},"
             rf"\quad {S}_t\in\mathbb{{R}}^{{{o.d_k}\times{o.d_v}}}\ \text{{per value head}}", state, "state"),
        Step(rf"{ctx_colour('o')}_t={S}_t^{{\top}}{qn}_t", ctx.tokens(vh, dv), "readout"),
        Step(r"\text{Chunked form (prefill), same outputs:}", heading=True, name="chunked-form"),
        # a chunk is entered with the state S_0 the previous chunk left (zero before the first); its writes U are
        # what each position adds once the chunk's earlier positions and S_0 are subtracted
        Step(rf"\text{{in each chunk of }}{o.chunk}\text{{, entered with }}{S}_0:\ \Gamma_{{ij}}=\textstyle\prod_{{j<s\le i}}"
             rf"\alpha_s,\ \bar\alpha_i=\Gamma_{{i0}},\ "
             rf"U=(\mathbf{{I}}+\operatorname{{tril}}(\operatorname{{diag}}(\beta)(\Gamma\odot "
             rf"{kn}{kn}^{{\top}}),-1))^{{-1}}\operatorname{{diag}}(\beta)({v('v')}-\operatorname{{diag}}(\bar\alpha){kn}{S}_0)",
             None, "chunk-writes"),
        Step(rf"{ctx_colour('o')}=\operatorname{{diag}}(\bar\alpha){qn}{S}_0+\operatorname{{tril}}(\Gamma\odot{qn}{kn}"
             rf"^{{\top}})U,\quad {S}_0\leftarrow\bar\alpha_{{{o.chunk}}}{S}_0+(\operatorname{{diag}}(\bar\alpha_{{{o.chunk}}}"
             rf"/\bar\alpha){kn})^{{\top}}U\ \text{{(the next chunk's state)}}", ctx.tokens(vh, dv), "chunked"),
        mixing[2].steps[0], mixing[3].steps[0],
    ]
    return Component(
        key="attn", title="Gated DeltaNet", kind="learned", code=f"{ctx.reference.prefix}GatedDeltaNet(config, layer_idx)",
        description=f"Linear attention over a state of {o.d_k}×{o.d_v} per value head ({o.v_heads} value heads, "
                    f"{o.k_heads} query/key heads): each token decays the state, corrects what it predicts for the "
                    "token's key toward the token's value (the delta rule) and reads it with the query. The state "
                    "does not grow with the context.",
        inputs=(x,), outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=tuple(s for s in steps if s.name in ("state", "readout")), steps=tuple(steps), children=children,
        citations=citations, program="gated_deltanet", options=o,
        extras=(("state per layer", f"{o.v_heads} × {o.d_k} × {o.d_v} = {o.v_heads * o.d_k * o.d_v:,} numbers"),
                ("conv state per layer", f"{o.conv_dim:,} channels × {o.conv_kernel} positions (the full kernel, as the "
                                          "reference's cache holds it)"),
                ("chunk (prefill)", f"{o.chunk} positions")),
        notes=("The recurrent form (one token, from the conv and recurrent states) and the chunked form (a sequence, "
               f"{o.chunk} positions at a time, each chunk entered with the state the previous one left) are one "
               "computation: they give the same outputs and the same final state, and the executed check runs both.",),
    )


# ----------------------------------------------------------------------------------------------- program

def mixer_inputs(comp: Component, run: Run, x: torch.Tensor):
    """The projections and the two gates: c (q, k, v before the convolution), z, log α and β."""
    c, z, b, a = projected(comp, run, x)
    beta = run.rec("beta", write_strength(b))                                         # [B, T, H_v]
    g = run_child(comp, "decay", run, a)                                              # log α: [B, T, H_v]
    return c, z, g, beta


def projected(comp: Component, run: Run, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """c, z, b and a: from the four projections, or from the one part that makes all four."""
    if any(c.key == PROJECTIONS_KEY for c in comp.children):
        part = comp.child(PROJECTIONS_KEY)
        return tuple(PROGRAMS[part.program](part, run.child(relative_module(comp, part)), x))
    return tuple(run_child(comp, key, run, x) for key in FOUR_PROJECTIONS)


def split_heads(o: DeltaNetOptions, mixed: torch.Tensor):
    """q, k [B, T, H_k, d_k] and v [B, T, H_v, d_v] from the convolved channels."""
    B_, T_, _ = mixed.shape
    q_, k_, v_ = torch.split(mixed, [o.key_dim, o.key_dim, o.value_dim], dim=-1)
    return (q_.reshape(B_, T_, o.k_heads, o.d_k), k_.reshape(B_, T_, o.k_heads, o.d_k),
            v_.reshape(B_, T_, o.v_heads, o.d_v))


def prepare_qk(o: DeltaNetOptions, q_: torch.Tensor, k_: torch.Tensor, run: Run | None = None):
    """L2-normalise (in float32), scale the queries by 1/√d_k, repeat each key head over its value heads (head h
    reads key head ⌊h / groups⌋)."""
    qn = l2_normalise(q_.float()) * o.d_k ** -0.5
    kn = l2_normalise(k_.float())
    if run is not None:
        run.rec("l2norm", kn)
    if o.groups > 1:
        qn, kn = qn.repeat_interleave(o.groups, dim=2), kn.repeat_interleave(o.groups, dim=2)
        if run is not None:
            run.rec("repeat", kn)
    return qn, kn


def chunked_form(comp: Component, o: DeltaNetOptions, run: Run, c: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
    """The prefill path: convolve the whole sequence, then the chunked delta rule from a zero state."""
    mixed = run_child(comp, "conv1d", run, c)
    q_, k_, v_ = split_heads(o, mixed)
    run.rec("split", v_)
    qn, kn = prepare_qk(o, q_, k_, run)
    S0 = torch.zeros(c.shape[0], o.v_heads, o.d_k, o.d_v, device=c.device)
    out, S = chunked_delta_rule(qn, kn, v_.float(), g.float(), beta.float(), S0, o.chunk)
    return run.rec("chunked", out.to(c.dtype)), S


def recurrent_form(o: DeltaNetOptions, run: Run, c: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
    """The decoding path, one token at a time: the conv state (last K−1 inputs) and the recurrent state, both
    starting at zero; returns o [B, T, H_v, d_v], the final recurrent state and the final conv state."""
    w = run.w("conv1d.weight")[:, 0]                                                  # [C, K]
    conv_state = torch.zeros(c.shape[0], c.shape[2], o.conv_kernel - 1, device=c.device, dtype=c.dtype)
    S = torch.zeros(c.shape[0], o.v_heads, o.d_k, o.d_v, device=c.device)
    outs = []
    for t in range(c.shape[1]):
        mixed_t, conv_state = conv_step(conv_state, c[:, t], w)
        q_, k_, v_ = split_heads(o, mixed_t[:, None])
        qn, kn = prepare_qk(o, q_, k_)
        S, o_t = recurrent_step(S, qn[:, 0], kn[:, 0], v_[:, 0].float(), g[:, t].float(), beta[:, t].float())
        outs.append(o_t)
    return torch.stack(outs, dim=1).to(c.dtype), S, conv_state


def gated_output(comp: Component, run: Run, o: DeltaNetOptions, out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    B_, T_ = out.shape[:2]
    o_hat = run_child(comp, "norm", run, out, z.reshape(B_, T_, o.v_heads, o.d_v))
    return run_child(comp, "out_proj", run, o_hat.reshape(B_, T_, o.value_dim))


@program("gated_deltanet", role="Linear attention (Gated DeltaNet)", token_mixer=True,
         picture=("linear", "Gated DeltaNet (linear attention, fixed-size state)"), picture_rank=1)
def run_gated_deltanet(comp: Component, run: Run, x: torch.Tensor, *_rest: torch.Tensor) -> list[torch.Tensor]:
    """Both forms: the chunked form's output is the layer's (as the reference computes a sequence); the recurrent
    form's is kept as "_recurrent" for the check. Extra inputs (a block's rotary angles and mask) are not used."""
    o = options(comp, DeltaNetOptions)
    c, z, g, beta = mixer_inputs(comp, run, x)
    out, _ = chunked_form(comp, o, run, c, g, beta)
    rec_out, S, conv_state = recurrent_form(o, run, c, g, beta)
    run.rec("state", S)
    run.rec("_conv_state", conv_state)
    run.rec("readout", rec_out)
    run.rec("_recurrent", gated_output(comp, run.child(prefix="_recurrent-"), o, rec_out, z))
    return [gated_output(comp, run, o, out, z)]


@program("causal_conv")
def run_causal_conv(comp: Component, run: Run, c: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec("conv", causal_conv(c, run.w("weight")[:, 0]))]


@program("decay_gate")
def run_decay_gate(comp: Component, run: Run, a: torch.Tensor) -> list[torch.Tensor]:
    g = log_decay(a, run.w("A_log"), run.w("dt_bias"))
    run.rec("decay", decay_factor(g))
    return [g]


@program("gated_rmsnorm")
def run_gated_rmsnorm(comp: Component, run: Run, o_: torch.Tensor, z: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec(comp.steps[0].name, gated_rmsnorm(o_, z, run.w("weight"), options(comp, DeltaNetOptions).eps))]


@reference_call("gated_deltanet")
def call_gated_deltanet(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """Our chunked and recurrent forms against the reference layer called without a cache (its chunked path), and
    the recurrent form's outputs and final states against the reference decoding through its own cache."""
    x = inputs[0]
    theirs = ref(hidden_states=x)
    return recurrent_comparison(ref, model, x, run, ours, theirs)


def recurrent_comparison(ref, model, x: torch.Tensor, run: Run, ours: torch.Tensor, theirs: torch.Tensor):
    """(ours, theirs, detail) of a delta-rule layer: prefill outputs, then the decode path (decode_check.py)."""
    recurrent = run.recorded[run.prefix + "_recurrent"]
    decoded = reference_decode(ref, model, x)
    ours_dec, theirs_dec = decode_comparison(recurrent, run.recorded[run.prefix + "state"],
                                             run.recorded[run.prefix + "_conv_state"], decoded)
    return (torch.cat([ours.float().flatten(), recurrent.float().flatten(), ours_dec]),
            torch.cat([theirs.float().flatten(), theirs.float().flatten(), theirs_dec]),
            "our chunked and recurrent forms, computed by our program from the layer input, each against the "
            "reference layer called without a cache; " + decode_detail(decoded, x.shape[1]))


@reference_call("gated_rmsnorm")
def call_gated_rmsnorm(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    o_, z = inputs
    B_, T_, H, D = o_.shape
    return ours, ref(o_.reshape(-1, D), z.reshape(-1, D)).reshape(B_, T_, H, D), "with the gate z"


PROGRAMS["recurrent_block"] = run_block
"""A decoder block whose token mixer is a Gated DeltaNet runs as any block; only its reference call differs."""


def recurrent_block(block: Component) -> Component:
    """A decoder block whose token mixer is a recurrence (Gated DeltaNet, KDA): run as any block, called as the
    reference's decoder layer with its cache (call_recurrent_block)."""
    return replace(block, program="recurrent_block")


@reference_call("recurrent_block")
def call_recurrent_block(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference layer takes neither rotary angles nor a mask here: the recurrence is causal by construction
    (a padding mask, which this check does not use, would zero padded positions' inputs)."""
    return ours, ref(inputs[0], position_embeddings=None), "no mask, no rotary: the recurrence is causal"


__all__ = ["DeltaNetOptions", "gated_deltanet", "chunked_delta_rule", "recurrent_delta_rule"]


# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("gated_deltanet")
def deltanet_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """A fixed state per sequence, whatever the context: the delta-rule matrix of every value head and the last
    kernel inputs of every convolution channel (the full kernel, as the reference holds it and as Mamba-2's conv state
    is counted). Nothing grows per token."""
    o = comp.options
    assert isinstance(o, DeltaNetOptions)
    state = StatePart("recurrent state", o.state_elements, o.state_dtype, o.state_bytes,
                      "linear_num_value_heads × linear_key_head_dim × linear_value_head_dim")
    conv = StatePart("conv state", o.conv_elements, o.conv_dtype, o.conv_bytes,
                     "(2 × linear_num_key_heads × linear_key_head_dim + linear_num_value_heads × "
                     "linear_value_head_dim) × linear_conv_kernel_dim", columns=o.conv_kernel)
    flops = (f"2 × ({conv.formula} + 4 × {state.formula} + linear_num_value_heads × linear_value_head_dim) "
             "(conv window, decay, Sᵀk, rank-1 write, Sᵀq, correction)")
    return (LayerKind(0, f"{state.formula} + {conv.formula}", state=(state, conv), update_flops=o.update_flops,
                      update_formula=flops),)
