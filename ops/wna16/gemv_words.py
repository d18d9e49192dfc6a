"""CUDA-core GEMV for ``wna16_gemm`` (4- and 8-bit) at decode M, reading the weights as int32 words.

The documented layouts read as little-endian int32 words put code ``k = CPW * w + t`` in bits
``BITS * t .. BITS * t + BITS - 1`` of word ``w``, CPW = 32 // BITS codes per word (4-bit: 8
nibbles, low nibble = even k; 8-bit: 4 bytes): natural K order, so no register shuffle lines
codes up with activations. Per word, half ``h`` in {0, 1} and code ``j`` of the half
(t = CPW/2 * h + j, MASK = 2**BITS - 1)::

    half = word, word >> 16                     codes CPW/2 * h .. in bits 0..15 (one SHF per word)
    c_t  = bitcast_f32((half & (MASK << BITS*j)) | 0x4B000000) - (2**23 + z * 2**(BITS*j))
         = (u - z) * 2**(BITS*j)                                                   (exact)
    t    = sum_t c_t * (x[CPW*w + t] * 2**-(BITS*j))                              (exact rescale)
    acc += t * s[n, g]                                                  (one FFMA per word)

Exact: a code kept in place in its 16-bit half is u * 2**(BITS*j) <= 2**16 - 1 < 2**23 (4-bit:
u * 2**12 at most 15 * 2**12; 8-bit: u * 2**8 at most 255 * 2**8), inside the 23 mantissa bits
of 2**23, so the OR gives 2**23 + u * 2**(BITS*j) exactly and the FADD of two floats in
[2**23, 2**24) is exact, as is 2**23 + z * 2**(BITS*j) (an integer < 2**24); scaling x by a
power of two is exact (an fp16 / bf16 value keeps its <= 11 significant bits, even as a float32
subnormal), so each FFMA adds (u - z) * x to t with one rounding. The upper half is shifted
down because its codes in place (bits 16..31) would overlap the exponent (bits 23..30). Against
the reference: float32 summation order, and the scale applied to a tile's partial dot instead
of a w_hat rounded to the activation dtype (the tests' tolerance covers both).

About 3 instructions per code (LOP3, FADD, FFMA) plus one SHF and one scale FFMA per word.
sm_90 SASS of the loop (triton 3.7.1, bf16, 4 warps; symmetric / with zero points, per
weight byte):

    4-bit  BLOCK_N=128 BLOCK_W=16   group 128: 8.23 / 8.84   per-channel: 7.42
    8-bit  BLOCK_N=128 BLOCK_W=32   group 128: 4.36 / 4.52   per-channel: 3.92
    8-bit  BLOCK_N=64  BLOCK_W=32   group 128: 4.97 / 5.44   per-channel: 4.48
    4-bit  BLOCK_N=32  BLOCK_W=64   group 128: 8.39 / 8.84   per-channel: 7.42  (triton 3.6)
    8-bit  BLOCK_N=32  BLOCK_W=64   group 128: 4.97 / 5.44   per-channel: 4.48  (triton 3.6)

against the byte-wise GEMV (ops/wna16/gemv.py: byte extract, nibble join, per-code scale):
15-20 for 4-bit and 7.4 for 8-bit (BLOCK_N=32, BLOCK_K=128, its shipped 8-bit M = 1 config).
Instruction count is not the whole story: on the H200 the 4-bit GEMV issues at about half
the rate its count allows, and tiles reading longer runs of each row are faster despite more
instructions (per-channel 28672x4096, M = 1: BLOCK_W = 64 26.4 us, BLOCK_W = 16 29.4 us;
BENCHMARKS.md), so the dispatcher offers BLOCK_W 16-64 and the tuning picks. Loading the next
tile's words one tile ahead (a software prefetch) measured no faster and was dropped.

**HFMA2 form** (config key ``HFMA2``; 4-bit with bf16 activations): the products are summed in
bf16 pairs by inline PTX (:func:`_word_dot_ptx`) before float32. Per word, for t = 0..3::

    plane_t = ((word >> 4t) & 0x000F000F) | 0x43004300   = bf16 pair (128 + u_t, 128 + u_t+4)  (exact)
    q_t     = fma(plane_t, 1, -(128 + z))                = (u_t - z, u_t+4 - z)                (exact)
    lanes   = fma(q_t, (x[t], x[t + 4]), lanes)          two bf16 lane sums, one rounding each
    part    = float32(lanes.lo) + float32(lanes.hi)      (HFMA2 = 2: after two words, 8 products a lane)
    acc    += part * s[n, g]

The activation pairs ``(x[t], x[t + 4])`` are built once per word column (one PRMT each) and
shared by the tile's rows. ~2 instructions per code (SHF, LOP3, packed FMA, packed FMA for
two codes) against ~3: 5.6-6.1 SASS instructions per weight byte at g128 against 7.4-8.2 in
the float32 form's tile layout (sm_90, triton 3.7.1; 6.0-6.3 with triton 3.6), 4.7-5.0 in its
own (below). On the H200 at M = 1, g128, the best tile of each form (tuned):
28-34 % less time than the float32 form on all five shapes (28672x4096: 20.6 against 30.8 us),
2.45-2.91x bf16. The cost is accuracy: each lane sum is rounded to bf16 after every
product, 8 products per lane. Against the exact (float64) product of x and w_hat over 32 cases
(4 shapes, g128 / per-channel, with and without zero points, plain and outlier activations),
the rms error was 1.4-2.0x the reference kernel's own (which rounds w_hat to bf16) and the max
error 1.0-1.8x; the float32 form's rms error was 0.6-0.85x (BENCHMARKS.md). ``QFUSE_FP32_ACCUMULATE=1``
(ops/wna16/dispatch.py) turns the form off. fp16 activations keep the float32 form: a 4-term
fp16 lane sum would overflow past |x| ~ 1e3, inside an LLM's activation range. 8-bit codes do
not fit a bf16 mantissa with the magic-number trick (128 + u needs u < 128).

The HFMA2 tile is loaded as one ``[BLOCK_N, BLOCK_W]`` block, so that a thread holds one word
column of several rows and loads its activations once: 4.95 SASS instructions per weight byte
at 32 x 128 g128 (4.73 per-channel) against 5.62 (5.35) for the same sums over a 3D
``[BLOCK_N, NG, WPG]`` tile with triton 3.6, and 11-14 % faster at g128 on the H200 (the
reason in the kernel's comment). The float32 form loads its tiles the same way.

One program: one activation row, BLOCK_N weight rows, a 1/SPLIT_K slice of K; the float32
partial of a split goes through the shared deterministic single-launch split-K reduction
(``finish_split``). A tile is ``[BLOCK_N, NG, WPG]``: NG whole scale groups of WPG words
(NG = 1 when the tile lies inside one group, and per-channel), one scale (and zero point)
per row and group, applied to the group's partial sum. Needs K % CPW == 0 (whole words).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket, split_k_choices
from .._exact_triton import bf16_rne_f32
from .._launch import launch
from .._views import aligned_view
from ..kernel_family import KernelFamily, Problem
from .common import cdiv, output_buffers, store_row, tile_major_cols, tile_major_rows


def _word_dot_ptx(words: int) -> str:
    """Inline PTX: ``words`` (1 or 2) int32 words of 8 codes each (k = 8w + t in bits 4t..)
    against their bf16 activations, in two bf16x2 lanes: lane 0 takes codes t = 0-3, lane 1
    codes t = 4-7, so the mask 0x000F000F picks the pair (t, t + 4) after a shift by 4t.
    Operands: $0 the float32 result (sum of both lanes), $1.. the words, then the pair
    -(128 + z), then per word the activation pairs (x[t], x[t + 4]), t = 0..3. Per code pair:
    LOP3 (128 + u, exact), FMA by 1 plus -(128 + z) (u - z, exact), FMA into the lane sum (one
    rounding to bf16). lop3 immLut 0xEA = (a & b) | c; fma.rn.bf16x2 runs from sm_80
    (sub / mul.bf16x2 need sm_90)."""
    negz = f"${words + 1}"
    lines = [".reg .b32 v, q, a, w, one, lo, hi;", "mov.b32 one, 0x3F803F80;", "mov.b32 a, 0x80008000;"]
    for i in range(words):
        for t in range(4):
            src = f"${1 + i}"
            if t:
                lines.append(f"shr.u32 w, {src}, {4 * t};")
                src = "w"
            lines += [
                f"lop3.b32 v, {src}, 0x000F000F, 0x43004300, 0xEA;",
                f"fma.rn.bf16x2 q, v, one, {negz};",
                f"fma.rn.bf16x2 a, q, ${words + 2 + 4 * i + t}, a;",
            ]
    lines += ["shl.b32 lo, a, 16;", "and.b32 hi, a, 0xFFFF0000;", "add.f32 $0, lo, hi;"]
    return "{\n" + "\n".join(lines) + "\n}"


_WORD_DOT_BF16X2 = tl.constexpr(_word_dot_ptx(1))
_TWO_WORD_DOT_BF16X2 = tl.constexpr(_word_dot_ptx(2))
_TWO_WORD_CONSTRAINTS = tl.constexpr("=r," + ",".join(["r"] * 11))  # a constant: triton 3.6 cannot join strings in a kernel


# (x[t], x[t + 4]) pairs from the 4 activation pairs a b c d = (x0 x1) (x2 x3) (x4 x5) (x6 x7): one
# PRMT each (ptxas makes LOP3 + IMAD of the shift-and-or spelling)
_ACT_PAIRS = tl.constexpr("""{
prmt.b32 $0, $4, $6, 0x5410;
prmt.b32 $1, $4, $6, 0x7632;
prmt.b32 $2, $5, $7, 0x5410;
prmt.b32 $3, $5, $7, 0x7632;
}""")


# compile options of a launch where the config does not set them (``qfuse bench sass`` compiles with the same)
LAUNCH_OPTIONS = {"num_stages": 2}


@triton.jit
def act_pairs(xa, xb, xc, xd, ASM: tl.constexpr):
    """``(x04, x15, x26, x37)``: uint32 pairs (x[t], x[t + 4]) of a word's 8 activations, given as
    its 4 uint32 pairs (x[2i], x[2i + 1])."""
    if ASM:
        return tl.inline_asm_elementwise(_ACT_PAIRS, "=r,=r,=r,=r,r,r,r,r", [xa, xb, xc, xd], dtype=(tl.uint32,) * 4, is_pure=True, pack=1)
    else:
        return (xa & 0xFFFF) | (xc << 16), (xa >> 16) | (xc & 0xFFFF0000), (xb & 0xFFFF) | (xd << 16), (xb >> 16) | (xd & 0xFFFF0000)


@triton.jit
def _lane_fma(acc_lo, acc_hi, words, q_minus, xp, SHIFT: tl.constexpr):
    """The interpreter's spelling of one pair step of :func:`_word_dot_ptx`: codes t and t + 4
    (``SHIFT`` = 4t) minus z times their activations, each lane rounded to bf16."""
    u_lo = ((words >> SHIFT) & 15).to(tl.float32)
    u_hi = ((words >> (SHIFT + 16)) & 15).to(tl.float32)
    x_lo = (xp << 16).to(tl.float32, bitcast=True)
    x_hi = (xp & 0xFFFF0000).to(tl.float32, bitcast=True)
    return bf16_rne_f32((u_lo + q_minus) * x_lo + acc_lo), bf16_rne_f32((u_hi + q_minus) * x_hi + acc_hi)


@triton.jit
def _word_dot_interp(words, q_minus, x04, x15, x26, x37, lo, hi):
    """One word of ``_word_dot_ptx`` in the interpreter's spelling: the lane sums after it."""
    lo, hi = _lane_fma(lo, hi, words, q_minus, x04, 0)
    lo, hi = _lane_fma(lo, hi, words, q_minus, x15, 4)
    lo, hi = _lane_fma(lo, hi, words, q_minus, x26, 8)
    lo, hi = _lane_fma(lo, hi, words, q_minus, x37, 12)
    return lo, hi


@triton.jit
def word_dot_bf16x2(words, negz, x04, x15, x26, x37, WORDS: tl.constexpr, ASM: tl.constexpr):
    """``sum_t (u_t - z) * x_t`` over the 8 codes of each uint32 word (``WORDS`` = 1), or of each
    pair of neighbouring words (``WORDS`` = 2: the last axis of ``words`` and of the activation
    pairs halves), float32 from two bf16x2 lane sums (see :func:`_word_dot_ptx`). ``negz``:
    uint32 pairs of bf16 -(128 + z); ``x04 .. x37``: uint32 pairs (x[t], x[t + 4]).
    ``ASM=False``: the interpreter's integer / float32 spelling with the same roundings."""
    if WORDS == 2:
        words, words_1 = _halves(words)
        x04, x04_1 = _halves(x04)
        x15, x15_1 = _halves(x15)
        x26, x26_1 = _halves(x26)
        x37, x37_1 = _halves(x37)
    if ASM:
        if WORDS == 2:
            r = tl.inline_asm_elementwise(
                _TWO_WORD_DOT_BF16X2,
                _TWO_WORD_CONSTRAINTS,
                [words, words_1, negz, x04, x15, x26, x37, x04_1, x15_1, x26_1, x37_1],
                dtype=tl.int32,
                is_pure=True,
                pack=1,
            )
        else:
            r = tl.inline_asm_elementwise(_WORD_DOT_BF16X2, "=r,r,r,r,r,r,r", [words, negz, x04, x15, x26, x37], dtype=tl.int32, is_pure=True, pack=1)
        return r.to(tl.float32, bitcast=True)
    else:
        q_minus = 128.0 + (negz << 16).to(tl.float32, bitcast=True)  # -z: u - z = (128 + u) - (128 + z)
        lo = tl.zeros(words.shape, tl.float32)
        hi = tl.zeros(words.shape, tl.float32)
        lo, hi = _word_dot_interp(words, q_minus, x04, x15, x26, x37, lo, hi)
        if WORDS == 2:
            lo, hi = _word_dot_interp(words_1, q_minus, x04_1, x15_1, x26_1, x37_1, lo, hi)
        return lo + hi


@triton.jit
def _halves(t):
    """``[A, B, C]`` -> its even and odd entries along the last axis, ``[A, B, C / 2]`` each."""
    return tl.split(tl.reshape(t, (t.shape[0], t.shape[1], t.shape[2] // 2, 2)))


# KW / W_PER_SPLIT unspecialized: when Triton may assume 16-divisible row lengths it gives
# each thread 4 contiguous words of 2 rows (16-byte loads) instead of 1 word of 8 rows, and
# the per-code activation loads then amortize over 2 rows instead of 8: 10.8 against 9.2
# SASS instructions per weight byte in the loop (4-bit, sm_90, BLOCK_N=64, BLOCK_W=16, 4 warps).
# 8-bit has half the codes (activations) per word, so there the 16-byte loads win: VEC = 4
# (row starts and tile starts are multiples of 4 words, set by the launcher where true) gives
# each thread 4 words of 8 rows at BLOCK_N=128, BLOCK_W=32: 4.36 against 4.73 instructions
# per byte, 125 against 255 registers. The HFMA2 form's tiles also take VEC = 4: their
# activation pairs are loaded per word column, not per code (see the kernel's comment).
@triton.jit(do_not_specialize=["KW", "W_PER_SPLIT"])
def _wna16_gemv_words_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, experts_ptr,
    M, N, KW, G, W_PER_SPLIT, SPLIT_K, MAGIC_BITS, CODE_MASK,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, VEC: tl.constexpr, HFMA2: tl.constexpr,
    ASM: tl.constexpr, EXPERTS: tl.constexpr = False, ROW_DIV: tl.constexpr = 1, TILED: tl.constexpr = False,
):  # fmt: skip
    CPW: tl.constexpr = 32 // BITS  # codes per word
    CPH: tl.constexpr = CPW // 2  # codes per 16-bit half
    # a tile is NG scale groups of WPG words ([BLOCK_N, NG, WPG]); per-channel: one "group"
    WPG: tl.constexpr = min(BLOCK_W, GROUP // CPW) if GROUP > 0 else BLOCK_W
    NG: tl.constexpr = BLOCK_W // WPG
    pid_k = tl.program_id(1)
    if EXPERTS:
        # fused_moe (ops/moe/gemv_words.py): output row m is a (token, expert) pair, and the pairs
        # are the fastest grid axis, so the programs in flight read the same row tile of every
        # pair's expert: pairs that share an expert (M = 16 top-2 on 8 experts: 4 each) meet its
        # tile in L2 instead of each streaming the expert from HBM.
        m = tl.program_id(0)
        pid_n = tl.program_id(2)
        n_tiles = tl.num_programs(2)
    else:
        pid_n = tl.program_id(0)
        m = tl.program_id(2)
        n_tiles = tl.num_programs(0)
    x_m = m
    if EXPERTS:
        e = tl.load(experts_ptr + m).to(tl.int64)
        qw_ptr += e * N * KW
        s_ptr += e * N * G
        z_ptr += e * N * G
        x_m = m // ROW_DIV
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N  # rows past N recompute row rn; their results are masked at the store
    x_row = x_ptr + x_m * (KW * CPW)
    w_start = pid_k * W_PER_SPLIT
    row = tile_major_rows(rn, KW, 16) if TILED else rn * KW  # TILED: tile-major words (ops/moe/tile_major.py)
    if VEC > 1:
        row = tl.multiple_of(row, VEC)
    # Both forms load a tile as one [BLOCK_N, BLOCK_W] block, contiguous along its rows, and
    # reshape it to [BLOCK_N, NG, WPG] (free: the same registers). Loaded as a 3D tile, its layout
    # depends on how Triton breaks the tie between the two non-contiguous dimensions, and triton
    # 3.6 gives NG > 1 tiles a slow one (see the HFMA2 comment below): float32 form, sm_90, 4-bit
    # g128 32 x 64 with zero points 10.06 -> 8.84 SASS instructions per weight byte, 64 x 64 /
    # 8 warps 9.48 -> 8.27; 8-bit g128 64 x 64 4.77 -> 4.36, 32 x 128 / 8 warps 7.92 -> 5.45;
    # the NG = 1 tiles unchanged; with triton 3.7.1 the same counts either way.
    cols = tl.arange(0, BLOCK_W)
    if GROUP > 0:
        sg = rn[:, None] * G + tl.arange(0, NG)[None, :]  # [BLOCK_N, NG]: + the tile's first group

    if HAS_ZEROS:
        if GROUP > 0:  # loaded per tile in the loop: here only its shape
            z = tl.zeros((BLOCK_N, NG), dtype=tl.float32)
        else:
            z = tl.load(z_ptr + rn[:, None] * G).to(tl.float32)
    else:
        z = tl.full((BLOCK_N, 1), 1 << (BITS - 1), tl.float32)
    if HFMA2:
        # With the tile loaded as one [BLOCK_N, BLOCK_W] block, a warp reads runs of a row and each
        # thread holds one 4-word column for several rows (8 at 32 x 128 / 4 warps): one 16-byte
        # load (VEC = 4) per row, and that column's activations once. Loaded as a 3D
        # [BLOCK_N, NG, WPG] tile, triton 3.6 gives each thread 4 words of each of NG groups of
        # one row, so at 32 x 128 g128 (sm_90) a loop iteration takes 32 4-byte word loads and the
        # activations of 32 columns through shared memory (8 STS.128 + 8 LDS.128), against 8
        # LDG.128 and 4 LDG.32 here: 5.62 against 4.95 SASS instructions per weight byte (the
        # same 4.95 with triton 3.7.1). On the H200 at M = 1, bf16, the best tile of each layout:
        # 11-14 % faster at g128, 5 % per-channel (8192x8192 g128 13.63 against
        # 15.37 us).
        # bf16 pairs -(128 + z) = 0xC300 + z in both halves (the symmetric z = 8: 0xC308C308)
        if HAS_ZEROS and GROUP < 0:
            negz = ((tl.load(z_ptr + rn * G).to(tl.uint32) + 0xC300) * 0x10001)[:, None, None]
        else:
            negz = tl.full((BLOCK_N, 1, 1), 0xC308C308, tl.uint32)
        xw_row = x_ptr.to(tl.pointer_type(tl.uint32)) + x_m * (KW * 4)  # activation pairs (x[2i], x[2i + 1])
    acc = tl.zeros((BLOCK_N, NG, WPG // max(HFMA2, 1)), dtype=tl.float32)  # HFMA2 = 2: one entry per word pair
    for it in range(0, W_PER_SPLIT // BLOCK_W):
        w0 = w_start + it * BLOCK_W
        if VEC > 1:
            w0 = tl.multiple_of(w0, VEC)
        ow = w0 + cols
        w_col = tile_major_cols(ow, 16) if TILED else ow
        words = tl.load(qw_ptr + row[:, None] + w_col[None, :], eviction_policy="evict_first").to(tl.uint32, bitcast=True)
        words = tl.reshape(words, (BLOCK_N, NG, WPG))
        if HFMA2:
            xa = tl.reshape(tl.load(xw_row + ow * 4, eviction_policy="evict_last"), (1, NG, WPG))
            xb = tl.reshape(tl.load(xw_row + ow * 4 + 1, eviction_policy="evict_last"), (1, NG, WPG))
            xc = tl.reshape(tl.load(xw_row + ow * 4 + 2, eviction_policy="evict_last"), (1, NG, WPG))
            xd = tl.reshape(tl.load(xw_row + ow * 4 + 3, eviction_policy="evict_last"), (1, NG, WPG))
            x04, x15, x26, x37 = act_pairs(xa, xb, xc, xd, ASM)
            negz_t = negz
            if GROUP > 0:
                g = (w0 * CPW) // GROUP
                s = tl.load(s_ptr + sg + g).to(tl.float32)[:, :, None]
                if HAS_ZEROS:
                    negz_t = ((tl.load(z_ptr + sg + g).to(tl.uint32) + 0xC300) * 0x10001)[:, :, None]
                acc += word_dot_bf16x2(words, negz_t, x04, x15, x26, x37, HFMA2, ASM) * s
            else:
                acc += word_dot_bf16x2(words, negz_t, x04, x15, x26, x37, HFMA2, ASM)
        else:
            if GROUP > 0:
                g = (w0 * CPW) // GROUP
                s = tl.load(s_ptr + sg + g).to(tl.float32)
                if HAS_ZEROS:
                    z = tl.load(z_ptr + sg + g).to(tl.float32)
            # per-channel: straight into acc (a separate tile sum costs one FADD per word:
            # 8-bit BLOCK_N=128, BLOCK_W=32 loop 534 -> 502 instructions)
            t = tl.zeros((BLOCK_N, NG, WPG), dtype=tl.float32) if GROUP > 0 else acc
            for h in tl.static_range(2):
                half = words if h == 0 else words >> 16  # codes CPH*h .. CPH*h + CPH-1 in bits 0..15
                for j in tl.static_range(CPH):
                    # Code j stays in place (bits BITS*j..): the exponent trick then yields
                    # 2**23 + u * 2**(BITS*j), exact, with one LOP3 (mask and magic are constants;
                    # a shift + mask would compile to a bit-field extract, SHF + SGXT + LOP3).
                    # (u - z) * 2**(BITS*j) times x * 2**(-BITS*j) is (u - z) * x exactly. MAGIC_BITS
                    # (0x4B000000) and CODE_MASK (2**BITS - 1) arrive as kernel arguments, so they sit
                    # in registers and ptxas fuses and + or into one 3-input LOP3 (immediates: two).
                    cj = ((half & (CODE_MASK << (BITS * j))) | MAGIC_BITS).to(tl.float32, bitcast=True) - (8388608.0 + z * (1 << (BITS * j)))[
                        :, :, None
                    ]
                    xj = tl.load(x_row + ow * CPW + (CPH * h + j), eviction_policy="evict_last").to(tl.float32) * (1.0 / (1 << (BITS * j)))
                    t += cj * tl.reshape(xj, (1, NG, WPG))
            if GROUP > 0:
                acc += t * s[:, :, None]
            else:
                acc = t
    res = tl.sum(tl.sum(acc, axis=2), axis=1)
    store_row(res, s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_n, m, pid_n + m * n_tiles, pid_k, M, N, G, GROUP, HAS_BIAS, SPLIT_K)


def words_supported(k: int, bits: int, group_size: int, block_w: int = 4) -> bool:
    """Whether this kernel can take the problem: 4- or 8-bit, K a whole number of ``block_w``-word
    tiles (32 codes for 4-bit, 16 for 8-bit at the default 4 words) and so is the group; the
    launcher shrinks BLOCK_W to a divisor of K / CPW where needed."""
    if bits not in (4, 8):
        return False
    codes = (32 // bits) * block_w
    return k % codes == 0 and (group_size <= 0 or group_size % codes == 0)


def tile_words(k: int, bits: int, group_size: int, block_w: int) -> int:
    """The words per row a tile of config width ``block_w`` really covers: a tile spans whole
    groups or lies inside one, and divides the row (per-channel K that is a multiple of the
    minimum tile but not of BLOCK_W, e.g. 576)."""
    cpw = 32 // bits
    kw = k // cpw
    if group_size > 0 and block_w * cpw > group_size and (block_w * cpw) % group_size:
        block_w = group_size // cpw
    while kw % block_w:
        block_w //= 2
    return block_w


def wna16_gemv_words(
    x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int, cfg: dict,
    experts: Tensor | None = None, row_div: int = 1, out_dtype: torch.dtype | None = None, tiled: bool = False,
) -> Tensor:  # fmt: skip
    """Launch with config ``cfg`` = {BLOCK_N, BLOCK_W, SPLIT_K, num_warps, MAXNREG (optional: ptxas
    register cap per thread, CUDA only), HFMA2 (optional: 4-bit with bf16 activations, each
    word's products summed in bf16x2 lanes)} (arguments already checked).

    ``experts`` (int32 ``[P]``, fused_moe's pairs): ``qweight [E, N, K * bits / 8]``, ``scales``
    and ``zeros`` ``[E, N, G]``; output row p is ``x[p // row_div] @ w_hat[experts[p]].T``.
    ``out_dtype``: the output's dtype (default x's); ``tiled``: ``qweight`` tile-major (ops/moe/tile_major.py)."""
    m, k = x.shape
    n = qweight.shape[-2]
    if experts is not None:
        m = experts.numel()
    cpw = 32 // bits
    kw = k // cpw
    if bits not in (4, 8) or k % cpw:
        raise ValueError(f"wna16_gemv_words: {bits}-bit K={k} is not a whole number of int32 words")
    hfma2 = int(cfg.get("HFMA2", 0))
    if hfma2 and (bits != 4 or x.dtype != torch.bfloat16):
        raise ValueError(f"wna16_gemv_words: HFMA2 takes 4-bit weights and bf16 activations, not {bits}-bit / {x.dtype}")
    x = x.contiguous()
    if hfma2 and x.data_ptr() % 4:  # HFMA2 reads the activations as int32 pairs: a view at an odd element
        x = x.clone()
    words = aligned_view(qweight, torch.int32)  # [N, K // CPW]; the byte layout read 4 bytes at a time
    block_w = tile_words(k, bits, group_size, cfg["BLOCK_W"])
    split_k = cfg.get("SPLIT_K", 1)
    while split_k > 1 and kw % (split_k * block_w):  # whole tiles per split
        split_k -= 1
    w_per_split = kw // split_k
    vec = 4 if (bits == 8 or hfma2) and kw % 4 == 0 and block_w % 4 == 0 else 1  # see the kernel's comment
    wpg = min(block_w, group_size // cpw) if group_size > 0 else block_w  # words per group in a tile (the kernel's WPG)
    if hfma2 == 2 and wpg % 2:  # word pairs need an even count
        hfma2 = 1
    n_tiles = triton.cdiv(n, cfg["BLOCK_N"])
    grid = (n_tiles, split_k, m) if experts is None else (m, split_k, n_tiles)  # EXPERTS: pairs fastest (the kernel's comment)
    out, ws, counts = output_buffers(x, n, split_k, n_tiles * m, m, out_dtype)
    cap = {"maxnreg": cfg["MAXNREG"]} if "MAXNREG" in cfg and x.is_cuda else {}  # a compile option; the interpreter has none
    launch(_wna16_gemv_words_kernel, grid,
        x, words, scales, zeros if zeros is not None else qweight, bias if bias is not None else scales, out, ws, counts,
        experts if experts is not None else words, m, n, kw, scales.shape[-1], w_per_split, split_k, 0x4B000000, (1 << bits) - 1,
        BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_W=block_w, VEC=vec, HFMA2=hfma2, ASM=x.is_cuda,
        EXPERTS=experts is not None, ROW_DIV=row_div, TILED=tiled, num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", LAUNCH_OPTIONS["num_stages"]), **cap,
    )  # fmt: skip
    return out


def _configs(p: Problem, exhaustive: bool) -> list[dict]:
    m, n, k, bits, group_size, sms = p.m, p.n, p.k, p.bits, p.group_size, p.sms
    # (BLOCK_N, BLOCK_W, warps): 8-32 words per thread and tile. Wide tiles read longer runs of
    # each row (BLOCK_W = 64: 256 / 128 bytes for 4 / 8 bits); a tile may span several groups.
    # Per-channel, H200, M = 1 (BENCHMARKS.md, word GEMV tile width): 28672x4096 4-bit 26.4 us
    # at BLOCK_W = 64 against 29.4 at 16; 8-bit 33.2 against 35.1 at 32.
    shapes = (
        ((128, 16, 4), (64, 16, 4), (64, 32, 4), (32, 32, 4), (32, 64, 4), (64, 64, 8), (128, 32, 8), (16, 128, 4), (32, 128, 8))
        if bits == 4
        else ((128, 32, 4), (64, 32, 4), (256, 32, 8), (32, 64, 4), (64, 64, 4), (128, 64, 8), (32, 128, 8))
    )
    plain = []
    for bn, bw, warps in shapes:
        for sp in split_k_choices(k * bits // 32 // tile_words(k, bits, group_size, bw), cdiv(n, bn) * m, sms):
            plain.append({"BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": sp, "num_warps": warps})
    out = list(plain)
    if bits == 4 and p.dtype == torch.bfloat16:
        # HFMA2 = 2: each word pair's 16 products summed in two bf16x2 lanes before float32,
        # the tile loaded as [BLOCK_N, BLOCK_W] blocks: 4.95 SASS instructions per weight byte
        # at 32 x 128 g128 (4.73 per-channel) against 7.4-8.2 for the float32 form (HFMA2 = 1,
        # per word, is the launcher's fallback for tiles of an odd word count)
        for bn, bw, warps in ((32, 128, 4), (16, 256, 4), (8, 128, 2), (8, 256, 4), (8, 512, 4), (16, 128, 2)):  # more rows or longer runs per thread
            for sp in split_k_choices(k * bits // 32 // tile_words(k, bits, group_size, bw), cdiv(n, bn) * m, sms):
                plain.append({"BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": sp, "num_warps": warps})
        out += [{**c, "HFMA2": 2} for c in plain]
    # Opt-in (MAXNREG): a register cap for more resident warps. ncu on the H200 put the shipped
    # 28672x4096 4-bit config at 95 registers, 5 blocks of 4 warps per SM and 0.69 issued warps
    # per scheduler cycle; `qfuse bench sass` with triton 3.6: maxnreg 80 -> 80 registers, no
    # spills, +2 % loop instructions (6 blocks per SM); 64 -> 72 B of spills, +8 %. Timed on the
    # H200 at M = 1: no faster than without a cap on any of 4 shapes x 2 bit widths (e.g. 4-bit
    # 8192x8192 64 x 32 split 4: 20.9 us with cap 80 against 19.7).
    for bn, bw, warps in shapes[:5]:
        for cap in (80, 64):
            for sp in (4, 1):
                out.append({"BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": sp, "num_warps": warps, "MAXNREG": cap})
    return out


def _opt_in(cfg: dict) -> str:
    return "MAXNREG: a register cap, never faster than without on the H200 (M = 1, 4 shapes x 2 bit widths)" if "MAXNREG" in cfg else ""


def _run(cfg, x, qweight, scales, zeros, bias, bits, group_size):
    return wna16_gemv_words(x, qweight, scales, zeros, bias, bits, group_size, cfg)


def _supports(p: Problem) -> tuple[bool, str]:
    if m_bucket(p.m) <= 2 and words_supported(p.k, p.bits, p.group_size):
        return True, ""
    return False, "M bucket > 2, or K not whole int32 words per group"


FAMILY = KernelFamily("gemv_words", "wna16/gemv_words", _supports, _configs, _run, opt_in=_opt_in)
