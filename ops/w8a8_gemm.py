"""int8 x int8 GEMM with float scales (SmoothQuant W8A8): ``w8a8_gemm``.

Arguments::

    xq       int8    [M, K]      quantized activations
    x_scale  float32 [M, 1]      per-token   or [1] per-tensor
    wq       int8    [N, K]      quantized weight, rows = output channels (nn.Linear layout)
    w_scale  float32 [N]         per-channel or [1] per-tensor
    bias     [N] of out_dtype, or None
    out_dtype  float16 or bfloat16

Math::

    acc[m, n] = sum_k int32(xq[m, k]) * int32(wq[n, k])            exact int32
    out[m, n] = out_dtype( float32(acc) * x_scale[m] * w_scale[n] + float32(bias[n]) )

evaluated left to right in float32. Overflow bound: |acc| <= K * 128 * 128 = K * 2**14,
so the int32 accumulator is exact for every K <= 131071 ((2**31 - 1) // 2**14; at
K = 131072 all-(-128) operands reach 2**31, one past int32). Output:
contiguous [M, N].
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

OP = "w8a8_gemm"
MAX_K = (2**31 - 1) // 2**14  # 131071


def scale_epilogue(acc: Tensor, x_scale: Tensor, w_scale: Tensor, bias: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """``out_dtype(float32(acc) * x_scale * w_scale + bias)``: the epilogue shared by the int8 GEMMs."""
    out = acc.float() * x_scale.reshape(-1, 1) * w_scale.reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype).contiguous()


def w8a8_gemm_ref(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, bias: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """Reference kernel for ``w8a8_gemm``."""
    return scale_epilogue(int8_matmul_nt(xq.contiguous(), wq), x_scale, w_scale, bias, out_dtype)


def check_act_scale(op: str, x_scale: Tensor, m: int) -> None:
    check_tensor(op, "x_scale", x_scale)
    check_dtype(op, "x_scale", x_scale, torch.float32)
    if tuple(x_scale.shape) not in ((m, 1), (1,)):
        raise ValueError(f"qfuse.{op}: x_scale must have shape ({m}, 1) (per-token) or (1,) (per-tensor), got {tuple(x_scale.shape)}")


def check_weight_scale(op: str, w_scale: Tensor, n: int) -> None:
    check_tensor(op, "w_scale", w_scale)
    check_dtype(op, "w_scale", w_scale, torch.float32)
    if tuple(w_scale.shape) not in ((n,), (1,)):
        raise ValueError(f"qfuse.{op}: w_scale must have shape ({n},) (per-channel) or (1,) (per-tensor), got {tuple(w_scale.shape)}")
    check_contiguous(op, "w_scale", w_scale)  # the CUDA kernels read it with unit stride


def check_w8a8_args(xq, x_scale, wq, w_scale, bias, out_dtype) -> tuple[int, int, int]:
    """Validate every argument of ``w8a8_gemm``; return (M, N, K)."""
    check_tensor(OP, "xq", xq)
    check_tensor(OP, "wq", wq)
    check_dtype(OP, "xq", xq, torch.int8)
    check_ndim(OP, "xq", xq, 2, "[M, K]")
    m, k = xq.shape
    if k > MAX_K:
        raise ValueError(f"qfuse.{OP}: K={k} exceeds {MAX_K}, past which the int32 accumulator could overflow")
    check_dtype(OP, "wq", wq, torch.int8)
    check_ndim(OP, "wq", wq, 2, "[N, K]")
    n = wq.shape[0]
    check_shape(OP, "wq", wq, (n, k), f"[N, K] with K={k} from xq")
    check_contiguous(OP, "wq", wq)
    check_act_scale(OP, x_scale, m)
    check_weight_scale(OP, w_scale, n)
    check_out_dtype(OP, out_dtype)
    check_bias(OP, bias, n, out_dtype)
    check_same_device(OP, "xq", xq, x_scale=x_scale, wq=wq, w_scale=w_scale, bias=bias)
    return m, n, k


@custom_op("qfuse::w8a8_gemm")
def w8a8_gemm(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, bias: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """``(xq @ wq.T) * x_scale * w_scale (+ bias)`` with an exact int32 accumulator."""
    check_w8a8_args(xq, x_scale, wq, w_scale, bias, out_dtype)
    return w8a8_gemm_ref(xq, x_scale, wq, w_scale, bias, out_dtype)


@w8a8_gemm.register_kernel("cuda")
def _w8a8_gemm_cuda(xq, x_scale, wq, w_scale, bias, out_dtype):
    """The Triton kernel families of ops/int8/dispatch.py (each bit-identical to the reference)."""
    m, n, k = check_w8a8_args(xq, x_scale, wq, w_scale, bias, out_dtype)
    if m == 0 or n == 0 or k == 0:  # nothing to launch; an empty problem must not reach config selection (a pick measured on it)
        return w8a8_gemm_ref(xq, x_scale, wq, w_scale, bias, out_dtype)
    from .int8.dispatch import int8_gemm

    return int8_gemm(OP, xq, x_scale, wq, w_scale, None, bias, out_dtype, w4=False)


@w8a8_gemm.register_fake
def _w8a8_gemm_fake(xq, x_scale, wq, w_scale, bias, out_dtype):
    m, n, _ = check_w8a8_args(xq, x_scale, wq, w_scale, bias, out_dtype)
    return torch.empty((m, n), dtype=out_dtype, device=xq.device)
