"""``qfuse bench eager``: host time per call of what an eager decode step runs, against ``nn.Linear``.

A model called without ``torch.compile`` (``model.generate``, a notebook) waits on Python for
every op: at decode M the GPU finishes a qfuse GEMM in 5-40 us, so the call's host time sets
the pace. Per Llama-3-8B projection shape as Hugging Face models hold them (q / o 4096 x 4096,
k / v 1024 x 4096, gate / up 14336 x 4096, down 4096 x 14336) and M in ``--m``, this times
``QuantLinear.forward`` for each scheme (a CUDA-graph replay after the warm-up, where the tree has
qfuse/eager_graphs.py; ``<scheme> plain``: the plain op calls it replays), ``nn.Linear`` in bf16,
the standalone ops and the ``qfuse.RMSNorm`` module:

* ``host_us``: Python time per call, ``n`` calls back to back without a synchronization
  (the GPU queue never fills at n = 200), divided by n;
* ``wall_us``: the same loop until the GPU is done, divided by n (host-bound when ~host_us);
* ``gpu_us``: one CUDA-graph replay of the call (no launch cost).

Uses only the public API (``qfuse.QuantLinear``, ``torch.ops.qfuse``), so it also times an older
checkout: ``PYTHONPATH=OLD python3 qfuse/bench/eager.py --csv before.csv`` (and
``PYTHONPATH=.`` for this one, run as a file). ``QFUSE_AUTOTUNE=0`` keeps shapes without a shipped
config from being measured inside the timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]  # run as a file: this folder's modules must not shadow top-level ones

SHAPES = {"q_o": (4096, 4096), "k_v": (1024, 4096), "gate_up": (14336, 4096), "down": (4096, 14336)}
SCHEMES = ("W4A16", "W8A16", "W8A8", "W4A8", "W4A8_G128")


def host_times(fn, n: int = 200, rounds: int = 5) -> tuple[float, float]:
    """(host_us, wall_us) per call: medians over ``rounds`` loops of ``n`` calls."""
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    host, wall = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / n * 1e6)
        wall.append((t2 - t0) / n * 1e6)
    return statistics.median(host), statistics.median(wall)


def gpu_time(fn) -> float:
    from qfuse.ops._autotune import graph_time_ms

    return graph_time_ms([fn] * 20, replays=10, warmup=2) * 1e3


def rows_for(ms: list[int], schemes: list[str], shapes: list[str], tree: str) -> list[dict]:
    import torch

    import qfuse

    rows = []

    def record(what: str, m: int, n: int, k: int, fn) -> None:
        host, wall = host_times(fn)
        rows.append(
            {
                "what": what,
                "m": m,
                "n": n,
                "k": k,
                "host_us": round(host, 2),
                "wall_us": round(wall, 2),
                "gpu_us": round(gpu_time(fn), 2),
                "tree": tree,
            }
        )
        print(f"[eager] {what:<18} M={m:<3} {n}x{k}: host {host:7.2f} us  wall {wall:7.2f} us", flush=True)

    with torch.inference_mode():
        for label in shapes:
            n, k = SHAPES[label]
            torch.manual_seed(0)
            linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
            quant = {s: qfuse.QuantLinear.from_linear(linear, s) for s in schemes}
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                record(f"nn.Linear/{label}", m, n, k, lambda: linear(x))
                for s, q in quant.items():
                    record(f"{s}/{label}", m, n, k, lambda q=q: q(x))
                    if hasattr(q, "_forward"):  # the plain calls a CUDA-graph replay stands in for (qfuse/eager_graphs.py)
                        record(f"{s} plain/{label}", m, n, k, lambda q=q: q._forward(x))
        for m in ms:
            h = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
            record("quant_per_token_int8", m, 4096, 0, lambda: torch.ops.qfuse.quant_per_token_int8(h))
            record("rms_norm", m, 4096, 0, lambda: torch.ops.qfuse.rms_norm(h, w, 1e-5))
            norm = qfuse.RMSNorm(w, 1e-5)
            record("qfuse.RMSNorm", m, 4096, 0, lambda: norm(h))
            record("torch rms_norm", m, 4096, 0, lambda: torch.nn.functional.rms_norm(h, (4096,), w, 1e-5))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="qfuse bench eager", description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--tree", default="", help="label for the CSV's tree column")
    ap.add_argument("--csv", type=Path, default=Path("bench_eager/eager.csv"))
    args = ap.parse_args(argv)
    import torch

    from qfuse.bench._device import require_cuda

    require_cuda("eager")
    print(f"[eager] torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rows = rows_for(args.m, args.schemes, args.shapes, args.tree)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    import csv

    with args.csv.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
