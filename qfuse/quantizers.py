"""Weight quantizers: float ``[N, K]`` weights -> the prepacked buffers each op reads.

These run once per layer at quantize time (plain torch, float32 math); the
layouts they produce are documented in the op modules (``qfuse.ops.*``).
Every scale stored in a reduced dtype is rounded first, and the codes are
computed from the rounded scale, so the stored tensors describe the real
weight as faithfully as their dtype allows.

A weight on the meta device (a model built with ``torch.device("meta")``, to be
filled by ``load_state_dict(..., assign=True)``) gives meta tensors of exactly the
shapes and dtypes a real weight gives: no code here branches on tensor values
there, and the value checks are skipped.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .ops.int4_packing import pack_int4
from .ops.w4a8_gemm import GROUP_SCALE_MAX

# Smallest scale numerator (as AutoAWQ's clamp(min=1e-5)): keeps an all-zero group finite.
_MIN_RANGE = 1e-5
# Weight elements quantized at a time (whole rows): the math holds a few float32 copies of what
# it quantizes. A 128256 x 4096 bf16 lm_head quantized W8A16 whole grew the CPU process by 6.2 GB
# (17.0 s); in blocks of 2**24 elements (64 MB in float32) by 1.1 GB (8.6 s). On the H200 the bench's
# W4A16:fuse:lm_head=W8A16 case peaked 5.6 GB above plain W4A16 (26.1 against 20.4 GB). Every
# scale is per row or per group within a row, so the result is the same bits.
CHUNK_ELEMENTS = 1 << 24


def _by_rows(quantize):
    """``quantize(w, ...)`` over blocks of ``w``'s rows, its outputs concatenated along rows;
    NaN / inf refused first: they would become garbage codes (NaN casts to an arbitrary integer)
    that fail only at the first forward, with a message about scales."""

    @functools.wraps(quantize)
    def by_rows(w: Tensor, *args, **kwargs):
        if w.is_meta or w.dim() != 2:
            return quantize(w, *args, **kwargs)
        rows = max(1, CHUNK_ELEMENTS // max(1, w.shape[1]))
        blocks = [w[i : i + rows] for i in range(0, w.shape[0], rows)]
        bad = sum(int((~torch.isfinite(b)).sum()) for b in blocks)
        if bad:
            raise ValueError(f"weight has {bad} NaN/inf value(s) of {w.numel()}; cannot quantize it")
        if len(blocks) == 1:
            return quantize(w, *args, **kwargs)
        parts = [quantize(b, *args, **kwargs) for b in blocks]
        return {key: None if parts[0][key] is None else torch.cat([p[key] for p in parts]) for key in parts[0]}

    return by_rows


def _pack(codes: Tensor) -> Tensor:
    """:func:`pack_int4`; on the meta device, where its range check cannot read values,
    an empty tensor of the shape and dtype it returns."""
    if not codes.is_meta:
        return pack_int4(codes)
    n, k = codes.shape
    if k % 2:
        raise ValueError(f"pack_int4: codes must be [N, K] with K even, got {tuple(codes.shape)}")
    return codes.new_empty(n, k // 2)


def _grouped(w: Tensor, group_size: int) -> Tensor:
    """View ``[N, K]`` as ``[N, G, group]`` (G = 1 for per-channel)."""
    n, k = w.shape
    g = k if group_size == -1 else group_size
    if k % g:
        raise ValueError(f"K={k} is not divisible by group_size={group_size}")
    return w.reshape(n, k // g, g)


@_by_rows
def quantize_wna16(w: Tensor, bits: int, group_size: int, symmetric: bool, scale_dtype: torch.dtype) -> dict[str, Tensor | None]:
    """Weight-only quantization for ``wna16_gemm``: returns ``qweight``, ``scales``, ``zeros``.

    symmetric:  s = max(amax, 1e-5) / (2**(bits-1) - 1);  q = clamp(round(w / s), -2**(bits-1), 2**(bits-1) - 1);
                stored u = q + 2**(bits-1)  (zeros = None)
    asymmetric: AutoAWQ ``pseudo_quantize_tensor(zero_point=True)``:
                s = max(max - min, 1e-5) / (2**bits - 1);  z = clamp(-round(min / s), 0, 2**bits - 1);
                u = clamp(round(w / s) + z, 0, 2**bits - 1)
    """
    wg = _grouped(w.float(), group_size)
    n, groups, _ = wg.shape
    if symmetric:
        qmax = (1 << (bits - 1)) - 1
        s = (wg.abs().amax(dim=-1, keepdim=True).clamp(min=_MIN_RANGE) / qmax).to(scale_dtype).float()
        q = torch.round(wg / s).clamp(-qmax - 1, qmax) + (qmax + 1)
        zeros = None
    else:
        umax = (1 << bits) - 1
        wmax, wmin = wg.amax(dim=-1, keepdim=True), wg.amin(dim=-1, keepdim=True)
        s = ((wmax - wmin).clamp(min=_MIN_RANGE) / umax).to(scale_dtype).float()
        z = (-torch.round(wmin / s)).clamp(0, umax)
        q = (torch.round(wg / s) + z).clamp(0, umax)
        zeros = z.reshape(n, groups).to(torch.uint8).contiguous()
    codes = q.reshape(n, -1).to(torch.uint8)
    qweight = _pack(codes) if bits == 4 else codes.contiguous()
    return {"qweight": qweight, "scales": s.reshape(n, groups).to(scale_dtype).contiguous(), "zeros": zeros}


@_by_rows
def quantize_w8a8(w: Tensor) -> dict[str, Tensor]:
    """Per-channel symmetric int8 for ``w8a8_gemm``: ``s = max(amax, 1e-5) / 127``, ``wq = clamp(round(w / s), -127, 127)``."""
    wf = w.float()
    s = wf.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_RANGE) / 127.0
    wq = torch.round(wf / s).clamp(-127, 127).to(torch.int8)
    return {"wq": wq.contiguous(), "w_scale": s.reshape(-1).contiguous()}


@_by_rows
def quantize_w4a8(w: Tensor, group_size: int) -> dict[str, Tensor | None]:
    """int4 weights for ``w4a8_gemm``: returns ``qweight``, ``w_scale``, ``group_scale``.

    per-channel (QQQ):  w_scale = amax / 7;  q = clamp(round(w / w_scale), -8, 7)
    group G (128/64/32): w_scale = amax_row / (7 * 16)  (so amax_row is 112 units of w_scale)
                        group_scale = clamp(ceil(amax_group / (7 * w_scale)), 1, 16)   integer
                        q = clamp(round(w / (w_scale * group_scale)), -8, 7)
    stored u = q + 8. The group path keeps every product q * group_scale inside int8.
    """
    wf = w.float()
    n, k = wf.shape
    amax = wf.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_RANGE)
    if group_size == -1:
        w_scale = amax / 7.0
        q = torch.round(wf / w_scale).clamp(-8, 7)
        group_scale = None
    elif group_size in (128, 64, 32):
        w_scale = amax / (7.0 * GROUP_SCALE_MAX)
        wg = _grouped(wf, group_size)
        gs = torch.ceil(wg.abs().amax(dim=-1, keepdim=True) / (7.0 * w_scale.unsqueeze(-1))).clamp(1, GROUP_SCALE_MAX)
        q = torch.round(wg / (w_scale.unsqueeze(-1) * gs)).clamp(-8, 7).reshape(n, k)
        group_scale = gs.reshape(n, -1).to(torch.int8).contiguous()
    else:
        raise ValueError(f"W4A8 group_size must be -1, 128, 64 or 32, got {group_size}")
    qweight = _pack((q + 8).to(torch.uint8))
    return {"qweight": qweight, "w_scale": w_scale.reshape(-1).contiguous(), "group_scale": group_scale}
