"""The kernel families of ``wna16_gemm`` (ops/wna16_gemm.py): one module per family, each declaring
``FAMILY``; ``dispatch`` holds their registry; ``common`` the shared Triton helpers and config helpers."""
