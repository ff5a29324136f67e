"""The checkpoint stage: what a checkpoint stores (safetensors and GGUF headers, Hub reads, listings,
recorded manifests, published variants, storage formats), the cited source files, and the
reconciliation of the ledger against them."""
