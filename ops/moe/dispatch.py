"""Kernel choice for ``fused_moe`` on CUDA: its kernel families, configs by M bucket, and the entry point.

Three families, in registry order (the untuned pick is the first offered config):

* ``grouped`` (ops/moe/grouped_gemm.py), every format and M: routing, block-aligned sorting
  (ops/moe/align.py), fc1 with the SiLU-and-mul epilogue, per-token int8 quantization of h for
  int8 activations, fc2 with the routing-weight epilogue, the top-k sum. A config sets the
  sorting block ``BLOCK_M`` (shared by both GEMMs) and the tiles of both GEMMs. Configs by M
  bucket (each expert sees about M * top_k / E rows), after the tuned fused-MoE tables of vLLM /
  SGLang for the H200: decode (M bucket <= 32) BLOCK_M 16
  with long K tiles; mid M 32-64 rows; large M 64-128 rows with 8 warps.
* ``gemv`` (ops/moe/gemv.py), weight-only experts (W8A16, W4A16) at M bucket <= 16: one
  program per (token, expert) pair and row tile, no sorting; byte-wise code unpacking.
* ``gemv_words`` (ops/moe/gemv_words.py), the same experts and M: the dense op's int32-word
  GEMV over the pairs (Mixtral W4A16 on the H200: 72 against ``gemv``'s 146 us at M = 1).
* ``grouped_words`` (ops/moe/grouped_words.py), W4A16 at M bucket <= 64: the dense op's
  tensor-core word loop over the expert-sorted blocks, each expert dequantized once per block
  (Mixtral M = 16: 387 against ``gemv_words``' 642 us).

Of the 21 shipped weight-only keys at M 1-64 on the H200, ``gemv_words`` holds 9, ``grouped_words``
6, ``grouped`` 5 and ``gemv`` 1 (``qfuse bench moe --every-config``; BENCHMARKS.md, "Fused MoE").
Two tile-major keys (Mixtral W4A16, M = 2 and 8) hold the picks of an H100 run on tile-major codes
(``grouped_words`` split 4 at M = 8: 276.4 against ``gemv_words``' 349.5 us there), not yet timed on
an H200; the other tile-major keys take the natural layout's pick.
Routing runs in one Triton launch here (ops/moe/routing.py).

:func:`pick_config` (ops/_autotune.py) keys the picks by ``(M bucket, E, I, H, top_k,
weight_bits, act_bits, group_size, dtype)``, ``tile_major`` last for tile-major codes (where no such
key is stored, the natural layout's stored pick of the shape: :func:`layout_key`): a cached or shipped pick
(ops/tuned/fused_moe.NVIDIA_H200.json: the Mixtral-8x7B and fine-grained shapes of ``qfuse bench
moe``, bf16 activations, M 1-4096), else one measurement of the offered configs (the first under
CUDA-graph capture or ``QFUSE_AUTOTUNE=0``, unless a stored key differs only in E and I).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._autotune import TILE_MAJOR, device_name, lookup, m_bucket, pick_config
from ..activation.quant_kernels import device_guard
from ..kernel_family import KernelFamily, Problem, Registry
from . import gemv, gemv_words, grouped_words
from .align import align_block_size, fc1_row_div, pair_rows
from .grouped_gemm import moe_gemm, moe_sum
from .routing import topk_routing_triton

OP = "fused_moe"


def _config(bm: int, bn: int, bk: int, warps: int, stages: int) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages}


def grouped_configs(p: Problem, exhaustive: bool) -> list[dict]:
    """Tiles by M bucket (``p.m`` tokens); BLOCK_K is capped at the group when the launch runs."""
    mb = m_bucket(p.m)
    if mb <= 32:
        tiles = [(16, 64, 128, 4, 4), (16, 128, 128, 4, 3), (16, 64, 256, 4, 3), (16, 32, 128, 4, 4)]
    elif mb <= 512:
        tiles = [(32, 64, 128, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (16, 64, 128, 4, 4)]
    else:
        tiles = [(64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 256, 64, 8, 3)]
    if exhaustive:
        tiles += [(bm, bn, bk, w, s + 1) for bm, bn, bk, w, s in tiles]
    return [_config(*t) for t in tiles]


def _supports(p: Problem) -> tuple[bool, str]:
    return True, ""


def run_fused_moe(
    cfg: dict, x: Tensor, weights: Tensor, experts: Tensor, w13: Tensor, w13_scale, w13_zeros, w13_group_scale,
    w2: Tensor, w2_scale, w2_zeros, w2_group_scale, weight_bits: int, act_bits: int, group_size: int, tile_major: bool = False,
) -> Tensor:  # fmt: skip
    """``fused_moe`` after routing (``weights`` float32 / ``experts`` [M, top_k]) with one config
    (arguments already checked). Any device Triton runs on: CUDA, or the interpreter on CPU."""
    m, top_k = experts.shape
    pairs = m * top_k
    sorted_ids, expert_ids, total = align_block_size(experts, w13.shape[0], cfg["BLOCK_M"])
    x = x.contiguous()
    weights = weights.contiguous()
    if act_bits == 8:
        from ..activation.quant_kernels import quant_per_token_int8_triton

        a1, a1_scale = quant_per_token_int8_triton(x)
    else:
        a1, a1_scale = x, None
    route = (sorted_ids, expert_ids, total, pairs)
    h = moe_gemm(a1, a1_scale, w13, w13_scale, w13_zeros, w13_group_scale, None, *route, fc1_row_div(x, experts), True,
                 weight_bits, act_bits, group_size, cfg, x.dtype, tile_major)  # fmt: skip
    if act_bits == 8:
        a2, a2_scale = quant_per_token_int8_triton(h)
    else:
        a2, a2_scale = h, None
    y = moe_gemm(a2, a2_scale, w2, w2_scale, w2_zeros, w2_group_scale, weights, *route, 1, False,
                 weight_bits, act_bits, group_size, cfg, x.dtype, tile_major)  # fmt: skip
    return moe_sum(y, top_k, x.dtype)


def _run(cfg, *args):
    return run_fused_moe(cfg, *args)


GROUPED = KernelFamily("grouped", "moe/grouped_gemm", _supports, grouped_configs, _run)
FAMILIES = (GROUPED, gemv.FAMILY, gemv_words.FAMILY, grouped_words.FAMILY)
REGISTRY = Registry(OP, FAMILIES)


def problem(m: int, i: int, h: int, weight_bits: int, group_size: int, dtype: torch.dtype | None = None, act_bits: int = 16) -> Problem:
    """The registry's view of a call: ``m`` tokens, ``n`` = I (fc1's outputs), ``k`` = H."""
    return Problem(m, i, h, weight_bits, group_size, dtype, act_bits=act_bits)


def candidate_configs(m: int, i: int, h: int, weight_bits: int, group_size: int, dtype: torch.dtype | None = None, act_bits: int = 16) -> list[dict]:
    return REGISTRY.candidates(problem(m, i, h, weight_bits, group_size, dtype, act_bits))


def config_key(m, e, i, h, top_k, weight_bits, act_bits, group_size, dtype, tile_major: bool = False) -> tuple:
    """The picks' key: tile-major codes get their own (the best config differs: on an H100 at M = 8
    ``grouped_words`` 277.7 against ``gemv_words`` 355.2 us tile-major, 343.9 against 334.3 natural)."""
    key = (m_bucket(m), e, i, h, top_k, weight_bits, act_bits, group_size, str(dtype).removeprefix("torch."))
    return (*key, TILE_MAJOR) if tile_major else key


_layout_keys: dict[tuple, tuple] = {}


def layout_key(key: tuple, gpu: str) -> tuple:
    """``key`` if it is stored (user cache or shipped table) or is not a tile-major key; else the natural
    layout's key of the same shape where that one is stored: its pick runs on tile-major codes too (every
    family reads both), so a shape tuned only for natural codes is not measured again. Once per key and process."""
    out = _layout_keys.get((key, gpu))
    if out is None:
        out = key
        if key[-1] == TILE_MAJOR and lookup(OP, key, gpu) is None and lookup(OP, key[:-1], gpu) is not None:
            out = key[:-1]
        _layout_keys[(key, gpu)] = out
    return out


def fused_moe_triton(
    x, router_logits, top_k, renormalize, w13, w13_scale, w13_zeros, w13_group_scale, w2, w2_scale, w2_zeros, w2_group_scale,
    weight_bits, act_bits, group_size, w13_act_perm=None, tile_major=False,
) -> Tensor:  # fmt: skip
    """Route, pick the config for this shape (cache / shipped / one measurement) and run it. With
    ``w13_act_perm`` the families get one activation row per pair, gathered in its expert's order;
    ``tile_major``: the weight-only codes are tile-major (ops/moe/tile_major.py), which every family reads."""
    m, h = x.shape
    e, two_i = w13.shape[:2]
    weights, experts = topk_routing_triton(router_logits, top_k, renormalize)
    args = (
        x if w13_act_perm is None else pair_rows(x, experts, w13_act_perm),
        weights,
        experts,
        w13,
        w13_scale,
        w13_zeros,
        w13_group_scale,
        w2,
        w2_scale,
        w2_zeros,
        w2_group_scale,
        weight_bits,
        act_bits,
        group_size,
        tile_major,
    )
    key = config_key(m, e, two_i // 2, h, top_k, weight_bits, act_bits, group_size, x.dtype, tile_major)
    if tile_major:
        key = layout_key(key, device_name(x.device))
    cands = lambda: REGISTRY.offered(problem(m, two_i // 2, h, weight_bits, group_size, x.dtype, act_bits))  # noqa: E731 - built only on a cache miss
    with device_guard(x):  # Triton launches on the current device: x's, for a measurement too (a model spread over GPUs)
        cfg = pick_config(OP, key, cands, lambda c: REGISTRY.run(c, *args), x.device, REGISTRY.usable)
        return REGISTRY.run(cfg, *args)
