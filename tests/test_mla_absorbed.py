"""The MLA page's cache explanation, executed: attention computed from the cached 576-style pair alone (the
normalised latent ĉ^KV and the rotated shared key k^R), with W_UK absorbed into each head's query and W_UV (times
that head's block of W_O) into the output, equals transformers' DeepseekV3Attention, which expands every cached
token into per-head keys and values."""

from __future__ import annotations

import torch
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

TINY = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=24,
            qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, rope_scaling=None, attention_bias=False,
            num_hidden_layers=1, vocab_size=64, intermediate_size=64, moe_intermediate_size=16)


def tiny_attention():
    config = DeepseekV3Config(**TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = ds.DeepseekV3Attention(config, layer_idx=0).double().eval()
    for p in attn.parameters():  # RMSNorm gains start at one; random ones make a mix-up of latents visible
        torch.nn.init.normal_(p, std=0.3)
    return config, attn


def absorbed(attn, config, x, cos, sin, mask, *, split_heads_last: bool = False):
    """Attention from the cache alone: per token only ĉ (kv_lora_rank) and k^R (qk_rope_head_dim) are read."""
    B, T, _ = x.shape
    H, dn, dr, dv, dc = (config.num_attention_heads, config.qk_nope_head_dim, config.qk_rope_head_dim,
                         config.v_head_dim, config.kv_lora_rank)
    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x))).view(B, T, H, dn + dr).transpose(1, 2)
    q_c, q_pe = q.split([dn, dr], dim=-1)
    c, k_pe = attn.kv_a_proj_with_mqa(x).split([dc, dr], dim=-1)
    c = attn.kv_a_layernorm(c)                                                 # cached: [B, T, dc]
    rotate = ds.apply_rotary_pos_emb_interleave if config.rope_interleave else ds.apply_rotary_pos_emb
    q_r, k_r = rotate(q_pe, k_pe.view(B, 1, T, dr), cos, sin)                  # k_r cached: [B, 1, T, dr]
    w = attn.kv_b_proj.weight                                                  # [H·(dn+dv), dc], y = ĉ wᵀ
    w = w.view(dn + dv, H, dc).transpose(0, 1) if split_heads_last else w.view(H, dn + dv, dc)
    w_uk, w_uv = w[:, :dn], w[:, dn:]                                          # [H, dn, dc], [H, dv, dc]
    q_tilde = torch.einsum("bhtn,hnc->bhtc", q_c, w_uk)                        # W_UK absorbed into the query
    s = torch.einsum("bhtc,bsc->bhts", q_tilde, c) + torch.einsum("bhtr,bsr->bhts", q_r, k_r[:, 0])
    p = torch.softmax(s * attn.scaling + mask, dim=-1)
    latent = torch.einsum("bhts,bsc->bhtc", p, c)                              # heads average cached latents
    w_o = attn.o_proj.weight.view(-1, H, dv)                                   # [d, H, dv]
    w_uv_o = torch.einsum("hvc,dhv->hcd", w_uv, w_o)                           # W_UV,h W_O,h: [H, dc, d]
    return torch.einsum("bhtc,hcd->btd", latent, w_uv_o)


def compare(split_heads_last: bool = False) -> float:
    config, attn = tiny_attention()
    x = torch.randn(2, 5, config.hidden_size, dtype=torch.float64)
    positions = torch.arange(5).expand(2, -1)
    cos, sin = ds.DeepseekV3RotaryEmbedding(config)(x, positions)
    mask = torch.full((5, 5), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        reference, _ = attn(x, position_embeddings=(cos, sin), attention_mask=mask)
        ours = absorbed(attn, config, x, cos, sin, mask, split_heads_last=split_heads_last)
    return (ours - reference).abs().max().item() / reference.abs().max().item()


def test_absorbed_form_equals_the_expanded_reference():
    assert compare() < 1e-6  # float64 throughout, but the reference's eager softmax runs in float32


def test_absorbed_form_check_fails_when_heads_are_cut_wrongly():
    """Mutation: W_UK and W_UV cut from kv_b_proj's rows in the wrong order; the check must notice."""
    assert compare(split_heads_last=True) > 1e-3
