"""Static per-tensor activation scales (``W8A8_STATIC``): one int8 scale per Linear input, fixed
at calibration time.

The plain choice ``s = max |x| / 127`` lets one outlier token set the step for every token: on
SmolLM2-135M it costs +165 % perplexity. Instead the scale is searched::

    s(r) = r * max |x| / 127,   r in {1, 0.95, ..., 0.05}
    r*   = argmin_r || X W^T - Q_s(r)(X) W^T ||^2    over the sampled calibration tokens X

with ``Q_s(x) = clamp(round(x / s), -128, 127) * s`` (the kernel's static quantization), so a
few clipped outliers are traded for a finer step on every other token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.quant_int8 import quant_per_tensor_int8_ref


@torch.no_grad()
def search_static_scale(x: Tensor, w: Tensor, absmax: Tensor, steps: int = 20) -> Tensor:
    """The scale [1] (float32) for inputs ``x`` [T, K] of the Linear ``w`` [N, K] (float32), whose
    inputs reached ``absmax`` (per channel) over all calibration tokens."""
    x = x.float()
    ref = x @ w.t()
    top = float(absmax.max().clamp(min=1e-8)) / 127.0
    best, best_s = float("inf"), None
    for i in range(steps):
        s = torch.tensor([top * (1 - i / steps)], dtype=torch.float32, device=x.device)
        err = float((quant_per_tensor_int8_ref(x, s).float() * s @ w.t() - ref).pow(2).mean())
        if err < best:
            best, best_s = err, s
    return best_s
