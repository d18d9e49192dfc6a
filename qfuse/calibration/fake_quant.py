"""``FakeQuantLinear``: a calibrated Linear as the calibration algorithm sees it, in plain torch.

The weight is the algorithm's own (:mod:`.grid`), never read back from the packed buffers, and
the int8 activations are quantized with the formula of the ops' reference
(``quant_per_token_int8_ref`` / ``quant_per_tensor_int8_ref``); products are float32, rounded
once to the activation dtype, in the order the kernels' epilogue uses::

    weight-only   y = x @ round_to_dtype(w_hat)^T + b                 w_hat = (c - z) * s
    int8 acts     y = ((xq @ w_int^T) * x_scale) * w_scale + b        xq, x_scale = quant(x)

``w_int`` (the codes, times W4A8 group 128's integer group scales) is integer-valued, so
``xq @ w_int^T`` is exact in float32 while its partial sums stay below 2**24 (|xq w| <= 127 * 127,
K <= 1040 always; far larger K in practice), as the kernels' int32 accumulation is.

The calibration pipeline propagates activations through these modules, and comparing a model of
them with the :class:`qfuse.QuantLinear` model built from the same codes checks that packing,
loading and the ops compute what the algorithm optimized (tests/qfuse/calibration).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops.quant_int8 import quant_per_tensor_int8_ref, quant_per_token_int8_ref
from ..schemes import Scheme
from .grid import QuantizedWeight, WeightGrid, integer_weight


class FakeQuantLinear(nn.Module):
    """``w_hat`` [N, K] float32 (in model input order, or in ``perm``'s order when given), optional ``bias``, and the activation
    quantization of ``scheme`` (``input_scale`` [1] for a static one). ``dtype``: the model's
    dtype, to which a weight-only kernel rounds ``w_hat`` (its tensor-core operand)."""

    def __init__(
        self,
        scheme: Scheme,
        w_hat: Tensor,
        bias: Tensor | None,
        dtype: torch.dtype,
        input_scale: Tensor | None = None,
        w_int: Tensor | None = None,
        w_scale: Tensor | None = None,
        perm: Tensor | None = None,
    ):
        super().__init__()
        self.scheme = scheme
        self.in_features, self.out_features = w_hat.shape[1], w_hat.shape[0]
        if not scheme.weight_only and (w_int is None or w_scale is None):
            raise ValueError(f"FakeQuantLinear: {scheme.name} takes w_int and w_scale (qfuse.calibration.grid.integer_weight)")
        # Plain attributes, not buffers: Module.to(dtype) must not round the float32 weights.
        self.w_hat = w_hat.float()
        self.w_int = w_int
        self.w_scale = w_scale
        # GPTQ act-order groups: the weights' columns are in this input order, and x is gathered
        # to it, so the sums run in the kernel's order.
        self.perm = perm
        self.bias_f = None if bias is None else bias.detach().float()
        self.input_scale = input_scale
        self.dtype = dtype

    def forward(self, x: Tensor) -> Tensor:
        s = self.scheme
        bias = None if self.bias_f is None else self.bias_f.to(x.device)
        if self.perm is not None:
            x = x[..., self.perm.to(x.device)]
        if s.weight_only:
            return F.linear(x.float(), self.w_hat.to(x.device).to(self.dtype).float(), bias).to(x.dtype)
        x2 = x.reshape(-1, x.shape[-1])
        if s.static_act:
            x_scale = self.input_scale.to(x.device)
            xq = quant_per_tensor_int8_ref(x2, x_scale)
        else:
            xq, x_scale = quant_per_token_int8_ref(x2)
        out = F.linear(xq.float(), self.w_int.to(x.device)) * x_scale.reshape(-1, 1) * self.w_scale.to(x.device).reshape(1, -1)
        if bias is not None:
            out = out + bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme.name}, fake-quant"


def fake_quant_linear(
    scheme: Scheme, grid: WeightGrid, q: QuantizedWeight, bias: Tensor | None, dtype: torch.dtype, input_scale: Tensor | None = None
) -> FakeQuantLinear:
    """The :class:`FakeQuantLinear` of the codes and scales ``q`` chosen under ``grid``."""
    w_int, w_scale = (None, None) if scheme.weight_only else integer_weight(q, stored_order=True)
    w_stored = grid.dequantize(q.codes, q.groups)
    return FakeQuantLinear(scheme, w_stored, bias, dtype, input_scale, w_int, w_scale, q.perm)
