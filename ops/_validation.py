"""Argument checks shared by every op entry (reference, fake and CUDA kernels).

Each check raises a ``ValueError`` or ``TypeError`` that names the op, the
argument and what was expected, before any kernel runs. The checks read only
metadata (shape, dtype, device, strides), never data, so they are safe inside
fake-tensor tracing and CUDA-graph capture; the value checks at the end of this
file are the exception and are called only where a sync is allowed (see there).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

ACT_DTYPES = (torch.float16, torch.bfloat16)


def _fmt_dtypes(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def check_dtype(op: str, name: str, t: torch.Tensor, dtypes) -> None:
    dtypes = (dtypes,) if isinstance(dtypes, torch.dtype) else tuple(dtypes)
    if t.dtype not in dtypes:
        raise TypeError(f"qfuse.{op}: {name} must be {_fmt_dtypes(dtypes)}, got {str(t.dtype).replace('torch.', '')}")


def check_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"qfuse.{op}: {name} must be a Tensor, got {type(t).__name__}")


def check_ndim(op: str, name: str, t: torch.Tensor, ndim: int, what: str = "") -> None:
    if t.dim() != ndim:
        hint = f" ({what})" if what else ""
        raise ValueError(f"qfuse.{op}: {name} must be {ndim}-D{hint}, got shape {tuple(t.shape)}")


def check_shape(op: str, name: str, t: torch.Tensor, shape: tuple, what: str = "") -> None:
    if tuple(t.shape) != tuple(shape):
        hint = f" ({what})" if what else ""
        raise ValueError(f"qfuse.{op}: {name} must have shape {tuple(shape)}{hint}, got {tuple(t.shape)}")


def check_same_device(op: str, ref_name: str, ref: torch.Tensor, **others) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"qfuse.{op}: {name} is on {t.device} but {ref_name} is on {ref.device}; all tensors must be on one device")


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(
            f"qfuse.{op}: {name} must be contiguous (it is a prepacked buffer; call .contiguous() once at load time), "
            f"got strides {t.stride()} for shape {tuple(t.shape)}"
        )


def check_nonempty_last(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() == 0 or t.shape[-1] == 0:
        raise ValueError(f"qfuse.{op}: {name} must have a non-empty last dimension, got shape {tuple(t.shape)}")


def check_group_size(op: str, group_size: int, k: int, allowed=(-1, 32, 64, 128)) -> int:
    """Return the number of groups along K, or raise."""
    if group_size not in allowed:
        raise ValueError(f"qfuse.{op}: group_size must be one of {list(allowed)} (-1 = per-channel), got {group_size}")
    if group_size == -1:
        return 1
    if k % group_size != 0:
        raise ValueError(f"qfuse.{op}: K={k} is not divisible by group_size={group_size}")
    return k // group_size


def check_out_dtype(op: str, out_dtype) -> None:
    if out_dtype not in ACT_DTYPES:
        raise TypeError(f"qfuse.{op}: out_dtype must be {_fmt_dtypes(ACT_DTYPES)}, got {out_dtype}")


def check_bias(op: str, bias, n: int, dtype: torch.dtype) -> None:
    if bias is None:
        return
    check_tensor(op, "bias", bias)
    check_shape(op, "bias", bias, (n,), "one value per output feature")
    check_dtype(op, "bias", bias, dtype)
    check_contiguous(op, "bias", bias)  # the CUDA kernels read it with unit stride


# Value checks. Unlike the checks above these read data: a pass over the tensor
# and, on an accelerator, a device->host sync (which would stall the stream and
# break CUDA-graph capture). So the ops run them only on their reference (CPU)
# path; the CUDA kernels skip them, and loaders call the public wrappers
# (``check_wna16_zeros``, ``check_static_scale``) once at load/quantize time.


def check_int_range(op: str, name: str, t: torch.Tensor, lo: int, hi: int, what: str = "") -> None:
    """Every value of the integer tensor ``t`` lies in [lo, hi)."""
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"qfuse.{op}: {name} must be an integer tensor, got {str(t.dtype).replace('torch.', '')}")
    info = torch.iinfo(t.dtype)
    if lo <= info.min and info.max < hi:
        return  # a dtype fact (e.g. uint8 zeros for bits=8): no data to read
    if t.numel() == 0:
        return
    t64 = t.to(torch.int64)  # compare in int64: ``uint8 >= 256`` would not fit the tensor's dtype
    count = int(((t64 < lo) | (t64 >= hi)).sum())
    if count:
        lo_seen, hi_seen = int(t64.min()), int(t64.max())
        seen = ", ".join(([f"min {lo_seen}"] if lo_seen < lo else []) + ([f"max {hi_seen}"] if hi_seen >= hi else []))
        raise ValueError(f"qfuse.{op}: {name}: {count} values outside [{lo}, {hi}){what} ({seen})")


def check_positive_finite(op: str, name: str, t: torch.Tensor) -> None:
    """Every value of ``t`` is finite and > 0 (a divisor: 0, negative or NaN would zero or flip codes)."""
    bad = ~(torch.isfinite(t) & (t > 0))
    count = int(bad.sum())
    if count:
        first = t[bad].flatten()[0].item()
        extra = f" ({count} of {t.numel()} values bad)" if t.numel() > 1 else ""
        raise ValueError(f"qfuse.{op}: {name} must be finite and > 0, got {first}{extra}")


def check_no_nan(op: str, name: str, t: torch.Tensor, why: str = "") -> None:
    count = int(torch.isnan(t).sum())
    if count:
        hint = f"; {why}" if why else ""
        raise ValueError(f"qfuse.{op}: {name}: {count} NaN values (of {t.numel()}){hint}")
