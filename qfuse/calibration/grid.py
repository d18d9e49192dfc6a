"""Weight grids: how a scheme maps a float weight to integer codes and back, a group of
columns at a time, in the form the calibration algorithms need.

Round-to-nearest (``rtn``), GPTQ and the AWQ searches all quantize through one
:class:`WeightGrid`, and :meth:`WeightGrid.pack` turns its codes into the buffers the op reads.
``pack(rtn(w))`` equals ``qfuse.quantizers`` bit for bit (tested), so a calibrated layer and a
round-to-nearest one differ only in the codes and scales chosen, never in their meaning.

Every grid writes ``w_hat = (c - z) * s`` per output row and group of columns, with ``s`` the
scale in float32 (already rounded to the dtype it is stored in) and ``z`` 0 for symmetric
grids::

    wna16 symmetric   s = max(amax, 1e-5) / qmax (rounded to the scale dtype), c = clamp(round(w / s), -qmax - 1, qmax)
    wna16 zero points s = max(max - min, 1e-5) / umax (rounded), z = clamp(-round(min / s), 0, umax),
                      c = clamp(round(w / s) + z, 0, umax)                      (AutoAWQ)
    w8a8              s = max(amax_row, 1e-5) / 127, c = clamp(round(w / s), -127, 127)
    w4a8 per channel  s = max(amax_row, 1e-5) / 7, c = clamp(round(w / s), -8, 7)
    w4a8 group 128    s = w_scale_row * gs, w_scale_row = max(amax_row, 1e-5) / 112 (fixed from the whole row),
                      gs = clamp(ceil(amax_group / (7 * w_scale_row)), 1, 16) integer, c = clamp(round(w / s), -8, 7)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..ops.int4_packing import pack_int4
from ..ops.w4a8_gemm import GROUP_SCALE_MAX
from ..schemes import Scheme

_MIN_RANGE = 1e-5


@dataclass
class GroupParams:
    """The scale of one group of columns for every output row (``[N, 1]`` float32), its zero
    point (``[N, 1]``, integer-valued float32, or None) and, for W4A8 group 128, the integer
    second-level scale ``gs`` (``[N, 1]``)."""

    scale: Tensor
    zero: Tensor | None = None
    group_scale: Tensor | None = None
    row_scale: Tensor | None = None  # W4A8 group 128: scale = row_scale * group_scale


@dataclass
class QuantizedWeight:
    """What a calibration algorithm produced for one Linear: the codes ``[N, K]`` (float32,
    integer-valued, in the grid's code range), one :class:`GroupParams` per group in column
    order, and ``perm``: when not None the columns are stored in this input order (GPTQ act-order
    with dynamic groups) and the layer gathers ``x[:, perm]``."""

    codes: Tensor
    groups: list[GroupParams]
    perm: Tensor | None = None
    row_scale: Tensor | None = None  # W4A8 group 128: the per-row float scale [N, 1]

    def dequantized(self, grid: WeightGrid) -> Tensor:
        """``w_hat`` [N, K] in float32, in the model's input order."""
        w = grid.dequantize(self.codes, self.groups)
        if self.perm is not None:
            w = torch.empty_like(w).index_copy_(1, self.perm, w)
        return w


def integer_weight(q: QuantizedWeight, stored_order: bool = False) -> tuple[Tensor, Tensor]:
    """For an int8-activation scheme: ``(w_int, w_scale)`` with ``w_hat = w_int * w_scale[:, None]``,
    ``w_int`` [N, K] integer-valued float32 (the codes, times the integer group scales of W4A8
    group 128) in model input order (``stored_order``: in the order of ``q.perm``), ``w_scale``
    [N] the per-row float scale."""
    if q.row_scale is not None:
        g = q.codes.shape[1] // len(q.groups)
        w_int = q.codes * torch.cat([p.group_scale for p in q.groups], dim=1).repeat_interleave(g, dim=1)
        w_scale = q.row_scale.reshape(-1)
    else:
        w_int, w_scale = q.codes, q.groups[0].scale.reshape(-1)
    if q.perm is not None and not stored_order:
        w_int = torch.empty_like(w_int).index_copy_(1, q.perm, w_int)
    return w_int, w_scale


class WeightGrid:
    """The codes and scales of ``scheme`` for a float ``[N, K]`` weight whose scales are stored
    in ``scale_dtype`` (the model's dtype for weight-only schemes)."""

    def __init__(self, scheme: Scheme, k: int, scale_dtype: torch.dtype):
        self.scheme = scheme
        self.k = k
        self.scale_dtype = scale_dtype
        self.group = k if scheme.group_size == -1 else scheme.group_size
        if k % self.group:
            raise ValueError(f"K={k} is not divisible by group_size={scheme.group_size} of {scheme.name}")
        bits = scheme.weight_bits
        if scheme.weight_only and not scheme.symmetric:
            self.qmin, self.qmax = 0, (1 << bits) - 1
        elif scheme.weight_only:
            self.qmin, self.qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        elif bits == 8:
            self.qmin, self.qmax = -127, 127
        else:
            self.qmin, self.qmax = -8, 7
        self.row_scale: Tensor | None = None
        self.mse = False  # fit(): search the range (GPTQ(mse=True))

    @property
    def two_level(self) -> bool:
        """W4A8 group 128: a per-row float scale times an integer per-group scale."""
        return not self.scheme.weight_only and self.scheme.weight_bits == 4 and self.scheme.group_size != -1

    def prepare(self, w: Tensor) -> None:
        """Fix what is set from the whole weight before any group: W4A8 group 128's per-row scale."""
        if self.two_level:
            self.row_scale = w.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_RANGE) / (7.0 * GROUP_SCALE_MAX)

    def fit(self, wg: Tensor) -> GroupParams:
        """The parameters of one group ``wg`` [N, group] (float32): from its range, or with
        ``self.mse`` the range shrunk by the factor in {1, 0.95, ..., 0.55} that minimizes each
        row's ``sum |w_hat - w|^2.4`` (GPTQ's reference quantizer; not for W4A8 group 128, whose
        group scales build on the row's)."""
        if not self.mse or self.two_level:
            return self._fit(wg, 1.0)
        best, best_err = None, None
        for i in range(10):
            p = self._fit(wg, 1.0 - 0.05 * i)
            err = (self.dequantize_group(self.quantize(wg, p), p) - wg).abs().pow(2.4).sum(dim=1, keepdim=True)
            if best is None:
                best, best_err = p, err
                continue
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best = GroupParams(torch.where(better, p.scale, best.scale), None if p.zero is None else torch.where(better, p.zero, best.zero))
        return best

    def _fit(self, wg: Tensor, shrink: float) -> GroupParams:
        s = self.scheme
        if s.weight_only and s.symmetric:
            scale = (wg.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_RANGE) * shrink / self.qmax).to(self.scale_dtype).float()
            return GroupParams(scale)
        if s.weight_only:
            wmax, wmin = wg.amax(dim=1, keepdim=True) * shrink, wg.amin(dim=1, keepdim=True) * shrink
            scale = ((wmax - wmin).clamp(min=_MIN_RANGE) / self.qmax).to(self.scale_dtype).float()
            return GroupParams(scale, (-torch.round(wmin / scale)).clamp(0, self.qmax))
        if not self.two_level:
            return GroupParams(wg.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_RANGE) * shrink / (127.0 if s.weight_bits == 8 else 7.0))
        if self.row_scale is None:
            raise RuntimeError("WeightGrid.prepare(w) must run before fit() for W4A8 group 128")
        gs = torch.ceil(wg.abs().amax(dim=1, keepdim=True) / (7.0 * self.row_scale)).clamp(1, GROUP_SCALE_MAX)
        return GroupParams(self.row_scale * gs, None, gs, self.row_scale)

    def quantize(self, w: Tensor, p: GroupParams) -> Tensor:
        """Codes of columns ``w`` [N, c] under ``p``."""
        q = torch.round(w / p.scale)
        if p.zero is not None:
            q = q + p.zero
        return q.clamp(self.qmin, self.qmax)

    def dequantize_group(self, codes: Tensor, p: GroupParams) -> Tensor:
        if p.group_scale is not None:  # as the kernel: the integer weight c * gs, then the row scale
            return (codes * p.group_scale) * p.row_scale
        return (codes - p.zero) * p.scale if p.zero is not None else codes * p.scale

    def dequantize(self, codes: Tensor, groups: list[GroupParams]) -> Tensor:
        g = self.group
        return torch.cat([self.dequantize_group(codes[:, i * g : (i + 1) * g], p) for i, p in enumerate(groups)], dim=1)

    def fake_quantize(self, w: Tensor) -> Tensor:
        """Round-to-nearest quantize-dequantize of ``w`` [N, K] (float32)."""
        q = self.rtn(w)
        return self.dequantize(q.codes, q.groups)

    def rtn(self, w: Tensor) -> QuantizedWeight:
        """Round-to-nearest: every group fitted on ``w`` itself (what ``qfuse.quantizers`` does)."""
        w = w.float()
        self.prepare(w)
        g = self.group
        groups = [self.fit(w[:, i : i + g]) for i in range(0, self.k, g)]
        codes = torch.cat([self.quantize(w[:, i * g : (i + 1) * g], p) for i, p in enumerate(groups)], dim=1)
        return QuantizedWeight(codes, groups, row_scale=self.row_scale)

    def pack(self, q: QuantizedWeight) -> dict[str, Tensor | None]:
        """The buffers of a :class:`qfuse.QuantLinear` of this scheme holding ``q``."""
        s = self.scheme
        scale = torch.cat([p.scale for p in q.groups], dim=1)
        codes = q.codes
        if s.weight_only:
            zeros = None
            if s.symmetric:
                u = codes + (self.qmax + 1)
            else:
                u = codes
                zeros = torch.cat([p.zero for p in q.groups], dim=1).to(torch.uint8).contiguous()
            u = u.to(torch.uint8)
            qweight = pack_int4(u) if s.weight_bits == 4 else u.contiguous()
            return {"qweight": qweight, "scales": scale.to(self.scale_dtype).contiguous(), "zeros": zeros}
        if s.weight_bits == 8:
            return {"wq": codes.to(torch.int8).contiguous(), "w_scale": scale.reshape(-1).contiguous()}
        qweight = pack_int4((codes + 8).to(torch.uint8))
        if not self.two_level:
            return {"qweight": qweight, "w_scale": scale.reshape(-1).contiguous(), "group_scale": None}
        gs = torch.cat([p.group_scale for p in q.groups], dim=1)
        return {"qweight": qweight, "w_scale": q.row_scale.reshape(-1).contiguous(), "group_scale": gs.to(torch.int8).contiguous()}
