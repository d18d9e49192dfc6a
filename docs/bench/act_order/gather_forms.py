"""Ways to gather an act-order layer's activations, x[:, perm] for x [M, K] bf16, timed as
CUDA-graph replays on the GPU (BENCHMARKS.md, "Act-order activation gather")."""

import torch

from qfuse.bench.timing import time_graph


def main():
    rows = []
    for k in (4096, 14336):
        perm = torch.randperm(k, device="cuda")
        gather_fn = torch.compile(lambda x, p: x[:, p], dynamic=False)
        for m in (1, 16, 256):
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(32)]
            idx2d = perm.expand(m, k).contiguous()
            out = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
            forms = {
                "index_select": lambda x: x.index_select(1, perm),
                "index_select_out": lambda x: torch.index_select(x, 1, perm, out=out),
                "advanced_index": lambda x: x[:, perm],
                "gather": lambda x: torch.gather(x, 1, idx2d),
                "inductor": lambda x: gather_fn(x, perm),
            }
            for x in xs[:1]:
                for f in forms.values():
                    f(x)  # compile / warm up outside the capture
            for name, f in forms.items():
                us = time_graph([lambda x=x, f=f: f(x) for x in xs])
                rows.append((k, m, name, us))
                print(f"K={k} M={m} {name}: {us:.2f} us", flush=True)


if __name__ == "__main__":
    main()
