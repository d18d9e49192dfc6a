"""``qfuse demo``: quantize the built-in TinyLlama with each scheme, run it eager and
compiled, and print how far each lands from the bf16 model and how much weight memory it takes."""

from __future__ import annotations

import copy
import time

import torch

from .compile import compile as qfuse_compile
from .linear import QuantLinear
from .quantize_model import quantize_model
from .schemes import SCHEMES, get_scheme
from .tiny_llama import tiny_llama


def _linear_weight_bytes(model: torch.nn.Module) -> int:
    total = 0
    for name, m in model.named_modules():
        if name.endswith("lm_head"):
            continue
        if isinstance(m, QuantLinear):
            total += m.weight_bytes()
        elif isinstance(m, torch.nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    return total


def run_demo(schemes: list[str] | None = None, *, compile_model: bool = True, dtype: str = "bfloat16", seed: int = 0) -> int:
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    base = tiny_llama(seed=seed, dtype=dt)
    c = base.config
    ids = torch.randint(0, c.vocab_size, (2, 32), generator=torch.Generator().manual_seed(seed + 1))
    with torch.inference_mode():
        ref = base(ids).float()
    base_bytes = _linear_weight_bytes(base)
    print(
        f"TinyLlama: {c.num_layers} layers, hidden {c.hidden_size}, intermediate {c.intermediate_size}, "
        f"{dtype}; input 2 x 32 tokens; errors are on the logits vs the {dtype} model.\n"
        "Its weights are random (normal, std 0.02): the errors show the mechanics of each scheme,\n"
        "not its accuracy on a trained model.\n"
    )
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
    header = f"{'scheme':<11} {'max err':>8} {'mean err':>9} {'rel err':>8} {'compiled-eager':>15} {'fused':>6} {'weights':>10} {'vs ' + short:>8} {'time':>6}"
    no_compiler = None
    print(header)
    print("-" * len(header))
    print(f"{dtype:<11} {0:>8.4f} {0:>9.5f} {0:>8.4f} {'-':>15} {'-':>6} {base_bytes / 2**20:>8.2f}MB {1:>7.2f}x {'-':>6}")
    for name in schemes or list(SCHEMES):
        scheme = get_scheme(name)
        t0 = time.perf_counter()
        model = quantize_model(copy.deepcopy(base), scheme, progress=False)
        with torch.inference_mode():
            out = model(ids).float()
            fused = "-"
            cdiff = "skipped" if no_compiler is None else "no C++ cc"
            if compile_model and no_compiler is None:
                from torch._inductor.utils import fresh_cache

                from . import passes

                torch._dynamo.reset()
                passes.reset_counters()
                try:
                    with fresh_cache():  # a cache hit would run no pass and count no fusion
                        compiled = qfuse_compile(model, fullgraph=True)(ids).float()
                except Exception as e:  # Inductor's CPU code needs a C++ compiler: without one the rest still runs
                    if "InvalidCxxCompiler" not in f"{type(e).__name__} {e}" and "C++ compiler" not in str(e):
                        raise
                    lines = [ln.strip() for ln in str(e).splitlines() if "compiler" in ln] or [type(e).__name__]
                    no_compiler, cdiff = lines[0], "no C++ cc"
                else:
                    cdiff = f"{(compiled - out).abs().max().item():.2e}"
                    n_fused = sum(v for k, v in passes.counters.items() if k not in ("dedup_quant", "kept_float_output", "add_rms_norm"))
                    fused = str(n_fused) if not scheme.weight_only else "-"
        err = (out - ref).abs()
        rel = ((out - ref).norm() / ref.norm()).item()
        nbytes = _linear_weight_bytes(model)
        print(
            f"{scheme.name:<11} {err.max().item():>8.4f} {err.mean().item():>9.5f} {rel:>8.4f} {cdiff:>15} {fused:>6} "
            f"{nbytes / 2**20:>8.2f}MB {nbytes / base_bytes:>7.2f}x {time.perf_counter() - t0:>5.1f}s"
        )
    print(
        "\nweights: every quantized Linear's codes + scales (+ zero points); lm_head stays in "
        f"{dtype}.\ncompiled-eager: max |qfuse.compile(fullgraph=True) - eager| on the logits.\n"
        "fused: activation quantizations the fusion passes folded into the norm / SiLU-and-mul before them "
        "(3 per layer; the one before o_proj stays).\ntime: quantize, eager and compiled runs of the row (the first "
        "compiled row includes torch.compile's start-up)."
    )
    if no_compiler is not None:
        print(
            f"\nNot compiled: torch.compile's CPU code needs a C++ compiler ({no_compiler}); install one (e.g. g++) "
            "for the compiled column, or pass --no-compile."
        )
    return 0
