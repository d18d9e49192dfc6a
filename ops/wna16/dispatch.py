"""Kernel-family choice for ``wna16_gemm`` on CUDA: the registry of its families, the untuned
pick, and the op's entry point. Each family is declared (``FAMILY``) in its kernel module, with
its configs, its refusal reasons and what is opt-in; in registry order:

* ``gemv`` (M bucket <= 4): CUDA-core GEMV with split-K (ops/wna16/gemv.py);
* ``gemv_words`` (M bucket <= 2, K whole int32 words per group): CUDA-core GEMV reading int32
  words, ~3 instructions per code (ops/wna16/gemv_words.py); with ``HFMA2`` (4-bit, bf16: each
  word pair's products summed in bf16 lanes first, ~2 instructions per code) the shipped W4A16
  bf16 pick at M = 1 on all five H200 shapes, 2.45-2.91x bf16 at g128 (``QFUSE_FP32_ACCUMULATE=1``
  turns it off); W8A16 at M = 1: 1.47-1.74x bf16;
* ``mma_gemv`` (opt-in): the weights as ``mma.sync``'s A operand by inline PTX (ops/wna16/mma_gemv.py);
* ``tiled`` (any M): tensor-core tiles, split-K for skinny M (ops/wna16/tiled.py);
* ``tiled_words`` (K whole int32 words): the same tiles reading int32 words, dequantized in place
  (ops/wna16/tiled_words.py); ``SWAP_AB``: the weights as the MMA's A operand;
* ``tiled_planes`` (4-bit): the weights as the MMA's A operand, dequantized by inline PTX on packed
  registers (ops/wna16/tiled_planes.py); the fallback at M = 2-32 where ``mma_words`` cannot run
  (K % 128 != 0); ``JOIN`` opt-in;
* ``mma_words`` (4-bit, M bucket <= 64, K % 128 == 0): the packed int32 words straight into
  wgmma's register A operand (ops/wna16/mma_words.py): the H200 pick at M = 2-32 on every shape
  and at M = 64 on four of five (M = 16: 1.61-2.13x bf16);
* ``tiled_tma`` (M bucket >= 16, TMA): large weight-major tiles fed by TMA (ops/wna16/tma.py); the
  H200 pick for 4-bit at M = 64-2048 and 8-bit at M = 64-1024;
* ``dequant_mm`` (M bucket >= 128): dequantize, then cuBLAS (ops/wna16/dequant_mm.py).

:func:`pick_config` (ops/_autotune.py) looks up the key ``(M bucket, N, K, group_size, dtype,
bits)`` in the user cache, then in the shipped ``ops/tuned/wna16_gemm.NVIDIA_H200.json``;
otherwise it times the offered candidates once (never while a CUDA graph is captured: then the
first candidate, the heuristic, runs). ``qfuse kernels --explain`` prints all of this for a shape.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._autotune import env_flag, m_bucket, pick_config, sm_count, tma_capable
from ..activation.quant_kernels import device_guard
from ..kernel_family import Problem, Registry
from .dequant_mm import FAMILY as DEQUANT_MM
from .gemv import FAMILY as GEMV
from .gemv_words import FAMILY as GEMV_WORDS
from .mma_gemv import FAMILY as MMA_GEMV
from .mma_words import FAMILY as MMA_WORDS
from .tiled import FAMILY as TILED
from .tiled_planes import FAMILY as TILED_PLANES
from .tiled_words import FAMILY as TILED_WORDS
from .tma import FAMILY as TILED_TMA

OP = "wna16_gemm"


def _heuristic(p: Problem, cands: list[dict]) -> list[dict]:
    """The untuned pick first (what runs under CUDA-graph capture with no cached config): the
    family measured fastest on the H200 for this M bucket. M = 1: the word GEMV where offered
    (bf16 4-bit: its HFMA2 16 x 256 tile, split 1, 4 warps: within 16 % of each of the five
    shapes' tuned pick), else the GEMV; M = 2-32: mma_words (4-bit, best at M = 16 on every
    shape), else tiled_planes; M >= 64: the TMA tiles (best at M = 64-1024 for 4 and 8 bits);
    otherwise the tiled kernel. The rest keep the registry's order."""
    mb = m_bucket(p.m)
    kinds = {c["kernel"] for c in cands}
    if mb == 1:
        first = "gemv_words" if "gemv_words" in kinds else "gemv"
    elif mb <= 32 and "mma_words" in kinds:
        first = "mma_words"
    elif mb <= 32 and "tiled_planes" in kinds:
        first = "tiled_planes"
    elif mb >= 64 and "tiled_tma" in kinds:
        first = "tiled_tma"
    else:
        first = "tiled"
    cands.sort(key=lambda c: c["kernel"] != first)  # stable: the family's own order is kept
    if first == "gemv_words" and p.dtype == torch.bfloat16 and p.bits == 4:
        lead = next((c for c in cands if c.get("HFMA2") and (c["BLOCK_N"], c["BLOCK_W"], c["SPLIT_K"], c["num_warps"]) == (16, 256, 1, 4)), None)
        if lead is not None:
            cands.remove(lead)
            cands.insert(0, lead)
    return cands


# The families in registry order: the order of the candidate list before the heuristic moves
# the untuned pick to the front.
FAMILIES = (GEMV, GEMV_WORDS, MMA_GEMV, TILED, TILED_WORDS, TILED_PLANES, MMA_WORDS, TILED_TMA, DEQUANT_MM)
REGISTRY = Registry(OP, FAMILIES, _heuristic)


def problem(m: int, n: int, k: int, bits: int, group_size: int, sms: int = 132, tma: bool = True, dtype: torch.dtype | None = None) -> Problem:
    return Problem(m, n, k, bits, group_size, dtype, sms, tma)


def candidate_configs(
    m: int, n: int, k: int, bits: int, group_size: int, sms: int = 132, exhaustive: bool = False, dtype: torch.dtype | None = None
) -> list[dict]:
    """Every family's configs for this problem, opt-in ones included, the heuristic choice first;
    ``dtype``: the activations' (bf16 adds the word GEMV's packed-bf16 forms; None: unknown)."""
    return REGISTRY.candidates(problem(m, n, k, bits, group_size, sms, True, dtype), exhaustive)


def run_config(
    cfg: dict, x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int
) -> Tensor:
    """Run ``wna16_gemm`` with one config (arguments already checked)."""
    return REGISTRY.run(cfg, x, qweight, scales, zeros, bias, bits, group_size)


def usable_configs(
    m: int, n: int, k: int, bits: int, group_size: int, sms: int = 132, tma: bool = True, dtype: torch.dtype | None = None
) -> list[dict]:
    """The candidates the op may pick from: opt-in configs only with ``QFUSE_EXPERIMENTAL_KERNELS=1``;
    the TMA family only with ``tma`` (a Hopper or newer GPU); no ``HFMA2`` with ``QFUSE_FP32_ACCUMULATE=1``."""
    every = REGISTRY.offered(problem(m, n, k, bits, group_size, sms, tma, dtype))
    if fp32_accumulate():
        every = [c for c in every if "HFMA2" not in c]
    return every


def fp32_accumulate() -> bool:
    """``QFUSE_FP32_ACCUMULATE=1``: never sum products in bf16 (the word GEMV's ``HFMA2`` forms, the
    shipped W4A16 M = 1 picks on the H200). A tuned or shipped ``HFMA2`` pick then runs the same
    tile in float32: the rms error against the exact product goes from 1.4-2.0x the reference
    kernel's own to 0.6-0.85x, and the time up 24-39 % (H200, M = 1; BENCHMARKS.md)."""
    return env_flag("QFUSE_FP32_ACCUMULATE", False)


def accumulate_form(cfg: dict) -> dict:
    """``cfg`` as it runs: with ``QFUSE_FP32_ACCUMULATE=1`` an ``HFMA2`` pick runs its tile in float32."""
    if "HFMA2" in cfg and fp32_accumulate():
        return {key: v for key, v in cfg.items() if key != "HFMA2"}
    return cfg


def is_experimental(cfg: dict, bits: int | None = None) -> bool:
    """Whether ``cfg`` is offered only with ``QFUSE_EXPERIMENTAL_KERNELS=1``: a family kept opt-in
    as a whole (``mma_gemv``) or a config its family marks (register caps ``MAXNREG``, ``mma_words``
    ``BYTE_PAIRS``, ``TAIL_SPLIT``, ``WORDS`` outside its two offered tiles, ``tiled_planes``
    ``JOIN``); each with its reason in :data:`FAMILIES` (``qfuse kernels --explain`` prints them)."""
    return REGISTRY.is_opt_in(cfg)


def config_key(m: int, n: int, k: int, bits: int, group_size: int, dtype: torch.dtype) -> tuple:
    return (m_bucket(m), n, k, group_size, str(dtype).removeprefix("torch."), bits)


def wna16_gemm_triton(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int) -> Tensor:
    """Pick the config for this shape (cache / shipped defaults / one measurement) and run it."""
    m, k = x.shape
    n = qweight.shape[0]
    cands = lambda: usable_configs(m, n, k, bits, group_size, sm_count(x.device), tma_capable(x.device), x.dtype)  # noqa: E731 - built only on a cache miss
    with device_guard(x):  # Triton launches on the current device: x's, for a measurement too (a model spread over GPUs)
        cfg = pick_config(OP, config_key(m, n, k, bits, group_size, x.dtype), cands,
                          lambda c: run_config(c, x, qweight, scales, zeros, bias, bits, group_size), x.device, REGISTRY.usable)  # fmt: skip
        return run_config(accumulate_form(cfg), x, qweight, scales, zeros, bias, bits, group_size)
