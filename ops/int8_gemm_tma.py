"""int8 tile kernel fed by the Tensor Memory Accelerator: W8A8, and W4A8 with the int4 unpack fused.

The math is the one of ops/int8_gemm_kernels.py (``w8a8_gemm`` / ``w4a8_gemm``)::

    acc[m, n] = sum_k int32(xq[m, k]) * w_int[n, k]                         exact int32
    out[m, n] = out_dtype( (float32(acc) * x_scale[m]) * w_scale[n] + float32(bias[n]) )

with ``w_int = wq`` (W8A8) or ``(u - 8) * group_scale[n, k // 128]`` (W4A8, |w_int| <= 128), and the
same epilogue (``_epilogue``: FMA contraction off, bf16 rounded to nearest even), so the output is
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

from ._tma import tma_aligned
from .int8_gemm_kernels import _epilogue, tile_of, unpack_w4


@triton.jit
def _one_tile(x_desc, w_desc, xs_ptr, ws_ptr, gs_ptr, bias_ptr, out_ptr, M, N, K, tile, num_pid_n, num_pid_m,
              W4: tl.constexpr, GROUPED: tl.constexpr, UNPACK_ASM: tl.constexpr,
              X_PER_TOKEN: tl.constexpr, W_PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_N: tl.constexpr):
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
    _epilogue(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, offs_m, offs_n, tl.where(mask_m, offs_m, 0),
              rows_n, mask_n[:, None] & mask_m[None, :], N, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS)


@triton.jit(do_not_specialize=["M"])
def _int8_gemm_tma_kernel(
    x_desc, w_desc, xs_ptr, ws_ptr, gs_ptr, bias_ptr, out_ptr, M, N, K, PROGRAMS,
    W4: tl.constexpr, GROUPED: tl.constexpr, UNPACK_ASM: tl.constexpr,
    X_PER_TOKEN: tl.constexpr, W_PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_N: tl.constexpr,
    PERSISTENT: tl.constexpr,
):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    if PERSISTENT:
        for tile in range(tl.program_id(0), num_pid_n * num_pid_m, PROGRAMS):
            _one_tile(x_desc, w_desc, xs_ptr, ws_ptr, gs_ptr, bias_ptr, out_ptr, M, N, K, tile, num_pid_n, num_pid_m,
                      W4, GROUPED, UNPACK_ASM, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_N)
    else:
        _one_tile(x_desc, w_desc, xs_ptr, ws_ptr, gs_ptr, bias_ptr, out_ptr, M, N, K, tl.program_id(0), num_pid_n, num_pid_m,
                  W4, GROUPED, UNPACK_ASM, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_N)


def tma_supported(k: int, w4: bool = False) -> bool:
    """Whether the TMA kernel can take a K: the descriptors need 16-byte row strides (int8 rows
    of K bytes; packed int4 rows of K / 2)."""
    return k % (32 if w4 else 16) == 0


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
        raise ValueError(f"int8 TMA kernel: W4A8 runs group 128 with BLOCK_K dividing it, got K={k} with "
                         f"{group_scale.shape[1]} groups and BLOCK_K={bk}")
    xq, w = tma_aligned(xq.contiguous()), tma_aligned(w)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    # PROGRAMS (tests) pins the grid; PERSISTENT: that many programs per SM; else one per tile
    programs = config.get("PROGRAMS") or (min(tiles, config["PERSISTENT"] * sms) if config.get("PERSISTENT") else tiles)
    _int8_gemm_tma_kernel[(programs,)](
        TensorDescriptor.from_tensor(xq, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk // 2 if w4 else bk]),
        x_scale.reshape(-1).contiguous(), w_scale, group_scale if group_scale is not None else w_scale,
        bias if bias is not None else w_scale, out, m, n, k, programs,
        W4=w4, GROUPED=group_scale is not None, UNPACK_ASM=bool(config.get("UNPACK_ASM", 0)) and w4,
        X_PER_TOKEN=x_scale.dim() == 2, W_PER_CHANNEL=w_scale.numel() != 1, HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_N=config["GROUP_N"], PERSISTENT=programs != tiles,
        num_warps=config["num_warps"], num_stages=config["num_stages"], enable_fp_fusion=False,
    )  # fmt: skip
    return out
