"""Kimi Delta Attention (KDA): the gated delta rule with a decay per key channel instead of one per head.

Per layer: three projections to q, k, v, a short causal depthwise convolution (SiLU) over them whose last inputs are
the decoding "conv state"; L2-normalised queries and keys; a forget gate through a low-rank pair of projections,
α_t = exp(−exp(A_log,h) · softplus(W_fb W_fa x_t + dt_bias)) ∈ (0, 1]^{d_k}, one factor for every key channel of
every head; a write strength β_t = σ(x_t W_b) per head; per head a state S of d_k × d_v numbers updated once per
token,

    S_t = (I − β_t k_t k_tᵀ) diag(α_t) S_{t−1} + β_t k_t v_tᵀ,     o_t = S_tᵀ q_t / √d_k,

then an RMSNorm of each head's read-out gated by σ of a low-rank output gate (W_gb W_ga x), and the output
projection. Gated DeltaNet (explorer/model/components/gated_deltanet.py) is the special case α_t = a_t·1, one decay
for all of a head's channels: KDA keeps the same state and delta rule and lets each key channel forget at its own
rate, as Gated Linear Attention does.

Two forms of the same computation, as for Gated DeltaNet: the recurrent form one token at a time (decoding), the
chunked form 64 positions at a time with the state carried from chunk to chunk (prefill). The per-channel decay
enters the chunked form as a decay vector between every pair of positions of a chunk (exp(G_i − G_j), G the
cumulative log decay), so no factor above 1 is ever formed. The program runs both and the check compares both with
the reference layer.

References: "Kimi Linear: An Expressive, Efficient Attention Architecture" (Kimi Team, arXiv:2510.26692), section 3;
"Gated Delta Networks" (arXiv:2412.06464); "Gated Linear Attention Transformers with Hardware-Efficient Training"
(arXiv:2312.06635) for the channel-wise gate; transformers' models/kimi_linear/modeling_kimi_linear.py
(KimiLinearDeltaAttention, KimiLinearForgetGate, KimiLinearRMSNormGated, chunk_kimi_delta_attention,
recurrent_kimi_delta_attention) for how the reference computes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import (
    B,
    Ctx,
    Run,
    ctx_colour,
    first_steps,
    fmt_eps,
    k,
    options,
    program,
    q,
    reference_call,
    run_child,
    v,
)
from explorer.model.components.gated_deltanet import (
    DeltaNetOptions,
    conv_component,
    conv_step,
    l2_normalise,
    recurrent_comparison,
)
from explorer.model.components.linear import linear
from explorer.model.components.serving import LayerKind, StatePart, layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step


@dataclass(frozen=True, slots=True)
class KDAOptions(DeltaNetOptions):
    """Gated DeltaNet's sizes with as many key as value heads (Kimi Linear's linear_num_heads) and d_k = d_v
    (linear_head_dim); the state, conv and chunk conventions are DeltaNet's."""


# ----------------------------------------------------------------------------------------------- the numbers

def channel_log_decay(raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, heads: int) -> torch.Tensor:
    """log α_t = −exp(A_log,h) · softplus(raw_t + dt_bias): raw [B, T, H·d_k] -> [B, T, H, d_k], one rate per head
    scaling a decay input per channel (≤ 0, so α ∈ (0, 1])."""
    B_, T_, _ = raw.shape
    g = (raw.float() + dt_bias.float()).reshape(B_, T_, heads, -1)                      # [B, T, H, d_k]
    return -A_log.float().reshape(1, 1, heads, 1).exp() * F.softplus(g)


def recurrent_step(S: torch.Tensor, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, g_t: torch.Tensor,
                   beta_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: S [B, H, d_k, d_v] decays row by row (key channel c by α_t,c), the value it predicts for k_t is
    corrected toward v_t by β_t, and q_t reads the new state. q_t, k_t, g_t [B, H, d_k]; v_t [B, H, d_v]; beta_t [B, H]."""
    S = S * g_t.exp()[..., None]                                                        # diag(α_t) S
    predicted = (S * k_t[..., None]).sum(-2)                                            # Sᵀk: [B, H, d_v]
    correction = (v_t - predicted) * beta_t[..., None]
    S = S + k_t[..., None] * correction[..., None, :]
    return S, (S * q_t[..., None]).sum(-2)


def recurrent_kda(q_: torch.Tensor, k_: torch.Tensor, v_: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form over a sequence: q, k, g [B, T, H, d_k] (q, k normalised, q scaled), v [B, T, H, d_v],
    beta [B, T, H]; S [B, H, d_k, d_v]. Returns o [B, T, H, d_v] and the final state."""
    outs = []
    for t in range(q_.shape[1]):
        S, o_t = recurrent_step(S, q_[:, t], k_[:, t], v_[:, t], g[:, t], beta[:, t])
        outs.append(o_t)
    return torch.stack(outs, dim=1), S


def chunked_kda(q_: torch.Tensor, k_: torch.Tensor, v_: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                S: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence a chunk at a time (shapes as recurrent_kda's), the state carried between chunks.

    In a chunk entered with state S₀, with G_i the cumulative log decay of positions 1..i (a vector over key
    channels) and D_ij = exp(G_i − G_j) for j ≤ i (every entry ≤ 1): the writes U solve
    (I + A) U = diag(β)(V − (K ⊙ e^G) S₀) with A_ij = β_i Σ_c K_ic K_jc D_ij,c for j < i; the outputs are
    (Q ⊙ e^G) S₀ + P U with P_ij = Σ_c Q_ic K_jc D_ij,c for j ≤ i; the state leaving is
    diag(e^{G_C}) S₀ + (K ⊙ e^{G_C − G})ᵀ U."""
    Bn, Tn, H, _ = q_.shape
    pad = (-Tn) % chunk
    q_, k_, v_, g = (F.pad(x.transpose(1, 2), (0, 0, 0, pad)) for x in (q_, k_, v_, g))  # [B, H, T', d]
    beta = F.pad(beta.transpose(1, 2), (0, pad))                                          # [B, H, T']
    n = (Tn + pad) // chunk
    q_, k_, v_, g = (x.reshape(Bn, H, n, chunk, -1) for x in (q_, k_, v_, g))            # [B, H, n, C, d]
    beta = beta.reshape(Bn, H, n, chunk)
    G = g.cumsum(-2)                                                                      # [B, H, n, C, d_k]
    past = torch.ones(chunk, chunk, dtype=torch.bool, device=q_.device).tril()          # j ≤ i
    diff = (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~past[..., None], float("-inf"))
    D = diff.exp()                                                                        # [.., C, C, d_k]
    kk = torch.einsum("...ic,...jc,...ijc->...ij", k_, k_, D)
    A = (beta[..., None] * kk).tril(-1)
    lower = torch.eye(chunk, device=q_.device) + A
    P = torch.einsum("...ic,...jc,...ijc->...ij", q_, k_, D)
    out = torch.zeros(Bn, H, n, chunk, v_.shape[-1], device=q_.device)
    for c in range(n):
        Gc = G[:, :, c]
        rhs = beta[:, :, c, :, None] * (v_[:, :, c] - (k_[:, :, c] * Gc.exp()) @ S)
        U = torch.linalg.solve_triangular(lower[:, :, c], rhs, upper=False, unitriangular=True)
        out[:, :, c] = (q_[:, :, c] * Gc.exp()) @ S + P[:, :, c] @ U
        S = S * Gc[:, :, -1].exp()[..., None] + (k_[:, :, c] * (Gc[:, :, -1:] - Gc).exp()).transpose(-1, -2) @ U
    return out.reshape(Bn, H, n * chunk, -1)[:, :, :Tn].transpose(1, 2), S


def sigmoid_gated_rmsnorm(o: torch.Tensor, gate: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over each head's d_v features with gain w, times σ(gate), in float32 as the reference computes it."""
    of = o.float()
    normed = w.float() * (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps))
    return (normed * torch.sigmoid(gate.float())).to(o.dtype)


def per_head_decay(g: torch.Tensor) -> torch.Tensor:
    """A mutation for the tests: the decay averaged over each head's channels (Gated DeltaNet's one decay per head)."""
    return g.mean(-1, keepdim=True).expand_as(g)


# --------------------------------------------------------------------------------------------------- spec

def _low_rank(ctx: Ctx, prefix: str, ranges: tuple[IndexRange, ...], x: Port, *, key_a: str, key_b: str,
              latent: str, out: Port, out_dim: Dim, what: str) -> tuple[Component, Component]:
    """Two bias-free projections through a d_k-wide latent: d -> d_k -> heads·d_k."""
    dk = ctx.sym("linear_head_dim")
    c_port = Port(latent, ctx.tokens("linear_head_dim"), key_a)
    a = linear(ctx, key_a, f"{what.capitalize()} down-projection", weight=prefix + key_a + ".weight", ranges=ranges,
               d_in="hidden_size", d_out=dk, out_dim=ctx.dim("linear_head_dim"), x=x, y=c_port,
               equation=rf"{latent}={x.latex}W_{{{key_a[0].upper()}A}}",
               description=f"Compress each token to a {ctx.size('linear_head_dim')}-feature latent for the {what}.",
               code=f"self.{key_a}(hidden_states)")
    b = linear(ctx, key_b, f"{what.capitalize()} up-projection", weight=prefix + key_b + ".weight", ranges=ranges, d_in=dk,
               d_out=ctx.sym("linear_num_heads") * dk, out_dim=out_dim, x=c_port, y=out,
               equation=rf"{out.latex}={latent}W_{{{key_b[0].upper()}B}}",
               description=f"Expand the latent to one {what} value per key channel of every head "
                           f"({out_dim.size:,} outputs).", code=f"self.{key_b}({key_a})")
    return a, b


def forget_gate(ctx: Ctx, o: KDAOptions, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port,
                citations: tuple[Citation, ...]) -> Component:
    """α_t per head and key channel: a low-rank decay input, its bias, a softplus and one rate per head."""
    ch = Dim("heads·d_k", o.key_dim)
    raw = Port(r"\alpha^{\mathrm{raw}}", ctx.tokens(ch), "f_raw")
    f_a, f_b = _low_rank(ctx, prefix, ranges, x, key_a="f_a_proj", key_b="f_b_proj", latent=r"c^{\alpha}", out=raw,
                         out_dim=ch, what="forget gate")
    heads = Dim("heads", o.k_heads)
    log_alpha = Port(r"\log\alpha", ctx.tokens(heads, Dim("d_k", o.d_k)), "log_alpha")
    decay = Step(r"\alpha_t=\exp\!\left(-e^{A_{\log,h}}\operatorname{softplus}(\alpha^{\mathrm{raw}}_t+b_{dt})\right)"
                 rf"\in(0,1]^{{{o.d_k}}}\ \text{{per head}}", log_alpha.shape, "decay")
    H = ctx.sym("linear_num_heads")
    rate = Component(
        key="rate", title="Decay rates", kind="learned", code="-exp(A_log) * softplus(g + dt_bias)",
        description=f"Add a learned bias to each of the {o.key_dim:,} decay inputs, pass it through a softplus and "
                    f"scale it by its head's rate: one factor in (0, 1] per key channel of each of the {o.k_heads} heads.",
        inputs=(raw,), outputs=(log_alpha,), equations=(decay,), steps=(decay,),
        tensors=(ctx.tensor(prefix + "dt_bias", ranges, (H * ctx.sym("linear_head_dim"),)),
                 ctx.tensor(prefix + "A_log", ranges, (1, 1, H, 1))),
        citations=citations, program="kda_decay_rate", reference="-", options=o,
        notes=("dt_bias has one entry per key channel of every head; A_log one per head (stored [1, 1, heads, 1]): "
               "the head's rate scales its channels' softplus inputs. Both are parameters of the forget gate module "
               "itself.",),
    )
    children = (f_a, f_b, rate)
    return Component(
        key="forget_gate", title="Forget gate (per key channel)", crumb="Forget gate", kind="learned",
        code="KimiLinearForgetGate(config)",
        description=f"Turn each token into a decay factor in (0, 1] for every one of the {o.d_k} key channels of each "
                    f"of the {o.k_heads} heads ({o.key_dim:,} factors): the share of each row of the state kept "
                    "before the token writes. Gated DeltaNet has one such factor per head.",
        inputs=(x,), outputs=(log_alpha,), equations=(decay,),
        steps=first_steps(children, "f_a_proj", "f_b_proj", "rate"), children=children,
        citations=citations, program="kda_forget_gate", options=o,
    )


def gated_norm(ctx: Ctx, o: KDAOptions, *, weight: str, ranges: tuple[IndexRange, ...], eps: float,
               citations: tuple[Citation, ...]) -> Component:
    """RMSNorm(o) ⊙ γ ⊙ σ(g) per head, one gain of d_v shared by every head."""
    shape = ctx.tokens(Dim("heads", o.v_heads), Dim("d_v", o.d_v))
    step = Step(rf"\hat o=\frac{{{ctx_colour('o')}}}{{\sqrt{{\operatorname{{mean}}({ctx_colour('o')}^2)+"
                rf"{fmt_eps(eps)}}}}}\odot\gamma\odot\sigma(g)", shape, "gated-norm")
    return Component(
        key="o_norm", title="Sigmoid-gated RMSNorm", kind="learned", code="KimiLinearRMSNormGated(head_dim, eps)",
        description=f"Normalise each head's {o.d_v} outputs to unit root mean square, scale by a learned gain shared "
                    "by the heads, and multiply by the sigmoid of the output gate g (Gated DeltaNet multiplies by "
                    "SiLU of its gate).",
        inputs=(Port(ctx_colour("o"), shape, "o"), Port("g", shape, "gate")), outputs=(Port(r"\hat o", shape, "o_hat"),),
        equations=(step,), steps=(step,), tensors=(ctx.tensor(weight, ranges, (ctx.sym("linear_head_dim"),)),),
        citations=citations, program="sigmoid_gated_rmsnorm", options=o,
    )


def kda(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, o: KDAOptions,
        citations: tuple[Citation, ...]) -> Component:
    """The whole KDA layer (the token mixer of a Kimi Linear block)."""
    heads, dk, dv = Dim("heads", o.k_heads), Dim("d_k", o.d_k), Dim("d_v", o.d_v)
    H, Dk, K = ctx.sym("linear_num_heads"), ctx.sym("linear_head_dim"), ctx.sym("linear_conv_kernel_dim")
    d = ctx.size("hidden_size")
    ch = Dim("heads·d_k", o.key_dim)

    def proj(key: str, title: str, latex: str, what: str) -> Component:
        return linear(ctx, key, title, weight=prefix + key + ".weight", ranges=ranges, d_in="hidden_size",
                      d_out=H * Dk, out_dim=ch, x=x, y=Port(latex, ctx.tokens(ch), key),
                      equation=rf"{latex}={x.latex}W_{{{key[0]}}}", description=f"Project {d:,} features to {what}.",
                      code=f"self.{key}(hidden_states)")

    g_a, g_b = _low_rank(ctx, prefix, ranges, x, key_a="g_a_proj", key_b="g_b_proj", latent=r"c^{g}",
                         out=Port("g", ctx.tokens(ch), "gate"), out_dim=ch, what="output gate")
    children = (
        proj("q_proj", "Query projection", r"\xi_{q}", f"{o.k_heads} query heads of {o.d_k}"),
        proj("k_proj", "Key projection", r"\xi_{k}", f"{o.k_heads} key heads of {o.d_k}"),
        proj("v_proj", "Value projection", r"\xi_{v}", f"{o.v_heads} value heads of {o.d_v}"),
        conv_component(ctx, o, weight=prefix + "conv1d.weight", ranges=ranges, shape=(3 * H * Dk, 1, K),
                       citations=citations[:1]),
        forget_gate(ctx, o, prefix=prefix + "forget_gate.", ranges=ranges, x=x, citations=citations[1:2]),
        linear(ctx, "b_proj", "Write-strength projection", weight=prefix + "b_proj.weight", ranges=ranges,
               d_in="hidden_size", d_out=H, out_dim=heads, x=x, y=Port(r"\beta^{\mathrm{raw}}", ctx.tokens(heads), "b"),
               equation=rf"\beta^{{\mathrm{{raw}}}}={x.latex}W_{{b}}", code="self.b_proj(hidden_states)",
               description="Project each token to one write-strength logit per head."),
        g_a, g_b,
        gated_norm(ctx, o, weight=prefix + "o_norm.weight", ranges=ranges, eps=o.eps, citations=citations[2:3]),
        linear(ctx, "o_proj", "Output projection", weight=prefix + "o_proj.weight", ranges=ranges, d_in=H * Dk,
               d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=Port(r"\hat o", ctx.tokens(ch), "o_hat"),
               y=Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),
               equation=r"\Delta_{\mathrm{attn}}=[\hat o_1;\dots;\hat o_{" + str(o.v_heads) + r"}]W_{O}",
               description=f"Mix the {o.v_heads} heads' gated outputs ({o.value_dim:,} features) back to {d:,}.",
               code="self.o_proj(output)"),
    )
    qn, kn, S, S0 = q(r"\hat q"), k(r"\hat k"), ctx_colour("S"), ctx_colour("S") + "_0"
    state = Shape((B, heads, dk, dv))
    steps = (
        *first_steps(children, "q_proj", "k_proj", "v_proj"),
        Step(r"\xi=[\xi_{q};\xi_{k};\xi_{v}]", ctx.tokens(Dim("conv_channels", o.conv_dim)), "concat"),
        *first_steps(children, "conv1d"),
        Step(rf"[{q('q')};{k('k')};{v('v')}]=\tilde\xi\ \text{{split into}}\ {o.key_dim}+{o.key_dim}+{o.value_dim}"
             r"\text{, viewed as heads}", ctx.tokens(heads, dv), "split"),
        Step(rf"{qn}=\frac{{{q('q')}}}{{\sqrt{{{o.d_k}}}\,\lVert {q('q')}\rVert}},\quad {kn}=\frac{{{k('k')}}}"
             rf"{{\lVert {k('k')}\rVert}}", ctx.tokens(heads, dk), "l2norm"),
        *first_steps(children, "b_proj"),
        Step(r"\beta_t=\sigma(\beta^{\mathrm{raw}}_t)", ctx.tokens(heads), "beta"),
        *next(c for c in children if c.key == "forget_gate").steps,
        Step(rf"{S}_t=\left(\mathbf{{I}}-\beta_t {kn}_t {kn}_t^{{\top}}\right)\operatorname{{diag}}(\alpha_t){S}_{{t-1}}"
             rf"+\beta_t {kn}_t {v('v')}_t^{{\top}}",
             state, "state"),
        Step(rf"{ctx_colour('o')}_t={S}_t^{{\top}}{qn}_t", ctx.tokens(heads, dv), "readout"),
        Step(rf"\text{{the same in chunks of {o.chunk}, entered with }}{S0}:\ \Gamma_{{ij}}=\textstyle\prod_{{j<s\le i}}"
             rf"\alpha_s\in(0,1]^{{{o.d_k}}},\ \bar\alpha_i=\Gamma_{{i0}},\ U=(\mathbf{{I}}+\operatorname{{tril}}(\operatorname{{diag}}(\beta)"
             rf"[{kn}_i^{{\top}}\operatorname{{diag}}(\Gamma_{{ij}}){kn}_j],-1))^{{-1}}\operatorname{{diag}}(\beta)({v('v')}"
             rf"-({kn}\odot\bar\alpha){S0})", ctx.tokens(heads, dv), "chunked"),
        Step(rf"{ctx_colour('o')}=({qn}\odot\bar\alpha){S0}+\operatorname{{tril}}[{qn}_i^{{\top}}\operatorname{{diag}}"
             rf"(\Gamma_{{ij}}){kn}_j]\,U,\quad {S0}\leftarrow\operatorname{{diag}}(\bar\alpha_{{{o.chunk}}}){S0}+({kn}"
             rf"\odot\Gamma_{{{o.chunk}\cdot}})^{{\top}}U\ \text{{(the next chunk's state)}}", ctx.tokens(heads, dv),
             "chunk-out"),
        *first_steps(children, "g_a_proj", "g_b_proj", "o_norm", "o_proj"),
    )
    return Component(
        key="attn", title="Kimi Delta Attention", crumb="KDA", kind="learned", code="KimiLinearDeltaAttention(config, "
        "layer_idx)",
        description=f"Linear attention over a state of {o.d_k}×{o.d_v} per head ({o.k_heads} heads): each token decays "
                    f"every key channel of the state at its own rate, corrects what the state predicts for the token's "
                    "key toward its value (the delta rule) and reads it with the query. The state does not grow with "
                    "the context.",
        inputs=(x,), outputs=(Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn"),),
        equations=tuple(s for s in steps if s.name in ("decay", "state", "readout")), steps=steps, children=children,
        citations=citations, program="kda", options=o,
        extras=(("state per layer", f"{o.v_heads} × {o.d_k} × {o.d_v} = {o.state_elements:,} numbers"),
                ("decay", f"per key channel: {o.key_dim:,} factors per token"),
                ("chunk (prefill)", f"{o.chunk} positions")),
        notes=("The recurrent form (one token, from the conv and recurrent states) and the chunked form (a sequence, "
               f"{o.chunk} positions at a time, the state carried across chunks) compute the same outputs; the "
               "executed check runs both against the reference layer.",
               "ᾱ_i is the decay since the chunk began (the product of α over its first i positions) and Γ_ij the "
               "decay from position j to i, both vectors over the key channels."),
    )


# ----------------------------------------------------------------------------------------------- program

def split_heads(o: KDAOptions, mixed: torch.Tensor):
    """q, k, v [B, T, H, d] from the convolved channels."""
    B_, T_, _ = mixed.shape
    q_, k_, v_ = torch.split(mixed, [o.key_dim, o.key_dim, o.value_dim], dim=-1)
    return (q_.reshape(B_, T_, o.k_heads, o.d_k), k_.reshape(B_, T_, o.k_heads, o.d_k),
            v_.reshape(B_, T_, o.v_heads, o.d_v))


def prepare_qk(o: KDAOptions, q_: torch.Tensor, k_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return l2_normalise(q_.float()) * o.d_k ** -0.5, l2_normalise(k_.float())


def recurrent_form(o: KDAOptions, run: Run, c: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
    """Decoding, one token at a time from zero conv and recurrent states: o [B, T, H, d_v], the final recurrent
    state and the final conv state (the last K − 1 inputs)."""
    w = run.w("conv1d.weight")[:, 0]                                                    # [C, K]
    conv_state = torch.zeros(c.shape[0], c.shape[2], o.conv_kernel - 1, device=c.device, dtype=c.dtype)
    S = torch.zeros(c.shape[0], o.v_heads, o.d_k, o.d_v, device=c.device)
    outs = []
    for t in range(c.shape[1]):
        mixed_t, conv_state = conv_step(conv_state, c[:, t], w)
        q_, k_, v_ = split_heads(o, mixed_t[:, None])
        qn, kn = prepare_qk(o, q_, k_)
        S, o_t = recurrent_step(S, qn[:, 0], kn[:, 0], v_[:, 0].float(), g[:, t], beta[:, t].float())
        outs.append(o_t)
    return torch.stack(outs, dim=1).to(c.dtype), S, conv_state


def gated_output(comp: Component, run: Run, o: KDAOptions, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    B_, T_ = out.shape[:2]
    gate = run_child(comp, "g_b_proj", run, run_child(comp, "g_a_proj", run, x))
    o_hat = run_child(comp, "o_norm", run, out, gate.reshape(B_, T_, o.v_heads, o.d_v))
    return run_child(comp, "o_proj", run, o_hat.reshape(B_, T_, o.value_dim))


@program("kda", role="Linear attention (KDA)", token_mixer=True, picture=(
    "linear", "Kimi Delta Attention (linear attention, fixed-size state, decay per key channel)"), picture_rank=2)
def run_kda(comp: Component, run: Run, x: torch.Tensor, *_rest: torch.Tensor) -> list[torch.Tensor]:
    """Both forms: the chunked form's output is the layer's (as the reference computes a sequence); the recurrent
    form's is kept as "_recurrent" for the check. A block's rotary angles and mask, if given, are not used."""
    o = options(comp, KDAOptions)
    c = run.rec("concat", torch.cat([run_child(comp, key, run, x) for key in ("q_proj", "k_proj", "v_proj")], -1))
    beta = run.rec("beta", torch.sigmoid(run_child(comp, "b_proj", run, x)))           # [B, T, H]
    g = run_child(comp, "forget_gate", run, x)                                          # log α: [B, T, H, d_k]
    mixed = run_child(comp, "conv1d", run, c)
    q_, k_, v_ = split_heads(o, mixed)
    run.rec("split", v_)
    qn, kn = prepare_qk(o, q_, k_)
    run.rec("l2norm", kn)
    S0 = torch.zeros(x.shape[0], o.v_heads, o.d_k, o.d_v, device=x.device)
    out, _ = chunked_kda(qn, kn, v_.float(), g, beta.float(), S0, o.chunk)
    run.rec("chunk-out", run.rec("chunked", out.to(x.dtype)))
    rec_out, S, conv_state = recurrent_form(o, run, c, g, beta)
    run.rec("state", S)
    run.rec("_conv_state", conv_state)
    run.rec("readout", rec_out)
    run.rec("_recurrent", gated_output(comp, run.child(prefix="_recurrent-"), o, rec_out, x))
    return [gated_output(comp, run, o, out.to(x.dtype), x)]


@program("kda_forget_gate")
def run_forget_gate(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    raw = run_child(comp, "f_b_proj", run, run_child(comp, "f_a_proj", run, x))
    return [run_child(comp, "rate", run, raw)]


@program("kda_decay_rate")
def run_decay_rate(comp: Component, run: Run, raw: torch.Tensor) -> list[torch.Tensor]:
    g = channel_log_decay(raw, run.w("A_log"), run.w("dt_bias"), options(comp, KDAOptions).k_heads)
    run.rec("decay", g.exp())
    return [g]


@program("sigmoid_gated_rmsnorm")
def run_sigmoid_gated_rmsnorm(comp: Component, run: Run, o_: torch.Tensor, gate: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec("gated-norm", sigmoid_gated_rmsnorm(o_, gate, run.w("weight"), options(comp, KDAOptions).eps))]


@reference_call("kda")
def call_kda(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """As Gated DeltaNet's: both forms against the reference without a cache, then the decode path against the
    reference's own cache (outputs and final states)."""
    return recurrent_comparison(ref, model, inputs[0], run, ours, ref(hidden_states=inputs[0]))


@reference_call("kda_forget_gate")
def call_forget_gate(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference gate returns log α with the same [B, T, heads, d_k] layout."""
    return ours, ref(inputs[0]), "log decay per head and key channel"


@reference_call("sigmoid_gated_rmsnorm")
def call_sigmoid_gated_rmsnorm(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    o_, gate = inputs
    return ours, ref(o_, gate), "with the gate g"


# ---------------------------------------------------------------------------------------------- serving memory

@layer_memory("kda")
def kda_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """A fixed state per sequence, whatever the context: every head's delta-rule matrix and the conv state of the
    q, k and v channels. Nothing grows per token."""
    o = comp.options
    assert isinstance(o, KDAOptions)
    state = StatePart("recurrent state", o.state_elements, o.state_dtype, o.state_bytes,
                      "linear_num_heads × linear_head_dim × linear_head_dim")
    conv = StatePart("conv state", o.conv_elements, o.conv_dtype, o.conv_bytes,
                     "3 × linear_num_heads × linear_head_dim × linear_conv_kernel_dim", columns=o.conv_kernel)
    flops = (f"2 × ({conv.formula} + 4 × {state.formula} + linear_num_heads × linear_head_dim) "
             "(conv window, decay per key channel, Sᵀk, rank-1 write, Sᵀq, correction)")
    return (LayerKind(0, f"{state.formula} + {conv.formula}", state=(state, conv), update_flops=o.update_flops,
                      update_formula=flops),)


__all__ = ["KDAOptions", "kda", "chunked_kda", "recurrent_kda", "channel_log_decay"]
