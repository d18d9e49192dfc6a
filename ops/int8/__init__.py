"""The kernel families of ``w8a8_gemm`` and ``w4a8_gemm`` (ops/w8a8_gemm.py, ops/w4a8_gemm.py): one module per
family, each declaring ``FAMILY``; ``dispatch`` holds their registry; ``common`` the shared Triton helpers."""
