"""The one int4 layout qfuse kernels read: two codes per byte along K.

For a code matrix ``codes: uint8 [N, K]`` with values in [0, 15] (K even)::

    packed[n, j] = codes[n, 2j] | (codes[n, 2j + 1] << 4)      uint8 [N, K // 2]

so the low nibble holds the even k and the high nibble the odd k; rows are
output channels, like ``nn.Linear.weight``. A row of K int4 weights is K/2
contiguous bytes, which a kernel loads 16 bytes (32 weights) at a time.
"""

from __future__ import annotations

import torch
from torch import Tensor


def pack_int4(codes: Tensor) -> Tensor:
    """Pack unsigned 4-bit codes ``uint8 [N, K]`` (values 0..15, K even) into ``uint8 [N, K // 2]``."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"pack_int4: codes must be uint8, got {codes.dtype}")
    if codes.dim() != 2 or codes.shape[1] % 2:
        raise ValueError(f"pack_int4: codes must be [N, K] with K even, got {tuple(codes.shape)}")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError("pack_int4: codes must lie in [0, 15]")
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: Tensor) -> Tensor:
    """Inverse of :func:`pack_int4`: ``uint8 [N, K // 2]`` -> ``uint8 [N, K]`` codes in [0, 15]."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(packed.shape[0], packed.shape[1] * 2)
