"""``qfuse quantize MODEL_DIR --scheme S --out DIR``: quantize a local Hugging Face model (or the
built-in real model ``smollm2``, see ``qfuse.models``) and save it as a compressed-tensors
checkpoint (what vLLM / SGLang load), with the model's tokenizer."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

from ..calibration import recipe_name
from ..checkpoint import save_quantized
from ..models.cast import cast_float_model
from ..moe import QuantExperts
from ..quantize_model import quantize_model
from ..schemes import CALIBRATED_SCHEMES, SCHEMES, get_scheme
from .common import (
    BUILTIN_MODELS,
    DEFAULT_CALIBRATION_SAMPLES,
    TOKENIZER_FILES,
    builtin_model,
    calibrates,
    human_bytes,
    is_quantized_dir,
    linear_weight_bytes,
    load_builtin,
    positive_int,
    scheme_arg,
    size_arg,
)


def add_parser(sub) -> None:
    p = sub.add_parser("quantize", help="quantize a local Hugging Face model directory and save it (compressed-tensors)")
    p.add_argument(
        "model", type=Path, help="directory with config.json and float safetensors weights, or a built-in model: " + ", ".join(BUILTIN_MODELS)
    )
    p.add_argument("--scheme", required=True, type=scheme_arg, help="one of " + ", ".join([*SCHEMES, *CALIBRATED_SCHEMES]) + ", or e.g. W4A16_G64")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument(
        "--ignore", nargs="*", default=None, help="layers to keep in floating point, besides lm_head (unless --lm-head) and shared_expert_gate"
    )
    p.add_argument(
        "--lm-head",
        default=None,
        type=scheme_arg,
        metavar="SCHEME",
        help="quantize the output head too, e.g. W8A16 (default: kept in floating point)",
    )
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default=None, help="activation dtype (default: the model's, else bfloat16)")
    p.add_argument("--max-shard-size", default="5GB", type=size_arg, help="largest safetensors shard (default 5GB)")
    p.add_argument("--calibration", default=None, help="recipe: rtn (default), sq, awq, gptq or steps joined by '+' (sq+gptq, awq+gptq)")
    p.add_argument(
        "--calibration-samples",
        type=positive_int,
        default=None,
        help="calibration windows of 512 tokens from qfuse.calibration.calibration_text (default 128)",
    )
    p.set_defaults(run=run)


def _calibration(args: argparse.Namespace, scheme, tokenizer):
    """The parsed recipe and its calibration batches (None without calibration)."""
    import transformers

    from ..calibration import calibration_batches, parse_recipe

    try:
        steps = parse_recipe(args.calibration)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"qfuse quantize: {e}") from None
    if not steps and not scheme.static_act:
        return steps, None
    if tokenizer is None:
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        except (OSError, ValueError) as e:
            raise SystemExit(f"qfuse quantize: calibration needs the model's tokenizer ({e})") from None
    try:
        data = calibration_batches(tokenizer, args.calibration_samples, 512)
    except ValueError as e:
        raise SystemExit(f"qfuse quantize: {e}") from None
    print(f"calibration: {data.shape[0]} windows of 512 tokens from qfuse.calibration.calibration_text")
    return steps, list(data.split(8))


def run(args: argparse.Namespace) -> int:
    import transformers

    scheme = get_scheme(args.scheme)
    if args.calibration_samples is not None and not calibrates(scheme.name, args.calibration):
        raise SystemExit("qfuse quantize: --calibration-samples needs a calibration (--calibration or a static scheme); it would be ignored")
    args.calibration_samples = args.calibration_samples or DEFAULT_CALIBRATION_SAMPLES
    builtin = builtin_model(args.model)
    if not builtin:
        if not (args.model / "config.json").is_file():
            raise SystemExit(f"qfuse quantize: {args.model} has no config.json (a local Hugging Face model directory is needed)")
        if is_quantized_dir(args.model):
            raise SystemExit(f"qfuse quantize: {args.model} is already a quantized checkpoint; start from the float model")
        if args.out.resolve() == args.model.resolve():
            raise SystemExit("qfuse quantize: --out must differ from the model directory")
    if args.out.exists() and not args.out.is_dir():
        raise SystemExit(f"qfuse quantize: --out {args.out} is a file, not a directory")
    try:  # before the work: an unwritable --out failed only after quantizing (and calibrating)
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"qfuse quantize: cannot create --out {args.out} ({e.strerror or e})") from None
    tokenizer = None
    if builtin:
        model, tokenizer = load_builtin(builtin, getattr(torch, args.dtype or "bfloat16"), "quantize")
        dtype = model.dtype
    else:
        print(f"loading {args.model}")
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype="auto", local_files_only=True)
        dtype = getattr(torch, args.dtype) if args.dtype else (model.dtype if model.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16)
        model = cast_float_model(model, dtype).eval()
    before, other = linear_weight_bytes(model)
    steps, data = _calibration(args, scheme, tokenizer)
    t0 = time.perf_counter()
    try:
        quantize_model(model, scheme, ignore=args.ignore, lm_head=args.lm_head, calibration=steps, calibration_data=data)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"qfuse quantize: {e}") from None
    if data is not None:
        print(f"calibrated ({recipe_name(steps)}) and quantized in {time.perf_counter() - t0:.1f} s")
    after, other_after = linear_weight_bytes(model)
    experts = any(isinstance(m, QuantExperts) for m in model.modules())
    # a quantized head tied to the embedding unties it: the embedding's float weight becomes an other tensor
    others = human_bytes(other) if other_after == other else f"{human_bytes(other)} -> {human_bytes(other_after)}"
    print(
        f"{'linear and expert' if experts else 'linear'} weights: {human_bytes(before)} {str(dtype).removeprefix('torch.')} -> {human_bytes(after)} {scheme.name} "
        f"({before / max(after, 1):.2f}x smaller); other tensors {others}; in all {human_bytes(before + other)} -> {human_bytes(after + other_after)}"
    )
    save_quantized(model, args.out, max_shard_size=args.max_shard_size)
    verb = "copied"
    if tokenizer is not None:  # a built-in model: its tokenizer lives in no directory, so it is written out
        copied, verb = sorted({Path(f).name for f in tokenizer.save_pretrained(args.out)} & set(TOKENIZER_FILES)), "wrote"
    else:
        copied = [name for name in TOKENIZER_FILES if (args.model / name).is_file()]
        for name in copied:
            shutil.copy2(args.model / name, args.out / name)
    size = sum(f.stat().st_size for f in args.out.glob("*.safetensors"))
    print(f"saved {args.out} ({human_bytes(size)} of safetensors; compressed-tensors format" + (f"; {verb} {', '.join(copied)})" if copied else ")"))
    return 0
