"""Tensor-core GEMV for 4-bit ``wna16_gemm`` at decode M: ``mma.sync.m16n8k16`` by inline PTX,
the weights as its A operand, one activation row broadcast over its 8 columns.

Each warp owns ``16 * ROW_TILES`` weight rows and walks the program's K slice in steps of 128
codes (16 int32 words per row), ``STEPS`` neighbouring steps per loop iteration. Lane ``l`` (group ``g = l // 4``, ``q = l % 4``) loads words
``4q .. 4q + 3`` of the step for rows ``g`` and ``g + 8`` of each row tile: 16-byte loads, the
natural packing (code ``k = 8w + t`` in bits ``4t..`` of word ``w``). Per word, as in
ops/wna16/tiled_planes.py, plane ``t`` (t = 0..3) is ``(word >> 4t) & 0x000F000F | MAGIC``: the
codes ``(t, t + 4)`` as the pair ``(M + u)`` in the activation dtype, exact, then one packed FMA
makes ``u - z``. The MMA sums over its K = 16 slots whatever pairs of codes fill them, as long
as the activations fill the B slots the same way, so no repacking is needed: for the word of
column ``w``, A registers ``{plane0(row g), plane0(row g + 8), plane1(row g), plane1(row g + 8)}``
go with B registers ``{(x[8w], x[8w + 4]), (x[8w + 1], x[8w + 5])}``, and a second MMA takes
planes 2, 3 with ``(x[8w + 2], x[8w + 6]), (x[8w + 3], x[8w + 7])``. Lanes with the same ``q``
hold the same word column for their rows, so every row sees the same K order. B does not
depend on the lane's group, so the 8 output columns are equal: ``d0`` is row ``g``'s dot and
``d2`` row ``g + 8``'s.

Per word: ~11 instructions of unpack (3 SHF, 4 LOP3, 4 packed FMA) and one MMA, against ~16
and four packed FMAs plus a float32 merge in the HFMA2 word GEMV (ops/wna16/gemv_words.py);
the products are exact and the tensor core accumulates in float32, so no bf16 partial sums.
Scales: per 128-code step (group sizes that are multiples of 128) the step's dot of each row
times its scale into a float32 accumulator; per-channel once at the end.

On the H200 (BENCHMARKS.md) it is right for every config, but 30-40 %
slower at M = 1 than the HFMA2 word GEMV despite fewer instructions (4.2-4.8 SASS per weight
byte at g128 against 5.6-6.3; e.g. 28672x4096: 30.3 against 21.5 us), with 1, 2 or 4 steps per
iteration and with the next step's operands loaded one step ahead. It was not profiled, so the
limit is not known; the dispatcher offers it opt-in (``QFUSE_EXPERIMENTAL_KERNELS=1``).

The lane and warp of each element come from ``%laneid`` / ``%tid.x`` (PTX), so the index
arithmetic follows the physical thread whatever layout Triton gives the 1-D tensors (one
element per thread). The interpreter (``ASM=False``) has no warps: there element ``e`` is lane
``e % 32`` of warp ``e // 32``, the unpack uses integer ops, and the MMA is the sum of each
lane's exact products over the 4 lanes of its group (``[NW, 8, 4]`` reshape): the same values
and the same index arithmetic, a different float32 summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket, split_k_choices
from .._launch import launch
from .._views import aligned_view
from ..jit_utils import split4
from ..kernel_family import KernelFamily, Problem
from .common import cdiv, finish_split, output_buffers
from .gemv_words import act_pairs


def _mma_pair_ptx(dtype: str) -> str:
    """Two words (rows g and g + 8, one column) into the MMA accumulator. $0-$3: d (float32);
    $4, $5: the words; $6, $7: the pairs -(M + z) of their rows; $8-$11: the activation pairs
    (x[t], x[t + 4]), t = 0..3; $12-$15: c."""
    magic, one, fma, ty = {
        "bf16": ("0x43004300", "0x3F803F80", "fma.rn.bf16x2", "bf16"),
        "fp16": ("0x64006400", "0x3C003C00", "fma.rn.f16x2", "f16"),
    }[dtype]
    lines = [".reg .b32 v, w, one, p<4>, r<4>;", f"mov.b32 one, {one};"]
    for word, negz, planes in (("$4", "$6", "p"), ("$5", "$7", "r")):
        for t in range(4):
            src = word
            if t:
                lines.append(f"shr.u32 w, {word}, {4 * t};")
                src = "w"
            lines += [f"lop3.b32 v, {src}, 0x000F000F, {magic}, 0xEA;", f"{fma} {planes}{t}, v, one, {negz};"]
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32"
    lines += [
        f"{mma} {{$0, $1, $2, $3}}, {{p0, r0, p1, r1}}, {{$8, $9}}, {{$12, $13, $14, $15}};",
        f"{mma} {{$0, $1, $2, $3}}, {{p2, r2, p3, r3}}, {{$10, $11}}, {{$0, $1, $2, $3}};",
    ]
    return "{\n" + "\n".join(lines) + "\n}"


_MMA_PAIR_BF16 = tl.constexpr(_mma_pair_ptx("bf16"))
_MMA_PAIR_FP16 = tl.constexpr(_mma_pair_ptx("fp16"))
_MMA_PAIR_CONSTRAINTS = tl.constexpr("=f,=f,=f,=f," + ",".join(["r"] * 8 + ["f"] * 4))


# compile options of a launch where the config does not set them (``qfuse bench sass`` compiles with the same)
LAUNCH_OPTIONS = {"num_stages": 1}


@triton.jit
def _lane_and_warp(e, ASM: tl.constexpr):
    """The physical lane and warp of each element of a one-element-per-thread tensor ``e``."""
    if ASM:
        lane = tl.inline_asm_elementwise("mov.u32 $0, %laneid;", "=r,r", [e], dtype=tl.int32, is_pure=True, pack=1)
        tid = tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r,r", [e], dtype=tl.int32, is_pure=True, pack=1)
        return lane, tid // 32
    else:
        return e % 32, e // 32


@triton.jit
def _half(bits, DTYPE: tl.constexpr):
    """uint32 values < 2**16 as the ``DTYPE`` (bf16 / fp16) values of those bits, in float32."""
    return bits.to(tl.uint16).to(DTYPE, bitcast=True).to(tl.float32)


@triton.jit
def _word_dot_exact(word, z, x04, x15, x26, x37, DTYPE: tl.constexpr):
    """The interpreter's lane share of one MMA pair: ``sum_t (u_t - z) * x_t`` over the word's 8
    codes in float32 (exact products)."""
    acc = tl.zeros(word.shape, tl.float32)
    for t in tl.static_range(4):
        xp = x04 if t == 0 else (x15 if t == 1 else (x26 if t == 2 else x37))
        u_lo = ((word >> (4 * t)) & 15).to(tl.float32) - z
        u_hi = ((word >> (4 * t + 16)) & 15).to(tl.float32) - z
        acc += u_lo * _half(xp & 0xFFFF, DTYPE) + u_hi * _half(xp >> 16, DTYPE)
    return acc


@triton.jit
def _group_sum(v, NW: tl.constexpr):
    """Each element replaced by the sum over the 4 lanes of its group (the MMA's K reduction)."""
    s = tl.sum(tl.reshape(v, (NW, 8, 4)), axis=2)
    return tl.reshape(tl.broadcast_to(s[:, :, None], (NW, 8, 4)), (NW * 32,))


@triton.jit
def _mma_word(c0, c1, c2, c3, w_a, w_b, negz_a, negz_b, za, zb, xq, NW: tl.constexpr, IS_BF16: tl.constexpr, ASM: tl.constexpr):
    """``c += `` the dots of the words ``w_a`` (row g) and ``w_b`` (row g + 8) of one column with
    that column's activations ``xq`` (``[E, 4]`` uint32 pairs (x[2i], x[2i + 1]))."""
    xa, xb, xc, xd = split4(xq)
    x04, x15, x26, x37 = act_pairs(xa, xb, xc, xd, ASM)
    if ASM:
        if IS_BF16:
            c0, c1, c2, c3 = tl.inline_asm_elementwise(
                _MMA_PAIR_BF16,
                _MMA_PAIR_CONSTRAINTS,
                [w_a, w_b, negz_a, negz_b, x04, x15, x26, x37, c0, c1, c2, c3],
                dtype=(tl.float32,) * 4,
                is_pure=True,
                pack=1,
            )
        else:
            c0, c1, c2, c3 = tl.inline_asm_elementwise(
                _MMA_PAIR_FP16,
                _MMA_PAIR_CONSTRAINTS,
                [w_a, w_b, negz_a, negz_b, x04, x15, x26, x37, c0, c1, c2, c3],
                dtype=(tl.float32,) * 4,
                is_pure=True,
                pack=1,
            )
    else:
        dtype: tl.constexpr = tl.bfloat16 if IS_BF16 else tl.float16
        da = _group_sum(_word_dot_exact(w_a, za, x04, x15, x26, x37, dtype), NW)
        db = _group_sum(_word_dot_exact(w_b, zb, x04, x15, x26, x37, dtype), NW)
        c0 += da
        c1 += da
        c2 += db
        c3 += db
    return c0, c1, c2, c3


@triton.jit
def _step_words(qw_ptr, ra, rb, col, KW):
    """A 128-code step's weights for one row tile: words ``col .. col + 3`` of rows ``ra`` (g)
    and ``rb`` (g + 8), ``[E, 4]`` uint32 each."""
    four = tl.arange(0, 4)[None, :]
    wa = tl.load(qw_ptr + (ra * KW + col)[:, None] + four, eviction_policy="evict_first").to(tl.uint32, bitcast=True)
    wb = tl.load(qw_ptr + (rb * KW + col)[:, None] + four, eviction_policy="evict_first").to(tl.uint32, bitcast=True)
    return wa, wb


@triton.jit
def _step_acts(xw_row, col):
    """The activation pairs of words ``col .. col + 3`` (4 ``[E, 4]`` uint32 tensors), shared by
    every row tile of the step."""
    xp = xw_row + (col * 4)[:, None] + tl.arange(0, 4)[None, :]
    return (
        tl.load(xp, eviction_policy="evict_last"),
        tl.load(xp + 4, eviction_policy="evict_last"),
        tl.load(xp + 8, eviction_policy="evict_last"),
        tl.load(xp + 12, eviction_policy="evict_last"),
    )


@triton.jit
def _step_dots(
    wa, wb, xq, z_ptr, s_ptr, ra, rb, G, grp, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, NW: tl.constexpr, IS_BF16: tl.constexpr, ASM: tl.constexpr
):
    """One 128-code step of one row tile (operands from :func:`_step_words`, :func:`_step_acts`): the rows' float32
    dots, times the step's group scale where there are groups."""
    if HAS_ZEROS:
        za_u = tl.load(z_ptr + ra * G + grp).to(tl.uint32)
        zb_u = tl.load(z_ptr + rb * G + grp).to(tl.uint32)
    else:
        za_u = tl.full(ra.shape, 8, tl.uint32)
        zb_u = tl.full(ra.shape, 8, tl.uint32)
    neg = 0xC300 if IS_BF16 else 0xE400  # -(M + z): bf16 -(128 + z), fp16 -(1024 + z)
    negz_a = (za_u + neg) * 0x10001
    negz_b = (zb_u + neg) * 0x10001
    za = za_u.to(tl.float32)
    zb = zb_u.to(tl.float32)
    zero = tl.zeros(ra.shape, tl.float32)
    c0, c1, c2, c3 = zero, zero, zero, zero
    w0a, w1a, w2a, w3a = split4(wa)
    w0b, w1b, w2b, w3b = split4(wb)
    x0, x1, x2, x3 = xq
    c0, c1, c2, c3 = _mma_word(c0, c1, c2, c3, w0a, w0b, negz_a, negz_b, za, zb, x0, NW, IS_BF16, ASM)
    c0, c1, c2, c3 = _mma_word(c0, c1, c2, c3, w1a, w1b, negz_a, negz_b, za, zb, x1, NW, IS_BF16, ASM)
    c0, c1, c2, c3 = _mma_word(c0, c1, c2, c3, w2a, w2b, negz_a, negz_b, za, zb, x2, NW, IS_BF16, ASM)
    c0, c1, c2, c3 = _mma_word(c0, c1, c2, c3, w3a, w3b, negz_a, negz_b, za, zb, x3, NW, IS_BF16, ASM)
    if GROUP > 0:
        c0 = c0 * tl.load(s_ptr + ra * G + grp).to(tl.float32)
        c2 = c2 * tl.load(s_ptr + rb * G + grp).to(tl.float32)
    return c0, c2


@triton.jit(do_not_specialize=["KW", "W_PER_SPLIT"])
def _w4a16_mma_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, KW, G, W_PER_SPLIT, SPLIT_K,
    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    ROW_TILES: tl.constexpr, STEPS: tl.constexpr, NW: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    IS_BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
    BLOCK_N: tl.constexpr = 16 * ROW_TILES * NW
    e = tl.arange(0, 32 * NW)
    lane, warp = _lane_and_warp(e, ASM)
    g = lane // 4
    q = lane % 4
    row0 = pid_n * BLOCK_N + warp * (16 * ROW_TILES) + g  # row g of the warp's first tile
    ra0 = row0 % N  # rows past N read row % N; their results are masked at the store
    rb0 = (row0 + 8) % N
    ra1 = (row0 + 16) % N
    rb1 = (row0 + 24) % N
    xw_row = x_ptr.to(tl.pointer_type(tl.uint32)) + m * (KW * 4)  # activation pairs (x[2i], x[2i + 1])
    w_start = pid_k * W_PER_SPLIT
    acc_a0 = tl.zeros(e.shape, tl.float32)
    acc_b0 = tl.zeros(e.shape, tl.float32)
    acc_a1 = tl.zeros(e.shape, tl.float32)
    acc_b1 = tl.zeros(e.shape, tl.float32)
    for it in range(0, W_PER_SPLIT // (16 * STEPS)):
        for j in tl.static_range(STEPS):  # 128-code steps next to each other: runs of 64 * STEPS bytes per row
            w0 = w_start + (it * STEPS + j) * 16
            col = w0 + 4 * q
            grp = (w0 * 8) // GROUP if GROUP > 0 else 0
            wa0, wb0 = _step_words(qw_ptr, ra0, rb0, col, KW)
            xq = _step_acts(xw_row, col)
            da, db = _step_dots(wa0, wb0, xq, z_ptr, s_ptr, ra0, rb0, G, grp, GROUP, HAS_ZEROS, NW, IS_BF16, ASM)
            acc_a0 += da
            acc_b0 += db
            if ROW_TILES == 2:
                wa1, wb1 = _step_words(qw_ptr, ra1, rb1, col, KW)
                da, db = _step_dots(wa1, wb1, xq, z_ptr, s_ptr, ra1, rb1, G, grp, GROUP, HAS_ZEROS, NW, IS_BF16, ASM)
                acc_a1 += da
                acc_b1 += db

    # lanes q = 0 hold each row once (the 4 lanes of a group carry the same dots)
    if ROW_TILES == 2:
        res = tl.join(tl.join(acc_a0, acc_b0), tl.join(acc_a1, acc_b1))  # [E, 2, 2]: tile, (g, g + 8)
        rows = tl.join(tl.join(row0, row0 + 8), tl.join(row0 + 16, row0 + 24))
        keep = tl.join(tl.join(q == 0, q == 0), tl.join(q == 0, q == 0))
    else:
        res = tl.join(acc_a0, acc_b0)
        rows = tl.join(row0, row0 + 8)
        keep = tl.join(q == 0, q == 0)
    rn = rows % N
    if GROUP == -1:
        res = res * tl.load(s_ptr + rn * G).to(tl.float32)
    mask = keep & (rows < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            res += tl.load(bias_ptr + rn).to(tl.float32)
        tl.store(out_ptr + m * N + rows, res.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        finish_split(
            res, m * N + rows, mask, bias_ptr + rn, ws_ptr, count_ptr, out_ptr, pid_n + m * tl.num_programs(0), pid_k, M * N, SPLIT_K, HAS_BIAS
        )


def mma_gemv_supported(k: int, group_size: int) -> bool:
    """K a whole number of 128-code steps, and a group size the steps do not straddle."""
    return k % 128 == 0 and (group_size == -1 or group_size % 128 == 0)


def w4a16_mma_gemv(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, group_size: int, cfg: dict) -> Tensor:
    """Launch with ``cfg`` = {ROW_TILES (1 or 2), STEPS (128-code steps per iteration: 1, 2, 4),
    SPLIT_K, num_warps} (arguments already checked)."""
    m, k = x.shape
    n = qweight.shape[0]
    if not mma_gemv_supported(k, group_size):
        raise ValueError(f"w4a16_mma_gemv: K={k} / group {group_size}: needs K % 128 == 0 and group -1 or a multiple of 128")
    x = x.contiguous()
    if x.data_ptr() % 4:  # the activations are read as int32 pairs: a view at an odd element is copied
        x = x.clone()
    words = aligned_view(qweight, torch.int32)
    kw = k // 8
    steps_per_it = cfg.get("STEPS", 1)
    while (kw // 16) % steps_per_it:
        steps_per_it //= 2
    its = kw // (16 * steps_per_it)
    split_k = min(cfg.get("SPLIT_K", 1), its)
    while its % split_k:  # whole iterations per split
        split_k -= 1
    nw = cfg.get("num_warps", 4)
    block_n = 16 * cfg.get("ROW_TILES", 1) * nw
    grid = (triton.cdiv(n, block_n), split_k, m)
    out, ws, counts = output_buffers(x, n, split_k, grid[0] * m)
    launch(_w4a16_mma_gemv_kernel, grid,
        x, words, scales, zeros if zeros is not None else qweight, bias if bias is not None else scales, out, ws, counts,
        m, n, kw, scales.shape[1], kw // split_k, split_k,
        GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None,
        ROW_TILES=cfg.get("ROW_TILES", 1), STEPS=steps_per_it, NW=nw, ASM=x.is_cuda, num_warps=nw, num_stages=LAUNCH_OPTIONS["num_stages"],
    )  # fmt: skip
    return out


def _configs(p: Problem, exhaustive: bool) -> list[dict]:
    # (row tiles, warps), 2 steps per iteration (1 and 4, and loading one step ahead, measured no faster)
    out = []
    for rt, warps in ((2, 4), (1, 4), (1, 8)):
        programs = cdiv(p.n, 16 * rt * warps) * p.m
        for sp in split_k_choices(p.k // 256, programs, p.sms):
            out.append({"ROW_TILES": rt, "STEPS": 2, "SPLIT_K": sp, "num_warps": warps})
    return out


def _run(cfg, x, qweight, scales, zeros, bias, bits, group_size):
    return w4a16_mma_gemv(x, qweight, scales, zeros, bias, group_size, cfg)


def _supports(p: Problem) -> tuple[bool, str]:
    if m_bucket(p.m) <= 2 and p.bits == 4 and mma_gemv_supported(p.k, p.group_size):
        return True, ""
    return False, "4-bit, M bucket <= 2, K % 128 == 0, group -1 or a multiple of 128"


FAMILY = KernelFamily(
    "mma_gemv",
    "wna16/mma_gemv",
    _supports,
    _configs,
    _run,
    default=False,
    why_opt_in="tensor-core GEMV: right on the H200, 30-40 % slower there than the HFMA2 word GEMV at M = 1 "
    "(28672x4096: 30.5 against 21.5 us); a candidate for GPUs where the word GEMV is slower",
)
