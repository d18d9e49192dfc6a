"""Large-M tile kernel for ``wna16_gemm`` (4- and 8-bit) fed by the Tensor Memory Accelerator.

The math of ``wna16_gemm`` (group ``g = k // GROUP``; ``GROUP == -1``: one group per row)::

    w[n, k]    = dtype( (u[n, k] - z[n, g]) * s[n, g] )          one rounding, as the reference
    out[m, n]  = dtype( sum_k x[m, k] * w[n, k]  (+ bias[n]) )   float32 accumulator

per program: a ``[BLOCK_M tokens, BLOCK_N weight rows]`` output tile over a ``1 / SPLIT_K`` slice
of K, as ``acc^T [BLOCK_N, BLOCK_M] += w_tile @ x_tile^T`` (split-K: the single-launch ordered sum of
ops/_wna16_common.py, :func:`finish_split`; for grids of fewer tiles than ~2 per SM, e.g. N = 4096 at
M = 256):

* both operands arrive by TMA (host ``TensorDescriptor``s of ``x [M, K]`` and of the weight bytes
  ``[N, K * BITS / 8]``), multi-buffered by Triton's pipeliner; the copy engine zero-fills rows past
  M / N and columns past K (zero activations past K cancel whatever the zero bytes dequantize to),
  so there are no masks in the loop;
* the weight bytes are dequantized in registers: 4-bit by ops/w4a16_tiled_planes.py's PTX planes
  (magic-exponent LOP3 + one packed FMA per code pair) joined back to natural K order, 8-bit by the
  float32 exponent trick (``bitcast(u | 0x4B000000) - (2**23 + z)``, exact; ``|u - z| <= 255`` is
  exact in bf16 / fp16 too); then multiplied by the group scale in the activation dtype. They are
  wgmma's *register* A operand,
  the activation tile its shared-memory B operand straight from the TMA buffer. Nothing else uses
  the accumulator in the loop, so Triton keeps the wgmma asynchronous (the pointer-fed
  ``tiled_planes`` JOIN form has the same loop with ``cp.async`` loads and address arithmetic).

Per-channel scales multiply the accumulator once, after the loop (``u - z`` is exact in the
activation dtype). Needs 16-byte weight rows: ``K % 32 == 0`` for 4-bit, ``K % 16 == 0`` for 8-bit
(:func:`tma_supported`). 8-bit tiles run at 4 warps only: on the H200 the 8-warp and
``TAIL_SPLIT`` forms computed wrong results that the interpreter computes right
(ops/wna16_dispatch.py, ``is_experimental``).

Not warp-specialized: ``tl.range(..., warp_specialize=True)`` on this loop (triton 3.6, H200,
fourteenth session; it compiled only for 64-row weight tiles at 4 warps) ran 1.5-3.0x slower than
the shipped picks at M = 16-1024, and with split-K it computed wrong sums and left the persistent
split-K counters nonzero, so later launches went wrong too (BENCHMARKS.md, fourteenth session).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._autotune import sm_count
from ._tma import tma_aligned
from ._wna16_common import codes_minus_zero, finish_split, grouped_tile, mma, output_buffers, split_counters, store_tile
from .w4a16_tiled_planes import planes_in_k_order
from .wna16_tiled import split_k_slices


# compile options of a launch where the config does not set them (``qfuse.bench.sass.compile_sass`` compiles with the same)
LAUNCH_OPTIONS = {"num_stages": 3}


@triton.jit(do_not_specialize=["M"])
def _wna16_tma_kernel(
    x_desc, w_desc, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, M, N, K, G, K_PER_SPLIT,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ASM: tl.constexpr, DOT_F32: tl.constexpr, TAIL_SPLIT: tl.constexpr, FULL_TILES,
):  # fmt: skip
    if TAIL_SPLIT > 1:  # programs >= FULL_TILES: TAIL_SPLIT slices of K of each tile past the last whole wave
        is_tail = tl.program_id(0) >= FULL_TILES
        q = tl.program_id(0) - FULL_TILES
        tile = tl.where(is_tail, FULL_TILES + q // TAIL_SPLIT, tl.program_id(0))
        pid_k = tl.where(is_tail, q % TAIL_SPLIT, 0)
        k_start = pid_k * K_PER_SPLIT
        k_tiles = tl.where(is_tail, tl.cdiv(K_PER_SPLIT, BLOCK_K), tl.cdiv(K, BLOCK_K))
    else:  # statement for statement the loop the GPU runs were made with (same sm_90 SASS)
        pid_k = tl.program_id(1)
        k_start = pid_k * K_PER_SPLIT
        tile = tl.program_id(0)
    pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N  # rows past N read row n % N's scales (their outputs are masked)
    dtype: tl.constexpr = x_desc.dtype

    if HAS_ZEROS:
        z = tl.load(z_ptr + rn * G + (tl.minimum(k_start // GROUP, G - 1) if GROUP != -1 else 0)).to(tl.float32)
    else:
        z = tl.full((BLOCK_N,), float(1 << (BITS - 1)), tl.float32)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kt in range(0, k_tiles if TAIL_SPLIT > 1 else tl.cdiv(K_PER_SPLIT, BLOCK_K)):
        k0 = k_start + kt * BLOCK_K
        if GROUP != -1:  # BLOCK_K <= GROUP: the tile lies in group k0 // GROUP (clamped: tiles past K)
            g = tl.minimum(k0 // GROUP, G - 1)
            s = tl.load(s_ptr + rn * G + g)
            if HAS_ZEROS:
                z = tl.load(z_ptr + rn * G + g).to(tl.float32)
        xt = x_desc.load([pid_m * BLOCK_M, k0])  # [BLOCK_M, BLOCK_K]
        if BITS == 4:
            b = w_desc.load([pid_n * BLOCK_N, k0 // 2])  # [BLOCK_N, BLOCK_K / 2] bytes: k = 2j low nibble, 2j + 1 high
            w = planes_in_k_order(b, z, dtype, ASM, False, BLOCK_N, BLOCK_K)  # u - z, exact
        else:
            u = w_desc.load([pid_n * BLOCK_N, k0]).to(tl.int32)  # [BLOCK_N, BLOCK_K] codes
            w = codes_minus_zero(u, (z + 8388608.0)[:, None]).to(dtype)  # u - z, exact
        if GROUP != -1:  # scaled_weights(w, s, dtype, DOT_F32), written out: through the call, triton 3.6
            # scheduled the 256x64x64 g64 split-4 tile differently, and these loops ran on the H200 as is
            if DOT_F32:  # the interpreter has no bf16 arithmetic: float32, then round
                w = (w.to(tl.float32) * s.to(tl.float32)[:, None]).to(dtype)
            else:
                w = w * s[:, None]
        acc = mma(w, tl.trans(xt), acc, DOT_F32)

    if TAIL_SPLIT > 1:
        _store_tail_split(tl.trans(acc), s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_m, offs_n, is_tail, tile, pid_k,
                          M, N, G, FULL_TILES, GROUP, HAS_BIAS, TAIL_SPLIT, BLOCK_M, BLOCK_N)
    else:
        store_tile(tl.trans(acc), s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_m, offs_n, pid_k, M, N, G, GROUP, HAS_BIAS, SPLIT_K)


@triton.jit
def _store_tail_split(acc, s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_m, offs_n, is_tail, tile, pid_k, M, N, G, FULL_TILES,
                      GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, TAIL_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Epilogue with ``TAIL_SPLIT``: a whole tile stores its output; a tail slice goes through
    :func:`finish_split` with a compact workspace ``[TAIL_SPLIT, tail tiles, BLOCK_M * BLOCK_N]``
    (``ws`` indexed by the tile's local element, the output by its global one)."""
    if is_tail:
        if GROUP == -1:
            acc = acc * tl.load(s_ptr + rn * G).to(tl.float32)[None, :]
        mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        idx = offs_m[:, None] * N + offs_n[None, :]
        local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tail_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) - FULL_TILES
        finish_split(acc, local, mask, (bias_ptr + rn)[None, :], ws_ptr + (tile - FULL_TILES) * (BLOCK_M * BLOCK_N), count_ptr,
                     out_ptr + (idx - local), tile, pid_k, tail_tiles * (BLOCK_M * BLOCK_N), TAIL_SPLIT, HAS_BIAS)
    else:  # a whole tile: the plain epilogue
        store_tile(acc, s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_m, offs_n, 0, M, N, G, GROUP, HAS_BIAS, 1)


def tma_supported(k: int, bits: int = 4) -> bool:
    """Whether the descriptors can take this K: 16-byte rows of weight bytes (K * bits / 8) and of activations."""
    return k % (32 if bits == 4 else 16) == 0


def wna16_tma(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int,
              cfg: dict) -> Tensor:
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
    # WAVE_PROGRAMS: tests) run as TAIL_SPLIT slices of K each, so the last wave is not mostly idle
    tail_split = cfg.get("TAIL_SPLIT", 0) if split_k == 1 else 0
    full = tiles
    if tail_split > 1:
        wave = cfg.get("WAVE_PROGRAMS") or cfg.get("TAIL_WAVE", 1) * sm_count(x.device)
        full = tiles // wave * wave
    if full < tiles:
        k_per_split, _ = split_k_slices(k, bk, tail_split)
        grid = (full + (tiles - full) * tail_split, 1)
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        ws = torch.empty((tail_split, tiles - full, bm * bn), dtype=torch.float32, device=x.device)
        counts = split_counters(x.device, tiles)
    else:
        tail_split, full = 0, tiles
        k_per_split, _ = split_k_slices(k, bk, split_k)  # whole BLOCK_K tiles per split; TMA zero-fills past K
        grid = (tiles, split_k)
        out, ws, counts = output_buffers(x, n, split_k, grid[0])
    x, qweight = tma_aligned(x.contiguous()), tma_aligned(qweight.contiguous())
    _wna16_tma_kernel[grid](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(qweight, [bn, bk * bits // 8]),
        scales, zeros if zeros is not None else qweight, bias if bias is not None else scales, out, ws, counts,
        m, n, k, scales.shape[1], k_per_split,
        BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None, SPLIT_K=split_k,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.get("GROUP_M", 8), ASM=x.is_cuda, DOT_F32=not x.is_cuda,
        TAIL_SPLIT=tail_split, FULL_TILES=full,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", LAUNCH_OPTIONS["num_stages"]),
    )  # fmt: skip
    return out
