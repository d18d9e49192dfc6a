"""``qfuse bench gemv_words``: the int32-word GEMV (ops/wna16/gemv_words.py; W4A16 and W8A16) at
decode M, every dispatcher config of it, against bf16 ``torch.matmul``, tinygemm (4-bit only) and
a baseline ``wna16_gemm`` config table, in one run. CUDA-graph medians over rotated weight copies
(qfuse/bench/timing.py).

Every word-GEMV config is first checked against the reference kernel (symmetric and with zero
points) on the real shape. The baseline column runs whatever config the given JSON ships for
that key (default: the shipped ops/tuned/wna16_gemm.NVIDIA_H200.json). The configs timed are the
dispatcher's ``gemv_words`` candidates for M = 1 with bf16 activations (ops/wna16/dispatch.py;
4-bit: the HFMA2 forms too; the opt-in register caps with ``--experimental``), at every M given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ._device import require_cuda

SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192)]
GROUP = 128


def _weights(n: int, k: int, bits: int, copies: int, group: int = GROUP) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ws = []
    for _ in range(copies):
        codes = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device="cuda")
        qw = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous() if bits == 4 else codes
        s = (torch.rand(n, 1 if group == -1 else k // group, device="cuda") * 0.02 + 0.005).bfloat16()
        ws.append((qw, s))
    return ws


def _tinygemm(ws, n: int, k: int):
    """tinygemm operands for the same codes: its packer wants the even k in the high nibble."""
    out = []
    for qw, s in ws:
        codes = torch.stack((qw & 15, qw >> 4), -1).reshape(n, k)
        w4 = torch._convert_weight_to_int4pack(((codes[:, 0::2] << 4) | codes[:, 1::2]).contiguous(), 8)
        out.append((w4, torch.stack((s.t().contiguous(), torch.zeros_like(s.t())), -1).contiguous()))  # w = (q - 8) * s
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qfuse bench gemv_words", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("bench_results"))
    p.add_argument("--m", default="1,2,4", help="comma-separated M values")
    p.add_argument("--bits", type=int, nargs="+", choices=(4, 8), default=[4, 8], help="weight widths (default: both)")
    p.add_argument("--shapes", nargs="+", default=[f"{n}x{k}" for n, k in SHAPES], help="N x K weight shapes")
    p.add_argument("--group", type=int, default=GROUP, help="group size (-1: per-channel; tinygemm only at 128)")
    p.add_argument("--experimental", action="store_true", help="also time the opt-in configs (register caps)")
    p.add_argument("--baseline-json", type=Path, default=Path(__file__).resolve().parents[2] / "ops/tuned/wna16_gemm.NVIDIA_H200.json")
    args = p.parse_args(argv)
    require_cuda("gemv_words")
    from qfuse.ops.wna16.dispatch import candidate_configs, config_key, is_experimental, run_config
    from qfuse.ops.wna16.gemv_words import wna16_gemv_words
    from qfuse.ops.wna16_gemm import wna16_gemm_ref

    from .timing import copies_for, hbm_bandwidth, time_graph, write_csv

    group = args.group
    baseline = json.loads(args.baseline_json.read_text())
    torch.manual_seed(0)
    bw = hbm_bandwidth()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; HBM bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for n, k in (tuple(int(v) for v in sh.lower().split("x")) for sh in args.shapes):
        wb = [torch.randn(n, k, device="cuda").bfloat16() for _ in range(copies_for(n * k * 2))]
        for bits in args.bits:
            cfgs = [
                c
                for c in candidate_configs(1, n, k, bits, group, dtype=torch.bfloat16)
                if c["kernel"] == "gemv_words" and (args.experimental or not is_experimental(c, bits))
            ]
            nbytes = n * k * bits // 8 + n * (1 if group == -1 else k // group) * 2
            ws = _weights(n, k, bits, copies_for(nbytes), group)
            tg = _tinygemm(ws, n, k) if bits == 4 and group == GROUP else None
            for m in (int(v) for v in args.m.split(",")):
                x = torch.randn(m, k, device="cuda").bfloat16()
                qw, s = ws[0]
                for z in (None, torch.randint(0, 2**bits, tuple(s.shape), dtype=torch.uint8, device="cuda")):
                    ref = wna16_gemm_ref(x, qw, s, z, None, bits, group).float()
                    tol = 2 * torch.finfo(torch.bfloat16).eps * ref.abs().max().item()
                    for c in cfgs:
                        err = (wna16_gemv_words(x, qw, s, z, None, bits, group, c).float() - ref).abs().max().item()
                        assert err <= tol, f"{bits}-bit {n}x{k} M={m} {c}: error {err:.3g} > {tol:.3g}"
                r = {"bits": bits, "N": n, "K": k, "M": m, "bf16": time_graph([lambda w=w: torch.matmul(x, w.t()) for w in wb])}
                key = "|".join(["wna16_gemm", "NVIDIA_H200", *map(str, config_key(m, n, k, bits, group, torch.bfloat16))])
                base = baseline.get(key)
                if base:
                    r["baseline"] = time_graph([lambda w=w: run_config(base, x, w[0], w[1], None, None, bits, group) for w in ws])
                    r["baseline_cfg"] = base["kernel"]
                if tg is not None:
                    r["tinygemm"] = time_graph([lambda t=t: torch._weight_int4pack_mm(x, t[0], GROUP, t[1]) for t in tg])
                for c in cfgs:
                    label = (
                        f"words_bn{c['BLOCK_N']}_bw{c['BLOCK_W']}_sk{c['SPLIT_K']}_w{c['num_warps']}"
                        + (f"_h{c['HFMA2']}" if "HFMA2" in c else "")
                        + (f"_r{c['MAXNREG']}" if "MAXNREG" in c else "")
                    )
                    r[label] = time_graph([lambda w=w, c=c: wna16_gemv_words(x, w[0], w[1], None, None, bits, group, c) for w in ws])
                words = {kk: v for kk, v in r.items() if kk.startswith("words")}
                best = min(words, key=words.get)
                r.update(words_best=words[best], words_best_cfg=best, floor=nbytes / bw * 1e6)
                # the best of each accumulation form
                for form, hfma2 in (("f32", False), ("hfma2", True)):
                    times = [v for kk, v in words.items() if ("_h" in kk) == hfma2]
                    if times:
                        r[f"best_{form}"] = min(times)
                rows.append(r)
                tiny = f"{r['tinygemm']:.1f}" if "tinygemm" in r else "-"
                print(
                    f"{n}x{k} W{bits} M={m}: bf16 {r['bf16']:.1f}  baseline({r.get('baseline_cfg')}) {r.get('baseline', 0):.1f}  "
                    f"tinygemm {tiny}  words {r['words_best']:.1f} [{best}]  floor {r['floor']:.1f}  "
                    f"x_bf16 {r['bf16'] / r['words_best']:.2f}  "
                    + "  ".join(f"{f} {r[f'best_{f}']:.1f}" for f in ("f32", "hfma2") if f"best_{f}" in r),
                    flush=True,
                )
            del ws, tg
    write_csv(rows, args.out / ("gemv_words.csv" if group == GROUP else f"gemv_words_g{group}.csv"))
    return 0
