"""Grouped-query decode attention for Hugging Face models, without ``repeat_kv``.

    qfuse.use_decode_attention(model)      # any transformers model with SDPA attention, bf16 or quantized

transformers' SDPA path copies the cached K and V once per query head of a KV group
(``repeat_kv``) whenever it is given a mask, which a ``StaticCache`` always needs, and under
``torch.compile`` always (its query-head packing runs only in eager mode). On the H200 that copy
took 92 of the 170 us of attention per Llama-3-8B layer at batch 16, context 1024, and 9.6 of 21
us at batch 1 (BENCHMARKS "Where the time goes"). ``use_decode_attention`` switches the model to
an attention function that runs ``qfuse::decode_attention`` (ops/decode_attention.py: the query
heads of a KV head packed as rows, K / V read once, key blocks hidden by the mask skipped) for
the decode-sized calls, and transformers' own SDPA function for everything else:

* decode-sized: query tokens x query heads per KV head <= ``MAX_PACKED_ROWS``, fp16 / bf16,
  no dropout, a mask shared by all heads ([batch or 1, 1, tokens, keys]) or none with a single
  query token, and none of softcap, position bias or attention sinks;
* everything else (prefill, training, other dtypes, eager attention's features): SDPA as before.

The mask is built as for SDPA (transformers' ``sdpa_mask``, registered under the same name), so
sliding windows and padding reach the op as they reach SDPA.
"""

from __future__ import annotations

import torch

NAME = "qfuse_decode"
# Rows of the op's tile: 64 covers a decode token of any common GQA model (4-8 query heads per
# KV head) and short multi-token steps (speculative decoding); longer prompts go to SDPA,
# whose causal kernels are made for them.
MAX_PACKED_ROWS = 64
_UNSUPPORTED_KWARGS = ("softcap", "position_bias", "s_aux", "sinks")


def _decode_sized(module, query, key, value, attention_mask, dropout, is_causal, kwargs) -> bool:
    if query.dtype not in (torch.float16, torch.bfloat16) or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    if dropout or kwargs.get("output_attentions") or any(kwargs.get(k) is not None for k in _UNSUPPORTED_KWARGS):
        return False
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return False  # the op has no backward: training, or a model called without no_grad, takes SDPA
    if key.shape != value.shape or query.shape[1] % key.shape[1] != 0:
        return False
    tokens = query.shape[2]
    if tokens * (query.shape[1] // key.shape[1]) > MAX_PACKED_ROWS:
        return False
    if attention_mask is None:
        # SDPA would apply is_causal to more than one token; the op has no causal rule
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        return tokens == 1 or not causal
    m = attention_mask.shape
    return attention_mask.dim() == 4 and m[0] in (1, query.shape[0]) and m[1] == 1 and m[2] in (1, tokens) and m[3] == key.shape[2]


def decode_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, is_causal=None, **kwargs):
    """A transformers attention function (``AttentionInterface``): query [B, Hq, L, D], key and
    value [B, Hkv, S, D]; returns ([B, L, Hq, D], None) like SDPA's."""
    if _decode_sized(module, query, key, value, attention_mask, dropout, is_causal, kwargs):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = torch.ops.qfuse.decode_attention(query, key, value, attention_mask, float(scale))
        return out.transpose(1, 2), None  # laid out as [B, L, Hq, D]: contiguous
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)


def register() -> str:
    """Register the attention function and its mask builder with transformers; returns its name."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:  # transformers < 4.53 has no AttentionMaskInterface
        raise ImportError(f"qfuse.use_decode_attention needs transformers >= 4.53 (AttentionInterface and AttentionMaskInterface): {e}") from e
    AttentionInterface.register(NAME, decode_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_decode_attention(model):
    """Switch a transformers model's attention to ``decode_attention_forward``; returns the model.

    Works on the bf16 model and on one quantized by ``qfuse.quantize_model``, before or after
    ``qfuse.compile`` is called on it (not after the first compiled call, which has traced the old
    attention). Undo with ``model.set_attn_implementation("sdpa")``.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        raise TypeError(f"qfuse.use_decode_attention: expected a transformers PreTrainedModel, got {type(model).__name__}")
    name = register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # transformers < 4.56
        config._attn_implementation = name
    if config._attn_implementation != name:
        raise RuntimeError(f"qfuse.use_decode_attention: {type(model).__name__} kept attention {config._attn_implementation!r}")
    return model
