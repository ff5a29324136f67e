"""Tiny random GGUF checkpoints of the two linear-attention hybrids tests/tiny_gguf.py leaves out, Qwen3-Next and
Kimi Linear, written the same way (tests/tiny_gguf.py's `_Checkpoint`): llama.cpp's architecture name, the
hyperparameters its `load_arch_hparams` reads and exactly the tensors its `load_arch_tensors` creates, at the shapes
it checks (src/models/qwen3next.cpp, src/models/kimi-linear.cpp); random weights, since only shapes and metadata
decide what the engine allocates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf


def _qwen3_next(path: Path, c: Any) -> None:
    """src/models/qwen3next.cpp: Gated DeltaNet layers (attention.recurrent_layers) beside gated attention, every
    layer's MLP routed experts and a gated shared expert. As for Qwen3.5, llama.cpp has one DeltaNet head width
    (ssm.state_size) for keys and values, so only linear_key_head_dim = linear_value_head_dim can be written."""
    from tiny_gguf import _Checkpoint

    assert c.linear_key_head_dim == c.linear_value_head_dim, "llama.cpp has one DeltaNet head width"
    recurrent = [k == "linear_attention" for k in c.layer_types]
    hd, kv, d, dk = c.head_dim, c.num_key_value_heads, c.hidden_size, c.linear_key_head_dim
    key_dim, value_dim = dk * c.linear_num_key_heads, dk * c.linear_num_value_heads
    e, ff, shared = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
    g = _Checkpoint(path, "qwen3next", c)
    g.attention_heads(hd, kv, rotary=int(hd * c.partial_rotary_factor))
    w = g.w
    w.add_expert_count(e)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(ff)
    w.add_expert_shared_feed_forward_length(shared)
    w.add_ssm_conv_kernel(c.linear_conv_kernel_dim)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(dk)
    w.add_ssm_time_step_rank(c.linear_num_value_heads)
    w.add_ssm_group_count(c.linear_num_key_heads)
    w.add_array(f"{w.arch}.attention.recurrent_layers", recurrent)
    g.embeddings(c.tie_word_embeddings)
    for i, r in enumerate(recurrent):
        g.norms(i, "attn_norm", "post_attention_norm")
        if r:
            g.tensor(f"blk.{i}.attn_qkv.weight", 2 * key_dim + value_dim, d)
            g.tensor(f"blk.{i}.attn_gate.weight", value_dim, d)
            g.tensor(f"blk.{i}.ssm_conv1d.weight", 2 * key_dim + value_dim, c.linear_conv_kernel_dim)
            g.tensor(f"blk.{i}.ssm_dt.bias", c.linear_num_value_heads)
            g.tensor(f"blk.{i}.ssm_a", c.linear_num_value_heads)
            g.tensor(f"blk.{i}.ssm_ba.weight", 2 * c.linear_num_value_heads, d)
            g.tensor(f"blk.{i}.ssm_norm.weight", dk)
            g.tensor(f"blk.{i}.ssm_out.weight", d, value_dim)
        else:
            g.tensor(f"blk.{i}.attn_q.weight", 2 * c.num_attention_heads * hd, d)  # queries and their gates
            g.tensor(f"blk.{i}.attn_k.weight", kv * hd, d)
            g.tensor(f"blk.{i}.attn_v.weight", kv * hd, d)
            g.tensor(f"blk.{i}.attn_output.weight", d, c.num_attention_heads * hd)
            g.norms(i, "attn_q_norm", "attn_k_norm", width=hd)
        g.experts(i, e, ff)
        g.tensor(f"blk.{i}.ffn_gate_inp_shexp.weight", d)
        g.tensor(f"blk.{i}.ffn_gate_shexp.weight", shared, d)
        g.tensor(f"blk.{i}.ffn_up_shexp.weight", shared, d)
        g.tensor(f"blk.{i}.ffn_down_shexp.weight", d, shared)
    g.close()


def _kimi_linear(path: Path, c: Any) -> None:
    """src/models/kimi-linear.cpp: KDA layers (recurrent where head_count_kv is 0) beside MLA layers written as
    tests/tiny_gguf.py's deepseek2 (one K/V head of the latent and the rotary key, no query compression), a
    leading dense MLP then routed and shared experts. llama.cpp's KDA has as many heads as the attention
    (n_embd_head_kda × n_head), so only linear_num_heads = num_attention_heads can be written (the published
    config has 32 of each)."""
    from tiny_gguf import _Checkpoint, _leading_dense

    assert c.linear_num_heads == c.num_attention_heads, "llama.cpp's KDA has the attention's head count"
    assert c.q_lora_rank is None, "Kimi Linear's MLA projects its queries directly"
    recurrent = [k == "linear_attention" for k in c.layer_types]
    h, d, hd, kernel = c.num_attention_heads, c.hidden_size, c.linear_head_dim, c.linear_conv_kernel_dim
    lora, rope, nope, vd = c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim
    e, ff, dense = c.num_local_experts, c.moe_intermediate_size, _leading_dense(c)
    g = _Checkpoint(path, "kimi-linear", c)
    w = g.w
    w.add_head_count_kv([0 if r else 1 for r in recurrent])
    w.add_key_length(lora + rope)
    w.add_value_length(lora)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(vd)
    w.add_rope_dimension_count(rope)
    w.add_kv_lora_rank(lora)
    w.add_ssm_conv_kernel(kernel)
    w.add_kda_head_dim(hd)
    w.add_leading_dense_block_count(dense)
    w.add_expert_count(e)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_expert_feed_forward_length(ff)
    w.add_expert_weights_scale(c.routed_scaling_factor)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    g.embeddings(tied=False)
    for i, r in enumerate(recurrent):
        g.norms(i, "attn_norm", "ffn_norm")
        if r:
            for part in "qkv":
                g.tensor(f"blk.{i}.ssm_conv1d_{part}.weight", h * hd, 1, kernel)
                g.tensor(f"blk.{i}.attn_{part}.weight", h * hd, d)
            g.tensor(f"blk.{i}.ssm_f_a.weight", hd, d)
            g.tensor(f"blk.{i}.ssm_f_b.weight", h * hd, hd)
            g.tensor(f"blk.{i}.ssm_beta.weight", h, d)
            g.tensor(f"blk.{i}.ssm_a", h, 1)
            g.tensor(f"blk.{i}.ssm_dt.bias", h * hd)
            g.tensor(f"blk.{i}.ssm_g_a.weight", hd, d)
            g.tensor(f"blk.{i}.ssm_g_b.weight", h * hd, hd)
            g.tensor(f"blk.{i}.ssm_norm.weight", hd)
            g.tensor(f"blk.{i}.attn_output.weight", d, h * hd)
        else:
            g.norms(i, "attn_kv_a_norm", width=lora)
            g.tensor(f"blk.{i}.attn_q.weight", h * (nope + rope), d)
            g.tensor(f"blk.{i}.attn_kv_a_mqa.weight", lora + rope, d)
            g.tensor(f"blk.{i}.attn_k_b.weight", h, lora, nope)
            g.tensor(f"blk.{i}.attn_v_b.weight", h, vd, lora)
            g.tensor(f"blk.{i}.attn_output.weight", d, h * vd)
        if i < dense:
            g.dense_ffn(i, c.intermediate_size)
            continue
        g.biased_experts_with_shared(i, e, ff, c.n_shared_experts)
    g.close()


WRITERS = {"qwen3_next": _qwen3_next, "kimi_linear": _kimi_linear}
"""The site's family name -> the writer of its llama.cpp checkpoint, joined to tests/tiny_gguf.py's."""
