"""The Triton kernels of the attention op (ops/decode_attention.py)."""
