"""The Mamba-2 mixer: one input projection split into a gate z, the convolved stream ξ = [x; B; C] and a time step δ;
a short depthwise causal convolution over ξ; a selective state-space recurrence whose state S has the shape
[heads, head_dim, state_size] per sequence; a skip D; a gated, grouped RMSNorm; and the output projection.

The recurrence, one token at a time (the form a decoder runs with a cache):
    Δ_t = max(softplus(δ_t + b_Δ), Δ_min),   ā_t = exp(Δ_t A),   A = −exp(A_log)           (per head)
    S_t = ā_t S_{t−1} + Δ_t x_t B_tᵀ,          y_t = S_t C_t + D x_t                         (per head)
Over a sequence the reference evaluates the same recurrence in chunks of Q positions (the SSD "chunked" form):
inside a chunk as a masked, decaying attention-like product (C Bᵀ ∘ L)(Δ x), across chunks by carrying S from
one chunk boundary to the next. `ssd_chunked` and `ssd_recurrent` below are the two forms; the tests show they
give the same outputs and final state.

References: "Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured State Space
Duality" (Mamba-2, arXiv:2405.21060), sections 3–7; transformers' models/nemotron_h/modeling_nemotron_h.py
(NemotronHMamba2Mixer, mamba2_chunk_scan, mamba2_selective_state_update, causal_conv1d_fn/_update,
NemotronHRMSNormGated).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import B, Ctx, Run, fmt_eps, fmt_num, options, program, reference_call, run_child
from explorer.model.components.decode_check import decode_comparison, decode_detail, reference_decode
from explorer.model.components.linear import linear
from explorer.model.components.serving import LayerKind, StatePart, layer_memory
from explorer.spec.types import Citation, Component, Dim, IndexRange, Port, Shape, Step, TensorSpec


@dataclass(frozen=True, slots=True)
class Mamba2Options:
    heads: int
    """H: SSM heads (mamba_num_heads), each with its own decay A_h, step bias and skip D_h."""
    head_dim: int
    """P: channels per head (mamba_head_dim)."""
    groups: int
    """G: groups sharing one B and one C (n_groups); head h reads group ⌊h·G/H⌋. Also the gated norm's groups."""
    state_size: int
    """N: state entries per channel (ssm_state_size)."""
    conv_kernel: int
    """K: taps of the causal depthwise convolution (conv_kernel)."""
    chunk_size: int
    """Q: positions per chunk of the chunked scan (chunk_size)."""
    eps: float
    dt_min: float
    """Lower clamp of ν (the papers' Δ) over a sequence (the reference's time_step_limit = (time_step_min, ∞))."""
    conv_bias: bool = True
    proj_bias: bool = False
    state_dtype: str = "float32"
    """dtype the SSM state is cached in (config.json: mamba_ssm_cache_dtype)."""
    conv_dtype: str = "bfloat16"
    """dtype of the cached convolution window: the activations' (torch_dtype)."""

    @property
    def inner(self) -> int:
        """H·P: width of x, z and y."""
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """H·P + 2·G·N: the channels the convolution sees (x, B and C)."""
        return self.inner + 2 * self.groups * self.state_size


# ------------------------------------------------------------------------------------------------ spec

SIZE_KEYS = ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel")
"""Config keys of H, P, G, N and K as Nemotron-H names them (another family passes its own to `mamba2`)."""


def mamba2(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, y: Port, o: Mamba2Options,
           code: str, citations: tuple[Citation, ...], size_keys: tuple[str, ...] = SIZE_KEYS) -> Component:
    """The mixer with its tensors under `prefix` (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj); `size_keys`
    name the config keys of heads, head width, B/C groups, state size and kernel taps, for the formulas."""
    H, P, G, N, K = (ctx.sym(n) for n in size_keys)
    inner_sym, conv_sym = H * P, H * P + 2 * G * N
    heads, head_dim, state = Dim("ssm_heads", o.heads), Dim("d_ssm_head", o.head_dim), Dim("d_state", o.state_size)
    inner, conv_dim = Dim("ssm_heads·d_ssm_head", o.inner), Dim("conv_dim", o.conv_dim)
    proj_dim = Dim("d_in_proj", 2 * o.inner + 2 * o.groups * o.state_size + o.heads)
    d = ctx.size("hidden_size")
    zxbcdt = Port(r"[g;\,\xi;\,\delta]", ctx.tokens(proj_dim), "zxbcdt")
    in_proj = linear(ctx, "in_proj", "Input projection", weight=prefix + "in_proj.weight", ranges=ranges,
                     d_in="hidden_size", d_out=2 * inner_sym + 2 * G * N + H, out_dim=proj_dim, x=x, y=zxbcdt,
                     equation=rf"[g;\,\xi;\,\delta]={x.latex}W_{{\mathrm{{in}}}}", bias=o.proj_bias,
                     code="self.in_proj(hidden_states)",
                     description=f"Project {d:,} features to the gate g ({o.inner:,}), the convolved stream ξ = "
                                 f"[x; B; C] ({o.conv_dim:,}) and one raw time step δ per head ({o.heads}).")
    xi = Port(r"\xi", ctx.tokens(conv_dim), "xi")
    xi_conv = Port(r"\tilde\xi", ctx.tokens(conv_dim), "xi_conv")
    conv = causal_conv(ctx, prefix=prefix + "conv1d.", ranges=ranges, x=xi, y=xi_conv, o=o, channels=conv_sym, K=K,
                       citations=citations[:1])
    delta = Port(r"\delta", ctx.tokens(heads), "dt")
    y_ssm = Port("y", ctx.tokens(inner), "y")
    scan = ssd(ctx, prefix=prefix, ranges=ranges, xi=xi_conv, delta=delta, y=y_ssm, o=o, heads_sym=H,
               dims=(heads, head_dim, state), citations=citations)
    z = Port("g", ctx.tokens(inner), "z")
    y_hat = Port(r"\hat y", ctx.tokens(inner), "y_hat")
    norm = gated_rmsnorm(ctx, prefix=prefix + "norm.", ranges=ranges, y=y_ssm, z=z, out=y_hat, o=o, size=inner_sym,
                         citations=citations[:1])
    out_proj = linear(ctx, "out_proj", "Output projection", weight=prefix + "out_proj.weight", ranges=ranges,
                      d_in=inner_sym, d_out="hidden_size", out_dim=ctx.dim("hidden_size"), x=y_hat, y=y,
                      equation=rf"{y.latex}=\hat y\,W_{{\mathrm{{out}}}}", bias=o.proj_bias,
                      code="self.out_proj(scan_output)",
                      description=f"Map the {o.inner:,} normalised channels back to {d:,} features.")
    split = Step(rf"g,\ \xi,\ \delta=\operatorname{{split}}([g;\,\xi;\,\delta];\ {o.inner},{o.conv_dim},{o.heads})",
                 ctx.tokens(conv_dim), "split")
    steps = (in_proj.steps[0], split, *conv.steps, *scan.steps, *norm.steps, out_proj.steps[0])
    return Component(
        key="mamba", title="Mamba-2 mixer", crumb="Mamba-2", kind="learned", code=code,
        description=f"A selective state-space layer: {o.heads} heads of {o.head_dim} channels, each carrying a "
                    f"{o.head_dim} × {o.state_size} state from token to token instead of a cache of keys and values.",
        inputs=(x,), outputs=(y,),
        equations=(Step(r"S_t=\bar a_t\,S_{t-1}+\nu_t\,x_t B_t^{\top},\quad y_t=S_t C_t+D\odot x_t",
                        Shape((B, heads, head_dim, state)), "state"),
                   Step(rf"{y.latex}=\big(\operatorname{{RMSNorm}}_{{G}}(y\odot\operatorname{{SiLU}}(g))\big)"
                        rf"W_{{\mathrm{{out}}}}", y.shape, "out_proj")),
        steps=steps, children=(in_proj, conv, scan, norm, out_proj), citations=citations, program="mamba2",
        options=o, extras=(("state per sequence", f"{o.heads} × {o.head_dim} × {o.state_size} = "
                                                  f"{o.heads * o.head_dim * o.state_size:,} values"),
                           ("conv state per sequence", f"{o.conv_dim:,} channels × {o.conv_kernel} taps"),
                           ("chunk size", f"{o.chunk_size} positions")),
        notes=("No KV cache: a Mamba layer carries its convolution window and its state S, whose size does not "
               "depend on the context length.",),
    )


def causal_conv(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], x: Port, y: Port, o: Mamba2Options,
                channels: sympy.Expr, K: sympy.Expr, citations: tuple[Citation, ...]) -> Component:
    """Depthwise causal convolution of K taps per channel, then SiLU (nn.Conv1d with groups = channels)."""
    bias = r"+b_{\mathrm{conv}}" if o.conv_bias else ""
    step = Step(rf"\tilde\xi_t=\operatorname{{SiLU}}\Big(\textstyle\sum_{{j=0}}^{{{o.conv_kernel - 1}}}w_{{j}}\odot"
                rf"\xi_{{t-{o.conv_kernel - 1}+j}}{bias}\Big),\ \ \xi_{{t<1}}=0", y.shape, "conv")
    tensors: tuple[TensorSpec, ...] = (ctx.tensor(prefix + "weight", ranges, (channels, sympy.Integer(1), K)),)
    if o.conv_bias:
        tensors += (ctx.tensor(prefix + "bias", ranges, (channels,)),)
    return Component(
        key="conv1d", title="Causal convolution", kind="learned", code="self.conv1d (nn.Conv1d, groups=conv_dim)",
        description=f"Mix each of the {o.conv_dim:,} channels of ξ with its own {o.conv_kernel} most recent values "
                    "(the current token included), then apply SiLU.",
        inputs=(x,), outputs=(y,), equations=(step,), steps=(step,), tensors=tensors, citations=citations,
        notes=(f"Decoding keeps the last {o.conv_kernel} columns of ξ per channel as the convolution state.",),
        program="mamba_causal_conv", options=o,
    )


def ssd(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], xi: Port, delta: Port, y: Port, o: Mamba2Options,
        heads_sym: sympy.Expr, dims: tuple[Dim, Dim, Dim], citations: tuple[Citation, ...]) -> Component:
    """The selective scan: discretisation, the state recurrence (computed chunkwise), the read-out and D skip."""
    heads, head_dim, state = dims
    per_group = o.heads // o.groups
    hp = ctx.tokens(heads, head_dim)
    steps = (
        Step(rf"x_t,\ B_t,\ C_t=\operatorname{{split}}(\tilde\xi_t;\ {o.inner},{o.groups * o.state_size},"
             rf"{o.groups * o.state_size}),\ \ B_{{h,t}}=B_{{\lfloor h/{per_group}\rfloor,t}}", hp, "heads"),
        # ν is the papers' Δ, renamed: Δ is what a mixer adds to the residual stream (Δ_mix) on the same page
        Step(rf"\nu_t=\max\!\big(\operatorname{{softplus}}(\delta_t+b_{{\nu}}),\ {fmt_num(o.dt_min)}\big)\ \ "
             r"\text{(a sequence; the reference's one-token path: no clamp)}", ctx.tokens(heads), "dt"),
        Step(r"\bar a_t=\exp\!\big(-\nu_t\,e^{A_{\log}}\big)", ctx.tokens(heads), "decay"),
        Step(r"\text{Recurrent form (decoding):}", heading=True, name="recurrent-form"),
        Step(r"S_t=\bar a_t\,S_{t-1}+\nu_t\,x_t B_t^{\top},\quad S_0=0", Shape((B, heads, head_dim, state)),
             "state"),
        Step(r"y_t=S_t C_t", hp, "read"),
        Step(r"\text{Chunked form (prefill), same outputs:}", heading=True, name="chunked-form"),
        # chunk c (positions 1..Q of it) is entered with the state S_{c-1} the previous chunk left (S_0 = 0)
        Step(rf"\text{{in chunks of {o.chunk_size}}}:\ y_{{c}}=\big(C_cB_c^{{\top}}\odot L_c\big)(\nu_c\odot x_c)"
             r"+\big(C_c\odot e^{-e^{A_{\log}}\mathrm{cumsum}(\nu_c)}\big)S_{c-1},\ \ "
             r"L_{c,ts}=e^{-e^{A_{\log}}\sum_{s<j\le t}\nu_j}\,[s\le t]", None, "chunks"),
        Step(rf"S_{{c}}=e^{{-e^{{A_{{\log}}}}\sum_{{j\le {o.chunk_size}}}\nu_{{c,j}}}}S_{{c-1}}+\textstyle\sum_{{s}}"
             rf"e^{{-e^{{A_{{\log}}}}\sum_{{s<j\le {o.chunk_size}}}\nu_{{c,j}}}}\,\nu_{{c,s}}\,x_{{c,s}}B_{{c,s}}^{{\top}}"
             r"\ \ \text{(the next chunk's state)}", None, "chunk-carry"),
        Step(r"y_t\leftarrow y_t+D\odot x_t", hp, "skip"),
    )
    H = heads_sym
    tensors = (ctx.tensor(prefix + "dt_bias", ranges, (H,)), ctx.tensor(prefix + "A_log", ranges, (H,)),
               ctx.tensor(prefix + "D", ranges, (H,)))
    return Component(
        key="ssm", title="Selective state-space scan", kind="learned",
        code="mamba2_chunk_scan(...) (one token: mamba2_selective_state_update)",
        description=f"Per head, decay the {o.head_dim} × {o.state_size} state by exp(−ν·exp(A_log)), add the token's x "
                    f"outer B, and read it with C; over a sequence, computed in chunks of {o.chunk_size}.",
        inputs=(xi, delta), outputs=(y,),
        equations=(steps[3], steps[4]), steps=steps, tensors=tensors, citations=citations,
        notes=(f"B and C are shared by the {per_group} heads of a group ({o.groups} groups).",
               "ν is the step size the Mamba papers write Δ (renamed here: Δ_mix is the mixer's output). Over a "
               "sequence the reference clamps it below at time_step_min, as the step shows; its one-token path "
               "(mamba2_selective_state_update) leaves it unclamped, which differs only where softplus(δ + b_ν) "
               "falls below that floor. The recurrent and chunked forms are otherwise one computation.",
               "A_log, D and b_ν are per-head vectors; the decay rate −exp(A_log) < 0 keeps every decay in (0, 1)."),
        program="ssd", options=o, reference="-",
    )


def gated_rmsnorm(ctx: Ctx, *, prefix: str, ranges: tuple[IndexRange, ...], y: Port, z: Port, out: Port,
                  o: Mamba2Options, size: sympy.Expr, citations: tuple[Citation, ...]) -> Component:
    """RMSNorm of y ⊙ SiLU(z) over each of G groups of channels, times a learned gain."""
    group = o.inner // o.groups
    step = Step(rf"\hat y=\operatorname{{RMSNorm}}_{{{o.groups}\times{group}}}\big(y\odot\operatorname{{SiLU}}(g)\big)"
                rf"\odot\gamma,\ \ \epsilon={fmt_eps(o.eps)}", out.shape, "gate-norm")
    return Component(
        key="norm", title="Gated RMSNorm", kind="learned", code="NemotronHRMSNormGated(intermediate_size, group_size)",
        description=f"Gate y by SiLU(g), then scale each group of {group:,} channels ({o.groups} groups) to unit "
                    "root mean square and by a learned gain.",
        inputs=(y, z), outputs=(out,), equations=(step,), steps=(step,),
        tensors=(ctx.tensor(prefix + "weight", ranges, (size,)),), citations=citations,
        program="mamba_gated_rmsnorm", options=o,
    )


# ------------------------------------------------------------------------------------------- programs

def conv_full(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x [B, T, C] -> SiLU(causal depthwise conv) [B, T, C]; w [C, 1, K]: output t sees inputs t−K+1..t."""
    K = w.shape[-1]
    out = F.conv1d(x.transpose(1, 2), w, b, padding=K - 1, groups=x.shape[-1])   # [B, C, T + K − 1]
    return F.silu(out[..., :x.shape[1]]).transpose(1, 2)                        # the first T: causal


def conv_step(state: torch.Tensor, x_t: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: shift the K-column window left and append x_t; state [B, C, K], x_t [B, C] -> (new state, out)."""
    state = shift_conv_state(state, x_t)
    out = (state * w[:, 0]).sum(-1)                                            # [B, C]
    return state, F.silu(out + b if b is not None else out)


def shift_conv_state(state: torch.Tensor, x_t: torch.Tensor) -> torch.Tensor:
    """Drop the oldest column, append the newest: [x_{t−K}, ..., x_{t−1}] -> [x_{t−K+1}, ..., x_t]."""
    return torch.cat([state[..., 1:], x_t[..., None]], dim=-1)


def discretize(o: Mamba2Options, dt_raw: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor,
               clamp: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(Δ, log ā = Δ·A) per head: Δ = softplus(δ + b_Δ) (clamped below at dt_min), A = −exp(A_log)."""
    dt = F.softplus(dt_raw.float() + dt_bias.float())
    if clamp:
        dt = dt.clamp(min=o.dt_min)
    return dt, decay_log(dt, A_log)


def decay_log(dt: torch.Tensor, A_log: torch.Tensor) -> torch.Tensor:
    """log ā_t = Δ_t · A with A = −exp(A_log) < 0, so that ā_t = exp(Δ_t A) lies in (0, 1)."""
    return dt * -torch.exp(A_log.float())


def by_head(o: Mamba2Options, BC: torch.Tensor) -> torch.Tensor:
    """[..., G, N] -> [..., H, N]: each group's B (or C) repeated for its H/G consecutive heads."""
    return BC.repeat_interleave(o.heads // o.groups, dim=-2)


def ssd_chunked(x: torch.Tensor, dt: torch.Tensor, a_log: torch.Tensor, Bh: torch.Tensor, Ch: torch.Tensor,
                Q: int, initial: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence S_t = ā_t S_{t−1} + Δ_t x_t B_tᵀ, y_t = S_t C_t over a sequence, in chunks of Q positions.

    x [b, T, H, P]; dt, a_log [b, T, H]; Bh, Ch [b, T, H, N] -> (y [b, T, H, P], final state [b, H, P, N])."""
    b, T, H, P = x.shape
    N = Bh.shape[-1]
    pad = (-T) % Q  # padded positions have Δ = 0 and log ā = 0: they neither write nor decay the state

    def chunks(t: torch.Tensor) -> torch.Tensor:
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
        return t.reshape(b, -1, Q, *t.shape[2:])                              # [b, c, Q, ...]

    X, Bc, Cc = chunks(x.float() * dt[..., None]), chunks(Bh.float()), chunks(Ch.float())
    A = chunks(a_log).cumsum(dim=2)                                           # [b, c, Q, H]: Σ_{r≤t} log ā_r
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    gaps = (A[:, :, :, None] - A[:, :, None, :]).masked_fill(~causal[..., None], float("-inf"))
    L = torch.exp(gaps)                                                       # [b, c, t, s, H]: Π_{s<r≤t} ā_r
    scores = torch.einsum("bcthn,bcshn->bctsh", Cc, Bc)                       # C_t · B_s per head
    y_inside = torch.einsum("bctsh,bcshp->bcthp", scores * L, X)
    to_end = torch.exp(A[:, :, -1:] - A)                                      # decay from s to the chunk's end
    written = torch.einsum("bcsh,bcshn,bcshp->bchpn", to_end, Bc, X)           # each chunk's own contribution
    S = torch.zeros(b, H, P, N, dtype=X.dtype, device=x.device) if initial is None else initial.float()
    starts = []
    for c in range(X.shape[1]):  # carry the state across chunk boundaries
        starts.append(S)
        S = torch.exp(A[:, c, -1])[..., None, None] * S + written[:, c]
    S0 = torch.stack(starts, dim=1)                                           # [b, c, H, P, N]
    y_carried = torch.einsum("bcthn,bchpn->bcthp", Cc, S0) * torch.exp(A)[..., None]
    y = (y_inside + y_carried).reshape(b, -1, H, P)[:, :T]
    return y, S


def ssd_recurrent(x: torch.Tensor, dt: torch.Tensor, a_log: torch.Tensor, Bh: torch.Tensor, Ch: torch.Tensor,
                  initial: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence one token at a time (as decoding runs it): same arguments and results as ssd_chunked."""
    b, T, H, P = x.shape
    S = torch.zeros(b, H, P, Bh.shape[-1], device=x.device) if initial is None else initial.float()
    ys = []
    for t in range(T):
        S, y_t = ssm_step(S, x[:, t].float(), dt[:, t], a_log[:, t], Bh[:, t].float(), Ch[:, t].float())
        ys.append(y_t)
    return torch.stack(ys, dim=1), S


def ssm_step(S: torch.Tensor, x_t: torch.Tensor, dt_t: torch.Tensor, a_log_t: torch.Tensor, B_t: torch.Tensor,
             C_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S [b, H, P, N]: S ← exp(Δ A) S + Δ x Bᵀ; y = S C; x_t [b, H, P], dt_t [b, H], B_t, C_t [b, H, N]."""
    write = (dt_t[..., None] * x_t)[..., None] * B_t[:, :, None, :]          # [b, H, P, N]
    S = torch.exp(a_log_t)[..., None, None] * S + write
    return S, torch.einsum("bhpn,bhn->bhp", S, C_t)


def gate(z: torch.Tensor) -> torch.Tensor:
    """SiLU(z): the gate from in_proj's first block, applied before the norm (norm_before_gate=False)."""
    return F.silu(z.float())


def gate_and_norm(o: Mamba2Options, y: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """RMSNorm over groups of H·P/G channels of y ⊙ SiLU(z), times w; y, z [..., H·P]."""
    g = y.float() * gate(z)
    grouped = g.reshape(*g.shape[:-1], o.groups, -1)
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + o.eps)
    return w * grouped.reshape(g.shape).to(y.dtype)


@program("mamba_causal_conv")
def run_causal_conv(comp: Component, run: Run, xi: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, Mamba2Options)
    return [run.rec("conv", conv_full(xi, run.w("weight"), run.w("bias") if o.conv_bias else None))]


@program("ssd")
def run_ssd(comp: Component, run: Run, xi: torch.Tensor, dt_raw: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, Mamba2Options)
    b, T, _ = xi.shape
    x, Bg, Cg = xi.split([o.inner, o.groups * o.state_size, o.groups * o.state_size], dim=-1)
    x = run.rec("heads", x.reshape(b, T, o.heads, o.head_dim))                # [B, T, H, P]
    Bh = by_head(o, Bg.reshape(b, T, o.groups, o.state_size))                  # [B, T, H, N]
    Ch = by_head(o, Cg.reshape(b, T, o.groups, o.state_size))
    dt, a_log = discretize(o, dt_raw, run.w("dt_bias"), run.w("A_log"))
    run.rec("dt", dt)
    run.rec("decay", torch.exp(a_log))
    y, S = ssd_chunked(x, dt, a_log, Bh, Ch, o.chunk_size)
    run.rec("state", S)
    run.rec("read", y)
    y = run.rec("skip", y + run.w("D").float()[:, None] * x.float())
    return [y.reshape(b, T, o.inner).to(xi.dtype)]


@program("mamba_gated_rmsnorm")
def run_gated_rmsnorm(comp: Component, run: Run, y: torch.Tensor, z: torch.Tensor) -> list[torch.Tensor]:
    return [run.rec("gate-norm", gate_and_norm(options(comp, Mamba2Options), y, z, run.w("weight")))]


@program("mamba2", role="State space (Mamba-2)", token_mixer=True, picture=("mamba", "Mamba-2 (fixed-size state)"),
         picture_rank=3)
def run_mamba2(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, Mamba2Options)
    zxbcdt = run_child(comp, "in_proj", run, x)
    z, xi, dt_raw = zxbcdt.split([o.inner, o.conv_dim, o.heads], dim=-1)
    run.rec("split", xi)
    xi = run_child(comp, "conv1d", run, xi)
    y = run_child(comp, "ssm", run, xi, dt_raw)
    y_hat = run_child(comp, "norm", run, y, z)
    return [run_child(comp, "out_proj", run, y_hat)]


def mamba2_recurrent(o: Mamba2Options, weights: dict[str, torch.Tensor], x: torch.Tensor,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole mixer one token at a time, with its two states: weights by their names inside the mixer
    ("in_proj.weight", ...). Returns (outputs [B, T, d], conv state [B, C, K], SSM state [B, H, P, N])."""
    b, T, _ = x.shape
    conv_w, conv_b = weights["conv1d.weight"], weights.get("conv1d.bias")
    conv_state = torch.zeros(b, o.conv_dim, o.conv_kernel, dtype=x.dtype)
    S = torch.zeros(b, o.heads, o.head_dim, o.state_size)
    outs = []
    for t in range(T):
        zxbcdt = F.linear(x[:, t], weights["in_proj.weight"], weights.get("in_proj.bias"))
        z, xi, dt_raw = zxbcdt.split([o.inner, o.conv_dim, o.heads], dim=-1)
        conv_state, xi = conv_step(conv_state, xi, conv_w, conv_b)
        x_t, B_t, C_t = xi.split([o.inner, o.groups * o.state_size, o.groups * o.state_size], dim=-1)
        x_t = x_t.reshape(b, o.heads, o.head_dim)
        dt, a_log = discretize(o, dt_raw, weights["dt_bias"], weights["A_log"])
        S, y = ssm_step(S, x_t.float(), dt, a_log, by_head(o, B_t.reshape(b, o.groups, o.state_size)).float(),
                        by_head(o, C_t.reshape(b, o.groups, o.state_size)).float())
        y = (y + weights["D"].float()[:, None] * x_t.float()).reshape(b, o.inner)
        y_hat = gate_and_norm(o, y, z, weights["norm.weight"])
        outs.append(F.linear(y_hat, weights["out_proj.weight"], weights.get("out_proj.bias")))
    return torch.stack(outs, dim=1), conv_state, S


@reference_call("mamba2")
def call_mamba2(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """Our chunked program against the reference mixer called without a cache; then our whole mixer one token at a
    time (mamba2_recurrent, its conv window and SSM state carried from zero) against the reference decoding through
    its own cache: per-position outputs and the final SSM and conv states."""
    (x,) = inputs
    theirs = ref(x)
    weights = {name.removeprefix(run.module): w for name, w in run.weights.items() if name.startswith(run.module)}
    recurrent, conv_state, S = mamba2_recurrent(options(comp, Mamba2Options), weights, x)
    decoded = reference_decode(ref, model, x)
    ours_dec, theirs_dec = decode_comparison(recurrent, S, conv_state, decoded)
    return (torch.cat([ours.float().flatten(), ours_dec]), torch.cat([theirs.float().flatten(), theirs_dec]),
            "our chunked program, computed from the mixer input, against the reference mixer called without a cache; "
            + decode_detail(decoded, x.shape[1]))


@reference_call("mamba_causal_conv")
def call_conv(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference's conv1d is a plain nn.Conv1d padded by K − 1 on both sides: keep the first T outputs."""
    (xi,) = inputs
    theirs = F.silu(ref(xi.transpose(1, 2))[..., :xi.shape[1]]).transpose(1, 2)
    return ours, theirs, "nn.Conv1d output truncated to the first T positions, then SiLU"


@reference_call("mamba_gated_rmsnorm")
def call_gated_norm(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    y, z = inputs
    return ours, ref(y, gate=z), "called with the gate z"


# ---------------------------------------------------------------------------------------------- serving memory

STATE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@layer_memory("mamba2")
def mamba2_memory(comp: Component, values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """A fixed state per sequence, whatever the context: the SSM state S (mamba_ssm_cache_dtype) and the last
    conv_kernel columns of x, B and C the causal convolution reads (the activations' dtype)."""
    o = comp.options
    assert isinstance(o, Mamba2Options)
    state = StatePart("SSM state", o.heads * o.head_dim * o.state_size, o.state_dtype, STATE_DTYPE_BYTES[o.state_dtype],
                      "mamba_num_heads × mamba_head_dim × ssm_state_size")
    conv = StatePart("conv state", o.conv_dim * o.conv_kernel, o.conv_dtype, STATE_DTYPE_BYTES.get(o.conv_dtype, 2),
                     "(mamba_num_heads × mamba_head_dim + 2 × n_groups × ssm_state_size) × conv_kernel",
                     columns=o.conv_kernel)
    channels = o.heads * o.head_dim  # the width of x and y
    # the one-token recurrence: conv window, decay S ⊙ ā, write Δ·x Bᵀ (added), read S C, then Δ·x and the D skip
    update = 2 * (conv.elements + 3 * state.elements + 2 * channels)
    return (LayerKind(0, f"{state.formula} + {conv.formula}", state=(state, conv), update_flops=update),)
