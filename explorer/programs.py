"""Executable equations of the DeepSeek-V3 family: one small torch program per component, one line per step,
in the pages' notation (row vectors times weights: F.linear(x, W) is x Wᵀ with W stored [out, in]).

Each program records every named step through `run.rec(step_name, tensor)`, using the names of the spec's
Step list, so the executor can trace shapes at full size (meta device) and compare numbers with transformers
at a tiny config (CPU). Weights are keyed by checkpoint name relative to the component's module, with the
routed experts stacked along a leading dimension.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .spec.deepseek_v3 import DeepseekV3Hyperparameters, softmax_scale
from .spec.types import Component

Tensor = torch.Tensor


@dataclass
class Run:
    """One execution: the config, the weights, and the steps recorded so far (in order)."""

    config: DeepseekV3Hyperparameters
    weights: dict[str, Tensor]
    recorded: dict[str, Tensor] = field(default_factory=dict)
    prefix: str = ""
    """Prepended to recorded names (a parent splicing a child's steps, e.g. "expert-")."""
    module: str = ""
    """Prefix of weight names for the current component ("model.layers.3.self_attn.")."""

    def rec(self, name: str, tensor: Tensor) -> Tensor:
        self.recorded[self.prefix + name] = tensor
        return tensor

    def w(self, name: str) -> Tensor:
        return self.weights[self.module + name]

    def child(self, module: str = "", prefix: str = "") -> Run:
        """A view for a sub-module: same record, deeper weight prefix, optional step-name prefix."""
        return Run(self.config, self.weights, self.recorded, self.prefix + prefix, self.module + module)


# ------------------------------------------------------------------------------------------------ leaves

def rmsnorm(run: Run, name: str, x: Tensor, weight: Tensor) -> Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + run.config.rms_norm_eps)
    return run.rec(name, weight * y.to(x.dtype))


def run_rmsnorm(comp: Component, run: Run, x: Tensor) -> list[Tensor]:
    return [rmsnorm(run, comp.steps[0].name, x, run.w("weight"))]


def run_linear(comp: Component, run: Run, x: Tensor) -> list[Tensor]:
    return [run.rec(comp.steps[0].name, F.linear(x, run.w("weight")))]


def run_embedding(comp: Component, run: Run, ids: Tensor) -> list[Tensor]:
    return [run.rec("lookup", F.embedding(ids, run.w("weight")))]


def run_head(comp: Component, run: Run, x: Tensor) -> list[Tensor]:
    return [run.rec("logits", F.linear(x, run.w("weight")))]


# -------------------------------------------------------------------------------------------- attention

def yarn_inverse_frequencies(run: Run, device: torch.device) -> tuple[Tensor, float]:
    """θ_j, the ramp γ_j between the correction dimensions, ω_j; and YaRN's attention factor."""
    c, r = run.config, run.config.rope_scaling
    d = c.qk_rope_head_dim
    theta = run.rec("theta", 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, device=device).float() / d)))

    def correction_dim(rotations: float) -> float:
        return d * math.log(r.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(c.rope_theta))

    low = max(math.floor(correction_dim(r.beta_fast)), 0)
    high: float = min(math.ceil(correction_dim(r.beta_slow)), d - 1)
    high = high + 0.001 if low == high else high  # as transformers does, to avoid dividing by zero
    ramp = run.rec("ramp", torch.clamp((torch.arange(d // 2, device=device).float() - low) / (high - low), 0, 1))
    omega = run.rec("inv-freq", ramp * theta / r.factor + (1 - ramp) * theta)

    def mscale(m: float) -> float:
        return 0.1 * m * math.log(r.factor) + 1.0 if r.factor > 1 else 1.0

    return omega, mscale(r.mscale) / mscale(r.mscale_all_dim)


def rotate(x: Tensor, angles: Tensor, factor: float = 1.0) -> Tensor:
    """RoPE on adjacent pairs (x_2j, x_2j+1); the result lists rotated evens then odds, as transformers'
    interleaved variant does (q and k share the layout, so q·k is unchanged).

    angles: [T, pairs]; x: [T, d_rope], [B, T, d_rope] or [B, T, H, d_rope].
    """
    cos, sin = (angles.cos() * factor).to(x.dtype), (angles.sin() * factor).to(x.dtype)  # as transformers does
    if x.dim() == 3:
        cos, sin = cos[None], sin[None]
    elif x.dim() == 4:
        cos, sin = cos[None, :, None], sin[None, :, None]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rotary_angles(run: Run, positions: Tensor) -> Tensor:
    """R_t: the angle t·ω_j of every position and rotary pair, [T, pairs]."""
    omega, _ = yarn_inverse_frequencies(run, positions.device)
    return run.rec("angles", positions.float()[:, None] * omega[None, :])


def run_rope(comp: Component, run: Run, positions: Tensor) -> list[Tensor]:
    angles = rotary_angles(run, positions)
    run.rec("rotate", rotate(torch.zeros(positions.shape[0], run.config.qk_rope_head_dim, device=positions.device),
                             angles))
    return [angles]


def attend(run: Run, Q: Tensor, K: Tensor, V: Tensor, M: Tensor) -> Tensor:
    """A_i = softmax(τ Q_i K_iᵀ + M), O_i = A_i V_i; heads on axis 2 of [B, T, H, d]."""
    _, tau = softmax_scale(run.config)
    scores = torch.matmul(Q.transpose(1, 2), K.transpose(1, 2).transpose(-1, -2)) * tau + M
    A = run.rec("softmax", F.softmax(scores, dim=-1, dtype=torch.float32).to(Q.dtype))  # [B, H, T, T]
    return run.rec("context", torch.matmul(A, V.transpose(1, 2)).transpose(1, 2))      # [B, T, H, d_v]


def run_scores(comp: Component, run: Run, Q: Tensor, K: Tensor, V: Tensor, M: Tensor) -> list[Tensor]:
    return [attend(run, Q, K, V, M)]


def run_attention(comp: Component, run: Run, x: Tensor, angles: Tensor, M: Tensor) -> list[Tensor]:
    c = run.config
    B, T, _ = x.shape
    H, nope, rope, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
    _, factor = yarn_inverse_frequencies(run.child(prefix="_"), x.device)
    c_q = run.rec("q-down", F.linear(x, run.w("q_a_proj.weight")))
    c_q_hat = rmsnorm(run, "q-norm", c_q, run.w("q_a_layernorm.weight"))
    kv_latent = F.linear(x, run.w("kv_a_proj_with_mqa.weight"))
    c_kv, k_pe = run.rec("kv-down", kv_latent[..., :c.kv_lora_rank]), kv_latent[..., c.kv_lora_rank:]
    c_kv_hat = rmsnorm(run, "kv-norm", c_kv, run.w("kv_a_layernorm.weight"))
    q = F.linear(c_q_hat, run.w("q_b_proj.weight")).view(B, T, H, nope + rope)       # [B, T, H, d_qk]
    Q_C = run.rec("q-content-heads", q[..., :nope])
    run.rec("q-content", Q_C.reshape(B, T, H * nope))
    Q_pe = run.rec("q-rope-heads", q[..., nope:])
    run.rec("q-rope", Q_pe.reshape(B, T, H * rope))
    Q_R = run.rec("q-rotate", rotate(Q_pe, angles, factor))
    Q = run.rec("q-concat", torch.cat([Q_C, Q_R], dim=-1))
    kv = F.linear(c_kv_hat, run.w("kv_b_proj.weight")).view(B, T, H, nope + dv)      # [B, T, H, d_nope + d_v]
    K_C = run.rec("k-content-heads", kv[..., :nope])
    run.rec("k-content", K_C.reshape(B, T, H * nope))
    run.rec("k-rope", k_pe)
    k_R = run.rec("k-rotate", rotate(k_pe, angles, factor))                          # [B, T, d_rope]
    K = run.rec("k-concat", torch.cat([K_C, k_R[:, :, None, :].expand(B, T, H, rope)], dim=-1))
    V = run.rec("v-heads", kv[..., nope:])
    run.rec("v", V.reshape(B, T, H * dv))
    O = attend(run, Q, K, V, M)
    delta = run.rec("o_proj", F.linear(O.reshape(B, T, H * dv), run.w("o_proj.weight")))
    return [run.rec("mla", delta)]


# ------------------------------------------------------------------------------------------ feed-forward

def run_swiglu(comp: Component, run: Run, x: Tensor) -> list[Tensor]:
    g = run.rec("gate_proj", F.linear(x, run.w("gate_proj.weight")))
    u = run.rec("up_proj", F.linear(x, run.w("up_proj.weight")))
    a = run.rec("silu", g * torch.sigmoid(g))
    h = run.rec("product", a * u)
    y = run.rec("down_proj", F.linear(h, run.w("down_proj.weight")))
    return [run.rec("swiglu", y)]


def route(run: Run, x: Tensor) -> tuple[Tensor, Tensor]:
    """Gates G [B, T, E] (zero for unselected experts) and the selected indices [B, T, k]; run is the gate's."""
    c = run.config
    z = run.rec("logits", F.linear(x.float(), run.w("weight").float()))
    s = run.rec("scores", torch.sigmoid(z))
    choice = s + run.w("e_score_correction_bias")  # the bias steers selection only
    if c.n_group > 1:
        per_group = choice.view(*choice.shape[:-1], c.n_group, -1)
        group_scores = per_group.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores).scatter(-1, group_scores.topk(c.topk_group, dim=-1).indices, 1.0)
        run.rec("groups", keep)
        mask = keep[..., None].expand(per_group.shape).reshape(choice.shape)
        choice = choice.masked_fill(mask == 0, float("-inf"))
    picked = choice.topk(c.num_experts_per_tok, dim=-1).indices
    selected = run.rec("select", torch.zeros_like(s).scatter(-1, picked, 1.0))
    weighted = s * selected
    if c.norm_topk_prob:
        weighted = weighted / (weighted.sum(-1, keepdim=True) + 1e-20)
    return run.rec("gates", c.routed_scaling_factor * weighted), picked


def run_router(comp: Component, run: Run, x: Tensor) -> list[Tensor]:
    return [route(run, x)[0]]


def run_moe(comp: Component, run: Run, x: Tensor) -> list[Tensor]:
    G, _ = route(run.child("gate."), x)
    W1, W3, W2 = (run.w(f"experts.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj"))  # [E, ...]
    ex = run.child(prefix="expert-")
    g = torch.einsum("btd,eid->ebti", x, W1)
    u = torch.einsum("btd,eid->ebti", x, W3)
    ex.rec("gate_proj", g[0]), ex.rec("up_proj", u[0])
    a = g * torch.sigmoid(g)
    h = a * u
    ex.rec("silu", a[0]), ex.rec("product", h[0])
    E_out = torch.einsum("ebti,edi->ebtd", h, W2)                                       # [E, B, T, d]
    ex.rec("down_proj", E_out[0])
    y_routed = run.rec("routed-sum", torch.einsum("bte,ebtd->btd", G.to(E_out.dtype), E_out))
    (y_shared,) = run_swiglu(comp, run.child("shared_experts.", "shared-"), x)
    return [run.rec("moe-out", y_routed + y_shared)]


# ------------------------------------------------------------------------------------------------ blocks

def run_block(comp: Component, run: Run, x: Tensor, angles: Tensor, M: Tensor) -> list[Tensor]:
    ffn = comp.children[3]
    x_attn = rmsnorm(run, "attn_norm", x, run.w("input_layernorm.weight"))
    (delta_attn,) = run_attention(comp.children[1], run.child("self_attn."), x_attn, angles, M)
    x_mid = run.rec("residual-attn", x + delta_attn)
    x_ffn = rmsnorm(run, "ffn_norm", x_mid, run.w("post_attention_layernorm.weight"))
    program = run_moe if ffn.program == "moe" else run_swiglu
    (delta_ffn,) = program(ffn, run.child("mlp."), x_ffn)
    return [run.rec("residual-ffn", x_mid + delta_ffn)]


def causal_mask(T: int, device: torch.device) -> Tensor:
    return torch.full((T, T), float("-inf"), device=device).triu(1)


def run_stack(comp: Component, run: Run, x: Tensor, angles: Tensor, M: Tensor) -> list[Tensor]:
    for layer, block in layer_order(comp):
        (x,) = run_block(block, run.child(f"model.layers.{layer}.", "_"), x, angles, M)
    return [run.rec("stack", x)]


def layer_order(stack: Component) -> list[tuple[int, Component]]:
    """(layer index, block component) in execution order, from the blocks' tensor ranges."""
    pairs = [(i, block) for block in stack.children for i in block.children[0].tensors[0].ranges[0].values]
    return sorted(pairs, key=lambda p: p[0])


def run_model(comp: Component, run: Run, ids: Tensor) -> list[Tensor]:
    stack = comp.children[1]
    x = run.rec("embed", F.embedding(ids, run.w("model.embed_tokens.weight")))
    positions = torch.arange(ids.shape[1], device=ids.device)
    angles = run_rope(comp, run.child(prefix="_rope-"), positions)[0]
    (x,) = run_stack(stack, run, x, angles, causal_mask(ids.shape[1], ids.device))
    run.rec("blocks", x)
    x_hat = rmsnorm(run, "_norm", x, run.w("model.norm.weight"))
    return [run.rec("head", F.linear(x_hat, run.w("lm_head.weight")))]


def run_mtp(comp: Component, run: Run, h: Tensor, next_ids: Tensor) -> list[Tensor]:
    block = comp.children[4]
    layer = block.children[0].tensors[0].ranges[0].values[0]
    m = run.child(f"model.layers.{layer}.")
    e = F.embedding(next_ids, m.w("embed_tokens.weight"))
    h_n = rmsnorm(m, "norms", h, m.w("hnorm.weight"))
    e_n = rmsnorm(m, "_enorm", e, m.w("enorm.weight"))
    x = m.rec("eh_proj", F.linear(torch.cat([h_n, e_n], dim=-1), m.w("eh_proj.weight")))
    T = h.shape[1]
    positions = torch.arange(T, device=h.device)
    angles = run_rope(comp, m.child(prefix="_rope-"), positions)[0]
    (y,) = run_block(block, m.child(prefix="_"), x, angles, causal_mask(T, h.device))
    m.rec("block", y)
    y_hat = rmsnorm(m, "_head_norm", y, m.w("shared_head.norm.weight"))
    return [m.rec("logits", F.linear(y_hat, m.w("shared_head.head.weight")))]


WHOLE_MODEL_PROGRAMS = {"stack", "model", "mtp"}
"""Programs that address weights by full checkpoint name (they span several layers)."""

PROGRAMS: dict[str, Callable[..., list[Tensor]]] = {
    "rmsnorm": run_rmsnorm, "linear": run_linear, "embedding": run_embedding, "head": run_head,
    "rope": run_rope, "scores": run_scores, "attention": run_attention, "swiglu": run_swiglu,
    "router": run_router, "moe": run_moe, "block": run_block, "stack": run_stack, "model": run_model,
    "mtp": run_mtp,
}
