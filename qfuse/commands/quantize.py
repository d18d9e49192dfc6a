"""``qfuse quantize MODEL_DIR --scheme S --out DIR``: quantize a local Hugging Face model (or the
built-in real model ``smollm2``, see ``qfuse.models``) and save it as a compressed-tensors
checkpoint (what vLLM / SGLang load), with the model's tokenizer."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from ..checkpoint import save_quantized
from ..quantize_model import quantize_model
from ..schemes import SCHEMES, get_scheme
from .common import BUILTIN_MODELS, TOKENIZER_FILES, builtin_model, human_bytes, linear_weight_bytes, load_builtin


def add_parser(sub) -> None:
    p = sub.add_parser("quantize", help="quantize a local Hugging Face model directory and save it (compressed-tensors)")
    p.add_argument("model", type=Path, help="directory with config.json and float safetensors weights, or a built-in model: "
                   + ", ".join(BUILTIN_MODELS))
    p.add_argument("--scheme", required=True, help="one of " + ", ".join(SCHEMES))
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--ignore", nargs="*", default=None, help="layers to keep in floating point (default: lm_head)")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default=None, help="activation dtype (default: the model's, else bfloat16)")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (default 5GB)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import transformers

    scheme = get_scheme(args.scheme)
    builtin = builtin_model(args.model)
    tokenizer = None
    if builtin:
        model, tokenizer = load_builtin(builtin, getattr(torch, args.dtype or "bfloat16"), "quantize")
        dtype = model.dtype
    else:
        if not (args.model / "config.json").is_file():
            raise SystemExit(f"qfuse quantize: {args.model} has no config.json (a local Hugging Face model directory is needed)")
        if args.out.resolve() == args.model.resolve():
            raise SystemExit("qfuse quantize: --out must differ from the model directory")
        print(f"loading {args.model}")
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype="auto", local_files_only=True)
        dtype = getattr(torch, args.dtype) if args.dtype else (model.dtype if model.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16)
        model = model.to(dtype).eval()
    before, other = linear_weight_bytes(model)
    quantize_model(model, scheme, ignore=args.ignore)
    after, _ = linear_weight_bytes(model)
    print(f"linear weights: {human_bytes(before)} {str(dtype).removeprefix('torch.')} -> {human_bytes(after)} {scheme.name} "
          f"({before / max(after, 1):.2f}x smaller); other tensors {human_bytes(other)}")
    save_quantized(model, args.out, max_shard_size=args.max_shard_size)
    verb = "copied"
    if tokenizer is not None:  # a built-in model: its tokenizer lives in no directory, so it is written out
        copied, verb = sorted({Path(f).name for f in tokenizer.save_pretrained(args.out)} & set(TOKENIZER_FILES)), "wrote"
    else:
        copied = [name for name in TOKENIZER_FILES if (args.model / name).is_file()]
        for name in copied:
            shutil.copy2(args.model / name, args.out / name)
    size = sum(f.stat().st_size for f in args.out.glob("*.safetensors"))
    print(f"saved {args.out} ({human_bytes(size)} of safetensors; compressed-tensors format"
          + (f"; {verb} {', '.join(copied)})" if copied else ")"))
    return 0
