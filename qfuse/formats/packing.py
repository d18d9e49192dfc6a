"""Integer codes in int32 words, as AutoAWQ, GPTQ and compressed-tensors store them.

With ``b`` bits a word holds ``pf = 32 // b`` codes; code ``j`` of a word sits in bits
``[b*j, b*j + b)`` (little-endian order). Element ``i`` along the packed dimension is code
``i % pf`` of word ``i // pf`` (GPTQ, compressed-tensors for b in {4, 8}); AutoAWQ
additionally interleaves the 8 columns of a word (:data:`AWQ_ORDER`). Shifts are done on the
bit pattern and masked, so the sign of the stored int32 does not matter.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

# AutoAWQ GEMM: nibble i of a word holds logical column AWQ_ORDER[i] of its 8 columns,
# so logical column j sits in nibble AWQ_REVERSE[j].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)


def _codes_per_word(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits={bits}: only 2, 4 and 8 pack evenly into int32 words")
    return 32 // bits


def unpack_int32(words: Tensor, bits: int, dim: int = -1) -> Tensor:
    """``int32`` words -> ``uint8`` codes; ``dim`` of the result is ``32 // bits`` times longer."""
    if words.dtype != torch.int32:
        raise TypeError(f"packed words must be int32, got {words.dtype}")
    pf = _codes_per_word(bits)
    w = words.movedim(dim, -1)
    if bits in (4, 8) and sys.byteorder == "little":
        # The words' bytes in memory order are codes (8-bit) or code pairs (4-bit) in element
        # order: unpacking through them keeps the temporaries at one byte per code, against
        # four for the int32 shifts below (470 MB for a 28672 x 4096 layer).
        b = w.contiguous().view(torch.uint8)
        codes = b if bits == 8 else torch.stack((b & 15, b >> 4), dim=-1).reshape(*b.shape[:-1], -1)
        return codes.movedim(-1, dim).contiguous()
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=w.device)
    codes = (w.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    codes = codes.reshape(*w.shape[:-1], w.shape[-1] * pf).to(torch.uint8)
    return codes.movedim(-1, dim).contiguous()


def pack_int32(codes: Tensor, bits: int, dim: int = -1) -> Tensor:
    """Inverse of :func:`unpack_int32`: unsigned codes (< 2**bits) -> ``int32`` words.
    The length of ``dim`` must be a multiple of ``32 // bits``."""
    pf = _codes_per_word(bits)
    c = codes.movedim(dim, -1).to(torch.int64)
    if c.shape[-1] % pf:
        raise ValueError(f"cannot pack {c.shape[-1]} codes of {bits} bits into whole int32 words")
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=c.device)
    words = (c.reshape(*c.shape[:-1], -1, pf) << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # bit pattern as signed int32
    return words.movedim(-1, dim).contiguous()


def awq_unpack(words: Tensor) -> Tensor:
    """AutoAWQ ``int32 [R, C]`` (4-bit, interleaved) -> ``uint8 [R, 8C]`` codes in logical column order."""
    nib = unpack_int32(words, 4, dim=-1)
    r, n = nib.shape
    return nib.reshape(r, n // 8, 8)[:, :, list(AWQ_REVERSE)].reshape(r, n).contiguous()


def awq_pack(codes: Tensor) -> Tensor:
    """Inverse of :func:`awq_unpack`."""
    r, n = codes.shape
    return pack_int32(codes.reshape(r, n // 8, 8)[:, :, list(AWQ_ORDER)].reshape(r, n), 4, dim=-1)
