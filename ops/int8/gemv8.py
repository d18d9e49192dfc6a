"""CUDA-core GEMV for ``w8a8_gemm`` at decode M (1..8): int32 words of four int8 codes, dp4a.

Same math and bits as ops/int8/common.py (the op's contract)::

    acc[m, n] = sum_k int32(xq[m, k]) * int32(wq[n, k])                      exact int32
    out[m, n] = out_dtype( float32(acc) * x_scale[m] * w_scale[n] + float32(bias[n]) )

A weight word and the activation word at the same index hold the same four k, so per word the
whole inner product is one ``dp4a.s32.s32`` (IDP.4A) into the lane's int32 accumulator, with no
unpack and no permute. Tiles, token tiles, split-K (exact int32 atomics, last split runs the
epilogue) and the epilogue are those of ops/int8/gemv.py. |acc| <= K * 2**14 < 2**31 for
K <= MAX_K. Why a second decode kernel for W8A8: the tensor-core tile kernel's decode loop is
not issue-bound (0.55-1.08 SASS instructions per weight byte) but read 28672x4096 at M = 1 at
~3.1 TB/s against cuBLAS bf16's ~4.1 TB/s (BENCHMARKS.md, int8_gemm); whether a plain
streaming GEMV reads faster is for the H200 to say (candidates, ``KERNEL="gemv8"``).
Needs K % (16 * BLOCK_W * SPLIT_K) == 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._launch import launch
from .._views import aligned_view
from .._zeroed_workspace import zeroed_int32
from ..jit_utils import split4
from ..kernel_family import KernelFamily, Problem
from .common import dp4a_s, finish_tokens

# compile options of a launch where the config does not set them (``qfuse bench sass`` compiles with the same)
LAUNCH_OPTIONS = {"num_stages": 2, "enable_fp_fusion": False}


@triton.jit
def _token_dot(w0, w1, w2, w3, x_ptrs, acc, ASM: tl.constexpr):
    xw = tl.load(x_ptrs, eviction_policy="evict_last")  # [BLOCK_W, 4] activation words
    x0, x1, x2, x3 = split4(xw)
    acc = dp4a_s(w0, x0[None, :], acc, ASM)
    acc = dp4a_s(w1, x1[None, :], acc, ASM)
    acc = dp4a_s(w2, x2[None, :], acc, ASM)
    return dp4a_s(w3, x3[None, :], acc, ASM)


@triton.jit(do_not_specialize=["M"])
def _w8a8_gemv_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, acc_ws_ptr, count_ptr,
    M, N, KW4, W_PER_SPLIT,
    X_PER_TOKEN: tl.constexpr, W_PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, SPLIT: tl.constexpr,
    DP4A_ASM: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    # x_ptr / w_ptr: int32 words, rows of K // 4 = 4 * KW4 words (KW4 = K // 16: Triton then
    # sees 16-byte aligned rows and loads 4 words per thread)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    split_k = tl.num_programs(1)
    tile = tl.program_id(2) * tl.num_programs(0) + pid_n
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)  # clamped rows keep the loads in bounds; stores are masked
    wcol = tl.arange(0, BLOCK_W)[:, None] * 4 + tl.arange(0, 4)[None, :]  # [BLOCK_W, 4]
    w_start = pid_k * W_PER_SPLIT
    row_words = KW4 * 4
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None, None] * row_words + (w_start + wcol)[None, :, :]
    # tokens past M recompute token M - 1; their stores are masked
    x0 = x_ptr + tl.minimum(m0, M - 1).to(tl.int64) * row_words + w_start + wcol
    x1 = x_ptr + tl.minimum(m0 + 1, M - 1).to(tl.int64) * row_words + w_start + wcol
    x2 = x_ptr + tl.minimum(m0 + 2, M - 1).to(tl.int64) * row_words + w_start + wcol
    x3 = x_ptr + tl.minimum(m0 + 3, M - 1).to(tl.int64) * row_words + w_start + wcol
    acc0 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.int32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.int32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.int32)
    acc3 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.int32)
    n_tiles = W_PER_SPLIT // (4 * BLOCK_W)
    if PREFETCH:
        nxt = tl.load(w_ptrs, eviction_policy="evict_first")
    for it in range(0, n_tiles):
        if PREFETCH:  # as ops/int8/gemv.py: the last iteration reloads its own tile
            words = nxt
            w_ptrs += tl.where(it + 1 < n_tiles, 4 * BLOCK_W, 0)
            nxt = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            words = tl.load(w_ptrs, eviction_policy="evict_first")  # [BLOCK_N, BLOCK_W, 4]
            w_ptrs += 4 * BLOCK_W
        w0, w1, w2, w3 = split4(words)
        acc0 = _token_dot(w0, w1, w2, w3, x0, acc0, DP4A_ASM)
        if BLOCK_M > 1:
            acc1 = _token_dot(w0, w1, w2, w3, x1, acc1, DP4A_ASM)
        if BLOCK_M > 2:
            acc2 = _token_dot(w0, w1, w2, w3, x2, acc2, DP4A_ASM)
            acc3 = _token_dot(w0, w1, w2, w3, x3, acc3, DP4A_ASM)
        x0 += 4 * BLOCK_W
        x1 += 4 * BLOCK_W
        x2 += 4 * BLOCK_W
        x3 += 4 * BLOCK_W

    finish_tokens(acc0, acc1, acc2, acc3, m0, xs_ptr, ws_ptr, bias_ptr, out_ptr, acc_ws_ptr, count_ptr + tile * BLOCK_M, offs_n, rn,
                  M, N, split_k, BLOCK_M, SPLIT, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS)  # fmt: skip


def gemv8_supported(k: int, cfg: dict) -> bool:
    """Whether ``cfg`` tiles K: whole [4 * BLOCK_W]-word tiles in every split."""
    return k % 16 == 0 and (k // 4) % (4 * cfg["BLOCK_W"] * cfg["SPLIT_K"]) == 0


def run_w8a8_gemv(xq, x_scale, wq, w_scale, bias, out_dtype, *, config: dict):
    """Launch with ``config`` = {BLOCK_M (1, 2, 4), BLOCK_N, BLOCK_W, SPLIT_K, num_warps, DP4A_ASM,
    PREFETCH}; arguments already checked by the op. Returns [M, N]."""
    import torch

    m, k = xq.shape
    n = wq.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return out
    bm, bn, bw, split = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_W"], config["SPLIT_K"]
    if bm not in (1, 2, 4) or not gemv8_supported(k, config):
        raise ValueError(f"run_w8a8_gemv: config {config} cannot run K={k}")
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, bm))
    if split > 1:
        buf = zeroed_int32(xq.device, m * n + grid[0] * grid[2] * bm)  # partials + counters, left zeroed
        acc_ws, counts = buf[: m * n], buf[m * n :]
    else:
        acc_ws = counts = out  # never touched without split-K
    launch(_w8a8_gemv_kernel, grid,
        aligned_view(xq.contiguous(), torch.int32), x_scale.reshape(-1).contiguous(), aligned_view(wq, torch.int32), w_scale,
        bias if bias is not None else w_scale, out, acc_ws, counts,
        m, n, k // 16, k // 4 // split,
        X_PER_TOKEN=x_scale.dim() == 2, W_PER_CHANNEL=w_scale.numel() != 1, HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_W=bw, SPLIT=split > 1,
        DP4A_ASM=bool(config.get("DP4A_ASM", 0)), PREFETCH=bool(config.get("PREFETCH", 0)),
        num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", LAUNCH_OPTIONS["num_stages"]), enable_fp_fusion=LAUNCH_OPTIONS["enable_fp_fusion"],
    )  # fmt: skip
    return out


# (BLOCK_N, BLOCK_W, num_warps): 0.45-0.5 SASS instructions per weight byte at M = 1, 0.86 at 2,
# 1.4-1.6 at 4 (sm_90, triton 3.7.1); BLOCK_W = 8 / 16 / 32 reads 128 / 256 / 512 B of a row per
# iteration (longer row runs made the W4A16 and W4A8 GEMVs faster on the H200)
_SHAPES = {
    1: ((256, 4, 4), (128, 8, 4), (256, 2, 4), (512, 2, 8), (64, 16, 4), (32, 32, 4), (128, 16, 8)),
    2: ((256, 4, 4), (128, 8, 4), (256, 2, 4), (64, 16, 4)),
    4: ((256, 4, 4), (128, 8, 4), (256, 2, 4), (64, 16, 4)),
}


def gemv8_configs(m: int, n: int, k: int, sms: int, asm: bool) -> list[dict]:
    """GEMV candidates for M <= 8, split-K up to >= 2 programs per SM, with and without PREFETCH."""
    if m > 8:
        return []
    bm = 1 if m == 1 else 2 if m == 2 else 4
    out = []
    for bn, bw, warps in _SHAPES[bm]:
        cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": 1, "num_warps": warps, "num_stages": 2, "DP4A_ASM": int(asm)}
        if not gemv8_supported(k, cfg):
            continue
        programs = triton.cdiv(n, bn) * triton.cdiv(m, bm)
        split = 1
        while programs * split < 2 * sms and gemv8_supported(k, dict(cfg, SPLIT_K=2 * split)) and k // 4 // (2 * split) >= 16 * bw and split < 16:
            split *= 2
        out += [dict(cfg, SPLIT_K=s) for s in dict.fromkeys((split, max(1, split // 2)))]
    return out + [dict(c, PREFETCH=1) for c in out]


def _supports(p: Problem) -> tuple[bool, str]:
    if p.bits != 8:
        return False, "W8A8 only"
    if not p.gpu:
        return False, "needs a GPU (dp4a inline PTX)"
    if p.m > 8:
        return False, "M > 8"
    return True, ""


def _run(cfg, xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4):
    return run_w8a8_gemv(xq, x_scale, w, w_scale, bias, out_dtype, config=cfg)


FAMILY = KernelFamily(
    "gemv8",
    "int8/gemv8",
    _supports,
    lambda p, exhaustive: gemv8_configs(p.m, p.n, p.k, p.sms, asm=True),
    _run,
    default=False,
    why_opt_in="W8A8 dp4a GEMV: right on the H200 grid but slower than the tile kernel at every "
    "measured point (M = 1: 10.8-50.6 us against 9.0-36.3); a candidate for GPUs without wgmma",
)
