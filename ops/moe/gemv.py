"""CUDA-core GEMV kernels of ``fused_moe`` for decode M with weight-only experts (W8A16, W4A16).

At decode the grouped GEMM (ops/moe/grouped_gemm.py) pads each expert's one or two rows to a
16-row MMA tile and dequantizes a whole weight tile per K step for them. This family instead
runs one program per (pair, ``BLOCK_N`` weight rows, K slice), where pair ``p = m * top_k + j``
is token ``m``'s ``j``-th expert ``e = experts[m, j]``, and needs no sorting (no
ops/moe/align.py launches)::

    w     = float32(u - z[n, g]) * float32(s[n, g])      (exponent trick, no I2F; per channel:
                                                          s after the sum)
    acc  += w * a[row(p), k-tile]                        ([BLOCK_N, BLOCK_K] partial sums)

and one ``tl.sum(acc, axis=1)`` after the loop. fc1 (``GATED``, A = x, row(p) = p // top_k)
keeps two accumulators, for the gate rows n and the up rows I + n of ``w13``, and stores
``h[p, n] = dtype(silu(g) * u)``. fc2 (A = h, row(p) = p) may split K over ``SPLIT_K``
programs: each stores its float32 partial times the routing weight into its own slice of
``y [SPLIT_K, P, H]``, and :func:`~ops.moe.grouped_gemm.moe_sum` adds the slices and the top-k
rows of a token in a fixed order (deterministic, no atomics). Consecutive programs are pairs
of the same N tile, so when tokens share an expert its weight tile is re-read from L2.

The weight is used in float32 (not rounded to the activation dtype first, as the reference
does): one rounding per weight away from the reference, inside the tests' tolerance.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket
from .._exact_triton import interpreting, silu_mul_f32, to_act_dtype
from .._launch import launch
from ..activation.quant_kernels import device_guard
from ..kernel_family import KernelFamily, Problem
from ..wna16.common import codes_minus_zero, load_codes, zero_plus_magic
from .align import fc1_row_div
from .grouped_gemm import moe_sum


@triton.jit
def _dequant_times_x(w_ptr, s_ptr, z_ptr, rn, k0, xt, K, KW, G, WBITS: tl.constexpr, GROUP: tl.constexpr,
                     HAS_ZEROS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TILED: tl.constexpr):  # fmt: skip
    """``w[rn, k0 : k0 + BLOCK_K] * xt`` in float32 (per channel: without the scale)."""
    u = load_codes(w_ptr, rn, k0, K, KW, WBITS, EVEN_K, BLOCK_N, BLOCK_K, TILED)
    if GROUP == -1:
        zc = zero_plus_magic(z_ptr, rn, HAS_ZEROS, WBITS)
        return codes_minus_zero(u, zc[:, None]) * xt[None, :]
    else:
        g = k0 // GROUP
        zc = zero_plus_magic(z_ptr, rn * G + g, HAS_ZEROS, WBITS)
        s = tl.load(s_ptr + rn * G + g).to(tl.float32)
        return codes_minus_zero(u, zc[:, None]) * s[:, None] * xt[None, :]


@triton.jit
def _moe_gemv_kernel(
    a_ptr, w_ptr, s_ptr, z_ptr, topw_ptr, experts_ptr, out_ptr,
    P, N, K, KW, G, ROW_DIV, K_PER_SPLIT,
    GATED: tl.constexpr, WBITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TILED: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    e = tl.load(experts_ptr + p).to(tl.int64)
    a_row = a_ptr + (p // ROW_DIV).to(tl.int64) * K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N  # wrap onto valid rows; the store is masked
    w_rows = 2 * N if GATED else N  # rows of one expert's weight
    w_e = w_ptr + e * w_rows * KW
    s_e = s_ptr + e * w_rows * G
    z_e = z_ptr + e * w_rows * G
    k_start = pid_k * K_PER_SPLIT
    k_tiles = tl.cdiv(tl.minimum(K - k_start, K_PER_SPLIT), BLOCK_K)  # <= 0 for a split past K: no tiles

    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros_like(acc)
    for kt in range(0, k_tiles):
        k0 = k_start + kt * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            xt = tl.load(a_row + offs_k, eviction_policy="evict_last").to(tl.float32)
        else:
            xt = tl.load(a_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        acc += _dequant_times_x(w_e, s_e, z_e, rn, k0, xt, K, KW, G, WBITS, GROUP, HAS_ZEROS, EVEN_K, BLOCK_N, BLOCK_K, TILED)
        if GATED:
            acc_up += _dequant_times_x(w_e, s_e, z_e, rn + N, k0, xt, K, KW, G, WBITS, GROUP, HAS_ZEROS, EVEN_K, BLOCK_N, BLOCK_K, TILED)

    res = tl.sum(acc, axis=1)
    if GROUP == -1:
        res = res * tl.load(s_e + rn).to(tl.float32)
    mask = offs_n < N
    if GATED:
        up = tl.sum(acc_up, axis=1)
        if GROUP == -1:
            up = up * tl.load(s_e + rn + N).to(tl.float32)
        h = silu_mul_f32(res, up, INTERPRET)
        tl.store(out_ptr + p.to(tl.int64) * N + offs_n, to_act_dtype(h, out_ptr.dtype.element_ty, INTERPRET), mask=mask)
    else:
        topw = tl.load(topw_ptr + p)
        tl.store(out_ptr + (pid_k * P + p).to(tl.int64) * N + offs_n, res * topw, mask=mask)


def moe_gemv(
    a: Tensor, w: Tensor, scale: Tensor, zeros: Tensor | None, topw: Tensor | None, experts: Tensor, row_div: int,
    gated: bool, weight_bits: int, group_size: int, cfg: dict, out_dtype: torch.dtype, tiled: bool = False,
) -> Tensor:  # fmt: skip
    """One GEMV launch over the pairs (arguments already checked): fc1 (``gated``: ``h [P, I]`` in
    ``out_dtype``) or fc2 (``y * topw`` as float32 ``[SPLIT_K, P, H]``); ``tiled``: ``w`` tile-major (ops/moe/tile_major.py)."""
    pairs = experts.numel()
    k = a.shape[1]
    n = w.shape[1] // 2 if gated else w.shape[1]
    block_k = cfg["BLOCK_K"] if group_size == -1 else min(cfg["BLOCK_K"], group_size)
    split = 1 if gated else cfg.get("SPLIT_K", 1)
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k  # whole tiles, so no tile spans two splits
    groups = 1 if group_size == -1 else k // group_size
    shape = (pairs, n) if gated else (split, pairs, n)
    out = torch.empty(shape, dtype=out_dtype if gated else torch.float32, device=a.device)
    grid = (pairs, triton.cdiv(n, cfg["BLOCK_N"]), split)
    with device_guard(a):
        launch(_moe_gemv_kernel, grid,
            a, w, scale, zeros if zeros is not None else w, topw if topw is not None else scale, experts, out,
            pairs, n, k, w.shape[2], groups, row_div, k_per_split,
            GATED=gated, WBITS=weight_bits, GROUP=group_size, HAS_ZEROS=zeros is not None, EVEN_K=k % block_k == 0,
            BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k, TILED=tiled, INTERPRET=interpreting(),
            num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 2),
        )  # fmt: skip
    return out


def run_moe_gemv(
    cfg: dict, x: Tensor, weights: Tensor, experts: Tensor, w13: Tensor, w13_scale, w13_zeros, w13_group_scale,
    w2: Tensor, w2_scale, w2_zeros, w2_group_scale, weight_bits: int, act_bits: int, group_size: int, tile_major: bool = False,
) -> Tensor:  # fmt: skip
    """``fused_moe`` after routing with one GEMV config: fc1 + SiLU-and-mul, fc2, the top-k sum."""
    top_k = experts.shape[1]
    x = x.contiguous()
    experts = experts.contiguous()
    h = moe_gemv(x, w13, w13_scale, w13_zeros, None, experts, fc1_row_div(x, experts), True, weight_bits, group_size, cfg, x.dtype, tile_major)
    y = moe_gemv(h, w2, w2_scale, w2_zeros, weights.contiguous(), experts, 1, False, weight_bits, group_size, cfg, x.dtype, tile_major)
    return moe_sum(y, top_k, x.dtype)


def _supports(p: Problem) -> tuple[bool, str]:
    if p.act_bits != 16 or p.bits not in (4, 8):
        return False, "weight-only quantized experts only (W8A16, W4A16)"
    if m_bucket(p.m) > 16:
        return False, "M bucket > 16 (each expert's rows fill a tensor-core tile)"
    return True, ""


def gemv_configs(p: Problem, exhaustive: bool) -> list[dict]:
    """Row tiles x K tiles (capped at the group when the launch runs) x fc2's K splits."""
    out = []
    for bn in (16, 32) if not exhaustive else (8, 16, 32, 64):
        for bk in (128, 256) if not exhaustive else (64, 128, 256, 512):
            for split in (1, 4) if not exhaustive else (1, 2, 4, 8):
                out.append({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": 4, "num_stages": 2})
    return out


def _run(cfg, *args):
    return run_moe_gemv(cfg, *args)


FAMILY = KernelFamily("gemv", "moe/gemv", _supports, gemv_configs, _run)
