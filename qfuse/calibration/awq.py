"""Activation-aware weight scaling (AWQ, Lin et al., 2024): per input channel scales that
protect the weights of the most active channels, folded into the op before the Linears, then
a search of each group's clipping range.

Scale search, for Linears ``f`` sharing an input ``X`` [T, K] (q/k/v after ``input_layernorm``,
gate/up after ``post_attention_layernorm``, down after ``up_proj``, o after ``v_proj`` where
their shapes allow), with ``x_j = mean |X_j|`` and ``w_j`` the mean over rows of
``|W[n, j]| / max_group |W[n, group]|``::

    s(a) = x^a / w^(1 - a), normalized to sqrt(max s * min s) = 1,  a in {0, 1/20, ..., 19/20}
    a* = argmin_a  sum_f || X W_f^T - (X / s(a)) Q(W_f * s(a))^T ||^2

with ``Q`` the scheme's round-to-nearest quantize-dequantize (:mod:`.grid`). The float model
is unchanged by folding ``s(a*)``: the previous op's output channels are divided by it, the
Linears' input columns multiplied.

Clip search, for each Linear except q/k (their error is judged after the attention softmax in
AutoAWQ; here they are left unclipped, as AutoAWQ does), per row and group: the range
``[-m, m]`` with ``m = amax * (1 - i/20)``, i in 0..9, that minimizes the group's own output
error ``|| X_g w_g - X_g Q(clamp(w_g, -m, m)) ||^2`` over up to 512 tokens (W4A8 group 128: one
shrink per row, for its groups' scales all build on the row's maximum). The weight is
clamped in place, and the scheme's quantizer then fits its scales on the clamped weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .grid import WeightGrid

_EPS = 1e-4


@dataclass(frozen=True)
class AWQ:
    """The AWQ step of a calibration recipe: ``grid`` points of the scale exponent, ``clip``
    whether to search clipping ranges, ``clip_grid`` / ``max_shrink`` its points and how far it
    shrinks, ``clip_tokens`` the tokens it scores on."""

    grid: int = 20
    clip: bool = True
    clip_grid: int = 20
    max_shrink: float = 0.5
    clip_tokens: int = 512

    def __post_init__(self):
        if self.grid < 1 or self.clip_grid < 1:
            raise ValueError(f"AWQ: grid and clip_grid must be >= 1, got {self.grid}, {self.clip_grid}")
        if not 0.0 <= self.max_shrink < 1.0:
            raise ValueError(f"AWQ: max_shrink must lie in [0, 1), got {self.max_shrink}")


def _weight_magnitude(weights: list[Tensor], group: int) -> Tensor:
    """Per input channel, the mean over rows of ``|W|`` relative to its group's max."""
    w = torch.cat(weights, dim=0)
    n, k = w.shape
    wg = w.abs().reshape(n, k // group, group)
    wg = wg / wg.amax(dim=-1, keepdim=True).clamp(min=1e-8)
    return wg.reshape(n, k).mean(dim=0)


@torch.no_grad()
def search_scales(x: Tensor, weights: list[Tensor], grids: list[WeightGrid], config: AWQ = AWQ()) -> Tensor:
    """The per-channel scales ``s`` [K] (float32) for Linears ``weights`` ([N_f, K] each, float32)
    sharing the input ``x`` [T, K]."""
    x = x.float()
    x_mag = x.abs().mean(dim=0)
    w_mag = _weight_magnitude(weights, min(g.group for g in grids))
    reference = [x @ w.t() for w in weights]
    best, best_s = float("inf"), torch.ones_like(x_mag)
    for i in range(config.grid):
        a = i / config.grid
        s = (x_mag.pow(a) / w_mag.pow(1 - a).clamp(min=_EPS)).clamp(min=_EPS)
        s = s / (s.max() * s.min()).sqrt()
        xs = x / s
        loss = 0.0
        for w, g, ref in zip(weights, grids, reference):
            loss += float((xs @ g.fake_quantize(w * s).t() - ref).pow(2).mean())
        if loss < best:
            best, best_s = loss, s
    return best_s


@torch.no_grad()
def search_clip(x: Tensor, w: Tensor, grid: WeightGrid, config: AWQ = AWQ()) -> Tensor:
    """The clipping bound ``m`` [N, G] per row and group of ``w`` [N, K] (float32) for inputs ``x`` [T, K]."""
    x = x.float()
    if x.shape[0] > config.clip_tokens:  # evenly spaced tokens
        x = x[torch.linspace(0, x.shape[0] - 1, config.clip_tokens, device=x.device).long()]
    n, k = w.shape
    g = grid.group
    xg = x.reshape(-1, k // g, g)  # [T, G, g]
    wg = w.reshape(n, k // g, g)  # [N, G, g]
    ref = torch.einsum("tgc,ngc->ngt", xg, wg)
    amax = wg.abs().amax(dim=-1)  # [N, G]
    best_err = torch.full_like(amax, float("inf"))
    best_m = amax.clone()
    steps = max(int(config.max_shrink * config.clip_grid), 1)
    for i in range(steps):
        m = amax * (1 - i / config.clip_grid)
        wc = torch.maximum(torch.minimum(wg, m.unsqueeze(-1)), -m.unsqueeze(-1)).reshape(n, k)
        q = grid.fake_quantize(wc).reshape(n, k // g, g)
        err = (torch.einsum("tgc,ngc->ngt", xg, q) - ref).pow(2).mean(dim=-1)
        if grid.two_level:  # clipping one group moves the row scale every group's scale builds on: one choice per row
            err = err.sum(dim=1, keepdim=True).expand_as(err)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_m = torch.where(better, m, best_m)
    return best_m


def apply_clip(w: Tensor, m: Tensor, group: int) -> Tensor:
    """``w`` [N, K] clamped to ``[-m, m]`` per row and group (``m`` [N, G])."""
    n, k = w.shape
    wg = w.reshape(n, k // group, group)
    return torch.maximum(torch.minimum(wg, m.unsqueeze(-1)), -m.unsqueeze(-1)).reshape(n, k)
