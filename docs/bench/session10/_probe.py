"""What the session-10 probe scripts share: graph-replay timing as in qfuse/bench/timing.py, the
bf16 reference, and one CSV row per measurement, flushed and printed as it lands (so a run cut
off by the device's time limit keeps what it measured)."""

import csv
import os
import time

import torch

from qfuse.bench.timing import copies_for, time_graph


class Probe:
    def __init__(self, out_dir: str, name: str, mode: str = "a"):
        os.makedirs(out_dir, exist_ok=True)
        self._file = open(os.path.join(out_dir, name), mode, newline="")
        self._csv = csv.writer(self._file)
        self._t0 = time.time()

    def elapsed(self) -> float:
        return time.time() - self._t0

    def time(self, calls, replays: int = 15) -> float:
        """Median us per call of ``calls`` captured as one CUDA graph (the first call runs once
        before, so compilation stays out of the capture)."""
        calls[0]()
        torch.cuda.synchronize()
        return round(time_graph(calls, replays=replays), 2)

    def bf16_us(self, n: int, k: int, m: int = 1) -> float:
        """bf16 ``torch.matmul`` of an [m, k] activation with [n, k] weights, rotated copies past the L2."""
        ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies_for(n * k * 2))]
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        return self.time([lambda wt=wt: torch.matmul(x, wt.t()) for wt in ws])

    def emit(self, *row) -> None:
        self._csv.writerow(row)
        self._file.flush()
        print(*row, f"[{self.elapsed():.0f}s]", flush=True)
