"""int8 tile kernel fed by the Tensor Memory Accelerator: W8A8, and W4A8 with the int4 unpack fused.

The math is the one of ops/int8/common.py (``w8a8_gemm`` / ``w4a8_gemm``)::

    acc[m, n] = sum_k int32(xq[m, k]) * w_int[n, k]                         exact int32
    out[m, n] = out_dtype( (float32(acc) * x_scale[m]) * w_scale[n] + float32(bias[n]) )

with ``w_int = wq`` (W8A8) or ``(u - 8) * group_scale[n, k // 128]`` (W4A8, |w_int| <= 128), and the
same epilogue (``epilogue``: FMA contraction off, bf16 rounded to nearest even), so the output is
bit-identical to the reference. What differs from the pointer kernel:

* **TMA loads**: host-side ``TensorDescriptor``s of ``xq [M, K]`` and of the weight (``wq [N, K]``,
  or the packed ``[N, K / 2]`` bytes). One thread issues a bulk tensor copy per operand tile instead
  of every thread computing addresses for 16-byte ``cp.async`` loads, and the copy engine zero-fills
  rows past M or N and columns past K, so the tails need no masks (zero activations past K meet the
  packed zeros' ``u - 8 = -8``: products 0). Needs 16-byte row strides, ``K % 16 == 0`` (packed:
  ``K % 32``; :func:`tma_supported`) and 16-byte aligned bases (the launcher copies a misaligned one).
* **Operand roles**: W8A8 keeps the pointer kernel's weight-major tiles (``acc^T = wq @ xq^T``: the
  weight is wgmma's M side, both operands in shared memory). W4A8 unpacks the loaded bytes in
  registers (inline PTX on the GPU, the group scale folded in: ``unpack_w4``) and computes
  ``acc = xq @ w_int^T``, so the unpacked weight is wgmma's shared-memory B operand, stored once per
  slice, where the pointer kernel feeds it as the register A operand (slower at large M: the
  ``fused TMA`` against ``asm`` columns in BENCHMARKS.md). Offered at M > 64, where the tokens fill
  wgmma's 64-row M side.
* **Occupancy, not pipelining, hides the MMA drains**: Triton keeps an int32-accumulator wgmma
  synchronous, so the useful tiles are those that fit 2-3 programs per SM (``tma_configs``).
* **Persistent grid** (``PERSISTENT`` programs per SM in the config): ``min(tiles, PERSISTENT * SMs)``
  programs walk the tiles with stride ``programs`` (tile loop not flattened: with
  ``tl.range(..., flatten=True)`` the 256x128x128 tile spilled 608 B of stack; triton 3.7.1).

Tile order: GROUP_N weight-row tiles x every token tile, as the pointer kernel (a weight column tile
is re-read by the token tiles while it is in L2). No split-K: the decode shapes that need it keep the
pointer kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._launch import launch
from .._tma import tma_aligned
from ..kernel_family import KernelFamily, Problem
from .common import epilogue, tile_of, unpack_w4
from .tile import tile_config


@triton.jit
def _one_tile(
    x_desc,
    w_desc,
    xs_ptr,
    ws_ptr,
    gs_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    tile,
    num_pid_n,
    num_pid_m,
    W4: tl.constexpr,
    GROUPED: tl.constexpr,
    UNPACK_ASM: tl.constexpr,
    X_PER_TOKEN: tl.constexpr,
    W_PER_CHANNEL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_N: tl.constexpr,
):
    pid_n, pid_m = tile_of(tile, num_pid_n, num_pid_m, GROUP_N)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    rows_n = tl.where(mask_n, offs_n, 0)
    if W4:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    for kt in range(tl.cdiv(K, BLOCK_K)):
        x = x_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])  # [BLOCK_M, BLOCK_K], zero past M / K
        if W4:
            # packed bytes [BLOCK_N, BLOCK_K / 2]; zero bytes past K unpack to -8, against zero activations
            # BLOCK_K divides 128: the tile lies in group k0 // 128
            gs = tl.load(gs_ptr + rows_n * (K // 128) + (kt * BLOCK_K) // 128) if GROUPED else 1
            w = unpack_w4(w_desc.load([pid_n * BLOCK_N, kt * (BLOCK_K // 2)]), gs, UNPACK_ASM, GROUPED)
            acc = tl.dot(x, w.T, acc, out_dtype=tl.int32)  # registers -> shared memory B operand
        else:
            w = w_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])  # [BLOCK_N, BLOCK_K], zero past N / K
            acc = tl.dot(w, x.T, acc, out_dtype=tl.int32)
    if W4:
        acc = tl.trans(acc)
    epilogue(
        acc,
        xs_ptr,
        ws_ptr,
        bias_ptr,
        out_ptr,
        offs_m,
        offs_n,
        tl.where(mask_m, offs_m, 0),
        rows_n,
        mask_n[:, None] & mask_m[None, :],
        N,
        X_PER_TOKEN,
        W_PER_CHANNEL,
        HAS_BIAS,
    )


@triton.jit(do_not_specialize=["M"])
def _int8_gemm_tma_kernel(
    x_desc,
    w_desc,
    xs_ptr,
    ws_ptr,
    gs_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    PROGRAMS,
    W4: tl.constexpr,
    GROUPED: tl.constexpr,
    UNPACK_ASM: tl.constexpr,
    X_PER_TOKEN: tl.constexpr,
    W_PER_CHANNEL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_N: tl.constexpr,
    PERSISTENT: tl.constexpr,
):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    if PERSISTENT:
        for tile in range(tl.program_id(0), num_pid_n * num_pid_m, PROGRAMS):
            _one_tile(
                x_desc,
                w_desc,
                xs_ptr,
                ws_ptr,
                gs_ptr,
                bias_ptr,
                out_ptr,
                M,
                N,
                K,
                tile,
                num_pid_n,
                num_pid_m,
                W4,
                GROUPED,
                UNPACK_ASM,
                X_PER_TOKEN,
                W_PER_CHANNEL,
                HAS_BIAS,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                GROUP_N,
            )
    else:
        _one_tile(
            x_desc,
            w_desc,
            xs_ptr,
            ws_ptr,
            gs_ptr,
            bias_ptr,
            out_ptr,
            M,
            N,
            K,
            tl.program_id(0),
            num_pid_n,
            num_pid_m,
            W4,
            GROUPED,
            UNPACK_ASM,
            X_PER_TOKEN,
            W_PER_CHANNEL,
            HAS_BIAS,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            GROUP_N,
        )


def tma_supported(k: int, w4: bool = False) -> bool:
    """Whether the TMA kernel can take a K: the descriptors need 16-byte row strides (int8 rows
    of K bytes; packed int4 rows of K / 2)."""
    return k % (32 if w4 else 16) == 0


def tma_configs(m: int, k: int, group_size: int = -1, w4: bool = False) -> list[dict]:
    """Configs of the TMA-fed kernel (ops/int8/tma.py; no split-K; none where K is too
    ragged for a descriptor). ``PERSISTENT``: programs per SM, 0 = one program per tile.
    ``w4``: its W4A8 form (M > 64 only: it unpacks into wgmma's B operand, whose M side is the
    tokens), BLOCK_K within the group of 128.

    Triton keeps a wgmma with an int32 accumulator synchronous (a ``wait 0`` after every K
    slice; only float32 accumulators are pipelined, checked in the PTX with triton 3.7.1), so
    the tensor cores idle while each slice's MMAs drain. The large-M tiles therefore include
    BLOCK_K = 256 (half the drains per MAC) and tiles of one warpgroup small enough for two or
    three programs per SM (128 x 128 x 128, 3 stages: 96 KB of shared memory, 159 registers a
    thread), whose drains (and epilogues) the other programs' MMAs fill: on the H200 that tile
    took W8A8 4096 x 4096 x 1024 from 35.1 to 26.9 us (BENCHMARKS.md). Two
    stages (64 KB, 160 registers) fit three programs per SM: 6144 x 4096 x 1024's 384 tiles of
    128 x 128 in one wave of 396 instead of 1.45 waves of 264.
    """
    if not tma_supported(k, w4) or (w4 and (m <= 64 or group_size not in (-1, 128))):  # its W4 form reads groups of 128
        return []
    # persistent variants only where the sm_90 compile keeps the loop in registers (triton 3.7.1:
    # the tile loop made e.g. 128 x 256 x 128 and 128 x 128 x 128 / 4 warps spill 320 B of stack)
    if w4:
        tiles = (
            (128, 128, 128, 4, 3, (0,)),
            (128, 128, 128, 8, 4, (0,)),
            (256, 128, 128, 8, 3, (0,)),
            (64, 128, 128, 4, 4, (0,)),
            (64, 128, 128, 4, 3, (0,)),
            (128, 64, 128, 4, 3, (0,)),
            (128, 64, 128, 4, 2, (0,)),
        )
    elif m <= 16:
        tiles = ((16, 64, 256, 4, 6, (0, 1)), (16, 128, 256, 4, 4, (0, 1)), (16, 64, 128, 4, 8, (0, 1)))
    elif m <= 64:
        tiles = ((32, 128, 128, 4, 4, (0, 1)),) if m <= 32 else ((64, 128, 128, 4, 4, (0,)),)
    elif m <= 512:
        tiles = ((64, 128, 128, 4, 4, (0,)), (128, 128, 128, 8, 4, (0, 1)), (128, 128, 128, 4, 3, (0,)), (128, 256, 128, 8, 3, (0,)))
    else:
        tiles = (
            (256, 128, 128, 8, 3, (0, 1)),
            (128, 256, 128, 8, 3, (0,)),
            (256, 128, 128, 8, 4, (0, 1)),
            (128, 128, 128, 4, 3, (0,)),
            (256, 128, 256, 8, 2, (0, 1)),
            (128, 256, 256, 8, 2, (0,)),
            (64, 128, 128, 4, 4, (0,)),
            (64, 128, 128, 4, 3, (0,)),
            (128, 64, 128, 4, 3, (0,)),
            (128, 128, 128, 4, 2, (0,)),
            (128, 128, 64, 4, 3, (0,)),
        )
    kmax = 128 if group_size == 128 else 256
    out = [dict(tile_config(bm, bn, min(bk, kmax), 1, w, s), PERSISTENT=p) for bm, bn, bk, w, s, ps in tiles for p in ps]
    return list({str(c): c for c in out}.values())


def run_int8_gemm_tma(xq, x_scale, w, w_scale, group_scale, bias, out, config: dict, sms: int, *, w4: bool):
    """Launch into ``out [M, N]`` with ``config``; ``w``: int8 ``[N, K]``, or with ``w4`` packed
    int4 ``[N, K / 2]`` (and ``group_scale`` for group 128). Arguments checked by the op."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = xq.shape
    n = w.shape[0]
    if not tma_supported(k, w4):
        raise ValueError(f"int8 TMA kernel: K={k} is not a multiple of {32 if w4 else 16} (TMA row strides)")
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    if group_scale is not None and (group_scale.shape[1] * 128 != k or 128 % bk):
        raise ValueError(
            f"int8 TMA kernel: W4A8 runs group 128 with BLOCK_K dividing it, got K={k} with {group_scale.shape[1]} groups and BLOCK_K={bk}"
        )
    xq, w = tma_aligned(xq.contiguous()), tma_aligned(w)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    # PROGRAMS (tests) pins the grid; PERSISTENT: that many programs per SM; else one per tile
    programs = config.get("PROGRAMS") or (min(tiles, config["PERSISTENT"] * sms) if config.get("PERSISTENT") else tiles)
    launch(_int8_gemm_tma_kernel, (programs,),
        TensorDescriptor.from_tensor(xq, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk // 2 if w4 else bk]),
        x_scale.reshape(-1).contiguous(), w_scale, group_scale if group_scale is not None else w_scale,
        bias if bias is not None else w_scale, out, m, n, k, programs,
        W4=w4, GROUPED=group_scale is not None, UNPACK_ASM=bool(config.get("UNPACK_ASM", 0)) and w4,
        X_PER_TOKEN=x_scale.dim() == 2, W_PER_CHANNEL=w_scale.numel() != 1, HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_N=config["GROUP_N"], PERSISTENT=programs != tiles,
        num_warps=config["num_warps"], num_stages=config["num_stages"], enable_fp_fusion=False,
    )  # fmt: skip
    return out


def _supports(p: Problem) -> tuple[bool, str]:
    if not p.gpu or not p.tma:
        return False, "needs a GPU with TMA (compute capability >= 9.0)"
    if not tma_supported(p.k, p.bits == 4):
        return False, f"K % {32 if p.bits == 4 else 16} != 0 (TMA row strides)"
    if p.bits == 4 and (p.m <= 64 or p.group_size not in (-1, 128)):
        return False, "W4A8: M > 64 only (the unpack feeds wgmma's B operand), groups of 128 or per channel"
    return True, ""


def _configs(p: Problem, exhaustive: bool) -> list[dict]:
    if p.bits == 4:  # M > 64: unpack into the B operand
        return [dict(c, UNPACK_ASM=1) for c in tma_configs(p.m, p.k, p.group_size, w4=True)]
    return tma_configs(p.m, p.k)


def _run(cfg, xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4):
    import torch

    from .._autotune import sm_count

    m, n = xq.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return out
    return run_int8_gemm_tma(xq, x_scale, w, w_scale, group_scale, bias, out, cfg, sm_count(xq.device), w4=w4)


FAMILY = KernelFamily("tma", "int8/tma", _supports, _configs, _run)
