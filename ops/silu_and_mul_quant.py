"""SiLU-and-mul followed by dynamic per-token int8 quantization.

Math, for gate, up: [..., I] of one dtype (fp16/bf16)::

    h             = silu(gate) * up      computed as Hugging Face's MLP does it, in the
                                         input dtype: silu rounds to x.dtype, the
                                         product rounds once more
    (xq, scale)   = quant_per_token_int8(h)

The op returns exactly what that composition returns; the reference kernel is
that composition. Outputs are contiguous (xq int8 [..., I], scale float32 [..., 1]).

CUDA kernel: Triton, in ``ops/activation/silu_kernels.py``; SiLU is computed as torch's CUDA
kernel does (``x / (1 + expf(-x))`` in float32, IEEE division, libdevice expf), so
its result equals the reference kernel run on the GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._custom_op import custom_op
from ._validation import ACT_DTYPES, check_dtype, check_nonempty_last, check_same_device, check_shape, check_tensor
from .quant_int8 import quant_per_token_int8_ref


def silu_and_mul_ref(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


def silu_and_mul_quant_ref(gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    """Reference kernel for ``silu_and_mul_quant``."""
    return quant_per_token_int8_ref(silu_and_mul_ref(gate, up))


def _check(gate: Tensor, up: Tensor) -> None:
    op = "silu_and_mul_quant"
    check_tensor(op, "gate", gate)
    check_tensor(op, "up", up)
    check_dtype(op, "gate", gate, ACT_DTYPES)
    check_nonempty_last(op, "gate", gate)
    check_dtype(op, "up", up, gate.dtype)
    check_shape(op, "up", up, tuple(gate.shape), "same as gate")
    check_same_device(op, "gate", gate, up=up)


@custom_op("qfuse::silu_and_mul_quant")
def silu_and_mul_quant(gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    """``quant_per_token_int8(silu(gate) * up)`` in one op; returns ``(xq, scale)``."""
    _check(gate, up)
    return silu_and_mul_quant_ref(gate, up)


@silu_and_mul_quant.register_kernel("cuda")
def _silu_and_mul_quant_cuda(gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    _check(gate, up)
    from .activation.silu_kernels import silu_and_mul_quant_triton  # triton only when a GPU op runs

    return silu_and_mul_quant_triton(gate, up, tune=True)


@silu_and_mul_quant.register_fake
def _silu_and_mul_quant_fake(gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    _check(gate, up)
    return torch.empty(gate.shape, dtype=torch.int8, device=gate.device), torch.empty((*gate.shape[:-1], 1), dtype=torch.float32, device=gate.device)
