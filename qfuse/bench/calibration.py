"""``qfuse bench calibration``: wall time of layer-by-layer calibration per decoder layer of a
large model shape, on random weights (no download), to state the time for the whole model.

Builds a Hugging Face ``LlamaForCausalLM`` of the chosen shape with ``--layers`` decoder layers
(default 2) in bf16 on the device, and times ``quantize_model(..., calibration=R)`` for each
recipe on ``--samples`` windows of ``--window`` random token ids. The per-layer time is
``(total - capture) / layers`` and the whole-model estimate ``per_layer * full_layers``
(capture, the embedding pass, is measured separately and is negligible). Writes a CSV.
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from pathlib import Path

import torch

from ._device import require_cuda

SHAPES = {  # hidden, intermediate, heads, kv heads, layers of the full model, vocab
    "llama3-8b": (4096, 14336, 32, 8, 32, 128256),
    "smollm2-135m": (576, 1536, 9, 3, 30, 49152),
}


def _model(shape: str, layers: int, device: str):
    import transformers as tf

    hidden, inter, heads, kv, _, vocab = SHAPES[shape]
    cfg = tf.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_hidden_layers=layers,
        vocab_size=vocab,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    with torch.device(device):
        return tf.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    import qfuse

    p = argparse.ArgumentParser(prog="qfuse bench calibration", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--recipes", nargs="*", default=["gptq", "awq", "awq+gptq", "sq+gptq"])
    p.add_argument("--scheme", default="W4A16")
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--batch", type=int, default=8, help="windows per calibration forward")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu: the CPU times one layer slowly, not a GPU stand-in")
    p.add_argument("--out", type=Path, default=Path("calibration_time.csv"))
    args = p.parse_args(argv)
    if args.device.startswith("cuda"):
        require_cuda("calibration")
    base = _model(args.shape, args.layers, args.device)
    vocab = SHAPES[args.shape][5]
    ids = torch.randint(0, vocab, (args.samples, args.window), generator=torch.Generator().manual_seed(0)).to(args.device)
    data = list(ids.split(args.batch))
    full = SHAPES[args.shape][4]
    with torch.no_grad():  # the capture pass alone: the embedding and one layer's inputs
        _sync(args.device)
        t0 = time.perf_counter()
        for b in data:
            base.model.embed_tokens(b)
        _sync(args.device)
        capture = time.perf_counter() - t0
    rows = []
    for recipe in args.recipes:
        scheme = "W4A8_G128" if "sq" in recipe and qfuse.get_scheme(args.scheme).weight_only else args.scheme
        model = copy.deepcopy(base)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _sync(args.device)
            t0 = time.perf_counter()
            qfuse.quantize_model(model, scheme, calibration=recipe, calibration_data=data, progress=False)
            _sync(args.device)
            total = time.perf_counter() - t0
        per_layer = (total - capture) / args.layers
        rows.append(
            (
                args.shape,
                scheme,
                recipe,
                args.samples,
                args.window,
                args.layers,
                round(total, 2),
                round(per_layer, 2),
                full,
                round(per_layer * full / 60, 1),
            )
        )
        print(
            f"{args.shape} {scheme} {recipe}: {total:.1f} s for {args.layers} layers, {per_layer:.1f} s/layer -> "
            f"{per_layer * full / 60:.1f} min for {full} layers ({args.samples} x {args.window} tokens)",
            flush=True,
        )
        del model
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        f.write("shape,scheme,recipe,samples,window,layers,total_s,per_layer_s,full_layers,full_model_min\n")
        for r in rows:
            f.write(",".join(map(str, r)) + "\n")
    print(f"wrote {args.out}")
    return 0
