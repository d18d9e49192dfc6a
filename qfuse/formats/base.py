"""What every checkpoint reader shares: the description of one quantized layer, and the
assembly of a :class:`qfuse.QuantLinear` from unpacked codes, scales and zero points."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..linear import QuantLinear
from ..ops.int4_packing import pack_int4
from ..ops.wna16_gemm import check_wna16_zeros
from ..schemes import Scheme, make_scheme
from .files import CheckpointError, CheckpointFiles

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class LayerSpec:
    """One quantized linear layer of a checkpoint, known from its config and tensor headers."""

    prefix: str
    scheme: Scheme
    out_features: int
    in_features: int
    act_order: bool = False  # input channels stored in group order (GPTQ desc_act / compressed-tensors actorder)
    tensors: list[str] = field(default_factory=list)  # every checkpoint tensor this layer consumes


def group_order(g_idx: Tensor, group_size: int, where: str) -> Tensor | None:
    """For a ``g_idx`` [K] (input channel -> scale group), the permutation that sorts the
    channels by group, or ``None`` when they already are (``g_idx[k] == k // group_size``).
    Sorted, group g must hold exactly channels g*G .. g*G + G - 1 of the permuted order."""
    k = g_idx.numel()
    g = k if group_size == -1 else group_size
    natural = torch.arange(k, dtype=torch.int64) // g
    g_idx = g_idx.to(torch.int64)
    if torch.equal(g_idx, natural):
        return None
    perm = torch.sort(g_idx, stable=True).indices
    if not torch.equal(g_idx[perm], natural):
        raise CheckpointError(f"{where}: g_idx does not put exactly {g} input channels in each of {k // g} groups")
    return perm


def wna16_linear(
    spec: LayerSpec,
    codes: Tensor,
    scales: Tensor,
    zeros: Tensor | None,
    bias: Tensor | None,
    g_idx: Tensor | None,
    dtype: torch.dtype,
    where: str,
) -> QuantLinear:
    """A weight-only QuantLinear from unsigned ``codes`` uint8 [N, K], ``scales`` [N, G],
    ``zeros`` uint8 [N, G] (``None``: the implicit 2**(bits-1)), in the model's K order.

    ``w[n, k] = (codes[n, k] - zeros[n, g(k)]) * scales[n, g(k)]``. Zero points that all equal
    2**(bits-1) are dropped (the symmetric kernel path computes the same). A ``g_idx`` that is
    not ``k // group`` reorders the codes once here and gives the layer an ``act_perm``.
    """
    s = spec.scheme
    n, k = spec.out_features, spec.in_features
    if zeros is not None:
        try:
            check_wna16_zeros(zeros, s.weight_bits)
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from None
        if bool((zeros == 1 << (s.weight_bits - 1)).all()):
            zeros = None
    s = make_scheme(s.weight_bits, 16, s.group_size, zeros is None)
    perm = None
    if g_idx is not None:
        perm = group_order(g_idx, s.group_size, where)
        if perm is not None:
            codes = codes.index_select(1, perm)
    qweight = pack_int4(codes.contiguous()) if s.weight_bits == 4 else codes.contiguous()
    tensors = {
        "qweight": qweight,
        "scales": scales.to(dtype).contiguous(),
        "zeros": None if zeros is None else zeros.to(torch.uint8).contiguous(),
    }
    if tensors["scales"].shape != (n, 1 if s.group_size == -1 else k // s.group_size):
        raise CheckpointError(f"{where}: scales have shape {list(scales.shape)} for a [{n}, {k}] weight with group {s.group_size}")
    if not bool(torch.isfinite(tensors["scales"]).all()):
        raise CheckpointError(f"{where}: scales hold NaN or inf (in {dtype})")
    bias = None if bias is None else bias.to(dtype)
    return QuantLinear(k, n, s, tensors, bias, perm)


def optional_bias(files: CheckpointFiles, prefix: str, n: int) -> Tensor | None:
    name = f"{prefix}.bias"
    return files.get(name, FLOAT_DTYPES, (n,)) if name in files else None
