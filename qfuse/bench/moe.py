"""``qfuse bench moe``: ``qfuse::fused_moe`` with bf16 and quantized experts against a per-expert torch loop.

Shapes (SiLU-gated experts, softmax top-k routing renormalized over the top k):

* ``mixtral-8x7b``: H 4096, I 14336, E 8, top-2;
* ``fine-grained``: H 2048, I 1408, E 64, top-8;

M (tokens) in 1, 4, 16, 64, 256, 1024, 4096 by default (``--m``). Cases, all in one run:

* ``bf16``, ``W8A16``, ``W4A16`` (group 128, symmetric), ``W8A8``, ``W4A8`` (per channel),
  ``W4A8_G128``: ``torch.ops.qfuse.fused_moe`` with the experts quantized and packed by
  ``qfuse.moe.QuantExperts.from_weights`` (the quantize_model path);
* ``W4A16_ACTORDER``: ``W4A16``'s experts read as act-order ones (a GPTQ ``desc_act`` checkpoint):
  a random input order per expert as ``w13_act_perm``, so fc1 reads one gathered activation row
  per (token, expert) pair; its cost over ``W4A16`` is that gather (``--every-config`` skips it);
* ``loop``: the naive bf16 peer, a Python loop over the experts the routing selects: routing
  (softmax, top-k, renormalize), gather of each expert's tokens, ``torch.matmul`` gate/up,
  ``silu(gate) * up``, ``torch.matmul`` down, routing-weighted ``index_add_`` (Hugging Face
  Mixtral's eager experts). Each expert's token list is found once per M outside the timed
  region (a CUDA graph cannot hold the host sync of ``torch.where``), so the figure omits
  that sync, which the eager module pays per expert.

Inputs: bf16 expert weights ``randn / sqrt(K)`` from a generator on the device; for each M, router
logits ``randn(M, E)`` (float32) then activations ``randn(M, H)`` from a CPU generator; every
generator is seeded with ``--seed`` (default 0), so a run's routing is fixed by the seed and M.

Timing on CUDA: median us per call of replays of a CUDA graph holding one call per weight copy;
each case cycles through enough copies of all E experts that one replay streams more than 3x
the L2 (60 MB) in touched expert bytes (``timing.copies_for``), so the experts come from HBM.
Before it is timed, each (case, M) runs once eagerly: that call picks the op's config, so under
the default ``QFUSE_AUTOTUNE=1`` the first call of each key (M bucket, E, I, H, top-k, format)
measures every offered config once (``ops/_autotune.py``), and ``QFUSE_AUTOTUNE=0`` runs the
untuned config (the stored pick of the nearest shape, else the heuristic's first). That call's
output is compared with the op's reference kernel (``max_rel_err``: max |out - ref| / max |ref|;
the loop against the bf16 reference).

Columns: ``us``; ``x_bf16`` (the qfuse bf16 MoE's us / this us) and ``x_loop`` (the loop's us /
this us), above 1 this case is faster; ``pct_of_floor``: ``floor_us`` / us, where ``floor_us`` =
bytes of the experts the routing selects at that M (``experts_touched`` distinct experts x
``expert_mb``, that format's codes, scales, zero points and group scales of w13 and w2) / the
HBM bandwidth measured in this run (``hbm_tb_s``: ``timing.hbm_bandwidth``, max of copy and
read-only); activations are not in the floor. ``copies``: weight copies the graph cycles through;
``tile_major``: the experts' codes tile-major (``QuantExperts``' layout; ``--natural-codes``: never); ``config``: the op's pick for that key. Rows go to ``moe.csv`` as each finishes (a case that fails
gets a row with its ``error``, the others go on, and the exit status is 1); ``moe.png`` plots
x bf16 per case against M, one panel per shape.

``--every-config``: each fused_moe case (bf16 included) also times every config of every family
that supports its key, opt-in families included, the same way (HBM copies, graph replays),
each checked against the reference: one row per config in ``moe_configs.csv`` (``family``,
``config``, ``us``, ``x_pick``: the run's pick's us / this us, ``opt_in``: why the family is
opt-in, "" if offered, ``max_rel_err``, ``tile_major``: the experts' layout), and the fastest
config of each key in ``moe_picks.json`` in the format of ``ops/tuned/fused_moe.<gpu>.json``
(tile-major experts' keys end in ``tile_major``).

    qfuse bench moe --out bench_results/moe
    QFUSE_AUTOTUNE=0 qfuse bench moe --shapes mixtral-8x7b --m 1 16 4096 --cases bf16 loop W4A16
    QFUSE_AUTOTUNE=0 qfuse bench moe --m 1 2 4 8 16 --cases bf16 W4A16 W8A16 --every-config
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ._device import require_cuda
from .timing import write_csv

SHAPES = {  # H, I, E, top_k
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "fine-grained": (2048, 1408, 64, 8),
    # CPU-sized, for the tests of this module
    "tiny": (128, 256, 4, 2),
    "tiny-fine": (128, 128, 16, 4),
}
GPU_SHAPES = ("mixtral-8x7b", "fine-grained")
CPU_SHAPES = ("tiny", "tiny-fine")
DEFAULT_M = (1, 4, 16, 64, 256, 1024, 4096)
CPU_M = (1, 4, 16)
CASES = ("bf16", "loop", "W8A16", "W4A16", "W4A16_ACTORDER", "W8A8", "W4A8", "W4A8_G128")
TENSORS = ("w13", "w13_scale", "w13_zeros", "w13_group_scale", "w2", "w2_scale", "w2_zeros", "w2_group_scale")  # fused_moe's order
CPU_BANDWIDTH = 4.3e12  # bytes/s for the floor column of the CPU test mode: the H200 runs of BENCHMARKS.md measured 4.1-4.4 TB/s
CPU_STEPS = 3


def _args(argv):
    p = argparse.ArgumentParser(prog="qfuse bench moe", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=None, help=f"MoE shapes (default: {' '.join(GPU_SHAPES)})")
    p.add_argument("--m", nargs="+", type=int, default=None, help=f"token counts M (default: {' '.join(map(str, DEFAULT_M))})")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="cases to time (default: all); x bf16 / x loop need bf16 / loop")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, activations and router logits")
    p.add_argument("--replays", type=int, default=20, help="CUDA-graph replays timed (the median is reported)")
    p.add_argument("--every-config", action="store_true", help="also time every config of every family (moe_configs.csv, moe_picks.json)")
    p.add_argument("--families", nargs="+", default=None, help="--every-config: only these kernel families' configs (default: all)")
    p.add_argument("--natural-codes", action="store_true", help="weight-only experts in the natural packing, not QuantExperts' tile-major codes")
    p.add_argument("--out", type=Path, default=Path("bench_results/moe"), help="folder for moe.csv and moe.png")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the tests' tiny shapes, reference kernel, wall-clock timing
    args = p.parse_args(argv)
    if args.families:
        from qfuse.ops.moe.dispatch import REGISTRY

        known = [f.name for f in REGISTRY.families]
        if unknown := [f for f in args.families if f not in known]:
            p.error(f"--families: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    cpu = args.device == "cpu"
    args.shapes = args.shapes or list(CPU_SHAPES if cpu else GPU_SHAPES)
    args.m = args.m or list(CPU_M if cpu else DEFAULT_M)
    args.cases = [c for c in CASES if c in args.cases]  # bf16 and loop first: the other rows' ratios need them
    return args


def _scheme(case: str) -> str | None:
    return None if case in ("bf16", "loop") else case.removesuffix("_ACTORDER")


def expert_tensors(w13: torch.Tensor, w2: torch.Tensor, top_k: int, case: str, natural: bool = False) -> tuple[tuple, tuple[int, int, int], bool]:
    """``fused_moe``'s eight weight arguments (TENSORS order), ``(weight_bits, act_bits, group_size)`` and
    ``tile_major`` for float ``w13 [E, 2I, H]`` / ``w2 [E, H, I]`` quantized as ``case``, as ``QuantExperts``
    holds them (weight-only codes tile-major where the shapes allow; ``natural``: never)."""
    from qfuse.moe import QuantExperts

    experts = QuantExperts.from_weights(w13, w2, top_k, True, _scheme(case), name=case, tile_major=False if natural else None)
    return tuple(getattr(experts, n) for n in TENSORS), experts.format, experts.tile_major


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def clone(tensors) -> tuple:
    return tuple(None if t is None else t.clone() for t in tensors)


def fused_moe(x, logits, top_k: int, tensors, fmt, act_perm=None, tile_major=False):
    return torch.ops.qfuse.fused_moe(x, logits, top_k, True, *tensors, *fmt, act_perm, tile_major)


def random_act_perm(e: int, h: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """``[E, H]`` int64: a random input channel order per expert (``fused_moe``'s ``w13_act_perm``)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(h, generator=gen) for _ in range(e)]).to(device)


def expert_plan(experts: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(e, token rows, top-k slots)`` of every expert that ``experts [M, top_k]`` selects (host syncs: untimed)."""
    plan = []
    for e in torch.unique(experts).tolist():
        rows, slots = torch.where(experts == e)
        plan.append((e, rows, slots))
    return plan


def moe_loop(x, logits, top_k: int, w13, w2, plan) -> torch.Tensor:
    """The per-expert bf16 loop: route, gather, gate/up matmul, silu(gate) * up, down matmul, weighted ``index_add_``."""
    from qfuse.ops.moe.routing import topk_routing

    weights, _ = topk_routing(logits, top_k, True)
    out = torch.zeros_like(x)
    for e, rows, slots in plan:
        gate, up = torch.matmul(x[rows], w13[e].t()).chunk(2, dim=-1)
        y = torch.matmul(F.silu(gate) * up, w2[e].t())
        out.index_add_(0, rows, (y * weights[rows, slots, None]).to(x.dtype))
    return out


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return round(((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-30)).item(), 6)


def _time_cpu(calls, steps: int = CPU_STEPS) -> float:
    """Median wall-clock us per call on the CPU (the test mode; the GPU figures are graph replays)."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for c in calls:
            c()
        times.append((time.perf_counter() - t0) * 1e6 / len(calls))
    return statistics.median(times)


def table_key(gpu: str, m: int, e: int, i: int, h: int, top_k: int, fmt, dtype, tile_major: bool = False, stored: bool = False) -> str:
    """The picks' key of a fused_moe call, as in ``ops/tuned/fused_moe.<gpu>.json`` and the autotune cache;
    ``stored``: the key the op looks up (a tile-major call without a stored pick takes the natural layout's)."""
    from qfuse.ops._autotune import _key_str
    from qfuse.ops.moe.dispatch import OP, config_key, layout_key

    key = config_key(m, e, i, h, top_k, *fmt, dtype, tile_major)
    return _key_str(OP, (gpu, *(layout_key(key, gpu) if stored else key)))


def _picked_config(dev: torch.device, m: int, e: int, i: int, h: int, top_k: int, fmt, dtype, tile_major: bool) -> str:
    """The config ``fused_moe`` runs for this key (measured, stored or untuned pick); "" on the CPU (reference kernel)."""
    if dev.type != "cuda":
        return ""
    from qfuse.ops._autotune import _memory, _untuned, device_name, experimental_kernels

    entry = table_key(device_name(dev), m, e, i, h, top_k, fmt, dtype, tile_major, stored=True)
    cfg = _memory.get(entry) or _untuned.get((entry, experimental_kernels()))
    return "" if cfg is None else str(cfg)


def every_config(x, logits, top_k: int, sets, fmt, ref, timed, pick_us: float, families=None, tile_major=False) -> list[dict]:
    """One row per config of every family (of ``families``, where given) that supports this call's key (opt-in ones included):
    ``family``, ``config``, ``us`` (``timed`` over the weight copies ``sets``), ``x_pick``
    (``pick_us`` / us), ``opt_in`` (why its family keeps it opt-in, "" if offered), ``max_rel_err``
    against ``ref``; a config that fails gets its ``error``."""
    from qfuse.ops.moe.dispatch import REGISTRY, problem
    from qfuse.ops.moe.routing import topk_routing

    weights, experts = topk_routing(logits, top_k, True)
    bits, act_bits, group = fmt
    p = problem(x.shape[0], sets[0][0].shape[1] // 2, x.shape[1], bits, group, x.dtype, act_bits)
    rows = []
    for cfg in REGISTRY.candidates(p):
        if families and cfg["kernel"] not in families:
            continue
        row = {"family": cfg["kernel"], "config": str(cfg), "opt_in": REGISTRY.family(cfg["kernel"]).opt_in_reason(cfg)}
        try:
            err = _rel_err(REGISTRY.run(cfg, x, weights, experts, *sets[0], *fmt, tile_major), ref)
            us = timed([lambda t=t, c=cfg: REGISTRY.run(c, x, weights, experts, *t, *fmt, tile_major) for t in sets])
            row.update(us=round(us, 2), x_pick=round(pick_us / us, 3), max_rel_err=err)
        except Exception as exc:  # a config that does not compile or fit: its reason, the others go on
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        rows.append(row)
    return rows


def bench_shape(name: str, args, bw: float, log, on_row, on_config=None) -> None:
    """Every case of ``args.cases`` at every M of ``args.m`` for one shape; ``on_row(row)`` per
    finished row; with ``args.every_config``, ``on_config(row)`` per config row (:func:`every_config`)."""
    from qfuse.ops.moe.fused_moe import fused_moe_ref
    from qfuse.ops.moe.routing import topk_routing

    from .timing import copies_for, time_graph

    h, i, e, top_k = SHAPES[name]
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    w13f = torch.randn(e, 2 * i, h, device=dev, generator=gen).mul_(h**-0.5).to(dtype)  # float32 first: 3.8 GB for Mixtral
    w2f = torch.randn(e, h, i, device=dev, generator=gen).mul_(i**-0.5).to(dtype)

    inputs = {}  # M -> (x, logits, experts [M, top_k])
    for m in args.m:
        cpu_gen = torch.Generator().manual_seed(args.seed)
        logits = torch.randn(m, e, generator=cpu_gen).to(dev)
        x = torch.randn(m, h, generator=cpu_gen).to(dtype).to(dev)
        inputs[m] = (x, logits, topk_routing(logits, top_k, True)[1])
    touched = {m: int(torch.unique(inputs[m][2]).numel()) for m in args.m}

    weights = {}  # case -> ([copies of the eight tensors], format, bytes of one expert)
    for case in dict.fromkeys("bf16" if c == "loop" else c for c in args.cases):
        t0 = time.perf_counter()
        tensors, fmt, tiled = expert_tensors(w13f, w2f, top_k, case, args.natural_codes)
        per_expert = nbytes(tensors) // e
        copies = max(copies_for(touched[m] * per_expert) for m in args.m) if cuda else 1
        weights[case] = ([tensors] + [clone(tensors) for _ in range(copies - 1)], fmt, per_expert, tiled)
        log(f"[moe] {name} {case}: {per_expert / 1e6:.2f} MB per expert, {copies} copies, built in {time.perf_counter() - t0:.1f} s")
    act_perm = random_act_perm(e, h, args.seed, dev) if "W4A16_ACTORDER" in args.cases else None  # its input orders
    del w13f, w2f

    def timed(calls) -> float:
        return time_graph(calls, replays=args.replays) if cuda else _time_cpu(calls, min(args.replays, CPU_STEPS))

    refs_first = [c for c in ("bf16", "loop") if c in args.cases]  # timed first (args.cases is in CASES order)
    for m in args.m:
        x, logits, experts = inputs[m]
        plan = expert_plan(experts)
        refs: dict[str, torch.Tensor] = {}
        us: dict[str, float] = {}
        pending: list[dict] = []
        for case in args.cases:
            row = {"shape": name, "M": m, "case": case}
            try:
                sets, fmt, per_expert, tiled = weights["bf16" if case == "loop" else case]
                n = copies_for(touched[m] * per_expert) if cuda else 1
                key = "bf16" if case == "loop" else case
                perm = act_perm if case.endswith("_ACTORDER") else None
                if key not in refs:
                    refs[key] = fused_moe_ref(x, logits, top_k, True, *sets[0], *fmt, perm, tiled)
                if case == "loop":
                    out = moe_loop(x, logits, top_k, sets[0][0], sets[0][4], plan)
                    calls = [lambda t=t: moe_loop(x, logits, top_k, t[0], t[4], plan) for t in sets[:n]]
                else:
                    out = fused_moe(x, logits, top_k, sets[0], fmt, perm, tiled)  # eager first: the config pick (a measurement on a new key)
                    calls = [lambda t=t: fused_moe(x, logits, top_k, t, fmt, perm, tiled) for t in sets[:n]]
                err = _rel_err(out, refs[key])
                us[case] = timed(calls)
                floor_us = touched[m] * per_expert / bw * 1e6
                row.update(
                    us=us[case],
                    x_bf16="",
                    x_loop="",
                    pct_of_floor=round(100 * floor_us / us[case], 1),
                    floor_us=round(floor_us, 2),
                    bf16_us="",
                    loop_us="",
                    experts_touched=touched[m],
                    expert_mb=round(per_expert / 1e6, 3),
                    copies=n,
                    tile_major=tiled,
                    max_rel_err=err,
                    config="" if case == "loop" else _picked_config(dev, m, e, i, h, top_k, fmt, dtype, tiled),
                    E=e,
                    top_k=top_k,
                    H=h,
                    I=i,
                    hbm_tb_s=round(bw / 1e12, 3),
                    seed=args.seed,
                )
                if args.every_config and case != "loop" and perm is None and on_config is not None:
                    for c in every_config(x, logits, top_k, sets[:n], fmt, refs[key], timed, us[case], args.families, tiled):
                        on_config({"shape": name, "M": m, "case": case, **c, "E": e, "top_k": top_k, "H": h, "I": i,
                                   "bits": fmt[0], "act_bits": fmt[1], "group_size": fmt[2], "tile_major": tiled})  # fmt: skip
            except Exception as exc:  # a case that fails must not cost the others
                log(f"[moe] {name} M={m} {case}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            pending.append(row)
            if case in refs_first and len(pending) < len(refs_first):
                continue  # the bf16 row's x loop needs the loop's time
            for r in pending:
                _finish(r, us)
                on_row(r)
                log(_line(r))
            pending = []
        del refs
    del weights, inputs
    if cuda:
        torch.cuda.empty_cache()


def _finish(row: dict, us: dict[str, float]) -> None:
    """Fill the ratios of a timed row from the unrounded times, then round its times."""
    if "us" not in row:
        return
    t = row["us"]
    for ref, col in (("bf16", "x_bf16"), ("loop", "x_loop")):
        if ref in us:
            row[col] = round(us[ref] / t, 3)
            row[f"{ref}_us"] = round(us[ref], 2)
        else:
            row[col] = row[f"{ref}_us"] = ""
    row["us"] = round(t, 2)


def _line(row: dict) -> str:
    if "error" in row:
        return f"[moe] {row['shape']} M={row['M']} {row['case']}: FAILED"
    return (
        f"[moe] {row['shape']:<13} M={row['M']:<5} {row['case']:<10} {row['us']:>10.2f} us  x bf16 {row['x_bf16']!s:>6}  x loop {row['x_loop']!s:>6}"
        f"  {row['pct_of_floor']:>5.1f} % of floor ({row['experts_touched']} experts)  err {row['max_rel_err']}  {row['config']}"
    )


def fastest_configs(config_rows: list[dict], gpu: str) -> dict[str, dict]:
    """The fastest config of each key (bf16 activations; none with an error or a relative error
    above 5 %), keyed like ``ops/tuned/fused_moe.<gpu>.json`` (``gpu``: ``_autotune.device_name``)."""
    import ast

    best: dict[str, tuple[float, dict]] = {}
    for r in config_rows:
        if "us" not in r or r["max_rel_err"] > 0.05:
            continue
        fmt = (r["bits"], r["act_bits"], r["group_size"])
        entry = table_key(gpu, r["M"], r["E"], r["I"], r["H"], r["top_k"], fmt, torch.bfloat16, bool(r.get("tile_major")))
        if entry not in best or r["us"] < best[entry][0]:
            best[entry] = (r["us"], ast.literal_eval(r["config"]))
    return {k: cfg for k, (_, cfg) in best.items()}


def plot(rows: list[dict], path: Path, title: str) -> None:
    """x bf16 per case against M, one panel per shape (timing.plot_speedup on rows pivoted by case)."""
    from .timing import plot_speedup

    pivot: dict[tuple, dict] = {}
    for r in rows:
        if r.get("x_bf16") not in (None, ""):
            pivot.setdefault((r["shape"], r["M"]), {"shape": r["shape"], "M": r["M"]})[r["case"]] = r["x_bf16"]
    if not pivot:
        return
    series = [c for c in CASES if c != "bf16" and any(c in p for p in pivot.values())]
    plot_speedup(list(pivot.values()), path, x="M", series=series, panel="shape", title=title, ylabel="speedup over the qfuse bf16 MoE")


def main(argv=None) -> int:
    args = _args(argv)  # None: sys.argv (python -m qfuse.bench.moe)
    cuda = args.device == "cuda"
    if cuda:
        require_cuda("moe")
    from .timing import hbm_bandwidth

    log = lambda s: print(s, flush=True)  # noqa: E731
    if cuda:
        import triton

        bw = hbm_bandwidth()
        gpu = torch.cuda.get_device_name()
        log(f"{gpu}  torch {torch.__version__}  triton {triton.__version__}  HBM bandwidth {bw / 1e12:.2f} TB/s")
    else:
        bw, gpu = CPU_BANDWIDTH, "CPU, reference kernel"
        log(f"CPU test mode: reference kernel, wall-clock timing, floor at a stand-in {bw / 1e12:.2f} TB/s")
    log(f"QFUSE_AUTOTUNE={os.environ.get('QFUSE_AUTOTUNE', '1')}  seed {args.seed}  shapes {' '.join(args.shapes)}  M {' '.join(map(str, args.m))}")
    rows: list[dict] = []

    def on_row(row: dict) -> None:
        rows.append(row)
        write_csv(rows, args.out / "moe.csv")  # per row: a run cut short keeps what it measured

    config_rows: list[dict] = []

    def on_config(row: dict) -> None:
        config_rows.append(row)
        write_csv(config_rows, args.out / "moe_configs.csv")
        log(f"[moe]   {row['family']:<11} {row.get('us', 'FAILED')!s:>10} us  x pick {row.get('x_pick', '')!s:>6}  {row['config']}")

    for name in args.shapes:
        bench_shape(name, args, bw, log, on_row, on_config)
    if config_rows:
        path = args.out / "moe_picks.json"
        from qfuse.ops._autotune import device_name

        picks = fastest_configs(config_rows, device_name(torch.device(args.device)))
        path.write_text(json.dumps(picks, indent=1, sort_keys=True) + "\n")
        log(f"wrote {args.out / 'moe_configs.csv'} and {path}")
    plot(rows, args.out / "moe.png", f"qfuse fused_moe vs its bf16 experts ({gpu})")
    log(f"wrote {args.out / 'moe.csv'} and {args.out / 'moe.png'}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
