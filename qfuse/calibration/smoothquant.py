"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights before int8
activation quantization.

For a norm whose output feeds Linears ``f`` (Llama-style: ``input_layernorm`` -> q/k/v,
``post_attention_layernorm`` -> gate/up), with ``a_j = max |X_j|`` over calibration tokens of
input channel j and ``w_j = max_f max_n |W_f[n, j]|``::

    s_j = clamp(a_j ** alpha / clamp(w_j, 1e-5) ** (1 - alpha), min=1e-5),   s_j = 1 where a_j = 0
    norm.weight[j] /= s_j        W_f[:, j] *= s_j          (the float model computes the same)

so the per-token activation range shrinks where it had outliers and the weights, quantized
per output channel, absorb them. ``alpha`` is the migration strength (0.5 in the paper; on
SmolLM2-135M W8A8 +1.24 % perplexity at 0.5, +1.09 % at 0.8, against +2.75 % without). ``o_proj`` and ``down_proj`` have no norm before
them and are left alone, as in the reference implementation and llm-compressor's defaults.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

_MIN = 1e-5


@dataclass(frozen=True)
class SmoothQuant:
    """The SmoothQuant step of a calibration recipe (``quantize_model(..., calibration=...)``):
    ``alpha`` is the migration strength."""

    alpha: float = 0.5

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"SmoothQuant: alpha must lie in [0, 1], got {self.alpha}")


def smoothquant_scales(act_absmax: Tensor, weights: list[Tensor], alpha: float) -> Tensor:
    """``s`` [K] (float32) from the per-channel activation max and the Linears' weights [N_f, K].
    A channel that was 0 on every calibration token keeps ``s = 1``: the formula's ``1e-5`` would
    multiply its norm weight by 1e5 (inf in fp16, and NaN from ``inf * 0`` in the norm)."""
    w_max = torch.stack([w.abs().amax(dim=0).float() for w in weights]).amax(dim=0)
    a = act_absmax.to(w_max.device).float()
    s = (a.pow(alpha) / w_max.clamp(min=_MIN).pow(1 - alpha)).clamp(min=_MIN)
    return torch.where(a > 0, s, torch.ones_like(s))


# Decoder layers whose norm -> Linear scale folds leave the float model as it was: pre-norm,
# attention then MLP in sequence, each RMSNorm computing x * w and feeding the named Linears
# (qfuse's built-in TinyLlama is one too). Others that share the names are not: Gemma's norm is
# x * (1 + w), Gemma2 / Olmo2's post_attention_layernorm normalizes the attention's output, and
# Phi / Cohere feed attention and MLP from one input_layernorm in parallel.
FOLDABLE_LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer", "TinyLlamaDecoderLayer")


def check_foldable(layers: Iterable[nn.Module], what: str) -> None:
    """A ValueError naming the first decoder layer class whose norms SmoothQuant / AWQ cannot fold into."""
    for layer in layers:
        if type(layer).__name__ not in FOLDABLE_LAYERS:
            raise ValueError(
                f"{what} folds scales into the norms of Llama / Mistral / Qwen2 / Qwen3 decoder layers "
                f"({', '.join(FOLDABLE_LAYERS[:4])}); {type(layer).__name__} is not one of them (its norms or their "
                "placement differ, so folding would change the float model). Calibrate with 'gptq' or round to nearest."
            )


@dataclass
class SmoothMapping:
    """One norm and the Linears it feeds (names relative to the model)."""

    norm: str
    linears: tuple[str, ...]


def smoothquant_mappings(model: nn.Module) -> list[SmoothMapping]:
    """The Llama / Qwen2 / Mistral mappings: each decoder layer's ``input_layernorm`` -> its
    attention's q/k/v projections, ``post_attention_layernorm`` -> the MLP's gate/up."""
    mappings = []
    for name, mod in model.named_modules():
        attn, mlp = getattr(mod, "self_attn", None), getattr(mod, "mlp", None)
        prefix = f"{name}." if name else ""
        if hasattr(mod, "input_layernorm") and attn is not None and all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj")):
            mappings.append(SmoothMapping(f"{prefix}input_layernorm", tuple(f"{prefix}self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj"))))
        if hasattr(mod, "post_attention_layernorm") and mlp is not None and all(hasattr(mlp, p) for p in ("gate_proj", "up_proj")):
            mappings.append(SmoothMapping(f"{prefix}post_attention_layernorm", tuple(f"{prefix}mlp.{p}" for p in ("gate_proj", "up_proj"))))
    return mappings


@torch.no_grad()
def activation_absmax(model: nn.Module, batches: Iterable[Tensor], layers: Iterable[str], progress: bool = True) -> dict[str, Tensor]:
    """Per input channel ``max |x|`` (float32) over every token the named Linears see while
    ``model(batch)`` runs on each batch of token ids."""
    stats: dict[str, Tensor] = {}

    def hook(name):
        def record(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(dim=0).float()
            stats[name] = torch.maximum(stats[name], x) if name in stats else x

        return record

    handles = [model.get_submodule(n).register_forward_pre_hook(hook(n)) for n in layers]
    try:
        for batch in tqdm(list(batches), desc="smoothquant calibration", unit="batch", disable=not progress):
            model(batch)
    finally:
        for h in handles:
            h.remove()
    return stats


@torch.no_grad()
def smooth_model(
    model: nn.Module,
    batches: Iterable[Tensor],
    alpha: float = 0.5,
    mappings: list[SmoothMapping] | None = None,
    progress: bool = True,
) -> dict[str, Tensor]:
    """Apply SmoothQuant to the float ``model`` in place (call it before ``quantize_model``
    with an int8-activation scheme) and return the scales ``s`` by norm name.

    ``batches``: token ids the model is called with (calibration text, disjoint from what is
    evaluated), as ``quantize_model``'s ``calibration_data``: a ``[B, T]`` tensor or a list of
    ``[B, T]`` / ``[T]`` ones. ``mappings`` default to :func:`smoothquant_mappings`; each lists a
    norm and every Linear its output feeds (a ValueError when a norm or a Linear is in two).
    """
    from .pipeline import decoder_layers, model_pad_token_id, token_batches

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    batches = token_batches(batches, next(model.parameters()).device, model_pad_token_id(model))
    if mappings is None:
        check_foldable(decoder_layers(model)[1], "smooth_model")
        mappings = smoothquant_mappings(model)
    if not mappings:
        raise ValueError("smooth_model: no norm -> Linear mappings found (a Llama / Qwen2 / Mistral decoder is expected)")
    # each norm's s is computed over, and folded into, every Linear it feeds at once
    for kind, names in (("norm", [m.norm for m in mappings]), ("Linear", [n for m in mappings for n in m.linears])):
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"smooth_model: {kind} {twice[0]} is in more than one mapping; list every Linear a norm feeds in one SmoothMapping")
    first = {m.norm: m.linears[0] for m in mappings}
    act = activation_absmax(model, batches, first.values(), progress)
    scales = {}
    for m in mappings:
        if first[m.norm] not in act:
            raise ValueError(f"smooth_model: {first[m.norm]} saw no activations during calibration")
        norm = model.get_submodule(m.norm)
        linears = [model.get_submodule(n) for n in m.linears]
        s = smoothquant_scales(act[first[m.norm]], [lin.weight for lin in linears], alpha)
        # in float32, rounded once to the weights' dtype
        norm.weight.copy_(norm.weight.float() / s)
        for lin in linears:
            lin.weight.copy_(lin.weight.float() * s)
        scales[m.norm] = s
    return scales
