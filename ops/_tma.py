"""Host side of the TMA-fed kernels (ops/int8/tma.py, ops/wna16/tma.py)."""

from __future__ import annotations

from torch import Tensor


def tma_aligned(t: Tensor) -> Tensor:
    """``t`` if its data is 16-byte aligned (a TMA descriptor's base must be), else a contiguous copy."""
    return t if t.data_ptr() % 16 == 0 else t.clone()
