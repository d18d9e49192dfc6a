"""A small Llama-architecture decoder built into qfuse (no download, no transformers).

Same structure as Hugging Face ``LlamaForCausalLM`` (RMSNorm, rotary attention with
grouped KV heads, SwiGLU MLP, residual adds), small enough to quantize, compile and
run on a CPU in seconds. Used by the demo and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class TinyLlamaConfig:
    vocab_size: int = 512
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0


class _LlamaRMSNorm(nn.Module):
    # Written like HF's LlamaRMSNorm (same class name, same attributes) so that
    # quantize_model treats it as one.
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * xf.to(x.dtype)


_LlamaRMSNorm.__name__ = "LlamaRMSNorm"


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _Attention(nn.Module):
    def __init__(self, c: TinyLlamaConfig):
        super().__init__()
        self.h, self.kvh, self.d = c.num_heads, c.num_kv_heads, c.hidden_size // c.num_heads
        self.q_proj = nn.Linear(c.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kvh, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kvh, self.d).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(self.h // self.kvh, dim=1)
        v = v.repeat_interleave(self.h // self.kvh, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.h * self.d))


class _MLP(nn.Module):
    def __init__(self, c: TinyLlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TinyLlamaDecoderLayer(nn.Module):
    def __init__(self, c: TinyLlamaConfig):
        super().__init__()
        self.input_layernorm = _LlamaRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = _LlamaRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _MLP(c)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    """``TinyLlama(config)(input_ids [B, T]) -> logits [B, T, vocab]``."""

    def __init__(self, config: TinyLlamaConfig = TinyLlamaConfig()):
        super().__init__()
        self.config = c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(TinyLlamaDecoderLayer(c) for _ in range(c.num_layers))
        self.norm = _LlamaRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        d = c.hidden_size // c.num_heads
        self.register_buffer("inv_freq", 1.0 / c.rope_theta ** (torch.arange(0, d, 2).float() / d), persistent=False)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.embed_tokens(input_ids)
        t = torch.arange(input_ids.shape[1], device=input_ids.device).float()
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.bfloat16, config: TinyLlamaConfig = TinyLlamaConfig()) -> TinyLlama:
    """A TinyLlama with deterministic random weights (normal, std 0.02; norm weights near 1)."""
    g = torch.Generator().manual_seed(seed)
    model = TinyLlama(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    return model.to(dtype).eval()
