"""Tiled tensor-core kernel for ``wna16_gemm`` (any M; split-K for skinny M).

One program computes a ``[BLOCK_M, BLOCK_N]`` output tile over a ``1 / SPLIT_K`` slice of K::

    for each K tile (BLOCK_K <= group_size, so a tile lies in one group):
        u      = codes of W[n-tile, k-tile]                     (uint8 bytes, unpacked in registers)
        w      = dtype( float32(u - z[n, g]) * float32(s[n, g]) )  (bit-exact with the reference)
        acc   += x[m-tile, k-tile] @ w.T                          (tl.dot, float32 accumulator)

4-bit codes are used without reordering: a byte holds k = 2j (low nibble) and k = 2j + 1
(high nibble); the weight tile is loaded as ``[BLOCK_N, BLOCK_K / 2]`` contiguous bytes and
interleaved in registers (``join(lo, hi)`` then reshape), so activations load contiguously
(a first version ran two dots on stride-2 activation loads: 3-10x slower at M >= 32).

Variants chosen by config (the math stays the one of ``wna16_gemm``):

* per-channel scales (``GROUP == -1``): ``u - z`` is an exact small integer in bf16/fp16,
  so the dot runs on it and the scale multiplies the accumulator once, after the loop;
* ``SCALE_AFTER_DOT`` (grouped): the dot runs on exact ``u - z`` and each K tile's partial
  product is scaled, ``acc += (x @ (u - z).T) * s``: ``BLOCK_M * BLOCK_N`` multiplies per
  tile instead of ``BLOCK_K * BLOCK_N``, cheaper when BLOCK_M < BLOCK_K (decode). Both skip
  the weight's rounding to the activation dtype: tolerance in the tests;
* ``SPLIT_K > 1``: each slice writes float32 partials to ``ws [SPLIT_K, M, N]`` and the
  last slice to finish a tile adds them (and the bias) in a fixed order, in the same launch
  (:func:`finish_split`): deterministic.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket
from .._launch import launch
from ..kernel_family import KernelFamily, Problem
from .common import cdiv, codes_minus_zero, load_codes, mma, output_buffers, split_for, store_tile, tile_coords, zero_plus_magic


@triton.jit
def _wna16_tiled_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K, KB, G, stride_xm, K_PER_SPLIT,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, SCALE_AFTER_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_F32: tl.constexpr,
):  # fmt: skip
    # grouped tile order: GROUP_M row tiles share each weight column tile while it is in L2
    pid_k, offs_m, offs_n, rm, rn, k_start = tile_coords(M, N, K_PER_SPLIT, BLOCK_M, BLOCK_N, GROUP_M)
    dtype = x_ptr.dtype.element_ty

    if GROUP == -1:  # per-channel: zero point and scale are per row, outside the loop
        zc = zero_plus_magic(z_ptr, rn * G, HAS_ZEROS, BITS)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K_PER_SPLIT, BLOCK_K)):
        k0 = k_start + kt * BLOCK_K
        if GROUP != -1:
            g = tl.minimum(k0 // GROUP, G - 1)  # clamp: masked tail tiles past K
            zc = zero_plus_magic(z_ptr, rn * G + g, HAS_ZEROS, BITS)
            s = tl.load(s_ptr + rn * G + g).to(tl.float32)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rm[:, None] * stride_xm + offs_k[None, :]
        if EVEN_K:
            xt = tl.load(x_ptrs, eviction_policy="evict_last")
        else:
            xt = tl.load(x_ptrs, mask=(offs_k < K)[None, :], other=0.0)
        u = load_codes(qw_ptr, rn, k0, K, KB, BITS, EVEN_K, BLOCK_N, BLOCK_K)  # [BLOCK_N, BLOCK_K]
        w = codes_minus_zero(u, zc[:, None])
        if GROUP != -1 and not SCALE_AFTER_DOT:
            w = w * s[:, None]
        wt = tl.trans(w.to(dtype))
        if GROUP != -1 and SCALE_AFTER_DOT:
            acc += mma(xt, wt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), DOT_F32) * s[None, :]
        else:
            acc = mma(xt, wt, acc, DOT_F32)

    store_tile(acc, s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_m, offs_n, pid_k, M, N, G, GROUP, HAS_BIAS, SPLIT_K)


def k_plan(k: int, cfg: dict, group_size: int) -> tuple[int, int, int, bool]:
    """``(BLOCK_K, SPLIT_K, K per split, EVEN_K)`` of a config: BLOCK_K capped at the group so a
    tile never spans two groups, then :func:`split_k_slices`."""
    block_k = cfg["BLOCK_K"] if group_size == -1 else min(cfg["BLOCK_K"], group_size)
    split_k = cfg.get("SPLIT_K", 1)
    return (block_k, split_k, *split_k_slices(k, block_k, split_k))


def split_k_slices(k: int, block_k: int, split_k: int) -> tuple[int, bool]:
    """(K per split, rounded to BLOCK_K; whether every split is whole tiles with no K mask)."""
    if k % (block_k * split_k) == 0:
        return k // split_k, True
    return triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k, False


def wna16_tiled(
    x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int, cfg: dict
) -> Tensor:
    """Launch the tiled kernel with config ``cfg`` (arguments already checked)."""
    m, k = x.shape
    n = qweight.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    block_k, split_k, k_per_split, even_k = k_plan(k, cfg, group_size)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), split_k)
    out, ws, counts = output_buffers(x, n, split_k, grid[0])
    launch(_wna16_tiled_kernel, grid,
        x, qweight, scales, zeros if zeros is not None else qweight, bias if bias is not None else scales, out, ws, counts,
        m, n, k, qweight.shape[1], scales.shape[1], x.stride(0), k_per_split,
        BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None,
        SPLIT_K=split_k, EVEN_K=even_k, SCALE_AFTER_DOT=bool(cfg.get("SCALE_AFTER_DOT", False)) and group_size != -1,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k, GROUP_M=cfg.get("GROUP_M", 8), DOT_F32=not x.is_cuda,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3),
    )  # fmt: skip
    return out


def tiled_configs(p: Problem, exhaustive: bool) -> list[dict]:
    """The tile configs: decode / mid-M tiles (split-K for skinny grids) up to M bucket 64, large tiles from 64."""
    m, n, k, sms = p.m, p.n, p.k, p.sms
    mb = m_bucket(m)
    gk = p.group_size if p.group_size > 0 else 256
    out = []
    if mb <= 64:
        bm = max(16, min(64, mb))
        for bn in (64, 128):
            for bk in sorted({min(128, gk), min(256, gk)}):
                split = split_for(cdiv(m, bm) * cdiv(n, bn), k, bk, sms)
                for sp in sorted({split, 1} | ({2 * split} if exhaustive else set()), reverse=True):
                    for stages in (3, 4) if exhaustive else (3,):
                        out.append(
                            {
                                "BLOCK_M": bm,
                                "BLOCK_N": bn,
                                "BLOCK_K": bk,
                                "SPLIT_K": sp,
                                "SCALE_AFTER_DOT": bm < bk,
                                "GROUP_M": 8,
                                "num_warps": 4,
                                "num_stages": stages,
                            }
                        )
    if mb >= 64:
        big = [(64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 128, 8, 3)]
        if exhaustive:
            big += [(64, 256, 64, 8, 4), (128, 256, 128, 8, 3), (128, 128, 64, 4, 4), (64, 128, 128, 4, 4)]
        for bm, bn, bk, warps, stages in big:
            if bm > 2 * mb:
                continue
            out.append(
                {
                    "BLOCK_M": bm,
                    "BLOCK_N": bn,
                    "BLOCK_K": min(bk, gk),
                    "SPLIT_K": 1,
                    "SCALE_AFTER_DOT": False,
                    "GROUP_M": 8,
                    "num_warps": warps,
                    "num_stages": stages,
                }
            )
    return out


def _run(cfg, x, qweight, scales, zeros, bias, bits, group_size):
    return wna16_tiled(x, qweight, scales, zeros, bias, bits, group_size, cfg)


FAMILY = KernelFamily("tiled", "wna16/tiled", lambda p: (True, ""), tiled_configs, _run)
