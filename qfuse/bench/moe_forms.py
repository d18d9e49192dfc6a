"""``qfuse bench moe_forms``: the forms of fused_moe's ``grouped_words`` family (ops/moe/grouped_words.py)
on one MoE shape at decode M, each config's whole call and its two GEMMs alone. CUDA-graph medians over
rotated copies of the experts (qfuse/bench/timing.py); W4A16 g128 symmetric, random bf16 weights.

Random inputs seeded by M (so the routing, and the experts it touches, differ from ``qfuse bench
moe``'s, seeded 0). Rows of ``moe_forms.csv``, one per (M, config): ``us`` the whole call after routing (the routing is
given: align, fc1, fc2, the sum), ``fc1_us`` / ``fc2_us`` each GEMM alone on the same route, ``pct_floor``
the whole call against the experts' bytes read once at ``--bandwidth``, ``max_rel_err`` against the op's
reference (max |out - ref| / max |ref|). Every config the family lists at each M (less those
``--without`` names) is timed, the opt-in forms too: they are run directly, whatever
``QFUSE_EXPERIMENTAL_KERNELS`` says. ``--tile-major``: each config on the natural and on tile-major
codes (ops/moe/tile_major.py; column ``layout``)::

    qfuse bench moe_forms --m 16 8 --out bench_results/moe_forms
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ._device import require_cuda
from .moe import SHAPES


def _args(argv):
    p = argparse.ArgumentParser(prog="qfuse bench moe_forms", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="mixtral-8x7b", choices=sorted(SHAPES), help="a shape of qfuse bench moe (default: mixtral-8x7b)")
    p.add_argument("--m", type=int, nargs="+", default=[16, 8], help="token counts")
    p.add_argument("--bandwidth", type=float, default=4.1, help="TB/s for pct_floor (default 4.1: the H200's copy rate here)")
    p.add_argument("--without", nargs="+", default=[], metavar="KEY", help="leave out the configs that set these keys (FOLD_ZERO, MAXNREG, ...)")
    p.add_argument("--tile-major", action="store_true", help="time each config on tile-major codes too")
    p.add_argument("--out", type=Path, default=Path("bench_results/moe_forms"))
    return p.parse_args(argv)


def _time_config(gw, cfg, layout, copies, x, weights, experts, fmt, ref, floor, row_div, topw, pairs, e) -> dict:
    """One row: ``cfg``'s whole call and fc1 / fc2 alone on ``copies`` of the experts in ``layout``."""
    from qfuse.ops.moe.align import align_block_size
    from qfuse.ops.wna16.tma import word_order_triton

    from .timing import time_graph

    tiled, group = layout == "tile_major", fmt[2]
    whole = lambda t: gw.run_moe_grouped_words(cfg, x, weights, experts, *t, *fmt, tiled)  # noqa: E731
    route = align_block_size(experts, e, cfg["BLOCK_M"])
    xx = word_order_triton(x, 128) if cfg.get("X_WORDS") else x
    fc1 = lambda t: gw.moe_mma_words(xx, *t[:3], None, group, cfg, route, pairs, row_div, 1, tiled)  # noqa: E731
    hh = fc1(copies[0])
    fc2 = lambda t: gw.moe_mma_words(hh, *t[4:7], topw, group, cfg, route, pairs, 1, cfg.get("SPLIT_K", 1), tiled)  # noqa: E731
    out = whole(copies[0]).float()
    row = {"M": x.shape[0], "layout": layout, "config": json.dumps({k: v for k, v in cfg.items() if k != "kernel"}, sort_keys=True)}
    row["max_rel_err"] = round(((out - ref).abs().max() / ref.abs().max()).item(), 6)
    for name, call in (("us", whole), ("fc1_us", fc1), ("fc2_us", fc2)):
        row[name] = round(time_graph([lambda t=t, call=call: call(t) for t in copies]), 2)
    row["pct_floor"] = round(100 * floor / row["us"], 1)
    return row


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    require_cuda("moe_forms")
    import qfuse  # noqa: F401  (registers the ops)
    from qfuse.ops.kernel_family import Problem
    from qfuse.ops.moe import grouped_words as gw
    from qfuse.ops.moe.align import fc1_row_div
    from qfuse.ops.moe.fused_moe import fused_moe_ref
    from qfuse.ops.moe.routing import topk_routing
    from qfuse.ops.moe.tile_major import from_tile_major, to_tile_major, with_codes

    from .moe import clone, expert_tensors
    from .timing import copies_for, write_csv

    h, i, e, top_k = SHAPES[args.shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(e, 2 * i, h, device="cuda", generator=gen).mul_(h**-0.5).to(torch.bfloat16)
    w2 = torch.randn(e, h, i, device="cuda", generator=gen).mul_(i**-0.5).to(torch.bfloat16)
    tensors, fmt, tiled = expert_tensors(w13, w2, top_k, "W4A16")
    if tiled:  # QuantExperts' layout of these experts: the natural codes first
        tensors = with_codes(tensors, from_tile_major)
    bits, group = fmt[0], fmt[2]
    del w13, w2
    torch.cuda.empty_cache()
    per_expert = sum(t.numel() * t.element_size() for t in tensors if t is not None) // e
    sets = {"natural": [tensors] + [clone(tensors) for _ in range(copies_for(e * per_expert) - 1)]}
    if args.tile_major:
        sets["tile_major"] = [with_codes(t, to_tile_major) for t in sets["natural"]]
    gpu = torch.cuda.get_device_name()
    print(
        f"{gpu}, torch {torch.__version__}: {args.shape} W4A16 g128, {per_expert / 1e6:.1f} MB per expert, {len(sets['natural'])} copies", flush=True
    )
    rows = []
    for m in args.m:
        g = torch.Generator().manual_seed(m)
        logits = torch.randn(m, e, generator=g).cuda()
        x = torch.randn(m, h, generator=g).to(torch.bfloat16).cuda()
        weights, experts = topk_routing(logits, top_k, True)
        topw, pairs, row_div = weights.reshape(-1).contiguous(), experts.numel(), fc1_row_div(x, experts)
        floor = int(torch.unique(experts).numel()) * per_expert / (args.bandwidth * 1e12) * 1e6
        ref = fused_moe_ref(x, logits, top_k, True, *tensors, *fmt).float()  # natural codes
        every = gw.configs(Problem(m, i, h, bits, group, torch.bfloat16, act_bits=16), exhaustive=False)
        cfgs = [c for c in every if not c["SCALE_W"] and not any(k in c for k in args.without)]
        t0 = time.time()
        for cfg in cfgs:
            for layout, copies in sets.items():
                rows.append(
                    _time_config(
                        gw, {"kernel": "grouped_words", **cfg}, layout, copies, x, weights, experts, fmt, ref, floor, row_div, topw, pairs, e
                    )
                )
                rows[-1]["gpu"] = gpu
        rows_m = sorted((r for r in rows if r["M"] == m), key=lambda r: r["us"])
        print(f"M={m}: floor {floor:.1f} us at {args.bandwidth} TB/s, {len(cfgs)} configs in {time.time() - t0:.0f} s")
        for r in rows_m:
            print(
                f"  {r['us']:8.1f} us {r['pct_floor']:5.1f} %  fc1 {r['fc1_us']:7.1f}  fc2 {r['fc2_us']:7.1f}  err {r['max_rel_err']:.1e}  {r['layout']:10s} {r['config']}"
            )
    write_csv(rows, args.out / "moe_forms.csv")
    print(f"wrote {args.out / 'moe_forms.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
