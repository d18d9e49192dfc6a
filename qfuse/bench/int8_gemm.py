"""``qfuse bench int8_gemm``: W8A8 and W4A8 GEMMs against their peers, side by side.

Per (N x K shape, M), medians in microseconds, all in one run:

* ``bf16_us``: ``torch.matmul(x, w.t())``, bf16 cuBLAS (nn.Linear layout);
* ``int_mm_us``: ``torch._int_mm(xq, wq.t())`` in its fast layout (weight stored [N, K],
  M padded to >= 17) followed by the plain-torch scale epilogue (the op's reference);
* ``w8a8_us``, ``w4a8_pc_us``, ``w4a8_g128_us``: ``qfuse::w8a8_gemm`` (per-token x
  per-channel) and ``qfuse::w4a8_gemm`` per-channel and group 128, bf16 out;
* ``gemlite_a8w8_us``, ``gemlite_a8w4_us``: gemlite's ``A8W8_int8_dynamic`` and
  ``A8W4_HQQ_INT_dynamic`` (per-channel; fp8 activations), if gemlite imports. Their
  figures include gemlite's own dynamic activation quantization; ours start from int8;
* ``floor_w8a8_us``, ``floor_w4a8_us`` (group 128), ``floor_w4a8_pc_us`` (per-channel: no group
  scales): bytes moved (``_floors.int8_gemm_bytes``) / measured HBM bandwidth (timing.hbm_bandwidth:
  max of copy and read-only);
* ``w4a8_pc_<family>_us``, ``w4a8_g128_<family>_us``: the best config of each W4A8 kernel
  family (:func:`config_family`: tensor-core tiles with int8-op or PTX unpack, the
  int32-partial group scale, the dp4a GEMV, ``mma_words``, the int8-weight pass + W8A8), all in this run;
* ``*_eager_us``: one eager call, Python launch overhead included.

Kernel times are CUDA-graph replays over enough weight copies to stream > 3x L2 per
replay (qfuse/bench/timing.py), so weights come from HBM as in a model.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from ._device import require_cuda
from ._floors import int8_gemm_bytes
from .timing import copies_for, hbm_bandwidth, plot_speedup, time_eager, time_graph, write_csv

SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192)]
MS = [1, 2, 4, 8, 16, 64, 256, 1024, 2048, 4096]
OURS = ("w8a8", "w4a8_pc", "w4a8_g128")
FAMILIES = ("tc", "asm", "gsp", "gemv", "mma_words", "w8", "w8_tma", "tma", "gemv8")


def _gemlite_layers(n, k, dev):
    """gemlite's A8W8 and A8W4 layers for one shape, or (None, None, reason)."""
    try:
        import gemlite
        from gemlite.helper import A8W4_HQQ_INT_dynamic, A8W8_int8_dynamic
    except Exception as e:  # noqa: BLE001 - gemlite is an optional peer
        return None, None, f"gemlite unavailable: {e!r}"
    cfg = Path(gemlite.__file__).with_name("configs") / "h100.json"  # no H200 file ships; H100 is the same SM
    if cfg.is_file() and not getattr(_gemlite_layers, "loaded", False):
        gemlite.load_config(str(cfg))
        _gemlite_layers.loaded = True
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
    a8w8 = A8W8_int8_dynamic(device=dev, dtype=torch.bfloat16).from_weights(w)
    wq = torch.randint(0, 16, (n, k), dtype=torch.uint8, device=dev)
    scales = torch.rand(n, 1, device=dev, dtype=torch.bfloat16) / 64
    zeros = torch.full((n, 1), 8.0, device=dev, dtype=torch.bfloat16)
    a8w4 = A8W4_HQQ_INT_dynamic(device=dev, dtype=torch.bfloat16).from_weights(wq, scales, zeros)
    return a8w8, a8w4, ""


def warm_up_gpu(seconds: float = 0.5) -> None:
    """Busy the GPU so its clocks are up before a timing (the first shape read ~10% slow without)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_end = time.time() + seconds
    while time.time() < t_end:
        a @ a
        torch.cuda.synchronize()


def bench_shape(n, k, ms, bw, gemlite_ms, gemlite_budget, log, tuned, eager=True, our_ops=OURS, families=None):
    dev = torch.device("cuda")
    dt = torch.bfloat16
    ops = torch.ops.qfuse
    from qfuse.ops._autotune import device_name, m_bucket
    from qfuse.ops._zeroed_workspace import rezero_workspaces
    from qfuse.ops.int4_packing import pack_int4
    from qfuse.ops.int8.dispatch import candidate_configs, is_experimental, run_int8_gemm
    from qfuse.ops.w4a8_gemm import w4a8_gemm_ref
    from qfuse.ops.w8a8_gemm import scale_epilogue, w8a8_gemm_ref

    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    warm_up_gpu()

    n_bf16 = copies_for(2 * n * k)
    n_i8 = copies_for(n * k)
    n_i4 = copies_for(n * k // 2)
    w_bf16 = [torch.randn(n, k, device=dev, dtype=dt) / k**0.5 for _ in range(n_bf16)]
    wq = [torch.randint(-128, 128, (n, k), dtype=torch.int8, device=dev) for _ in range(n_i8)]
    qw = [pack_int4(torch.randint(0, 16, (n, k), dtype=torch.uint8, device=dev)) for _ in range(n_i4)]
    gs = [torch.randint(1, 17, (n, k // 128), dtype=torch.int8, device=dev) for _ in range(n_i4)]
    ws = torch.rand(n, device=dev) / 512 + 1e-4
    gl8, gl4, why = (None, None, "not asked")
    if gemlite_ms:
        try:
            gl8, gl4, why = _gemlite_layers(n, k, dev)
        except Exception as e:  # noqa: BLE001
            why = f"gemlite setup failed: {e!r}"
        if why:
            log(f"  {why}")
    rows = []
    for m in ms:
        x = torch.randn(m, k, device=dev, dtype=dt)
        xq = torch.randint(-128, 128, (m, k), dtype=torch.int8, device=dev)
        xs = torch.rand(m, 1, device=dev) / 64 + 1e-4
        xq_pad = torch.cat([xq, xq.new_zeros(max(0, 17 - m), k)]) if m < 17 else xq

        def int_mm(w):
            return scale_epilogue(torch._int_mm(xq_pad, w.t())[:m], xs, ws, None, dt)

        calls = {
            "bf16": [lambda w=w: torch.matmul(x, w.t()) for w in w_bf16],
            "int_mm": [lambda w=w: int_mm(w) for w in wq],
        }
        if m in gemlite_ms and gemlite_budget["left"] > 0:
            if gl8 is not None:
                calls["gemlite_a8w8"] = [lambda: gl8(x)]
            if gl4 is not None:
                calls["gemlite_a8w4"] = [lambda: gl4(x)]
        row = {"shape": f"{n}x{k}", "N": n, "K": k, "M": m}
        for name, cs in calls.items():
            t0 = time.time()
            try:
                cs[0]()  # compile / autotune outside the graph
                torch.cuda.synchronize()
                row[f"{name}_us"] = round(time_graph(cs), 2)
            except Exception as e:  # noqa: BLE001 - a failing peer is reported, not fatal
                log(f"  {name} M={m}: {type(e).__name__}: {str(e)[:200]}")
            if name.startswith("gemlite"):  # its first call per M autotunes: cap the total
                gemlite_budget["left"] -= time.time() - t0
        # qfuse kernels: every candidate config, timed the same way; the fastest that may ship
        # (not opt-in: is_experimental) is the reported figure and the config shipped in
        # ops/tuned/ for this (M bucket, N, K); an opt-in family shows in its own column
        ours = {
            "w8a8": (
                "w8a8_gemm",
                (n, k),
                -1,
                lambda: w8a8_gemm_ref(xq, xs, wq[0], ws, None, dt),
                lambda c: [lambda w=w: run_int8_gemm(xq, xs, w, ws, None, None, dt, w4=False, config=c) for w in wq],
            ),
            "w4a8_pc": (
                "w4a8_gemm",
                (n, k, -1),
                -1,
                lambda: w4a8_gemm_ref(xq, xs, qw[0], ws, None, None, -1, dt),
                lambda c: [lambda w=w: run_int8_gemm(xq, xs, w, ws, None, None, dt, w4=True, config=c) for w in qw],
            ),
            "w4a8_g128": (
                "w4a8_gemm",
                (n, k, 128),
                128,
                lambda: w4a8_gemm_ref(xq, xs, qw[0], ws, gs[0], None, 128, dt),
                lambda c: [lambda w=w, g=g: run_int8_gemm(xq, xs, w, ws, g, None, dt, w4=True, config=c) for w, g in zip(qw, gs)],
            ),
        }
        expected = None
        for name, (op, key, group, reference, make) in ours.items():
            if name not in our_ops:
                continue
            best = None
            family_best: dict = {}
            expected = reference()
            for cfg in candidate_configs(m, n, k, group, sms, w4=name != "w8a8", gpu=True):
                if families and (name != "w8a8" or cfg["kernel"] not in ("tile", "tma")) and config_family(cfg) not in families:
                    continue
                try:
                    cs = make(cfg)
                    if not torch.equal(cs[0](), expected):  # a config is only a candidate if it is right
                        log(f"  {name} M={m} {cfg}: MISMATCH against the reference, skipped")
                        rezero_workspaces()  # its split-K sums and counters may be left nonzero
                        continue
                    torch.cuda.synchronize()
                    us = time_graph(cs, replays=10)
                except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                    log(f"  {name} M={m} {cfg}: {type(e).__name__}: {str(e)[:160]}")
                    rezero_workspaces()
                    continue
                if (best is None or us < best[0]) and not is_experimental(cfg):  # opt-in: timed, never the pick
                    best = (us, cfg)
                fam = config_family(cfg)
                family_best[fam] = min(family_best.get(fam, us), us)
            if best is not None:
                row[f"{name}_us"] = round(best[0], 2)
                row[f"{name}_cfg"] = config_label(best[1])
                for fam, us in family_best.items():  # each kernel family's best, side by side
                    row[f"{name}_{fam}_us"] = round(us, 2)
                tuned["|".join(str(v) for v in (op, device_name(dev), m_bucket(m), *key))] = best[1]
        if eager and m in (1, 16):  # launch overhead: the op's full Python path, one call
            if "w8a8" in our_ops:
                row["w8a8_eager_us"] = round(time_eager(lambda: ops.w8a8_gemm(xq, xs, wq[0], ws, None, dt)), 1)
            if "w4a8_pc" in our_ops:
                row["w4a8_pc_eager_us"] = round(time_eager(lambda: ops.w4a8_gemm(xq, xs, qw[0], ws, None, None, -1, dt)), 1)
        row["floor_w8a8_us"] = round(int8_gemm_bytes(m, n, k, 8) / bw * 1e6, 2)
        row["floor_w4a8_us"] = round(int8_gemm_bytes(m, n, k, 4, 128) / bw * 1e6, 2)  # group 128's
        row["floor_w4a8_pc_us"] = round(int8_gemm_bytes(m, n, k, 4) / bw * 1e6, 2)  # per-channel: no group scales
        b = row.get("bf16_us")
        for name in ("int_mm", "w8a8", "w4a8_pc", "w4a8_g128", "gemlite_a8w8", "gemlite_a8w4"):
            if b and row.get(f"{name}_us"):
                row[f"{name}_x_bf16"] = round(b / row[f"{name}_us"], 3)
        if row.get("int_mm_us") and row.get("w8a8_us"):
            row["w8a8_x_int_mm"] = round(row["int_mm_us"] / row["w8a8_us"], 3)
        if row.get("w4a8_pc_us") and row.get("w4a8_g128_us"):
            row["g128_over_pc"] = round(row["w4a8_pc_us"] / row["w4a8_g128_us"], 3)
        log("  " + "  ".join(f"{k_}={v}" for k_, v in row.items() if k_ not in ("N", "K", "shape")))
        rows.append(row)
        del calls, ours, expected
    return rows


def config_family(cfg: dict) -> str:
    """Which kernel a candidate runs: ``tc`` (tensor-core tile kernel, int8-op unpack), ``asm``
    (inline-PTX unpack), ``gsp`` (asm + int32-partial group scale), ``gemv`` (dp4a GEMV),
    ``mma_words`` (ops/int8/mma_words.py: packed bytes into the A registers, K permuted),
    ``tma`` (ops/int8/tma.py: unpack into the B operand), ``w8`` / ``w8_tma`` (int4 -> int8
    weight pass + the W8A8 tile / TMA kernel); W8A8: ``tc``, ``tma`` or ``gemv8`` (dp4a GEMV)."""
    kind = cfg.get("kernel", "tile")
    if kind != "tile":
        return kind + ("_tma" if kind == "w8" and cfg.get("TMA") else "")
    if cfg.get("GS_PARTIAL"):
        return "gsp"
    return "asm" if cfg.get("UNPACK_ASM") else "tc"


def config_label(cfg: dict) -> str:
    if cfg.get("kernel") in ("gemv", "gemv8"):
        return "{kernel}/m{BLOCK_M}/{BLOCK_N}x{BLOCK_W}x4w/s{SPLIT_K}/w{num_warps}".format(**cfg) + ("/pf" if cfg.get("PREFETCH") else "")
    split = f"streamk{cfg['STREAM']}" if cfg.get("STREAM") else f"s{cfg.get('SPLIT_K', 1)}"
    label = f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg.get('BLOCK_K', 128)}/{split}/w{cfg['num_warps']}/st{cfg['num_stages']}"
    if cfg.get("PERSISTENT"):
        label += f"/p{cfg['PERSISTENT']}"
    fam = config_family(cfg)
    return label + ("" if fam == "tc" else "/" + fam) + ("/fold" if cfg.get("GS_FOLD") else "")


def markdown_table(rows) -> str:
    cols = [
        ("shape", "N x K"),
        ("M", "M"),
        ("bf16_us", "bf16 us"),
        ("int_mm_us", "_int_mm+epi us"),
        ("w8a8_us", "w8a8 us"),
        ("w8a8_x_bf16", "w8a8 x bf16"),
        ("w8a8_x_int_mm", "w8a8 x _int_mm"),
        ("w4a8_pc_us", "w4a8 pc us"),
        ("w4a8_pc_x_bf16", "w4a8 pc x bf16"),
        ("w4a8_g128_us", "w4a8 g128 us"),
        ("w4a8_g128_x_bf16", "w4a8 g128 x bf16"),
        ("g128_over_pc", "g128/pc"),
        ("w8a8_gemv8_us", "w8a8 gemv us"),
        ("w8a8_cfg", "w8a8 cfg"),
        ("w4a8_pc_asm_us", "pc asm us"),
        ("w4a8_g128_asm_us", "g128 asm us"),
        ("w4a8_pc_gemv_us", "pc gemv us"),
        ("w4a8_g128_gemv_us", "g128 gemv us"),
        ("w4a8_g128_gsp_us", "g128 gsp us"),
        ("w4a8_pc_mma_words_us", "pc mma_words us"),
        ("w4a8_g128_mma_words_us", "g128 mma_words us"),
        ("w8a8_tma_us", "w8a8 tma us"),
        ("w4a8_pc_w8_us", "pc w8 us"),
        ("w4a8_pc_w8_tma_us", "pc w8 tma us"),
        ("w4a8_pc_tma_us", "pc tma us"),
        ("w4a8_g128_tma_us", "g128 tma us"),
        ("w4a8_g128_w8_us", "g128 w8 us"),
        ("w4a8_pc_cfg", "pc cfg"),
        ("w4a8_g128_cfg", "g128 cfg"),
        ("gemlite_a8w8_us", "gemlite a8w8 us"),
        ("gemlite_a8w4_us", "gemlite a8w4 us"),
        ("floor_w8a8_us", "floor w8a8 us"),
        ("floor_w4a8_pc_us", "floor w4a8 pc us"),
        ("floor_w4a8_us", "floor w4a8 g128 us"),
        ("w8a8_eager_us", "w8a8 eager us"),
    ]
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c, _ in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="qfuse bench int8_gemm", description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, nargs="+", default=MS, help="token counts")
    p.add_argument("--shapes", nargs="+", default=[f"{n}x{k}" for n, k in SHAPES], help="N x K shapes")
    p.add_argument("--out", type=Path, default=Path("bench_results/int8_gemm"), help="folder for CSV, PNG, table")
    p.add_argument("--gemlite-m", type=int, nargs="*", default=[1, 16, 4096], help="M values to time gemlite at (empty: none)")
    p.add_argument("--gemlite-budget-s", type=float, default=40.0, help="stop adding gemlite points after this long")
    p.add_argument("--ops", nargs="+", choices=OURS, default=list(OURS), help="which qfuse kernels to time")
    p.add_argument("--no-eager", action="store_true", help="skip the eager per-call column")
    p.add_argument(
        "--families",
        nargs="+",
        choices=FAMILIES,
        default=None,
        help="kernel families to time (default: all; see config_family); W8A8's tile kernel is always timed",
    )
    args = p.parse_args(argv)
    require_cuda("int8_gemm")
    import triton

    log = lambda s: print(s, flush=True)  # noqa: E731
    os.environ["QFUSE_AUTOTUNE"] = "0"  # configs are chosen here, by graph timing, not by pick_config
    warm_up_gpu()
    bw = hbm_bandwidth()
    gpu = torch.cuda.get_device_name()
    log(f"{gpu}  torch {torch.__version__}  triton {triton.__version__}  HBM bandwidth {bw / 1e12:.2f} TB/s")
    budget = {"left": args.gemlite_budget_s}
    tuned: dict = {}
    rows = []
    for shape in args.shapes:
        n, k = (int(v) for v in shape.lower().split("x"))
        log(f"{n}x{k}")
        rows += bench_shape(
            n,
            k,
            args.m,
            bw,
            set(args.gemlite_m),
            budget,
            log,
            tuned,
            eager=not args.no_eager,
            our_ops=set(args.ops),
            families=set(args.families) if args.families else None,
        )
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "autotune.json").write_text(json.dumps(tuned, indent=1, sort_keys=True))
    write_csv(rows, args.out / "int8_gemm.csv")
    series = ["w8a8_x_bf16", "w4a8_pc_x_bf16", "w4a8_g128_x_bf16", "int_mm_x_bf16", "gemlite_a8w8_x_bf16", "gemlite_a8w4_x_bf16"]
    plot_speedup(rows, args.out / "int8_gemm.png", x="M", series=series, panel="shape", title=f"int8-activation GEMMs vs bf16 torch.matmul ({gpu})")
    table = markdown_table(rows)
    head = f"GPU: {gpu}; torch {torch.__version__}; triton {triton.__version__}; HBM bandwidth {bw / 1e12:.2f} TB/s\n\n"
    (args.out / "int8_gemm.md").write_text(head + table + "\n")
    log(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
