"""The site's notation: every symbol the equations use, what kind of thing it is, and what it means, once.

A symbol is what explorer/model/step_symbols.py reads out of a step: a base with its accent, primes and naming scripts
(x_{\\mathrm{attn}}, \\hat c^{KV}); index scripts (Q_h, x_n, W_{1,i}) are not part of it. Weight matrices and biases
are two families (W_{...}, b_{...}): their subscript or superscript names which matrix.

Kinds: "computed" is produced by a step and may be read only after a port brings it in or an earlier step computes
it; "parameter" is learned or stored and never computed by a step; "constant" is a size or number from the config;
"index" runs over positions, heads, experts or features. tests/test_notation.py checks every step of every model
against this registry and checks_steps() (issue 25).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from explorer.model.step_symbols import NAMED_BY_SCRIPT, parse_step, symbols_of
from explorer.spec.types import Component

Kind = Literal["computed", "parameter", "constant", "index", "function"]
Section = Literal["Streams and blocks", "Attention", "Positions", "Experts and MLPs", "Recurrent mixers",
                  "Vision", "Parameters", "Indices and sizes"]


@dataclass(frozen=True, slots=True)
class Symbol:
    """One symbol of the notation."""

    latex: str
    """The symbol as step_symbols reads it (its key)."""
    kind: Kind
    meaning: str
    section: Section
    also: str = ""
    """A second use the steps make of the symbol, with why it stays (a convention the seed pages themselves use
    both ways) or that it is to be renamed: a declared overload (tests/test_notation.py keeps the list exact, empty
    today), shown on the Notation page."""


def _s(latex: str, kind: Kind, meaning: str, section: Section, also: str = "") -> Symbol:
    return Symbol(latex, kind, meaning, section, also)


_STREAM: Section = "Streams and blocks"
_ATT: Section = "Attention"
_POS: Section = "Positions"
_EXP: Section = "Experts and MLPs"
_REC: Section = "Recurrent mixers"
_VIS: Section = "Vision"
_PAR: Section = "Parameters"
_IDX: Section = "Indices and sizes"

SYMBOLS: tuple[Symbol, ...] = (
    # ---------------------------------------------------------------- the residual stream and blocks
    _s(r"t^{\mathrm{id}}", "constant", "the token ids at the input (t^{id}_{i+1}: the next token's): upright id "
       "names them, since t alone is a position", _STREAM),
    _s(r"x", "computed", "the residual stream: x_n enters block n, x_1 is the embedding, x_L leaves the last block",
       _STREAM),
    _s(r"x'", "computed", "the stream after attention's addition, before the feed-forward network's", _STREAM),
    _s(r"x_{\mathrm{attn}}", "computed", "the normalised stream entering attention", _STREAM),
    _s(r"x_{\mathrm{ffn}}", "computed", "the normalised stream entering the feed-forward network", _STREAM),
    _s(r"x_{\mathrm{mix}}", "computed", "the normalised stream entering a hybrid block's one mixer", _STREAM),
    _s(r"x_{\mathrm{moe}}", "computed", "the normalised stream entering experts that run beside a dense MLP", _STREAM),
    _s(r"x_{\mathrm{mtp}}", "computed", "the multi-token-prediction module's input: next-token embedding and hidden "
       "state, projected together", _STREAM),
    _s(r"\bar x_{\mathrm{attn}}", "computed", "hyper-connections: the streams collapsed into attention's input",
       _STREAM),
    _s(r"\bar x_{\mathrm{ffn}}", "computed", "hyper-connections: the streams collapsed into the FFN's input", _STREAM),
    _s(r"\hat x", "computed", "the final normalised stream that the LM head reads", _STREAM),
    _s(r"\Delta_{\mathrm{attn}}", "computed", "what attention adds to the residual stream", _STREAM),
    _s(r"\Delta_{\mathrm{ffn}}", "computed", "what the feed-forward network adds to the residual stream", _STREAM),
    _s(r"\Delta_{\mathrm{mlp}}", "computed", "the dense MLP's output where experts run beside it", _STREAM),
    _s(r"\bar \Delta_{\mathrm{attn}}", "computed", "attention's addition after its post-norm", _STREAM),
    _s(r"\bar \Delta_{\mathrm{ffn}}", "computed", "the FFN's addition after its post-norm", _STREAM),
    _s(r"\bar \Delta_{\mathrm{mlp}}", "computed", "the dense MLP's output after its post-norm", _STREAM),
    _s(r"\Delta_{\mathrm{mix}}", "computed", "what a hybrid block's one mixer adds to the stream", _STREAM),
    _s(r"\ell", "computed", "logits over the vocabulary", _STREAM),
    _s(r"\ell_{\mathrm{raw}}", "computed", "logits before the final soft cap", _STREAM),
    _s(r"\ell^{\mathrm{mtp}}", "computed", "the multi-token-prediction module's logits for the token after next",
       _STREAM),
    _s(r"h'", "computed", "MTP: the main model's last stream (x_{L,i}), normalised", _STREAM),
    _s(r"e'", "computed", "MTP: the normalised embedding of the next token", _STREAM),
    _s(r"h^{\mathrm{mtp}}", "computed", "MTP: the output of its transformer block", _STREAM),
    _s(r"X", "computed", "hyper-connections: the hc_mult parallel residual streams (X_n entering block n)", _STREAM),
    _s(r"X'", "computed", "hyper-connections: the streams after attention's addition", _STREAM),
    _s(r"\hat X", "computed", "hyper-connections: the flattened, normalised streams", _STREAM),
    _s(r"a^{\mathrm{pre}}", "computed", "hyper-connections: raw pre-mixing weights", _STREAM),
    _s(r"a^{\mathrm{post}}", "computed", "hyper-connections: raw post-mixing weights", _STREAM),
    _s(r"a^{\mathrm{res}}", "computed", "hyper-connections: raw stream-mixing weights, one per pair of streams",
       _STREAM),
    _s(r"\pi^{\mathrm{pre}}", "computed", "hyper-connections: how much of each stream enters the layer", _STREAM),
    _s(r"\pi^{\mathrm{post}}", "computed", "hyper-connections: how much of the layer's output each stream gets",
       _STREAM),
    _s(r"\pi^{\mathrm{head}}", "computed", "hyper-connections: the final collapse weights before the head", _STREAM),
    _s(r"\pi", "constant", "the circle constant", _IDX),
    _s(r"P", "computed", "hyper-connections: the doubly stochastic stream-mixing matrix (Sinkhorn)", _STREAM),
    _s(r"x^{\mathrm{pos}}", "computed", "GPT-2: the learned position vectors, one per position (x^{pos}_t)", _STREAM),
    _s(r"s_{\mathrm{layer}}", "parameter", "a stored per-layer scalar that multiplies the block's output (Gemma 4)",
       _PAR),
    # ---------------------------------------------------------------- attention
    _s(r"q", "computed", "queries, all heads side by side", _ATT),
    _s(r"k", "computed", "keys, all key heads side by side", _ATT),
    _s(r"v", "computed", "values, all value heads side by side", _ATT),
    _s(r"\hat q", "computed", "QK-normed (or L2-normed) queries", _ATT),
    _s(r"\hat k", "computed", "QK-normed (or L2-normed) keys", _ATT),
    _s(r"\tilde q", "computed", "queries after a vision tower's 2D rotary embedding", _ATT),
    _s(r"\tilde k", "computed", "keys after a vision tower's 2D rotary embedding", _ATT),
    _s(r"Q", "computed", "queries per head (Q_h for head h)", _ATT),
    _s(r"K", "computed", "keys per head (K_h, repeated for query head h under grouped-query attention)", _ATT),
    _s(r"V", "computed", "values per head (V_h)", _ATT),
    _s(r"\hat Q", "computed", "QK-normed queries per head", _ATT),
    _s(r"\hat K", "computed", "QK-normed keys per head", _ATT),
    _s(r"\hat V", "computed", "normed values per head", _ATT),
    _s(r"\bar Q", "computed", "L2-normed rotated queries (Llama 4)", _ATT),
    _s(r"\bar K", "computed", "L2-normed rotated keys (Llama 4)", _ATT),
    _s(r"Q^{R}", "computed", "rotated queries (RoPE applied)", _ATT),
    _s(r"K^{R}", "computed", "rotated keys (RoPE applied)", _ATT),
    _s(r"Q^{\tau}", "computed", "queries scaled by a position-dependent temperature", _ATT),
    _s(r"c^{Q}", "computed", "MLA: the query latent", _ATT),
    _s(r"c^{KV}", "computed", "MLA: the key-value latent, the part the cache holds", _ATT),
    _s(r"\hat c^{Q}", "computed", "MLA: the normalised query latent", _ATT),
    _s(r"\hat c^{KV}", "computed", "MLA: the normalised key-value latent", _ATT),
    _s(r"q^{C}", "computed", "MLA: the content (position-free) part of the queries", _ATT),
    _s(r"k^{C}", "computed", "MLA: the content part of the keys", _ATT),
    _s(r"Q^{C}", "computed", "MLA: content queries per head", _ATT),
    _s(r"K^{C}", "computed", "MLA: content keys per head", _ATT),
    _s(r"q^{\mathrm{pe}}", "computed", "MLA: the rotary part of the queries, before rotation", _ATT),
    _s(r"k^{\mathrm{pe}}", "computed", "MLA: the rotary part of the key (one, shared by all heads), before rotation",
       _ATT),
    _s(r"Q^{\mathrm{pe}}", "computed", "MLA: rotary queries per head, before rotation", _ATT),
    _s(r"k^{R}", "computed", "MLA: the rotated shared rotary key", _ATT),
    _s(r"\tau", "constant", "the softmax scale, from the config (the scores page derives it)", _ATT),
    _s(r"M", "computed", "the attention mask: 0 where a query may see a key, −∞ where it may not", _ATT),
    _s(r"A", "computed", "attention weights, the softmax over keys (A_h per head)", _ATT),
    _s(r"O", "computed", "each head's context: its attention weights applied to the values (O_h)", _ATT),
    _s(r"\tilde O", "computed", "the context after its output gate (or un-rotation)", _ATT),
    _s(r"g^{\mathrm{head}}", "computed", "head-gated attention: one gate logit per query head and token "
       "(g^{head}_h), from its own projection", _ATT),
    _s(r"O^{\mathrm{grp}}", "computed", "the context in groups of heads for a grouped output projection", _ATT),
    _s(r"O^{A}", "computed", "each head group's context projected by its own matrix (O^{A}_j for group j)", _ATT),
    _s(r"\kappa", "parameter", "a learned attention-sink logit per head (κ_h): a column every query may attend to "
       "that carries no value", _ATT),
    _s(r"G", "computed", "gate values: per routed expert (G_i), or an attention output gate", _ATT),
    _s(r"\tilde w", "computed", "sparse-attention indexer: per-head weights before their 1/√heads scale", _ATT),
    _s(r"q^{I}", "computed", "sparse-attention indexer: its queries", _ATT),
    _s(r"k^{I}", "computed", "sparse-attention indexer: its key", _ATT),
    _s(r"\hat k^{I}", "computed", "sparse-attention indexer: its normalised key", _ATT),
    _s(r"Q^{I}", "computed", "sparse-attention indexer: queries per indexer head", _ATT),
    _s(r"Q^{IR}", "computed", "sparse-attention indexer: rotated queries", _ATT),
    _s(r"K^{I}", "computed", "sparse-attention indexer: the rotated key", _ATT),
    _s(r"w'", "computed", "sparse-attention indexer: per-head weights (w'_{t,h})", _ATT),
    _s(r"\tilde I", "computed", "sparse-attention indexer: its scores per head (Ĩ_{t,h,s}), before the weighted "
       "sum over heads", _ATT),
    _s(r"I", "computed", "indexer scores per key position (I_{t,s})", _ATT),
    _s(r"M^{\mathrm{sel}}", "computed", "sparse attention: the mask that keeps the selected keys", _ATT),
    _s(r"M^{\mathrm{DSA}}", "computed", "sparse attention: the causal mask plus the selection mask", _ATT),
    _s(r"\hat Q^{I}", "computed", "block indexer: its queries, normalised per head", _ATT),
    _s(r"I^{\mathrm{blk}}", "computed", "block indexer: a key block's score, the best of its keys' (I^{blk}_{h,t,j})",
       _ATT),
    _s(r"\hat I^{\mathrm{blk}}", "computed", "block indexer: the block scores with the query's local blocks forced "
       "to +∞", _ATT),
    _s(r"M^{\mathrm{MSA}}", "computed", "MiniMax sparse attention: the causal mask plus each key block's selection, "
       "per head", _ATT),
    _s(r"C^{\mathrm{kv}}", "computed", "compressed attention: projected entries before pooling", _ATT),
    _s(r"C", "computed", "Mamba-2: the read-out vector C_t", _REC),
    _s(r"Z", "computed", "compressed attention: pooling logits", _ATT),
    _s(r"C^{I}", "computed", "compressed indexer: projected entries", _ATT),
    _s(r"Z^{I}", "computed", "compressed indexer: pooling logits", _ATT),
    _s(r"\mathcal{C}", "computed", "compressed attention: a window's entries, overlapping halves concatenated",
       _ATT),
    _s(r"\mathcal{Z}", "computed", "compressed attention: a window's pooling logits", _ATT),
    _s(r"\tilde c", "computed", "compressed attention: a pooled entry, before its norm and rotation", _ATT),
    _s(r"\tilde c^{I}", "computed", "compressed indexer: a pooled entry", _ATT),
    _s(r"c", "computed", "compressed attention: an entry (c_w)", _ATT),
    _s(r"c^{I}", "computed", "compressed indexer: an entry", _ATT),
    _s(r"\mathcal{S}", "computed", "compressed indexer: the entries each query selects", _ATT),
    _s(r"\mathcal{V}", "computed", "compressed attention: which entries a query may see", _ATT),
    _s(r"w", "parameter", "a causal convolution's learned taps (w_j); as a subscript, a compressed window", _PAR),
    _s(r"\hat o", "computed", "DeltaNet: the normed, gated read-out", _ATT),
    _s(r"o", "computed", "DeltaNet: the read-out from the state", _ATT),
    # ---------------------------------------------------------------- positions
    _s(r"R", "computed", "the rotary angles of each position (R_t)", _POS),
    _s(r"\theta", "computed", "RoPE base frequencies (θ_j)", _POS),
    _s(r"a_{\mathrm{YaRN}}", "constant", "YaRN's magnitude factor, 0.1·ln s + 1 for a stretch s: it multiplies cos and "
       "sin, and MLA's softmax scale by its square", _POS),
    _s(r"\omega", "computed", "RoPE frequencies after any scaling (ω_j)", _POS),
    _s(r"\lambda", "computed", "Llama 3 RoPE: the wavelength of frequency j, λ_j = 2π/θ_j", _POS),
    _s(r"\phi", "computed", "RoPE scaling: the weight φ_j that blends frequency j's original and stretched values "
       "(YaRN's ramp, Llama 3's smoothing factor)", _POS),
    _s(r"j_{\mathrm{low}}", "computed", "YaRN: the last frequency kept as is", _POS),
    _s(r"j_{\mathrm{high}}", "computed", "YaRN: the first frequency fully interpolated", _POS),
    _s(r"p^{\mathrm{t}}", "computed", "multimodal RoPE: a token's time position (p^t_t)", _POS),
    _s(r"p^{\mathrm{h}}", "computed", "multimodal RoPE: a token's height position, its row added for an image token",
       _POS),
    _s(r"p^{\mathrm{w}}", "computed", "multimodal RoPE: a token's width position, its column added for an image token",
       _POS),
    _s(r"p^{\mathrm{pair}}", "computed", "multimodal RoPE: the position rotary pair j of token t turns with (p^pair_{t,j}), "
       "from the axis the pair is dealt to", _POS),
    _s(r"t_{\mathrm{img}}", "constant", "multimodal RoPE: the position at which an image starts", _POS),
    # ---------------------------------------------------------------- experts and MLPs
    _s(r"z", "computed", "router logits, one per routed expert (z_i), from the router matrix W_r", _EXP),
    _s(r"\psi", "computed", "vision: the patch stream, a vision tower's own residual stream (ψ_i: patch i's "
       "embedding; ψ_n enters vision block n). A letter of its own, no other part's: not x, since it runs over "
       "patches rather than tokens and often at another width, and not z (ViT's letter), the router's logits", _VIS),
    _s(r"\psi'", "computed", "a vision block's stream after attention's addition", _VIS),
    _s(r"\rho", "computed", "the router's affinity for each routed expert, scored on its own (a sigmoid or √softplus "
       "of its logit) and not normalised over the experts", _EXP),
    _s(r"p", "computed", "the router's probabilities, a softmax over the routed experts", _EXP),
    _s(r"\mathcal{P}", "constant", "vision: the image's pixel values (𝒫_i: patch i's)", _VIS),
    _s(r"\chi", "computed", "the router's affinities with the experts outside the kept groups set to −∞", _EXP),
    _s(r"x_{\mathrm{route}}", "computed", "the router's normalised, scaled input (Gemma 4)", _EXP),
    _s(r"s_{\mathrm{r}}", "parameter", "the router's learned scale per feature (Gemma 4)", _PAR),
    _s(r"s^{E}", "parameter", "the router's learned scale per expert (Gemma 4)", _PAR),
    _s(r"\zeta", "parameter", "hyper-connections: learned scales of the pre, post and mixing logits (ζ_1, ζ_2, ζ_3)",
       _PAR),
    _s(r"\bar \psi", "computed", "vision: a group of normalised patch vectors, concatenated (one image token)", _VIS),
    _s(r"\psi^{\mathrm{grp}}", "computed", "vision: a group of neighbouring patch vectors (MoonViT)", _VIS),
    _s(r"\hat \psi^{\mathrm{grp}}", "computed", "vision: a group's patch vectors, each normalised", _VIS),
    _s(r"\psi^{\mathrm{pool}}", "computed", "vision: the patch grid average-pooled to the image's tokens", _VIS),
    _s(r"\hat \psi^{\mathrm{pool}}", "computed", "vision: the pooled image tokens, normalised", _VIS),
    _s(r"\psi^{\mathrm{cat}}", "computed", "vision: a group of neighbouring patch vectors concatenated before their "
       "norm (a DeepStack merger's input)", _VIS),
    _s(r"\hat \psi^{\mathrm{cat}}", "computed", "vision: a concatenated group of patch vectors, normalised as one "
       "vector", _VIS),
    _s(r"F", "computed", "DeepStack: the features a DeepStack merger makes of a vision block's output (F_k), added at the "
       "image tokens after text layer k", _VIS),
    _s(r"m^{\mathrm{img}}", "computed", "DeepStack: 1 at an image token, 0 at a text token (m^img_t)", _VIS),
    _s(r"x_{\mathrm{img}}", "computed", "vision: the image tokens a vision tower hands to the language model, in its "
       "width", _VIS),
    _s(r"E^{\mathrm{sel}}", "computed", "1 for the experts selected for a token, 0 for the rest", _EXP),
    _s(r"\mathcal{G}", "computed", "the expert groups a token may pick from", _EXP),
    _s(r"E", "computed", "the output of routed expert i (E_i)", _EXP),
    _s(r"y^{\mathrm{routed}}", "computed", "the routed experts' weighted sum", _EXP),
    _s(r"\bar y^{\mathrm{routed}}", "computed", "the routed sum after its post-norm", _EXP),
    _s(r"x^{\mathrm{lat}}", "computed", "latent MoE: the token projected into the routed experts' latent width", _EXP),
    _s(r"y^{\mathrm{lat}}", "computed", "latent MoE: the routed experts' weighted sum in the latent width, before "
       "the projection back", _EXP),
    _s(r"y^{\mathrm{shared}}", "computed", "the shared expert's output", _EXP),
    _s(r"E_{\mathrm{sh}}", "computed", "the shared expert's output before its sigmoid gate", _EXP),
    _s(r"\eta", "computed", "the shared expert's gate logit", _EXP),
    _s(r"\tilde x", "computed", "an expert's input scaled by its gate", _EXP),
    _s(r"g", "computed", "the gate projection (g_i for expert i)", _EXP),
    _s(r"u", "computed", "the up projection (u_i for expert i)", _EXP),
    _s(r"a", "computed", "the activated gate: SiLU(g) or GELU(g)", _EXP),
    _s(r"m", "computed", "an MLP's hidden activation, the one its down projection reads: a ⊙ u in a gated MLP, "
       "GELU(g) or ReLU(u)² in a plain one (m_i for expert i)", _EXP),
    _s(r"h", "index", "indexes a head (Q_h, A_h, O_h)", _IDX),
    _s(r"i", "index", "indexes a routed expert (G_i, E_i), a patch (row(i), col(i): its row and column in the "
       "image), a position in a chunk, or a key head's group of fused projections (π^{qkvz}_i)", _IDX),
    _s(r"j", "index", "indexes a feature pair (θ_j), the experts a sum runs over, a head group (O^{A}_j) or a key block "
       "(I^{blk}_{h,t,j})", _IDX),
    _s(r"n", "index", "indexes a block (x_n enters block n)", _IDX),
    _s(r"s", "index", "indexes a key position (M_{ts}: query t, key s)", _IDX),
    _s(r"t", "index", "indexes a position (R_t, x^{pos}_t, t = 0, …, T − 1); in attention, the query's (M_{ts}: query "
       "t, key s)", _IDX),
    _s(r"\hat g", "computed", "the clamped gate projection", _EXP),
    _s(r"\hat u", "computed", "the clamped up projection", _EXP),
    _s(r"g_{\mathrm{sh}}", "computed", "the shared expert's gate projection", _EXP),
    _s(r"u_{\mathrm{sh}}", "computed", "the shared expert's up projection", _EXP),
    _s(r"a_{\mathrm{sh}}", "computed", "the shared expert's activated gate", _EXP),
    _s(r"m_{\mathrm{sh}}", "computed", "the shared expert's gated product", _EXP),
    _s(r"\hat g_{\mathrm{sh}}", "computed", "the shared expert's clamped gate projection", _EXP),
    _s(r"\hat u_{\mathrm{sh}}", "computed", "the shared expert's clamped up projection", _EXP),
    _s(r"e", "index", "indexes a routed expert in experts stored as one tensor (G_e, E_e, W^{gu}_e)", _IDX),
    # ---------------------------------------------------------------- recurrent mixers
    _s(r"\xi", "computed", "a recurrent mixer's convolution input: x, B, C together (Mamba-2), q, k, v together "
       "(DeltaNet)", _REC),
    _s(r"\tilde \xi", "computed", "a recurrent mixer's convolved input", _REC),
    _s(r"\xi_{q}", "computed", "KDA: the query projection, before the convolution", _REC),
    _s(r"\xi_{k}", "computed", "KDA: the key projection, before the convolution", _REC),
    _s(r"\xi_{v}", "computed", "KDA: the value projection, before the convolution", _REC),
    _s(r"c^{\alpha}", "computed", "KDA: the forget gate's low-rank latent (d_k wide)", _REC),
    _s(r"c^{g}", "computed", "KDA: the output gate's low-rank latent (d_k wide)", _REC),
    _s(r"\delta", "computed", "Mamba-2: the raw step size", _REC),
    _s(r"\nu", "computed", "Mamba-2: the step size ν_t (the papers' Δ), softplus of δ_t plus a bias", _REC),
    _s(r"B", "computed", "Mamba-2: the write vector B_t", _REC),
    _s(r"\bar a", "computed", "Mamba-2: the per-step decay", _REC),
    _s(r"y", "computed", "Mamba-2: the read-out y_t", _REC),
    _s(r"\hat y", "computed", "Mamba-2: the gated, normed read-out", _REC),
    _s(r"L", "computed", "Mamba-2: the decay mask within a chunk", _REC),
    _s(r"\alpha", "computed", "DeltaNet: the per-step decay α_t", _REC),
    _s(r"\beta", "computed", "DeltaNet: the write strength β_t, how much of the correction is written", _REC),
    _s(r"\beta^{\mathrm{raw}}", "computed", "DeltaNet: the write-strength logit before its sigmoid", _REC),
    _s(r"\alpha^{\mathrm{raw}}", "computed", "DeltaNet: the decay input before its softplus", _REC),
    _s(r"\pi^{\mathrm{qkvz}}", "computed", "DeltaNet with fused projections (Qwen3-Next): in_proj_qkvz's output, one "
       "group per key head (π^{qkvz}_i: key head i's q, k, v and gate)", _REC),
    _s(r"\pi^{\mathrm{ba}}", "computed", "DeltaNet with fused projections (Qwen3-Next): in_proj_ba's output, one group "
       "per key head (π^{ba}_i: key head i's write-strength logits and decay inputs)", _REC),
    _s(r"S", "computed", "a recurrent mixer's state (S_t after position t)", _REC),
    _s(r"\Gamma", "computed", "DeltaNet: cumulative decays within a chunk", _REC),
    _s(r"\gamma", "parameter", "a norm's learned gain per feature", _PAR),
    _s(r"\bar \alpha", "computed", "DeltaNet: the decay since the chunk's start (ᾱ_i, the product of the α before "
       "position i)", _REC),
    _s(r"U", "computed", "DeltaNet: the chunk's corrected values, from one triangular solve", _REC),
    _s(r"D", "parameter", "Mamba-2: the learned skip weight per head", _REC),
    _s(r"\epsilon", "constant", "a norm's small constant", _PAR),
    _s(r"\mu", "computed", "LayerNorm: the mean of the features", _PAR),
    _s(r"\sigma", "function", "the logistic sigmoid, 1/(1+e^{−x}); LayerNorm's variance is written out, "
       "mean((x − μ)²), not as σ²", _PAR),
    _s(r"A_{\log}", "parameter", "the log of a learned decay rate per head (Mamba-2, DeltaNet)", _REC),
    _s(r"T", "constant", "the number of positions", _IDX),
    # ---------------------------------------------------------------- vision
    _s(r"\hat \psi_{\mathrm{out}}", "computed", "vision: the tower's output scaled to unit RMS before its projection",
       _VIS),
    _s(r"\hat \psi", "computed", "vision: a normalised stream", _VIS),
    _s(r"\psi_{\mathrm{attn}}", "computed", "vision: the normalised stream entering attention", _VIS),
    _s(r"\psi_{\mathrm{ffn}}", "computed", "vision: the normalised stream entering the MLP", _VIS),
    _s(r"\psi_{\mathrm{out}}", "computed", "vision: the tower's output, its last stream after the final norm", _VIS),
    # ---------------------------------------------------------------- parameters and sizes
    _s(r"W", "parameter", "a learned weight matrix; its subscript or superscript names which (W_Q, W_{DKV}, "
       "W_{1,i}: expert i's gate matrix)", _PAR),
    _s(r"b", "parameter", "a learned bias; its subscript names which (b_Q); alone, the router's correction bias or a "
       "LayerNorm's bias", _PAR),
    _s(r"E_{\mathrm{tok}}", "parameter", "the token embedding table", _PAR),
    _s(r"E_{\mathrm{pos}}", "parameter", "the learned position table", _PAR),
    _s(r"E^{x}_{\mathrm{pos}}", "parameter", "vision: the learned column-position table", _PAR),
    _s(r"E^{y}_{\mathrm{pos}}", "parameter", "vision: the learned row-position table", _PAR),
    _s(r"w_{\mathrm{gate}}", "parameter", "the shared expert's gate vector", _PAR),
    _s(r"s_{\mathrm{std}}", "parameter", "vision: the stored standardisation scale", _PAR),
    _s(r"B^{\mathrm{res}}", "parameter", "hyper-connections: the learned bias of the stream-mixing weights",
       _PAR),
    _s(r"B^{a}", "parameter", "compressed attention: the learned position bias of the first half", _PAR),
    _s(r"B^{b}", "parameter", "compressed attention: the learned position bias of the second half", _PAR),
    _s(r"B^{\mathrm{pos}}", "parameter", "compressed attention: the learned bias of each position in a window "
       "(B^{pos}_j)", _PAR),
    _s(r"C^{a}", "computed", "compressed attention: the first half of an entry's projection", _ATT),
    _s(r"C^{b}", "computed", "compressed attention: the second half of an entry's projection", _ATT),
    _s(r"Z^{a}", "computed", "compressed attention: the first half's pooling logits", _ATT),
    _s(r"Z^{b}", "computed", "compressed attention: the second half's pooling logits", _ATT),
    _s(r"d", "constant", "the feature count (d_head: of one head)", _IDX),
    _s(r"d_{\mathrm{head}}", "constant", "features per attention head", _IDX),
)

BY_LATEX: dict[str, Symbol] = {s.latex: s for s in SYMBOLS}


def lookup(symbol: str) -> Symbol | None:
    """The registry's entry for a symbol: its own, or its family's (W_{DQ} -> W)."""
    if symbol in BY_LATEX:
        return BY_LATEX[symbol]
    base = symbol.split("_")[0].split("^")[0]
    return BY_LATEX[base] if base in NAMED_BY_SCRIPT and base != symbol else None


def _kind(symbol: str) -> Kind | None:
    entry = lookup(symbol)
    return entry.kind if entry else None


def unregistered(comp: Component) -> list[str]:
    """Each symbol comp's steps and ports use that the registry does not define."""
    used = [s for p in (*comp.inputs, *comp.outputs) for s in symbols_of(p.latex)]
    for step in comp.steps:
        if not step.heading:
            parsed = parse_step(step.latex)
            used += [*parsed.defines, *parsed.reads, *parsed.indices]
    return sorted({s for s in used if _kind(s) is None})


def _plain(symbol: str) -> str:
    """The symbol without its accent and superscript: \\hat Q, Q^{R} -> Q (forms of one tensor)."""
    if " " in symbol and symbol.split(" ")[0].lstrip("\\") in ("hat", "tilde", "bar"):
        symbol = symbol.split(" ", 1)[1]
    head, _, rest = symbol.partition("^")
    sub = rest.partition("}")[2] if rest.startswith("{") else rest[1:]
    return head + sub


def undefined_reads(comp: Component) -> list[str]:
    """Each computed symbol a step reads that no input port brings and no earlier step computes, or that a later
    form has superseded (reading Q after \\hat Q or Q^{R} was computed from it); and each parameter a step
    computes, or a function (σ² = var(x) would make σ a variance). As "step 'name' reads Q, K ..."."""
    known = {s for p in comp.inputs for s in symbols_of(p.latex)}
    superseded: dict[str, str] = {}
    made_from: dict[str, frozenset[str]] = {}
    out = []
    for step in comp.steps:
        if step.heading:
            continue
        parsed = parse_step(step.latex)
        missing = sorted(s for s in parsed.reads if _kind(s) in ("computed", None) and s not in known)
        if missing:
            out.append(f"step '{step.name}' reads {', '.join(missing)}, which no input or earlier step gives")
        stale = sorted(s for s in parsed.reads if s in superseded
                       and not _weighted_by_its_form(s, superseded[s], parsed.reads, made_from))
        if stale:
            out.append(f"step '{step.name}' reads {', '.join(stale)}, superseded by "
                       f"{', '.join(superseded[s] for s in stale)}")
        for d in parsed.defines:
            superseded.pop(d, None)
            superseded.update({r: d for r in parsed.reads if r != d and _plain(r) == _plain(d)})
            made_from[d] = parsed.reads.union(*(made_from.get(r, ()) for r in parsed.reads))
        for kind in ("parameter", "function"):  # a learned weight or a named function: never a step's result
            computed = sorted(s for s in parsed.defines if _kind(s) == kind)
            if computed:
                out.append(f"step '{step.name}' computes {', '.join(computed)}, registered as a {kind}")
        indexed_indices = sorted(s for s in parsed.subscripted if _kind(s) == "index")
        if indexed_indices:
            out.append(f"step '{step.name}' writes {', '.join(indexed_indices)} with an index, registered as an index")
        known |= parsed.defines
    return out


def unread_inputs(comp: Component) -> list[str]:
    """Each input port whose symbol no step of comp mentions (a page would list an input nothing uses), as
    "input R (R) is read by no step"; a component without steps is a group and reads through its children.

    Mentioned: read, read as an index, or defined. A step that reads an input may also define it, and the parser
    then counts it as defined only: the convolution's boundary clause (xi_{<1} = the conv state) beside its read of
    xi_{t-3+j}, the positions' range t = 0..T-1, the patch positions psi^+ = psi_0 + ... ."""
    if not any(not s.heading for s in comp.steps):
        return []
    parsed = [parse_step(s.latex) for s in comp.steps if not s.heading]
    mentioned = frozenset().union(*(p.reads | p.indices | p.defines for p in parsed))
    return [f"input {p.name} ({symbol}) is read by no step" for p in comp.inputs for symbol in symbols_of(p.latex)
            if symbol not in mentioned]


def _weighted_by_its_form(raw: str, form: str, reads: frozenset[str], made_from: dict[str, frozenset[str]]) -> bool:
    """Whether a step that reads raw after form superseded it also reads weights computed from that form.

    A form replaces its tensor when the computation carries on with it (scores read Q^{R}, not Q). But a copy can be
    made only to compute weights for the tensor itself: hyper-connections flatten and norm the streams X into
    \\hat X, project \\hat X to mixing weights, and then mix the streams X, not \\hat X, by them. Such a step reads
    the raw tensor as computed; a step that reads it without anything made from its form (scores from Q and K^{R})
    still skips the form."""
    return any(form in made_from.get(r, ()) for r in reads if r != raw)
