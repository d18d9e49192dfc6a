"""``wna16_gemm`` as dequantize + cuBLAS (family ``dequant_mm``, M bucket >= 128): the weights
dequantized to ``x.dtype`` by one Triton kernel (ops/wna16/common.py), then ``x @ w_hat.T``.
Picked only where it measured faster on the H200: M bucket 4096 (and 2048 / 1024 for some keys,
mostly 8-bit and fp16)."""

from __future__ import annotations

import torch
from torch import Tensor

from .._autotune import m_bucket
from ..kernel_family import KernelFamily
from .common import dequantize_triton


def _run(cfg: dict, x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int) -> Tensor:
    """Dequantize to ``x.dtype`` (one Triton kernel), then cuBLAS ``x @ w_hat.T``."""
    w_hat = dequantize_triton(qweight, scales, zeros, bits, group_size, x.dtype)
    if bias is not None:
        return torch.addmm(bias, x, w_hat.t())
    return torch.mm(x, w_hat.t())


FAMILY = KernelFamily(
    "dequant_mm", "wna16/dequant_mm", lambda p: (True, "") if m_bucket(p.m) >= 128 else (False, "M bucket < 128"), lambda p, exhaustive: [{}], _run
)
