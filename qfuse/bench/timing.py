"""GPU timing that survives the two traps measured on the H200 (BENCHMARKS.md, "Timing method").

* CPU launch overhead (120-350 us per eager Python op call, against 8-40 us of GPU
  time): kernels are timed as replays of a CUDA graph holding many calls, so no
  launch gap is in the figure. Eager per-call time is measured separately.
* The 60 MB L2: a single layer's weights timed in a loop stay L2-resident. The graph
  cycles through enough *copies* of the inputs that each replay streams more than
  ``ROTATE_BYTES`` (3x L2), so every call reads its weights from HBM, as in a model.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from qfuse.ops._autotune import graph_time_ms

L2_BYTES = 60 * 2**20
ROTATE_BYTES = 3 * L2_BYTES


def copies_for(bytes_per_call: int, max_copies: int = 64) -> int:
    """How many input copies to cycle through so one pass streams > ROTATE_BYTES."""
    return max(2, min(max_copies, math.ceil(ROTATE_BYTES / max(bytes_per_call, 1))))


def time_graph(calls: Sequence[Callable[[], object]], replays: int = 20, warmup: int = 3) -> float:
    """Median microseconds per call: capture ``calls`` (run in order) in one CUDA graph, replay it.

    The same routine the autotuner uses (``qfuse.ops._autotune.graph_time_ms``).
    """
    return graph_time_ms(calls, replays=replays, warmup=warmup) * 1e3


def time_eager(call: Callable[[], object]) -> float:
    """Median microseconds of one eager call, launch overhead included (triton do_bench)."""
    from triton.testing import do_bench

    return do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3


def copy_bandwidth(device: torch.device | str = "cuda", nbytes: int = 4 * 2**30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + bytes written).

    float32 elements (a uint8 copy measured only 2.68 TB/s on the H200, against ~4.3 TB/s
    for wide elements), 2 GiB each way: far beyond the L2.
    """
    src = torch.randn(nbytes // 8, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    us = time_graph([lambda: dst.copy_(src)], replays=10)
    return 2 * src.numel() * src.element_size() / (us * 1e-6)


def read_bandwidth(device: torch.device | str = "cuda", nbytes: int = 4 * 2**30) -> float:
    """Measured read-only bandwidth in bytes/s: a float32 sum over ``nbytes``.

    A GEMV mostly reads, and torch's copy kernel measured only 2.7 TB/s on the H200 while
    cuBLAS bf16 GEMV streamed its weights at 3.7 TB/s, so the floors use the larger of this
    and :func:`copy_bandwidth` (see :func:`hbm_bandwidth`).
    """
    src = torch.randn(nbytes // 4, dtype=torch.float32, device=device)
    out = torch.empty((), dtype=torch.float32, device=device)
    us = time_graph([lambda: torch.sum(src, dim=0, out=out)], replays=10)  # a full reduction takes no out= (torch 2.11)
    return src.numel() * src.element_size() / (us * 1e-6)


def hbm_bandwidth(device: torch.device | str = "cuda") -> float:
    """The bandwidth the floors use: max(copy, read-only) measured in this run, bytes/s."""
    return max(copy_bandwidth(device), read_bandwidth(device))


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def plot_speedup(
    rows: list[dict], path: Path, *, x: str, series: Sequence[str], panel: str, title: str, ylabel: str = "speedup over bf16 torch.matmul"
) -> None:
    """One panel per value of ``panel`` (e.g. the N x K shape), one line per column in ``series``, log-x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(r[panel] for r in rows))
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for ax, p in zip(axes.flat, panels):
        sub = [r for r in rows if r[panel] == p]
        for s in series:
            pts = [(r[x], r[s]) for r in sub if r.get(s) not in (None, "")]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=s)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(str(p))
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
