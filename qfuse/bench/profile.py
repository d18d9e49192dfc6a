"""``qfuse bench profile``: where one decode step's time goes, per kernel category and per scheme.

The model and step of ``qfuse bench model`` (a Hugging Face decoder of a published shape with
random bf16 weights, lm_head bf16, one new token per sequence at position ``--context`` of a
``StaticCache``), with ``--layers`` decoder layers (default 4: every layer runs the same kernels,
so the per-layer figures of a 32-layer model are these; the embedding, final norm and lm_head run
once). Per case and batch, under ``torch.profiler``:

* ``compiled``: ``qfuse.compile`` / ``torch.compile`` (fullgraph) of the step, called ``--steps``
  times without a CUDA graph (the kernels are the same; the graph removes only the launches).
  Each GPU kernel's time per step, grouped by :func:`category`; ``step_ms`` is one CUDA-graph
  replay of the step, ``kernel_us`` the sum of its kernels (the rest are gaps between them).
* ``eager``: the step called from Python: each GPU kernel likewise, and each operator's host
  (CPU) time per step (``eager_ops.csv``: what ``model.generate`` without compile waits on), and
  a ``cProfile`` of one step (``cprofile_<case>_b<batch>.txt``, the Python functions by own time);
  ``step_ms`` is the median synchronized step (``qfuse bench model``'s eager timing).
* ``prefill`` (``--prefill TOKENS``): the compiled forward over one prompt of TOKENS tokens (``qfuse
  bench model``'s prefill row), its kernels likewise; ``step_ms`` one CUDA-graph replay.

Writes ``profile.csv`` (case, mode, batch, category: kernels and us per step),
``kernels.csv`` (each kernel), ``eager_ops.csv``, ``steps.csv`` and ``profile.png`` (stacked
bars of the categories per case) under ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import sys
import time
from pathlib import Path

import torch

from ._device import require_cuda
from .model import MODELS, QFUSE_CASES, DecodeStep, PrefillStep, build_model, compile_step, model_config, time_captured, time_eager
from .timing import write_csv

DEFAULT_CASES = ("bf16", "W4A16", "W4A8_G128", "W8A8", "W8A8:nopasses")

# Inductor names a generated kernel after the aten ops it fuses (triton.descriptive_names):
# the first rule with an op of the name (a word with "_": a part of the name) gives the category
_INDUCTOR_RULES = (
    # HF's repeat_kv: the cached K / V expanded from the KV heads to every query head, feeding the
    # attention kernel (its name carries the attention op it was fused for)
    ("attention inputs", ("scaled_dot_product", "attention")),
    ("norm", ("rsqrt", "mean", "pow")),
    ("kv cache write", ("index_put", "index_copy", "scatter")),
    ("rope", ("cos", "sin", "neg", "cat")),
    ("attention", ("bmm", "softmax", "amax", "exp")),
    ("act", ("silu", "sigmoid")),
    ("residual add", ("add",)),
)
# qfuse's own Triton kernels are named _<what>_kernel
_QFUSE_RULES = (
    ("qfuse norm", ("rms_norm", "norm")),
    ("qfuse quant", ("quant",)),
    ("qfuse act", ("silu",)),
    ("qfuse moe", ("moe", "expert", "align", "_sum")),
)


def category(kernel: str) -> str:
    """The category of a GPU kernel from its name (profile.csv groups by it)."""
    name = kernel.lower()
    if name.startswith(("memcpy", "memset")) or "memcpy" in name or "memset" in name:
        return "memcpy / memset"
    if name.startswith("triton_"):  # Inductor's generated kernels (triton_poi_ / _red_ / _per_ / _tem_)
        if name.startswith("triton_tem_"):
            return "GEMM (Inductor template)"
        ops = set(name.split("_"))  # whole op names: "exp" is not "expand", "cat" not "scatter"
        for label, words in _INDUCTOR_RULES:
            if any((w in name) if "_" in w else (w in ops) for w in words):
                return f"{label} (Inductor)"
        return "other (Inductor)"
    if any(w in name for w in ("flash", "fmha", "attention", "attn")):
        return "attention"
    if name.startswith("_") and "kernel" in name:
        for label, words in _QFUSE_RULES:
            if any(w in name for w in words):
                return label
        return "qfuse GEMM"
    if any(w in name for w in ("gemm", "gemv", "nvjet", "xmma", "cutlass", "cublas", "splitk", "sm90_", "sm80_")):
        return "cuBLAS GEMM"
    if any(w in name for w in ("elementwise", "vectorized", "reduce_kernel", "index", "copy", "fill", "cat")):
        return "aten elementwise"
    return "other"


def _kernel_times(prof, steps: int) -> dict[str, tuple[int, float]]:
    """kernel name -> (calls per step, us per step) of the GPU kernels ``prof`` recorded."""
    out: dict[str, tuple[int, float]] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        calls, us = out.get(e.name, (0, 0.0))
        out[e.name] = (calls + 1, us + e.time_range.elapsed_us())
    return {k: (round(c / steps), us / steps) for k, (c, us) in out.items()}


def _host_ops(prof, steps: int, top: int = 40) -> list[dict]:
    """The operators' host time per step (self and total CPU us), the costliest ``top`` by total."""
    rows = []
    for a in prof.key_averages():
        if a.device_type != torch.autograd.DeviceType.CPU or a.key.startswith("ProfilerStep"):
            continue
        rows.append(
            {
                "op": a.key,
                "calls": round(a.count / steps, 2),
                "cpu_us": round(a.cpu_time_total / steps, 1),
                "self_cpu_us": round(a.self_cpu_time_total / steps, 1),
            }
        )
    rows.sort(key=lambda r: -r["cpu_us"])
    return rows[:top]


def profile_calls(fn, args: tuple, steps: int, cpu: bool):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if cpu else [])
    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn(*args)
        torch.cuda.synchronize()
    return prof


def cprofile_text(fn, args: tuple, lines: int = 45) -> str:
    """The Python functions of one ``fn(*args)`` call by their own time (cProfile)."""
    pr = cProfile.Profile()
    pr.enable()
    fn(*args)
    torch.cuda.synchronize()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(lines)
    return buf.getvalue()


def _account(prof, base: dict, steps: int, cats: list[dict], kernels: list[dict]) -> tuple[float, int, str]:
    """Add ``prof``'s kernels of one (case, mode, batch) to ``kernels`` and their categories to
    ``cats``; returns the kernel us per step, the kernel count and the log line's category part."""
    by_cat: dict[str, tuple[int, float]] = {}
    for name, (calls, us) in _kernel_times(prof, steps).items():
        c = category(name)
        kernels.append({**base, "category": c, "kernel": name[:160], "calls": calls, "us": round(us, 2)})
        n, t = by_cat.get(c, (0, 0.0))
        by_cat[c] = (n + calls, t + us)
    kernel_us = sum(t for _, t in by_cat.values())
    ranked = sorted(by_cat.items(), key=lambda kv: -kv[1][1])
    for c, (n, t) in ranked:
        cats.append({**base, "category": c, "kernels": n, "us": round(t, 1), "share": round(t / kernel_us, 4) if kernel_us else 0})
    return kernel_us, sum(n for n, _ in by_cat.values()), ", ".join(f"{c} {t:.0f} us" for c, (_, t) in ranked[:6])


def profile_case(case: str, args, out: Path, log=print) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    config = model_config(args.model, args.layers)
    model = build_model(config, case, "cuda")
    summary, cats, kernels, host = [], [], [], []

    def measure(mode: str, batch: int, fn, inputs: tuple, timed) -> None:
        t0 = time.perf_counter()
        fn(*inputs)  # the compile, or the eager warm-up
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        prof = profile_calls(fn, inputs, args.steps, cpu=mode == "eager")
        step_ms = timed(fn, inputs)
        if mode == "eager":
            for r in _host_ops(prof, args.steps):
                host.append({"case": case, "batch": batch, **r})
            (out / f"cprofile_{case.replace(':', '_')}_b{batch}.txt").write_text(cprofile_text(fn, inputs))
        base = {"case": case, "mode": mode, "batch": batch}
        kernel_us, n_kernels, top = _account(prof, base, args.steps, cats, kernels)
        summary.append(
            {
                **base,
                "layers": config.num_hidden_layers,
                "tokens": inputs[0].shape[1],
                "step_ms": round(step_ms, 4),
                "kernel_us": round(kernel_us, 1),
                "kernels": n_kernels,
                "first_call_s": round(first_s, 1),
            }
        )
        what = f"prefill {inputs[0].shape[1]}" if mode == "prefill" else f"{mode} batch {batch}"
        log(f"[profile] {case} {what}: step {step_ms:.3f} ms, kernels {kernel_us / 1e3:.3f} ms ({n_kernels} kernels); {top}")

    def eager_ms(fn, inputs):
        return time_eager(fn, inputs, args.steps)

    def replay_ms(fn, inputs):
        return time_captured(fn, inputs, args.replays)

    with torch.inference_mode():
        for batch in args.batches:
            step = DecodeStep(model, args.context + 8, batch)
            ids = torch.randint(0, config.vocab_size, (batch, 1), device="cuda")
            pos = torch.tensor([args.context], device="cuda")
            if not args.no_eager:
                measure("eager", batch, step, (ids, pos), eager_ms)
            if not args.no_compile:
                measure("compiled", batch, compile_step(step, case), (ids, pos), replay_ms)
            del step
        if args.prefill:  # compiled only, as bench model times its prefill rows
            ids = torch.randint(0, config.vocab_size, (1, args.prefill), device="cuda")
            measure("prefill", 1, compile_step(PrefillStep(model), case), (ids,), replay_ms)
    del model
    gc.collect()
    return summary, cats, kernels, host


def plot(cats: list[dict], path: Path) -> None:
    """One panel per (mode, batch): each case's kernel time per step, stacked by category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["mode"], r["batch"]) for r in cats))
    names = list(dict.fromkeys(r["category"] for r in sorted(cats, key=lambda r: -r["us"])))
    colors = {c: plt.cm.tab20(i % 20) for i, c in enumerate(names)}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), squeeze=False)
    for ax, (mode, batch) in zip(axes.flat, panels):
        sub = [r for r in cats if (r["mode"], r["batch"]) == (mode, batch)]
        cases = list(dict.fromkeys(r["case"] for r in sub))
        bottom = [0.0] * len(cases)
        for c in names:
            heights = [sum(r["us"] for r in sub if r["case"] == case and r["category"] == c) / 1e3 for case in cases]
            ax.bar(cases, heights, bottom=bottom, color=colors[c], label=c)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_title("prefill" if mode == "prefill" else f"{mode}, batch {batch}")
        ax.set_ylabel("GPU kernel time per step (ms)")
        ax.tick_params(axis="x", rotation=45, labelsize=7)
    axes.flat[-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="qfuse bench profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="llama3-8b")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (the per-layer kernels are the same in each)")
    ap.add_argument(
        "--cases",
        nargs="+",
        default=list(DEFAULT_CASES),
        help=f"bf16, {', '.join(QFUSE_CASES)} (SCHEME:nopasses), torchao-int4; modifiers as bench model's (CASE:attn, CASE:fuse, ...)",
    )
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 16], help="decode batches (none: --prefill only)")
    ap.add_argument("--prefill", type=int, default=0, metavar="TOKENS", help="also profile the compiled prefill of one TOKENS-long prompt")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5, help="steps profiled")
    ap.add_argument("--replays", type=int, default=20, help="CUDA-graph replays timed (compiled step_ms)")
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench_profile"))
    args = ap.parse_args(argv)
    require_cuda("profile")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"[profile] torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.model} x {args.layers} layers", flush=True)
    tables: dict[str, list[dict]] = {"steps": [], "profile": [], "kernels": [], "eager_ops": []}
    failed = False
    for case in args.cases:
        try:
            for name, rows in zip(tables, profile_case(case, args, args.out)):
                tables[name] += rows
        except Exception as e:  # one case's failure must not cost the others
            failed = True
            print(f"[profile] {case}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        for name, rows in tables.items():
            if rows:
                write_csv(rows, args.out / f"{name}.csv")
    if tables["profile"]:
        plot(tables["profile"], args.out / "profile.png")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
