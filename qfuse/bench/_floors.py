"""Bytes an int8-activation GEMM must move, the numerator of its bandwidth floor (``qfuse bench
int8_gemm``). Standard library only: ``qfuse bench report`` recomputes floors from a CSV's shape."""

from __future__ import annotations


def int8_gemm_bytes(m: int, n: int, k: int, weight_bits: int, group: int = -1) -> int:
    """int8 activations and fp32 token scales in, bf16 out; int8 (``weight_bits`` 8) or packed int4
    codes and fp32 channel scales; with ``group`` > 0 (W4A8 group 128) one int8 group scale per
    ``group`` codes of a row. A per-channel op (``group`` -1) reads no group scales."""
    weights = n * k * weight_bits // 8 + 4 * n + (n * (k // group) if group > 0 else 0)
    return weights + m * k + 4 * m + 2 * m * n
