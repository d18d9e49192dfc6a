"""Decode-M tensor-core kernel for ``w4a8_gemm``: the natural int4 packing straight into the int8
MMA's register A operand, the activations permuted to the packing's code order.

Same math and bits as ops/int8/common.py (the op's contract)::

    acc[m, n] = sum_k int32(xq[m, k]) * (u[n, k] - 8) * group_scale[n, k // 128]   exact int32
    out[m, n] = out_dtype( float32(acc) * x_scale[m] * w_scale[n] + float32(bias[n]) )

The A operand of an 8-bit ``m16n8k32`` / wgmma tile gives lane ``l`` (``c = l % 4``) of each
row the k runs ``4c .. 4c + 3`` and ``16 + 4c .. 16 + 4c + 3`` of every 32-deep step: one
32-bit register each. Four bytes of the natural packing (ops/int4_packing.py) hold eight codes,
byte ``b`` the codes ``2b`` (low nibble) and ``2b + 1`` (high); masking the low nibbles of a
32-bit register gives four codes as four bytes, shifting first the other four. So the kernel
gives the MMA the codes in the order the bytes hold them: per 128-code tile of a row, byte
``16c + 4q + b`` (c, q, b in 0..3), i.e. natural ``k = 32c + 8q + 2b + h`` (h the nibble),
goes to::

    k' = 32q + 16h + 4c + b            (a permutation of 0..127)

which puts a lane's 16 bytes of a row (one 16-byte load) exactly in its A registers of the
tile's four 32-deep steps, low nibbles in the first register of each step, high in the second.
The sum over k does not depend on the order, so the activation tile is permuted the same way
in registers (``reshape`` + ``permute``) on its way to the MMA's shared-memory B operand.

Per 32-bit register of packed bytes (``ASM``, inline PTX; the interpreter spells the same in
int8 ops)::

    lo = ((p & 0x0F0F0F0F) + 0x78787878) ^ 0x80808080          = four (u - 8), two's complement
    hi = (((p >> 4) & 0x0F0F0F0F) + 0x78787878) ^ 0x80808080

``u + 0x78 <= 0x87`` never carries into the next byte. Then, per 128-code tile::

    acc[n, m] += sum_k' (u - 8)[n, k'] * x[m, k']                         per-channel
    acc[n, m] += (sum_k' (u - 8)[n, k'] * x[m, k']) * group_scale[n, g]   group 128 (one group a tile)
    acc[n, m] += sum_k' w_int[n, k'] * x[m, k']                            group 128, GS_FOLD

(``w_int = (u - 8) * group_scale``, exact in int8), all exact int32 (|acc| <= K * 2**14, the
op's bound). One program: a ``[BLOCK_N, BLOCK_M]`` tile of ``out^T`` (weight rows on the MMA's
64-row M side, the few tokens on its N side) over a ``1 / SPLIT_K`` slice of K; split-K adds
exact int32 partials into the persistent zeroed workspace and the last split runs the float
epilogue (ops/int8/common.py), so the output is bit-identical to the reference. The
opt-in stream-K form (``STREAM``) splits the (tile, K tile) units evenly over the grid instead.
Needs K % 128 == 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._autotune import m_bucket, sm_count, split_k_choices
from .._launch import launch
from .._zeroed_workspace import zeroed_int32
from ..kernel_family import KernelFamily, Problem
from .common import finish_tile, nibbles_minus_8, scaled_nibbles, tile_of

# compile options of a launch where the config does not set them (``qfuse bench sass`` compiles with the same)
LAUNCH_OPTIONS = {"num_stages": 4, "enable_fp_fusion": False}


@triton.jit
def _codes_minus_8(p, HIGH: tl.constexpr, ASM: tl.constexpr):
    """``int8(nibble - 8)`` of every byte of uint8 ``p``: its low nibble, or with HIGH its high one.
    ASM: ops/int8/common.py's PTX, four bytes per 32-bit register (3-4 instructions)."""
    if ASM:
        return nibbles_minus_8(p, 4 if HIGH else 0)
    else:
        s = (p ^ 0x88).to(tl.int8, bitcast=True)  # each nibble now holds u - 8 in two's complement
        if HIGH:
            return s >> 4
        else:
            return (s << 4) >> 4


@triton.jit
def _scaled_codes_minus_8(p, g, c, HIGH: tl.constexpr, ASM: tl.constexpr):
    """``int8((nibble - 8) * g)`` of every byte of uint8 ``p``; ``g`` the integer group scale in
    [1, 16] of the byte's row (int32, broadcast), ``c = (128 - 8 g) * 0x01010101``. ASM:
    ops/int8/common.py's multiply-add PTX (one instruction more than the unscaled unpack),
    which takes the first of a register's four ``g`` for all four bytes: right here because a
    register's four bytes lie in one row (a lane's 16 bytes of a row; the GPU tests check every
    config bit for bit)."""
    if ASM:
        return scaled_nibbles(p, g, c, 4 if HIGH else 0)
    else:
        return (_codes_minus_8(p, HIGH, False).to(tl.int32) * g).to(tl.int8)  # |(u - 8) g| <= 128: exact


@triton.jit
def _tile_rows(pid_n, pid_m, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Weight rows and tokens of tile (pid_n, pid_m): offsets, in-bounds masks, and the rows
    clamped into bounds (the loads stay unmasked; the stores are masked)."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    return offs_n, offs_m, mask_n, mask_m, tl.where(mask_n, offs_n, 0), tl.where(mask_m, offs_m, 0)


@triton.jit
def _tile_dot(
    x_ptr,
    w_ptr,
    gs_ptr,
    rows_m,
    rows_n,
    K,
    KB,
    G,
    b_start,
    n_tiles,
    GROUPED: tl.constexpr,
    GS_FOLD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ASM: tl.constexpr,
):
    """Exact int32 ``acc^T[BLOCK_N, BLOCK_M]`` over ``n_tiles`` 128-code tiles of K from packed byte
    ``b_start`` of each row (``K // 2`` bytes a row)."""
    BLOCK_K: tl.constexpr = 128
    # KB (= K // 2) and b_start are multiples of 64 on every supported shape: 16-byte loads
    w_ptrs = w_ptr + rows_n.to(tl.int64)[:, None] * KB + (b_start + tl.arange(0, BLOCK_K // 2))[None, :]
    x_ptrs = x_ptr + rows_m.to(tl.int64)[:, None] * K + (2 * b_start + tl.arange(0, BLOCK_K))[None, :]
    if GROUPED:
        gs_rows = gs_ptr + rows_n.to(tl.int64) * G + b_start // 64
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    for it in range(0, n_tiles):
        p = tl.load(w_ptrs, eviction_policy="evict_first")  # [BLOCK_N, 64]: byte 16c + 4q + b of the tile
        p = tl.reshape(p, (BLOCK_N, 4, 4, 4))  # [n, c, q, b]
        if GROUPED and GS_FOLD:  # the tile is one group: its scale into the int8 operand
            g = tl.load(gs_rows + it).to(tl.int32)[:, None, None, None]
            c = (128 - 8 * g) * 0x01010101
            a = tl.join(_scaled_codes_minus_8(p, g, c, False, ASM), _scaled_codes_minus_8(p, g, c, True, ASM))
        else:
            a = tl.join(_codes_minus_8(p, False, ASM), _codes_minus_8(p, True, ASM))  # [n, c, q, b, h]
        a = tl.reshape(tl.permute(a, (0, 2, 4, 1, 3)), (BLOCK_N, BLOCK_K))  # [n, q, h, c, b] = k' order
        xt = tl.load(x_ptrs, eviction_policy="evict_last")  # [BLOCK_M, 128], natural k = 32c + 8q + 2b + h
        xt = tl.reshape(tl.permute(tl.reshape(xt, (BLOCK_M, 4, 4, 4, 2)), (0, 2, 4, 1, 3)), (BLOCK_M, BLOCK_K))
        if GROUPED and not GS_FOLD:  # the tile is one group: its exact partial times the rows' integer scales
            part = tl.dot(a, tl.trans(xt), out_dtype=tl.int32)
            acc += part * tl.load(gs_rows + it).to(tl.int32)[:, None]
        else:
            acc = tl.dot(a, tl.trans(xt), acc, out_dtype=tl.int32)
        w_ptrs += BLOCK_K // 2
        x_ptrs += BLOCK_K
    return acc


@triton.jit(do_not_specialize=["M"])
def _w4a8_mma_words_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, gs_ptr, bias_ptr, out_ptr, acc_ws_ptr, count_ptr,
    M, N, K, KB, G, B_PER_SPLIT,
    GROUPED: tl.constexpr, X_PER_TOKEN: tl.constexpr, W_PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, GROUP_N: tl.constexpr, GS_FOLD: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    pid_k = tl.program_id(1)
    split_k = tl.num_programs(1)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_n, pid_m = tile_of(tl.program_id(0), num_pid_n, tl.cdiv(M, BLOCK_M), GROUP_N)
    offs_n, offs_m, mask_n, mask_m, rows_n, rows_m = _tile_rows(pid_n, pid_m, M, N, BLOCK_M, BLOCK_N)
    acc = _tile_dot(x_ptr, w_ptr, gs_ptr, rows_m, rows_n, K, KB, G, pid_k * B_PER_SPLIT, B_PER_SPLIT // 64, GROUPED, GS_FOLD, BLOCK_M, BLOCK_N, ASM)
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


@triton.jit(do_not_specialize=["M"])
def _w4a8_mma_words_stream_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, gs_ptr, bias_ptr, out_ptr, acc_ws_ptr, count_ptr,
    M, N, K, KB, G, KT, UNITS,
    GROUPED: tl.constexpr, X_PER_TOKEN: tl.constexpr, W_PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_N: tl.constexpr, GS_FOLD: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """Stream-K: the ``UNITS = tiles * KT`` (tile, 128-code K tile) units in tile-major order, split
    evenly over the grid's P programs, program p taking ``[p * UNITS // P, (p + 1) * UNITS // P)``;
    a tile whose units span several programs is finished by the last of them to arrive (its
    contributor count follows from the same formula), so every SM gets the same work whatever
    the tile count (224 tiles of 128 rows on 132 SMs: 1.7 each). Opt-in: bit-exact on the H200
    but slower than the split-K grid at M = 1 (28672x4096: 25.7 against 24.0 us, 4096x14336:
    16.0 against 13.6, best of 1-8 programs per SM), so the tile-count imbalance
    is not what limits the split-K grid there."""
    pid = tl.program_id(0)
    num_progs = tl.num_programs(0)
    u = (pid.to(tl.int64) * UNITS // num_progs).to(tl.int32)
    u_end = ((pid + 1).to(tl.int64) * UNITS // num_progs).to(tl.int32)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    while u < u_end:
        tile = u // KT
        kt0 = u - tile * KT
        n_kt = tl.minimum(KT - kt0, u_end - u)
        pid_n, pid_m = tile_of(tile, num_pid_n, tl.cdiv(M, BLOCK_M), GROUP_N)
        offs_n, offs_m, mask_n, mask_m, rows_n, rows_m = _tile_rows(pid_n, pid_m, M, N, BLOCK_M, BLOCK_N)
        acc = _tile_dot(x_ptr, w_ptr, gs_ptr, rows_m, rows_n, K, KB, G, kt0 * 64, n_kt, GROUPED, GS_FOLD, BLOCK_M, BLOCK_N, ASM)
        # programs covering the tile's first and last unit: unit v lies in program ((v + 1) * P - 1) // UNITS
        first = ((tile.to(tl.int64) * KT + 1) * num_progs - 1) // UNITS
        last = ((tile.to(tl.int64) * KT + KT) * num_progs - 1) // UNITS
        contributors = (last - first + 1).to(tl.int32)
        mask = mask_n[:, None] & mask_m[None, :]
        if contributors == 1:
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
                1,
                False,
                X_PER_TOKEN,
                W_PER_CHANNEL,
                HAS_BIAS,
            )
        else:
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
                contributors,
                True,
                X_PER_TOKEN,
                W_PER_CHANNEL,
                HAS_BIAS,
            )
        u += n_kt


def mma_words_supported(k: int, split_k: int = 1) -> bool:
    """K a whole number of 128-code tiles in every split."""
    return k % 128 == 0 and (k // 128) % split_k == 0


def _operands(xq, x_scale, qweight, w_scale, group_scale, bias) -> tuple:
    """Both kernels' leading tensor arguments (``w_scale`` as the unread placeholder of an absent
    ``group_scale`` / ``bias``)."""
    return (
        xq.contiguous(),
        x_scale.reshape(-1).contiguous(),
        qweight,
        w_scale,
        group_scale if group_scale is not None else w_scale,
        bias if bias is not None else w_scale,
    )


def _options(xq, x_scale, w_scale, group_scale, bias, config: dict) -> dict:
    """Both kernels' constexprs and launch options for ``config``."""
    return dict(
        GROUPED=group_scale is not None,
        X_PER_TOKEN=x_scale.dim() == 2,
        W_PER_CHANNEL=w_scale.numel() != 1,
        HAS_BIAS=bias is not None,
        BLOCK_M=config["BLOCK_M"],
        BLOCK_N=config["BLOCK_N"],
        GROUP_N=config.get("GROUP_N", 8),
        GS_FOLD=bool(config.get("GS_FOLD", 0)),
        ASM=xq.is_cuda,
        num_warps=config.get("num_warps", 4),
        num_stages=config.get("num_stages", LAUNCH_OPTIONS["num_stages"]),
        enable_fp_fusion=LAUNCH_OPTIONS["enable_fp_fusion"],
    )


def run_w4a8_mma_words(xq, x_scale, qweight, w_scale, group_scale, bias, out_dtype, *, config: dict):
    """Launch with ``config`` = {KERNEL: "mma_words", BLOCK_M, BLOCK_N, SPLIT_K or STREAM (stream-K:
    programs per SM, on ``SMS`` SMs when given), GROUP_N, num_warps, num_stages, GS_FOLD (group 128:
    the scale in the int8 operand, not on the tile's partial)}; arguments already checked by the op.
    Returns [M, N]."""
    m, k = xq.shape
    n = qweight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return out
    split = config.get("SPLIT_K", 1)
    if not mma_words_supported(k, split) or (group_scale is not None and group_scale.shape[1] * 128 != k):
        raise ValueError(f"run_w4a8_mma_words: config {config} cannot run K={k} (K % 128 == 0, whole tiles per split, group 128 or per channel)")
    operands = _operands(xq, x_scale, qweight, w_scale, group_scale, bias)
    options = _options(xq, x_scale, w_scale, group_scale, bias, config)
    tiles = triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"])
    if config.get("STREAM"):
        units = tiles * (k // 128)
        sms = config.get("SMS") or (sm_count(xq.device) if xq.is_cuda else 4)
        buf = zeroed_int32(xq.device, m * n + tiles)  # partial sums + arrival counters, left zeroed
        launch(_w4a8_mma_words_stream_kernel, (max(1, min(units, config["STREAM"] * sms)),),
            *operands, out, buf[: m * n], buf[m * n :], m, n, k, k // 2, k // 128, k // 128, units, **options
        )  # fmt: skip
        return out
    if split > 1:
        buf = zeroed_int32(xq.device, m * n + tiles)  # partial sums + arrival counters, left zeroed
        acc_ws, counts = buf[: m * n], buf[m * n :]
    else:
        acc_ws = counts = out  # never touched without split-K
    launch(_w4a8_mma_words_kernel, (tiles, split),
           *operands, out, acc_ws, counts, m, n, k, k // 2, k // 128, k // 2 // split, SPLIT=split > 1, **options)  # fmt: skip
    return out


# (weight rows BLOCK_N, warps, stages). sm_90 SASS of the loop (triton 3.6, 16 tokens; `qfuse bench
# sass w4a8_mma_words`), instructions per weight byte, per-channel / group 128: 128 rows / 4 warps
# 3.03 / 3.44, 128 / 8 warps 3.59 / 4.38, 64 / 4 warps 3.72 / 4.47 (the tile kernel of
# ops/int8/tile.py: 5.7-6.7 / 6.5-8.4 with GS_PARTIAL). No shuffle on the weight side; the
# activation permutation costs 4 PRMT + 4 STS per iteration at 16 tokens, 16 + 16 at 64 (compiled
# without it, the tile goes by cp.async straight to shared memory and the loop has none)
_TILES = ((128, 4, 4), (128, 8, 4), (64, 4, 4), (128, 4, 6), (64, 4, 6), (256, 8, 3))


def mma_words_configs(m: int, n: int, k: int, sms: int, group_size: int = -1) -> list[dict]:
    """Candidates for M <= 64: BLOCK_M = 16-64 tokens (the MMA's N side; Triton's dot needs >= 16),
    each tile with the split-K factors of :func:`split_k_choices` that divide K's 128-code tiles;
    up to M = 16 also the stream-K form (``STREAM``: programs per SM); group 128: each also with
    ``GS_FOLD``.
    The first is the heuristic pick (what runs untuned): 128 rows / 8 warps up to M = 8, else
    64 rows / 4 warps (4 stages), split to about two programs per SM: the tiles the H200 tune
    picked most often (BENCHMARKS.md: of the 14 keys at M = 1-4 it won, 12 with
    128 rows / 8 warps; of the 19 at M = 16-64, 17 with 64 rows / 4 warps, 4 or 6 stages)."""
    if m > 64 or not mma_words_supported(k) or group_size not in (-1, 128):  # its tiles are groups of 128
        return []
    bm = max(16, min(64, m_bucket(m)))
    out = []
    for bn, warps, stages in _TILES:
        programs = triton.cdiv(n, bn) * triton.cdiv(m, bm)
        for sp in split_k_choices(k // 128, programs, sms):
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sp, "GROUP_N": 8, "num_warps": warps, "num_stages": stages})
    bn, warps = (128, 8) if m_bucket(m) <= 8 else (64, 4)
    tile = [c for c in out if (c["BLOCK_N"], c["num_warps"], c["num_stages"]) == (bn, warps, 4)]
    programs = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    first = min(tile, key=lambda c: max(programs * c["SPLIT_K"], 2 * sms) / min(programs * c["SPLIT_K"], 2 * sms))
    out = [first] + [c for c in out if c is not first]
    if m_bucket(m) <= 16:  # stream-K, opt-in (FAMILY's opt_in: slower on the H200), 1 or 2 programs per SM
        out += [
            {"BLOCK_M": bm, "BLOCK_N": bn, "STREAM": per_sm, "GROUP_N": 8, "num_warps": warps, "num_stages": 4}
            for bn, warps in ((128, 8), (128, 4), (64, 4))
            for per_sm in (1, 2)
        ]
    if group_size == 128:  # group 128 also with the scale folded into the int8 operand
        out += [dict(c, GS_FOLD=1) for c in out]
    return out


def _supports(p: Problem) -> tuple[bool, str]:
    if p.bits != 4:
        return False, "W4A8 only"
    if not p.gpu:
        return False, "needs a GPU (inline-PTX unpack)"
    if p.m > 64:
        return False, "M > 64"
    if not mma_words_supported(p.k) or p.group_size not in (-1, 128):
        return False, "K % 128 != 0, or a group other than 128 (its tiles are groups of 128)"
    return True, ""


def _opt_in(cfg: dict) -> str:
    if cfg.get("STREAM"):
        return (
            "STREAM: stream-K, bit-exact on the H200 but slower than its split-K grid (per-channel M = 1: 25.7 against "
            "24.0 us on 28672x4096, 16.0 against 13.6 on 4096x14336)"
        )
    return ""


def _run(cfg, xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4):
    return run_w4a8_mma_words(xq, x_scale, w, w_scale, group_scale, bias, out_dtype, config=cfg)


FAMILY = KernelFamily(
    "mma_words", "int8/mma_words", _supports, lambda p, exhaustive: mma_words_configs(p.m, p.n, p.k, p.sms, p.group_size), _run, opt_in=_opt_in
)
