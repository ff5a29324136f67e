"""Tiny random GGUF checkpoints of the site's tiny configs, written with the `gguf` package, so that llama.cpp can
load them as a test oracle of what it allocates (tests/test_llama_cpp_oracle.py).

Each writer states the family's tiny config in llama.cpp's terms: the architecture name llama.cpp registers for it
(src/llama-arch.cpp), the hyperparameters its loader reads (src/models/ARCH.cpp, `load_arch_hparams`) and exactly the
tensors its `load_arch_tensors` creates, at the shapes it checks. The weights are random: only the shapes and the
metadata decide the cache, and llama.cpp refuses a file whose tensors are missing, extra or misshapen. The tokenizer
is llama.cpp's "none" model, which adds `vocab_size` dummy tokens (src/llama-vocab.cpp), so no vocabulary is needed.

Shapes are written as numpy arrays, (out, in) as in a Linear's weight; GGUF stores them reversed, as the {in, out}
llama.cpp's loader names.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import gguf
import numpy as np

from explorer.model.families import gemma4, llama4, mimo_v2_flash
from explorer.model.families.gemma3 import layer_types as gemma3_layer_types
from explorer.spec.types import ModelSpec


class _Checkpoint:
    """One GGUF file being written: metadata under the architecture's prefix, random float32 tensors."""

    def __init__(self, path: Path, arch: str, c: Any, heads: int | list[int] | None = None,
                 ffn: int | list[int] | None = None) -> None:
        self.w = gguf.GGUFWriter(path, arch)
        self.c = c
        self.rng = np.random.default_rng(0)
        w = self.w
        w.add_tokenizer_model("none")
        w.add_vocab_size(c.vocab_size)
        w.add_context_length(c.max_position_embeddings)
        w.add_embedding_length(c.hidden_size)
        w.add_block_count(c.num_hidden_layers)
        w.add_feed_forward_length(ffn or c.intermediate_size)
        w.add_head_count(heads or c.num_attention_heads)
        if hasattr(c, "rms_norm_eps"):
            w.add_layer_norm_rms_eps(c.rms_norm_eps)
        if getattr(c, "rope_theta", None):
            w.add_rope_freq_base(c.rope_theta)

    def tensor(self, name: str, *shape: int) -> None:
        self.w.add_tensor(name, (self.rng.standard_normal(shape) * 0.02).astype(np.float32))

    def attention_heads(self, head_dim: int, kv_heads: int, rotary: int | None = None) -> None:
        self.w.add_head_count_kv(kv_heads)
        self.w.add_key_length(head_dim)
        self.w.add_value_length(head_dim)
        self.w.add_rope_dimension_count(rotary or head_dim)

    def embeddings(self, tied: bool) -> None:
        c = self.c
        self.tensor("token_embd.weight", c.vocab_size, c.hidden_size)
        self.tensor("output_norm.weight", c.hidden_size)
        if not tied:
            self.tensor("output.weight", c.vocab_size, c.hidden_size)

    def qkvo(self, i: int, head_dim: int, kv_heads: int, q_heads: int | None = None) -> None:
        d, h = self.c.hidden_size, q_heads or self.c.num_attention_heads
        self.tensor(f"blk.{i}.attn_q.weight", h * head_dim, d)
        self.tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, d)
        self.tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, d)
        self.tensor(f"blk.{i}.attn_output.weight", d, h * head_dim)

    def dense_ffn(self, i: int, width: int) -> None:
        d = self.c.hidden_size
        self.tensor(f"blk.{i}.ffn_gate.weight", width, d)
        self.tensor(f"blk.{i}.ffn_up.weight", width, d)
        self.tensor(f"blk.{i}.ffn_down.weight", d, width)

    def experts(self, i: int, experts: int, width: int) -> None:
        d = self.c.hidden_size
        self.tensor(f"blk.{i}.ffn_gate_inp.weight", experts, d)
        self.tensor(f"blk.{i}.ffn_gate_exps.weight", experts, width, d)
        self.tensor(f"blk.{i}.ffn_up_exps.weight", experts, width, d)
        self.tensor(f"blk.{i}.ffn_down_exps.weight", experts, d, width)

    def biased_experts_with_shared(self, i: int, experts: int, width: int, shared: int) -> None:
        """DeepSeek's MoE layer: routed experts, the router's correction bias and `shared` shared experts' width."""
        d = self.c.hidden_size
        self.experts(i, experts, width)
        self.tensor(f"blk.{i}.exp_probs_b.bias", experts)
        self.tensor(f"blk.{i}.ffn_gate_shexp.weight", width * shared, d)
        self.tensor(f"blk.{i}.ffn_up_shexp.weight", width * shared, d)
        self.tensor(f"blk.{i}.ffn_down_shexp.weight", d, width * shared)

    def norms(self, i: int, *names: str, width: int | None = None) -> None:
        for n in names:
            self.tensor(f"blk.{i}.{n}.weight", width or self.c.hidden_size)

    def close(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def _head_dim(c: Any) -> int:
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def _llama(path: Path, c: Any) -> None:
    """src/models/llama.cpp: full attention with grouped K/V heads, a gated MLP."""
    g = _Checkpoint(path, "llama", c)
    hd = _head_dim(c)
    g.attention_heads(hd, c.num_key_value_heads)
    g.embeddings(c.tie_word_embeddings)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "ffn_norm")
        g.qkvo(i, hd, c.num_key_value_heads)
        g.dense_ffn(i, c.intermediate_size)
    g.close()


def _qwen3(path: Path, c: Any) -> None:
    """src/models/qwen3.cpp: Llama's layers with per-head RMS norms of queries and keys; head_dim is set apart from
    hidden_size / heads (24 against 16 in the tiny config), so the cache width is the config's, not the quotient."""
    g = _Checkpoint(path, "qwen3", c)
    hd = _head_dim(c)
    g.attention_heads(hd, c.num_key_value_heads)
    g.embeddings(c.tie_word_embeddings)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "ffn_norm")
        g.norms(i, "attn_q_norm", "attn_k_norm", width=hd)
        g.qkvo(i, hd, c.num_key_value_heads)
        g.dense_ffn(i, c.intermediate_size)
    g.close()


def _gemma3(path: Path, c: Any) -> None:
    """src/models/gemma3.cpp: sliding and global layers, which layer is which given per layer
    (attention.sliding_window_pattern as an array, read by load_swa_pattern) from the config's own layer types."""
    g = _Checkpoint(path, "gemma3", c)
    hd = _head_dim(c)
    g.attention_heads(hd, c.num_key_value_heads)
    g.w.add_sliding_window(c.sliding_window)
    g.w.add_sliding_window_pattern([t == "sliding_attention" for t in gemma3_layer_types(c)])
    g.w.add_rope_freq_base_swa(c.rope_local_base_freq)
    g.embeddings(tied=True)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
        g.norms(i, "attn_q_norm", "attn_k_norm", width=hd)
        g.qkvo(i, hd, c.num_key_value_heads)
        g.dense_ffn(i, c.intermediate_size)
    g.close()


def _gpt_oss(path: Path, c: Any) -> None:
    """src/models/openai-moe.cpp ("gpt-oss"): sliding and full layers as layer_types lists them, attention sinks,
    biased experts."""
    g = _Checkpoint(path, "gpt-oss", c)
    hd, kv, e = _head_dim(c), c.num_key_value_heads, c.num_local_experts
    g.attention_heads(hd, kv)
    g.w.add_sliding_window(c.sliding_window)
    g.w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
    g.w.add_expert_count(e)
    g.w.add_expert_used_count(c.num_experts_per_tok)
    g.w.add_expert_feed_forward_length(c.intermediate_size)
    g.embeddings(tied=False)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "post_attention_norm")
        g.qkvo(i, hd, kv)
        g.tensor(f"blk.{i}.attn_output.bias", c.hidden_size)
        g.tensor(f"blk.{i}.attn_sinks.weight", c.num_attention_heads)
        g.experts(i, e, c.intermediate_size)
        g.tensor(f"blk.{i}.ffn_gate_inp.bias", e)
        g.tensor(f"blk.{i}.ffn_gate_exps.bias", e, c.intermediate_size)
        g.tensor(f"blk.{i}.ffn_up_exps.bias", e, c.intermediate_size)
        g.tensor(f"blk.{i}.ffn_down_exps.bias", e, c.hidden_size)
    g.close()


def _leading_dense(c: Any) -> int:
    """Dense MLP layers before the first with experts: first_k_dense_replace, or mlp_layer_types' leading "dense"."""
    if getattr(c, "first_k_dense_replace", None) is not None:
        return c.first_k_dense_replace
    types = list(c.mlp_layer_types)
    assert types == sorted(types), "dense layers lead"
    return types.count("dense")


def _deepseek2(path: Path, c: Any, arch: str = "deepseek2") -> None:
    """src/models/deepseek2.cpp: multi-head latent attention as llama.cpp's converter writes it, one K/V head whose
    key is the latent and the rotary key (key_length = kv_lora_rank + qk_rope_head_dim) and whose value is the latent;
    the per-head widths go in key_length_mla / value_length_mla, which make the model MLA (`hparams.is_mla`). With
    `arch` deepseek32 or glm-dsa (src/models/deepseek32.cpp, glm-dsa.cpp) each layer adds DeepSeek Sparse
    Attention's lightning indexer: index_n_heads query heads over one index_head_dim-wide key."""
    g = _Checkpoint(path, arch, c)
    dense = _leading_dense(c)
    lora, rope, nope, vd = c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim
    h, d, e, ff = c.num_attention_heads, c.hidden_size, c.n_routed_experts, c.moe_intermediate_size
    w = g.w
    w.add_head_count_kv(1)
    w.add_key_length(lora + rope)
    w.add_value_length(lora)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(vd)
    w.add_rope_dimension_count(rope)
    w.add_q_lora_rank(c.q_lora_rank)
    w.add_kv_lora_rank(lora)
    w.add_leading_dense_block_count(dense)
    w.add_expert_count(e)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_expert_feed_forward_length(ff)
    w.add_expert_weights_scale(c.routed_scaling_factor)
    w.add_expert_weights_norm(c.norm_topk_prob)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    dsa = arch != "deepseek2"
    if dsa:
        w.add_indexer_head_count(c.index_n_heads)
        w.add_indexer_key_length(c.index_head_dim)
        w.add_indexer_top_k(c.index_topk)
    g.embeddings(tied=False)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "ffn_norm")
        g.norms(i, "attn_q_a_norm", width=c.q_lora_rank)
        if dsa:
            g.tensor(f"blk.{i}.indexer.k_norm.weight", c.index_head_dim)
            g.tensor(f"blk.{i}.indexer.k_norm.bias", c.index_head_dim)
            g.tensor(f"blk.{i}.indexer.proj.weight", c.index_n_heads, d)
            g.tensor(f"blk.{i}.indexer.attn_k.weight", c.index_head_dim, d)
            g.tensor(f"blk.{i}.indexer.attn_q_b.weight", c.index_n_heads * c.index_head_dim, c.q_lora_rank)
        g.norms(i, "attn_kv_a_norm", width=lora)
        g.tensor(f"blk.{i}.attn_q_a.weight", c.q_lora_rank, d)
        g.tensor(f"blk.{i}.attn_q_b.weight", h * (nope + rope), c.q_lora_rank)
        g.tensor(f"blk.{i}.attn_kv_a_mqa.weight", lora + rope, d)
        g.tensor(f"blk.{i}.attn_k_b.weight", h, lora, nope)
        g.tensor(f"blk.{i}.attn_v_b.weight", h, vd, lora)
        g.tensor(f"blk.{i}.attn_output.weight", d, h * vd)
        if i < dense:
            g.dense_ffn(i, c.intermediate_size)
            continue
        g.biased_experts_with_shared(i, e, ff, c.n_shared_experts)
    g.close()


def _llama4(path: Path, c: Any) -> None:
    """src/models/llama4.cpp: chunked layers (those that rotate) beside global NoPE layers, experts with a shared
    expert every interleave_moe_layer_step-th layer. llama.cpp takes the chunk as 8,192 whatever the file says (its
    loader sets n_swa = 8192 when no sliding_window key is given), so none is written."""
    t = c.text_config
    g = _Checkpoint(path, "llama4", t, ffn=t.intermediate_size_mlp)
    hd, kv, e = _head_dim(t), t.num_key_value_heads, t.num_local_experts
    g.attention_heads(hd, kv)
    g.w.add_sliding_window_pattern(list(llama4.rope_layers(t)))
    g.w.add_expert_count(e)
    g.w.add_expert_used_count(t.num_experts_per_tok)
    g.w.add_expert_feed_forward_length(t.intermediate_size)
    g.w.add_interleave_moe_layer_step(t.interleave_moe_layer_step)
    g.embeddings(t.tie_word_embeddings)
    moe = set(llama4.moe_layers(t))
    for i in range(t.num_hidden_layers):
        g.norms(i, "attn_norm", "ffn_norm")
        g.qkvo(i, hd, kv)
        if i not in moe:
            g.dense_ffn(i, t.intermediate_size_mlp)
            continue
        g.experts(i, e, t.intermediate_size)
        g.tensor(f"blk.{i}.ffn_gate_shexp.weight", t.intermediate_size, t.hidden_size)
        g.tensor(f"blk.{i}.ffn_up_shexp.weight", t.intermediate_size, t.hidden_size)
        g.tensor(f"blk.{i}.ffn_down_shexp.weight", t.hidden_size, t.intermediate_size)
    g.close()


def _mimo2(path: Path, c: Any) -> None:
    """src/models/mimo2.cpp: sliding and global layers with their own K/V head counts (per-layer head_count_kv),
    value heads narrower than query/key heads (value_length < key_length), a dense first MLP then experts."""
    sliding = [t == "sliding_attention" for t in mimo_v2_flash.layer_types(c)]
    kv = [c.swa_num_key_value_heads if s else c.num_key_value_heads for s in sliding]
    heads = [c.swa_num_attention_heads if s else c.num_attention_heads for s in sliding]
    g = _Checkpoint(path, "mimo2", c, heads=heads)
    e, ff, w = c.n_routed_experts, c.moe_intermediate_size, g.w
    w.add_head_count_kv(kv)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.v_head_dim)
    w.add_key_length_swa(c.swa_head_dim)
    w.add_value_length_swa(c.swa_v_head_dim)
    w.add_rope_dimension_count(mimo_v2_flash.rotary_width(c))
    w.add_sliding_window(mimo_v2_flash.window(c))
    w.add_sliding_window_pattern(sliding)
    w.add_rope_freq_base_swa(c.swa_rope_theta)
    w.add_expert_count(e)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(ff)
    g.embeddings(tied=False)
    d = c.hidden_size
    for i, (s, mlp) in enumerate(zip(sliding, mimo_v2_flash.mlp_types(c))):
        k_dim, v_dim = (c.swa_head_dim, c.swa_v_head_dim) if s else (c.head_dim, c.v_head_dim)
        g.norms(i, "attn_norm", "ffn_norm")
        g.tensor(f"blk.{i}.attn_q.weight", heads[i] * k_dim, d)
        g.tensor(f"blk.{i}.attn_k.weight", kv[i] * k_dim, d)
        g.tensor(f"blk.{i}.attn_v.weight", kv[i] * v_dim, d)
        g.tensor(f"blk.{i}.attn_output.weight", d, heads[i] * v_dim)
        if mlp == "dense":
            g.dense_ffn(i, c.intermediate_size)
            continue
        g.experts(i, e, ff)
        g.tensor(f"blk.{i}.exp_probs_b.bias", e)
    g.close()


def _gemma4(path: Path, c: Any) -> None:
    """src/models/gemma4.cpp: sliding layers beside global layers with their own head width and K/V heads
    (key_length against key_length_swa, per-layer head_count_kv); a global layer whose keys double as values
    (attention_k_eq_v) has no V projection, and llama.cpp still caches V beside K (src/llama-kv-cache.cpp allocates
    V for every layer that is not MLA). Experts beside the dense MLP in every layer."""
    t = c.text_config
    sliding = [k == "sliding_attention" for k in gemma4.layer_types(t)]
    global_kv = gemma4.global_kv_heads(t)[0]
    g = _Checkpoint(path, "gemma4", t)
    w, d, e = g.w, t.hidden_size, t.num_experts
    w.add_head_count_kv([t.num_key_value_heads if s else global_kv for s in sliding])
    w.add_key_length(t.global_head_dim)
    w.add_value_length(t.global_head_dim)
    w.add_key_length_swa(t.head_dim)
    w.add_value_length_swa(t.head_dim)
    w.add_sliding_window(t.sliding_window)
    w.add_sliding_window_pattern(sliding)
    w.add_embedding_length_per_layer_input(t.hidden_size_per_layer_input)
    w.add_expert_count(e)
    w.add_expert_used_count(t.top_k_experts)
    w.add_expert_feed_forward_length(t.moe_intermediate_size)
    w.add_rope_freq_base(t.rope_parameters.full_attention.rope_theta)
    w.add_rope_freq_base_swa(t.rope_parameters.sliding_attention.rope_theta)
    g.embeddings(tied=True)
    g.tensor("rope_freqs.weight", t.global_head_dim // 2)
    for i, s in enumerate(sliding):
        hd, kv = (t.head_dim, t.num_key_value_heads) if s else (t.global_head_dim, global_kv)
        g.norms(i, "attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "pre_ffw_norm_2",
                "post_ffw_norm_1", "post_ffw_norm_2")
        g.norms(i, "attn_q_norm", "attn_k_norm", width=hd)
        g.tensor(f"blk.{i}.attn_q.weight", t.num_attention_heads * hd, d)
        g.tensor(f"blk.{i}.attn_k.weight", kv * hd, d)
        if s or not t.attention_k_eq_v:
            g.tensor(f"blk.{i}.attn_v.weight", kv * hd, d)
        g.tensor(f"blk.{i}.attn_output.weight", d, t.num_attention_heads * hd)
        g.dense_ffn(i, t.intermediate_size)
        g.experts(i, e, t.moe_intermediate_size)
        g.tensor(f"blk.{i}.ffn_gate_inp.scale", d)
    g.close()


def _nemotron_h(path: Path, c: Any) -> None:
    """src/models/nemotron-h.cpp: Mamba-2 mixers (M), MLPs (-) and attention (*) as hybrid_override_pattern spells
    them; a layer is recurrent where its head_count_kv and feed_forward_length are both 0, so both go per layer."""
    layers = c.hybrid_override_pattern
    assert set(layers) <= {"M", "-", "*"}, "the tiny config has no experts"
    d_inner, groups, state, kernel = c.mamba_num_heads * c.mamba_head_dim, c.n_groups, c.ssm_state_size, c.conv_kernel
    g = _Checkpoint(path, "nemotron_h", c, ffn=[c.intermediate_size if t == "-" else 0 for t in layers])
    w, d, hd, kv = g.w, c.hidden_size, _head_dim(c), c.num_key_value_heads
    w.add_head_count_kv([kv if t == "*" else 0 for t in layers])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_eps(c.layer_norm_epsilon)
    w.add_ssm_conv_kernel(kernel)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(state)
    w.add_ssm_time_step_rank(c.mamba_num_heads)
    w.add_ssm_group_count(groups)
    g.embeddings(c.tie_word_embeddings)
    conv = d_inner + 2 * groups * state
    for i, t in enumerate(layers):
        g.norms(i, "attn_norm")
        if t == "M":
            g.tensor(f"blk.{i}.ssm_in.weight", 2 * d_inner + 2 * groups * state + c.mamba_num_heads, d)
            g.tensor(f"blk.{i}.ssm_conv1d.weight", conv, kernel)
            g.tensor(f"blk.{i}.ssm_conv1d.bias", conv)
            g.tensor(f"blk.{i}.ssm_dt.bias", c.mamba_num_heads)
            g.tensor(f"blk.{i}.ssm_a", c.mamba_num_heads, 1)
            g.tensor(f"blk.{i}.ssm_d", c.mamba_num_heads, 1)
            g.tensor(f"blk.{i}.ssm_norm.weight", groups, d_inner // groups)
            g.tensor(f"blk.{i}.ssm_out.weight", d, d_inner)
        elif t == "*":
            g.qkvo(i, hd, kv)
        else:
            g.tensor(f"blk.{i}.ffn_up.weight", c.intermediate_size, d)
            g.tensor(f"blk.{i}.ffn_down.weight", d, c.intermediate_size)
    g.close()


def _mixtral(path: Path, c: Any) -> None:
    """src/models/llama.cpp with experts (llama.cpp loads Mixtral as "llama" with expert_count set): every layer's
    MLP is num_local_experts experts of intermediate_size."""
    g = _Checkpoint(path, "llama", c)
    hd, kv = _head_dim(c), c.num_key_value_heads
    g.attention_heads(hd, kv)
    g.w.add_expert_count(c.num_local_experts)
    g.w.add_expert_used_count(c.num_experts_per_tok)
    g.embeddings(c.tie_word_embeddings)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "ffn_norm")
        g.qkvo(i, hd, kv)
        g.experts(i, c.num_local_experts, c.intermediate_size)
    g.close()


def _qwen3_moe(path: Path, c: Any) -> None:
    """src/models/qwen3moe.cpp: Qwen3's attention (per-head Q/K norms), experts of moe_intermediate_size."""
    g = _Checkpoint(path, "qwen3moe", c)
    hd, kv = _head_dim(c), c.num_key_value_heads
    assert not c.mlp_only_layers and c.decoder_sparse_step == 1, "every layer of the tiny config has experts"
    g.attention_heads(hd, kv)
    g.w.add_expert_count(c.num_experts)
    g.w.add_expert_used_count(c.num_experts_per_tok)
    g.w.add_expert_feed_forward_length(c.moe_intermediate_size)
    g.embeddings(c.tie_word_embeddings)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "ffn_norm")
        g.norms(i, "attn_q_norm", "attn_k_norm", width=hd)
        g.qkvo(i, hd, kv)
        g.experts(i, c.num_experts, c.moe_intermediate_size)
    g.close()


def _olmo2(path: Path, c: Any) -> None:
    """src/models/olmo2.cpp: norms after attention and MLP, Q/K norms over all heads at once."""
    g = _Checkpoint(path, "olmo2", c)
    hd, kv = _head_dim(c), c.num_key_value_heads
    g.attention_heads(hd, kv)
    g.embeddings(tied=False)
    for i in range(c.num_hidden_layers):
        g.norms(i, "post_attention_norm", "post_ffw_norm", "attn_q_norm")
        g.norms(i, "attn_k_norm", width=kv * hd)
        g.qkvo(i, hd, kv)
        g.dense_ffn(i, c.intermediate_size)
    g.close()


def _phi3(path: Path, c: Any) -> None:
    """src/models/phi3.cpp: fused QKV and gate-up projections, a partial rotary; llama.cpp turns Phi's sliding
    window off ("Phi SWA is currently disabled"), so none is written and the cache is full-length."""
    g = _Checkpoint(path, "phi3", c)
    hd, kv, d = _head_dim(c), c.num_key_value_heads, c.hidden_size
    g.attention_heads(hd, kv, rotary=int(hd * c.partial_rotary_factor))
    g.embeddings(c.tie_word_embeddings)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "ffn_norm")
        g.tensor(f"blk.{i}.attn_qkv.weight", d + 2 * kv * hd, d)
        g.tensor(f"blk.{i}.attn_output.weight", d, d)
        g.tensor(f"blk.{i}.ffn_up.weight", 2 * c.intermediate_size, d)
        g.tensor(f"blk.{i}.ffn_down.weight", d, c.intermediate_size)
    g.close()


def _gpt2(path: Path, c: Any) -> None:
    """src/models/gpt2.cpp: learned positions (n_positions of them), LayerNorms with biases, a fused biased QKV."""
    d, ff = c.n_embd, c.n_inner or 4 * c.n_embd
    g = _Checkpoint(path, "gpt2", SimpleNamespace(
        vocab_size=c.vocab_size, max_position_embeddings=c.n_positions, hidden_size=d, num_hidden_layers=c.n_layer,
        intermediate_size=ff, num_attention_heads=c.n_head))
    g.w.add_layer_norm_eps(c.layer_norm_epsilon)
    g.embeddings(c.tie_word_embeddings)
    g.tensor("position_embd.weight", c.n_positions, d)
    g.tensor("output_norm.bias", d)
    for i in range(c.n_layer):
        for n, width in (("attn_norm", d), ("ffn_norm", d), ("attn_output", d), ("ffn_down", d), ("ffn_up", ff),
                         ("attn_qkv", 3 * d)):
            g.tensor(f"blk.{i}.{n}.bias", width)
        g.norms(i, "attn_norm", "ffn_norm")
        g.tensor(f"blk.{i}.attn_qkv.weight", 3 * d, d)
        g.tensor(f"blk.{i}.attn_output.weight", d, d)
        g.tensor(f"blk.{i}.ffn_up.weight", ff, d)
        g.tensor(f"blk.{i}.ffn_down.weight", d, ff)
    g.close()


def _glm4_moe(path: Path, c: Any) -> None:
    """src/models/glm4-moe.cpp: full attention (post_attention_norm is the MLP's norm), a partial rotary, leading
    dense layers then routed and shared experts."""
    g = _Checkpoint(path, "glm4moe", c)
    hd, kv, e, ff = _head_dim(c), c.num_key_value_heads, c.n_routed_experts, c.moe_intermediate_size
    g.attention_heads(hd, kv, rotary=hd // 2)
    for add, value in ((g.w.add_expert_count, e), (g.w.add_expert_used_count, c.num_experts_per_tok),
                       (g.w.add_expert_shared_count, c.n_shared_experts), (g.w.add_expert_feed_forward_length, ff),
                       (g.w.add_leading_dense_block_count, c.first_k_dense_replace)):
        add(value)
    g.embeddings(c.tie_word_embeddings)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "post_attention_norm")
        g.qkvo(i, hd, kv)
        if i < c.first_k_dense_replace:
            g.dense_ffn(i, c.intermediate_size)
            continue
        g.biased_experts_with_shared(i, e, ff, c.n_shared_experts)
    g.close()


def _minimax_m2(path: Path, c: Any) -> None:
    """src/models/minimax-m2.cpp: full attention with Q/K norms across all heads, a partial rotary (rotary_dim),
    experts of intermediate_size with a routing bias."""
    g = _Checkpoint(path, "minimax-m2", c)
    hd, kv, e = _head_dim(c), c.num_key_value_heads, c.num_local_experts
    g.attention_heads(hd, kv, rotary=c.rotary_dim)
    assert c.scoring_func == "sigmoid"
    g.w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    g.w.add_expert_count(e)
    g.w.add_expert_used_count(c.num_experts_per_tok)
    g.w.add_expert_feed_forward_length(c.intermediate_size)
    g.embeddings(tied=False)
    for i in range(c.num_hidden_layers):
        g.norms(i, "attn_norm", "ffn_norm")
        g.norms(i, "attn_q_norm", width=c.num_attention_heads * hd)
        g.norms(i, "attn_k_norm", width=kv * hd)
        g.qkvo(i, hd, kv)
        g.experts(i, e, c.intermediate_size)
        g.tensor(f"blk.{i}.exp_probs_b.bias", e)
    g.close()


def _qwen35(path: Path, c: Any) -> None:
    """src/models/qwen35.cpp: Gated DeltaNet layers (recurrent, per attention.recurrent_layers) beside gated
    attention. llama.cpp reads one head width for a DeltaNet layer's keys and values (ssm.state_size;
    delta-net-base.cpp asserts S_k == S_v), so only a config with linear_key_head_dim = linear_value_head_dim can be
    written (the published Qwen3.5 configs have both 128)."""
    t = c.text_config
    assert t.linear_key_head_dim == t.linear_value_head_dim, "llama.cpp has one DeltaNet head width"
    recurrent = [k == "linear_attention" for k in t.layer_types]
    hd, kv, d, dk = t.head_dim, t.num_key_value_heads, t.hidden_size, t.linear_key_head_dim
    key_dim, value_dim = dk * t.linear_num_key_heads, dk * t.linear_num_value_heads
    g = _Checkpoint(path, "qwen35", t)
    g.attention_heads(hd, kv, rotary=int(hd * t.rope_parameters.partial_rotary_factor))
    w = g.w
    w.add_rope_freq_base(t.rope_parameters.rope_theta)
    w.add_rope_dimension_sections([1, 1, 0, 0])  # read by the graph only, not by the cache
    w.add_ssm_conv_kernel(t.linear_conv_kernel_dim)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(dk)
    w.add_ssm_time_step_rank(t.linear_num_value_heads)
    w.add_ssm_group_count(t.linear_num_key_heads)
    w.add_array(f"{w.arch}.attention.recurrent_layers", recurrent)
    g.embeddings(t.tie_word_embeddings)
    for i, r in enumerate(recurrent):
        g.norms(i, "attn_norm", "post_attention_norm")
        g.dense_ffn(i, t.intermediate_size)
        if not r:
            g.tensor(f"blk.{i}.attn_q.weight", 2 * t.num_attention_heads * hd, d)  # queries and their gates
            g.tensor(f"blk.{i}.attn_k.weight", kv * hd, d)
            g.tensor(f"blk.{i}.attn_v.weight", kv * hd, d)
            g.tensor(f"blk.{i}.attn_output.weight", d, t.num_attention_heads * hd)
            g.norms(i, "attn_q_norm", "attn_k_norm", width=hd)
            continue
        g.tensor(f"blk.{i}.attn_qkv.weight", 2 * key_dim + value_dim, d)
        g.tensor(f"blk.{i}.attn_gate.weight", value_dim, d)
        g.tensor(f"blk.{i}.ssm_conv1d.weight", 2 * key_dim + value_dim, t.linear_conv_kernel_dim)
        g.tensor(f"blk.{i}.ssm_dt.bias", t.linear_num_value_heads)
        g.tensor(f"blk.{i}.ssm_a", t.linear_num_value_heads)
        g.tensor(f"blk.{i}.ssm_beta.weight", t.linear_num_value_heads, d)
        g.tensor(f"blk.{i}.ssm_alpha.weight", t.linear_num_value_heads, d)
        g.tensor(f"blk.{i}.ssm_norm.weight", dk)
        g.tensor(f"blk.{i}.ssm_out.weight", d, value_dim)
    g.close()


WRITERS: dict[str, Callable[[Path, Any], None]] = {
    "llama": _llama,
    "qwen3": _qwen3,
    "gemma3_text": _gemma3,
    "gpt_oss": _gpt_oss,
    "deepseek_v3": _deepseek2,
    "llama4": _llama4,
    "mimo_v2_flash": _mimo2,
    "gemma4": _gemma4,
    "nemotron_h": _nemotron_h,
    "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe,
    "olmo2": _olmo2,
    "phi3": _phi3,
    "gpt2": _gpt2,
    "glm4_moe": _glm4_moe,
    "glm4_moe_lite": _deepseek2,  # llama.cpp's converter writes GLM-4.7-Flash as deepseek2
    "minimax_m2": _minimax_m2,
    "gemma3": lambda path, c: _gemma3(path, c.text_config),
    "kimi_k25": lambda path, c: _deepseek2(path, c.text_config),
    "qwen3_5": _qwen35,
    "deepseek_v32": lambda path, c: _deepseek2(path, c, "deepseek32"),
    "glm_moe_dsa": lambda path, c: _deepseek2(path, c, "glm-dsa"),
}
"""The site's family name (ModelSpec.family) -> the writer of its llama.cpp checkpoint."""


def write_tiny_gguf(tiny: ModelSpec, path: Path) -> Path:
    """Write `tiny`'s config as a random GGUF checkpoint llama.cpp loads; returns `path`."""
    from tiny_gguf_linear import WRITERS as LINEAR

    {**WRITERS, **LINEAR}[tiny.family](path, tiny.config)
    return path
