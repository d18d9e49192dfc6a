"""Tile-major expert codes (ops/moe/tile_major.py): the reordering and its inverse, and every
``fused_moe`` family reading them (``tile_major=True``) against the same kernel on the natural
layout: the same loads in the same order, so the same bits. The op's reference and its
argument checks. CPU: the Triton interpreter; GPU: every family at decode and prefill M."""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.moe import gemv, gemv_words, grouped_words
from qfuse.ops.moe.dispatch import run_fused_moe
from qfuse.ops.moe.routing import topk_routing
from qfuse.ops.moe.tile_major import from_tile_major, to_tile_major, with_codes
from tests.ops.moe.test_grouped_gemm import _gpu_moe

# (family's run, config) at the interpreter's small tiles
RUNS = {
    "grouped": (run_fused_moe, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64}),
    "gemv": (gemv.run_moe_gemv, {"BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 2}),
    "gemv_words": (gemv_words.run_moe_gemv_words, {"BLOCK_N": 32, "BLOCK_W": 32, "SPLIT_K": 2, "num_warps": 4}),
    "gemv_words_hfma2": (gemv_words.run_moe_gemv_words, {"BLOCK_N": 32, "BLOCK_W": 32, "SPLIT_K": 1, "HFMA2": 2, "FUSED_ACT": True}),
    "grouped_words": (grouped_words.run_moe_grouped_words, {"BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 2, "num_warps": 4}),
}


def test_round_trip_and_layout():
    codes = torch.randint(0, 256, (3, 128, 192), dtype=torch.uint8)
    tiled = to_tile_major(codes)
    assert tiled.shape == codes.shape and tiled.dtype == codes.dtype
    assert torch.equal(from_tile_major(tiled), codes)
    # byte (r, b) of a matrix at (r // 64) * 64 * B + (b // 64) * 4096 + (r % 64) * 64 + b % 64
    flat = tiled[1].reshape(-1)
    for r, b in ((0, 0), (5, 63), (70, 64), (127, 191), (64, 130)):
        assert flat[(r // 64) * 64 * 192 + (b // 64) * 4096 + (r % 64) * 64 + b % 64] == codes[1, r, b]
    words = codes.view(torch.int32)  # the same bytes as int32 words: the same reordering
    assert torch.equal(to_tile_major(words).view(torch.uint8), tiled)
    weights = with_codes((codes, "s13", None, None, codes + 1, "s2", None, None), to_tile_major)  # the op's weight arguments
    assert torch.equal(weights[0], tiled) and torch.equal(weights[4], to_tile_major(codes + 1))
    assert weights[1:4] == ("s13", None, None) and weights[5:] == ("s2", None, None)


@pytest.mark.parametrize("shape", [(100, 64), (128, 96)])
def test_refuses_partial_tiles(shape):
    with pytest.raises(ValueError, match="multiple|% 64"):
        to_tile_major(torch.zeros(shape, dtype=torch.uint8))


# each family with the formats it takes (grouped_words: 4-bit; HFMA2: 4-bit, bf16)
PAIRS = [(f, fmt) for f in ("grouped", "gemv", "gemv_words") for fmt in ("W4A16_G128", "W4A16_ASYM_CH", "W8A16")] + [
    ("gemv_words_hfma2", "W4A16_G128"), ("grouped_words", "W4A16_G128"), ("grouped_words", "W4A16_ASYM_CH"),
]  # fmt: skip


@pytest.mark.parametrize("family,fmt", PAIRS, ids=[f"{f}-{fmt}" for f, fmt in PAIRS])
def test_every_family_reads_tile_major_bit_equal(family, fmt):
    run, cfg = RUNS[family]
    m = 7 if family.startswith("grouped") else 2  # the GEMV families run a program per (token, expert) pair
    h, i, e, top_k = 256, 128, 4, 2
    x, logits, args = _gpu_moe(fmt, m, h, i, e, torch.bfloat16, device="cpu")
    weights, experts = topk_routing(logits, top_k, True)
    natural, tiled = run(cfg, x, weights, experts, *args), with_codes(args, to_tile_major)
    assert torch.equal(run(cfg, x, weights, experts, *tiled, True), natural)
    assert not torch.equal(run(cfg, x, weights, experts, *tiled), natural)  # the layouts differ


def test_op_reference_and_checks():
    x, logits, args = _gpu_moe("W4A16_G128", 5, 256, 128, 4, torch.bfloat16, device="cpu")
    natural = torch.ops.qfuse.fused_moe(x, logits, 2, True, *args)
    assert torch.equal(torch.ops.qfuse.fused_moe(x, logits, 2, True, *with_codes(args, to_tile_major), None, True), natural)
    x8, logits8, args8 = _gpu_moe("W8A8", 5, 256, 128, 4, torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="weight-only"):
        torch.ops.qfuse.fused_moe(x8, logits8, 2, True, *args8, None, True)
    x, logits, args = _gpu_moe("W8A16", 5, 128, 96, 4, torch.bfloat16, device="cpu")  # w2's 96 bytes per row
    with pytest.raises(ValueError, match="multiples of 64"):
        torch.ops.qfuse.fused_moe(x, logits, 2, True, *args, None, True)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["W4A16_G128", "W4A16_ASYM_G128", "W8A16"])
@pytest.mark.parametrize("m", [1, 7, 16, 64, 257])
def test_gpu_tile_major_matches_reference(fmt, m):
    """Through the op (each M's pick), then every offered config of every family at that M, on
    tile-major codes: within the families' tolerance of the reference. Not bit-equal to the natural
    layout on the GPU: the loads' contiguity changes the register layout Triton gives a tile, and
    with it the float32 summation order (the word GEMV's float32 form, g128, M = 7 / 16, H100)."""
    from qfuse.ops.kernel_family import Problem
    from qfuse.ops.moe.dispatch import REGISTRY
    from qfuse.ops.moe.fused_moe import fused_moe_ref
    from tests.ops.moe.test_grouped_gemm import assert_close_to_ref

    h, i, e, top_k = 1024, 512, 8, 2
    x, logits, args = _gpu_moe(fmt, m, h, i, e, torch.bfloat16)
    ref, tiled = fused_moe_ref(x, logits, top_k, True, *args), with_codes(args, to_tile_major)
    assert_close_to_ref(torch.ops.qfuse.fused_moe(x, logits, top_k, True, *tiled, None, True), ref, False)
    weights, experts = topk_routing(logits, top_k, True)
    for cfg in REGISTRY.offered(Problem(m, i, h, args[-3], args[-1], x.dtype, act_bits=16)):
        assert_close_to_ref(REGISTRY.run(cfg, x, weights, experts, *tiled, True), ref, False)
