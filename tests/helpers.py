"""Shared test helpers: independent decoders (written differently from the ops' own
code, so a bug in one is not copied into the other) and input factories."""

from __future__ import annotations

import torch

ACT_DTYPES = (torch.float16, torch.bfloat16)
DECODE_AND_ODD_M = (1, 2, 7, 16, 33)


def decode_uint4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> int64 [N, K] codes, by integer arithmetic (not bit ops)."""
    p = packed.to(torch.int64)
    out = torch.empty(p.shape[0], p.shape[1] * 2, dtype=torch.int64)
    out[:, 0::2] = p % 16
    out[:, 1::2] = p // 16
    return out


def linear_of(weight: torch.Tensor) -> torch.nn.Linear:
    """An ``nn.Linear`` without bias holding ``weight`` [N, K], in its dtype."""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
    return lin


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def randn(*shape, dtype=torch.bfloat16, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape) * scale).to(dtype)


def random_int8(*shape) -> torch.Tensor:
    return torch.randint(-128, 128, shape, dtype=torch.int8)


# a wna16 config the registry offers only under QFUSE_EXPERIMENTAL_KERNELS=1 (its MAXNREG register cap)
OPT_IN_MMA_WORDS = {
    "kernel": "mma_words",
    "BLOCK_M": 16,
    "BLOCK_N": 128,
    "SPLIT_K": 1,
    "SCALE_W": False,
    "GROUP_M": 8,
    "num_warps": 4,
    "num_stages": 4,
    "MAXNREG": 128,
}


def record_cuda_device(monkeypatch) -> list:
    """Replaces ``torch.cuda.device`` (no GPU here) by a guard that records the device entered: the
    returned list holds the devices of the guards open now, innermost last."""
    entered = []

    class Guard:
        def __init__(self, device):
            self.device = torch.device(device)

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            entered.pop()

    monkeypatch.setattr(torch.cuda, "device", Guard)
    return entered


def run_in_threads(worker, n: int) -> None:
    """``worker(i)`` for i in 0..n-1, each on its own thread, all started before any is joined."""
    import threading

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def assert_per_token_quant(xq: torch.Tensor, scale: torch.Tensor, y: torch.Tensor) -> None:
    """``(xq, scale)`` is per-token int8 quantization of ``y`` (fp16 / bf16), computed here from the
    math, not with qfuse's quant op: scale = max(amax, 1e-10) / 127 rounded once to float32, codes
    the nearest integers (ties to even) to the float32 quotient y / scale."""
    y32 = y.float()  # exact: the values are fp16 / bf16
    assert torch.equal(scale, (y32.double().abs().amax(-1, keepdim=True).clamp(min=1e-10) / 127).float())
    assert torch.equal(xq, torch.round(y32 / scale).clamp(-128, 127).to(torch.int8))  # IEEE float32 division
