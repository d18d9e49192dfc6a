"""The ``qfuse`` command line.

qfuse demo [--schemes W8A8 W4A8 ...] [--no-compile]
qfuse quantize MODEL_DIR --scheme S --out DIR      quantize a local HF model, save compressed-tensors
qfuse eval MODEL_DIR --ppl [--text FILE]            perplexity of a quantized or float model
qfuse info DIR                                       format, scheme per layer, bytes
qfuse kernels --explain M N K SCHEME                 kernel families considered / refused / picked for a GEMM
qfuse bench NAME [options]                           NAME = a module of qfuse.bench (gemm, int8, decoder, ...)
qfuse --version
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import sys
import warnings


def _bench_names() -> list[str]:
    import qfuse.bench

    return sorted(m.name for m in pkgutil.iter_modules(qfuse.bench.__path__) if m.name != "timing" and not m.name.startswith("_"))


def _version() -> str:
    import torch

    import qfuse

    try:
        from importlib.metadata import version

        triton = version("triton")
    except Exception:
        triton = "not installed"
    return f"qfuse {qfuse.__version__} (torch {torch.__version__}, triton {triton})"


def _demo_scheme(name: str) -> str:
    """argparse ``type=`` of ``demo --schemes``: a scheme that quantizes from the weights alone."""
    from .commands.common import scheme_arg
    from .schemes import get_scheme

    name = scheme_arg(name)
    if get_scheme(name).static_act:
        raise argparse.ArgumentTypeError(f"{name} needs calibration data, which the demo does not have (qfuse quantize --scheme {name} calibrates)")
    return name


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.schemes, compile_model=not args.no_compile, dtype=args.dtype)


@contextlib.contextmanager
def _warnings_as_lines():
    """A warning on the command line is one ``qfuse: warning: ...`` line, not the path and source
    line of the qfuse code that raised it."""
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, category, *_, **__: print(f"qfuse: warning: {message}", file=sys.stderr)
        yield


def main(argv: list[str] | None = None) -> int:
    from .commands import evaluate, info, kernels, quantize

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="qfuse", description="Quantized LLM inference under torch.compile.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="quantize a small built-in Llama with every scheme; run eager and compiled")
    demo.add_argument("--schemes", nargs="+", default=None, type=_demo_scheme, help="schemes to run (default: all)")
    demo.add_argument("--no-compile", action="store_true", help="skip the torch.compile run")
    demo.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    demo.set_defaults(run=_run_demo)
    quantize.add_parser(sub)
    evaluate.add_parser(sub)
    info.add_parser(sub)
    kernels.add_parser(sub)
    bench = sub.add_parser("bench", help="GPU benchmarks (CSV + PNG); `qfuse bench NAME --help`")
    bench.add_argument("name", help="benchmark: " + ", ".join(_bench_names()))
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.command != "bench":
        with _warnings_as_lines():
            return args.run(args)
    if args.name not in _bench_names():
        parser.error(f"unknown benchmark {args.name!r}; choose from {', '.join(_bench_names())}")
    module = importlib.import_module(f"qfuse.bench.{args.name}")
    return module.main(args.rest) or 0


if __name__ == "__main__":
    raise SystemExit(main())
