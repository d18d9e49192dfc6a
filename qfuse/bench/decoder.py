"""``qfuse bench decoder``: a stack of Llama-3-8B decoder layers, with and without the fusion passes.

Four layers (hidden 4096, intermediate 14336, 32 query / 8 KV heads of 128, bf16,
random weights), quantized W8A8 and W4A8 with ``qfuse.quantize_model``. Each layer
is written the way serving engines write it, ``(hidden, residual) -> (hidden,
residual)``, so every RMSNorm starts with the residual add (as in the middle of a
model). One ``torch.compile(fullgraph=True, dynamic=False)`` per (scheme, shape,
passes) of the layer function serves all four layers (they differ only in weights).

Per row, one run, medians in microseconds of the whole 4-layer step:

* ``passes_us`` / ``no_passes_us``: CUDA-graph replay of the 4 compiled layers, with
  ``qfuse.compile`` (passes on) and plain ``torch.compile`` (passes off);
* ``speedup``: no_passes_us / passes_us;
* ``floor_us``: the quantized weights of 4 layers / measured HBM bandwidth (timing.hbm_bandwidth: max of copy and read-only) (decode's floor);
* ``compile_s_*``: wall time of the first call (compile; every qfuse kernel was
  autotuned beforehand, so this is Dynamo + Inductor + Triton), each in a fresh
  Inductor cache so neither setting reuses the other's kernels;
* ``rel_diff``: ||out_passes - out_no_passes|| / ||out_no_passes|| of the stack's hidden output
  (the fused kernels may round a code differently from the unfused pair);
* ``fusions``: what the passes fused in one layer graph.

Decode: M sequences, one new token each, attending over a 1-token context (no KV
cache): the step is the GEMM / norm / activation path the passes change, attention
is negligible. Prefill: one sequence of 2048 tokens, causal SDPA. The weights of 4
layers (0.9 GB W8A8, 0.5 GB W4A8) exceed the 60 MB L2 many times over, so no copy
rotation is needed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from ._device import require_cuda
from .timing import hbm_bandwidth, plot_speedup, time_graph, write_csv

SHAPES = {"decode1": (1, 1), "decode16": (16, 1), "decode64": (64, 1), "prefill2048": (1, 2048)}  # (batch, tokens)


class Layer(nn.Module):
    """Llama decoder layer, ``(hidden, residual) -> (hidden, residual)``; qfuse's TinyLlama parts."""

    def __init__(self, config):
        from qfuse.tiny_llama import _MLP, _Attention, _LlamaRMSNorm

        super().__init__()
        self.input_layernorm = _LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = _LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = _MLP(config)

    def forward(self, hidden: Tensor, residual: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        residual = hidden + residual
        residual = self.self_attn(self.input_layernorm(residual), cos, sin) + residual
        return self.mlp(self.post_attention_layernorm(residual)), residual


def layer_step(layer: Layer, hidden: Tensor, residual: Tensor, cos: Tensor, sin: Tensor):
    return layer(hidden, residual, cos, sin)


def build_layers(n: int, scheme: str, config, device="cuda") -> list[nn.Module]:
    import qfuse

    torch.manual_seed(0)
    layers = []
    for _ in range(n):
        with torch.device(device):
            layer = Layer(config).to(torch.bfloat16).eval()
        with torch.no_grad():
            for name, p in layer.named_parameters():
                if name.endswith("layernorm.weight"):
                    p.copy_(1 + 0.1 * torch.randn_like(p))
        layers.append(qfuse.quantize_model(layer, scheme, progress=False))
    return layers


def weight_bytes(layers) -> int:
    from qfuse.linear import QuantLinear

    return sum(m.weight_bytes() for layer in layers for m in layer.modules() if isinstance(m, QuantLinear))


def _inputs(batch: int, tokens: int, config, device="cuda"):
    g = torch.Generator(device=device).manual_seed(1)
    h = config.hidden_size
    hidden = torch.randn(batch, tokens, h, device=device, generator=g).to(torch.bfloat16)
    residual = torch.randn(batch, tokens, h, device=device, generator=g).to(torch.bfloat16)
    d = h // config.num_heads
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, d, 2, device=device).float() / d)
    freqs = torch.outer(torch.arange(tokens, device=device).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return hidden, residual, emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def _pretune(layers, inputs) -> None:
    """Run every qfuse op the two graphs can call once eagerly at this shape, so the
    autotuner (ops/_autotune.py) is done before compile times are taken."""
    q = torch.ops.qfuse
    hidden, residual, cos, sin = inputs
    layer = layers[0]
    with torch.inference_mode():
        layer(hidden, residual, cos, sin)  # unfused ops: rms_norm, quant, GEMMs
        x2 = hidden.reshape(-1, hidden.shape[-1])
        w = layer.input_layernorm.weight
        q.rms_norm_quant(x2, w, 1e-5)
        q.fused_add_rms_norm_quant(x2, x2, w, 1e-5)
        inter = layer.mlp.down_proj.in_features
        g = torch.randn(x2.shape[0], inter, device=x2.device).to(torch.bfloat16)
        q.silu_and_mul_quant(g, g)
    if hidden.is_cuda:
        torch.cuda.synchronize()


def run_one(layers, inputs, passes: bool) -> tuple[float, float, dict, Tensor]:
    """(step us, compile s, fusion counts, output hidden) for one (scheme, shape, passes)."""
    from torch._inductor.utils import fresh_cache

    import qfuse.passes as qp
    from qfuse.compile import compile as qcompile

    torch._dynamo.reset()
    qp.reset_counters()
    hidden, residual, cos, sin = inputs
    with fresh_cache(), torch.inference_mode():
        step = qcompile(layer_step, passes=passes, fullgraph=True, dynamic=False)
        t0 = time.perf_counter()
        step(layers[0], hidden, residual, cos, sin)
        if hidden.is_cuda:
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        fusions = {k: v for k, v in qp.counters.items() if v}

        def stack():
            h, r = hidden, residual
            for layer in layers:
                h, r = step(layer, h, r, cos, sin)
            return h, r

        out = stack()[0].clone()  # the other layers reuse the compiled code (guards only)
        us = time_graph([stack], replays=20)
    return us, compile_s, fusions, out


def warm_up(device) -> None:
    """One throwaway compile, so the first measured compile does not pay process start-up
    (Inductor imports, compile worker pool)."""
    torch._dynamo.reset()
    x = torch.randn(64, device=device)
    torch.compile(lambda t: (t.sin() + 1) * 2)(x)


def llama3_8b_config(n_layers: int):
    from qfuse.tiny_llama import TinyLlamaConfig

    return TinyLlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_layers=n_layers, num_heads=32, num_kv_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0
    )


def bench(schemes, shapes, n_layers, log, on_row, config=None, device="cuda") -> list[dict]:
    config = config or llama3_8b_config(n_layers)
    bw = hbm_bandwidth(device)
    warm_up(device)
    log(f"HBM bandwidth {bw / 1e12:.2f} TB/s")
    rows = []
    for scheme in schemes:
        layers = build_layers(n_layers, scheme, config, device)
        wbytes = weight_bytes(layers)
        for shape in shapes:
            batch, tokens = SHAPES[shape]
            inputs = _inputs(batch, tokens, config, device)
            _pretune(layers, inputs)
            # alternate which setting compiles first, so neither always finds warmer caches
            order = (False, True) if len(rows) % 2 == 0 else (True, False)
            res = {p: run_one(layers, inputs, passes=p) for p in order}
            (off_us, off_s, _, off_out), (on_us, on_s, fusions, on_out) = res[False], res[True]
            rel_diff = ((on_out.float() - off_out.float()).norm() / off_out.float().norm()).item()
            row = dict(
                scheme=scheme,
                shape=shape,
                M=batch * tokens,
                passes_us=round(on_us, 1),
                no_passes_us=round(off_us, 1),
                speedup=round(off_us / on_us, 3),
                floor_us=round(wbytes / bw * 1e6, 1),
                compile_s_passes=round(on_s, 2),
                compile_s_no_passes=round(off_s, 2),
                compile_ratio=round(on_s / off_s, 3),
                rel_diff=f"{rel_diff:.1e}",
                fusions=" ".join(f"{k}={v}" for k, v in sorted(fusions.items())),
            )
            rows.append(row)
            on_row(rows)
            log(str(row))
        del layers
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def markdown(rows) -> str:
    head = (
        "| scheme | shape | M | passes us | no passes us | speedup | weight floor us | compile s (passes / none) "
        "| output rel. diff | fusions per layer graph |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['scheme']} | {r['shape']} | {r['M']} | {r['passes_us']} | {r['no_passes_us']} | {r['speedup']:.3f} | "
            f"{r['floor_us']} | {r['compile_s_passes']} / {r['compile_s_no_passes']} | {r['rel_diff']} | {r['fusions']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qfuse bench decoder", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_results/decoder", help="folder for the CSV and PNG")
    p.add_argument("--schemes", nargs="+", default=["W8A8", "W4A8"])
    p.add_argument("--shapes", nargs="+", default=["decode16", "prefill2048", "decode1", "decode64"], choices=list(SHAPES))
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args(argv)
    require_cuda("decoder")
    import triton

    out = Path(args.out)
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    rows = bench(args.schemes, args.shapes, args.layers, log, lambda rows: write_csv(rows, out / "decoder.csv"))
    log(markdown(rows))
    plot_speedup(
        rows,
        out / "decoder.png",
        x="M",
        series=["speedup"],
        panel="scheme",
        title=f"{args.layers} Llama-3-8B layers: passes on vs off ({torch.cuda.get_device_name()})",
        ylabel="speedup from the passes",
    )
    return 0
