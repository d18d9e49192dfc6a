"""Weight-only quantized GEMM: W8A16 and W4A16 (``wna16_gemm``).

Layout (prepacked once, at quantize or load time; never repacked per call)::

    x        [M, K]           fp16 or bf16 activations
    qweight  bits=8: uint8 [N, K]       unsigned codes u in [0, 255]
             bits=4: uint8 [N, K // 2]  unsigned codes u in [0, 15], two per byte
                                         (low nibble = even k; see int4_packing.py)
    scales   [N, G]  x.dtype             G = K // group_size groups (G = 1 per-channel)
    zeros    [N, G]  uint8 or None       integer zero points; None = symmetric, z = 2**(bits-1)
    bias     [N]     x.dtype or None
    group_size  -1 (per-channel), 32, 64 or 128;  K % group_size == 0

Math (g = k // group_size, or 0 per-channel)::

    w_hat[n, k] = dtype( float32(u[n, k] - z[n, g]) * float32(scales[n, g]) )   (one rounding)
    out[m, n]   = dtype( sum_k float32(x[m, k]) * float32(w_hat[n, k]) + float32(bias[n]) )

i.e. ``out = x @ w_hat.T + bias`` with a float32 accumulator, the dequantized
weight rounded to the activation dtype first, as a tensor-core kernel sees it.
A Triton kernel matches this up to float32 summation order (and, where it
applies a group's scale after that group's partial dot, one rounding of the
weight): tolerance stated in the tests. Output: contiguous [M, N] of x.dtype.

CUDA: Triton kernels picked per M bucket (ops/wna16/dispatch.py; configs from
``ops/tuned/wna16_gemm.<gpu>.json`` or ``$QFUSE_AUTOTUNE_CACHE``, see ops/_autotune.py).
Any M, any N, any K that the checks above accept (even K for 4-bit, K % group_size == 0);
no repacking per call: the kernels read this layout as is.

Value checks. Zero points must lie in [0, 2**bits), the range of a code: the CUDA
kernels' bit-trick dequantization assumes z fits the code width, so a 4-bit z of
16..255 gives a silently wrong weight there (and CPU and CUDA would disagree)::

    CPU (reference kernel)  4-bit zeros: ValueError naming the count and the max
    CUDA                    nothing that reads data (it would sync the host and break
                            CUDA-graph capture); 8-bit uint8 zeros are in range by
                            their dtype, 4-bit zeros are NOT checked
    load / quantize time    ``check_wna16_zeros(zeros, bits)``: any device, may sync;
                            call it once where the zeros are made or loaded

Scales, x and bias are not value-checked: any scale is a well-defined weight
(0 or negative included), and a NaN/inf there propagates to the output, not hidden.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._custom_op import custom_op
from ._validation import (
    ACT_DTYPES,
    check_bias,
    check_contiguous,
    check_dtype,
    check_group_size,
    check_int_range,
    check_ndim,
    check_same_device,
    check_shape,
    check_tensor,
)
from .int4_packing import unpack_int4

OP = "wna16_gemm"


def dequantize_wna16(qweight: Tensor, scales: Tensor, zeros: Tensor | None, bits: int, group_size: int) -> Tensor:
    """The real weight ``w_hat`` as float32 ``[N, K]`` (before the rounding to the activation dtype)."""
    codes = unpack_int4(qweight) if bits == 4 else qweight
    k = codes.shape[1]
    g = k if group_size == -1 else group_size
    z = (1 << (bits - 1)) if zeros is None else zeros.to(torch.int32).repeat_interleave(g, dim=1)
    s = scales.float().repeat_interleave(g, dim=1)
    return (codes.to(torch.int32) - z).float() * s


def wna16_gemm_ref(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int) -> Tensor:
    """Reference kernel for ``wna16_gemm`` (plain torch, any device)."""
    w_hat = dequantize_wna16(qweight, scales, zeros, bits, group_size).to(x.dtype)
    acc = x.float() @ w_hat.float().t()
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(x.dtype).contiguous()


def check_wna16_args(x, qweight, scales, zeros, bias, bits, group_size) -> tuple[int, int, int]:
    """Validate every argument of ``wna16_gemm``; return (M, N, K)."""
    for name, t in (("x", x), ("qweight", qweight), ("scales", scales)):
        check_tensor(OP, name, t)
    check_dtype(OP, "x", x, ACT_DTYPES)
    check_ndim(OP, "x", x, 2, "[M, K]; flatten leading dimensions first")
    if bits not in (4, 8):
        raise ValueError(f"qfuse.{OP}: bits must be 4 or 8, got {bits}")
    m, k = x.shape
    if bits == 4 and k % 2:
        raise ValueError(f"qfuse.{OP}: K={k} must be even for 4-bit weights (two codes per byte)")
    check_dtype(OP, "qweight", qweight, torch.uint8)
    check_ndim(OP, "qweight", qweight, 2, "[N, K] for 8-bit, [N, K // 2] for 4-bit")
    n = qweight.shape[0]
    check_shape(OP, "qweight", qweight, (n, k * bits // 8), f"{bits}-bit codes for K={k} from x")
    check_contiguous(OP, "qweight", qweight)
    groups = check_group_size(OP, group_size, k)
    check_dtype(OP, "scales", scales, x.dtype)
    check_shape(OP, "scales", scales, (n, groups), f"[N, K // group_size] for group_size={group_size}")
    check_contiguous(OP, "scales", scales)
    if zeros is not None:
        check_tensor(OP, "zeros", zeros)
        check_dtype(OP, "zeros", zeros, torch.uint8)
        check_shape(OP, "zeros", zeros, (n, groups), "same as scales")
        check_contiguous(OP, "zeros", zeros)
    check_bias(OP, bias, n, x.dtype)
    check_same_device(OP, "x", x, qweight=qweight, scales=scales, zeros=zeros, bias=bias)
    return m, n, k


def check_wna16_zeros(zeros: Tensor | None, bits: int) -> None:
    """Raise ``ValueError`` unless every zero point lies in [0, 2**bits).

    For loaders and quantizers: call once at load/quantize time, on any device (it reads
    the data, so on CUDA it syncs; the CUDA op itself does not check, see the module
    docstring). Accepts any integer dtype, so it also catches values a cast to uint8
    would wrap. ``None`` (symmetric) passes.
    """
    if bits not in (4, 8):
        raise ValueError(f"qfuse.{OP}: bits must be 4 or 8, got {bits}")
    if zeros is None:
        return
    check_tensor(OP, "zeros", zeros)
    check_int_range(OP, "zeros", zeros, 0, 1 << bits, f" for bits={bits}")


@custom_op("qfuse::wna16_gemm")
def wna16_gemm(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int) -> Tensor:
    """``x @ dequant(qweight).T + bias`` for 8- or 4-bit weights and fp16/bf16 activations."""
    check_wna16_args(x, qweight, scales, zeros, bias, bits, group_size)
    check_wna16_zeros(zeros, bits)  # reads data: reference path only, never the CUDA kernel
    return wna16_gemm_ref(x, qweight, scales, zeros, bias, bits, group_size)


@wna16_gemm.register_kernel("cuda")
def _wna16_gemm_cuda(x, qweight, scales, zeros, bias, bits, group_size):
    """Triton kernels chosen by M bucket (ops/wna16/dispatch.py): GEMV / split-K tiled for
    decode, tiled tensor-core GEMM for large M, dequant + cuBLAS only where measured faster."""
    m, n, k = check_wna16_args(x, qweight, scales, zeros, bias, bits, group_size)
    if m == 0 or n == 0 or k == 0:
        return wna16_gemm_ref(x, qweight, scales, zeros, bias, bits, group_size)
    from .wna16.dispatch import wna16_gemm_triton

    return wna16_gemm_triton(x, qweight, scales, zeros, bias, bits, group_size)


@wna16_gemm.register_fake
def _wna16_gemm_fake(x, qweight, scales, zeros, bias, bits, group_size):
    m, n, _ = check_wna16_args(x, qweight, scales, zeros, bias, bits, group_size)
    return torch.empty((m, n), dtype=x.dtype, device=x.device)
