"""GPTQ (Frantar et al., 2023): quantize a Linear's weight one column at a time and spread
each column's rounding error over the columns not yet quantized, weighted by the inverse
Hessian of the layer's output error.

For inputs ``X`` [T, K] seen during calibration, the layer-output error of a weight change
``dW`` is ``||dW X^T||^2 = tr(dW H dW^T)`` with ``H = 2 X^T X / T``. With ``U`` the upper
Cholesky factor of ``(H + damp * mean(diag H) * I)^-1``, column ``j`` is quantized to
``q_j`` and the rest updated by::

    e_j = (w_j - q_j) / U[j, j]          W[:, j+1:] -= e_j U[j, j+1:]

(in blocks of 128 columns, the update to later blocks applied once per block). The codes and
scales come out directly, in the grid of the layer's scheme (:mod:`.grid`); nothing is
re-quantized from a fake-quantized weight. A group's scale is fitted when the algorithm reaches
its first column, on the weights as updated so far.

``act_order`` processes columns by decreasing ``H[j, j]`` (the most active inputs first, when
the most freedom is left to absorb their error):

* ``"weight"`` (default): the group scales are fitted up front on the original weight in the
  natural column order; only the processing order changes, so the layer runs like any other
  (no gather; compressed-tensors ``actorder: weight``).
* ``"group"``: groups are consecutive in the processing order, so a group holds scattered input
  channels: the layer stores its columns in that order and gathers ``x[:, perm]`` on every
  call (``g_idx``; compressed-tensors ``actorder: group``, GPTQ ``desc_act``).
* ``None``: natural order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .grid import GroupParams, QuantizedWeight, WeightGrid

ACT_ORDERS = (None, "weight", "group")


@dataclass(frozen=True)
class GPTQ:
    """The GPTQ step of a calibration recipe: ``damp`` is the fraction of the mean Hessian
    diagonal added to it (1 % as in the paper), ``block_size`` the columns updated together,
    ``act_order`` one of None, ``"weight"``, ``"group"`` (see the module docstring), ``mse``
    whether group ranges are searched (recipe name ``gptq-mse``)."""

    damp: float = 0.01
    block_size: int = 128
    act_order: str | None = "weight"
    mse: bool = False  # fit each group's range by minimizing its rounding error (WeightGrid.fit), not from its max

    def __post_init__(self):
        if not 0.0 < self.damp <= 1.0:
            raise ValueError(f"GPTQ: damp must lie in (0, 1], got {self.damp}")
        if self.block_size < 1:
            raise ValueError(f"GPTQ: block_size must be >= 1, got {self.block_size}")
        if self.act_order not in ACT_ORDERS:
            raise ValueError(f"GPTQ: act_order must be one of {ACT_ORDERS}, got {self.act_order!r}")


class Hessian:
    """``H = 2 X^T X / T`` accumulated in float32 over calibration batches of inputs ``x`` [..., K]."""

    def __init__(self, k: int, device: torch.device):
        self.sum = torch.zeros(k, k, dtype=torch.float32, device=device)
        self.tokens = 0

    def add(self, x: Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        self.sum.addmm_(x.t(), x)
        self.tokens += x.shape[0]

    def value(self) -> Tensor:
        if self.tokens == 0:
            raise ValueError("GPTQ: the layer saw no calibration tokens")
        return 2.0 * self.sum / self.tokens


def _inverse_cholesky(h: Tensor, damp: float) -> Tensor:
    """Upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1``; the damping is raised
    tenfold (up to 10 times) while the factorization fails."""
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    mean = h.diagonal().mean().clamp(min=1e-8)
    for _ in range(10):
        chol, info = torch.linalg.cholesky_ex(h + damp * mean * eye)
        if int(info) == 0:
            inv = torch.cholesky_inverse(chol)
            upper, info = torch.linalg.cholesky_ex(inv, upper=True)
            if int(info) == 0:
                return upper
        damp *= 10
    raise ValueError("GPTQ: the Hessian is not positive definite even with damping 10^10 times the requested")


@torch.no_grad()
def gptq_quantize(w: Tensor, hessian: Tensor, grid: WeightGrid, config: GPTQ = GPTQ()) -> QuantizedWeight:
    """GPTQ codes and scales of ``w`` [N, K] under ``grid`` for the Hessian ``hessian`` [K, K]."""
    w = w.float().clone()
    n, k = w.shape
    h = hessian.float().clone()
    grid.mse = config.mse
    grid.prepare(w)
    dead = h.diagonal() == 0  # inputs that were always 0: their weights cannot matter
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    g = grid.group
    grouped = g != k
    order = config.act_order
    static_groups = None
    if not grouped or order == "weight":
        # fitted up front on the original weight, natural column order
        static_groups = [grid.fit(w[:, i : i + g]) for i in range(0, k, g)]
    perm = torch.argsort(h.diagonal(), descending=True) if order is not None else None
    if perm is not None:
        w, h = w[:, perm], h[perm][:, perm]
    u = _inverse_cholesky(h, config.damp)
    codes = torch.zeros_like(w)
    dynamic: list[GroupParams] = []
    # Blocks hold whole groups, so a group is fitted on weights already updated for every column before it.
    block = max(config.block_size // g, 1) * g if grouped else config.block_size
    col_group = (perm if perm is not None else torch.arange(k, device=w.device)) // g
    params = static_groups[0] if static_groups is not None else None
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        wb = w[:, b0:b1].clone()
        ub = u[b0:b1, b0:b1]
        err = torch.zeros_like(wb)
        for i in range(b1 - b0):
            j = b0 + i
            if static_groups is not None:
                if grouped:
                    params = static_groups[int(col_group[j])]
            elif j % g == 0:
                params = grid.fit(wb[:, i : i + g])
                dynamic.append(params)
            col = wb[:, i : i + 1]
            c = grid.quantize(col, params)
            codes[:, j : j + 1] = c
            e = (col - grid.dequantize_group(c, params)) / ub[i, i]
            wb[:, i:] -= e @ ub[i : i + 1, i:]
            err[:, i : i + 1] = e
        w[:, b1:] -= err @ u[b0:b1, b1:]
    if static_groups is not None:
        if perm is not None:  # back to the natural column order
            codes = torch.empty_like(codes).index_copy_(1, perm, codes)
        return QuantizedWeight(codes, static_groups, row_scale=grid.row_scale)
    if perm is not None:
        # Ascending channels inside each group: the order a loader rebuilds from g_idx (a stable
        # sort, formats/base.py group_order), so a saved and reloaded layer sums in the same order.
        within = torch.cat([torch.argsort(perm[i : i + g]) + i for i in range(0, k, g)])
        perm, codes = perm[within], codes[:, within]
    return QuantizedWeight(codes, dynamic, perm, grid.row_scale)
