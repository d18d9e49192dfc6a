"""CUDA-core GEMV for 4-bit ``wna16_gemm`` at decode M, reading the weights as int32 words.

The documented layout (two codes per byte along K, low nibble = even k) read as little-endian
int32 words puts code ``8w + t`` in nibble ``t`` of word ``w``: natural K order, so no
register shuffle is needed to line codes up with activations. Per word (8 codes)::

    half = word, word >> 16                     nibbles 4h..4h+3 in bits 0..15 (one SHF per word)
    c_t  = bitcast_f32((half & (15 << 4j)) | 0x4B000000) - (2**23 + z * 2**4j)  = (u - z) * 2**4j, exact
    t    = sum_t c_t * (x[8w + t] * 2**-4j)                                       (exact rescale)
    acc += t * s[n, g]                                                            (one FFMA per word)

About 3 instructions per code (LOP3, FADD, FFMA) against ~9 in the byte-wise GEMV
(ops/wna16_gemv.py: byte extract, nibble join/reshape, per-code scale), counted in the sm_90
SASS of both (triton 3.7.1): a decode GEMV is issue-bound well before it is HBM-bound, so
instructions per weight byte set its speed. One program: one activation row, BLOCK_N weight
rows, a 1/SPLIT_K slice of K; the float32 partial of a split goes through the shared
deterministic split-K reduction. A tile never spans two groups (BLOCK_W * 8 <= group_size),
so each tile takes one scale per row. Needs K % 8 == 0 (whole words).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._wna16_common import splitk_reduce


# KW / W_PER_SPLIT unspecialized: when Triton may assume 16-divisible row lengths it gives
# each thread 4 contiguous words of 2 rows (16-byte loads) instead of 1 word of 8 rows, and
# the per-code activation loads then amortize over 2 rows instead of 8: 10.8 against 9.2
# SASS instructions per weight byte in the loop (sm_90, BLOCK_N=64, BLOCK_W=16, 4 warps).
@triton.jit(do_not_specialize=["KW", "W_PER_SPLIT"])
def _w4a16_gemv_words_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr,
    M, N, KW, G, W_PER_SPLIT, SPLIT_K, MAGIC_BITS, NIBBLE,
    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N  # rows past N recompute row rn; their results are masked at the store
    x_row = x_ptr + m * (KW * 8)
    w_start = pid_k * W_PER_SPLIT

    if HAS_ZEROS:
        z = tl.load(z_ptr + rn * G + ((w_start * 8) // GROUP if GROUP > 0 else 0)).to(tl.float32)
    else:
        z = tl.full((BLOCK_N,), 8.0, tl.float32)
    acc = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
    for it in range(0, W_PER_SPLIT // BLOCK_W):
        w0 = w_start + it * BLOCK_W
        ow = w0 + tl.arange(0, BLOCK_W)
        words = tl.load(qw_ptr + rn[:, None] * KW + ow[None, :], eviction_policy="evict_first").to(tl.uint32, bitcast=True)
        if GROUP > 0:
            g = (w0 * 8) // GROUP
            s = tl.load(s_ptr + rn * G + g).to(tl.float32)
            if HAS_ZEROS:
                z = tl.load(z_ptr + rn * G + g).to(tl.float32)
        t = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
        for h in tl.static_range(2):
            half = words if h == 0 else words >> 16  # nibbles 4h .. 4h+3 in bits 0..15
            for j in tl.static_range(4):
                # Nibble j stays in place (bits 4j..4j+3): the exponent trick then yields
                # 2**23 + u * 2**(4j), exact, with one LOP3 (mask and magic are constants;
                # a shift + mask would compile to a bit-field extract, SHF + SGXT + LOP3).
                # (u - z) * 2**(4j) times x * 2**(-4j) is (u - z) * x exactly. MAGIC_BITS
                # (0x4B000000) and NIBBLE (15) arrive as kernel arguments, so they sit in
                # registers and ptxas fuses and + or into one 3-input LOP3 (immediates: two).
                cj = ((half & (NIBBLE << (4 * j))) | MAGIC_BITS).to(tl.float32, bitcast=True) - (8388608.0 + z * (1 << (4 * j)))[:, None]
                xj = tl.load(x_row + ow * 8 + (4 * h + j), eviction_policy="evict_last").to(tl.float32) * (1.0 / (1 << (4 * j)))
                t += cj * xj[None, :]
        if GROUP > 0:
            acc += t * s[:, None]
        else:
            acc += t

    res = tl.sum(acc, axis=1)
    if GROUP <= 0:
        res = res * tl.load(s_ptr + rn * G).to(tl.float32)
    mask = offs_n < N
    if SPLIT_K == 1:
        if HAS_BIAS:
            res += tl.load(bias_ptr + rn).to(tl.float32)
        tl.store(out_ptr + m * N + offs_n, res.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_k * M * N + m * N + offs_n, res, mask=mask)


def words_supported(k: int, bits: int, group_size: int, block_w: int = 4) -> bool:
    """Whether this kernel can take the problem: 4-bit, K a whole number of 4-word (32-code)
    tiles; the launcher shrinks BLOCK_W to a divisor of K / 8 where needed."""
    return bits == 4 and k % (8 * block_w) == 0 and (group_size <= 0 or group_size % (8 * block_w) == 0)


def w4a16_gemv_words(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, group_size: int, cfg: dict) -> Tensor:
    """Launch with config ``cfg`` = {BLOCK_N, BLOCK_W, SPLIT_K, num_warps} (arguments already checked)."""
    m, k = x.shape
    n = qweight.shape[0]
    kw = k // 8
    x = x.contiguous()
    words = qweight.view(torch.int32)  # [N, K // 8]; the byte layout read 4 bytes at a time
    block_w = cfg["BLOCK_W"] if group_size <= 0 else min(cfg["BLOCK_W"], group_size // 8)
    while kw % block_w:  # per-channel K that is a multiple of 32 but not of 8 * BLOCK_W (e.g. 576)
        block_w //= 2
    split_k = cfg.get("SPLIT_K", 1)
    while split_k > 1 and kw % (split_k * block_w):
        split_k //= 2
    w_per_split = kw // split_k
    if w_per_split % block_w:
        raise ValueError(f"w4a16_gemv_words: K={k} is not a whole number of {block_w}-word tiles per split")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    ws = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device) if split_k > 1 else out
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split_k, m)
    _w4a16_gemv_words_kernel[grid](
        x, words, scales, zeros if zeros is not None else qweight, bias if bias is not None else scales, out, ws,
        m, n, kw, scales.shape[1], w_per_split, split_k, 0x4B000000, 15,
        GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_W=block_w, num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 2),
    )  # fmt: skip
    if split_k > 1:
        splitk_reduce(ws, bias, out)
    return out
