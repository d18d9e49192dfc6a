"""int4 weight x int8 activation GEMM, QQQ-style: ``w4a8_gemm``.

Arguments::

    xq           int8    [M, K]        per-token (or per-tensor) quantized activations
    x_scale      float32 [M, 1] or [1]
    qweight      uint8   [N, K // 2]   int4 codes u in [0, 15], two per byte (low nibble =
                                       even k, see int4_packing.py); the weight code is q = u - 8
    w_scale      float32 [N] (per-channel) or [1]
    group_scale  int8    [N, K // G]   second-level integer scales in [1, 16] (group_size G =
                                       128, 64 or 32), or None (group_size=-1, per-channel)
    bias         [N] of out_dtype, or None
    group_size   -1, 128, 64 or 32 (64 and 32 run layers whose K 128 does not divide)
    out_dtype    float16 or bfloat16

Math (g = k // group_size; group_scale = 1 per-channel)::

    w_int[n, k] = (u[n, k] - 8) * group_scale[n, g]           integer in [-128, 112]
    acc[m, n]   = sum_k int32(xq[m, k]) * w_int[n, k]          exact int32
    out[m, n]   = out_dtype( float32(acc) * x_scale[m] * w_scale[n] + float32(bias[n]) )

so the real weight is ``w_scale[n] * group_scale[n, g] * q[n, k]``. The second-level
scale is an integer (QQQ stores it as fp16 and rounds ``q * s_group`` inside the
kernel, which is why its kernel and its fake-quant reference disagree); here the
kernel's int8 operand ``w_int`` is exact, so kernel and reference agree bit for bit
in the accumulator. Since |w_int| <= 128, |acc| <= K * 2**14 and int32 is exact for
K <= 131071 (MAX_K). Output: contiguous [M, N].

The group_scale range [1, 16] is a precondition (the quantizers guarantee it): the CPU
reference checks it, the CUDA kernel does not (checking values would need a host sync,
which a CUDA graph cannot hold), and an out-of-range scale would wrap in its int8 operand.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._custom_op import custom_op
from ._int_matmul import int8_matmul_nt
from ._validation import (
    check_bias,
    check_contiguous,
    check_dtype,
    check_ndim,
    check_out_dtype,
    check_same_device,
    check_shape,
    check_tensor,
)
from .int4_packing import unpack_int4
from .w8a8_gemm import MAX_K, check_act_scale, check_weight_scale, scale_epilogue

OP = "w4a8_gemm"
GROUP_SCALE_MAX = 16
GROUP_SIZES = (128, 64, 32)  # besides -1 (per channel); the same list as qfuse.schemes.W4A8_GROUP_SIZES


def w4a8_int_weight(qweight: Tensor, group_scale: Tensor | None, group_size: int) -> Tensor:
    """``w_int = (u - 8) * group_scale`` as int8 ``[N, K]`` (the kernel's int8 operand)."""
    q = unpack_int4(qweight).to(torch.int16) - 8
    if group_scale is not None:
        bad = int(((group_scale < 1) | (group_scale > GROUP_SCALE_MAX)).sum()) if group_scale.numel() else 0
        if bad:
            raise ValueError(
                f"qfuse.{OP}: group_scale values must lie in [1, {GROUP_SCALE_MAX}]; {bad} of {group_scale.numel()} "
                f"do not (min {int(group_scale.min())}, max {int(group_scale.max())})"
            )
        q = q * group_scale.to(torch.int16).repeat_interleave(group_size, dim=1)
    return q.to(torch.int8)


def dequantize_w4a8(qweight: Tensor, w_scale: Tensor, group_scale: Tensor | None, group_size: int) -> Tensor:
    """The real weight as float32 ``[N, K]``: ``w_scale[n] * w_int[n, k]``."""
    return w4a8_int_weight(qweight, group_scale, group_size).float() * w_scale.reshape(-1, 1)


def w4a8_gemm_ref(xq, x_scale, qweight, w_scale, group_scale, bias, group_size, out_dtype) -> Tensor:
    """Reference kernel for ``w4a8_gemm``."""
    acc = int8_matmul_nt(xq.contiguous(), w4a8_int_weight(qweight, group_scale, group_size))
    return scale_epilogue(acc, x_scale, w_scale, bias, out_dtype)


def check_w4a8_args(xq, x_scale, qweight, w_scale, group_scale, bias, group_size, out_dtype) -> tuple[int, int, int]:
    """Validate every argument of ``w4a8_gemm``; return (M, N, K)."""
    check_tensor(OP, "xq", xq)
    check_tensor(OP, "qweight", qweight)
    check_dtype(OP, "xq", xq, torch.int8)
    check_ndim(OP, "xq", xq, 2, "[M, K]")
    m, k = xq.shape
    if k % 2:
        raise ValueError(f"qfuse.{OP}: K={k} must be even (two int4 codes per byte)")
    if k > MAX_K:
        raise ValueError(f"qfuse.{OP}: K={k} exceeds {MAX_K}, past which the int32 accumulator could overflow")
    check_dtype(OP, "qweight", qweight, torch.uint8)
    check_ndim(OP, "qweight", qweight, 2, "[N, K // 2]")
    n = qweight.shape[0]
    check_shape(OP, "qweight", qweight, (n, k // 2), f"[N, K // 2] with K={k} from xq")
    check_contiguous(OP, "qweight", qweight)
    check_act_scale(OP, x_scale, m)
    check_weight_scale(OP, w_scale, n)
    if group_size == -1:
        if group_scale is not None:
            raise ValueError(f"qfuse.{OP}: group_scale must be None for per-channel weights (group_size=-1)")
    elif group_size in GROUP_SIZES:
        if k % group_size:
            raise ValueError(f"qfuse.{OP}: K={k} is not divisible by group_size={group_size}")
        if group_scale is None:
            raise ValueError(f"qfuse.{OP}: group_size={group_size} needs group_scale (int8 [N, K // {group_size}])")
        check_tensor(OP, "group_scale", group_scale)
        check_dtype(OP, "group_scale", group_scale, torch.int8)
        check_shape(OP, "group_scale", group_scale, (n, k // group_size), f"[N, K // {group_size}]")
        check_contiguous(OP, "group_scale", group_scale)
    else:
        raise ValueError(f"qfuse.{OP}: group_size must be -1 (per-channel), 128, 64 or 32, got {group_size}")
    check_out_dtype(OP, out_dtype)
    check_bias(OP, bias, n, out_dtype)
    check_same_device(OP, "xq", xq, x_scale=x_scale, qweight=qweight, w_scale=w_scale, group_scale=group_scale, bias=bias)
    return m, n, k


@custom_op("qfuse::w4a8_gemm")
def w4a8_gemm(
    xq: Tensor,
    x_scale: Tensor,
    qweight: Tensor,
    w_scale: Tensor,
    group_scale: Tensor | None,
    bias: Tensor | None,
    group_size: int,
    out_dtype: torch.dtype,
) -> Tensor:
    """int4 weights x int8 activations with an exact int32 accumulator and a float scale epilogue."""
    check_w4a8_args(xq, x_scale, qweight, w_scale, group_scale, bias, group_size, out_dtype)
    return w4a8_gemm_ref(xq, x_scale, qweight, w_scale, group_scale, bias, group_size, out_dtype)


@w4a8_gemm.register_kernel("cuda")
def _w4a8_gemm_cuda(xq, x_scale, qweight, w_scale, group_scale, bias, group_size, out_dtype):
    """The Triton kernel families of ops/int8/dispatch.py (each bit-identical to the reference):
    the tile kernel, the dp4a GEMV, the register-operand kernel, the TMA kernel or the
    int8-weight pass + W8A8 kernel, by config.

    group_scale values outside [1, 16] are not checked here (that would need a host
    sync); the kernel's int8 product wraps for them, as the docstring's range allows.
    """
    m, n, k = check_w4a8_args(xq, x_scale, qweight, w_scale, group_scale, bias, group_size, out_dtype)
    if m == 0 or n == 0 or k == 0:  # nothing to launch; an empty problem must not reach config selection (a pick measured on it)
        return w4a8_gemm_ref(xq, x_scale, qweight, w_scale, group_scale, bias, group_size, out_dtype)
    from .int8.dispatch import int8_gemm

    return int8_gemm(OP, xq, x_scale, qweight, w_scale, group_scale, bias, out_dtype, w4=True, group_size=group_size)


@w4a8_gemm.register_fake
def _w4a8_gemm_fake(xq, x_scale, qweight, w_scale, group_scale, bias, group_size, out_dtype):
    m, n, _ = check_w4a8_args(xq, x_scale, qweight, w_scale, group_scale, bias, group_size, out_dtype)
    return torch.empty((m, n), dtype=out_dtype, device=xq.device)
