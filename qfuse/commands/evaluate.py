"""``qfuse eval MODEL --ppl``: perplexity of a quantized checkpoint (any format qfuse loads), of a
float Hugging Face model directory, or of the built-in real model ``smollm2`` (see
``qfuse.models``), with its own tokenizer.

A float model can be quantized in memory first (``--scheme S [--calibration R] [--fake-quant]``),
and ``--table --out DIR`` runs the whole accuracy table: every scheme and calibration recipe,
through qfuse's ops and through the calibration's own simulation (``qfuse.eval.accuracy``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..calibration.recipe import parse_recipe
from ..eval.perplexity import default_text, perplexity, windows_of
from ..models.cast import cast_float_model
from ..schemes import CALIBRATED_SCHEMES, SCHEMES
from .common import (
    BUILTIN_MODELS,
    DEFAULT_CALIBRATION_SAMPLES,
    builtin_model,
    calibrates,
    device_arg,
    is_quantized_dir,
    load_any,
    load_builtin,
    positive_int,
    scheme_arg,
)


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a model (quantized, float, or float quantized here): perplexity")
    p.add_argument("model", type=Path, help="model directory (with its tokenizer files), or a built-in model: " + ", ".join(BUILTIN_MODELS))
    p.add_argument("--ppl", action="store_true", required=True, help="perplexity (the only evaluation so far)")
    p.add_argument("--text", type=Path, default=None, help="UTF-8 text file (default: CPython's pydoc_data.topics)")
    p.add_argument("--window", type=int, default=512, help="tokens per window (default 512)")
    p.add_argument("--max-windows", type=positive_int, default=None, help="evaluate only the first N windows")
    p.add_argument("--batch", type=positive_int, default=1, help="windows per forward pass")
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16"),
        default=None,
        help="activation dtype (default: the checkpoint's; for a built-in model float32, or bfloat16 with --scheme/--table)",
    )
    p.add_argument(
        "--device", type=device_arg, default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda, cuda:1, ... (default: cuda if present)"
    )
    q = p.add_argument_group("quantize a float model first")
    q.add_argument("--scheme", default=None, type=scheme_arg, help="one of " + ", ".join([*SCHEMES, *CALIBRATED_SCHEMES]) + ", or e.g. W4A16_G64")
    q.add_argument("--calibration", default=None, help="recipe: rtn, sq, awq, gptq or steps joined by '+' (e.g. sq+gptq, awq+gptq)")
    q.add_argument(
        "--calibration-samples",
        type=positive_int,
        default=None,
        help="calibration windows of --window tokens from qfuse.calibration.calibration_text (default 128)",
    )
    q.add_argument(
        "--lm-head",
        default=None,
        type=scheme_arg,
        metavar="SCHEME",
        help="quantize the output head too, e.g. W8A16 (default: kept in floating point)",
    )
    q.add_argument("--fake-quant", action="store_true", help="evaluate the calibration's own fake-quant simulation instead of qfuse's ops")
    t = p.add_argument_group("the accuracy table")
    t.add_argument("--table", action="store_true", help="every scheme x recipe; writes accuracy.csv / .md / .png to --out")
    t.add_argument("--schemes", nargs="+", default=None, type=scheme_arg, help="table: these schemes only")
    t.add_argument("--recipes", nargs="+", default=None, help="table: these recipes only")
    t.add_argument("--out", type=Path, default=None, help="table: output directory")
    t.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="table: cells in this many processes (each loads the model; on one GPU a small model leaves room for several)",
    )
    t.add_argument("--cells", nargs="*", default=None, help=argparse.SUPPRESS)  # SCHEME:RECIPE pairs, for --jobs' processes
    p.set_defaults(run=run)


def _check_args(args: argparse.Namespace) -> None:
    if args.table and args.out is None:
        raise SystemExit("qfuse eval: --table needs --out DIR")
    if args.table and args.scheme:
        raise SystemExit("qfuse eval: --table runs every scheme; use --schemes to choose some, not --scheme")
    if (args.calibration or args.fake_quant or args.lm_head) and not args.scheme:
        raise SystemExit("qfuse eval: --calibration, --fake-quant and --lm-head quantize a float model: they need --scheme")
    if args.calibration_samples is not None and not (args.table or (args.scheme and calibrates(args.scheme, args.calibration))):
        raise SystemExit("qfuse eval: --calibration-samples needs a calibration (--calibration, a static scheme or --table); it would be ignored")
    args.calibration_samples = args.calibration_samples or DEFAULT_CALIBRATION_SAMPLES
    if args.jobs < 1:
        raise SystemExit("qfuse eval: --jobs must be >= 1")
    table_only = [
        f for f, given in (("--schemes", args.schemes), ("--recipes", args.recipes), ("--out", args.out), ("--jobs", args.jobs != 1)) if given
    ]
    if table_only and not args.table:
        raise SystemExit(f"qfuse eval: {', '.join(table_only)} belong to --table (they would be ignored)")
    for recipe in args.recipes or ():
        try:
            parse_recipe(recipe)
        except (ValueError, TypeError) as e:
            raise SystemExit(f"qfuse eval: --recipes: {e}") from None
    if args.text is not None and not args.text.is_file():
        raise SystemExit(f"qfuse eval: --text {args.text} is not a file")


def _calibration_data(tok, args: argparse.Namespace):
    from ..calibration import calibration_batches

    try:
        data = calibration_batches(tok, args.calibration_samples, args.window)
    except ValueError as e:
        raise SystemExit(f"qfuse eval: {e}") from None
    print(f"calibration: {data.shape[0]} windows of {data.shape[1]} tokens from qfuse.calibration.calibration_text")
    return list(data.split(max(args.batch, 8)))


def _quantize(model, tok, args: argparse.Namespace):
    from ..calibration import parse_recipe
    from ..calibration.recipe import check_recipe
    from ..quantize_model import quantize_model
    from ..schemes import get_scheme

    scheme = get_scheme(args.scheme)
    try:
        steps = parse_recipe(args.calibration)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"qfuse eval: {e}") from None
    try:
        check_recipe(steps, scheme)
    except ValueError as e:
        raise SystemExit(f"qfuse eval: {e}") from None
    data = _calibration_data(tok, args) if steps or scheme.static_act else None
    t0 = time.perf_counter()
    try:
        model = quantize_model(model, scheme, lm_head=args.lm_head, calibration=steps, calibration_data=data, fake_quant=args.fake_quant)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"qfuse eval: {e}") from None
    head = f", lm_head {args.lm_head}" if args.lm_head else ""
    print(
        f"quantized to {scheme.name} ({args.calibration or 'rtn'}{', fake-quant' if args.fake_quant else ''}{head}) in {time.perf_counter() - t0:.1f} s"
    )
    return model


def run(args: argparse.Namespace) -> int:
    import transformers

    _check_args(args)
    quantizing = bool(args.scheme or args.table)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    builtin = builtin_model(args.model)
    if not builtin and not args.model.is_dir():
        raise SystemExit(f"qfuse eval: {args.model}: no such directory (a model directory, or a built-in model: {', '.join(BUILTIN_MODELS)})")
    if args.table and not builtin and is_quantized_dir(args.model):
        raise SystemExit(f"qfuse eval: --table quantizes a float model, and {args.model} is already a quantized checkpoint")
    try:  # before loading a model (a built-in one takes ~20 s)
        text = args.text.read_text(encoding="utf-8") if args.text else default_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"qfuse eval: cannot read --text {args.text} as UTF-8 text ({e})") from None
    if builtin:
        model, tok = load_builtin(builtin, dtype or (torch.bfloat16 if quantizing else torch.float32), "eval")
    else:
        try:
            tok = transformers.AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        except (OSError, ValueError) as e:
            raise SystemExit(f"qfuse eval: no usable tokenizer in {args.model} ({e})") from None
    source = str(args.text) if args.text else "pydoc_data.topics"
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    try:
        windows = windows_of(ids, args.window, args.max_windows)
    except ValueError as e:
        raise SystemExit(f"qfuse eval: {e}") from None
    if not builtin:
        model = load_any(args.model, None if quantizing and dtype is None else dtype, "cpu" if quantizing else args.device)
        if quantizing and model.dtype not in (torch.float16, torch.bfloat16):
            model = cast_float_model(model, torch.bfloat16)
    if args.table:
        return _table(model, tok, windows, source, args)
    if args.scheme:
        model = _quantize(model.to(args.device), tok, args)
    model = model.to(args.device)
    t0 = time.perf_counter()
    result = perplexity(model, windows, args.batch)
    secs = time.perf_counter() - t0
    head = f" (lm_head {args.lm_head})" if args.lm_head else ""
    what = f"{args.model}" + (f" {args.scheme}{head} {args.calibration or 'rtn'}{' fake-quant' if args.fake_quant else ''}" if args.scheme else "")
    print(f"{what}: perplexity {result.ppl:.4f} on {source} ({result.windows} windows of {args.window}, {result.tokens} scored tokens, {secs:.1f} s)")
    return 0


def _table(model, tok, windows, source: str, args: argparse.Namespace) -> int:
    import platform

    from ..eval.accuracy import TABLE_SCHEMES, accuracy_table, table_cells, write_table

    cells = [tuple(c.split(":", 1)) for c in args.cells] if args.cells else table_cells(args.schemes or TABLE_SCHEMES, args.recipes)
    if not cells:
        raise SystemExit("qfuse eval: --schemes / --recipes select no cell of the table")
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"
    header = (
        f"# {args.model} on {source}: {windows.shape[0]} windows of {windows.shape[1]} tokens, "
        f"{str(model.dtype).removeprefix('torch.')}, {where}, torch {torch.__version__}; "
        f"calibration {args.calibration_samples} windows of calibration_text"
    )
    if args.jobs == 1:  # the table so far is rewritten after every cell
        base_ppl, rows = accuracy_table(
            model, cells, windows, _calibration_data(tok, args), device, args.batch, on_row=lambda ppl, done: write_table(args.out, ppl, done, header)
        )
    else:
        base_ppl, rows = _table_in_processes(cells, args)
    for path in write_table(args.out, base_ppl, rows, header):
        print(f"wrote {path}")
    return 0


def _table_in_processes(cells, args: argparse.Namespace):
    """The cells round-robin over ``--jobs`` child ``qfuse eval --table`` processes (each loads
    the model and measures the float model), merged in table order."""
    import subprocess
    import sys

    from ..eval.accuracy import read_rows

    shares = [share for share in (cells[i :: args.jobs] for i in range(args.jobs)) if share]
    forwarded = [
        "--window",
        str(args.window),
        "--batch",
        str(args.batch),
        "--device",
        args.device,
        "--calibration-samples",
        str(args.calibration_samples),
    ]
    for flag, value in (("--max-windows", args.max_windows), ("--text", args.text), ("--dtype", args.dtype)):
        if value is not None:
            forwarded += [flag, str(value)]
    procs = []
    for i, share in enumerate(shares):
        out = args.out / f"part{i}"
        cmd = [
            sys.executable,
            "-m",
            "qfuse.cli",
            "eval",
            str(args.model),
            "--ppl",
            "--table",
            "--out",
            str(out),
            *forwarded,
            "--cells",
            *[f"{s}:{r}" for s, r in share],
        ]
        procs.append((out, subprocess.Popen(cmd)))
    failed = [str(out) for out, p in procs if p.wait() != 0]
    if failed:
        raise SystemExit(f"qfuse eval: table processes failed: {', '.join(failed)}")
    base_ppl, rows = None, {}
    for out, _ in procs:
        ppl, part = read_rows(out / "accuracy.csv")
        base_ppl = ppl if base_ppl is None else base_ppl
        rows.update({(r.scheme, r.recipe): r for r in part})
    from ..calibration import parse_recipe, recipe_name

    return base_ppl, [rows[(s, recipe_name(parse_recipe(r)))] for s, r in cells]
