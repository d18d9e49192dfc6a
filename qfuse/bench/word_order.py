"""``qfuse bench word_order``: the ``WORDS`` TMA tiles' activation permutation (ops/wna16/tma.py,
``word_order``) as ATen's copy of the permuted view against the Triton kernel, alone and inside
the prefill GEMMs, in one run. CUDA-graph medians over rotated input copies (qfuse/bench/timing.py).

Rows of ``word_order.csv``:

* ``permute``: ``[M, K]`` bf16 at each BLOCK_K, both ways; every Triton result first checked
  bit for bit against the torch order; GB/s = bytes read and written over the Triton time;
* ``gemm``: W4A16 g128 at each (M, N x K): the op with the shipped pick (``op``), then the
  256 x 128 x 64 / 8-warp TMA tile on the byte path and as ``WORDS`` (3 and 4 stages), each
  ``WORDS`` config timed with the Triton order and with ATen's; max error against the op.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ._device import require_cuda

TILE = {"kernel": "tiled_tma", "BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 8}
CONFIGS = {
    f"{path} s{st}": {**TILE, "num_stages": st, **({"WORDS": True} if path == "words" else {})} for path in ("bytes", "words") for st in (3, 4)
}


def _permute_rows(ms: list[int], ks: list[int]) -> list[dict]:
    from qfuse.ops.wna16 import tma

    from .timing import copies_for, time_graph

    rows = []
    for m in ms:
        for k in ks:
            xs = [torch.randn(m, k, device="cuda").bfloat16() for _ in range(copies_for(4 * m * k))]
            for bk in (64, 128):
                assert all(torch.equal(tma.word_order_triton(x, bk), tma.word_order(x, bk)) for x in xs[:2])
                aten = time_graph([lambda x=x: tma.word_order(x, bk) for x in xs])
                tri = time_graph([lambda x=x: tma.word_order_triton(x, bk) for x in xs])
                rows.append(
                    {"kind": "permute", "M": m, "N": "", "K": k, "config": f"BLOCK_K {bk}", "us": tri, "us_aten": aten, "GB_s": 4 * m * k / tri / 1e3}
                )
                print(f"word_order M={m} K={k} BLOCK_K={bk}: Triton {tri:.1f} us ({rows[-1]['GB_s']:.0f} GB/s), ATen {aten:.1f} us")
    return rows


def _gemm_rows(ms: list[int], shapes: list[tuple[int, int]]) -> list[dict]:
    from qfuse.ops.wna16 import tma
    from qfuse.ops.wna16.dispatch import run_config

    from ._wna16_tune import make_weights
    from .timing import copies_for, time_graph

    triton_order, rows = tma.word_order_triton, []
    for n, k in shapes:
        weights = [make_weights(n, k, 4, 128, torch.bfloat16, False)[1:3] for _ in range(copies_for(n * k // 2))]
        for m in ms:
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = torch.ops.qfuse.wna16_gemm(x, *weights[0], None, None, 4, 128).float()
            res = {"op": (time_graph([lambda w=w: torch.ops.qfuse.wna16_gemm(x, *w, None, None, 4, 128) for w in weights]), "", 0.0)}
            for name, cfg in CONFIGS.items():
                err = (run_config(cfg, x, *weights[0], None, None, 4, 128).float() - ref).abs().max().item()
                t = time_graph([lambda w=w, cfg=cfg: run_config(cfg, x, *w, None, None, 4, 128) for w in weights])
                aten = ""
                if cfg.get("WORDS"):
                    tma.word_order_triton = tma.word_order  # the launcher's call of the permutation, as ATen's copy
                    try:
                        aten = time_graph([lambda w=w, cfg=cfg: run_config(cfg, x, *w, None, None, 4, 128) for w in weights])
                    finally:
                        tma.word_order_triton = triton_order
                res[name] = (t, aten, err)
            for name, (t, aten, err) in res.items():
                rows.append({"kind": "gemm", "M": m, "N": n, "K": k, "config": name, "us": t, "us_aten": aten, "max_err": err})
            print(
                f"M={m} N={n} K={k}: " + ", ".join(f"{a} {t:.1f}" + (f" (ATen order {aten:.1f})" if aten else "") for a, (t, aten, _) in res.items())
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qfuse bench word_order", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench_results/word_order"))
    p.add_argument("--permute-m", type=int, nargs="+", default=[64, 2048])
    p.add_argument("--permute-k", type=int, nargs="+", default=[4096, 14336])
    p.add_argument("--m", type=int, nargs="+", default=[1024, 2048], help="GEMM token counts")
    p.add_argument("--shapes", nargs="+", default=["28672x4096", "4096x14336", "6144x4096", "4096x4096"], help="N x K weight shapes")
    args = p.parse_args(argv)
    require_cuda("word_order")
    import qfuse  # noqa: F401  (registers the ops)

    from .timing import write_csv

    print(torch.cuda.get_device_name(), torch.__version__)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    rows = _permute_rows(args.permute_m, args.permute_k) + _gemm_rows(args.m, shapes)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "word_order.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
