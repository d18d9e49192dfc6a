"""The persistent zeroed int32 workspace of the single-launch split-K kernels (no memset per call)."""

from __future__ import annotations

import torch
from torch import Tensor

# Arrival counters (the wna16 and int8 split-K kernels') and the int8 kernels' int32 split-K sums
# stay zero between launches: the last split of a tile resets what it used. So they live in one
# persistent zeroed buffer instead of a memset per call (a graph node of its own, ~1.5 us at
# decode M where the whole GEMV takes 7-25 us). One buffer per (device, stream) for eager calls, and one per device shared by every
# CUDA-graph capture: launches on one stream are ordered, so they never overlap. Made or grown
# only outside capture (a buffer allocated while capturing would hold garbage until the first
# replay); a capture that finds none big enough gets a fresh torch.zeros (a memset, recorded
# into the graph). A grown buffer's predecessor is kept alive: a captured graph may point at it.
_ZEROED_MIN = 1 << 16
_zeroed: dict[tuple, Tensor] = {}
_retired: list[Tensor] = []


def zeroed_int32(device: torch.device, numel: int) -> Tensor:
    """``numel`` int32 zeros that the caller's kernel must leave zero (ops/wna16/common.py's
    ``finish_split``, ops/int8/common.py's ``take_split_sum``)."""
    if device.type != "cuda":
        return torch.zeros(numel, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing():
        buf = _zeroed.get((index, "graph"))
        return buf[:numel] if buf is not None and buf.numel() >= numel else torch.zeros(numel, dtype=torch.int32, device=device)
    key = (index, torch.cuda.current_stream(index).stream_id)
    for k in (key, (index, "graph")):
        buf = _zeroed.get(k)
        if buf is None or buf.numel() < numel:
            if buf is not None:
                _retired.append(buf)
            _zeroed[k] = torch.zeros(max(numel, 2 * buf.numel() if buf is not None else _ZEROED_MIN), dtype=torch.int32, device=device)
    return _zeroed[key][:numel]


def rezero_workspaces() -> None:
    """Zero every eager and graph workspace again, the retired ones too (a graph captured before a
    buffer grew still points at its predecessor). For the tuner after a wrong candidate: a kernel
    that sums its split-K partials wrong may also leave its arrival counters nonzero, and every
    later split-K launch on the same counters then goes wrong too (seen on the H200: one such
    candidate turned the rest of a tune's checks into mismatches)."""
    for buf in [*_zeroed.values(), *_retired]:
        buf.zero_()
