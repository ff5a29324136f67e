"""The component library: every part a family composes, each owning its spec, program and reference call.

Importing this package registers every program (`base.PROGRAMS`) and reference call (`base.REFERENCE_CALLS`).
"""

from __future__ import annotations

from explorer.model.components import (  # noqa: F401  (registration)
    activated_clamp,
    attention,
    block_sparse_attention,
    blocks,
    compressed_attention,
    compressed_attention_memory,
    compressor_decode,
    deepstack,
    dsa,
    embedding,
    fused_attention,
    fused_deltanet_proj,
    fused_experts,
    fused_mlp,
    fused_qkv_attention,
    gemma4_vision,
    hash_routing,
    hc_blocks,
    head_gated_attention,
    hybrid_block,
    hyper_connections,
    index_share,
    kda,
    latent_moe,
    layer_attention,
    layer_attention_reference,
    layer_blocks,
    linear,
    mamba2,
    mla,
    mla_nope,
    mlp,
    moe,
    mrope,
    mtp,
    nope_attention,
    norms,
    parallel_moe,
    post_norm_block,
    relu2_experts,
    rope,
    scaled_routed_moe,
    sigmoid_moe,
    softcap,
)
from explorer.model.components.base import PROGRAMS, REFERENCE_CALLS, Ctx, Reference, Run

__all__ = ["PROGRAMS", "REFERENCE_CALLS", "Ctx", "Reference", "Run"]
