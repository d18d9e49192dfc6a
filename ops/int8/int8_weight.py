"""``w4a8_gemm`` at large M as two passes: int4 codes -> the exact int8 operand, then the W8A8 kernel.

At M >= 1024 the W4A8 tile kernel unpacks every weight tile in registers for every token
tile (BLOCK_M = 128-256 tokens), and feeds wgmma from registers; on the H200 it ran at
0.97-1.12x bf16 per-channel and 0.62-0.66x of that with group 128, where the W8A8 kernel on
an int8 weight ran at 1.25-1.29x bf16 (BENCHMARKS.md, int8_gemm). Writing the op's int8
operand once per call::

    w_int[n, k] = (u[n, k] - 8) * group_scale[n, k // G]     (G = 128, 64, 32; group_scale = 1 per-channel)

costs N*K/2 bytes read + N*K written (28672 x 4096: ~176 MB, ~50 us at 3.5 TB/s, against
~943 us for the W8A8 kernel at M = 4096), after which the W8A8 kernel's int32 accumulator
is the op's, bit for bit, whatever the group size. It needs an N*K int8 buffer per call
(from the caching allocator; CUDA-graph capturable).

The pass reads int32 words (8 codes) and writes two int32 words (4 int8 each) per word, in
packed 32-bit arithmetic: spread nibbles 0-3 (or 4-7) into the four bytes, then per byte
``u * gs + (128 - 8 * gs)`` lies in [0, 240] (no carry between bytes: one 32-bit multiply-add
for four codes) and ``^ 0x80`` makes it ``(u - 8) * gs`` in two's complement.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._launch import launch
from .._views import aligned_view
from ..kernel_family import KernelFamily, Problem
from .tile import run_int8_tile, tile_configs
from .tma import FAMILY as TMA
from .tma import tma_configs

_BYTE_SIGN = tl.constexpr(-2139062144)  # 0x80808080 as an int32


@triton.jit
def _spread_nibbles(v):
    """The low 16 bits' four nibbles n0..n3 -> bytes: ``n0 | n1 << 8 | n2 << 16 | n3 << 24``."""
    v = v & 0xFFFF
    v = (v | (v << 8)) & 0x00FF00FF
    return (v | (v << 4)) & 0x0F0F0F0F


@triton.jit
def _w4_to_int8_kernel(qw_ptr, gs_ptr, out_ptr, N, KW, G, GROUP_WORDS, GROUPED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    # qw_ptr: int32 words [N, KW] (KW = K // 8); out_ptr: int32 words [N, 2 * KW] of the int8 [N, K]
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = (offs_n < N)[:, None] & (offs_w < KW)[None, :]
    rows = offs_n.to(tl.int64)[:, None]
    words = tl.load(qw_ptr + rows * KW + offs_w[None, :], mask=mask, other=0)
    if GROUPED:  # word w holds k = 8w .. 8w + 7: group w // GROUP_WORDS (words per group: 16, 8 or 4)
        gs = tl.load(gs_ptr + rows * G + (offs_w // GROUP_WORDS)[None, :], mask=mask, other=1).to(tl.int32)
    else:
        gs = tl.full((BLOCK_N, BLOCK_W), 1, tl.int32)
    bias = _BYTE_SIGN - gs * 0x08080808  # per byte 128 - 8 * gs in [0, 120]: no borrow
    lo = (_spread_nibbles(words) * gs + bias) ^ _BYTE_SIGN  # k = 8w .. 8w + 3
    hi = (_spread_nibbles(words >> 16) * gs + bias) ^ _BYTE_SIGN  # k = 8w + 4 .. 8w + 7
    out = tl.join(lo, hi).reshape(BLOCK_N, 2 * BLOCK_W)  # output words 2w, 2w + 1
    offs_o = 2 * tl.program_id(1) * BLOCK_W + tl.arange(0, 2 * BLOCK_W)
    omask = (offs_n < N)[:, None] & (offs_o < 2 * KW)[None, :]
    tl.store(out_ptr + rows * (2 * KW) + offs_o[None, :], out, mask=omask)


def w4_to_int8(qweight, group_scale, block_n: int = 32, block_w: int = 64):
    """The op's int8 operand ``w_int`` [N, K] (exactly ``w4a8_int_weight``) from ``qweight`` [N, K // 2]."""
    import torch

    n, kh = qweight.shape
    k = 2 * kh
    if k % 8:
        raise ValueError(f"w4_to_int8: K={k} must be a multiple of 8 (whole int32 words)")
    out = torch.empty((n, k), dtype=torch.int8, device=qweight.device)
    if n == 0 or k == 0:
        return out
    kw = k // 8
    groups = group_scale.shape[1] if group_scale is not None else 1
    grid = (triton.cdiv(n, block_n), triton.cdiv(kw, block_w))
    launch(_w4_to_int8_kernel, grid,
        aligned_view(qweight, torch.int32), group_scale if group_scale is not None else qweight, out.view(torch.int32),
        n, kw, groups, kw // groups, GROUPED=group_scale is not None, BLOCK_N=block_n, BLOCK_W=block_w, num_warps=4,
    )  # fmt: skip
    return out


def _supports(p: Problem) -> tuple[bool, str]:
    if p.bits != 4:
        return False, "W4A8 only"
    if not p.gpu:
        return False, "needs a GPU"
    if p.m <= 64 or p.k % 8:
        return False, "M > 64 and K % 8 == 0 only (the weight pass costs N*K bytes per call)"
    return True, ""


def _configs(p: Problem, exhaustive: bool) -> list[dict]:
    """The W8A8 configs of the tile kernel, then (``TMA``) of the TMA kernel, that run on the int8 weight."""
    tma = [dict(c, TMA=1) for c in tma_configs(p.m, p.k)] if p.tma else []
    return tile_configs(p.m, p.n, p.k, -1, p.sms) + tma


def _run(cfg, xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4):
    inner = {key: v for key, v in cfg.items() if key not in ("kernel", "TMA")}
    w8 = w4_to_int8(w, group_scale)
    if cfg.get("TMA"):
        return TMA.run(inner, xq, x_scale, w8, w_scale, None, bias, out_dtype, False)
    return run_int8_tile(xq, x_scale, w8, w_scale, None, bias, out_dtype, w4=False, config=inner)


FAMILY = KernelFamily("w8", "int8/int8_weight", _supports, _configs, _run)
