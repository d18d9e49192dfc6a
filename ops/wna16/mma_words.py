"""Decode-M tensor-core kernel for 4-bit ``wna16_gemm``: the natural int4 packing read as int32
words straight into wgmma's register A operand, the activations permuted to match.

The A operand of a 16-bit ``m16n8k16`` / wgmma tile gives lane ``l`` (``c = l % 4``) of each row
the k pairs ``(2c, 2c + 1)`` and ``(2c + 8, 2c + 9)`` of every 16-deep step: 8 codes per row per
32 k, and an int32 word of the natural packing (ops/int4_packing.py) holds 8 codes. So the
kernel gives the MMA the codes in the order the words hold them instead of natural K order:
the sum over k does not depend on the order, as long as the activations are permuted the same.
Per 128-code tile of a row, word ``w = 4c + q`` (c, q in 0..3) holds natural
``k = 8w + i``, nibble ``i = 4e + 2sl + h`` (e, sl, h in {0, 1}), and the MMA sees it at::

    k' = 32q + 16sl + 8h + 2c + e            (a permutation of 0..127)

which puts the 8 codes of word ``4c + q`` exactly in lane c's A registers of 16-deep steps
``2q`` and ``2q + 1``. Triton's layout propagation then loads each lane's 4 words of a row with
one 16-byte shared-memory load and needs no shuffle (TTGIR: the word tile's ``local_load`` is
already in the dot-operand layout; sm_90 SASS of the loop: no PRMT on the weight side).
The activation tile is permuted in registers (``reshape`` + ``permute``) on its way to the
MMA's shared-memory B operand.

Per word, pair ``p`` in 0..3 is nibbles ``p`` and ``p + 4``, bits ``4p`` and ``16 + 4p``
(Marlin's trick, kernel_anchors.md section 3; MAGIC = 128.0 for bf16, 1024.0 for fp16)::

    v_p = ((word >> 4p) & 0x000F000F) | (MAGIC, MAGIC)     = (MAGIC + u_p, MAGIC + u_{p+4})
    v_p = v_p + (-(MAGIC + z), -(MAGIC + z))                = u - z, exact     (one packed FMA)
    SCALE_W:  v_p = v_p * (s, s)          = dtype((u - z) * s), the reference's one rounding

11 instructions per 8 codes (15 with SCALE_W), against ~24 for the CUDA-core word GEMV
(ops/wna16/gemv_words.py). Whole loop, sm_90 SASS (triton 3.6, bf16, ``qfuse bench sass
mma_words``), per weight byte: g128 4.7 (128 rows, 4 warps) / 5.4 (128 rows, 8 warps),
per-channel 4.8, SCALE_W g128 6.2; the word GEMV 8.2-9.5. Then, per 128-code tile (``g`` its
group)::

    acc[n, m] += (sum_k' (u - z)[n, k'] * x[m, k']) * s[n, g]     GROUP % 128 == 0 (one wgmma chain)
    acc[n, m] += sum_k' w_hat[n, k'] * x[m, k']                   SCALE_W (GROUP % 32 == 0)
    acc[n, m] *= s[n] after the loop                              per-channel (GROUP == -1)

``BYTE_PAIRS`` (opt-in: 12-19 % slower than the plain form on the H200, fp16 g128, 6144x4096
and 8192x8192 at M = 1-16; not profiled): pair p is instead the two nibbles of byte p
(natural k, k + 1; one PRMT each, +2 instructions per word), i.e. natural
``k = 32c + 8q + 4sl + 2h + e``. Each activation pair is then two adjacent values, so the
activation tile is a gathered load of 4-byte pieces that Triton pipelines by ``cp.async``
straight into the MMA's B buffer: no shared-memory store in the loop, and where nothing
rescales the accumulator inside the loop (per-channel, SCALE_W) the wgmma stays asynchronous
(PTX ``wgmma.wait_group 7`` against 0), overlapping the next tile's dequantization.

Timed on the H200 and dropped (M = 16, three large shapes): the next one or two
tiles' words loaded straight into registers an iteration ahead instead of by cp.async stages
(1.48-1.50x slower: Triton then takes the dequantized tile through shared memory, STSM / LDSM, to
reach wgmma's layout), and 6 or 8 stages (0.91-0.99x the best shallower config).

One program: a ``[BLOCK_N, BLOCK_M]`` tile of ``out^T`` (weight rows are wgmma's 64-row M side,
the few tokens its N side) over a ``1 / SPLIT_K`` slice of K, split-K through the shared
deterministic reduction (``store_tile``). Needs K % 128 == 0. Against the reference: float32
summation order and, without SCALE_W, the scale applied to a tile's partial dot instead of a
rounded ``w_hat`` (tolerance in the tests). The Triton interpreter cannot run inline PTX: there
(``ASM=False``) the same values come from integer and float32 ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket, split_k_choices
from .._launch import launch
from .._views import aligned_view
from ..kernel_family import KernelFamily, Problem
from .common import cdiv, mma, output_buffers, split_for, store_tile, tile_coords, tile_major_rows

# One word -> 4 pairs of 16-bit values. $8 the word, $9 -(MAGIC + z), ($10 the scale). Pair p is
# nibbles (p, p + 4), in place at bits 4p and 16 + 4p after one shift; with BYTE_PAIRS it is the
# byte's two nibbles (2p, 2p + 1), moved to bits 0 and 16 by one PRMT of the word and the word
# shifted right by 4 (selector: byte p of each into bytes 0 and 2). fma with 1.0 (and with -0.0
# for the product) instead of add / mul: sm_80's bf16x2 arithmetic has only fma (add.bf16x2 and
# mul.bf16x2 need sm_90). _PAIR: the pair in v (:func:`magic_pair`) less MAGIC + z, times s.
_PAIR = """fma.rn.TYPE v, v, one, nz;{scale}
mov.b32 {{${lo}, ${hi}}}, v;
"""


def _dequant_asm(magic: int, one: int, ty: str, scaled: bool, byte_pairs: bool) -> str:
    body = "shr.u32 w4, $8, 4;\n" if byte_pairs else ""
    for p in range(4):
        if byte_pairs:  # byte p's nibbles into bits 0 and 16 of t: t's pair 0
            body += f"prmt.b32 t, $8, w4, {(p | p << 4 | (4 + p) << 8 | (4 + p) << 12):#x};\n" + magic_pair("t", 0, magic)
        else:
            body += magic_pair("$8", p, magic)
        body += _PAIR.format(lo=2 * p, hi=2 * p + 1, scale="\nfma.rn.TYPE v, v, s2, negzero;" if scaled else "")
    head = f".reg .b32 v, t, w4, one, nz{', s2, negzero' if scaled else ''};\nmov.b32 one, {one:#x};\nmov.b32 nz, {{$9, $9}};\n"
    if scaled:
        head += "mov.b32 s2, {$10, $10};\nmov.b32 negzero, 0x80008000;\n"
    return "{\n" + head + body.replace("TYPE", ty) + "}"


def magic_pair(word: str, p: int, magic: int) -> str:
    """PTX of code pair ``p`` (nibbles p, p + 4) of the int32 operand ``word`` into register ``v`` as
    ``(MAGIC + u_p, MAGIC + u_{p+4})`` (``magic``: MAGIC in both 16-bit halves): a shift into ``t``
    (p > 0), then one lop3 (0xEA: (a & b) | c). The caller declares ``.reg .b32 v, t``."""
    shift = f"shr.u32 t, {word}, {4 * p};\n" if p else ""
    return shift + f"lop3.b32 v, {'t' if p else word}, 0x000F000F, {magic:#x}, 0xEA;\n"


def _magic_asm(magic: int) -> str:
    """One word -> 4 pairs ``MAGIC + u`` (no zero point subtracted): lop3 and a shift per pair."""
    body = "".join(magic_pair("$8", p, magic) + f"mov.b32 {{${2 * p}, ${2 * p + 1}}}, v;\n" for p in range(4))
    return "{\n.reg .b32 v, t;\n" + body + "}"


_BF16_MAGIC = tl.constexpr(_magic_asm(0x43004300))
_FP16_MAGIC = tl.constexpr(_magic_asm(0x64006400))
_BF16 = tl.constexpr(_dequant_asm(0x43004300, 0x3F803F80, "bf16x2", False, False))
_BF16_SCALED = tl.constexpr(_dequant_asm(0x43004300, 0x3F803F80, "bf16x2", True, False))
_FP16 = tl.constexpr(_dequant_asm(0x64006400, 0x3C003C00, "f16x2", False, False))
_FP16_SCALED = tl.constexpr(_dequant_asm(0x64006400, 0x3C003C00, "f16x2", True, False))
_BF16_BYTES = tl.constexpr(_dequant_asm(0x43004300, 0x3F803F80, "bf16x2", False, True))
_BF16_SCALED_BYTES = tl.constexpr(_dequant_asm(0x43004300, 0x3F803F80, "bf16x2", True, True))
_FP16_BYTES = tl.constexpr(_dequant_asm(0x64006400, 0x3C003C00, "f16x2", False, True))
_FP16_SCALED_BYTES = tl.constexpr(_dequant_asm(0x64006400, 0x3C003C00, "f16x2", True, True))


# compile options of a launch where the config does not set them (``qfuse bench sass`` compiles with the same)
LAUNCH_OPTIONS = {"num_stages": 3}


@triton.jit
def _run_asm(words, neg, s, TEXT: tl.constexpr, dtype: tl.constexpr, SCALE_W: tl.constexpr):
    if SCALE_W:
        if dtype == tl.bfloat16:
            return tl.inline_asm_elementwise(TEXT, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [words, neg, s], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise(TEXT, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [words, neg, s], dtype=(tl.float16,) * 8, is_pure=True, pack=1)
    else:
        if dtype == tl.bfloat16:
            return tl.inline_asm_elementwise(TEXT, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [words, neg], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise(TEXT, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [words, neg], dtype=(tl.float16,) * 8, is_pure=True, pack=1)


@triton.jit
def magic_pairs(words, dtype: tl.constexpr, ASM: tl.constexpr):
    """int32 ``words`` -> 8 tensors: pairs (nibbles p, p + 4) as ``MAGIC + u`` in ``dtype`` (exact)."""
    if ASM:
        if dtype == tl.bfloat16:
            return tl.inline_asm_elementwise(_BF16_MAGIC, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise(_FP16_MAGIC, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(tl.float16,) * 8, is_pure=True, pack=1)
    else:  # word_pairs' plain form with -(MAGIC + z) = 0: MAGIC + u
        zero = tl.zeros(words.shape, dtype=dtype)
        return word_pairs(words, zero, zero, dtype, False, False, False)


@triton.jit
def word_pairs(words, neg, s, dtype: tl.constexpr, SCALE_W: tl.constexpr, BYTE_PAIRS: tl.constexpr, ASM: tl.constexpr):
    """int32 ``words`` -> 8 tensors of their shape, pairs p = 0..3 as (lo, hi): nibbles
    (p, p + 4), or with BYTE_PAIRS (2p, 2p + 1), as ``u - z`` (``neg`` = -(MAGIC + z) in
    ``dtype``) or, with SCALE_W, ``dtype((u - z) * s)``."""
    if ASM:
        if dtype == tl.bfloat16:
            if BYTE_PAIRS:
                return _run_asm(words, neg, s, _BF16_SCALED_BYTES if SCALE_W else _BF16_BYTES, dtype, SCALE_W)
            else:
                return _run_asm(words, neg, s, _BF16_SCALED if SCALE_W else _BF16, dtype, SCALE_W)
        else:
            if BYTE_PAIRS:
                return _run_asm(words, neg, s, _FP16_SCALED_BYTES if SCALE_W else _FP16_BYTES, dtype, SCALE_W)
            else:
                return _run_asm(words, neg, s, _FP16_SCALED if SCALE_W else _FP16, dtype, SCALE_W)
    else:
        magic = 128.0 if dtype == tl.bfloat16 else 1024.0
        zf = neg.to(tl.float32) + magic  # -z
        sf = s.to(tl.float32)
        out = ()
        for i in tl.static_range(8):
            if BYTE_PAIRS:
                nib = (words >> (4 * i)) & 15
            else:
                nib = (words >> (4 * ((i % 2) * 4 + i // 2))) & 15
            v = nib.to(tl.float32) + zf
            if SCALE_W:
                v = v * sf
            out = out + (v.to(dtype),)
        return out


@triton.jit
def words_neg_zero(z_ptr, rn, dtype: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr):
    """-(MAGIC + z) of rows ``rn`` as ``[BLOCK_N, 1, 1]`` in ``dtype``: the symmetric z = 8, the
    per-channel zero points, or (zero points in groups: loaded per tile) unused."""
    MAGIC: tl.constexpr = 128.0 if dtype == tl.bfloat16 else 1024.0
    if HAS_ZEROS and GROUP == -1:
        neg = (-(tl.load(z_ptr + rn).to(tl.float32) + MAGIC)).to(dtype)[:, None, None]
    else:
        neg = tl.full((BLOCK_N, 1, 1), -(MAGIC + 8.0), tl.float32).to(dtype)
    return neg


@triton.jit
def words_mma_step(
    acc, neg, w0, qw_ptr, s_ptr, z_ptr, x_ptr, rn, rm, KW, G, stride_xm,
    dtype: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, SCALE_W: tl.constexpr, BYTE_PAIRS: tl.constexpr,
    X_WORDS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ASM: tl.constexpr, DOT_F32: tl.constexpr,
    FOLD_ZERO: tl.constexpr = False, xs=None, TILED: tl.constexpr = False,
):  # fmt: skip
    """One 128-code tile (words ``w0 .. w0 + 15`` of rows ``rn``) of the loop of the kernels that
    read int4 words into the MMA (the dense op's and fused_moe's ``grouped_words``): ``acc
    [BLOCK_N, BLOCK_M]`` += the tile's dot with the activation rows ``rm``; ``neg`` from
    :func:`words_neg_zero` (with zero points and groups, each tile loads its own). ``X_WORDS``: the
    activations already in k' order (ops/wna16/tma.py ``word_order``), loaded as they are.
    ``FOLD_ZERO`` (GROUP % 128 == 0, not SCALE_W): the codes go to the MMA as ``MAGIC + u`` (a lop3
    per pair, no packed add) and the tile's dot loses ``(MAGIC + z) * xs`` after it, ``xs
    [BLOCK_M]`` the float32 sums of the activation rows over this tile::

        acc[n, m] += (sum_k' (MAGIC + u)[n, k'] x[m, k'] - (MAGIC + z[n]) * xs[m]) * s[n, g]

    The products are exact; the float32 sums cancel terms up to (MAGIC + 15) times those of the
    plain form (143x in bf16, 1039x in fp16), a few bits of float32's 24.

    ``TILED``: ``qw_ptr``'s words are tile-major (ops/moe/tile_major.py; the tile's words of each 64
    rows one 4 KB run), the same codes at other addresses."""
    BLOCK_K: tl.constexpr = 128
    MAGIC: tl.constexpr = 128.0 if dtype == tl.bfloat16 else 1024.0
    kc = tl.arange(0, 4) * 32  # words (c, 0..3) of a tile hold natural k = 32c .. 32c + 31: one group (GROUP >= 32)
    k0 = w0 * 8
    if TILED:  # tile-major words (ops/moe/tile_major.py): the tile's 16 words of 64 rows are 4 KB in a row; w0 % 16 == 0, so
        # tile_major_cols of its columns is w0 * 64 + 0..15
        words = tl.load(qw_ptr + (tile_major_rows(rn, KW, 16) + w0 * 64)[:, None] + tl.arange(0, 16)[None, :], eviction_policy="evict_first")
    else:
        words = tl.load(qw_ptr + rn[:, None] * KW + (w0 + tl.arange(0, 16))[None, :], eviction_policy="evict_first")
    words = tl.reshape(words, (BLOCK_N, 4, 4))  # [n, c, q]: word 4c + q of the tile
    if SCALE_W:  # scale (and zero point) of each word's group
        if GROUP % 128 == 0:  # one group per tile
            goffs = (rn * G + k0 // GROUP)[:, None, None]
        else:
            # [BLOCK_N, 4, 1]: with this operand Triton 3.6 builds the A tile in shared memory
            # (STS + LDSM: 9.6 SASS instructions per weight byte against 6.2 at g128); the
            # groups below 128 are right, not tuned for speed
            goffs = (rn[:, None] * G + ((k0 + kc) // GROUP)[None, :])[:, :, None]
        s_w = tl.load(s_ptr + goffs)
        if HAS_ZEROS:
            neg = (-(tl.load(z_ptr + goffs).to(tl.float32) + MAGIC)).to(dtype)
    else:
        s_w = tl.full((BLOCK_N, 1, 1), 1.0, tl.float32).to(dtype)  # unused
        if GROUP != -1:
            g = k0 // GROUP
            if HAS_ZEROS:
                neg = (-(tl.load(z_ptr + rn * G + g).to(tl.float32) + MAGIC)).to(dtype)[:, None, None]
    if FOLD_ZERO:
        l0, h0, l1, h1, l2, h2, l3, h3 = magic_pairs(words, dtype, ASM)
    else:
        l0, h0, l1, h1, l2, h2, l3, h3 = word_pairs(words, tl.broadcast_to(neg, (BLOCK_N, 4, 4)), tl.broadcast_to(s_w, (BLOCK_N, 4, 4)),
                                                    dtype, SCALE_W, BYTE_PAIRS, ASM)  # fmt: skip
    # pair p = 2sl + h of word (c, q): [n, c, q, e, h, sl] -> [n, q, sl, h, c, e] = k' order
    a = tl.join(tl.join(tl.join(l0, h0), tl.join(l1, h1)), tl.join(tl.join(l2, h2), tl.join(l3, h3)))
    a = tl.reshape(tl.permute(a, (0, 2, 5, 4, 1, 3)), (BLOCK_N, BLOCK_K))
    if BYTE_PAIRS:
        # natural k = 32c + 8q + 4sl + 2h + e at k' = 32q + 16sl + 8h + 2c + e: each pair (e) is two
        # adjacent activations, so the gathered load is 4-byte cp.async straight into the MMA's
        # shared-memory B buffer, and Triton keeps the wgmma asynchronous (PTX wait_group 7)
        kp = tl.arange(0, BLOCK_K)
        nat = ((kp >> 1) & 3) * 32 + (kp >> 5) * 8 + ((kp >> 4) & 1) * 4 + ((kp >> 3) & 1) * 2 + (kp & 1)
        nat = tl.max_contiguous(tl.multiple_of(nat, 2), 2)
        xt = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + nat)[None, :], eviction_policy="evict_last")
    else:
        xt = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + tl.arange(0, BLOCK_K))[None, :], eviction_policy="evict_last")
        if not X_WORDS:
            # natural k = 32c + 8q + 4e + 2sl + h -> k' = 32q + 16sl + 8h + 2c + e (in registers: the
            # pairs (e) are 4 apart, too fine for an async copy; stored to shared memory in the loop)
            xt = tl.reshape(tl.permute(tl.reshape(xt, (BLOCK_M, 4, 4, 2, 2, 2)), (0, 2, 4, 5, 1, 3)), (BLOCK_M, BLOCK_K))
    if SCALE_W or GROUP == -1:
        acc = mma(a, tl.trans(xt), acc, DOT_F32)
    elif FOLD_ZERO:  # the codes came as MAGIC + u: take (MAGIC + z) * sum_k' x off the tile's dot
        d = mma(a, tl.trans(xt), tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), DOT_F32)
        neg_f = tl.reshape(neg, (BLOCK_N,)).to(tl.float32)  # -(MAGIC + z), exact in dtype
        acc += (d + neg_f[:, None] * xs[None, :]) * tl.load(s_ptr + rn * G + g).to(tl.float32)[:, None]
    else:
        acc += mma(a, tl.trans(xt), tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), DOT_F32) * tl.load(s_ptr + rn * G + g).to(tl.float32)[:, None]
    return acc


@triton.jit
def _w4a16_mma_words_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K, KW, G, stride_xm, W_PER_SPLIT,
    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, SCALE_W: tl.constexpr,
    BYTE_PAIRS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, ASM: tl.constexpr,
    DOT_F32: tl.constexpr,
):  # fmt: skip
    pid_k, offs_m, offs_n, rm, rn, w_start = tile_coords(M, N, W_PER_SPLIT, BLOCK_M, BLOCK_N, GROUP_M)
    dtype = x_ptr.dtype.element_ty
    neg = words_neg_zero(z_ptr, rn, dtype, GROUP, HAS_ZEROS, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for it in range(0, W_PER_SPLIT // 16):
        acc = words_mma_step(acc, neg, w_start + it * 16, qw_ptr, s_ptr, z_ptr, x_ptr, rn, rm, KW, G, stride_xm,
                                  dtype, GROUP, HAS_ZEROS, SCALE_W, BYTE_PAIRS, False, BLOCK_M, BLOCK_N, ASM, DOT_F32)  # fmt: skip
    store_tile(tl.trans(acc), s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_m, offs_n, pid_k, M, N, G, GROUP, HAS_BIAS, SPLIT_K)


def mma_words_supported(k: int, group_size: int, scale_w: bool) -> bool:
    """K a whole number of 128-code tiles; the group a multiple of 128 (its scale applied to a
    tile's partial dot), per-channel, or with ``scale_w`` any multiple of 32 (a lane's 32 codes
    of a tile lie in one group)."""
    if k % 128:
        return False
    if scale_w:
        return group_size > 0 and group_size % 32 == 0
    return group_size == -1 or group_size % 128 == 0


def w4a16_mma_words(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, group_size: int, cfg: dict) -> Tensor:
    """Launch with config ``cfg`` = {BLOCK_M, BLOCK_N, SPLIT_K, SCALE_W, BYTE_PAIRS, GROUP_M, num_warps,
    num_stages, MAXNREG (optional: ptxas register cap per thread, CUDA only)} (arguments
    already checked; 4-bit)."""
    m, k = x.shape
    n = qweight.shape[0]
    scale_w = bool(cfg.get("SCALE_W", False))
    if not mma_words_supported(k, group_size, scale_w):
        raise ValueError(
            f"w4a16_mma_words: needs K % 128 == 0 and group -1 / a multiple of 128 (any multiple of 32 with SCALE_W); "
            f"got K={k}, group_size={group_size}, SCALE_W={scale_w}"
        )
    if x.stride(1) != 1:
        x = x.contiguous()
    kw = k // 8
    split_k = cfg.get("SPLIT_K", 1)
    while split_k > 1 and kw % (16 * split_k):  # whole 16-word tiles per split
        split_k -= 1
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), split_k)
    out, ws, counts = output_buffers(x, n, split_k, grid[0])
    cap = {"maxnreg": cfg["MAXNREG"]} if "MAXNREG" in cfg and x.is_cuda else {}  # a compile option; the interpreter has none
    launch(_w4a16_mma_words_kernel, grid,
        x, aligned_view(qweight, torch.int32), scales, zeros if zeros is not None else qweight, bias if bias is not None else scales, out, ws, counts,
        m, n, k, kw, scales.shape[1], x.stride(0), kw // split_k,
        GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None, SPLIT_K=split_k, SCALE_W=scale_w,
        BYTE_PAIRS=bool(cfg.get("BYTE_PAIRS", False)), BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], GROUP_M=cfg.get("GROUP_M", 8), ASM=x.is_cuda, DOT_F32=not x.is_cuda,
        num_warps=cfg.get("num_warps", 8), num_stages=cfg.get("num_stages", LAUNCH_OPTIONS["num_stages"]), **cap,
    )  # fmt: skip
    return out


def _configs(p: Problem, exhaustive: bool) -> list[dict]:
    """ops/wna16/mma_words.py configs for M bucket <= 64 (BLOCK_M tokens: 16, 32 or 64), the
    heuristic pick first: 128 weight rows on 8 warps, 4 stages, ~2 programs per SM. H200, M = 1
    and 16, five shapes: 128 rows / 8 warps was the best tile on 9 of 10 points;
    64 rows / 4 warps and 256 / 8 were 0-30 % slower; two or four 128-code tiles per iteration
    (longer runs of each row) were slower everywhere. ``SCALE_W`` (the scale on the weights,
    the reference's rounding) where the group allows it; needed for groups 32 and 64."""
    m, n, k, group_size, sms = p.m, p.n, p.k, p.group_size, p.sms
    bm = max(16, min(64, m_bucket(m)))
    forms = [sw for sw in (False, True) if mma_words_supported(k, group_size, sw)]
    # (rows, warps, stages, ptxas register cap): ncu on the shipped M = 16 picks (128 rows, 4 warps,
    # 167 registers) found 3 blocks per SM, 0.57-0.65 waves and under 2 warps per scheduler; a cap
    # of 128 (4 warps) / 80 (8 warps) spills nothing (sm_90 SASS, triton 3.6: loop +1-3 %) and
    # lets 4 / 3 blocks share an SM. Opt-in (MAXNREG): right on the GPU, but in an H200 tune
    # they won 2 of 15 keys by <= 2.4 %, and one of those wins (8192x8192 M = 1: 18.6 us) did
    # not hold in the same run's timing pass (20.6 us)
    tiles = ((128, 8, 4, 0), (128, 4, 4, 0), (64, 4, 4, 0), (256, 8, 3, 0), (128, 4, 4, 128), (128, 8, 4, 80))
    if exhaustive:
        tiles += ((128, 8, 3, 0), (128, 4, 3, 0), (64, 4, 3, 0), (128, 4, 3, 128))
    # 6 and 8 stages (more bytes in flight: DRAM 38-43 % busy at M = 16) were never faster on the H200:
    # the best of them 0.91-0.99x the best shallower config at M = 16, five shapes
    out = []
    for bn, warps, stages, cap in tiles:
        programs = cdiv(n, bn) * cdiv(m, bm)
        first = split_for(programs, k, 128, sms)
        splits = [first] + [s for s in split_k_choices(k // 128, programs, sms) if s != first]
        for sp in splits if exhaustive or bn == 128 else splits[:1]:
            for sw in forms:
                c = {
                    "BLOCK_M": bm,
                    "BLOCK_N": bn,
                    "SPLIT_K": sp,
                    "SCALE_W": sw,
                    "GROUP_M": 8,
                    "num_warps": warps,
                    "num_stages": stages,
                    **({"MAXNREG": cap} if cap else {}),
                }
                out.append(c)
                # opt-in (H200: 12-19 % slower than the plain form on 10 fp16 keys): codes
                # paired within a byte, so the activations arrive by 4-byte async copies and the wgmma
                # stays asynchronous where nothing rescales the accumulator in the loop (per-channel,
                # SCALE_W; PTX wait_group 7 instead of 0);
                # +15 % loop instructions (sm_90 SASS, 128 rows / 4 warps, per-channel: 344 against 298);
                # and in 9 of its 12 g128 tiles ptxas writes registers of wgmmas in flight (qfuse bench sass)
                if bn == 128 and not cap and (sw or group_size == -1):
                    out.append({**c, "BYTE_PAIRS": True})
    return out


def _opt_in(cfg: dict) -> str:
    if "MAXNREG" in cfg:
        return "MAXNREG: won 2 of 15 H200 keys by <= 2.4 %, not confirmed in the timing pass"
    if "BYTE_PAIRS" in cfg:
        return "BYTE_PAIRS: 12-19 % slower on the H200; ptxas writes registers of wgmmas in flight in 9 of 12 g128 tiles"
    return ""


def _run(cfg, x, qweight, scales, zeros, bias, bits, group_size):
    return w4a16_mma_words(x, qweight, scales, zeros, bias, group_size, cfg)


def _supports(p: Problem) -> tuple[bool, str]:
    if p.bits == 4 and m_bucket(p.m) <= 64 and any(mma_words_supported(p.k, p.group_size, sw) for sw in (False, True)):
        return True, ""
    return False, "4-bit, M bucket <= 64, K % 128 == 0 and a group it reads"


FAMILY = KernelFamily("mma_words", "wna16/mma_words", _supports, _configs, _run, opt_in=_opt_in)
