"""Storage formats packed and unpacked exactly: MXFP4, NVFP4, compressed-tensors INT4, FP8 with
per-tensor scales."""
