"""Triton kernels of ``fused_moe`` (math: ops/moe/fused_moe.py): the grouped GEMM and the top-k sum.

Grouped GEMM: one program per (block of ``BLOCK_M`` sorted rows, ``BLOCK_N`` output columns).
The rows of a block belong to one expert (ops/moe/align.py), so the program reads one expert's
weight tile per K step and dequantizes it in registers::

    e   = expert_ids[block]; ids = sorted_ids[block rows] (pairs p; P = padding)
    for each K tile (BLOCK_K divides the group, so a tile lies in one group):
        a  = A[row(p), k-tile]                x / h (16-bit) or their int8 codes
        w  = W[e][n-tile, k-tile]            16-bit: as stored; W8A16/W4A16: x.dtype((u - z) * s);
                                               W8A8: int8 codes; W4A8: int8 (u - 8) * group_scale
        acc += a @ w.T                         float32, or int32 (int8 x int8, exact)

* ``GATED`` (fc1): A = x (row(p) = p // top_k), two accumulators over the gate rows n and the
  up rows I + n of ``w13``, epilogue ``h[p, n] = dtype(g / (1 + exp(-g)) * u)`` (after the
  per-token x per-channel scales for int8 activations), stored in pair order.
* fc2: A = h (row(p) = p), epilogue ``y[p, n] = acc (* hs[p] * scale2[e, n]) * w[p]`` in float32,
  stored in pair order; :func:`moe_sum` then adds the top_k rows of each token in j order.

Weight-only tiles are dequantized with the reference's rounding (one rounding of the float32
product to the activation dtype), so only the float32 summation order differs from the
reference; the int8 accumulators are exact. The interpreter (CPU tests) needs two detours
that the GPU does not: dots on float32 operands (``DOT_F32``) and an integer-exact bf16
rounding (``to_act_dtype``), see ops/_exact_triton.py and ops/wna16/common.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._exact_triton import interpreting, silu_mul_f32, to_act_dtype
from .._launch import launch
from ..activation.quant_kernels import device_guard
from ..wna16.common import codes_minus_zero, load_codes, mma, zero_plus_magic


@triton.jit
def _weight_tile(w_ptr, s_ptr, z_ptr, gs_ptr, rn, k0, K, KW, G, DTYPE: tl.constexpr, WBITS: tl.constexpr, ACT_INT8: tl.constexpr,
                 GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 INTERPRET: tl.constexpr, TILED: tl.constexpr = False):  # fmt: skip
    """Rows ``rn`` of one expert's weight over ``k0 .. k0 + BLOCK_K`` as the dot's operand ``[BLOCK_N, BLOCK_K]``
    (0 past K; the activations are 0 there too)."""
    if GROUP == -1:
        g = 0
    else:
        g = k0 // GROUP
    if WBITS == 16:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rn[:, None] * KW + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0)
    elif ACT_INT8 and WBITS == 8:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rn[:, None] * KW + offs_k[None, :], mask=(offs_k < K)[None, :], other=0)
    elif ACT_INT8:
        q = load_codes(w_ptr, rn, k0, K, KW, 4, EVEN_K, BLOCK_N, BLOCK_K) - 8
        if GROUP != -1:
            q = q * tl.load(gs_ptr + rn * G + g).to(tl.int32)[:, None]
        w = q.to(tl.int8)
    else:
        u = load_codes(w_ptr, rn, k0, K, KW, WBITS, EVEN_K, BLOCK_N, BLOCK_K, TILED)  # weight-only: natural or tile-major
        zc = zero_plus_magic(z_ptr, rn * G + g, HAS_ZEROS, WBITS)
        s = tl.load(s_ptr + rn * G + g).to(tl.float32)
        w = to_act_dtype(codes_minus_zero(u, zc[:, None]) * s[:, None], DTYPE, INTERPRET)
    return w


@triton.jit
def _moe_gemm_kernel(
    a_ptr, a_scale_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, topw_ptr, out_ptr, sorted_ids_ptr, expert_ids_ptr, total_ptr,
    P, N, K, KW, G, ROW_DIV,
    GATED: tl.constexpr, WBITS: tl.constexpr, ACT_INT8: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_F32: tl.constexpr, INTERPRET: tl.constexpr, TILED: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    dtype = out_ptr.dtype.element_ty if GATED else a_ptr.dtype.element_ty
    e = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = ids < P
    rows = tl.where(valid, ids // ROW_DIV, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N  # wrap onto valid rows; the store is masked
    w_rows = 2 * N if GATED else N  # rows of one expert's weight
    w_e = w_ptr + e * w_rows * KW
    if ACT_INT8:
        s_e = s_ptr + e * w_rows  # float32 [E, N]: per channel (W4A8's groups are in group_scale)
    else:
        s_e = s_ptr + e * w_rows * G
    z_e = z_ptr + e * w_rows * G
    gs_e = gs_ptr + e * w_rows * G
    if ACT_INT8:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros_like(acc)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kt * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * K + offs_k[None, :], mask=valid[:, None] & (offs_k < K)[None, :], other=0)
        w = _weight_tile(w_e, s_e, z_e, gs_e, rn, k0, K, KW, G, dtype, WBITS, ACT_INT8, GROUP, HAS_ZEROS, EVEN_K, BLOCK_N, BLOCK_K, INTERPRET, TILED)
        if ACT_INT8:
            acc = tl.dot(a, tl.trans(w), acc, out_dtype=tl.int32)
        else:
            acc = mma(a, tl.trans(w), acc, DOT_F32)
        if GATED:
            wu = _weight_tile(w_e, s_e, z_e, gs_e, rn + N, k0, K, KW, G, dtype, WBITS, ACT_INT8, GROUP, HAS_ZEROS, EVEN_K, BLOCK_N, BLOCK_K,
                              INTERPRET, TILED)  # fmt: skip
            if ACT_INT8:
                acc_up = tl.dot(a, tl.trans(wu), acc_up, out_dtype=tl.int32)
            else:
                acc_up = mma(a, tl.trans(wu), acc_up, DOT_F32)

    if ACT_INT8:
        a_scale = tl.load(a_scale_ptr + rows, mask=valid, other=1.0)[:, None]
        res = acc.to(tl.float32) * a_scale * tl.load(s_e + rn)[None, :]
        if GATED:
            up = acc_up.to(tl.float32) * a_scale * tl.load(s_e + rn + N)[None, :]
    else:
        res = acc
        if GATED:
            up = acc_up
    mask = valid[:, None] & (offs_n < N)[None, :]
    out_ptrs = out_ptr + ids[:, None] * N + offs_n[None, :]
    if GATED:
        h = silu_mul_f32(res, up, INTERPRET)
        tl.store(out_ptrs, to_act_dtype(h, dtype, INTERPRET), mask=mask)
    else:
        topw = tl.load(topw_ptr + ids, mask=valid, other=0.0)
        tl.store(out_ptrs, res * topw[:, None], mask=mask)


@triton.jit
def _moe_sum_kernel(y_ptr, w_ptr, out_ptr, H, P, TOP_K: tl.constexpr, SPLITS: tl.constexpr, HAS_W: tl.constexpr, BLOCK: tl.constexpr,
                    INTERPRET: tl.constexpr):  # fmt: skip
    m = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    acc = tl.load(y_ptr + m * TOP_K * H + offs, mask=mask, other=0.0)
    if HAS_W:
        acc = acc * tl.load(w_ptr + m * TOP_K)
    for i in tl.static_range(1, TOP_K * SPLITS):  # row j of split s: s * P + m * TOP_K + j; j outer, as the reference
        row = tl.load(y_ptr + ((i % SPLITS) * P + m * TOP_K + i // SPLITS) * H + offs, mask=mask, other=0.0)
        if HAS_W:
            row = row * tl.load(w_ptr + m * TOP_K + i // SPLITS)
        acc += row
    tl.store(out_ptr + m * H + offs, to_act_dtype(acc, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


@triton.jit
def _silu_and_mul_kernel(gu_ptr, h_ptr, N, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    p = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(gu_ptr + p * 2 * N + offs, mask=mask, other=0.0)
    u = tl.load(gu_ptr + p * 2 * N + N + offs, mask=mask, other=0.0)
    h = silu_mul_f32(g, u, INTERPRET)
    tl.store(h_ptr + p * N + offs, to_act_dtype(h, h_ptr.dtype.element_ty, INTERPRET), mask=mask)


def silu_and_mul_rows(gu: Tensor, dtype: torch.dtype, block: int = 1024) -> Tensor:
    """``dtype(g / (1 + exp(-g)) * u)`` for float32 ``gu [P, 2N]`` = ``[g | u]`` per row, in one launch
    (the grouped kernel's fc1 epilogue, for kernels that store ``gu``)."""
    pairs, n = gu.shape[0], gu.shape[1] // 2
    h = torch.empty((pairs, n), dtype=dtype, device=gu.device)
    block = min(block, triton.next_power_of_2(n))
    with device_guard(gu):
        launch(_silu_and_mul_kernel, (pairs, triton.cdiv(n, block)), gu.contiguous(), h, n, BLOCK=block, INTERPRET=interpreting(), num_warps=4)
    return h


def block_k_for(cfg: dict, group_size: int) -> int:
    """The config's BLOCK_K, capped at the group so a K tile never spans two groups."""
    return cfg["BLOCK_K"] if group_size == -1 else min(cfg["BLOCK_K"], group_size)


def moe_gemm(
    a: Tensor, a_scale: Tensor | None, w: Tensor, scale: Tensor | None, zeros: Tensor | None, group_scale: Tensor | None,
    topw: Tensor | None, sorted_ids: Tensor, expert_ids: Tensor, total: Tensor, pairs: int, row_div: int, gated: bool,
    weight_bits: int, act_bits: int, group_size: int, cfg: dict, out_dtype: torch.dtype, tiled: bool = False,
) -> Tensor:  # fmt: skip
    """One grouped-GEMM launch (arguments already checked): fc1 (``gated``: ``h [pairs, I]`` in
    ``out_dtype``) or fc2 (``y * topw`` as float32 ``[pairs, H]``); ``tiled``: weight-only ``w``
    tile-major (ops/moe/tile_major.py)."""
    k = a.shape[1]
    n = w.shape[1] // 2 if gated else w.shape[1]
    block_k = block_k_for(cfg, group_size)
    groups = 1 if group_size == -1 else k // group_size
    out = torch.empty((pairs, n), dtype=out_dtype if gated else torch.float32, device=a.device)
    grid = (expert_ids.numel(), triton.cdiv(n, cfg["BLOCK_N"]))
    dummy = w  # stands in for the absent tensors: never read (constexpr-disabled)
    with device_guard(a):
        launch(_moe_gemm_kernel, grid,
            a, a_scale if a_scale is not None else dummy, w, scale if scale is not None else dummy,
            zeros if zeros is not None else dummy, group_scale if group_scale is not None else dummy,
            topw if topw is not None else dummy, out, sorted_ids, expert_ids, total,
            pairs, n, k, w.shape[2], groups, row_div,
            GATED=gated, WBITS=weight_bits, ACT_INT8=act_bits == 8, GROUP=group_size, HAS_ZEROS=zeros is not None,
            EVEN_K=k % block_k == 0, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k,
            DOT_F32=not a.is_cuda, INTERPRET=interpreting(), TILED=tiled,
            num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3),
        )  # fmt: skip
    return out


def moe_sum(y: Tensor, top_k: int, dtype: torch.dtype, weights: Tensor | None = None, block: int = 1024) -> Tensor:
    """``out[m] = dtype(y[m * top_k] + y[m * top_k + 1] + ...)`` (float32 ``y [M * top_k, H]``, j order);
    ``y [S, M * top_k, H]`` (K-split partials): ``sum_j sum_s y[s, m * top_k + j]``, s inner. With
    float32 ``weights [M * top_k]`` each row is first multiplied by its pair's weight (rounded
    there, as ``y * w[:, None]`` then the sum)."""
    splits = y.shape[0] if y.dim() == 3 else 1
    pairs, h = y.shape[-2:]
    m = pairs // top_k
    out = torch.empty((m, h), dtype=dtype, device=y.device)
    block = min(block, triton.next_power_of_2(h))
    with device_guard(y):
        launch(_moe_sum_kernel, (m, triton.cdiv(h, block)), y, weights if weights is not None else y, out, h, pairs,
               TOP_K=top_k, SPLITS=splits, HAS_W=weights is not None, BLOCK=block, INTERPRET=interpreting(), num_warps=4)  # fmt: skip
    return out
