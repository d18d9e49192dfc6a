"""Symmetric int8 activation quantization: dynamic per-token and static per-tensor.

Math (all arithmetic in float32, IEEE division, ``round`` = round-half-to-even
as ``torch.round``)::

    quant_per_token_int8(x):                 x: [..., K] fp16/bf16
        amax[r]  = max_k |x[r, k]|                               (per row r)
        scale[r] = max(amax[r], 1e-10) / 127                     float32 [..., 1]
        xq[r, k] = clamp(round(x[r, k] / scale[r]), -128, 127)   int8   [..., K]

    quant_per_tensor_int8(x, scale):         scale: float32 [1], finite, > 0 (static, calibrated)
        xq = clamp(round(x / scale), -128, 127)

``x ≈ xq * scale``. An all-zero row gets the finite scale 1e-10/127 and zero
codes (the 1e-10 floor is what keeps 0/0 out; it changes no row whose amax is
above 1e-10). Codes of the per-token path lie in [-127, 127] since
|x| <= amax. Outputs are contiguous.

CUDA kernels: Triton, in ``ops/activation/quant_kernels.py`` (codes and scales bit-exact to
the reference kernel run on the same device).

Value checks of ``quant_per_tensor_int8`` (a scale <= 0 flips or zeroes every code,
a NaN/inf scale makes them 0 or garbage, and a NaN activation becomes code 0, a
finite value downstream: all silent)::

    CPU (reference kernel)  scale finite and > 0, x free of NaN: ValueError naming
                            the bad value / the NaN count
    CUDA                    nothing that reads data (it would sync the host and break
                            CUDA-graph capture; scale must be on x's device, so it
                            can never be read for free)
    load / calibrate time   ``check_static_scale(scale)``: any device, may sync
    never                   NaN activations on CUDA (they are per-call data)

A tiny positive scale is valid (codes saturate at -128/127), and so is +-inf in x
(it saturates too). ``quant_per_token_int8`` is not value-checked: a NaN in a row
makes that row's scale NaN, so it propagates instead of hiding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._custom_op import custom_op
from ._validation import (
    ACT_DTYPES,
    check_dtype,
    check_no_nan,
    check_nonempty_last,
    check_positive_finite,
    check_same_device,
    check_shape,
    check_tensor,
)

AMAX_FLOOR = 1e-10


def quant_per_token_int8_ref(x: Tensor) -> tuple[Tensor, Tensor]:
    """Reference kernel for ``quant_per_token_int8`` (plain torch, any device)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    # A tensor divisor, not the Python scalar 127.0: on CUDA, torch computes
    # ``t / python_scalar`` as ``t * fl(1/127)`` (BinaryDivTrueKernel.cu), which is
    # not IEEE division and differs in the last bit for ~4.4% of amax values
    # (measured on 2**20 random floats); this form divides on every device.
    scale = amax.clamp(min=AMAX_FLOOR) / torch.full_like(amax, 127.0)
    xq = torch.round(xf / scale).clamp(-128, 127).to(torch.int8)
    return xq.contiguous(), scale.contiguous()


def quant_per_tensor_int8_ref(x: Tensor, scale: Tensor) -> Tensor:
    """Reference kernel for ``quant_per_tensor_int8``."""
    return torch.round(x.float() / scale).clamp(-128, 127).to(torch.int8).contiguous()


def check_static_scale(scale: Tensor | float) -> None:
    """Raise ``ValueError`` unless every value of the static ``scale`` is finite and > 0.

    For loaders and calibration: call once when the scale is made or loaded, on any
    device (it reads the data, so on CUDA it syncs; the CUDA op itself does not check,
    see the module docstring).
    """
    check_positive_finite("quant_per_tensor_int8", "scale", torch.as_tensor(scale))


def _check_per_token(x: Tensor) -> None:
    op = "quant_per_token_int8"
    check_tensor(op, "x", x)
    check_dtype(op, "x", x, ACT_DTYPES)
    check_nonempty_last(op, "x", x)


def _check_per_tensor(x: Tensor, scale: Tensor) -> None:
    op = "quant_per_tensor_int8"
    check_tensor(op, "x", x)
    check_tensor(op, "scale", scale)
    check_dtype(op, "x", x, ACT_DTYPES)
    check_nonempty_last(op, "x", x)
    check_dtype(op, "scale", scale, torch.float32)
    check_shape(op, "scale", scale, (1,), "one static scale")
    check_same_device(op, "x", x, scale=scale)


@custom_op("qfuse::quant_per_token_int8")
def quant_per_token_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Dynamic symmetric per-token int8 quantization; returns ``(xq, scale)``."""
    _check_per_token(x)
    return quant_per_token_int8_ref(x)


@quant_per_token_int8.register_kernel("cuda")
def _quant_per_token_int8_cuda(x: Tensor) -> tuple[Tensor, Tensor]:
    _check_per_token(x)
    from .activation.quant_kernels import quant_per_token_int8_triton  # triton only when a GPU op runs

    return quant_per_token_int8_triton(x)


@quant_per_token_int8.register_fake
def _quant_per_token_int8_fake(x: Tensor) -> tuple[Tensor, Tensor]:
    _check_per_token(x)
    return torch.empty(x.shape, dtype=torch.int8, device=x.device), torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)


@custom_op("qfuse::quant_per_tensor_int8")
def quant_per_tensor_int8(x: Tensor, scale: Tensor) -> Tensor:
    """Static symmetric per-tensor int8 quantization with a calibrated float32 ``scale`` of shape [1]."""
    _check_per_tensor(x, scale)
    # These read data: reference path only, never the CUDA kernel (see the module docstring).
    check_static_scale(scale)
    check_no_nan("quant_per_tensor_int8", "x", x, "NaN has no int8 code (it would become 0)")
    return quant_per_tensor_int8_ref(x, scale)


@quant_per_tensor_int8.register_kernel("cuda")
def _quant_per_tensor_int8_cuda(x: Tensor, scale: Tensor) -> Tensor:
    _check_per_tensor(x, scale)
    from .activation.quant_kernels import quant_per_tensor_int8_triton

    return quant_per_tensor_int8_triton(x, scale)


@quant_per_tensor_int8.register_fake
def _quant_per_tensor_int8_fake(x: Tensor, scale: Tensor) -> Tensor:
    _check_per_tensor(x, scale)
    return torch.empty(x.shape, dtype=torch.int8, device=x.device)
