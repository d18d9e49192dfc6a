"""``RMSNorm`` module calling ``qfuse::rms_norm``, and conversion from the RMSNorm
classes of Hugging Face models and ``torch.nn.RMSNorm``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import ops  # noqa: F401
from .eager_graphs import graphs_of, replayable

# Classes with exactly LlamaRMSNorm's math (weight * normalize(x).to(dtype)).
# Gemma's RMSNorm (x * (1 + weight)) is deliberately absent.
HF_RMSNORM_CLASSES = ("LlamaRMSNorm", "MistralRMSNorm", "MixtralRMSNorm", "Qwen2RMSNorm", "Qwen2MoeRMSNorm", "Qwen3RMSNorm")


class RMSNorm(nn.Module):
    """RMSNorm with Hugging Face ``LlamaRMSNorm`` semantics, as one ``qfuse::rms_norm`` op."""

    def __init__(self, weight: Tensor, eps: float | None):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        # None: float32's eps (1.19e-7), which torch.nn.RMSNorm adds for fp16 / bf16 inputs too (it
        # computes in float32); bf16's own eps (7.8e-3) moved the output RMS of 0.01-sized inputs to 0.12
        self.eps = eps

    @classmethod
    def from_module(cls, module: nn.Module) -> "RMSNorm":
        if isinstance(module, nn.RMSNorm):
            shape = tuple(module.normalized_shape)
            if len(shape) != 1:
                raise ValueError(f"only RMSNorm over the last dimension is supported, got normalized_shape={shape}")
            weight = module.weight if module.weight is not None else torch.ones(shape)
            return cls(weight, module.eps)
        if type(module).__name__ in HF_RMSNORM_CLASSES:
            return cls(module.weight, float(module.variance_epsilon))
        raise TypeError(f"cannot convert {type(module).__name__} to qfuse RMSNorm")

    def forward(self, x: Tensor) -> Tensor:
        if replayable(x):  # eager CUDA calls at decode sizes: a CUDA-graph replay (qfuse/eager_graphs.py)
            return graphs_of(self)(self._forward, (self.weight,), x)
        return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(torch.float32).eps
        weight = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        return torch.ops.qfuse.rms_norm(x, weight, float(eps))

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def is_convertible_rmsnorm(module: nn.Module) -> bool:
    if isinstance(module, nn.RMSNorm):
        return len(tuple(module.normalized_shape)) == 1
    return type(module).__name__ in HF_RMSNORM_CLASSES and hasattr(module, "variance_epsilon")


def check_convertible(module: nn.Module, name: str) -> None:
    """Raise a TypeError when ``module``'s weight is not fp16/bf16.

    ``qfuse::rms_norm`` takes fp16/bf16 activations only. A float32 norm weight means
    float32 activations (an fp32 model: every forward would fail after conversion) or a
    norm kept in float32 on purpose (HF promotes its output to float32; the qfuse module
    would return the input dtype instead). A norm without weight has no dtype to check.
    """
    weight = getattr(module, "weight", None)
    if weight is not None and weight.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(
            f"{name}: {type(module).__name__} weight dtype {weight.dtype} is not supported; qfuse runs fp16/bf16 models "
            "(convert first, e.g. model.to(torch.bfloat16))"
        )
