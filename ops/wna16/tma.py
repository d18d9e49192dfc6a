"""Large-M tile kernel for ``wna16_gemm`` (4- and 8-bit) fed by the Tensor Memory Accelerator.

The math of ``wna16_gemm`` (group ``g = k // GROUP``; ``GROUP == -1``: one group per row)::

    w[n, k]    = dtype( (u[n, k] - z[n, g]) * s[n, g] )          one rounding, as the reference
    out[m, n]  = dtype( sum_k x[m, k] * w[n, k]  (+ bias[n]) )   float32 accumulator

per program: a ``[BLOCK_M tokens, BLOCK_N weight rows]`` output tile over a ``1 / SPLIT_K`` slice
of K, as ``acc^T [BLOCK_N, BLOCK_M] += w_tile @ x_tile^T`` (split-K: the single-launch ordered sum of
ops/wna16/common.py, :func:`finish_split`; for grids of fewer tiles than ~2 per SM, e.g. N = 4096 at
M = 256):

* both operands arrive by TMA (host ``TensorDescriptor``s of ``x [M, K]`` and of the weight bytes,
  ``[N, K / 2]`` bytes for 4-bit, ``[N, K / 2]`` int16 code pairs for 8-bit), multi-buffered by
  Triton's pipeliner; the copy engine zero-fills rows past M / N and columns past K (zero
  activations past K cancel whatever the zero bytes dequantize to), so there are no masks in the loop;
* the weight bytes are dequantized in registers: 4-bit by ops/wna16/tiled_planes.py's PTX planes
  (magic-exponent LOP3 + one packed FMA per code pair), 8-bit by PTX on two code pairs per
  register (PRMT of each byte under the float32 exponent byte 0x4B = ``2**23 + u``, minus
  ``2**23 + z``, exact, packed to the activation dtype; ``|u - z| <= 255`` is exact in bf16 / fp16),
  both as even-k and odd-k planes joined back to natural K order; then multiplied by the group
  scale in the activation dtype. They are wgmma's *register* A operand,
  the activation tile its shared-memory B operand straight from the TMA buffer. Nothing else uses
  the accumulator in the loop, so Triton keeps the wgmma asynchronous (the pointer-fed
  ``tiled_planes`` JOIN form has the same loop with ``cp.async`` loads and address arithmetic).

Per-channel scales multiply the accumulator once, after the loop (``u - z`` is exact in the
activation dtype). Needs 16-byte weight rows: ``K % 32 == 0`` for 4-bit, ``K % 16 == 0`` for 8-bit
(:func:`tma_supported`).

**What ptxas does with this loop** (triton 3.6's CUDA 12.8 ptxas, sm_90 SASS; ``qfuse bench sass
tiled_tma`` prints it, tests/ops/test_wna16_tma.py checks it on the CPU):

* With the accumulator's zeros written as a constant, LLVM rematerialized them on the loop's
  zero-trip edge, and ptxas then found non-wgmma instructions defining accumulator registers
  inside the wgmma pipeline and serialized every wgmma of the loop (``C7515``; SASS:
  ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after each one, though the PTX waits for 3). At split 1 that
  was every 8-bit tile shape the dispatcher offers and 8 of the 14 4-bit ones (the 64-token tiles,
  128 x 128, 128 x 256, 256 x 128 x 128). :func:`accumulator_zeros` writes them with an asm
  ``mov`` that stays before the loop: every offered tile now keeps wgmmas in flight (triton 3.6:
  3 of a BLOCK_K 64 tile's 4, 7 of a BLOCK_K 128 tile's 8).
* The former 8-bit path (codes as uint8, ``(u | 0x4B000000) - (2**23 + z)`` in Triton ops) came
  out asynchronous in 8 of the 14 tile shapes at split 2, and in all 8 ptxas wrote the next K
  tile's register A operands and scales while the wgmmas that read them were still in flight,
  which PTX leaves undefined. The 8-warp ones among them computed wrong results on the H200 (up
  to a third of the output's range), which the interpreter computes right. With
  the zeros fixed, that source did it in all 5 tiles checked. The PTX pair planes above do not:
  no such write in any of 56 (tile shape, split, quant form) compiles, 4- and 8-bit, triton 3.6
  and 3.7.1. The 8-warp and ``TAIL_SPLIT`` 8-bit tiles are offered again.

Those register writes are a known Triton bug, triton-lang/triton#9433 (open): the pipeliner's wait
after a dot whose A operand is in registers guarantees only that the first of its wgmmas is done
when the next K tile's values are computed, so whether a tile is hit depends on ptxas's register
allocation. tests/ops/test_wna16_gemm_kernel.py checks every default-offered config's SASS for it.

**``WORDS``** (4-bit, ``K % BLOCK_K == 0``; offered for the 64-token 128-deep and the 256-token 64-deep
tiles, opt-in for the rest: ops/wna16/dispatch.py, ``_words_offered``; right in every GPU test):
the bytes path above reads the weight tile from shared memory one byte per ``LDS.U8`` and
gathers the bytes with PRMTs, because wgmma's A fragment gives a lane the k pairs ``(2c, 2c + 1)``,
``(2c + 8, 2c + 9)`` of every 16-deep step: strided bytes. ``WORDS`` takes ops/wna16/mma_words.py's
way instead: int32 words by TMA, :func:`word_planes` (a word's 8 codes straight into one lane's A
registers of two steps, 11 instructions per word, 15 with the group scale), and the activations
permuted to the same order once per call (:func:`word_order_triton`, a copy of ``x``). sm_90 SASS of the
loop, triton 3.6, g128 bf16: 16 x 128 x 128 / 4 warps 398 instructions against 653, 256 x 128 x 64
/ 8 warps 185 against 229. Without a drain that loop hits triton#9433 in every tile checked, so
each K tile first waits for the last one's wgmmas (``_DRAINED``: one ``wgmma.wait_group 0`` per 4
words a thread holds): no write under a wgmma in flight, but this K tile's dequantization no
longer overlaps the last one's MMAs in the same warps. On the H200 (g128 bf16,
28672x4096 / 4096x14336 / 8192x8192) against the best other config: M = 64 1.19x / 1.01x / 1.07x,
M = 16 0.88x / 0.81x / 0.83x, M = 256 1.04x / 0.86x / 0.97x, M = 1024 1.01x / 0.83x / 0.94x;
re-tuned with the 256-token tiles offered, it is picked at M = 256-2048 on 28672x4096,
1.02-1.05x the byte-path picks there.

Not warp-specialized: ``tl.range(..., warp_specialize=True)`` on this loop (triton 3.6, H200;
it compiled only for 64-row weight tiles at 4 warps) ran 1.5-3.0x slower than
the shipped picks at M = 16-1024, and with split-K it computed wrong sums and left the persistent
split-K counters nonzero, so later launches went wrong too (BENCHMARKS.md).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket, sm_count
from .._launch import launch
from .._tma import tma_aligned
from ..kernel_family import KernelFamily, Problem
from .common import cdiv, codes_minus_zero, grouped_tile, mma, output_buffers, split_for, split_workspace, store_tile, weight_major_tiles
from .mma_words import magic_pair
from .tiled import split_k_slices
from .tiled_planes import planes_in_k_order

# compile options of a launch where the config does not set them (``qfuse.bench.sass.compile_sass`` compiles with the same)
LAUNCH_OPTIONS = {"num_stages": 3}

# 8-bit: one register of two int16 code pairs, bytes b0..b3 = u[k], u[k + 1], u[k'], u[k' + 1] (k, k' even).
# Each byte becomes the float32 2**23 + u (PRMT with the exponent byte 0x4B), minus 2**23 + z (exact),
# packed to the activation dtype: $0 = the even-k plane (u0 - z, u2 - z), $1 = the odd-k plane (u1 - z, u3 - z).
_BYTE_PAIRS_BF16 = tl.constexpr("""{
.reg .b32 f0, f1, f2, f3;
prmt.b32 f0, $2, 0x4B000000, 0x7440;
prmt.b32 f1, $2, 0x4B000000, 0x7441;
prmt.b32 f2, $2, 0x4B000000, 0x7442;
prmt.b32 f3, $2, 0x4B000000, 0x7443;
sub.f32 f0, f0, $3;
sub.f32 f1, f1, $3;
sub.f32 f2, f2, $4;
sub.f32 f3, f3, $4;
cvt.rn.bf16x2.f32 $0, f2, f0;
cvt.rn.bf16x2.f32 $1, f3, f1;
}""")
_BYTE_PAIRS_FP16 = tl.constexpr(_BYTE_PAIRS_BF16.value.replace("cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32"))


@triton.jit
def byte_pair_planes(h, z, dtype: tl.constexpr, ASM: tl.constexpr, BLOCK_N: tl.constexpr, W: tl.constexpr):
    """int16 code pairs ``h [BLOCK_N, W]`` (low byte k = 2j, high byte 2j + 1) -> the even-k and
    odd-k planes ``u - z`` as ``dtype [BLOCK_N, W]`` (exact); ``z``: float32 ``[BLOCK_N]``."""
    zc = tl.broadcast_to((z + 8388608.0)[:, None], (BLOCK_N, W))
    if ASM:
        if dtype == tl.bfloat16:
            return tl.inline_asm_elementwise(_BYTE_PAIRS_BF16, "=r,=r,r,r,r", [h, zc], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)
        else:
            return tl.inline_asm_elementwise(_BYTE_PAIRS_FP16, "=r,=r,r,r,r", [h, zc], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)
    else:
        hv = h.to(tl.int32)
        return codes_minus_zero(hv & 255, zc).to(dtype), codes_minus_zero((hv >> 8) & 255, zc).to(dtype)


@triton.jit
def accumulator_zeros(BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, ASM: tl.constexpr):
    """float32 zeros ``[BLOCK_N, BLOCK_M]``; on the GPU made by an asm ``mov`` that stays where it is
    written, before the loop: a constant let LLVM rematerialize the zeros on the loop's zero-trip
    edge, and ptxas then serialized every wgmma of the loop (C7515, see the module docstring)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "mov.b32 $0, 0;", "=r,r", [tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)], dtype=tl.float32, is_pure=False, pack=1
        )
    else:
        return tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)


def _word_pairs_asm(magic: int, ty: str, scaled: bool) -> str:
    """One int32 word (``$4``; ``$5`` the same word) -> its 4 code pairs p = nibbles (p, p + 4) as
    packed ``u - z`` (``$6`` = the pair -(MAGIC + z)) or, ``scaled``, ``dtype((u - z) * s)`` (``$7`` =
    the pair s), each in a 32-bit output: ops/wna16/mma_words.py's trick, add / mul instead of fma
    (sm_90 has bf16x2 add and mul; fma's constant 1.0 took a register that ptxas then reused as an
    A operand of a wgmma in flight)."""
    body = ""
    for p in range(4):
        body += magic_pair("$4", p, magic)
        body += f"add.rn.{ty} v, v, $6;\nmul.rn.{ty} ${p}, v, $7;\n" if scaled else f"add.rn.{ty} ${p}, v, $6;\n"
    return "{\n.reg .b32 v, t;\n" + body + "}"


_WORD_PAIRS = {
    (dt, scaled): tl.constexpr(_word_pairs_asm(magic, ty, scaled))
    for dt, magic, ty in (("bf16", 0x43004300, "bf16x2"), ("fp16", 0x64006400, "f16x2"))
    for scaled in (False, True)
}
_WORD_PAIRS_BF16, _WORD_PAIRS_BF16_SCALED = _WORD_PAIRS["bf16", False], _WORD_PAIRS["bf16", True]
_WORD_PAIRS_FP16, _WORD_PAIRS_FP16_SCALED = _WORD_PAIRS["fp16", False], _WORD_PAIRS["fp16", True]
# 4 registers unchanged, after every wgmma in flight is done
_DRAINED = tl.constexpr("wgmma.wait_group.sync.aligned 0;\nmov.b32 $0, $4;\nmov.b32 $1, $5;\nmov.b32 $2, $6;\nmov.b32 $3, $7;")


@triton.jit
def word_planes(words, z, s, dtype: tl.constexpr, SCALED: tl.constexpr, ASM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """int32 ``words [BLOCK_N, 4, Q]`` (word ``Qc + q`` of a row's ``BLOCK_K`` codes, ``Q = BLOCK_K / 32``)
    -> ``u - z`` (``SCALED``: ``dtype((u - z) * s)``, the reference's one rounding) as ``dtype
    [BLOCK_N, BLOCK_K]`` in the order :func:`word_order` gives the activations: pair p of word
    ``Qc + q`` (nibbles p, p + 4; ``p = 2sl + h``, e = 0 / 1) at ``k' = 32q + 16sl + 8h + 2c + e``,
    which puts a word's 8 codes in lane c's A registers of 16-deep steps ``2q`` and ``2q + 1``.
    ``z``, ``s``: per row (float32, ``dtype``; ``s`` unused without ``SCALED``). Each asm output is a
    32-bit register of one pair."""
    Q: tl.constexpr = BLOCK_K // 32
    MAGIC: tl.constexpr = 128.0 if dtype == tl.bfloat16 else 1024.0
    shape: tl.constexpr = (BLOCK_N, 4, Q, 2)
    if ASM:  # wgmma.wait_group 0 first (once per 4 words a thread holds): Triton's pipelined wait leaves wgmmas of
        # the last K tile in flight whose register A operands this tile's values would overwrite
        # (triton-lang/triton#9433; `qfuse bench sass tiled_tma` finds such writes in this loop without it).
        # Pure, so Triton's layouts propagate through it (impure, the words came in a blocked layout plus
        # shuffles); it cannot move before this tile's words are loaded
        words = tl.inline_asm_elementwise(_DRAINED, "=r,=r,=r,=r,r,r,r,r", [words], dtype=tl.int32, is_pure=True, pack=4)
    w2 = tl.join(words, words)  # [n, c, q, e]: the word twice, so that a pair (e = 0, 1) is one packed register
    neg = tl.broadcast_to((-(z + MAGIC)).to(dtype)[:, None, None, None], shape)
    if ASM:
        if SCALED:
            s2 = tl.broadcast_to(s[:, None, None, None], shape)
            if dtype == tl.bfloat16:
                p0, p1, p2, p3 = tl.inline_asm_elementwise(
                    _WORD_PAIRS_BF16_SCALED, "=r,=r,=r,=r,r,r,r,r", [w2, neg, s2], dtype=(tl.bfloat16,) * 4, is_pure=True, pack=2
                )
            else:
                p0, p1, p2, p3 = tl.inline_asm_elementwise(
                    _WORD_PAIRS_FP16_SCALED, "=r,=r,=r,=r,r,r,r,r", [w2, neg, s2], dtype=(tl.float16,) * 4, is_pure=True, pack=2
                )
        else:
            if dtype == tl.bfloat16:
                p0, p1, p2, p3 = tl.inline_asm_elementwise(
                    _WORD_PAIRS_BF16, "=r,=r,=r,=r,r,r,r", [w2, neg], dtype=(tl.bfloat16,) * 4, is_pure=True, pack=2
                )
            else:
                p0, p1, p2, p3 = tl.inline_asm_elementwise(
                    _WORD_PAIRS_FP16, "=r,=r,=r,=r,r,r,r", [w2, neg], dtype=(tl.float16,) * 4, is_pure=True, pack=2
                )
    else:
        e = tl.arange(0, 2)[None, None, None, :]
        zf = z[:, None, None, None]
        sf = s.to(tl.float32)[:, None, None, None]  # unused without SCALED
        p0 = _pair_values(w2, e, 0, zf, sf, dtype, SCALED)
        p1 = _pair_values(w2, e, 1, zf, sf, dtype, SCALED)
        p2 = _pair_values(w2, e, 2, zf, sf, dtype, SCALED)
        p3 = _pair_values(w2, e, 3, zf, sf, dtype, SCALED)
    a = tl.join(tl.join(p0, p1), tl.join(p2, p3))  # [n, c, q, e, h, sl]
    return tl.reshape(tl.permute(a, (0, 2, 5, 4, 1, 3)), (BLOCK_N, BLOCK_K))  # [n, q, sl, h, c, e]: k' order


@triton.jit
def _pair_values(w2, e, p: tl.constexpr, zf, sf, dtype: tl.constexpr, SCALED: tl.constexpr):
    """The interpreter's pair p (nibble p + 4e of each word), as the PTX computes it."""
    v = ((w2 >> (4 * p + 16 * e)) & 15).to(tl.float32) - zf
    if SCALED:
        v = v * sf
    return v.to(dtype)


@triton.jit(do_not_specialize=["M"])
def _wna16_tma_kernel(
    x_desc, w_desc, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, M, N, K, G, K_PER_SPLIT,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ASM: tl.constexpr, DOT_F32: tl.constexpr, TAIL_SPLIT: tl.constexpr, FULL_TILES, WORDS: tl.constexpr = False,
):  # fmt: skip
    pid_k = tl.program_id(1)
    k_start = pid_k * K_PER_SPLIT
    tile = tl.program_id(0)
    if TAIL_SPLIT > 1:  # the tail launch of TAIL_SPLIT: the tiles from FULL_TILES on (past the last whole wave)
        tile += FULL_TILES
    pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N  # rows past N read row n % N's scales (their outputs are masked)
    dtype: tl.constexpr = x_desc.dtype

    if HAS_ZEROS:
        z = tl.load(z_ptr + rn * G + (tl.minimum(k_start // GROUP, G - 1) if GROUP != -1 else 0)).to(tl.float32)
    else:
        z = tl.full((BLOCK_N,), float(1 << (BITS - 1)), tl.float32)
    acc = accumulator_zeros(BLOCK_N, BLOCK_M, ASM)
    for kt in range(0, tl.cdiv(K_PER_SPLIT, BLOCK_K)):
        k0 = k_start + kt * BLOCK_K
        if GROUP != -1:  # BLOCK_K <= GROUP: the tile lies in group k0 // GROUP (clamped: tiles past K)
            g = tl.minimum(k0 // GROUP, G - 1)
            s = tl.load(s_ptr + rn * G + g)
            if HAS_ZEROS:
                z = tl.load(z_ptr + rn * G + g).to(tl.float32)
        xt = x_desc.load([pid_m * BLOCK_M, k0])  # [BLOCK_M, BLOCK_K]
        if WORDS:  # 4-bit int32 words in wgmma's lane order; the activations arrive permuted the same (word_order)
            words = tl.reshape(w_desc.load([pid_n * BLOCK_N, k0 // 8]), (BLOCK_N, 4, BLOCK_K // 32))  # [n, c, q]: word Qc + q
            if GROUP != -1:
                w = word_planes(words, z, s, dtype, True, ASM, BLOCK_N, BLOCK_K)  # k' order, scaled
            else:  # per-channel: the scale after the loop (s unused: z stands in for it)
                w = word_planes(words, z, z, dtype, False, ASM, BLOCK_N, BLOCK_K)
        elif BITS == 4:
            b = w_desc.load([pid_n * BLOCK_N, k0 // 2])  # [BLOCK_N, BLOCK_K / 2] bytes: k = 2j low nibble, 2j + 1 high
            w = planes_in_k_order(b, z, dtype, ASM, False, BLOCK_N, BLOCK_K)  # u - z, exact
        else:
            h = w_desc.load([pid_n * BLOCK_N, k0 // 2])  # [BLOCK_N, BLOCK_K / 2] int16 code pairs (k = 2j, 2j + 1)
            even, odd = byte_pair_planes(h, z, dtype, ASM, BLOCK_N, BLOCK_K // 2)  # u - z, exact
            w = tl.reshape(tl.join(even, odd), (BLOCK_N, BLOCK_K))
        if GROUP != -1 and not WORDS:  # scaled_weights(w, s, dtype, DOT_F32), written out: through the call, triton 3.6
            # scheduled the 256x64x64 g64 split-4 tile differently, and these loops ran on the H200 as is
            if DOT_F32:  # the interpreter has no bf16 arithmetic: float32, then round
                w = (w.to(tl.float32) * s.to(tl.float32)[:, None]).to(dtype)
            else:
                w = w * s[:, None]
        acc = mma(w, tl.trans(xt), acc, DOT_F32)

    store_tile(tl.trans(acc), s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_m, offs_n, pid_k, M, N, G, GROUP, HAS_BIAS, SPLIT_K)


def word_order(x: Tensor, block_k: int) -> Tensor:
    """``x [M, K]`` with each ``block_k`` tile's columns in the order ``WORDS`` gives the MMA the
    codes (a copy): natural ``k = 8w + 4e + 2sl + h`` of word ``w = Qc + q`` (``Q = block_k / 32``)
    at ``k' = 32q + 16sl + 8h + 2c + e``, the order of ops/wna16/mma_words.py. Plain torch: the
    reference of :func:`word_order_triton`."""
    m, k = x.shape
    q = block_k // 32
    return x.reshape(m, k // block_k, 4, q, 2, 2, 2).permute(0, 1, 3, 5, 6, 2, 4).reshape(m, k)


@triton.jit
def _word_order_kernel(x_ptr, out_ptr, M, K, stride_m, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr):
    """:func:`word_order` of a ``[BLOCK_M, TILES * BLOCK_K]`` block: loaded and stored as whole
    contiguous rows (16-byte vectors in sm_90 PTX), the columns permuted in registers."""
    Q: tl.constexpr = BLOCK_K // 32
    W: tl.constexpr = TILES * BLOCK_K
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * W + tl.arange(0, W)
    rows, mask = rm[:, None].to(tl.int64), (rm < M)[:, None]
    v = tl.load(x_ptr + rows * stride_m + cols[None, :], mask=mask)
    v = tl.permute(tl.reshape(v, (BLOCK_M, TILES, 4, Q, 2, 2, 2)), (0, 1, 3, 5, 6, 2, 4))  # [m, tile, c, q, e, sl, h] -> k' order
    tl.store(out_ptr + rows * K + cols[None, :], tl.reshape(v, (BLOCK_M, W)), mask=mask)


def word_order_triton(x: Tensor, block_k: int) -> Tensor:
    """:func:`word_order` in one launch (``K % block_k == 0``), blocks of 16 rows by 256 columns.
    ATen's copy of the 7-d permuted view ran at 1.2 TB/s on an H100 (27.5 us for [2048, 4096]
    bf16, the Llama-3-8B prefill's activations); a gather of 2-byte elements took 41 us."""
    m, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    tiles = math.gcd(k // block_k, max(1, 256 // block_k))  # 256 columns a block where K allows
    out = torch.empty((m, k), dtype=x.dtype, device=x.device)
    if m:
        grid = (triton.cdiv(m, 16), k // (tiles * block_k))
        launch(_word_order_kernel, grid, x, out, m, k, x.stride(0), BLOCK_M=16, BLOCK_K=block_k, TILES=tiles, num_warps=4)
    return out


def tma_supported(k: int, bits: int = 4) -> bool:
    """Whether the descriptors can take this K: 16-byte rows of weight bytes (K * bits / 8) and of activations."""
    return k % (32 if bits == 4 else 16) == 0


def wna16_tma(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int, cfg: dict) -> Tensor:
    """Launch with config ``cfg`` (BLOCK_M / N / K, SPLIT_K, GROUP_M, num_warps, num_stages;
    arguments already checked by the op)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    n = qweight.shape[0]
    if not tma_supported(k, bits):
        raise ValueError(f"wna16_tma: K={k} is not a multiple of {32 if bits == 4 else 16} (16-byte TMA rows of {bits}-bit codes)")
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    bk = cfg["BLOCK_K"] if group_size == -1 else min(cfg["BLOCK_K"], group_size)
    split_k = cfg.get("SPLIT_K", 1)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    # TAIL_SPLIT (opt-in): the tiles past the last whole wave of WAVE programs (TAIL_WAVE per SM, or
    # WAVE_PROGRAMS: tests) run in a second launch as TAIL_SPLIT slices of K each, so the last wave
    # is not mostly idle (one launch that did both ran 1.5x slower on the H200: its two epilogues
    # took 255 registers and spilled, sm_90 SASS; timed in a tune)
    tail_split = cfg.get("TAIL_SPLIT", 0) if split_k == 1 else 0
    full = tiles
    if tail_split > 1:
        wave = cfg.get("WAVE_PROGRAMS") or cfg.get("TAIL_WAVE", 1) * sm_count(x.device)
        full = tiles // wave * wave
    k_per_split, _ = split_k_slices(k, bk, split_k)  # whole BLOCK_K tiles per split; TMA zero-fills past K
    out, ws, counts = output_buffers(x, n, split_k, tiles)
    words = bool(cfg.get("WORDS", False))
    if words and (bits != 4 or k % bk):
        raise ValueError(f"wna16_tma: WORDS needs 4-bit codes and K % BLOCK_K == 0; got bits={bits}, K={k}, BLOCK_K={bk}")
    x, qweight = tma_aligned(word_order_triton(x, bk) if words else x.contiguous()), tma_aligned(qweight.contiguous())
    if words:  # int32 words [N, K / 8]
        w_desc = TensorDescriptor.from_tensor(qweight.view(torch.int32), [bn, bk // 8])
    else:  # 8-bit: the code bytes as int16 pairs [N, K / 2] (the kernel's PTX takes two pairs per register)
        w_desc = TensorDescriptor.from_tensor(qweight if bits == 4 else qweight.view(torch.int16), [bn, bk // 2])
    args = (
        TensorDescriptor.from_tensor(x, [bm, bk]),
        w_desc,
        scales,
        zeros if zeros is not None else qweight,
        bias if bias is not None else scales,
        out,
    )
    consts = dict(
        BITS=bits,
        GROUP=group_size,
        HAS_ZEROS=zeros is not None,
        HAS_BIAS=bias is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=cfg.get("GROUP_M", 8),
        ASM=x.is_cuda,
        DOT_F32=not x.is_cuda,
        WORDS=words,
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", LAUNCH_OPTIONS["num_stages"]),
    )
    if full:  # every tile, or with TAIL_SPLIT the whole waves
        launch(_wna16_tma_kernel, (full, split_k),
            *args, ws, counts, m, n, k, scales.shape[1], k_per_split, SPLIT_K=split_k, TAIL_SPLIT=0, FULL_TILES=0, **consts
        )  # fmt: skip
    if full < tiles:  # the tail: its own K slices, float32 partials and arrival counters
        launch(_wna16_tma_kernel, (tiles - full, tail_split),
            *args,
            *split_workspace(x, n, tail_split, tiles - full),
            m,
            n,
            k,
            scales.shape[1],
            split_k_slices(k, bk, tail_split)[0],
            SPLIT_K=tail_split,
            TAIL_SPLIT=tail_split,
            FULL_TILES=full,
            **consts,
        )  # fmt: skip
    return out


def _configs(p: Problem, exhaustive: bool) -> list[dict]:
    m, n, k, sms = p.m, p.n, p.k, p.sms
    mb = m_bucket(m)
    gk = p.group_size if p.group_size > 0 else 256
    out = []
    # at M bucket 64 also tiles of 64 tokens with fewer weight rows (more programs); at 16-32
    # tiles of the bucket's tokens (wgmma's N = 16 / 32), whose wgmmas stay asynchronous in SASS,
    # against mma_words whose wgmma waits every iteration
    small = [(64, 128, 64, 4, 4), (64, 64, 128, 4, 4), (64, 128, 128, 4, 3)] if mb == 64 else []
    # (5 / 6 stages of these: 0.88-0.98x the best shallower config at M = 64, H200)
    if mb <= 32:
        small = [(mb, 128, 128, 4, 4), (mb, 64, 128, 4, 4), (mb, 128, 64, 4, 4), (mb, 256, 64, 8, 4)]
    for bm, bn, bk, warps, stages in small + weight_major_tiles(mb, exhaustive):
        bk = min(bk, gk)
        # split-K where the grid has fewer than ~2 tiles per SM (N = 4096 or 8192 at M = 256)
        # (at most 4, 8 for the decode tiles: each split adds a float32 [M, N] partial to write and reread)
        split = split_for(cdiv(m, bm) * cdiv(n, bn), k, bk, sms)
        for sp in [s for s in (1, 2, 4, 8) if s <= split and (s < 8 or bm <= 32)]:
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sp, "GROUP_M": 8, "num_warps": warps, "num_stages": stages})
            # the int32 words in wgmma's lane order, the activations permuted to match once per call
            # (ops/wna16/tma.py, WORDS; sm_90 SASS: loop 19-39 % shorter, but a wgmma drain per K tile);
            # offered for the 64-token 128-deep and 256-token 64-deep tiles only (_words_offered)
            if p.bits == 4 and k % bk == 0:
                out.append({**out[-1], "WORDS": True})
        # opt-in: the tiles past the last whole wave split 2 ways along K, in a second launch (M = 512
        # on 28672x4096: 448 tiles of 256x128 at one program per SM are 3.39 waves); TAIL_WAVE:
        # programs per SM of the tile (sm_90 registers: 256x128 / 8 warps 172 -> 1; 256x64 / 4
        # warps 170 -> 2). H200, M = 256 / 1024 on the three large shapes: 1.09-1.22x the best
        # config's time where a tail exists (the float32 partials cost more than the idle part of
        # the last wave; split 4 1.17-1.33x), so never picked
        if mb >= 256 and bm == 256:
            out.append(
                {
                    "BLOCK_M": bm,
                    "BLOCK_N": bn,
                    "BLOCK_K": bk,
                    "SPLIT_K": 1,
                    "GROUP_M": 8,
                    "num_warps": warps,
                    "num_stages": stages,
                    "TAIL_SPLIT": 2,
                    "TAIL_WAVE": 1 if warps == 8 else 2,
                }
            )
    return out


def _opt_in(cfg: dict) -> str:
    if "TAIL_SPLIT" in cfg:
        return "TAIL_SPLIT: right on the H200, 1.09-1.33x the best config's time where a tail exists"
    if cfg.get("WORDS") and not _words_offered(cfg):
        return "WORDS: offered for the 64 x 128 and 256 x 64 tiles only (elsewhere 0.83-0.97x on the H200)"
    return ""


def _words_offered(cfg: dict) -> bool:
    """The ``WORDS`` TMA tiles offered by default: 64 tokens 128 codes deep (M bucket 64), and 256
    tokens 64 deep (M bucket >= 128). H200 (right in every GPU test; tunes of g128 bf16 on the three
    large shapes): at M = 64 the fastest config on all three, 1.19x / 1.01x / 1.07x the best other
    (28672x4096: 42.2 against 50.1 us); at M = 16 14-24 % slower than ``mma_words``; at M = 256 /
    1024 on 28672x4096 the fastest, 1.04x / 1.03x the best other (100.9 against 105.1 us, 348.0
    against 359.6), on 4096x14336 and 8192x8192 0.83-0.97x (the tuner keeps the bytes path there);
    elsewhere opt-in (BENCHMARKS.md)."""
    return (cfg.get("BLOCK_M") == 64 and cfg.get("BLOCK_K") == 128) or (cfg.get("BLOCK_M") == 256 and cfg.get("BLOCK_K") == 64)


def _run(cfg, x, qweight, scales, zeros, bias, bits, group_size):
    return wna16_tma(x, qweight, scales, zeros, bias, bits, group_size, cfg)


def _supports(p: Problem) -> tuple[bool, str]:
    if not p.tma:
        return False, "no TMA on this GPU (compute capability < 9.0)"
    if m_bucket(p.m) >= 16 and tma_supported(p.k, p.bits):
        return True, ""
    return False, "M bucket < 16, or weight rows not 16-byte multiples"


FAMILY = KernelFamily("tiled_tma", "wna16/tma", _supports, _configs, _run, opt_in=_opt_in)
