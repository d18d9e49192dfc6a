"""Reinterpreting packed byte tensors as wider words (int16 halves, int32 words) for the kernels."""

from __future__ import annotations

import torch
from torch import Tensor


def aligned_view(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.view(dtype)``, from a copy when ``t`` starts at a storage offset that is not a multiple of
    ``dtype``'s size (e.g. a slice of a larger buffer at an odd byte), which a view cannot take."""
    if t.storage_offset() * t.element_size() % dtype.itemsize:
        t = t.clone()
    return t.view(dtype)
