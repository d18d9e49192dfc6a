"""Attention of a few query tokens against a KV cache with grouped-query heads, without
repeating K and V per query head.

Math, for q: [B, Hq, L, D], k, v: [B, Hkv, S, D] with Hq = G * Hkv (query head h reads KV
head h // G, as Hugging Face's ``repeat_kv`` lays them out), mask: None, or a bool or float
tensor of shape [B or 1, 1, L or 1, S] shared by all heads::

    s[b, h, l, n] = scale * sum_d q[b, h, l, d] * k[b, h // G, n, d]
                    + mask[b, 0, l, n]                        (float mask: added)
                    or -inf where mask[b, 0, l, n] is False   (bool mask: True = attend)
    out[b, h, l, :] = sum_n softmax_n(s[b, h, l, :]) * v[b, h // G, n, :]

in float32, rounded once to q's dtype. There is no causal rule: which keys a query sees is the
mask's job (Hugging Face builds it for a KV cache). A query with no visible key gives zeros
(SDPA's math kernel gives NaN there). The output has q's shape [B, Hq, L, D] and is laid out as
[B, L, Hq, D]: ``out.transpose(1, 2)`` is contiguous, what a decoder's o_proj reads.

The CUDA kernel (ops/attention/decode_kernels.py) packs the G query heads of a KV head (times
the L tokens) as the rows of one tile, so each K / V element is read once per KV head, splits
the keys over programs when the batch alone does not fill the GPU, and skips key blocks the
mask hides entirely. Its softmax runs in float32 with P rounded to q's dtype before P @ V (as
flash attention does), so it matches the reference to about one unit of the output dtype's
last place, not bit for bit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._custom_op import custom_op
from ._validation import ACT_DTYPES, check_dtype, check_ndim, check_same_device, check_tensor

OP = "decode_attention"


def decode_attention_ref(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """Reference kernel: the math above in float32, heads grouped (no K / V copies per head)."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    qf = q.float().reshape(B, Hkv, G * L, D)
    s = torch.matmul(qf, k.float().transpose(-1, -2)) * scale  # [B, Hkv, G * L, S]
    s = s.view(B, Hkv, G, L, -1)
    if mask is not None:
        m = mask[:, :, None]  # [B | 1, 1, 1, L | 1, S] against [B, Hkv, G, L, S]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
    top = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(top), 0.0, top))  # no visible key: p = 0, not NaN
    denom = p.sum(-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, 1.0)
    out = torch.matmul(p.view(B, Hkv, G * L, -1), v.float()).view(B, Hq, L, D)
    return _empty_out(q).copy_(out)


def _empty_out(q: Tensor) -> Tensor:
    B, Hq, L, D = q.shape
    return torch.empty((B, L, Hq, D), dtype=q.dtype, device=q.device).transpose(1, 2)


def _check(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(OP, name, t)
        check_ndim(OP, name, t, 4, "[batch, heads, tokens, head_dim]")
    check_dtype(OP, "q", q, ACT_DTYPES)
    check_dtype(OP, "k", k, q.dtype)
    check_dtype(OP, "v", v, q.dtype)
    B, Hq, L, D = q.shape
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"qfuse.{OP}: k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"qfuse.{OP}: k must be [{B}, Hkv, S, {D}] (q's batch and head_dim), got {tuple(k.shape)}")
    Hkv, S = k.shape[1], k.shape[2]
    if min(B, Hq, L, D, Hkv, S) == 0:
        raise ValueError(f"qfuse.{OP}: empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"qfuse.{OP}: q's {Hq} heads are not a multiple of k's {Hkv} KV heads")
    if mask is not None:
        check_tensor(OP, "mask", mask)
        if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
            raise TypeError(f"qfuse.{OP}: mask must be bool or floating point, got {str(mask.dtype).replace('torch.', '')}")
        m = tuple(mask.shape)
        if len(m) != 4 or m[0] not in (1, B) or m[1] != 1 or m[2] not in (1, L) or m[3] != S:
            raise ValueError(f"qfuse.{OP}: mask must have shape [{B} or 1, 1, {L} or 1, {S}] (one mask for all heads), got {m}")
    check_same_device(OP, "q", q, k=k, v=v, mask=mask)
    if isinstance(scale, bool) or not isinstance(scale, (float, int)) or not (scale > 0.0 and math.isfinite(scale)):
        raise ValueError(f"qfuse.{OP}: scale must be a positive finite float, got {scale!r}")


@custom_op("qfuse::decode_attention")
def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """softmax(scale * q k^T + mask) v with Hq = G * Hkv query heads per KV head; see the module docstring."""
    _check(q, k, v, mask, scale)
    return decode_attention_ref(q, k, v, mask, scale)


@decode_attention.register_kernel("cuda")
def _decode_attention_cuda(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    _check(q, k, v, mask, scale)
    from .attention.decode_kernels import decode_attention_triton  # triton only when a GPU op runs

    return decode_attention_triton(q, k, v, mask, scale)


@decode_attention.register_fake
def _decode_attention_fake(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    _check(q, k, v, mask, scale)
    return _empty_out(q)
