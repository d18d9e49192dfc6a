"""``qfuse bench norm_quant``: fused norm / activation + int8 quantize against its peers.

Per (op, hidden size H, M tokens), bf16 by default, medians in microseconds, one run:

* ``fused_us``: the fused qfuse op (``rms_norm_quant``, ``fused_add_rms_norm_quant``,
  ``silu_and_mul_quant``), one Triton kernel;
* ``unfused_us``: the two unfused qfuse kernels: ``rms_norm`` / ``fused_add_rms_norm``
  then ``quant_per_token_int8``; for SiLU the Triton ``silu_and_mul`` kernel (the same
  kernel with the quantization switched off; not a registered op) then the quantizer;
* ``inductor_us``: ``torch.compile`` (default mode) of the plain-torch reference,
  i.e. the norm / activation + quantize as torch code, fused by Inductor itself
  (compiled once per (op, H); M = 1 static, then Inductor's automatic dynamic M);
* ``floor_us``: bytes the fused op must move / measured HBM bandwidth (timing.hbm_bandwidth: max of copy and read-only); ``fused_tb_s``:
  those bytes / ``fused_us``;
* ``fused_eager_us``, ``unfused_eager_us``: one eager call, Python launch overhead included.

Kernel times are CUDA-graph replays cycling through enough input copies to stream
> 3x L2 per replay (qfuse/bench/timing.py). ``--accuracy`` also writes
``norm_quant_accuracy.csv``: per op, dtype and H, how many outputs / codes / scales of
the CUDA op differ from the plain-torch reference run on the GPU and on the CPU.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ._device import require_cuda
from .timing import copies_for, hbm_bandwidth, plot_speedup, time_eager, time_graph, write_csv

OPS = ("rms_norm_quant", "fused_add_rms_norm_quant", "silu_and_mul_quant")
EPS = 1e-6


def _inputs(op: str, m: int, h: int, dtype, dev, seed: int = 0):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = (torch.randn(m, h, device=dev, generator=g) * 2).to(dtype)
    if op == "silu_and_mul_quant":
        return (x, torch.randn(m, h, device=dev, generator=g).to(dtype))
    w = (torch.rand(h, device=dev, generator=g) + 0.5).to(dtype)
    if op == "rms_norm_quant":
        return (x, w)
    return (x, torch.randn(m, h, device=dev, generator=g).to(dtype), w)


def _bytes(op: str, m: int, h: int, elt: int) -> int:
    """Minimal bytes the fused op moves: inputs, int8 codes, fp32 scales (and residual_out)."""
    codes_scales = m * h + 4 * m
    if op == "rms_norm_quant":
        return m * h * elt + h * elt + codes_scales
    if op == "fused_add_rms_norm_quant":
        return 3 * m * h * elt + h * elt + codes_scales
    return 2 * m * h * elt + codes_scales


def _callables(op: str):
    """(fused, unfused, plain-torch reference) for one op; each takes the op's inputs."""
    from qfuse.ops.activation.silu_kernels import silu_and_mul_triton
    from qfuse.ops.rms_norm import fused_add_rms_norm_quant_ref, rms_norm_quant_ref
    from qfuse.ops.silu_and_mul_quant import silu_and_mul_quant_ref

    ops = torch.ops.qfuse
    if op == "rms_norm_quant":
        return (
            lambda x, w: ops.rms_norm_quant(x, w, EPS),
            lambda x, w: ops.quant_per_token_int8(ops.rms_norm(x, w, EPS)),
            lambda x, w: rms_norm_quant_ref(x, w, EPS),
        )
    if op == "fused_add_rms_norm_quant":

        def unfused(x, r, w):
            out, res = ops.fused_add_rms_norm(x, r, w, EPS)
            return (*ops.quant_per_token_int8(out), res)

        return (
            lambda x, r, w: ops.fused_add_rms_norm_quant(x, r, w, EPS),
            unfused,
            lambda x, r, w: fused_add_rms_norm_quant_ref(x, r, w, EPS),
        )
    return (
        ops.silu_and_mul_quant,
        lambda g, u: ops.quant_per_token_int8(silu_and_mul_triton(g, u)),
        silu_and_mul_quant_ref,
    )


def bench(ops_, hs, ms, dtype, bw, inductor: bool, log, dev: str = "cuda") -> list[dict]:
    dev = torch.device(dev)
    elt = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for op in ops_:
        fused, unfused, ref = _callables(op)
        for h in hs:
            compiled = torch.compile(ref) if inductor else None  # one per (op, H): static M=1, then dynamic M
            for m in sorted(ms):
                nbytes = _bytes(op, m, h, elt)
                copies = [_inputs(op, m, h, dtype, dev, seed=i) for i in range(copies_for(nbytes))]
                row = {"op": op, "dtype": str(dtype).replace("torch.", ""), "H": h, "M": m, "case": f"{op} H={h}"}
                t0 = time.time()
                row["fused_us"] = time_graph([lambda a=a: fused(*a) for a in copies])
                row["unfused_us"] = time_graph([lambda a=a: unfused(*a) for a in copies])
                if compiled is not None:
                    compiled(*copies[0])  # compile outside any capture
                    row["inductor_us"] = time_graph([lambda a=a: compiled(*a) for a in copies])
                row["bytes"] = nbytes
                row["floor_us"] = nbytes / bw * 1e6
                row["fused_eager_us"] = time_eager(lambda copies=copies: fused(*copies[0]))
                row["unfused_eager_us"] = time_eager(lambda copies=copies: unfused(*copies[0]))
                row["fused_vs_unfused"] = row["unfused_us"] / row["fused_us"]
                if "inductor_us" in row:
                    row["fused_vs_inductor"] = row["inductor_us"] / row["fused_us"]
                row["fused_tb_s"] = nbytes / row["fused_us"] / 1e6  # bytes moved per second, in TB/s
                rows.append(row)
                log(
                    f"{op:26s} H={h:5d} M={m:5d}  fused {row['fused_us']:8.2f}  unfused {row['unfused_us']:8.2f}  "
                    f"inductor {row.get('inductor_us', float('nan')):8.2f}  floor {row['floor_us']:7.2f} us  "
                    f"x{row['fused_vs_unfused']:.2f} / x{row.get('fused_vs_inductor', float('nan')):.2f}  ({time.time() - t0:.1f}s)"
                )
                del copies
    return rows


def _ulp_mismatch(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    i, j = a.view(torch.int16).int(), b.view(torch.int16).int()
    oi, oj = torch.where(i < 0, -(i & 0x7FFF), i), torch.where(j < 0, -(j & 0x7FFF), j)
    d = (oi - oj).abs()
    return int((d > 0).sum()), int(d.max())


def accuracy(hs, m, log, dev: str = "cuda") -> list[dict]:
    """Mismatch counts of the CUDA ops against the reference kernel on the GPU and on the CPU."""
    from qfuse.ops.activation.silu_kernels import silu_and_mul_triton
    from qfuse.ops.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
    from qfuse.ops.silu_and_mul_quant import silu_and_mul_ref

    ops = torch.ops.qfuse
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for h in hs:
            for op in ("rms_norm_quant", "fused_add_rms_norm_quant", "silu_and_mul_quant"):
                args = _inputs(op, m, h, dtype, torch.device(dev), seed=123)
                if op == "rms_norm_quant":
                    mid = ops.rms_norm(*args, EPS)
                    mid_ref = lambda a: rms_norm_ref(*a, EPS)  # noqa: E731
                elif op == "fused_add_rms_norm_quant":
                    mid = ops.fused_add_rms_norm(*args, EPS)[0]
                    mid_ref = lambda a: fused_add_rms_norm_ref(*a, EPS)[0]  # noqa: E731
                else:
                    mid = silu_and_mul_triton(*args)
                    mid_ref = lambda a: silu_and_mul_ref(*a)  # noqa: E731
                q, s = ops.quant_per_token_int8(mid)
                for where in (dev, "cpu"):
                    r = mid_ref(tuple(t.to(where) for t in args)).to(dev)
                    qr, sr = ops.quant_per_token_int8(r)  # exact on either device (test_quant_int8_kernel)
                    n_out, max_ulp = _ulp_mismatch(mid, r)
                    row = {
                        "op": op, "dtype": str(dtype).replace("torch.", ""), "H": h, "M": m, "reference_on": where,
                        "outputs": mid.numel(), "output_ulp_mismatches": n_out, "max_ulp": max_ulp,
                        "code_mismatches": int((q != qr).sum()), "max_code_diff": int((q.int() - qr.int()).abs().max()),
                        "scale_mismatches": int((s != sr).sum()), "rows": m,
                    }  # fmt: skip
                    rows.append(row)
                    log(" ".join(f"{k}={v}" for k, v in row.items()))
    return rows


def _markdown(rows: list[dict]) -> str:
    head = "| op | H | M | fused us | unfused us | Inductor us | fused / unfused | fused / Inductor | fused TB/s | floor us | fused eager us |"
    lines = [head, "|---|" + "---:|" * 10]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['H']} | {r['M']} | {r['fused_us']:.2f} | {r['unfused_us']:.2f} | "
            f"{r.get('inductor_us', float('nan')):.2f} | {r['fused_vs_unfused']:.2f}x | "
            f"{r.get('fused_vs_inductor', float('nan')):.2f}x | {r['fused_tb_s']:.2f} | {r['floor_us']:.2f} | {r['fused_eager_us']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qfuse bench norm_quant", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_results/norm_quant", help="folder for the CSV and PNG")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    p.add_argument("--hidden", nargs="+", type=int, default=[4096, 14336])
    p.add_argument("--m", nargs="+", type=int, default=[1, 16, 256, 4096])
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    p.add_argument("--no-inductor", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--accuracy", action="store_true", help="also count mismatches against the reference (GPU and CPU)")
    args = p.parse_args(argv)
    require_cuda("norm_quant")
    import triton

    out = Path(args.out)
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    bw = hbm_bandwidth()
    log(f"HBM bandwidth {bw / 1e12:.2f} TB/s")
    rows = bench(args.ops, args.hidden, args.m, getattr(torch, args.dtype), bw, not args.no_inductor, log)
    write_csv(rows, out / "norm_quant.csv")
    plot_speedup(
        rows, out / "norm_quant.png", x="M", series=["fused_vs_unfused", "fused_vs_inductor"], panel="case",
        title=f"fused norm/act + int8 quantize ({args.dtype}, {torch.cuda.get_device_name()})",
        ylabel="speedup of the fused op",
    )  # fmt: skip
    log(_markdown(rows))
    if args.accuracy:
        write_csv(accuracy(args.hidden, 1024, log), out / "norm_quant_accuracy.csv")
    return 0
