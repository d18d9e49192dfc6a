"""``qfuse eval MODEL_DIR --ppl [--text FILE]``: perplexity of a quantized checkpoint (any
format qfuse loads) or of a float Hugging Face model directory, with its own tokenizer; or of
the built-in real model ``smollm2`` (float32 unless ``--dtype``; see ``qfuse.models``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..eval.perplexity import default_text, perplexity, windows_of
from .common import BUILTIN_MODELS, builtin_model, load_any, load_builtin


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a model directory (quantized or float): perplexity")
    p.add_argument("model", type=Path, help="model directory (with its tokenizer files), or a built-in model: " + ", ".join(BUILTIN_MODELS))
    p.add_argument("--ppl", action="store_true", required=True, help="perplexity (the only evaluation so far)")
    p.add_argument("--text", type=Path, default=None, help="UTF-8 text file (default: CPython's pydoc_data.topics)")
    p.add_argument("--window", type=int, default=512, help="tokens per window (default 512)")
    p.add_argument("--max-windows", type=int, default=None, help="evaluate only the first N windows")
    p.add_argument("--batch", type=int, default=1, help="windows per forward pass")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default=None,
                   help="activation dtype (default: the checkpoint's; float32 for a built-in model)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import transformers

    dtype = getattr(torch, args.dtype) if args.dtype else None
    builtin = builtin_model(args.model)
    if builtin:
        model, tok = load_builtin(builtin, dtype or torch.float32, "eval")
        model = model.to(args.device)
    else:
        try:
            tok = transformers.AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        except (OSError, ValueError) as e:
            raise SystemExit(f"qfuse eval: no usable tokenizer in {args.model} ({e})") from None
    text = args.text.read_text(encoding="utf-8") if args.text else default_text()
    source = str(args.text) if args.text else "pydoc_data.topics"
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    try:
        windows = windows_of(ids, args.window, args.max_windows)
    except ValueError as e:
        raise SystemExit(f"qfuse eval: {e}") from None
    if not builtin:
        model = load_any(args.model, dtype, args.device)
    t0 = time.perf_counter()
    result = perplexity(model, windows, args.batch)
    secs = time.perf_counter() - t0
    print(f"{args.model}: perplexity {result.ppl:.4f} on {source} "
          f"({result.windows} windows of {args.window}, {result.tokens} scored tokens, {secs:.1f} s)")
    return 0
