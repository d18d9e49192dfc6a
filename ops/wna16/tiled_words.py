"""Tiled tensor-core kernel for ``wna16_gemm`` that reads the weights as int32 words.

Same tiling, split-K and scale placement as ops/wna16/tiled.py (one program: a
``[BLOCK_M, BLOCK_N]`` output tile over a ``1 / SPLIT_K`` slice of K; ``BLOCK_K <= group``),
only the dequantization differs. The documented layout read as little-endian int32 words
puts code ``CPW * w + t`` in bits ``BITS * t ..`` of word ``w`` (CPW = 32 / BITS codes per
word: natural K order). Per word, for the two 16-bit halves ``h`` and the codes ``j`` of a
half (``t = CPW / 2 * h + j``)::

    half  = word, word >> 16                                      (one SHF per word)
    B_t   = bitcast_f32((half & (MASK << BITS * j)) | 0x4B000000) = 2**23 + u * 2**(BITS * j)
    c_t   = B_t * 2**-(BITS * j) - (2**(23 - BITS * j) + z)       = u - z        (one FFMA)

The code stays in place (one 3-input LOP3, mask and magic passed as kernel arguments so
ptxas fuses them; immediates give SHF + SGXT + LOP3), and the FFMA is exact: the product is
a power-of-two scaling of an exactly representable value, the difference of two integers
below 2**23 is an integer, so the one rounding of the FFMA has nothing to round. The byte
kernel spends a PRMT (byte extract), SHF + SGXT (high nibble), two LOP3 and an FADD per
code pair member instead. The ``CPW`` code tensors are joined along a new last axis
(``code t`` of word ``w`` -> ``k = CPW * w + t``) and reshaped to ``[BLOCK_N, BLOCK_K]``:
natural K order, so the activations load contiguously as in the byte kernel.

``SWAP_AB`` (config key) computes ``out^T = w @ x^T``: the weight tile is the MMA's A
operand (64-row wgmma tiles on Hopper even for BLOCK_M = 16) and the activations the B
operand; fewer register moves around the MMA in the sm_90 SASS (see the dispatcher's figures).
Scales: per-channel after the loop; per group either after each tile's dot
(``SCALE_AFTER_DOT``) or on the weights as ``dtype(u - z) * s`` in the activation dtype (one
packed multiply per two codes; one rounding of the exact product, as in the reference).

Needs K % CPW == 0 (whole words; the op's checks allow any even K for 4-bit: the
dispatcher offers this family only where :func:`tiled_words_supported`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket
from .._launch import launch
from .._views import aligned_view
from ..kernel_family import KernelFamily, Problem
from .common import mma, output_buffers, scaled_weights, store_tile, tile_coords, weight_major_tiles
from .tiled import k_plan, tiled_configs
from .tiled_planes import planes_in_k_order


@triton.jit
def _code(half, MASK, MAGIC_BITS, d, BITS: tl.constexpr, J: tl.constexpr):
    """u - z (float32, exact) for the code in bits BITS*J.. of ``half``; ``d`` = 2**(23 - BITS*J) + z."""
    b = ((half & (MASK << (BITS * J))) | MAGIC_BITS).to(tl.float32, bitcast=True)
    return b * (1.0 / (1 << (BITS * J))) - d


@triton.jit
def _join_codes(c0, c1, c2, c3, c4, c5, c6, c7, BITS: tl.constexpr):
    """[BN, W] code tensors c_t -> [BN, W * CPW] with column CPW * w + t (natural K order).

    ``join`` adds its axis last, so the outermost index bit (t // (CPW / 2)) is joined first."""
    if BITS == 4:
        a0 = tl.join(c0, c4)  # [.., t2]
        a1 = tl.join(c1, c5)
        a2 = tl.join(c2, c6)
        a3 = tl.join(c3, c7)
        b0 = tl.join(a0, a2)  # [.., t2, t1]
        b1 = tl.join(a1, a3)
        r = tl.join(b0, b1)  # [.., t2, t1, t0]
        return tl.reshape(r, (c0.shape[0], c0.shape[1] * 8))
    else:
        b0 = tl.join(c0, c2)  # [.., t1]
        b1 = tl.join(c1, c3)
        r = tl.join(b0, b1)  # [.., t1, t0]
        return tl.reshape(r, (c0.shape[0], c0.shape[1] * 4))


@triton.jit
def _dequant_words(words, MASK, MAGIC_BITS, z, BITS: tl.constexpr):
    """int32 words [BN, W] -> float32 (u - z) [BN, W * CPW] in natural K order; z: [BN] float32."""
    lo = words.to(tl.uint32, bitcast=True)
    hi = lo >> 16  # codes of the upper half in bits 0..15: the magic's mantissa has 23 bits
    zz = z[:, None]
    if BITS == 4:
        return _join_codes(
            _code(lo, MASK, MAGIC_BITS, zz + 8388608.0, BITS, 0), _code(lo, MASK, MAGIC_BITS, zz + 524288.0, BITS, 1),
            _code(lo, MASK, MAGIC_BITS, zz + 32768.0, BITS, 2), _code(lo, MASK, MAGIC_BITS, zz + 2048.0, BITS, 3),
            _code(hi, MASK, MAGIC_BITS, zz + 8388608.0, BITS, 0), _code(hi, MASK, MAGIC_BITS, zz + 524288.0, BITS, 1),
            _code(hi, MASK, MAGIC_BITS, zz + 32768.0, BITS, 2), _code(hi, MASK, MAGIC_BITS, zz + 2048.0, BITS, 3),
            BITS,
        )  # fmt: skip
    else:
        c0 = _code(lo, MASK, MAGIC_BITS, zz + 8388608.0, BITS, 0)
        c1 = _code(lo, MASK, MAGIC_BITS, zz + 32768.0, BITS, 1)
        c2 = _code(hi, MASK, MAGIC_BITS, zz + 8388608.0, BITS, 0)
        c3 = _code(hi, MASK, MAGIC_BITS, zz + 32768.0, BITS, 1)
        return _join_codes(c0, c1, c2, c3, c0, c1, c2, c3, BITS)


@triton.jit
def _wna16_tiled_words_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K, KW, G, stride_xm, K_PER_SPLIT, MASK, MAGIC_BITS,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, SCALE_AFTER_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr, HALF_PLANES: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    CPW: tl.constexpr = 32 // BITS
    BLOCK_W: tl.constexpr = BLOCK_K // CPW if not HALF_PLANES else BLOCK_K // 4  # int32 words, or int16 halves
    pid_k, offs_m, offs_n, rm, rn, k_start = tile_coords(M, N, K_PER_SPLIT, BLOCK_M, BLOCK_N, GROUP_M)
    dtype = x_ptr.dtype.element_ty

    if HAS_ZEROS:
        z = tl.load(z_ptr + rn * G + (tl.minimum(k_start // GROUP, G - 1) if GROUP != -1 else 0)).to(tl.float32)
    else:
        z = tl.full((BLOCK_N,), 1 << (BITS - 1), tl.float32)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K_PER_SPLIT, BLOCK_K)):
        k0 = k_start + kt * BLOCK_K
        if GROUP != -1:
            g = tl.minimum(k0 // GROUP, G - 1)  # clamp: masked tail tiles past K
            s = tl.load(s_ptr + rn * G + g)  # dtype
            if HAS_ZEROS:
                z = tl.load(z_ptr + rn * G + g).to(tl.float32)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_w = k0 // (CPW if not HALF_PLANES else 4) + tl.arange(0, BLOCK_W)
        x_ptrs = x_ptr + rm[:, None] * stride_xm + offs_k[None, :]
        w_ptrs = qw_ptr + rn[:, None] * KW + offs_w[None, :]
        if EVEN_K:
            xt = tl.load(x_ptrs, eviction_policy="evict_last")
            words = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            xt = tl.load(x_ptrs, mask=(offs_k < K)[None, :], other=0.0)
            words = tl.load(w_ptrs, mask=(offs_w < KW)[None, :], other=0)
        if HALF_PLANES:  # 4-bit, int16 halves: PTX planes (k = 4h + t) joined back to natural K order
            w = planes_in_k_order(words, z, dtype, ASM, True, BLOCK_N, BLOCK_K)
        else:
            w = _dequant_words(words, MASK, MAGIC_BITS, z, BITS).to(dtype)  # [BLOCK_N, BLOCK_K] u - z, exact
        if GROUP != -1 and not SCALE_AFTER_DOT:  # one packed multiply per two codes (HMUL2), not an FMUL per code
            w = scaled_weights(w, s, dtype, DOT_F32)
        if SWAP_AB:  # acc^T [BLOCK_N, BLOCK_M] = w @ x^T: the weights are the MMA's A operand
            if GROUP != -1 and SCALE_AFTER_DOT:
                acc += mma(w, tl.trans(xt), tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), DOT_F32) * s.to(tl.float32)[:, None]
            else:
                acc = mma(w, tl.trans(xt), acc, DOT_F32)
        else:
            wt = tl.trans(w)
            if GROUP != -1 and SCALE_AFTER_DOT:
                acc += mma(xt, wt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), DOT_F32) * s.to(tl.float32)[None, :]
            else:
                acc = mma(xt, wt, acc, DOT_F32)

    if SWAP_AB:
        acc = tl.trans(acc)
    store_tile(acc, s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_m, offs_n, pid_k, M, N, G, GROUP, HAS_BIAS, SPLIT_K)


def tiled_words_supported(k: int, bits: int) -> bool:
    """Whether this kernel can take the problem: whole int32 words per row."""
    return k % (32 // bits) == 0


def wna16_tiled_words(
    x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int, cfg: dict
) -> Tensor:
    """Launch with config ``cfg`` (the tiled kernel's keys; arguments already checked)."""
    m, k = x.shape
    n = qweight.shape[0]
    if not tiled_words_supported(k, bits):
        raise ValueError(f"wna16_tiled_words: K={k} is not a whole number of int32 words of {bits}-bit codes")
    if x.stride(1) != 1:
        x = x.contiguous()
    block_k, split_k, k_per_split, even_k = k_plan(k, cfg, group_size)
    halves = bool(cfg.get("HALF_PLANES", False)) and bits == 4
    # [N, K * bits / 32]: the byte layout read 4 bytes at a time (or 2 bytes: int16 halves)
    words = aligned_view(qweight, torch.int16 if halves else torch.int32)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), split_k)
    out, ws, counts = output_buffers(x, n, split_k, grid[0])
    launch(_wna16_tiled_words_kernel, grid,
        x, words, scales, zeros if zeros is not None else qweight, bias if bias is not None else scales, out, ws, counts,
        m, n, k, words.shape[1], scales.shape[1], x.stride(0), k_per_split, (1 << bits) - 1, 0x4B000000,
        BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None,
        SPLIT_K=split_k, EVEN_K=even_k, SCALE_AFTER_DOT=bool(cfg.get("SCALE_AFTER_DOT", False)) and group_size != -1,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k, GROUP_M=cfg.get("GROUP_M", 8), DOT_F32=not x.is_cuda,
        SWAP_AB=bool(cfg.get("SWAP_AB", False)), HALF_PLANES=halves, ASM=x.is_cuda, num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3),
    )  # fmt: skip
    return out


def _configs(p: Problem, exhaustive: bool) -> list[dict]:
    mb = m_bucket(p.m)
    gk = p.group_size if p.group_size > 0 else 256
    tiled = tiled_configs(p, exhaustive)
    swapped = [{**c, "SWAP_AB": True} for c in tiled if c["BLOCK_M"] <= 64]
    out = list(swapped)
    if p.bits == 4 and exhaustive:
        out += [{**c, "HALF_PLANES": True} for c in swapped if c["BLOCK_K"] >= 64]
    out += tiled
    if mb >= 64:
        out += _swap_words_configs(mb, gk, p.bits, exhaustive)
    return out


def _swap_words_configs(mb: int, gk: int, bits: int, exhaustive: bool) -> list[dict]:
    """Large ops/wna16/tiled_words.py tiles with the weights as wgmma's register A operand and
    the activations (up to 256 tokens: wgmma's N side) as its shared-memory B operand, group
    scale folded into the weights. Triton keeps that wgmma asynchronous (PTX: ``wait_group 3`` /
    ``7``, the dot split into K = 16 pieces): the next tile's dequantization overlaps the MMAs.
    The non-swapped tiles store the dequantized weights as the B operand to shared memory inside
    the loop, which makes each slice's wgmma synchronous (``wait_group 0``; triton 3.6 / 3.7.1).
    sm_90 registers (triton 3.6, 4-bit, g128): 128-238, no spills, so 4-warp tiles up to
    128 x 128 fit two programs per SM. 4-bit: with and without the PTX half planes."""
    out = []
    for bm, bn, bk, warps, stages in weight_major_tiles(mb, exhaustive):
        c = {
            "BLOCK_M": bm,
            "BLOCK_N": bn,
            "BLOCK_K": min(bk, gk),
            "SPLIT_K": 1,
            "SCALE_AFTER_DOT": False,
            "GROUP_M": 8,
            "SWAP_AB": True,
            "num_warps": warps,
            "num_stages": stages,
        }
        if bits == 4:
            out.append({**c, "HALF_PLANES": True})
        if bits == 8 or exhaustive:
            out.append(c)
    return out


def _run(cfg, x, qweight, scales, zeros, bias, bits, group_size):
    return wna16_tiled_words(x, qweight, scales, zeros, bias, bits, group_size, cfg)


FAMILY = KernelFamily(
    "tiled_words",
    "wna16/tiled_words",
    lambda p: (True, "") if tiled_words_supported(p.k, p.bits) else (False, "K not whole int32 words"),
    _configs,
    _run,
)
