"""CUDA-core GEMV kernel for ``wna16_gemm`` at decode M (1 to a few rows), with split-K.

One program owns one activation row ``m``, ``BLOCK_N`` weight rows and a ``1 / SPLIT_K``
slice of K. Programs of consecutive ``m`` read the same weight tile back to back, so for
M > 1 the tile comes from L2 after the first row. Per K tile::

    w        = float32(u - z[n, g]) * float32(s[n, g])       (exponent trick, no I2F)
    acc2d   += w * x[m, k-tile]                              ([BLOCK_N, BLOCK_K] partial sums)

and ``tl.sum(acc2d, axis=1)`` once after the loop, so the cross-lane reduction is paid
once per program, not per tile. The weight is used in float32 (not rounded to the
activation dtype first): one rounding of the weight away from the reference, in the tests'
tolerance. Split-K partials go through the same deterministic reduction as the tiled kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket
from .._launch import launch
from ..kernel_family import KernelFamily, Problem
from .common import cdiv, codes_minus_zero, load_codes, output_buffers, split_for, store_row, zero_plus_magic
from .tiled import k_plan


@triton.jit
def _wna16_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K, KB, G, stride_xm, K_PER_SPLIT,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = pid % M
    pid_n = pid // M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N
    k_start = pid_k * K_PER_SPLIT
    x_row = x_ptr + m * stride_xm

    if GROUP == -1:
        zc = zero_plus_magic(z_ptr, rn * G, HAS_ZEROS, BITS)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K_PER_SPLIT, BLOCK_K)):
        k0 = k_start + kt * BLOCK_K
        if GROUP != -1:
            g = tl.minimum(k0 // GROUP, G - 1)
            zc = zero_plus_magic(z_ptr, rn * G + g, HAS_ZEROS, BITS)
            s = tl.load(s_ptr + rn * G + g).to(tl.float32)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            xt = tl.load(x_row + offs_k, eviction_policy="evict_last").to(tl.float32)
        else:
            xt = tl.load(x_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        w = codes_minus_zero(load_codes(qw_ptr, rn, k0, K, KB, BITS, EVEN_K, BLOCK_N, BLOCK_K), zc[:, None])
        if GROUP != -1:
            w = w * s[:, None]
        acc += w * xt[None, :]

    store_row(tl.sum(acc, axis=1), s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_n, m, pid, pid_k, M, N, G, GROUP, HAS_BIAS, SPLIT_K)


def wna16_gemv(
    x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int, cfg: dict
) -> Tensor:
    """Launch the GEMV kernel with config ``cfg`` (arguments already checked)."""
    m, k = x.shape
    n = qweight.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    block_k, split_k, k_per_split, even_k = k_plan(k, cfg, group_size)
    grid = (m * triton.cdiv(n, cfg["BLOCK_N"]), split_k)
    out, ws, counts = output_buffers(x, n, split_k, grid[0])
    launch(_wna16_gemv_kernel, grid,
        x, qweight, scales, zeros if zeros is not None else qweight, bias if bias is not None else scales, out, ws, counts,
        m, n, k, qweight.shape[1], scales.shape[1], x.stride(0), k_per_split,
        BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None,
        SPLIT_K=split_k, EVEN_K=even_k, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 2),
    )  # fmt: skip
    return out


def _configs(p: Problem, exhaustive: bool) -> list[dict]:
    gk = p.group_size if p.group_size > 0 else 256  # BLOCK_K never spans two groups
    out = []
    bk = min(256, gk)
    for bn in (64, 32):
        split = split_for(cdiv(p.n, bn), p.k, bk, p.sms)
        for sp in sorted({1, split} | ({2 * split} if exhaustive else set()), reverse=True):
            for warps in (4, 8) if exhaustive else (4,):
                out.append({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sp, "num_warps": warps, "num_stages": 2})
    return out


def _run(cfg, x, qweight, scales, zeros, bias, bits, group_size):
    return wna16_gemv(x, qweight, scales, zeros, bias, bits, group_size, cfg)


FAMILY = KernelFamily("gemv", "wna16/gemv", lambda p: (True, "") if m_bucket(p.m) <= 4 else (False, "M bucket > 4"), _configs, _run)
