"""Exact int8 x int8 -> int32 matrix product for the reference kernels."""

from __future__ import annotations

import torch
from torch import Tensor

# Partial sums of 1024 products of int8 values are below 1024 * 128 * 128 = 2**24,
# so each chunk is exact in a float32 (or tf32) matmul, and the int32 sum of the
# chunks is the exact int32 accumulator.
_EXACT_FP32_CHUNK = 1024


def int8_matmul_nt(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b.T`` accumulated exactly in int32, for int8 ``a [M, K]`` and ``b [N, K]``."""
    if a.device.type == "cpu":
        if a.shape[1] == 1:  # torch._int_mm on the CPU returns uninitialized values at K = 1 (torch 2.13)
            return a.to(torch.int32) * b.to(torch.int32).t()
        return torch._int_mm(a, b.t())  # exact on CPU for any other shape and layout
    k = a.shape[1]
    acc = torch.zeros((a.shape[0], b.shape[0]), dtype=torch.int32, device=a.device)
    for k0 in range(0, k, _EXACT_FP32_CHUNK):
        part = a[:, k0 : k0 + _EXACT_FP32_CHUNK].float() @ b[:, k0 : k0 + _EXACT_FP32_CHUNK].float().t()
        acc += part.to(torch.int32)
    return acc
