"""CUDA-core GEMV for ``w4a8_gemm`` at decode M (candidates for M <= 8): int32 weight words, dp4a.

Same math and bits as ops/int8/common.py (the op's contract)::

    acc[m, n] = sum_k int32(xq[m, k]) * (u[n, k] - 8) * group_scale[n, k // 128]   exact int32
    out[m, n] = out_dtype( float32(acc) * x_scale[m] * w_scale[n] + float32(bias[n]) )

The tensor-core kernel spends ~6 (per-channel) to ~15-27 (group 128) SASS instructions per
weight byte at M <= 16 unpacking nibbles into int8 MMA operands; a decode GEMV is
issue-bound there (BENCHMARKS.md, int8_gemm). Here the packed bytes are never unpacked:

* The documented layout read as little-endian int32 words holds codes ``8w .. 8w + 7`` of
  word ``w``; byte b holds code ``8w + 2b`` (low nibble) and ``8w + 2b + 1`` (high nibble).
  ``lo = word & 0x0F0F0F0F`` has the four even codes as unsigned bytes, ``hi = word &
  0xF0F0F0F0`` the four odd codes times 16 (<= 240, still one unsigned byte).
* The activations of the word, two int32 words ``xa = x[8w .. 8w+3]``, ``xb = x[8w+4 ..]``,
  are byte-permuted once per column (shared by every weight row of the thread):
  ``xe = [xa.b0, xa.b2, xb.b0, xb.b2]`` (even k), ``xo = [xa.b1, xa.b3, xb.b1, xb.b3]``.
* ``dp4a(a, b, c) = c + sum_b ubyte(a)_b * sbyte(b)_b`` (one IDP4A on sm_61+), so per word
  ``t_lo = dp4a(lo, xe, t_lo)``, ``t_hi = dp4a(hi, xo, t_hi)``: two LOP3 + two IDP4A for eight
  codes (times the token count for the IDP4As). ``t_hi`` is 16x its dot product, so
  ``t_hi >> 4`` is exact.
* The codes are ``u``, the weights ``u - 8``: ``cx = -8 * sum x`` per column, by
  ``dp4a(0xF8F8F8F8, x, c)`` (signed bytes -8) over the activation words, once per column
  and token for all the thread's rows: it is where each row's ``t_lo`` starts. (A separate
  per-column running sum for per-channel, added once at the end, put 4 more shared-memory
  layout conversions and barriers in the loop: 6 against 2 at 4 rows x 32 columns,
  24-30 % slower there on the H200.)
* A tile covers 4 consecutive words (32 codes) of BLOCK_W columns per row (16-byte loads); a
  column lies in one group of 128 codes, so with group 128 each column's exact int32 partial
  is multiplied by its integer group scale (``acc += (t_lo + (t_hi >> 4)) * gs``, gs per
  row and column; a tile of more than 16 words spans several groups): grouped costs one IMAD
  per row and column more than per-channel, not one multiply per weight.

Every partial is an exact integer in int32: per tile lane |t_lo| <= 16 * 15 * 128 + 32 * 8 * 128
and |t_hi| <= 16 * 240 * 128; a per-channel lane sums ``(u - 8) * x`` over its codes, |.| <=
1024 * K, group 128 is bounded by the op's |acc| <= K * 2**14, all < 2**31 for K <= MAX_K.
Split-K adds exact int32 partials (atomics, any order) into a persistent zeroed workspace and
the last split re-zeroes it and runs the float epilogue, as the tensor-core kernel, so the
output is bit-identical to the reference.

``DP4A_ASM`` (GPU): ``dp4a`` and the byte permute as inline PTX (``dp4a.u32.s32``,
``prmt.b32``); the interpreter path spells the same functions in shifts and masks.
Needs K % (32 * BLOCK_W) == 0 per split (:func:`gemv_supported`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._autotune import split_k_choices
from .._launch import launch
from .._views import aligned_view
from .._zeroed_workspace import zeroed_int32
from ..jit_utils import split4
from ..kernel_family import KernelFamily, Problem
from .common import dp4a_s, finish_tokens

_HI_MASK = tl.constexpr(-252645136)  # 0xF0F0F0F0 as an int32
_MINUS_8 = tl.constexpr(-117901064)  # 0xF8F8F8F8: four signed bytes of -8
_BYTE3 = tl.constexpr(-16777216)  # 0xFF000000


# compile options of a launch where the config does not set them (``qfuse bench sass`` compiles with the same)
LAUNCH_OPTIONS = {"num_stages": 2, "enable_fp_fusion": False}


@triton.jit
def _dp4a_u(a, b, c, ASM: tl.constexpr):
    """``c + sum_i ubyte_i(a) * sbyte_i(b)`` (int32)."""
    if ASM:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1)
    else:
        for i in tl.static_range(4):
            c += ((a >> (8 * i)) & 0xFF) * ((b << (24 - 8 * i)) >> 24)
        return c


@triton.jit
def _even_odd_bytes(xa, xb, ASM: tl.constexpr):
    """``([xa.b0, xa.b2, xb.b0, xb.b2], [xa.b1, xa.b3, xb.b1, xb.b3])`` as int32 words."""
    if ASM:
        xe = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x6420;", "=r,r,r", [xa, xb], dtype=tl.int32, is_pure=True, pack=1)
        xo = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7531;", "=r,r,r", [xa, xb], dtype=tl.int32, is_pure=True, pack=1)
    else:
        xe = (xa & 0xFF) | ((xa >> 8) & 0xFF00) | ((xb << 16) & 0xFF0000) | ((xb << 8) & _BYTE3)
        xo = ((xa >> 8) & 0xFF) | ((xa >> 16) & 0xFF00) | ((xb << 8) & 0xFF0000) | (xb & _BYTE3)
    return xe, xo


@triton.jit
def _token_partial(lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, x_ptrs, ASM: tl.constexpr):
    """One token over the tile: ``sum_k (u - 8) * x[k]`` per row and column [BLOCK_N, BLOCK_W], exact int32."""
    xw = tl.load(x_ptrs, eviction_policy="evict_last")  # [BLOCK_W, 8] activation words of the column's 4 weight words
    xa, xb = tl.split(xw.reshape(xw.shape[0], 4, 2))  # [BLOCK_W, 4]: x[8w .. 8w+3], x[8w+4 .. 8w+7]
    xe, xo = _even_odd_bytes(xa, xb, ASM)
    xe0, xe1, xe2, xe3 = split4(xe)
    xo0, xo1, xo2, xo3 = split4(xo)
    minus8 = tl.full(xe0.shape, _MINUS_8, tl.int32)
    cx = dp4a_s(minus8, xe0, tl.zeros_like(xe0), ASM)  # -8 * sum x per column: shared by every row of the thread
    cx = dp4a_s(minus8, xe1, cx, ASM)
    cx = dp4a_s(minus8, xe2, cx, ASM)
    cx = dp4a_s(minus8, xe3, cx, ASM)
    cx = dp4a_s(minus8, xo0, cx, ASM)
    cx = dp4a_s(minus8, xo1, cx, ASM)
    cx = dp4a_s(minus8, xo2, cx, ASM)
    cx = dp4a_s(minus8, xo3, cx, ASM)
    t_lo = _dp4a_u(lo0, xe0[None, :], cx[None, :], ASM)  # the column's -8 * sum x starts every row's sum
    t_lo = _dp4a_u(lo1, xe1[None, :], t_lo, ASM)
    t_lo = _dp4a_u(lo2, xe2[None, :], t_lo, ASM)
    t_lo = _dp4a_u(lo3, xe3[None, :], t_lo, ASM)
    t_hi = _dp4a_u(hi0, xo0[None, :], tl.zeros_like(hi0), ASM)
    t_hi = _dp4a_u(hi1, xo1[None, :], t_hi, ASM)
    t_hi = _dp4a_u(hi2, xo2[None, :], t_hi, ASM)
    t_hi = _dp4a_u(hi3, xo3[None, :], t_hi, ASM)
    return t_lo + (t_hi >> 4)  # t_hi is 16x the odd-k dot product: the shift is exact


@triton.jit
def _accumulate(acc, x_ptrs, lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, gs, GROUPED: tl.constexpr, ASM: tl.constexpr):
    """Add one token's tile to its int32 lanes ``acc`` [BLOCK_N, BLOCK_W]."""
    part = _token_partial(lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, x_ptrs, ASM)
    if GROUPED:
        return acc + part * gs  # exact: a column lies in one group, gs an integer
    return acc + part


@triton.jit(do_not_specialize=["M"])
def _w4a8_gemv_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, gs_ptr, bias_ptr, out_ptr, acc_ws_ptr, count_ptr,
    M, N, KW4, W_PER_SPLIT, G,
    GROUPED: tl.constexpr, X_PER_TOKEN: tl.constexpr, W_PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, SPLIT: tl.constexpr,
    DP4A_ASM: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    # x_ptr / w_ptr: int32 words. KW4 = K // 32: row lengths are passed divided by 4 words so
    # that Triton sees 16-byte aligned rows and loads 4 words per thread (one LDG.128).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    split_k = tl.num_programs(1)
    tile = tl.program_id(2) * tl.num_programs(0) + pid_n
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)  # clamped rows keep the loads in bounds; stores are masked
    w_rows = w_ptr + rn.to(tl.int64)[:, None, None] * (KW4 * 4)
    offs_c = tl.arange(0, BLOCK_W)
    offs_j = tl.arange(0, 4)
    wcol = offs_c[:, None] * 4 + offs_j[None, :]  # [BLOCK_W, 4] word offsets in the tile
    xcol = 8 * offs_c[:, None] + tl.arange(0, 8)[None, :]  # [BLOCK_W, 8] activation words
    w_start = pid_k * W_PER_SPLIT
    x_row_words = KW4 * 8  # K // 4
    # tokens past M recompute token M - 1; their stores are masked
    x0 = x_ptr + tl.minimum(m0, M - 1).to(tl.int64) * x_row_words + 2 * w_start + xcol
    x1 = x_ptr + tl.minimum(m0 + 1, M - 1).to(tl.int64) * x_row_words + 2 * w_start + xcol
    x2 = x_ptr + tl.minimum(m0 + 2, M - 1).to(tl.int64) * x_row_words + 2 * w_start + xcol
    x3 = x_ptr + tl.minimum(m0 + 3, M - 1).to(tl.int64) * x_row_words + 2 * w_start + xcol
    w_ptrs = w_rows + (w_start + wcol)[None, :, :]

    acc0 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.int32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.int32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.int32)
    acc3 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.int32)
    gs = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.int32)
    # [BLOCK_N, BLOCK_W]: the scale of each row and 4-word column (a column lies in one group;
    # a tile of more than 16 words spans several), in the accumulator's layout: a [BLOCK_N]
    # load went through shared memory (STS + 2 BAR + LDS)
    gs_rows = gs_ptr + (rn.to(tl.int64) * G)[:, None] + offs_c[None, :] // 4
    n_tiles = W_PER_SPLIT // (4 * BLOCK_W)
    if PREFETCH:
        nxt = tl.load(w_ptrs, eviction_policy="evict_first")
    for it in range(0, n_tiles):
        if PREFETCH:
            # the next tile's load is issued before this tile's math (Triton does not pipeline
            # a loop without a dot): twice the weight bytes in flight per thread. The last
            # iteration reloads its own tile (in bounds, from L2) instead of a masked load,
            # which cost ~40 more instructions per loop (predicates, zero fill).
            words = nxt
            w_ptrs += tl.where(it + 1 < n_tiles, 4 * BLOCK_W, 0)
            nxt = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            words = tl.load(w_ptrs, eviction_policy="evict_first")  # [BLOCK_N, BLOCK_W, 4]
            w_ptrs += 4 * BLOCK_W
        if GROUPED:  # tiles start on a multiple of min(4 * BLOCK_W, 16) words: the groups add up
            gs = tl.load(gs_rows + (w_start + it * (4 * BLOCK_W)) // 16).to(tl.int32)
        lo0, lo1, lo2, lo3 = split4(words & 0x0F0F0F0F)  # even codes, unsigned bytes
        hi0, hi1, hi2, hi3 = split4(words & _HI_MASK)  # odd codes x 16, unsigned bytes
        acc0 = _accumulate(acc0, x0, lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, gs, GROUPED, DP4A_ASM)
        if BLOCK_M > 1:
            acc1 = _accumulate(acc1, x1, lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, gs, GROUPED, DP4A_ASM)
        if BLOCK_M > 2:
            acc2 = _accumulate(acc2, x2, lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, gs, GROUPED, DP4A_ASM)
            acc3 = _accumulate(acc3, x3, lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, gs, GROUPED, DP4A_ASM)
        x0 += 8 * BLOCK_W
        x1 += 8 * BLOCK_W
        x2 += 8 * BLOCK_W
        x3 += 8 * BLOCK_W

    finish_tokens(
        acc0,
        acc1,
        acc2,
        acc3,
        m0,
        xs_ptr,
        ws_ptr,
        bias_ptr,
        out_ptr,
        acc_ws_ptr,
        count_ptr + tile * BLOCK_M,
        offs_n,
        rn,
        M,
        N,
        split_k,
        BLOCK_M,
        SPLIT,
        X_PER_TOKEN,
        W_PER_CHANNEL,
        HAS_BIAS,
    )


# ---------------------------------------------------------------- launcher


def gemv_supported(k: int, group_size: int, cfg: dict) -> bool:
    """Whether config ``cfg`` can run K: whole tiles of 4 * BLOCK_W words in every split (a tile
    lies inside one group of 128 codes or spans whole groups: BLOCK_W is a power of two). Groups
    of 64 / 32 are not read by this kernel."""
    kw, tile = k // 8, 4 * cfg["BLOCK_W"]
    return group_size in (-1, 128) and k % 32 == 0 and kw % (tile * cfg["SPLIT_K"]) == 0


def run_w4a8_gemv(xq, x_scale, qweight, w_scale, group_scale, bias, out_dtype, *, config: dict):
    """Launch with ``config`` = {BLOCK_M (1, 2, 4), BLOCK_N, BLOCK_W, SPLIT_K, num_warps, DP4A_ASM, PREFETCH};
    arguments already checked by the op, and ``gemv_supported``. Returns [M, N]."""
    import torch

    m, k = xq.shape
    n = qweight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return out
    bm, bn, bw, split = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_W"], config["SPLIT_K"]
    group = -1 if group_scale is None else k // max(1, group_scale.shape[1])
    if bm not in (1, 2, 4) or not gemv_supported(k, group, config):
        raise ValueError(f"run_w4a8_gemv: config {config} cannot run K={k}")
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, bm))
    if split > 1:
        tiles = grid[0] * grid[2] * bm
        buf = zeroed_int32(xq.device, m * n + tiles)  # partial sums + arrival counters, left zeroed
        acc_ws, counts = buf[: m * n], buf[m * n :]
    else:
        acc_ws = counts = out  # never touched without split-K
    x_words = aligned_view(xq.contiguous(), torch.int32)  # [M, K // 4]
    w_words = aligned_view(qweight, torch.int32)  # [N, K // 8]
    launch(_w4a8_gemv_kernel, grid,
        x_words, x_scale.reshape(-1).contiguous(), w_words, w_scale,
        group_scale if group_scale is not None else w_scale, bias if bias is not None else w_scale,
        out, acc_ws, counts,
        m, n, k // 32, k // 8 // split, k // 128,
        GROUPED=group_scale is not None, X_PER_TOKEN=x_scale.dim() == 2, W_PER_CHANNEL=w_scale.numel() != 1,
        HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_W=bw, SPLIT=split > 1,
        DP4A_ASM=bool(config.get("DP4A_ASM", 0)), PREFETCH=bool(config.get("PREFETCH", 0)),
        num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", LAUNCH_OPTIONS["num_stages"]), enable_fp_fusion=LAUNCH_OPTIONS["enable_fp_fusion"],
    )  # fmt: skip
    return out


# (BLOCK_N, BLOCK_W, num_warps) per token tile. First, at 1 and 2 tokens, the tiles of one
# (row, column) lane per thread: 2-4 rows of 512-1024 bytes, 2-4 warps, N / 2 - N / 4 programs.
# So many small programs keep the most loads in flight (an SM holds 32 of them): on the H200 at
# M = 1, 2 x 32 / 2 warps took 28672x4096 from 24.3 to 17.6 us, 4096x14336 from 14.8 (the
# `mma_words` pick) to 9.7 with 2 x 64 / 4 warps (BENCHMARKS.md); a plain read
# of the same bytes with such tiles was the fastest there too (3.9 TB/s at 58.7 MB). Their loop
# costs more per byte (sm_90 SASS, triton 3.7.1: 4.4-4.6 instructions per weight byte at 2 x 32
# and 2 x 64, against 1.7-2.6 below), which a memory-bound GEMV has to spare.
# The rest, from the sm_90 SASS of the loop (instructions per weight byte, DP4A_ASM, triton
# 3.7.1): BLOCK_M = 1: 1.7-2.2 per-channel, 2.0-2.6 group 128; 2: 2.5-2.9 / 3.0-3.4; 4: 4.1-5.0
# / 4.7-5.6 (the tile kernel at M <= 16: 5.7-6.7 per-channel, 15-27 group 128, 6.5-8.4 with
# GS_PARTIAL). BLOCK_W >= 2 keeps a row's bytes per iteration at >= 32 (a whole sector).
_LANE_TILES = ((2, 32, 2), (2, 64, 4), (4, 32, 4), (4, 16, 2), (1, 64, 2))
_SHAPES = {
    1: _LANE_TILES + ((256, 4, 4), (128, 8, 4), (256, 2, 4), (512, 2, 8), (128, 4, 4), (64, 16, 4), (128, 16, 8), (32, 32, 4), (64, 32, 8)),
    2: _LANE_TILES + ((256, 4, 4), (128, 8, 4), (256, 2, 4), (512, 2, 8), (64, 16, 4)),
    4: ((256, 4, 4), (128, 8, 4), (256, 2, 4), (512, 2, 8)),
}  # (64, 16, 4) at 4 tokens: 255 registers


def gemv_configs(m: int, n: int, k: int, group_size: int, sms: int, asm: bool) -> list[dict]:
    """GEMV candidates for M <= 8 (token tiles of 1, 2 or 4), each with the split-K factors of
    :func:`split_k_choices` (1 to ~16 programs per SM; >= 2 tiles per split). At M <= 2 the
    first is the heuristic pick (what runs untuned): the first lane tile K takes."""
    if m > 8:
        return []
    bm = 1 if m == 1 else 2 if m == 2 else 4
    out = []
    for bn, bw, warps in _SHAPES[bm]:
        cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": 1, "num_warps": warps, "num_stages": 2, "DP4A_ASM": int(asm)}
        if not gemv_supported(k, group_size, cfg):
            continue
        programs = triton.cdiv(n, bn) * triton.cdiv(m, bm)
        out += [dict(cfg, SPLIT_K=s) for s in split_k_choices(k // 8 // (4 * bw), programs, sms)]
    return out + [dict(c, PREFETCH=1) for c in out]


def _supports(p: Problem) -> tuple[bool, str]:
    if p.bits != 4:
        return False, "W4A8 only"
    if not p.gpu:
        return False, "needs a GPU (dp4a / prmt inline PTX)"
    if p.m > 8:
        return False, "M > 8"
    if p.group_size not in (-1, 128):
        return False, "reads groups of 128 or per channel only"
    return True, ""


def _run(cfg, xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4):
    return run_w4a8_gemv(xq, x_scale, w, w_scale, group_scale, bias, out_dtype, config=cfg)


FAMILY = KernelFamily("gemv", "int8/gemv", _supports, lambda p, exhaustive: gemv_configs(p.m, p.n, p.k, p.group_size, p.sms, asm=True), _run)
