"""RMSNorm (Hugging Face ``LlamaRMSNorm`` semantics), residual-add + RMSNorm, and
both followed by dynamic per-token int8 quantization.

Math, for x: [..., H] fp16/bf16 and weight: [H] of the same dtype::

    rms_norm(x, weight, eps):
        xf   = float32(x)
        y    = xf * rsqrt(mean_h(xf^2) + eps)        float32
        out  = weight * dtype(y)                      (the product rounds once, in x.dtype)

    fused_add_rms_norm(x, residual, weight, eps):
        residual_out = x + residual                   (in x.dtype, as HF's decoder layer adds)
        out          = rms_norm(residual_out, weight, eps)
        returns (out, residual_out)

    rms_norm_quant(x, weight, eps)                 = quant_per_token_int8(rms_norm(x, weight, eps))
    fused_add_rms_norm_quant(x, residual, weight, eps)
        = (*quant_per_token_int8(out), residual_out)  with (out, residual_out) = fused_add_rms_norm(...)

The fused ops return exactly what the composition of the unfused ops returns
(same codes, same scales, same residual): that is their definition, and the
reference kernels below are written as that composition. An all-zero row
normalizes to zeros (rsqrt(eps) is finite for eps > 0). All outputs are contiguous.

CUDA kernels: Triton, one kernel for all four ops in ``ops/activation/norm_kernels.py``. On
one device a fused op equals the composition of the unfused CUDA ops bit for bit, except for H
a multiple of 8 but not of 16 up to 1024 (520, 1000, 1016: compiled for sm_90 with triton 3.7.1,
3.8.0 and 3.9.0, ``rms_norm_quant`` sums the squares in another order than ``rms_norm``, which
can move a row by up to the 2 ulps below; every other H tested agrees, 4095 and 4097 included);
against the plain-torch reference the float sum of squares is taken in another
order, so an output can differ by up to 2 ulps of its dtype where the normalized
value lies at a rounding boundary (one ulp in dtype(x * rsqrt), doubled at most by
the weight product). Measured on an H200 (M=1024, H 4096/14336, fp16/bf16): 0 to
1,135 of 4.2M-14.7M outputs, moving 0-58 codes by 1 and no scale.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._custom_op import custom_op
from ._validation import ACT_DTYPES, check_dtype, check_nonempty_last, check_same_device, check_shape, check_tensor
from .quant_int8 import quant_per_token_int8_ref


def rms_norm_ref(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Reference kernel for ``rms_norm``: exactly ``LlamaRMSNorm.forward``."""
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    y = xf * torch.rsqrt(variance + eps)
    return (weight * y.to(x.dtype)).contiguous()


def fused_add_rms_norm_ref(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    residual_out = (x + residual).contiguous()
    return rms_norm_ref(residual_out, weight, eps), residual_out


def rms_norm_quant_ref(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return quant_per_token_int8_ref(rms_norm_ref(x, weight, eps))


def fused_add_rms_norm_quant_ref(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    out, residual_out = fused_add_rms_norm_ref(x, residual, weight, eps)
    xq, scale = quant_per_token_int8_ref(out)
    return xq, scale, residual_out


def _check(op: str, x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None) -> None:
    check_tensor(op, "x", x)
    check_tensor(op, "weight", weight)
    check_dtype(op, "x", x, ACT_DTYPES)
    check_nonempty_last(op, "x", x)
    check_dtype(op, "weight", weight, x.dtype)
    check_shape(op, "weight", weight, (x.shape[-1],), "the hidden size of x")
    if residual is not None:
        check_tensor(op, "residual", residual)
        check_dtype(op, "residual", residual, x.dtype)
        check_shape(op, "residual", residual, tuple(x.shape), "same as x")
    check_same_device(op, "x", x, weight=weight, residual=residual)
    if isinstance(eps, bool) or not isinstance(eps, (float, int)) or not 0.0 < eps < float("inf"):  # inf: all zeros
        raise ValueError(f"qfuse.{op}: eps must be a positive finite float, got {eps!r}")


def _int8_and_scale_like(x: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty(x.shape, dtype=torch.int8, device=x.device), torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)


@custom_op("qfuse::rms_norm")
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm with Hugging Face ``LlamaRMSNorm`` semantics."""
    _check("rms_norm", x, weight, eps)
    return rms_norm_ref(x, weight, eps)


@rms_norm.register_kernel("cuda")
def _rms_norm_cuda(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    _check("rms_norm", x, weight, eps)
    from .activation.norm_kernels import rms_norm_triton  # triton only when a GPU op runs

    return rms_norm_triton(x, weight, eps)


@rms_norm.register_fake
def _rms_norm_fake(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    _check("rms_norm", x, weight, eps)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@custom_op("qfuse::fused_add_rms_norm")
def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``residual_out = x + residual; out = rms_norm(residual_out)``; returns ``(out, residual_out)``."""
    _check("fused_add_rms_norm", x, weight, eps, residual)
    return fused_add_rms_norm_ref(x, residual, weight, eps)


@fused_add_rms_norm.register_kernel("cuda")
def _fused_add_rms_norm_cuda(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    _check("fused_add_rms_norm", x, weight, eps, residual)
    from .activation.norm_kernels import fused_add_rms_norm_triton  # triton only when a GPU op runs

    return fused_add_rms_norm_triton(x, residual, weight, eps)


@fused_add_rms_norm.register_fake
def _fused_add_rms_norm_fake(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    _check("fused_add_rms_norm", x, weight, eps, residual)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty(x.shape, dtype=x.dtype, device=x.device)


@custom_op("qfuse::rms_norm_quant")
def rms_norm_quant(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``quant_per_token_int8(rms_norm(x, weight, eps))`` in one op; returns ``(xq, scale)``."""
    _check("rms_norm_quant", x, weight, eps)
    return rms_norm_quant_ref(x, weight, eps)


@rms_norm_quant.register_kernel("cuda")
def _rms_norm_quant_cuda(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    _check("rms_norm_quant", x, weight, eps)
    from .activation.norm_kernels import rms_norm_quant_triton  # triton only when a GPU op runs

    return rms_norm_quant_triton(x, weight, eps)


@rms_norm_quant.register_fake
def _rms_norm_quant_fake(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    _check("rms_norm_quant", x, weight, eps)
    return _int8_and_scale_like(x)


@custom_op("qfuse::fused_add_rms_norm_quant")
def fused_add_rms_norm_quant(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Residual add, RMSNorm and per-token int8 quantization; returns ``(xq, scale, residual_out)``."""
    _check("fused_add_rms_norm_quant", x, weight, eps, residual)
    return fused_add_rms_norm_quant_ref(x, residual, weight, eps)


@fused_add_rms_norm_quant.register_kernel("cuda")
def _fused_add_rms_norm_quant_cuda(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    _check("fused_add_rms_norm_quant", x, weight, eps, residual)
    from .activation.norm_kernels import fused_add_rms_norm_quant_triton  # triton only when a GPU op runs

    return fused_add_rms_norm_quant_triton(x, residual, weight, eps)


@fused_add_rms_norm_quant.register_fake
def _fused_add_rms_norm_quant_fake(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    _check("fused_add_rms_norm_quant", x, weight, eps, residual)
    xq, scale = _int8_and_scale_like(x)
    return xq, scale, torch.empty(x.shape, dtype=x.dtype, device=x.device)
