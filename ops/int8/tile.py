"""The tile kernel of the int8-activation GEMMs ``w8a8_gemm`` and ``w4a8_gemm`` (family ``tile``).

One kernel, specialised by constexprs, computes (the math of ops/w8a8_gemm.py and
ops/w4a8_gemm.py)::

    acc[m, n] = sum_k int32(xq[m, k]) * w_int[n, k]                       exact int32
    out[m, n] = out_dtype( float32(acc) * x_scale[m] * w_scale[n] + float32(bias[n]) )

with ``w_int = wq`` (W8A8) or ``w_int = (u - 8) * group_scale[n, k // G]`` (W4A8, G = 128,
64 or 32; group_scale = 1 per-channel), a value in [-128, 112] that fits int8 exactly, so the
main loop is one int8 x int8 -> int32 ``tl.dot`` per tile in both cases.

Design (why, with the numbers behind it in BENCHMARKS.md):

* **Weight-major tiles** (Machete's "swap A and B"): a program computes
  ``acc^T[BLOCK_N, BLOCK_M] = w_int[BLOCK_N, BLOCK_K] @ xq^T[BLOCK_K, BLOCK_M]``.
  The weight, the big operand, is the MMA's M side (64/128 rows, what Hopper's
  wgmma wants) and the few decode tokens are its N side (16 is legal), so decode does
  not pad M to 64; for W4A8 the dequantized weight tile comes from registers.
* **int4 unpack in registers**: a tile of packed bytes ``[BLOCK_N, BLOCK_K // 2]`` is
  loaded contiguously (16-byte vectors), ``s = int8(p ^ 0x88)`` turns both nibbles into
  two's-complement ``u - 8``, ``lo = (s << 4) >> 4`` and ``hi = s >> 4`` sign-extend them,
  and ``join + reshape`` interleaves them back to ``k = 2j, 2j + 1``. With groups the
  tile's K range lies in one group (BLOCK_K divides the group), so the second-level scale is a
  ``[BLOCK_N]`` int8 vector: ``w_int = q * gs`` is exact in int8 (|q * gs| <= 128).
  On the GPU (``UNPACK_ASM``, a tuned candidate) the unpack is inline PTX on four codes
  per 32-bit register, about half the instructions of the int8 ops (which stay as the
  interpreter's path). Measured alternative, not kept: two dots over the nibble planes
  (``lo @ xq[even k]^T + hi @ xq[odd k]^T``) was 2-9% slower at M = 1 and 18-52% slower
  at M = 4096 on the H200 (BENCHMARKS.md, int8_gemm).
* **Split-K** (SPLIT_K > 1 in the config, for decode shapes with too few output tiles for 132 SMs):
  each split adds its exact int32 partial into a zeroed int32 workspace with
  ``atomic_add``; the program that bumps the tile's counter last reads the complete
  int32 sum, zeroes the sums and the counter again (the workspace is persistent,
  ``zeroed_int32``: no memset per call) and runs the float epilogue. Integer addition is associative, so the
  result is bit-identical to SPLIT_K = 1 whatever order the splits land in.
  |acc| <= K * 2**14 holds for every partial and for the sum, so int32 is exact for
  K <= 131071 (the ops' MAX_K); at K = 131072, all-(-128) x all-(-128) gives 2**31, one past int32.
* **Group scale as an int32 partial** (``GS_PARTIAL``, a W4A8 group candidate): the
  tile's dot of the unscaled codes ``(u - 8) @ xq^T`` times its ``[BLOCK_N]`` group scale,
  added to the accumulator (exact: integer, |partial * gs| <= 2**14 * 128 * 16), instead of
  the int8 multiply ``q * gs`` per weight element. sm_90 SASS of the decode loop, instructions
  per weight byte (triton 3.7.1, PTX unpack): 16x128x128 15.4 -> 6.5, 16x64x128 17.0 -> 7.5,
  16x32x128 27.1 -> 8.4 (per-channel 5.7-6.7); at 256x128x128 the [BLOCK_N, BLOCK_M] partial
  spills (352 B of stack), so large M keeps the per-element product.
* The other kernels of the op family (ops/int8/dispatch.py) are the dp4a GEMV (``gemv``, W4A8
  M <= 8), the packed bytes as the int8 wgmma's register operand (``mma_words``, W4A8 M <= 64),
  the TMA-fed kernel (``tma``), the int4 -> int8 weight pass followed by this kernel or the TMA
  one in their W8A8 form (``w8``, W4A8 M > 64) and the W8A8 dp4a GEMV (``gemv8``, opt-in).
* **Epilogue order**: ``(acc * x_scale) * w_scale + bias`` in float32, as the
  reference; the launcher passes ``enable_fp_fusion=False`` so no FMA contracts the
  last two steps, which makes the output bit-identical to the reference (the GPU
  tests assert equality).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._launch import launch
from .._zeroed_workspace import zeroed_int32
from ..kernel_family import KernelFamily, Problem
from .common import finish_tile, tile_of, unpack_w4


@triton.jit(do_not_specialize=["M"])  # M = 1 would otherwise compile its own copy of every config
def _int8_gemm_kernel(
    x_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    gs_ptr,
    bias_ptr,
    out_ptr,
    acc_ws_ptr,
    count_ptr,
    M,
    N,
    K,
    K_HALF,
    W4: tl.constexpr,
    GROUPED: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    UNPACK_ASM: tl.constexpr,
    GS_PARTIAL: tl.constexpr,
    X_PER_TOKEN: tl.constexpr,
    W_PER_CHANNEL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    GROUP_N: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # SPLIT (constexpr) says whether K is split; how many ways is the grid's second axis,
    # so split counts share one compiled kernel.
    # ---- tile order: GROUP_N weight-row tiles x all token tiles run together (L2 reuse)
    pid_k = tl.program_id(1)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_n, pid_m = tile_of(tl.program_id(0), num_pid_n, tl.cdiv(M, BLOCK_M), GROUP_N)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    rows_n = tl.where(mask_n, offs_n, 0)  # clamped row indices keep unmasked loads in bounds
    rows_m = tl.where(mask_m, offs_m, 0)

    # ---- this split's range of K tiles
    k_tiles = tl.cdiv(K, BLOCK_K)
    split_k = tl.num_programs(1)
    tiles_per_split = tl.cdiv(k_tiles, split_k)
    k_begin = pid_k * tiles_per_split * BLOCK_K
    k_end = tl.minimum(k_begin + tiles_per_split * BLOCK_K, K)

    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows_m[None, :].to(tl.int64) * K + (k_begin + offs_k)[:, None]  # xq^T tile [BK, BM]
    if W4:
        offs_kp = tl.arange(0, BLOCK_K // 2)
        # ``K_HALF`` is its own argument (not ``K // 2``) and the K offset is a product of
        # BLOCK_K // 2, so Triton sees 16-byte aligned rows and contiguous bytes and issues
        # vector loads (``k_begin // 2`` here compiled to one ld.global.b8 per byte)
        k_off = pid_k * tiles_per_split * (BLOCK_K // 2) + offs_kp
        w_ptrs = w_ptr + rows_n[:, None].to(tl.int64) * K_HALF + k_off[None, :]
    else:
        w_ptrs = w_ptr + rows_n[:, None].to(tl.int64) * K + (k_begin + offs_k)[None, :]
    if GROUPED:
        gs_rows = gs_ptr + rows_n.to(tl.int64) * (K // GROUP_SIZE)

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        if EVEN_K:
            xt = tl.load(x_ptrs)
        else:
            xt = tl.load(x_ptrs, mask=(k0 + offs_k)[:, None] < K, other=0)
        if W4:
            if EVEN_K:
                p = tl.load(w_ptrs)
            else:
                p = tl.load(w_ptrs, mask=(k0 // 2 + offs_kp)[None, :] < K_HALF, other=0)
            w = unpack_w4(p, 1, UNPACK_ASM, False)  # not the folded group-scale PTX: see unpack_w4
            if GROUPED and not GS_PARTIAL:  # BLOCK_K divides the group, so the whole tile lies in one group
                w = w * tl.load(gs_rows + k0 // GROUP_SIZE)[:, None]  # |q * gs| <= 8 * 16 = 128: exact in int8
            w_ptrs += BLOCK_K // 2
        else:
            if EVEN_K:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=(k0 + offs_k)[None, :] < K, other=0)
            w_ptrs += BLOCK_K
        if GROUPED and GS_PARTIAL and W4:
            # the tile's exact int32 partial times its integer group scale: BLOCK_N x BLOCK_M
            # multiplies per tile instead of BLOCK_N x BLOCK_K int8 ones; |partial| <= 2**14 * 64
            # ... and the sum is the same integer as with w_int = q * gs (associativity)
            part = tl.dot(w, xt, out_dtype=tl.int32)
            acc += part * tl.load(gs_rows + k0 // GROUP_SIZE).to(tl.int32)[:, None]
        else:
            acc = tl.dot(w, xt, acc, out_dtype=tl.int32)
        x_ptrs += BLOCK_K

    mask = mask_n[:, None] & mask_m[None, :]
    finish_tile(
        acc,
        xs_ptr,
        ws_ptr,
        bias_ptr,
        out_ptr,
        acc_ws_ptr,
        count_ptr,
        pid_m * num_pid_n + pid_n,
        offs_m,
        offs_n,
        rows_m,
        rows_n,
        mask,
        N,
        split_k,
        SPLIT,
        X_PER_TOKEN,
        W_PER_CHANNEL,
        HAS_BIAS,
    )


# ---------------------------------------------------------------- configs and launcher


def tile_config(bm, bn, bk, split_k=1, warps=4, stages=4, group_n=8, unpack_asm=0, gs_partial=0):
    cfg = {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "SPLIT_K": split_k,
        "GROUP_N": group_n,
        "num_warps": warps,
        "num_stages": stages,
        "UNPACK_ASM": unpack_asm,
    }
    return dict(cfg, GS_PARTIAL=1) if gs_partial else cfg


def _split_for(m, n, k, bm, bn, bk, sms):
    """Smallest power-of-two split giving >= 2 programs per SM, keeping >= 4 K tiles per split."""
    tiles = -(-m // bm) * -(-n // bn)
    split = 1
    while tiles * split < 2 * sms and k // (bk * split * 2) >= 4 and split < 16:
        split *= 2
    return split


def tile_configs(m: int, n: int, k: int, group_size: int, sms: int) -> list[dict]:
    """Configs to try for one problem, heuristic choice first (used when tuning is off).

    Token tile BLOCK_M by M; weight tile BLOCK_N x BLOCK_K sized for wgmma (64/128 rows);
    BLOCK_K <= the group (128, 64 or 32) so one tile reads one group's scales. The split count
    is a launch-grid size, not a compile-time constant, so split variants cost no compile.
    """
    if group_size not in (-1, 128):  # groups of 64 / 32 (layers whose K 128 does not divide): the same tiles, shallower
        deeper = tile_configs(m, n, k, 128, sms)
        return list({str(c): c for c in (dict(c, BLOCK_K=min(c["BLOCK_K"], group_size)) for c in deeper)}.values())
    kmax = 128 if group_size == 128 else 256
    if m <= 16:
        out = []
        for bm, bn, bk, w, s in ((16, 64, kmax, 4, 6), (16, 32, kmax, 4, 6), (16, 128, kmax, 4, 4)):
            base = _split_for(m, n, k, bm, bn, bk, sms)
            for sk in dict.fromkeys((base, max(1, base // 2), 1)):
                out.append(tile_config(bm, bn, bk, sk, w, s))
        return list({str(c): c for c in out}.values())
    if m <= 64:
        bm = 32 if m <= 32 else 64
        return [
            tile_config(bm, 128, 128, _split_for(m, n, k, bm, 128, 128, sms), 4, 4),
            tile_config(bm, 64, kmax, _split_for(m, n, k, bm, 64, kmax, sms), 4, 5),
            tile_config(bm, 128, 128, 1, 4, 4),
        ]
    if m <= 512:
        return [tile_config(64, 128, 128, 1, 4, 4), tile_config(128, 128, 128, 1, 8, 4), tile_config(128, 128, 128, 1, 4, 3)]
    # the rest: the TMA kernel's sync-wgmma remedies (tma_configs) for this kernel too
    out = [
        tile_config(256, 128, 128, 1, 8, 3),
        tile_config(128, 128, 128, 1, 8, 4),
        tile_config(128, 256, 128, 1, 8, 3),
        tile_config(128, 128, 128, 1, 4, 3),
        tile_config(256, 128, kmax, 1, 8, 2),
        tile_config(128, 256, kmax, 1, 8, 2),
        tile_config(64, 128, 128, 1, 4, 4),
        tile_config(64, 128, 128, 1, 4, 3),
        tile_config(128, 64, 128, 1, 4, 3),
    ]
    return list({str(c): c for c in out}.values())


def run_int8_tile(xq, x_scale, w, w_scale, group_scale, bias, out_dtype, *, w4: bool, config: dict):
    """Launch the tile kernel with ``config``; arguments already checked by the op. Returns [M, N]."""
    import torch

    m, k = xq.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        raise ValueError("run_int8_tile: K must be positive (the ops send K == 0 to their reference)")
    cfg = {key: v for key, v in config.items() if key != "kernel"}
    bm, bn, bk, split = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K"), cfg.pop("SPLIT_K")
    group_n, warps, stages = cfg.pop("GROUP_N"), cfg.pop("num_warps"), cfg.pop("num_stages")
    unpack_asm = bool(cfg.pop("UNPACK_ASM", 0)) and w4
    gs_partial = bool(cfg.pop("GS_PARTIAL", 0))
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if split > 1:
        buf = zeroed_int32(xq.device, m * n + tiles)  # partial sums + arrival counters, left zeroed
        acc_ws, counts = buf[: m * n], buf[m * n :]
    else:
        acc_ws = counts = out  # never touched when SPLIT_K == 1
    xq = xq.contiguous()
    xs = x_scale.reshape(-1).contiguous()
    launch(_int8_gemm_kernel, (tiles, split),
        xq,
        xs,
        w,
        w_scale,
        group_scale if group_scale is not None else w_scale,
        bias if bias is not None else w_scale,
        out,
        acc_ws,
        counts,
        m,
        n,
        k,
        k // 2,
        W4=w4,
        GROUPED=group_scale is not None,
        GROUP_SIZE=k // group_scale.shape[1] if group_scale is not None else 1,
        UNPACK_ASM=unpack_asm,
        GS_PARTIAL=gs_partial,
        X_PER_TOKEN=x_scale.dim() == 2,  # [M, 1] per-token, [1] per-tensor
        W_PER_CHANNEL=w_scale.numel() != 1,  # [N] per-channel (N == 1 reads the same value)
        HAS_BIAS=bias is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        SPLIT=split > 1,
        GROUP_N=group_n,
        EVEN_K=k % bk == 0,
        num_warps=warps,
        num_stages=stages,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out


def _family_configs(p: Problem, exhaustive: bool) -> list[dict]:
    """The tile configs; for W4A8 on a GPU each also with the inline-PTX nibble unpack (which the
    Triton interpreter cannot run) and, with groups at M <= 64, with the int32-partial group scale."""
    base = tile_configs(p.m, p.n, p.k, p.group_size, p.sms)
    if p.bits != 4 or not p.gpu:
        return base
    asm = [dict(c, UNPACK_ASM=1) for c in base]
    return base + asm + [dict(c, GS_PARTIAL=1) for c in asm if p.group_size != -1 and p.m <= 64]


def _run(cfg, xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4):
    return run_int8_tile(xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4=w4, config=cfg)


FAMILY = KernelFamily("tile", "int8/tile", lambda p: (True, ""), _family_configs, _run)
