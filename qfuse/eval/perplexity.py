"""Perplexity of a causal LM on a text, in independent fixed-length windows.

The protocol: the text is tokenized once without
special tokens, cut into non-overlapping windows of ``window`` tokens (the tail shorter than
a window is dropped), each window is one forward pass with no carried context, and every
token but the window's first is scored: ``ppl = exp(sum NLL / scored tokens)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm


def default_text() -> str:
    """English technical prose that ships with every CPython: the ``pydoc_data.topics`` help
    topics, joined in sorted order (465,126 characters on CPython 3.11.7)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


@dataclass
class Perplexity:
    ppl: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    tokens: int  # scored tokens
    windows: int


def windows_of(ids: Tensor, window: int, max_windows: int | None = None) -> Tensor:
    """``ids`` [T] -> [W, window] non-overlapping windows (the short tail dropped)."""
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    if max_windows is not None and max_windows < 1:
        raise ValueError(f"max_windows must be >= 1, got {max_windows}")
    n = ids.numel() // window
    if max_windows is not None:
        n = min(n, max_windows)
    if n == 0:
        raise ValueError(f"the text has {ids.numel()} tokens, fewer than one window of {window}")
    return ids[: n * window].reshape(n, window)


@torch.inference_mode()
def perplexity(model: nn.Module, windows: Tensor, batch: int = 1, progress: bool = True) -> Perplexity:
    """Perplexity of ``model`` (called as ``model(input_ids=...)`` returning ``.logits`` or a
    tensor of logits) over ``windows`` [W, T]."""
    if batch < 1:  # range(0, W, batch) would score nothing and report a perplexity of 1
        raise ValueError(f"batch must be >= 1, got {batch}")
    device = next(model.parameters()).device
    total = 0.0
    for i in tqdm(range(0, len(windows), batch), desc="perplexity", unit="batch", disable=not progress):
        x = windows[i : i + batch].to(device)
        out = model(input_ids=x)
        logits = out.logits if hasattr(out, "logits") else out
        nll = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        total += float(nll)
    scored = windows.shape[0] * (windows.shape[1] - 1)
    mean = total / scored
    return Perplexity(math.exp(mean), mean, scored, windows.shape[0])
