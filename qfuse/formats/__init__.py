"""Quantized checkpoint formats: AutoAWQ, GPTQ and compressed-tensors in; compressed-tensors out."""

from __future__ import annotations

from pathlib import Path

from .awq import AwqCheckpoint, is_awq
from .base import LayerSpec
from .compressed_tensors import CompressedTensorsCheckpoint, is_compressed_tensors
from .files import CheckpointError, CheckpointFiles, check_checkpoint_dir, read_json
from .gptq import GptqCheckpoint, is_gptq

__all__ = ["CheckpointError", "CheckpointFiles", "LayerSpec", "open_checkpoint", "quantization_config"]

# Files that older AutoGPTQ / AutoAWQ releases write beside config.json.
SIDE_CONFIGS = ("quantize_config.json", "quant_config.json")


def quantization_config(path: Path) -> tuple[dict, dict]:
    """(config.json as a dict, the quantization config) of a checkpoint directory: config.json's
    ``quantization_config``, else ``quantize_config.json`` / ``quant_config.json``."""
    check_checkpoint_dir(path)
    config = read_json(path / "config.json") if (path / "config.json").is_file() else {}
    qc = config.get("quantization_config")
    for name in SIDE_CONFIGS:
        if qc is None and (path / name).is_file():
            qc = read_json(path / name)
            if "quant_method" not in qc:  # AutoGPTQ's quantize_config.json and AutoAWQ's quant_config.json
                qc = {**qc, "quant_method": "awq" if "w_bit" in qc or "version" in qc else "gptq"}
    if qc is None:
        raise CheckpointError(
            f"{path}: no quantization config (config.json has no quantization_config, "
            f"and there is no {' or '.join(SIDE_CONFIGS)}); is this a quantized checkpoint?"
        )
    if not isinstance(qc, dict):
        raise CheckpointError(f"{path}: quantization_config must be a JSON object")
    return config, qc


def open_checkpoint(path: str | Path):
    """The reader for the checkpoint at ``path``: its format is detected from its config."""
    path = Path(path)
    config, qc = quantization_config(path)
    files = CheckpointFiles(path)
    if is_compressed_tensors(qc):
        return CompressedTensorsCheckpoint(files, qc, config)
    if is_awq(qc):
        return AwqCheckpoint(files, qc)
    if is_gptq(qc):
        return GptqCheckpoint(files, qc)
    raise CheckpointError(f"{path}: quant_method {qc.get('quant_method')!r} is not supported (qfuse reads awq, gptq and compressed-tensors)")
