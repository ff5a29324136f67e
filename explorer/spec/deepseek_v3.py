"""The DeepSeek-V3 family (DeepSeek-V3, Kimi K2) as a component tree parameterised by config.json values.

References: DeepSeek-V3 technical report (arXiv:2412.19437) for MLA, the router and MTP; the checkpoint's
modeling_deepseek.py and transformers' models/deepseek_v3/modeling_deepseek_v3.py for the module layout
and tensor names. Nothing model-specific lives here: a model is its config plus content metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import sympy

from ..content import parse_table
from ..errors import ContentError
from .types import Citation, Component, Dim, IndexRange, ModelSpec, Port, Shape, Step, TensorSpec

FAMILY = "deepseek_v3"
TRANSFORMERS_FILE = "models/deepseek_v3/modeling_deepseek_v3.py"
ROPE_UTILS_FILE = "modeling_rope_utils.py"


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """config.json "rope_scaling" (YaRN)."""

    type: str
    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    mscale: float
    mscale_all_dim: float


@dataclass(frozen=True, slots=True)
class QuantizationConfig:
    """config.json "quantization_config" (block-wise FP8)."""

    quant_method: str
    fmt: str
    activation_scheme: str
    weight_block_size: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeepseekV3Hyperparameters:
    """The config.json keys of the family, named as published; informational keys are optional."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    n_shared_experts: int
    n_routed_experts: int
    routed_scaling_factor: float
    kv_lora_rank: int
    q_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    topk_method: str
    n_group: int
    topk_group: int
    num_experts_per_tok: int
    moe_layer_freq: int
    first_k_dense_replace: int
    norm_topk_prob: bool
    scoring_func: str
    hidden_act: str
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    attention_bias: bool
    tie_word_embeddings: bool
    num_nextn_predict_layers: int
    torch_dtype: str
    quantization_config: QuantizationConfig | None = None
    # Informational keys: recorded as published, not used by the spec.
    architectures: tuple[str, ...] = ()
    model_type: str = ""
    bos_token_id: int = 0
    eos_token_id: int = 0
    initializer_range: float = 0.0
    attention_dropout: float = 0.0
    aux_loss_alpha: float = 0.0
    seq_aux: bool = False
    pretraining_tp: int = 1
    ep_size: int = 1
    use_cache: bool = True
    transformers_version: str = ""
    auto_map: dict[str, str] = field(default_factory=dict)


# Short names used in shapes ("7168 d") for each config size.
DIM_LABELS = {
    "hidden_size": "d", "intermediate_size": "d_ff", "moe_intermediate_size": "d_expert",
    "vocab_size": "vocab", "q_lora_rank": "d_cq", "kv_lora_rank": "d_ckv",
    "num_attention_heads": "heads", "qk_nope_head_dim": "d_nope", "qk_rope_head_dim": "d_rope",
    "v_head_dim": "d_v", "n_routed_experts": "experts", "num_experts_per_tok": "k",
}
SYMBOLS = {name: sympy.Symbol(name, positive=True, integer=True) for name in (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank",
    "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
    "n_shared_experts")}
S = SYMBOLS

B = Dim("batch", symbol="B")
T = Dim("positions", symbol="T")


def validate_config(raw: dict, where: str) -> DeepseekV3Hyperparameters:
    """Parse and cross-check a config table; raise ContentError listing every problem."""
    problems: list[str] = []
    config = parse_table(raw, DeepseekV3Hyperparameters, where, problems)
    if config is not None:
        problems.extend(f"{where}: {p}" for p in _consistency_problems(config))
    if problems:
        raise ContentError(problems)
    return config


def _consistency_problems(c: DeepseekV3Hyperparameters) -> list[str]:
    """Relations between keys that a self-consistent config must satisfy."""
    rules = [
        (c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
         f"must be <= n_routed_experts ({c.n_routed_experts}), got {c.num_experts_per_tok}"),
        (c.n_group >= 1 and c.n_routed_experts % c.n_group == 0, "n_group",
         f"must divide n_routed_experts ({c.n_routed_experts}), got {c.n_group}"),
        (1 <= c.topk_group <= c.n_group, "topk_group", f"must be in 1..n_group ({c.n_group}), got {c.topk_group}"),
        (c.num_experts_per_tok <= c.topk_group * (c.n_routed_experts // max(c.n_group, 1)), "num_experts_per_tok",
         "must not exceed the experts in the topk_group selected groups"),
        (0 <= c.first_k_dense_replace <= c.num_hidden_layers, "first_k_dense_replace",
         f"must be in 0..num_hidden_layers ({c.num_hidden_layers}), got {c.first_k_dense_replace}"),
        (c.moe_layer_freq >= 1, "moe_layer_freq", f"must be >= 1, got {c.moe_layer_freq}"),
        (c.num_attention_heads % c.num_key_value_heads == 0, "num_key_value_heads",
         f"must divide num_attention_heads ({c.num_attention_heads}), got {c.num_key_value_heads}"),
        (c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", f"must be even (rotary pairs), got {c.qk_rope_head_dim}"),
        (c.scoring_func == "sigmoid", "scoring_func", f"must be 'sigmoid' for this family, got {c.scoring_func!r}"),
        (c.hidden_act == "silu", "hidden_act", f"must be 'silu' (SwiGLU), got {c.hidden_act!r}"),
        (c.rope_scaling.type == "yarn", "rope_scaling.type", f"must be 'yarn', got {c.rope_scaling.type!r}"),
        (not c.tie_word_embeddings, "tie_word_embeddings", "must be false: the family stores lm_head separately"),
    ]
    sizes = [n for n in SYMBOLS if getattr(c, n) <= 0]
    out = [f"key '{key}': {msg}" for ok, key, msg in rules if not ok]
    out += [f"key '{n}': must be a positive integer, got {getattr(c, n)}" for n in sizes]
    if c.quantization_config is not None and len(c.quantization_config.weight_block_size) != 2:
        out.append("key 'quantization_config.weight_block_size': expected 2 integers")
    return out


# ---------------------------------------------------------------------------------------------- helpers

def q(s: str) -> str:
    """Colour a query-stream symbol."""
    return r"{\color{stream-q}{" + s + "}}"


def k(s: str) -> str:
    return r"{\color{stream-k}{" + s + "}}"


def v(s: str) -> str:
    return r"{\color{stream-v}{" + s + "}}"


def ctx(s: str) -> str:
    return r"{\color{stream-context}{" + s + "}}"


def fmt_num(x: float) -> str:
    """A decimal for equations: integers plain, others with 4 significant digits (2.827, 0.1309)."""
    return str(int(x)) if float(x).is_integer() else f"{x:.4g}"


class _Builder:
    """Evaluates sizes against one config and builds components with shapes and tensors."""

    def __init__(self, c: DeepseekV3Hyperparameters) -> None:
        self.c = c
        self.values: dict[str, int | float] = {n: getattr(c, n) for n in SYMBOLS}
        self.quantized = c.quantization_config is not None
        self.block = tuple(c.quantization_config.weight_block_size) if c.quantization_config else ()
        fmt = c.quantization_config.fmt if c.quantization_config else ""
        self.quant_dtype = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}.get(fmt, "")
        block = " × ".join(str(n) for n in self.block)
        self.quant_citation = Citation(
            f"Weights are stored in FP8 ({fmt}) with one scale per {block} block; the scales are quantization "
            "metadata and are excluded from parameter counts.", "config", "quantization_config")
        self.dtype = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(c.torch_dtype, c.torch_dtype)

    def size(self, expr: sympy.Expr) -> int:
        return int(expr.subs(self.values))

    def dim(self, name: str) -> Dim:
        return Dim(DIM_LABELS[name], getattr(self.c, name))

    def shape(self, *dims: Dim | str) -> Shape:
        return Shape(tuple(self.dim(d) if isinstance(d, str) else d for d in dims))

    def tokens(self, *dims: Dim | str) -> Shape:
        """[B batch, T positions, ...]."""
        return self.shape(B, T, *dims)

    def weight(self, template: str, ranges: tuple[IndexRange, ...], shape: tuple[sympy.Expr, ...],
               quantized: bool) -> TensorSpec:
        quantized = quantized and self.quantized
        dtype = self.quant_dtype if quantized else self.dtype
        return TensorSpec(template, shape, ranges, quantized=quantized, dtype=dtype)


LINEAR_NOTES = (
    "This projection has no bias parameter.",
    "The reference module holds the weight output by input, [out, in].",
)


def _linear(b: _Builder, key: str, title: str, code: str, description: str, template: str,
            ranges: tuple[IndexRange, ...], d_in: str | sympy.Expr, d_out: sympy.Expr, out_dim: Dim,
            step: str, x: Port, y_latex: str, y_name: str, quantized: bool = True,
            citations: tuple[Citation, ...] = ()) -> Component:
    """A bias-free nn.Linear: one [out, in] weight, y = x W."""
    y = Port(y_latex, b.tokens(out_dim), y_name)
    if quantized and b.quantized:
        citations = citations + (b.quant_citation,)
    return Component(
        key=key, title=title, kind="learned", code=code, description=description,
        inputs=(x,), outputs=(y,),
        equations=(Step(step, y.shape, key),), steps=(Step(step, y.shape, key),),
        tensors=(b.weight(template, ranges, (d_out, S[d_in] if isinstance(d_in, str) else d_in), quantized),),
        citations=citations, notes=LINEAR_NOTES, program="linear",
    )


def _rmsnorm(b: _Builder, key: str, title: str, template: str, ranges: tuple[IndexRange, ...], size: str,
             x: Port, y_latex: str, y_name: str, code: str) -> Component:
    """RMSNorm with a learned per-feature gain."""
    y = Port(y_latex, x.shape, y_name)
    eps = fmt_num(b.c.rms_norm_eps) if b.c.rms_norm_eps >= 1e-4 else f"10^{{{int(math.log10(b.c.rms_norm_eps))}}}"
    detail = (rf"{y_latex}=\frac{{{x.latex}}}{{\sqrt{{\operatorname{{mean}}(({x.latex})^2)+{eps}}}}}\odot \gamma")
    return Component(
        key=key, title=title, kind="learned", code=code,
        description=f"Scale each {getattr(b.c, size):,}-feature vector to unit root mean square, then by a "
                    "learned gain.",
        inputs=(x,), outputs=(y,),
        equations=(Step(rf"{y_latex}=\operatorname{{RMSNorm}}({x.latex})", y.shape, key),),
        steps=(Step(detail, y.shape, key),),
        tensors=(b.weight(template, ranges, (S[size],), quantized=False),),
        citations=(Citation("RMSNorm divides by the root mean square over the last dimension (plus eps) and "
                            "multiplies by a learned weight of that length.", "checkpoint", "DeepseekV3RMSNorm"),
                   Citation("The same RMSNorm in the transformers implementation.", "transformers",
                            "DeepseekV3RMSNorm", TRANSFORMERS_FILE)),
        program="rmsnorm",
    )


def _layers(indices: tuple[int, ...]) -> tuple[IndexRange, ...]:
    return (IndexRange("layer", indices),)


def _prefixed(steps: tuple[Step, ...], prefix: str) -> tuple[Step, ...]:
    """Steps spliced into a parent's list keep unique anchors: "expert-gate_proj", "shared-gate_proj"."""
    return tuple(replace(s, name=prefix + s.name) for s in steps)


# ------------------------------------------------------------------------------------------- attention

def softmax_scale(c: DeepseekV3Hyperparameters) -> tuple[float, float]:
    """(mscale, softmax scale): YaRN multiplies 1/sqrt(d_nope + d_rope) by mscale squared."""
    r = c.rope_scaling
    mscale = 0.1 * r.mscale_all_dim * math.log(r.factor) + 1.0 if r.factor > 1 and r.mscale_all_dim else 1.0
    return mscale, (c.qk_nope_head_dim + c.qk_rope_head_dim) ** -0.5 * mscale * mscale


def _rope(b: _Builder, prefix: str, ranges: tuple[IndexRange, ...]) -> Component:
    """YaRN rotary embedding: computed angles, plus the inv_freq buffer where a checkpoint stores one."""
    c, r = b.c, b.c.rope_scaling
    pairs = Dim("pairs", c.qk_rope_head_dim // 2)
    angles = Port(ctx("R"), Shape((Dim("positions", symbol="T"), pairs)), "R")
    d = c.qk_rope_head_dim
    steps = (
        Step(rf"\theta_j={fmt_num(c.rope_theta)}^{{-2j/{d}}},\quad j=0,\dots,{d // 2 - 1}", Shape((pairs,)), "theta"),
        Step(r"\gamma_j=\operatorname{clamp}\!\left(\frac{j-j_{\mathrm{low}}}{j_{\mathrm{high}}"
             r"-j_{\mathrm{low}}},0,1\right)", Shape((pairs,)), "ramp"),
        Step(rf"\omega_j=\gamma_j\,\frac{{\theta_j}}{{{fmt_num(r.factor)}}}+(1-\gamma_j)\,\theta_j",
             Shape((pairs,)), "inv-freq"),
        Step(rf"{ctx('R_t')}=\left(\cos t\omega_j,\ \sin t\omega_j\right)_{{j}}", angles.shape, "angles"),
        Step(r"\operatorname{RoPE}(x,R_t)_{j}=\begin{pmatrix}\cos t\omega_j & -\sin t\omega_j\\ \sin t\omega_j"
             r" & \cos t\omega_j\end{pmatrix}\begin{pmatrix}x_{2j}\\ x_{2j+1}\end{pmatrix}",
             Shape((T, Dim("d_rope", d))), "rotate"),
    )
    buffer = TensorSpec(prefix + "rotary_emb.inv_freq", None, ranges, role="buffer", dtype=b.dtype, optional=True)
    return Component(
        key="rope", title="YaRN rotary position embedding", kind="computed",
        code="DeepseekV3YarnRotaryEmbedding(qk_rope_head_dim, ...)",
        description=f"Rotate each of the {d // 2} pairs of rotary features by a position-dependent angle, with "
                    f"YaRN stretching long wavelengths {fmt_num(r.factor)}× for a "
                    f"{r.original_max_position_embeddings * r.factor:,.0f}-position context.",
        inputs=(Port("t", Shape((T,)), "positions"),), outputs=(angles,),
        equations=(steps[2], steps[3]), steps=steps, tensors=(buffer,),
        extras=(("base θ", fmt_num(c.rope_theta)), ("scaling factor", fmt_num(r.factor)),
                ("beta_fast / beta_slow", f"{fmt_num(r.beta_fast)} / {fmt_num(r.beta_slow)}"),
                ("original context", f"{r.original_max_position_embeddings:,}")),
        citations=(
            Citation("YaRN blends interpolated and extrapolated inverse frequencies with a linear ramp between "
                     "the beta_fast and beta_slow correction dimensions.", "checkpoint", "DeepseekV3YarnRotaryEmbedding"),
            Citation("transformers computes the same YaRN inverse frequencies.", "transformers",
                     "_compute_yarn_parameters", ROPE_UTILS_FILE),
        ),
        row_label="Rotary embedding (computed)", program="rope",
    )


def _scores(b: _Builder) -> Component:
    c = b.c
    mscale, scale = softmax_scale(c)
    d_qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    heads = b.dim("num_attention_heads")
    scores = Shape((B, heads, Dim("queries", symbol="T"), Dim("keys", symbol="T")))
    steps = (
        Step(rf"\tau=\frac{{m^2}}{{\sqrt{{{d_qk}}}}},\quad m=0.1\ln {fmt_num(c.rope_scaling.factor)}+1="
             rf"{mscale:.4f},\quad \tau={scale:.6f}", None, "scale"),
        Step(rf"A_i=\operatorname{{softmax}}\!\left(\tau\,{q('Q_i')}{k('K_i')}^{{\top}}+M\right)", scores, "softmax"),
        Step(rf"{ctx('O_i')}=A_i{v('V_i')}", b.tokens(heads, "v_head_dim"), "context"),
    )
    return Component(
        key="scores", title="Scaled dot-product scores", kind="computed",
        code="softmax(Q @ K.transpose(-1, -2) * softmax_scale + mask) @ V",
        description=f"Causal softmax attention per head over {d_qk}-dimensional query-key dot products, with "
                    "the softmax scale enlarged by YaRN's mscale squared.",
        inputs=(Port(q("Q"), b.tokens(heads, Dim("d_qk", d_qk)), "Q"), Port(k("K"), b.tokens(heads, Dim("d_qk", d_qk)), "K"),
                Port(v("V"), b.tokens(heads, "v_head_dim"), "V"),
                Port("M", Shape((Dim("queries", symbol="T"), Dim("keys", symbol="T"))), "mask")),
        outputs=(Port(ctx("O"), b.tokens(heads, "v_head_dim"), "O"),),
        equations=steps[1:], steps=steps,
        extras=(("softmax scale", f"{scale:.6f}"),),
        citations=(Citation("The softmax scale is (qk_nope_head_dim + qk_rope_head_dim)^-0.5, multiplied by "
                            "mscale squared when YaRN's mscale_all_dim is set.", "transformers",
                            "DeepseekV3Attention.__init__", TRANSFORMERS_FILE),),
        row_label="Scores and softmax (computed)", program="scores",
    )


def _attention(b: _Builder, ranges: tuple[IndexRange, ...], x: Port) -> Component:
    """Multi-head latent attention: low-rank query and joint key-value latents, decoupled RoPE keys."""
    c = b.c
    p = "model.layers.{layer}.self_attn."
    pe = r"\mathrm{pe}"
    q_pe, Q_pe, Q_pe_t = q(f"q^{{{pe}}}"), q(f"Q^{{{pe}}}"), q(f"Q^{{{pe}}}_{{t}}")
    k_pe, k_pe_t = k(f"k^{{{pe}}}"), k(f"k^{{{pe}}}_{{t}}")
    heads, n = b.dim("num_attention_heads"), c.num_attention_heads
    d_qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    cq = Port(q("c^{Q}"), b.tokens("q_lora_rank"), "c_q")
    cq_hat = Port(r"\hat c^{" + q("Q") + "}", cq.shape, "c_q_hat")
    ckv = Port("c^{KV}", b.tokens("kv_lora_rank"), "c_kv")
    ckv_hat = Port(r"\hat c^{KV}", ckv.shape, "c_kv_hat")
    q_a = _linear(b, "q_a_proj", "Query down-projection", "self.q_a_proj(hidden_states)",
                  f"Compress each {c.hidden_size:,}-feature token to a {c.q_lora_rank:,}-dimensional query latent.",
                  p + "q_a_proj.weight", ranges, "hidden_size", S["q_lora_rank"], b.dim("q_lora_rank"),
                  rf"{cq.latex}=xW_{{DQ}}", x, cq.latex, "c_q")
    q_norm = _rmsnorm(b, "q_a_layernorm", "Query latent RMSNorm", p + "q_a_layernorm.weight", ranges, "q_lora_rank",
                      cq, cq_hat.latex, "c_q_hat", "self.q_a_layernorm(q_a)")
    q_out = S["num_attention_heads"] * (S["qk_nope_head_dim"] + S["qk_rope_head_dim"])
    q_b = _linear(b, "q_b_proj", "Query up-projection", "self.q_b_proj(q_latent)",
                  f"Expand the query latent to {n} heads of {c.qk_nope_head_dim} content and "
                  f"{c.qk_rope_head_dim} rotary features ({n * d_qk:,} outputs; W_UQ and W_QR are its column blocks).",
                  p + "q_b_proj.weight", ranges, "q_lora_rank", q_out, Dim("heads·d_qk", n * d_qk),
                  rf"[{q('q^{C}')};{q_pe}]=\hat c^{{{q('Q')}}}[W_{{UQ}};W_{{QR}}]", cq_hat,
                  q("q"), "q")
    kv_out = S["kv_lora_rank"] + S["qk_rope_head_dim"]
    kv_a = _linear(b, "kv_a_proj_with_mqa", "Joint KV down-projection", "self.kv_a_proj_with_mqa(hidden_states)",
                   f"Compress each token to a {c.kv_lora_rank}-dimensional key-value latent plus one shared "
                   f"{c.qk_rope_head_dim}-dimensional rotary key ({c.kv_lora_rank + c.qk_rope_head_dim} outputs).",
                   p + "kv_a_proj_with_mqa.weight", ranges, "hidden_size", kv_out,
                   Dim("d_ckv+d_rope", c.kv_lora_rank + c.qk_rope_head_dim),
                   rf"[c^{{KV}};{k_pe}]=x[W_{{DKV}};W_{{KR}}]", x, "c^{KV}", "c_kv")
    kv_norm = _rmsnorm(b, "kv_a_layernorm", "KV latent RMSNorm", p + "kv_a_layernorm.weight", ranges, "kv_lora_rank",
                       ckv, ckv_hat.latex, "c_kv_hat", "self.kv_a_layernorm(kv_latent)")
    kv_b_out = S["num_attention_heads"] * (S["qk_nope_head_dim"] + S["v_head_dim"])
    kv_b = _linear(b, "kv_b_proj", "KV up-projection", "self.kv_b_proj(kv_latent)",
                   f"Expand the KV latent to {n} heads of {c.qk_nope_head_dim} key-content and {c.v_head_dim} value "
                   f"features ({n * (c.qk_nope_head_dim + c.v_head_dim):,} outputs; W_UK and W_UV are its blocks).",
                   p + "kv_b_proj.weight", ranges, "kv_lora_rank", kv_b_out,
                   Dim("heads·(d_nope+d_v)", n * (c.qk_nope_head_dim + c.v_head_dim)),
                   rf"[{k('k^{C}')};{v('v')}]=\hat c^{{KV}}[W_{{UK}};W_{{UV}}]", ckv_hat, k("k"), "kv")
    o_in = Port(ctx("O"), b.tokens(Dim("heads·d_v", n * c.v_head_dim)), "O")
    o_step = rf"\Delta_{{\mathrm{{attn}}}}=[{ctx('O_1')};\dots;{ctx(f'O_{{{n}}}')}]W_{{O}}"  # the concatenated heads
    o_proj = _linear(b, "o_proj", "Output projection", "self.o_proj(attn_output)",
                     f"Mix the {n} heads' {c.v_head_dim}-dimensional outputs ({n * c.v_head_dim:,} features) back "
                     f"to {c.hidden_size:,} features.", p + "o_proj.weight", ranges,
                     S["num_attention_heads"] * S["v_head_dim"],
                     S["hidden_size"], b.dim("hidden_size"), o_step, o_in, r"\Delta_{\mathrm{attn}}", "delta_attn")
    rope = _rope(b, p, ranges)
    scores = _scores(b)
    hd = lambda *dims: b.tokens(heads, *dims)  # noqa: E731
    nope, rope_d, vd = b.dim("qk_nope_head_dim"), b.dim("qk_rope_head_dim"), b.dim("v_head_dim")
    steps = (
        Step(rf"{cq.latex}=xW_{{DQ}}", cq.shape, "q-down"),
        Step(rf"{cq_hat.latex}=\operatorname{{RMSNorm}}({cq.latex})", cq.shape, "q-norm"),
        Step(r"c^{KV}=xW_{DKV}", ckv.shape, "kv-down"),
        Step(r"\hat c^{KV}=\operatorname{RMSNorm}(c^{KV})", ckv.shape, "kv-norm"),
        Step(rf"{q('q^{C}')}={cq_hat.latex}W_{{UQ}}", b.tokens(Dim("heads·d_nope", n * c.qk_nope_head_dim)), "q-content"),
        Step(rf"{q('Q^{C}')}=\operatorname{{reshape}}({q('q^{C}')})", hd(nope), "q-content-heads"),
        Step(rf"{q_pe}={cq_hat.latex}W_{{QR}}", b.tokens(Dim("heads·d_rope", n * c.qk_rope_head_dim)),
             "q-rope"),
        Step(rf"{Q_pe}=\operatorname{{reshape}}({q_pe})", hd(rope_d), "q-rope-heads"),
        Step(rf"{q('Q^{R}_{t}')}=\operatorname{{RoPE}}({Q_pe_t},{ctx('R_t')})", hd(rope_d), "q-rotate"),
        Step(rf"{q('Q')}=[{q('Q^{C}')};\,{q('Q^{R}')}]", hd(Dim("d_qk", d_qk)), "q-concat"),
        Step(rf"{k('k^{C}')}=\hat c^{{KV}}W_{{UK}}", b.tokens(Dim("heads·d_nope", n * c.qk_nope_head_dim)), "k-content"),
        Step(rf"{k('K^{C}')}=\operatorname{{reshape}}({k('k^{C}')})", hd(nope), "k-content-heads"),
        Step(rf"{k_pe}=xW_{{KR}}", b.tokens(rope_d), "k-rope"),
        Step(rf"{k('k^{R}_{t}')}=\operatorname{{RoPE}}({k_pe_t},{ctx('R_t')})", b.tokens(rope_d),
             "k-rotate"),
        Step(rf"{k('K_i')}=[{k('K^{C}_i')};\,{k('k^{R}')}]", hd(Dim("d_qk", d_qk)), "k-concat"),
        Step(rf"{v('v')}=\hat c^{{KV}}W_{{UV}}", b.tokens(Dim("heads·d_v", n * c.v_head_dim)), "v"),
        Step(rf"{v('V')}=\operatorname{{reshape}}({v('v')})", hd(vd), "v-heads"),
        *scores.steps[1:],
        *o_proj.steps,
    )
    children = (q_a, q_norm, q_b, kv_a, kv_norm, kv_b, rope, scores, o_proj)
    delta = Port(r"\Delta_{\mathrm{attn}}", x.shape, "delta_attn")
    return Component(
        key="attn", title="Multi-head latent attention", kind="learned",
        code="DeepseekV3Attention(config, layer_idx)",
        description=f"{n} heads attend through a {c.q_lora_rank}-dimensional query latent and a {c.kv_lora_rank}-"
                    f"dimensional key-value latent, with a {c.qk_rope_head_dim}-dimensional rotary key shared by "
                    "all heads.",
        inputs=(x, Port(ctx("R"), rope.outputs[0].shape, "R"), scores.inputs[3]), outputs=(delta,),
        equations=(Step(r"\Delta_{\mathrm{attn}}=\operatorname{MLA}(x_{\mathrm{attn}})", x.shape, "mla"),),
        steps=steps, children=children,
        citations=(
            Citation("Attention compresses queries through q_a_proj, q_a_layernorm and q_b_proj, and keys and values "
                     "through kv_a_proj_with_mqa (latent plus shared rotary key), kv_a_layernorm and kv_b_proj.",
                     "checkpoint", "DeepseekV3Attention.__init__"),
            Citation("The forward pass splits content and rotary parts, applies RoPE to the rotary parts only, "
                     "concatenates them per head and attends.", "checkpoint", "DeepseekV3Attention.forward"),
            Citation("transformers builds the same projections and forward pass.", "transformers",
                     "DeepseekV3Attention", TRANSFORMERS_FILE),
        ),
        program="attention",
    )


# ------------------------------------------------------------------------------------------ feed-forward

def _swiglu(b: _Builder, key: str, title: str, crumb: str, prefix: str, ranges: tuple[IndexRange, ...],
            d_ff: sympy.Expr, ff_dim: Dim, x: Port, y_latex: str, y_name: str, description: str,
            code: str, citations: tuple[Citation, ...]) -> Component:
    """down(silu(gate x) ⊙ up x): three bias-free projections."""
    g = Port("g", b.tokens(ff_dim), "g")
    h = Port("h", b.tokens(ff_dim), "h")
    y = Port(y_latex, x.shape, y_name)
    d = b.c.hidden_size
    gate = _linear(b, "gate_proj", "Gate projection", "self.gate_proj(x)",
                   f"Project {d:,} features to {ff_dim.size:,} gate pre-activations.",
                   prefix + "gate_proj.weight", ranges, "hidden_size", d_ff, ff_dim, rf"g={x.latex}W_{{1}}", x, "g", "g")
    up = _linear(b, "up_proj", "Up projection", "self.up_proj(x)",
                 f"Project {d:,} features to {ff_dim.size:,} values that the gate multiplies.",
                 prefix + "up_proj.weight", ranges, "hidden_size", d_ff, ff_dim, rf"u={x.latex}W_{{3}}", x, "u", "u")
    down = _linear(b, "down_proj", "Down projection",
                   "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
                   f"Map {ff_dim.size:,} gated features back to {d:,} features.",
                   prefix + "down_proj.weight", ranges, d_ff, S["hidden_size"], b.dim("hidden_size"),
                   rf"{y_latex}=hW_{{2}}", h, y_latex, y_name)
    steps = (
        gate.steps[0], up.steps[0],
        Step(r"a=g\,\sigma(g)", g.shape, "silu"),
        Step(r"h=a\odot u", h.shape, "product"),
        down.steps[0],
    )
    return Component(
        key=key, title=title, crumb=crumb, kind="learned", code=code, description=description,
        inputs=(x,), outputs=(y,),
        equations=(Step(rf"{y_latex}=\left(\operatorname{{SiLU}}({x.latex}W_1)\odot {x.latex}W_3\right)W_2",
                        y.shape, "swiglu"),),
        steps=steps, children=(gate, up, down), citations=citations,
        program="swiglu",
    )


MLP_CITATIONS = (
    Citation("The dense feed-forward network is a SwiGLU MLP: down(silu(gate x) ⊙ up x), with no biases.",
             "checkpoint", "DeepseekV3MLP"),
    Citation("transformers implements the same SwiGLU MLP.", "transformers", "DeepseekV3MLP", TRANSFORMERS_FILE),
)


def _router(b: _Builder, ranges: tuple[IndexRange, ...], x: Port) -> Component:
    c = b.c
    E, kk = c.n_routed_experts, c.num_experts_per_tok
    experts = b.dim("n_routed_experts")
    p = "model.layers.{layer}.mlp.gate."
    grouped = c.n_group > 1
    select = (rf"E^{{\mathrm{{sel}}}}_i=\big[\,i\in\operatorname{{top}}_{{{kk}}}\big((s+b)\odot\mathbb{{1}}"
              rf"[\operatorname{{group}}(i)\in\mathcal{{G}}]\big)\,\big]" if grouped else
              rf"E^{{\mathrm{{sel}}}}_i=\big[\,i\in\operatorname{{top}}_{{{kk}}}(s+b)\,\big]")
    steps = (
        Step(rf"z={x.latex}W_{{r}}", b.tokens(experts), "logits"),
        Step(r"s=\sigma(z)", b.tokens(experts), "scores"),
        *((Step(rf"\mathcal{{G}}=\operatorname{{top}}_{{{c.topk_group}}}\Big(\textstyle\sum_{{\text{{top 2 in group}}}}"
                rf"(s+b)\Big)\ \text{{over {c.n_group} groups of {E // c.n_group}}}", None, "groups"),) if grouped else ()),
        Step(select, b.tokens(experts), "select"),
        Step(rf"G_{{i}}={fmt_num(c.routed_scaling_factor)}\,\frac{{s_i\,E^{{\mathrm{{sel}}}}_i}}{{\sum_{{j}}s_j\,"
             rf"E^{{\mathrm{{sel}}}}_j}}" if c.norm_topk_prob else
             rf"G_{{i}}={fmt_num(c.routed_scaling_factor)}\,s_i\,E^{{\mathrm{{sel}}}}_i", b.tokens(experts), "gates"),
    )
    group_text = (f", restricted to the best {c.topk_group} of {c.n_group} expert groups" if grouped else "")
    return Component(
        key="router", title="Router", kind="learned", code="MoEGate(config)",
        description=f"Score all {E} experts with sigmoid affinities, pick {kk} by score plus a correction bias"
                    f"{group_text}, and weight them by their normalised scores × {fmt_num(c.routed_scaling_factor)}.",
        inputs=(x,), outputs=(Port("G", b.tokens(experts), "gates"),),
        equations=steps[-2:], steps=steps,
        tensors=(b.weight(p + "weight", ranges, (S["n_routed_experts"], S["hidden_size"]), quantized=False),
                 TensorSpec(p + "e_score_correction_bias", (S["n_routed_experts"],), ranges, dtype="F32")),
        citations=(
            Citation("The gate scores experts with a sigmoid, adds e_score_correction_bias only for selection "
                     "(noaux_tc), keeps the top groups, takes the top-k, normalises and scales by "
                     "routed_scaling_factor.", "checkpoint", "MoEGate.forward"),
            Citation("transformers' router implements the same selection and weighting.", "transformers",
                     "DeepseekV3TopkRouter", TRANSFORMERS_FILE),
        ),
        notes=("The correction bias b shifts which experts are selected but not the gate values G.",),
        program="router",
    )


def _moe(b: _Builder, layers: tuple[int, ...], x: Port, y_latex: str) -> Component:
    c = b.c
    ranges = _layers(layers)
    E = c.n_routed_experts
    router = _router(b, ranges, x)
    expert_ranges = ranges + (IndexRange("expert", tuple(range(E))),)
    expert = _swiglu(b, "expert", "Routed expert", "Routed expert", "model.layers.{layer}.mlp.experts.{expert}.",
                     expert_ranges, S["moe_intermediate_size"], b.dim("moe_intermediate_size"), x, "E_i", "expert_out",
                     f"One of {E} SwiGLU experts of width {c.moe_intermediate_size:,}; each token runs "
                     f"{c.num_experts_per_tok} of them.", "DeepseekV3MLP(config, intermediate_size=moe_intermediate_size)",
                     (Citation("Routed experts are SwiGLU MLPs of width moe_intermediate_size.", "checkpoint",
                               "DeepseekV3MoE.__init__"),
                      Citation("transformers fuses the experts' gate and up weights into one 3-D tensor.",
                               "transformers", "DeepseekV3Experts", TRANSFORMERS_FILE)))
    expert = replace(expert, repeat=E, repeat_label="routed experts", repeat_formula="n_routed_experts",
                     row_label="Routed experts")
    d_shared = S["moe_intermediate_size"] * S["n_shared_experts"]
    shared = _swiglu(b, "shared", "Shared expert", "Shared expert", "model.layers.{layer}.mlp.shared_experts.",
                     ranges, d_shared, Dim("d_shared", c.moe_intermediate_size * c.n_shared_experts), x,
                     r"y^{\mathrm{shared}}", "shared_out",
                     f"A SwiGLU MLP of width {c.moe_intermediate_size * c.n_shared_experts:,} that every token runs.",
                     "DeepseekV3MLP(config, intermediate_size=moe_intermediate_size * n_shared_experts)",
                     (Citation("The shared experts are one SwiGLU MLP of width moe_intermediate_size × "
                               "n_shared_experts, added to the routed output.", "checkpoint", "DeepseekV3MoE.__init__"),))
    steps = (
        *router.steps,
        *_prefixed(expert.steps, "expert-"),
        Step(rf"y^{{\mathrm{{routed}}}}=\sum_{{i=1}}^{{{E}}}G_i\,E_i", x.shape, "routed-sum"),
        *_prefixed(shared.steps, "shared-"),
        Step(rf"{y_latex}=y^{{\mathrm{{routed}}}}+y^{{\mathrm{{shared}}}}", x.shape, "moe-out"),
    )
    return Component(
        key="moe", title="Mixture of experts", crumb="Mixture of experts", kind="learned",
        code="DeepseekV3MoE(config)",
        description=f"Route each token to {c.num_experts_per_tok} of {E} experts and add one shared expert.",
        inputs=(x,), outputs=(Port(y_latex, x.shape, "delta_ffn"),),
        equations=tuple(s for s in steps if s.name in ("routed-sum", "moe-out")), steps=steps,
        children=(router, expert, shared),
        citations=(Citation("The MoE layer sums the gated outputs of the selected routed experts and adds the "
                            "shared experts' output.", "checkpoint", "DeepseekV3MoE.forward"),
                   Citation("transformers' MoE adds the shared experts to the routed experts' output.",
                            "transformers", "DeepseekV3MoE", TRANSFORMERS_FILE)),
        program="moe",
    )


# ------------------------------------------------------------------------------------------------ blocks

BLOCK_CITATIONS = (
    Citation("A block applies input RMSNorm, attention and a residual addition, then post-attention RMSNorm, the "
             "FFN and a second residual addition; the first first_k_dense_replace blocks use the dense MLP, the "
             "rest MoE.", "checkpoint", "DeepseekV3DecoderLayer.__init__"),
    Citation("The forward pass adds attention and FFN outputs to the residual stream.", "checkpoint",
             "DeepseekV3DecoderLayer.forward"),
    Citation("transformers' decoder layer has the same structure.", "transformers", "DeepseekV3DecoderLayer",
             TRANSFORMERS_FILE),
)


def _block(b: _Builder, key: str, title: str, layers: tuple[int, ...], moe: bool, label: str,
           prefix: str = "model.layers.{layer}.") -> Component:
    """One decoder layer kind (dense or MoE), repeated over `layers`."""

    ranges = _layers(layers)
    x = Port("x_n", b.tokens("hidden_size"), "x")
    x_attn = Port(r"x_{\mathrm{attn}}", x.shape, "x_attn")
    x_mid = Port("x'_n", x.shape, "x_mid")
    x_ffn = Port(r"x_{\mathrm{ffn}}", x.shape, "x_ffn")
    delta_ffn = r"\Delta_{\mathrm{ffn}}"
    attn_norm = _rmsnorm(b, "attn_norm", "Attention RMSNorm", prefix + "input_layernorm.weight", ranges,
                         "hidden_size", x, x_attn.latex, "x_attn", "self.input_layernorm(hidden_states)")
    attn = _attention(b, ranges, x_attn)
    ffn_norm = _rmsnorm(b, "ffn_norm", ("MoE" if moe else "MLP") + " RMSNorm", prefix + "post_attention_layernorm.weight",
                        ranges, "hidden_size", x_mid, x_ffn.latex, "x_ffn", "self.post_attention_layernorm(hidden_states)")
    if moe:
        ffn = _moe(b, layers, x_ffn, delta_ffn)
    else:
        ffn = _swiglu(b, "mlp", "SwiGLU MLP", "SwiGLU", prefix + "mlp.", ranges, S["intermediate_size"],
                      b.dim("intermediate_size"), x_ffn, delta_ffn, "delta_ffn",
                      f"A dense SwiGLU feed-forward network of width {b.c.intermediate_size:,}.",
                      "DeepseekV3MLP(config)", MLP_CITATIONS)
    ffn_name = "Mixture of experts:" if moe else "SwiGLU MLP:"
    residual_attn = Step(r"x'_n=x_n+\Delta_{\mathrm{attn}}", x.shape, "residual-attn")
    residual_ffn = Step(r"x_{n+1}=x'_n+\Delta_{\mathrm{ffn}}", x.shape, "residual-ffn")
    steps = (
        attn_norm.equations[0],
        Step(r"\text{Multi-head latent attention:}", heading=True, name="mla"),
        *attn.steps, residual_attn,
        ffn_norm.equations[0],
        Step(rf"\text{{{ffn_name}}}", heading=True, name="ffn"),
        *ffn.steps, residual_ffn,
    )
    n = len(layers)
    kind = "MoE" if moe else "dense"
    description = (f"MLA and {'a mixture of experts' if moe else 'a dense SwiGLU MLP'}, each added to the residual "
                   f"stream; {label}.")
    return Component(
        key=key, title=title, kind="learned", code="DeepseekV3DecoderLayer(config, layer_idx)",
        description=description, repeat=n, repeat_label=f"{kind} block" + ("s" if n != 1 else ""),
        repeat_formula="first_k_dense_replace" if not moe else "num_hidden_layers − first_k_dense_replace",
        crumb=f"{n} {kind} block" + ("s" if n != 1 else ""),
        inputs=(x, attn.inputs[1], attn.inputs[2]), outputs=(Port("x_{n+1}", x.shape, "x_next"),),
        equations=(residual_attn, residual_ffn), steps=steps,
        children=(attn_norm, attn, ffn_norm, ffn), citations=BLOCK_CITATIONS,
        program="block",
    )


def _layer_label(layers: tuple[int, ...]) -> str:
    """Human 1-based block numbers: "block 1", "blocks 2–61"."""
    if not layers:
        return "no blocks"
    if len(layers) == 1:
        return f"block {layers[0] + 1}"
    contiguous = layers == tuple(range(layers[0], layers[-1] + 1))
    return f"blocks {layers[0] + 1}–{layers[-1] + 1}" if contiguous else f"{len(layers)} blocks"


def _embedding(b: _Builder, key: str, title: str, template: str, ranges: tuple[IndexRange, ...] = (),
               note: str = "") -> Component:
    tokens = Port("t", Shape((B, T)), "input_ids")
    x = Port("x_1", b.tokens("hidden_size"), "x")
    return Component(
        key=key, title=title, kind="learned", code="nn.Embedding(vocab_size, hidden_size)",
        description=f"Look up a {b.c.hidden_size:,}-feature vector for each of {b.c.vocab_size:,} token ids.",
        inputs=(tokens,), outputs=(x,),
        equations=(Step(r"x_1=E_{\mathrm{tok}}[t]", x.shape, "lookup"),),
        steps=(Step(r"x_1=E_{\mathrm{tok}}[t]", x.shape, "lookup"),),
        tensors=(b.weight(template, ranges, (S["vocab_size"], S["hidden_size"]), quantized=False),),
        citations=(Citation("The model embeds token ids with nn.Embedding(vocab_size, hidden_size), runs the decoder "
                            "layers and a final RMSNorm.", "checkpoint", "DeepseekV3Model.__init__"),
                   Citation("transformers builds the same embedding, layers and final norm.", "transformers",
                            "DeepseekV3Model.__init__", TRANSFORMERS_FILE)),
        notes=(note,) if note else (), program="embedding",
    )


def _head(b: _Builder, key: str, title: str, template: str, ranges: tuple[IndexRange, ...] = ()) -> Component:
    x = Port(r"\hat x", b.tokens("hidden_size"), "x")
    logits = Port(r"\ell", b.tokens("vocab_size"), "logits")
    step = Step(r"\ell=\hat x\,W_{\mathrm{vocab}}", logits.shape, "logits")
    return Component(
        key=key, title=title, kind="learned", code="nn.Linear(hidden_size, vocab_size, bias=False)",
        description=f"Project {b.c.hidden_size:,} features to {b.c.vocab_size:,} next-token logits; not tied to "
                    "the embedding.",
        inputs=(x,), outputs=(logits,), equations=(step,), steps=(step,),
        tensors=(b.weight(template, ranges, (S["vocab_size"], S["hidden_size"]), quantized=False),),
        citations=(Citation("lm_head is a separate bias-free Linear from hidden_size to vocab_size.", "checkpoint",
                            "DeepseekV3ForCausalLM.__init__"),
                   Citation("transformers builds the same untied head.", "transformers",
                            "DeepseekV3ForCausalLM.__init__", TRANSFORMERS_FILE)),
        notes=LINEAR_NOTES, program="head",
    )


def _final_norm(b: _Builder, template: str, key: str = "norm", title: str = "Final RMSNorm",
                ranges: tuple[IndexRange, ...] = ()) -> Component:
    x = Port(r"x_{L}", b.tokens("hidden_size"), "x")
    return _rmsnorm(b, key, title, template, ranges, "hidden_size", x, r"\hat x", "x_hat", "self.norm(hidden_states)")


def _mtp(b: _Builder, first_layer: int) -> Component:
    """Multi-token prediction modules stored after the main layers (not run by the inference code)."""
    c = b.c
    n = c.num_nextn_predict_layers
    layers = tuple(range(first_layer, first_layer + n))
    ranges = _layers(layers)
    p = "model.layers.{layer}."
    h = Port("h_i", b.tokens("hidden_size"), "h")
    cat = Port(r"[h';e']", b.tokens(Dim("2d", 2 * c.hidden_size)), "concat")
    embed = _embedding(b, "embed", "MTP token embedding", p + "embed_tokens.weight", ranges,
                       note="Stored as a tensor of its own under the MTP layer's prefix.")
    enorm = _rmsnorm(b, "enorm", "Embedding RMSNorm", p + "enorm.weight", ranges, "hidden_size",
                     Port("e_{i+1}", h.shape, "e"), "e'", "e_norm", "self.enorm(embeds)")
    hnorm = _rmsnorm(b, "hnorm", "Hidden-state RMSNorm", p + "hnorm.weight", ranges, "hidden_size", h, "h'",
                     "h_norm", "self.hnorm(hidden)")
    eh = _linear(b, "eh_proj", "Combining projection", "self.eh_proj(torch.cat([h, e], -1))",
                 f"Project the concatenated {2 * c.hidden_size:,} features back to {c.hidden_size:,}.",
                 p + "eh_proj.weight", ranges, 2 * S["hidden_size"], S["hidden_size"], b.dim("hidden_size"),
                 r"x_{\mathrm{mtp}}=[h';e']\,W_{M}", cat, r"x_{\mathrm{mtp}}", "x_mtp")
    block = _block(b, "block", "MTP transformer block", layers, moe=True, label="run on the combined state")
    block = replace(block, crumb="MTP block", repeat=1, repeat_label="", repeat_formula="")
    norm = _final_norm(b, p + "shared_head.norm.weight", "head_norm", "MTP head RMSNorm", ranges)
    head = _head(b, "head", "MTP output head", p + "shared_head.head.weight", ranges)
    steps = (
        Step(r"h'=\operatorname{RMSNorm}(h_i),\quad e'=\operatorname{RMSNorm}(E_{\mathrm{tok}}[t_{i+1}])", h.shape,
             "norms"),
        eh.steps[0],
        Step(r"h^{\mathrm{mtp}}=\operatorname{Block}(x_{\mathrm{mtp}})", h.shape, "block"),
        Step(r"\ell^{\mathrm{mtp}}=\operatorname{RMSNorm}(h^{\mathrm{mtp}})\,W_{\mathrm{vocab}}",
             b.tokens("vocab_size"), "logits"),
    )
    return Component(
        key="mtp", title="Multi-token prediction module", kind="learned", code="model.layers.{num_hidden_layers + k}",
        description="Predicts one token further ahead from the main model's last hidden state and the next token's "
                    "embedding; stored in the checkpoint, skipped by transformers when it loads the model.",
        repeat=n, repeat_label="MTP modules" if n != 1 else "MTP module", repeat_formula="num_nextn_predict_layers",
        crumb=f"{n} MTP module" + ("s" if n != 1 else ""),
        inputs=(h, Port("t_{i+1}", Shape((B, T)), "next_ids")), outputs=(Port(r"\ell^{\mathrm{mtp}}",
                                                                              b.tokens("vocab_size"), "logits"),),
        equations=steps, steps=steps, children=(embed, enorm, hnorm, eh, block, norm, head),
        citations=(Citation("transformers skips the stored multi-token-prediction layer when loading.",
                            "transformers", "DeepseekV3PreTrainedModel", TRANSFORMERS_FILE),),
        notes=("Its weights are counted in what the checkpoint stores, and shown apart from the main model.",),
        program="mtp",
    )


def build_spec(slug: str, raw_config: dict, where: str) -> ModelSpec:
    """Validate a DeepSeek-V3-family config and build the model's component tree."""
    c = validate_config(raw_config, where)
    b = _Builder(c)
    k, freq, L = c.first_k_dense_replace, c.moe_layer_freq, c.num_hidden_layers
    moe_layers = tuple(i for i in range(L) if i >= k and i % freq == 0)
    dense_layers = tuple(i for i in range(L) if i not in moe_layers)
    blocks = []
    if dense_layers:
        blocks.append(_block(b, "dense", "Dense transformer block", dense_layers, False, _layer_label(dense_layers)))
    if moe_layers:
        blocks.append(_block(b, "moe", "MoE transformer block", moe_layers, True, _layer_label(moe_layers)))
    stack = Component(
        key="blocks", title="Transformer blocks", crumb=f"{L} transformer blocks", kind="group",
        code="nn.ModuleList(DeepseekV3DecoderLayer(config, i) for i in range(num_hidden_layers))",
        description=f"{L} decoder layers: {len(dense_layers)} dense, {len(moe_layers)} with a mixture of experts.",
        inputs=blocks[0].inputs, outputs=blocks[0].outputs,
        equations=(Step(r"x_{n+1}=\operatorname{Block}_n(x_n),\quad n=1,\dots," + str(L), blocks[0].inputs[0].shape,
                        "stack"),),
        children=tuple(blocks), citations=BLOCK_CITATIONS[:1], program="stack",
    )
    children = [_embedding(b, "embed", "Token embedding", "model.embed_tokens.weight"), stack]
    if c.num_nextn_predict_layers:
        children.append(_mtp(b, L))
    children += [_final_norm(b, "model.norm.weight"), _head(b, "lm_head", "LM head", "lm_head.weight")]
    logits = children[-1].outputs[0]
    root = Component(
        key="", title="Model", crumb="Model", kind="group", code="DeepseekV3ForCausalLM(config)",
        description=f"Token embedding, {L} transformer blocks, a final RMSNorm and an untied LM head.",
        inputs=children[0].inputs, outputs=(logits,),
        equations=(Step(r"x_1=E_{\mathrm{tok}}[t]", None, "embed"),
                   Step(r"x_{n+1}=\operatorname{Block}_n(x_n)", None, "blocks"),
                   Step(r"\ell=\operatorname{RMSNorm}(x_{" + str(L + 1) + r"})\,W_{\mathrm{vocab}}", logits.shape,
                        "head")),
        children=tuple(children), citations=children[0].citations[:1], program="model",
    )
    return ModelSpec(slug=slug, family=FAMILY, root=root, values=b.values, config=c)


TINY_CONFIG: dict = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
    "n_routed_experts": 8, "routed_scaling_factor": 2.5, "kv_lora_rank": 16, "q_lora_rank": 24,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "topk_method": "noaux_tc", "n_group": 2,
    "topk_group": 1, "num_experts_per_tok": 2, "moe_layer_freq": 1, "first_k_dense_replace": 1,
    "norm_topk_prob": True, "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "attention_bias": False, "tie_word_embeddings": False, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}
"""A small, self-consistent config of the family, for tests."""
