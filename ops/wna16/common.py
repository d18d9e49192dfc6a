"""Triton pieces shared by the ``wna16_gemm`` kernels: code -> float conversion, the
single-launch split-K reduction, and a standalone dequantize kernel (for the dequant + cuBLAS path).

Codes become floats with the exponent trick instead of an int -> float convert:
``bitcast_f32(u | 0x4B000000) == 2**23 + u`` exactly for ``0 <= u < 2**23``, so
``bitcast_f32(u | 0x4B000000) - (2**23 + z) == float32(u - z)`` exactly. That is one
integer OR (which ptxas merges with the nibble mask into one LOP3) and one FADD per code,
where I2F runs at a quarter of the FP32 rate on Hopper and bounds a W4A16 GEMV.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._launch import launch
from .._zeroed_workspace import zeroed_int32

MAGIC = 8388608.0  # 2**23: float32 with exponent 23, so the low mantissa bits hold an integer


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of program ``pid`` in grouped order: GROUP_M row tiles run next to each
    other over every weight column tile, so a weight tile is reused while it is in L2."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    size_m = min(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


@triton.jit
def tile_coords(M, N, K_PER_SPLIT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """The tiled kernels' program coordinates: ``(pid_k, offs_m, offs_n, rm, rn, k_start)``;
    ``rm`` / ``rn`` wrap rows and columns past M / N onto valid memory (the store is masked)."""
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return pid_k, offs_m, offs_n, offs_m % M, offs_n % N, pid_k * K_PER_SPLIT


@triton.jit
def tile_major_rows(rn, row_len, UNIT: tl.constexpr):
    """Where rows ``rn`` of a matrix of ``row_len``-element rows start in its tile-major layout
    (ops/moe/tile_major.py): tiles of 64 rows x ``UNIT`` elements (64 bytes), stored row tile by
    row tile, each one's tiles along the row in order. Add :func:`tile_major_cols` of the columns."""
    return (rn // 64) * (row_len * 64) + (rn % 64) * UNIT


@triton.jit
def tile_major_cols(c, UNIT: tl.constexpr):
    """The part of columns ``c`` in a tile-major offset (:func:`tile_major_rows`)."""
    return (c // UNIT) * (64 * UNIT) + c % UNIT


@triton.jit
def codes_minus_zero(u, zc):
    """``float32(u - z)`` for int32 codes ``u`` in [0, 255]; ``zc`` = 2**23 + z (float32)."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - zc


@triton.jit
def load_codes(qw_ptr, rn, k0, K, KB, BITS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               TILED: tl.constexpr = False):  # fmt: skip
    """int32 codes ``u[rn, k0 : k0 + BLOCK_K]`` as ``[BLOCK_N, BLOCK_K]`` (0 past K); ``KB`` bytes per
    row, ``TILED``: in the tile-major layout (:func:`tile_major_rows`; K a whole number of tiles).

    4-bit: ``BLOCK_K / 2`` contiguous bytes per row (vector loads), nibbles interleaved in
    registers: ``join(low, high)`` puts k = 2j, 2j + 1 side by side, the reshape merges them."""
    if TILED:
        row = tile_major_rows(rn, KB, 64)
    else:
        row = rn * KB
    if BITS == 4:
        offs_j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        col = tile_major_cols(offs_j, 64) if TILED else offs_j
        ptrs = qw_ptr + row[:, None] + col[None, :]
        if EVEN_K:
            b = tl.load(ptrs, eviction_policy="evict_first").to(tl.int32)
        else:
            b = tl.load(ptrs, mask=(offs_j < KB)[None, :], other=0).to(tl.int32)
        return tl.reshape(tl.join(b & 15, b >> 4), (BLOCK_N, BLOCK_K))
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        col = tile_major_cols(offs_k, 64) if TILED else offs_k
        ptrs = qw_ptr + row[:, None] + col[None, :]
        if EVEN_K:
            return tl.load(ptrs, eviction_policy="evict_first").to(tl.int32)
        else:
            return tl.load(ptrs, mask=(offs_k < K)[None, :], other=0).to(tl.int32)


@triton.jit
def mma(a, b, acc, DOT_F32: tl.constexpr):
    """``acc + a @ b``. DOT_F32 (the CPU interpreter only, which multiplies bf16 dot operands
    as their raw uint16 bits in triton 3.7): upcast the operands first, exactly."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def scaled_weights(w, s, dtype: tl.constexpr, DOT_F32: tl.constexpr):
    """``dtype(w * s[:, None])`` for exact ``w`` and per-row scales ``s`` in ``dtype``: one rounding
    of the exact product, as the reference's float32 product then rounding (on the GPU one packed
    multiply per two codes). DOT_F32 (the interpreter, no bf16 arithmetic): float32, then round."""
    if DOT_F32:
        return (w.to(tl.float32) * s.to(tl.float32)[:, None]).to(dtype)
    else:
        return w * s[:, None]


@triton.jit
def zero_plus_magic(z_ptr, offs, HAS_ZEROS: tl.constexpr, BITS: tl.constexpr):
    """2**23 + z for the zero points at ``offs`` (uint8), or for the symmetric z = 2**(bits-1)."""
    if HAS_ZEROS:
        return tl.load(z_ptr + offs).to(tl.float32) + 8388608.0
    else:
        return tl.full(offs.shape, 8388608.0 + (1 << (BITS - 1)), tl.float32)


@triton.jit
def store_tile(
    acc,
    s_ptr,
    bias_ptr,
    out_ptr,
    ws_ptr,
    count_ptr,
    rn,
    offs_m,
    offs_n,
    pid_k,
    M,
    N,
    G,
    GROUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """The tiled kernels' epilogue for a float32 ``acc [BLOCK_M, BLOCK_N]``: the per-channel
    scale (``GROUP == -1``), then either bias and the store in the output dtype, or with split-K
    :func:`finish_split` (the tile's counter is its linear program id, ``program_id(0)``)."""
    if GROUP == -1:
        acc = acc * tl.load(s_ptr + rn * G).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    idx = offs_m[:, None] * N + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn).to(tl.float32)[None, :]
        tl.store(out_ptr + idx, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        finish_split(acc, idx, mask, (bias_ptr + rn)[None, :], ws_ptr, count_ptr, out_ptr, tl.program_id(0), pid_k, M * N, SPLIT_K, HAS_BIAS)


@triton.jit
def store_row(
    res, s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_n, m, tile, pid_k, M, N, G, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K
):
    """The GEMVs' epilogue for the float32 ``res [BLOCK_N]`` of activation row ``m``: the
    per-channel scale (``GROUP == -1``), then either bias and the store in the output dtype, or
    with split-K :func:`finish_split` on counter ``tile`` (SPLIT_K may be a runtime value)."""
    if GROUP == -1:
        res = res * tl.load(s_ptr + rn * G).to(tl.float32)
    mask = offs_n < N
    if SPLIT_K == 1:
        if HAS_BIAS:
            res += tl.load(bias_ptr + rn).to(tl.float32)
        tl.store(out_ptr + m * N + offs_n, res.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        finish_split(res, m * N + offs_n, mask, bias_ptr + rn, ws_ptr, count_ptr, out_ptr, tile, pid_k, M * N, SPLIT_K, HAS_BIAS)


@triton.jit
def finish_split(part, idx, mask, bias_ptrs, ws_ptr, count_ptr, out_ptr, tile, pid_k, MN, SPLIT_K, HAS_BIAS: tl.constexpr):
    """Single-launch deterministic split-K: store this split's float32 ``part`` (output
    elements ``idx``) in ``ws[pid_k]``; the split that arrives last at the tile's counter sums
    ``ws[0], ws[1], ..., ws[SPLIT_K - 1]`` in that order (+ bias), stores the output and resets
    the counter to 0 for the next launch. The sum order is fixed, so the result does not depend
    on which split finishes last. Replaces a second reduction launch (a few us per call at decode
    M, where the whole GEMM takes 9-40 us on the H200)."""
    tl.store(ws_ptr + pid_k * MN + idx, part, mask=mask)
    tl.debug_barrier()  # every thread's partial is stored before the counter moves
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    if arrived == SPLIT_K - 1:
        acc = tl.load(ws_ptr + idx, mask=mask, other=0.0, cache_modifier=".cg")  # L2, not a stale L1 line
        for s in range(1, SPLIT_K):
            acc += tl.load(ws_ptr + s * MN + idx, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            acc += tl.load(bias_ptrs).to(tl.float32)
        tl.store(out_ptr + idx, acc.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(count_ptr + tile, 0)


def split_counters(device: torch.device, tiles: int) -> Tensor:
    """Zeroed int32 arrival counters for ``tiles`` output tiles (see :func:`finish_split`)."""
    return zeroed_int32(device, tiles)


def output_buffers(
    x: Tensor, n: int, split_k: int, tiles: int, rows: int | None = None, dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``out [M, N]`` (M = ``rows``, default x's; ``dtype``, default x's), the float32 split-K
    workspace ``[SPLIT_K, M, N]`` and the ``tiles`` arrival counters (``out`` stands in for both
    when SPLIT_K == 1: never touched)."""
    out = torch.empty((x.shape[0] if rows is None else rows, n), dtype=dtype or x.dtype, device=x.device)
    if split_k == 1:
        return out, out, out
    return out, *split_workspace(out, n, split_k, tiles)


def split_workspace(x: Tensor, n: int, split_k: int, tiles: int) -> tuple[Tensor, Tensor]:
    """The float32 split-K partials ``[SPLIT_K, M, N]`` and the ``tiles`` arrival counters."""
    return torch.empty((split_k, x.shape[0], n), dtype=torch.float32, device=x.device), split_counters(x.device, tiles)


@triton.jit
def _dequant_kernel(qw_ptr, s_ptr, z_ptr, w_ptr, N, K, KB, G, BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr,
                    EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """w[n, k] = dtype(float32(u - z) * float32(s)) for a [BLOCK_N, BLOCK_K] tile (bit-exact with
    the reference); BLOCK_K <= GROUP, so one scale per row per tile."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    rn = offs_n % N
    u = load_codes(qw_ptr, rn, k0, K, KB, BITS, EVEN_K, BLOCK_N, BLOCK_K)
    if GROUP == -1:
        soffs = rn * G
    else:
        soffs = rn * G + k0 // GROUP
    zc = zero_plus_magic(z_ptr, soffs, HAS_ZEROS, BITS)
    s = tl.load(s_ptr + soffs).to(tl.float32)
    w = codes_minus_zero(u, zc[:, None]) * s[:, None]
    mask = (offs_n < N)[:, None] & (offs_k < K)[None, :]
    tl.store(w_ptr + offs_n[:, None] * K + offs_k[None, :], w.to(w_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


def dequantize_triton(qweight: Tensor, scales: Tensor, zeros: Tensor | None, bits: int, group_size: int, dtype: torch.dtype) -> Tensor:
    """``w_hat`` as ``dtype [N, K]``: the reference dequantization, one Triton kernel."""
    n = qweight.shape[0]
    k = qweight.shape[1] * 8 // bits
    w = torch.empty((n, k), dtype=dtype, device=qweight.device)
    bn, bk = 32, 128 if group_size == -1 else min(128, group_size)
    grid = (triton.cdiv(n, bn), triton.cdiv(k, bk))
    launch(_dequant_kernel, grid, qweight, scales, zeros if zeros is not None else qweight, w, n, k, qweight.shape[1], scales.shape[1],
                          BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, EVEN_K=k % bk == 0, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)  # fmt: skip
    return w


# ---------------------------------------------------------------- config helpers of the families


def split_for(tiles: int, k: int, block_k: int, sms: int) -> int:
    """Smallest power-of-two split that puts ~2 programs on every SM, keeping >= 4 K tiles each."""
    split = 1
    while tiles * split < 2 * sms and split < 16 and k // (2 * split * block_k) >= 4:
        split *= 2
    return split


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def weight_major_tiles(mb: int, exhaustive: bool) -> list[tuple[int, int, int, int, int]]:
    """(tokens BLOCK_M, weight rows BLOCK_N, BLOCK_K, warps, stages) of the large weight-major
    tiles for M bucket ``mb`` (tokens up to twice the bucket)."""
    tiles = [
        (128, 64, 64, 4, 4),
        (128, 128, 64, 4, 3),
        (128, 128, 64, 8, 4),
        (256, 64, 64, 4, 3),
        (256, 128, 64, 8, 3),
        (128, 128, 128, 8, 3),
        (64, 256, 64, 8, 4),
    ]
    if exhaustive:
        tiles += [(128, 256, 64, 8, 3), (256, 128, 128, 8, 2), (256, 128, 64, 8, 4), (256, 64, 64, 4, 4)]
    return [t for t in tiles if t[0] <= 2 * mb]
