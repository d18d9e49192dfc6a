"""``qfuse bench gemm``: ``wna16_gemm`` (W4A16 / W8A16) against its peers, per shape and M.

Peers, timed in the same run, the same way (CUDA-graph replays over rotated weight copies,
median us per call; see qfuse/bench/timing.py):

* ``bf16``: ``torch.matmul(x, w.t())`` with a bf16 (or fp16) weight (cuBLAS);
* ``tinygemm``: ``torch._weight_int4pack_mm`` (bf16 only; its own packed layout, g = --group);
* ``gemlite``: gemlite 0.6 ``A16Wn``, 4- and 8-bit (if importable; its shipped H100 configs are loaded,
  since it ships none for the H200). ``--gemlite-autotune``: its autotune level, by default
  ``fast``, gemlite's own default (it tunes each kernel on the first, eager call, outside the
  timed graph). ``default`` (one fixed config per kernel, no tuning) is quicker but unfair at
  M = 1: the H100 file holds no GEMV configs, and the fixed GEMV config runs at 0.02-0.14x bf16 on the
  H200;
* ``floor``: bytes the op must move / measured HBM bandwidth (timing.hbm_bandwidth: max of copy and read-only).

Writes ``gemm.csv`` and ``gemm.png`` (speedup over bf16 vs M, one panel per shape and bits)
under ``--out``. ``--tune`` first measures every candidate config (qfuse/bench/_wna16_tune.py)
and writes ``wna16_gemm.tuned.json`` there (the format of ops/tuned/wna16_gemm.<gpu>.json).

    qfuse bench gemm --tune --out bench_results/gemm
    qfuse bench gemm --shapes 8192x8192 --m 1 16 --bits 4
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ._device import require_cuda
from ._peers import gemlite_layer, setup_gemlite

DEFAULT_SHAPES = ("4096x4096", "6144x4096", "28672x4096", "4096x14336", "8192x8192")
DEFAULT_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _args(argv):
    p = argparse.ArgumentParser(prog="qfuse bench gemm", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="N x K weight shapes (default: %(default)s)")
    p.add_argument("--m", nargs="+", type=int, default=list(DEFAULT_M), help="token counts M")
    p.add_argument("--bits", nargs="+", type=int, default=[4, 8], choices=(4, 8))
    p.add_argument("--group", type=int, default=128, help="group size (-1 = per-channel)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--asym", action="store_true", help="with zero points (default: symmetric)")
    p.add_argument("--out", default="bench_results/gemm", help="output folder for CSV / PNG / tuned JSON")
    p.add_argument("--tune", action="store_true", help="measure every candidate config first (slow)")
    p.add_argument(
        "--tune-families",
        nargs="+",
        default=None,
        metavar="KERNEL",
        help="with --tune: time only these kernel families (e.g. tiled_words) and the shipped pick of each key",
    )
    p.add_argument("--tune-workers", type=int, default=12, help="processes compiling candidates in parallel")
    p.add_argument("--precompile-only", action="store_true", help="only compile the --tune candidates (parallel), then exit")
    p.add_argument("--no-gemlite", action="store_true")
    p.add_argument("--gemlite-autotune", default="fast", choices=["default", "fast", "max"], help="gemlite's autotune level (its own default: fast)")
    p.add_argument("--no-eager", action="store_true", help="skip the eager per-call column")
    return p.parse_args(argv)


def _families(args) -> set[str] | None:
    return set(args.tune_families) if args.tune_families else None


def _tinygemm_weights(codes: torch.Tensor, k: int, group: int):
    """tinygemm's layout: high nibble = even k, then its tile packing; scales+zeros [K/g, N, 2]."""
    n = codes.shape[0]
    packed = ((codes[:, 0::2] << 4) | codes[:, 1::2]).contiguous()
    w = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
    sz = torch.stack([torch.rand(k // group, n, device=codes.device) * 0.02 + 0.005, torch.randn(k // group, n, device=codes.device) * 0.01], dim=-1)
    return w, sz.to(torch.bfloat16).contiguous()


def main(argv=None) -> int:
    args = _args(argv or [])
    require_cuda("gemm")  # --precompile-only too: its workers compile by running each config on the GPU
    from qfuse.ops._autotune import _key_str, _memory, device_name
    from qfuse.ops.wna16.dispatch import OP, config_key
    from qfuse.ops.wna16_gemm import wna16_gemm_ref

    from ._wna16_tune import make_weights, op_bytes, tune
    from .timing import copies_for, hbm_bandwidth, plot_speedup, time_eager, time_graph, write_csv

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    group = args.group
    log = lambda s: print(s, flush=True)  # noqa: E731
    if args.precompile_only:
        from ._wna16_tune import precompile

        precompile(shapes, args.m, args.bits, group, dtype, args.asym, args.tune_workers, families=_families(args))
        return 0
    if args.tune:
        tune(shapes, args.m, args.bits, group, dtype, args.asym, args.tune_workers, out_dir / "wna16_gemm.tuned.json", log, families=_families(args))
    gl_version = None if args.no_gemlite else setup_gemlite(log, args.gemlite_autotune)
    bw = hbm_bandwidth()
    log(
        f"{torch.cuda.get_device_name()} torch {torch.__version__} HBM bandwidth {bw / 1e12:.2f} TB/s gemlite {gl_version} (autotune {args.gemlite_autotune})"
    )

    rows = []
    for n, k in shapes:
        wb = [torch.randn(n, k, device=dev).to(dtype) for _ in range(copies_for(n * k * 2))]
        bf16_us = {}
        for bits in args.bits:
            codes, qw, s, z = make_weights(n, k, bits, group, dtype, args.asym)
            ops = [(qw.clone(), s.clone(), None if z is None else z.clone()) for _ in range(copies_for(op_bytes(1, n, k, bits, group, args.asym)))]
            tiny = gl = None
            if bits == 4 and dtype == torch.bfloat16 and group in (32, 64, 128, 256):
                tiny = [_tinygemm_weights(codes, k, group) for _ in range(copies_for(n * k // 2))]
            if gl_version is not None:
                try:
                    gl = [gemlite_layer(codes, s.clone(), group, dtype, bits) for _ in range(copies_for(n * k * bits // 8))]
                except Exception as e:
                    log(f"gemlite setup failed for {n}x{k}: {type(e).__name__}: {e}")
            for m in args.m:
                x = torch.randn(m, k, device=dev).to(dtype)
                row = {"shape": f"{n}x{k}", "N": n, "K": k, "M": m, "bits": bits, "group": group, "dtype": args.dtype, "asym": args.asym}
                out = torch.ops.qfuse.wna16_gemm(x, *ops[0], None, bits, group)  # eager first: config pick
                ref = wna16_gemm_ref(x, *ops[0], None, bits, group)
                row["max_rel_err"] = round(((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item(), 6)
                row["config"] = str(_memory.get(_key_str(OP, (device_name(dev), *config_key(m, n, k, bits, group, dtype)))))
                row["op_us"] = time_graph([lambda c=c: torch.ops.qfuse.wna16_gemm(x, *c, None, bits, group) for c in ops])
                if m not in bf16_us:
                    bf16_us[m] = time_graph([lambda w=w: torch.matmul(x, w.t()) for w in wb])
                row["bf16_us"] = bf16_us[m]
                if tiny is not None:
                    row["tinygemm_us"] = time_graph([lambda t=t: torch.ops.aten._weight_int4pack_mm(x, t[0], group, t[1]) for t in tiny])
                if gl is not None:
                    try:
                        if m == args.m[0]:
                            g_out = gl[0](x)
                            row["gemlite_rel_err"] = (
                                round(((g_out.float() - ref.float()).abs().max() / ref.float().abs().max()).item(), 6) if z is None else ""
                            )
                        row["gemlite_us"] = time_graph([lambda g=g: g(x) for g in gl])
                    except Exception as e:
                        log(f"gemlite failed at M={m}: {type(e).__name__}: {e}")
                        gl = None
                row["floor_us"] = op_bytes(m, n, k, bits, group, args.asym) / bw * 1e6
                if not args.no_eager:
                    row["op_eager_us"] = time_eager(lambda ops=ops, x=x: torch.ops.qfuse.wna16_gemm(x, *ops[0], None, bits, group))
                row["speedup_vs_bf16"] = row["bf16_us"] / row["op_us"]
                if "tinygemm_us" in row:
                    row["tinygemm_vs_bf16"] = row["bf16_us"] / row["tinygemm_us"]
                if "gemlite_us" in row:
                    row["gemlite_vs_bf16"] = row["bf16_us"] / row["gemlite_us"]
                row["pct_of_floor"] = 100 * row["floor_us"] / row["op_us"]
                for key in [c for c in row if c.endswith("_us") or c.endswith("_bf16")] + ["pct_of_floor"]:
                    row[key] = round(row[key], 2)
                rows.append(row)
                log(", ".join(f"{c}={v}" for c, v in row.items() if c not in ("config", "dtype", "asym")) + f" cfg={row['config']}")
            del ops, tiny, gl
            torch.cuda.empty_cache()
        del wb
        write_csv(rows, out_dir / "gemm.csv")  # after each shape: a run cut short keeps what it measured
    for r in rows:
        r["panel"] = f"W{r['bits']}A16 {r['shape']}"
    plot_speedup(rows, out_dir / "gemm.png", x="M", series=["speedup_vs_bf16", "tinygemm_vs_bf16", "gemlite_vs_bf16"], panel="panel",
                 title=f"wna16_gemm vs bf16 torch.matmul ({torch.cuda.get_device_name()}, {args.dtype}, g{group})")  # fmt: skip
    log(f"wrote {out_dir / 'gemm.csv'} and {out_dir / 'gemm.png'}")
    return 0
