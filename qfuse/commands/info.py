"""``qfuse info DIR``: what a checkpoint holds: its format, the scheme of every quantized
layer, and the bytes of each."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from ..formats import CheckpointError, CheckpointFiles, open_checkpoint, quantization_config
from .common import human_bytes, is_quantized_dir


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="format, scheme per layer and bytes of a checkpoint directory")
    p.add_argument("model", type=Path, help="checkpoint directory")
    p.add_argument("--summary", action="store_true", help="only the per-scheme summary, not every layer")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path = args.model
    try:
        if not is_quantized_dir(path):
            files = CheckpointFiles(path)
            total = sum(files.nbytes(n) for n in files.names())
            print(f"{path}: not a quantized checkpoint ({len(files.names())} tensors, {human_bytes(total)})")
            return 0
        config, qc = quantization_config(path)
        reader = open_checkpoint(path)
        specs = reader.layers()
    except CheckpointError as e:
        raise SystemExit(f"qfuse info: {e}") from None
    files = reader.files
    arch = ", ".join(config.get("architectures") or ["?"])
    fmt = reader.name + (f" ({qc['format']})" if isinstance(qc.get("format"), str) else "")
    print(f"{path}\n  format: {fmt}\n  model: {arch}, dtype {config.get('dtype') or config.get('torch_dtype') or '?'}")
    layer_bytes = {p: sum(files.nbytes(t) for t in s.tensors) for p, s in specs.items()}
    if not args.summary:
        width = max((len(p) for p in specs), default=5)
        print(f"\n  {'layer':<{width}}  {'scheme':<15} {'[out, in]':>14} {'bytes':>10}")
        for p, s in specs.items():
            shape = f"[{s.out_features}, {s.in_features}]"
            order = "  act-order" if s.act_order else ""
            print(f"  {p:<{width}}  {s.scheme.name:<15} {shape:>14} {human_bytes(layer_bytes[p]):>10}{order}")
    consumed = {t for s in specs.values() for t in s.tensors}
    other = [n for n in files.names() if n not in consumed]
    other_bytes = sum(files.nbytes(n) for n in other)
    counts = Counter(s.scheme.name for s in specs.values())
    print("\n  scheme           layers      bytes")
    for name, count in counts.most_common():
        b = sum(layer_bytes[p] for p, s in specs.items() if s.scheme.name == name)
        print(f"  {name:<15} {count:>7} {human_bytes(b):>10}")
    print(f"  {'float tensors':<15} {len(other):>7} {human_bytes(other_bytes):>10}")
    print(f"  {'total':<15} {'':>7} {human_bytes(sum(layer_bytes.values()) + other_bytes):>10}")
    return 0
