"""The word-GEMV family of ``qfuse::fused_moe`` (ops/moe/gemv_words.py) against the op's reference,
under the Triton interpreter (CPU, CI): both weight widths, symmetric / zero points, per channel
and groups, the float32 and packed-bf16 (``HFMA2``) forms, K splits, decode M, idle experts and
all tokens to one expert. Tolerance as in test_grouped_gemm.py."""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.kernel_family import Problem
from qfuse.ops.moe.dispatch import REGISTRY, candidate_configs
from qfuse.ops.moe.fused_moe import fused_moe_ref
from qfuse.ops.moe.gemv_words import FAMILY, configs, run_moe_gemv_words
from qfuse.ops.moe.routing import topk_routing
from tests.ops.moe.test_fused_moe import make_moe
from tests.ops.moe.test_grouped_gemm import assert_close_to_ref, assert_replay_equals_eager


def run_words(x, logits, top_k, renormalize, args, cfg):
    weights, experts = topk_routing(logits, top_k, renormalize)
    return run_moe_gemv_words({"kernel": "gemv_words", "num_warps": 4, **cfg}, x, weights, experts, *args)


# (format, M, dtype, H, I, E, top_k, config)
CASES = [
    ("W4A16_G32", 1, torch.bfloat16, 64, 32, 8, 2, {"BLOCK_N": 16, "BLOCK_W": 256, "SPLIT_K": 1, "HFMA2": 2}),  # six experts idle
    ("W4A16_G32", 7, torch.bfloat16, 128, 64, 4, 2, {"BLOCK_N": 32, "BLOCK_W": 128, "SPLIT_K": 2, "HFMA2": 2}),  # tiles of 4 groups, split
    ("W4A16_ASYM_CH", 2, torch.bfloat16, 64, 96, 4, 3, {"BLOCK_N": 32, "BLOCK_W": 4, "SPLIT_K": 1, "HFMA2": 2}),  # zero points, per channel
    ("W4A16_ASYM_CH", 16, torch.float16, 96, 64, 5, 2, {"BLOCK_N": 64, "BLOCK_W": 4, "SPLIT_K": 3}),  # float32 form, partial row tiles
    ("W4A16_G32", 1, torch.float16, 64, 32, 4, 1, {"BLOCK_N": 16, "BLOCK_W": 8, "SPLIT_K": 2}),
    ("W8A16", 1, torch.bfloat16, 64, 48, 4, 2, {"BLOCK_N": 32, "BLOCK_W": 8, "SPLIT_K": 2}),
    ("W8A16_ASYM_G32", 7, torch.float16, 64, 32, 4, 2, {"BLOCK_N": 16, "BLOCK_W": 16, "SPLIT_K": 1}),  # a tile of two groups
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-M{c[1]}-{'hfma2' if c[7].get('HFMA2') else 'fp32'}" for c in CASES])
def test_kernel_matches_reference(case):
    fmt, m, dtype, h, i, e, top_k, cfg = case
    x, logits, args = make_moe(fmt, m, h, i, e, dtype)
    out = run_words(x, logits, top_k, m != 2, args, cfg)
    assert_close_to_ref(out, fused_moe_ref(x, logits, top_k, m != 2, *args), False)


def test_all_tokens_to_one_expert():
    x, logits, args = make_moe("W4A16_G32", 7, 64, 32, 4, torch.bfloat16)
    logits[:, 3] = 30.0
    for top_k in (1, 2):
        out = run_words(x, logits, top_k, True, args, {"BLOCK_N": 16, "BLOCK_W": 8, "SPLIT_K": 2, "HFMA2": 2})
        assert_close_to_ref(out, fused_moe_ref(x, logits, top_k, True, *args), False)


def test_fp32_accumulate_runs_an_hfma2_pick_in_float32(monkeypatch):
    x, logits, args = make_moe("W4A16_G32", 2, 64, 32, 4, torch.bfloat16)
    cfg = {"BLOCK_N": 16, "BLOCK_W": 8, "SPLIT_K": 1}
    monkeypatch.setenv("QFUSE_FP32_ACCUMULATE", "1")
    assert torch.equal(run_words(x, logits, 2, True, args, {**cfg, "HFMA2": 2}), run_words(x, logits, 2, True, args, cfg))


def test_offered_by_default_and_hfma2_only_with_bf16_sums(monkeypatch):
    p = Problem(1, 14336, 4096, 4, 128, torch.bfloat16, act_bits=16)
    assert FAMILY.supports(p)[0] and FAMILY.default and not FAMILY.why_opt_in
    assert all("HFMA2" in c for c in configs(p, False)[:4])
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    assert "gemv_words" in {c["kernel"] for c in REGISTRY.offered(p)}
    monkeypatch.setenv("QFUSE_FP32_ACCUMULATE", "1")
    assert [c for c in configs(p, False) if "HFMA2" in c] == []
    for bits, act_bits, m, ok in [(8, 16, 16, True), (4, 16, 17, False), (8, 8, 1, False), (16, 16, 1, False)]:
        assert FAMILY.supports(Problem(m, 14336, 4096, bits, 128, torch.bfloat16, act_bits=act_bits))[0] == ok
    assert not FAMILY.supports(Problem(1, 14336, 4100, 4, -1, torch.bfloat16, act_bits=16))[0]  # H not whole words
    assert {c["kernel"] for c in candidate_configs(4, 14336, 4096, 8, -1, torch.bfloat16, act_bits=8)} == {"grouped"}


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["W8A16", "W4A16_G128", "W4A16_ASYM_G128"])
@pytest.mark.parametrize("m", [1, 2, 7, 16])
def test_gpu_every_config(fmt, m):
    """Every config of the family (HFMA2 forms at bf16) at an E 8 top-2 shape (H 1024, I 512)."""
    from tests.ops.moe.test_fused_moe import FORMATS
    from tests.ops.moe.test_grouped_gemm import _gpu_moe

    h, i, e, top_k = 1024, 512, 8, 2
    dtype = torch.bfloat16 if m % 2 else torch.float16
    x, logits, args = _gpu_moe(fmt, m, h, i, e, dtype)
    ref = fused_moe_ref(x, logits, top_k, True, *args)
    bits = FORMATS[fmt.replace("G128", "G32").replace("W4A16_ASYM_G32", "W4A16_ASYM_CH")][0]
    for cfg in configs(Problem(m, i, h, bits, args[-1], dtype, act_bits=16), exhaustive=False):
        assert_close_to_ref(run_words(x, logits, top_k, True, args, cfg), ref, False)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    from tests.ops.moe.test_grouped_gemm import _gpu_moe

    x, logits, args = _gpu_moe("W4A16_G128", 4, 1024, 512, 8, torch.bfloat16)
    cfg = {"BLOCK_N": 16, "BLOCK_W": 256, "SPLIT_K": 4, "HFMA2": 2}
    assert_replay_equals_eager(lambda: run_words(x, logits, 2, True, args, cfg))


@pytest.mark.parametrize("split", [1, 2])
def test_fused_act_matches_the_torch_epilogue(split):
    """FUSED_ACT: SiLU-and-mul and the weighted top-k sum as one launch each, against the
    torch kernels they replace: within one rounding of the output dtype, and the reference's tolerance."""
    x, logits, args = make_moe("W4A16_G32", 5, 64, 32, 4, torch.bfloat16)
    cfg = {"BLOCK_N": 16, "BLOCK_W": 8, "SPLIT_K": split, "HFMA2": 2}
    fused = run_words(x, logits, 2, True, args, {**cfg, "FUSED_ACT": True})
    plain = run_words(x, logits, 2, True, args, cfg)
    torch.testing.assert_close(fused, plain, rtol=2**-7, atol=0)
    assert_close_to_ref(fused, fused_moe_ref(x, logits, 2, True, *args), False)
    assert not FAMILY.opt_in_reason(cfg) and not FAMILY.opt_in_reason({**cfg, "FUSED_ACT": True})


def test_silu_and_mul_rows_and_the_weighted_sum():
    from qfuse.ops.moe.fused_moe import silu_and_mul
    from qfuse.ops.moe.grouped_gemm import moe_sum, silu_and_mul_rows

    gen = torch.Generator().manual_seed(3)
    gu = torch.randn(6, 2 * 40, generator=gen) * 4
    torch.testing.assert_close(silu_and_mul_rows(gu, torch.bfloat16), silu_and_mul(gu[:, :40], gu[:, 40:]).to(torch.bfloat16), rtol=2**-8, atol=0)
    y, w = torch.randn(6, 40, generator=gen), torch.rand(6, generator=gen)
    assert torch.equal(moe_sum(y, 3, torch.float32, w), moe_sum(y * w[:, None], 3, torch.float32))
    ys = torch.randn(2, 6, 40, generator=gen)  # K-split slices: each weighted
    assert torch.equal(moe_sum(ys, 2, torch.bfloat16, w), moe_sum(ys * w[None, :, None], 2, torch.bfloat16))
