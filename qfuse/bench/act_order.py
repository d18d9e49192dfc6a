"""``qfuse bench act_order``: what a GPTQ act-order layer costs per call.

A checkpoint with ``desc_act`` stores its scale groups in a permuted input-channel order;
qfuse sorts the weight's channels by group once at load, and each call gathers the
activations (``x.index_select(1, act_perm)``, one extra small kernel) before the unchanged
W4A16 GEMM. Per (N x K, M), bf16, group 128, medians in microseconds, one run:

* ``plain_us``: ``QuantLinear`` without ``act_perm`` (a checkpoint without act-order);
* ``act_order_us``: the same layer with ``act_perm``;
* ``gather_us``: ``index_select`` alone (the layer gathers by advanced indexing, ~1 us less; docs/bench/act_order/gather_forms.py); ``overhead_pct``: ``act_order_us / plain_us - 1``;
* ``compiled_act_order_us``: gather + GEMM as one ``torch.compile``'d function (Inductor
  writes its own gather kernel); ``compiled_overhead_pct`` against ``plain_us``;
* ``act_order_eager_us``: one eager call with ``act_perm``, launch overhead included.

Kernel times are CUDA-graph replays cycling through enough weight copies to stream
> 3x L2 per replay (qfuse/bench/timing.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ._device import require_cuda
from .timing import copies_for, plot_speedup, time_eager, time_graph, write_csv

SHAPES = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))


def _layers(n: int, k: int, copies: int, perm: torch.Tensor | None):
    from qfuse.linear import QuantLinear
    from qfuse.schemes import get_scheme

    g = torch.Generator(device="cuda").manual_seed(0)
    layers = []
    for _ in range(copies):
        tensors = {
            "qweight": torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g),
            "scales": (torch.rand(n, k // 128, device="cuda", generator=g) * 0.01 + 0.001).to(torch.bfloat16),
            "zeros": None,
        }
        layers.append(QuantLinear(k, n, get_scheme("W4A16"), tensors, None, perm))
    return layers


@torch.compile(dynamic=False)
def _compiled(x, perm, qweight, scales):
    return torch.ops.qfuse.wna16_gemm(x[:, perm], qweight, scales, None, None, 4, 128)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qfuse bench act_order", description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, nargs="+", default=[1, 2, 16, 64, 256])
    p.add_argument("--out", type=Path, default=Path("bench_results"))
    args = p.parse_args(argv)
    require_cuda("act_order")
    rows = []
    for n, k in SHAPES:
        copies = copies_for(n * k // 2)
        perm = torch.randperm(k, device="cuda")
        plain, permuted = _layers(n, k, copies, None), _layers(n, k, copies, perm)
        for m in args.m:
            torch._dynamo.reset()  # one compile per (shape, M), never the recompile limit's eager fallback
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            with torch.inference_mode():
                plain_us = time_graph([lambda lay=lay: lay(x) for lay in plain])
                act_us = time_graph([lambda lay=lay: lay(x) for lay in permuted])
                xs = [x.clone() for _ in range(copies)]
                gather_us = time_graph([lambda xi=xi: xi.index_select(1, perm) for xi in xs])
                eager_us = time_eager(lambda: permuted[0](x))
                compiled_us = time_graph([lambda lay=lay: _compiled(x, perm, lay.qweight, lay.scales) for lay in permuted])
            rows.append(
                {
                    "shape": f"{n}x{k}",
                    "N": n,
                    "K": k,
                    "M": m,
                    "plain_us": round(plain_us, 2),
                    "act_order_us": round(act_us, 2),
                    "gather_us": round(gather_us, 2),
                    "overhead_pct": round(100 * (act_us / plain_us - 1), 1),
                    "act_order_eager_us": round(eager_us, 1),
                    "compiled_act_order_us": round(compiled_us, 2),
                    "compiled_overhead_pct": round(100 * (compiled_us / plain_us - 1), 1),
                    "plain_over_act_order": round(plain_us / act_us, 3),
                }
            )
            print(rows[-1], flush=True)
    write_csv(rows, args.out / "act_order.csv")
    for r in rows:
        r["plain_over_compiled"] = round(r["plain_us"] / r["compiled_act_order_us"], 3)
    plot_speedup(
        rows,
        args.out / "act_order.png",
        x="M",
        series=["plain_over_act_order", "plain_over_compiled"],
        panel="shape",
        title="W4A16 g128 bf16: act-order layer speed relative to the same layer without it",
        ylabel="plain_us / act_order_us",
    )
    print(f"wrote {args.out / 'act_order.csv'} and {args.out / 'act_order.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
