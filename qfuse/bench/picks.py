"""``qfuse bench picks``: the time of every shipped default pick, to compare two trees in one run.

For each key of the shipped tables (``ops/tuned/<op>.<gpu>.json`` of the tree given by
``--tables``: ``wna16_gemm``, ``w8a8_gemm``, ``w4a8_gemm``), the op is called at that key's
shape (M = the key's M bucket; symmetric weights; random data) with autotuning off and an
empty user cache, so the dispatcher runs its shipped pick, and timed as replays of one CUDA
graph that cycles through enough weight copies to stream 3x the L2 per replay (``timing.copies_for``).

The module needs only ``torch``, the public ops and ``qfuse.quantizers``, so it also runs
against an older checkout: ``PYTHONPATH=OLD python3 qfuse/bench/picks.py --tables ops/tuned
--csv before.csv`` times OLD's code on this tree's keys. ``--compare BEFORE.csv AFTER.csv``
prints the per-op ratio summary (after / before) and every key outside ``--tolerance``.

    PYTHONPATH=. python3 qfuse/bench/picks.py --csv after.csv                 # this tree
    PYTHONPATH=OLD python3 qfuse/bench/picks.py --tables ops/tuned --csv before.csv
    python3 qfuse/bench/picks.py --compare before.csv,before2.csv after.csv,after2.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]  # run as a file: this folder's modules must not shadow top-level ones

OPS = ("wna16_gemm", "w8a8_gemm", "w4a8_gemm")
FIELDS = ("op", "m", "n", "k", "group", "dtype", "bits", "us", "tree")


def shipped_keys(tables: Path, op: str, gpu: str) -> list[dict]:
    """The keys of ``op``'s shipped table for ``gpu`` as dicts of the problem's fields."""
    path = tables / f"{op}.{gpu}.json"
    if not path.is_file():
        return []
    rows = []
    for key in json.loads(path.read_text()):
        parts = key.split("|")[2:]  # op | gpu | M | N | K [| group [| dtype | bits]]
        m, n, k = (int(v) for v in parts[:3])
        row = {"op": op, "m": m, "n": n, "k": k, "group": -1, "dtype": "bfloat16", "bits": 8 if op == "w8a8_gemm" else 4}
        if op == "wna16_gemm":
            row.update(group=int(parts[3]), dtype=parts[4], bits=int(parts[5]))
        elif op == "w4a8_gemm":
            row.update(group=int(parts[3]))
        rows.append(row)
    return rows


def build_calls(row: dict):
    """Zero-argument calls of the op at ``row``'s problem, one per weight copy."""
    import torch

    import qfuse  # noqa: F401  (registers torch.ops.qfuse.*)
    from qfuse.bench.timing import copies_for
    from qfuse.quantizers import quantize_w4a8, quantize_w8a8, quantize_wna16

    m, n, k, g = row["m"], row["n"], row["k"], row["group"]
    dtype = getattr(torch, row["dtype"])
    w = (torch.randn(n, k, device="cuda") * 0.02).to(dtype)
    if row["op"] == "wna16_gemm":
        t = quantize_wna16(w, row["bits"], g, True, dtype)
        x = torch.randn(m, k, device="cuda").to(dtype)

        def call(t):
            return lambda: torch.ops.qfuse.wna16_gemm(x, t["qweight"], t["scales"], t["zeros"], None, row["bits"], g)

    else:
        xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
        x_scale = torch.rand(m, 1, device="cuda") * 0.01 + 1e-3
        if row["op"] == "w8a8_gemm":
            t = quantize_w8a8(w)

            def call(t):
                return lambda: torch.ops.qfuse.w8a8_gemm(xq, x_scale, t["wq"], t["w_scale"], None, dtype)

        else:
            t = quantize_w4a8(w, g)

            def call(t):
                return lambda: torch.ops.qfuse.w4a8_gemm(xq, x_scale, t["qweight"], t["w_scale"], t["group_scale"], None, g, dtype)

    copies = copies_for(sum(v.numel() * v.element_size() for v in t.values() if v is not None), max_copies=32)
    tables = [t] + [{name: None if v is None else v.clone() for name, v in t.items()} for _ in range(copies - 1)]
    return [call(c) for c in tables]


def time_rows(rows: list[dict], tree: str, replays: int, csv_path: Path | None) -> list[dict]:
    """Time every row; each is appended to ``csv_path`` as it is measured (a run stopped early keeps them)."""
    import torch

    from qfuse.ops._autotune import graph_time_ms

    out = []
    start = time.time()
    f = None
    if csv_path:
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        f = csv_path.open("w", newline="")
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
    try:
        for i, row in enumerate(rows):
            calls = build_calls(row)
            us = graph_time_ms(calls, replays=replays, warmup=2) * 1e3
            out.append({**row, "us": f"{us:.3f}", "tree": tree})
            if f:
                writer.writerow(out[-1])
                f.flush()
            del calls
            if i % 25 == 0:
                print(
                    f"[picks] {i + 1}/{len(rows)} {row['op']} M={row['m']} {row['n']}x{row['k']}: {us:.2f} us ({time.time() - start:.0f} s)",
                    flush=True,
                )
            torch.cuda.empty_cache()
    finally:
        if f:
            f.close()
    return out


def load_times(paths: str) -> dict[tuple, float]:
    """Per key, the least time over the comma-separated CSVs (repeated passes of one tree)."""
    times: dict[tuple, float] = {}
    for p in paths.split(","):
        with open(p) as f:
            for r in csv.DictReader(f):
                key = (r["op"], int(r["m"]), int(r["n"]), int(r["k"]), int(r["group"]), r["dtype"], int(r["bits"]))
                times[key] = min(times.get(key, math.inf), float(r["us"]))
    return times


def compare(before: str, after: str, tolerance: float) -> int:
    """Print after/before per op (median, min, max, keys beyond the tolerance); 1 if any is slower.

    ``before`` / ``after``: comma-separated CSVs; each key takes its least time over them."""
    b, a = load_times(before), load_times(after)
    keys = sorted(set(a) & set(b))
    slower = []
    print(f"{'op':<11} {'keys':>5} {'median':>7} {'min':>6} {'max':>6} {'>' + format(tolerance, '.0%'):>5}")
    for op in OPS:
        ratios = [(a[key] / b[key], key) for key in keys if key[0] == op]
        if not ratios:
            continue
        rs = [r for r, _ in ratios]
        over = [(r, key) for r, key in ratios if r > 1 + tolerance]
        slower += over
        print(f"{op:<11} {len(rs):>5} {statistics.median(rs):>7.3f} {min(rs):>6.3f} {max(rs):>6.3f} {len(over):>5}")
    for r, key in sorted(slower, reverse=True):
        print(f"  slower: {key} {b[key]:.2f} -> {a[key]:.2f} us ({r:.3f})")
    return 1 if slower else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="qfuse bench picks", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tables", type=Path, default=Path(__file__).resolve().parents[2] / "ops" / "tuned", help="folder of the shipped tables whose keys are timed"
    )
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--csv", type=Path, help="write the timings here")
    ap.add_argument("--tree", default="", help="label for the CSV's tree column")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="CSVs to compare (each side: comma-separated passes)")
    ap.add_argument("--tolerance", type=float, default=0.03, help="ratio above 1 + this counts as slower (default 0.03)")
    args = ap.parse_args(argv)
    if args.compare:
        missing = [p for side in args.compare for p in side.split(",") if not Path(p).is_file()]
        if missing:
            ap.error(f"--compare: no such file: {', '.join(missing)}")
        return compare(*args.compare, args.tolerance)
    import torch

    from qfuse.bench._device import require_cuda

    require_cuda("picks")
    os.environ["QFUSE_AUTOTUNE"] = "0"  # the shipped pick (or the untuned default), never a measurement
    os.environ.setdefault("QFUSE_AUTOTUNE_CACHE", os.devnull)
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    rows = [r for op in args.ops.split(",") for r in shipped_keys(args.tables, op, gpu)]
    if not rows:
        print(f"qfuse bench picks: no shipped keys for {gpu} under {args.tables}", file=sys.stderr)
        return 2
    import qfuse

    print(f"[picks] {len(rows)} keys, qfuse from {Path(qfuse.__file__).parent}, torch {torch.__version__}", flush=True)
    time_rows(rows, args.tree, args.replays, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
