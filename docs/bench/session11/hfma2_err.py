"""Usage: PYTHONPATH=. python3 docs/bench/session11/hfma2_err.py OUT.csv (a CUDA machine).

Accuracy of the word GEMV's float32 form against its HFMA2 forms, W4A16 M = 1 bf16, real shapes:
errors against the exact (float64) product of x and w_hat, and the reference kernel's own."""
import csv, sys, torch
from qfuse.ops.wna16_gemm import wna16_gemm_ref, dequantize_wna16
from qfuse.ops.wna16_gemv_words import wna16_gemv_words
out = sys.argv[1]
torch.manual_seed(0)
rows = []
for n, k in [(4096, 4096), (28672, 4096), (4096, 14336), (8192, 8192)]:
    for g in (128, -1):
        for asym in (False, True):
            groups = 1 if g == -1 else k // g
            codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, device="cuda")
            qw = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
            s = (torch.rand(n, groups, device="cuda") * 0.02 + 0.005).bfloat16()
            z = torch.randint(0, 16, (n, groups), dtype=torch.uint8, device="cuda") if asym else None
            for xs in ("randn", "outliers"):
                x = torch.randn(1, k, device="cuda")
                if xs == "outliers":
                    x[0, torch.randint(0, k, (k // 100,))] *= 50
                x = x.bfloat16()
                zz = (z.float() if asym else torch.full((n, groups), 8.0, device="cuda")).double()
                wd = ((codes.double() - zz.repeat_interleave(k // groups, 1)) * s.double().repeat_interleave(k // groups, 1))
                exact = x.double() @ wd.t()
                ref = wna16_gemm_ref(x, qw, s, z, None, 4, g).double()
                rms = exact.pow(2).mean().sqrt().item()
                r = {"N": n, "K": k, "group": g, "asym": asym, "x": xs, "rms_out": rms}
                for name, val in [("ref", ref)] + [(f"h{h}", wna16_gemv_words(x, qw, s, z, None, 4, g, {"BLOCK_N": 64, "BLOCK_W": 32, "SPLIT_K": 1, "num_warps": 4, **({"HFMA2": h} if h else {})}).double()) for h in (0, 1, 2)]:
                    e = (val - exact).abs()
                    r[f"{name}_max_rel"] = e.max().item() / exact.abs().max().item()
                    r[f"{name}_rms_rel"] = e.pow(2).mean().sqrt().item() / rms
                rows.append(r)
                print(" ".join(f"{kk}={v:.3g}" if isinstance(v, float) else f"{kk}={v}" for kk, v in r.items()), flush=True)
with open(out, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
