"""The decode GEMV family of ``qfuse::fused_moe`` (ops/moe/gemv.py) against the op's reference.

CPU (CI): the Triton interpreter on small shapes. GPU (``pytest -m gpu``): every offered and
exhaustive config at the Mixtral and fine-grained expert shapes, decode M.
Tolerance as in test_grouped_gemm.py (4 eps of the output's largest magnitude): the GEMV keeps
the dequantized weight in float32, one rounding away from the reference's activation-dtype
weight, and sums in another order.
"""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.kernel_family import Problem
from qfuse.ops.moe.dispatch import REGISTRY, candidate_configs
from qfuse.ops.moe.fused_moe import fused_moe_ref
from qfuse.ops.moe.gemv import FAMILY, gemv_configs, run_moe_gemv
from qfuse.ops.moe.grouped_gemm import moe_sum
from qfuse.ops.moe.routing import topk_routing
from tests.ops.moe.test_fused_moe import FORMATS, make_moe
from tests.ops.moe.test_grouped_gemm import _gpu_moe, assert_close_to_ref, assert_replay_equals_eager


def run_gemv(x, logits, top_k, renormalize, args, cfg):
    weights, experts = topk_routing(logits, top_k, renormalize)
    return run_moe_gemv({"kernel": "gemv", **cfg}, x, weights, experts, *args)


# ---------------------------------------------------------------- CPU: Triton interpreter

# (format, M, dtype, H, I, E, top_k, config): the decode Ms, K tails, splits past K
CASES = [
    ("W8A16", 1, torch.float16, 64, 32, 8, 2, {"BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 1}),  # six of eight experts idle
    ("W8A16_ASYM_G32", 2, torch.bfloat16, 64, 32, 4, 1, {"BLOCK_N": 8, "BLOCK_K": 64, "SPLIT_K": 2}),  # BLOCK_K capped at the group
    ("W4A16_G32", 16, torch.float16, 96, 64, 4, 3, {"BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 3}),
    ("W4A16_ASYM_CH", 7, torch.bfloat16, 72, 40, 5, 2, {"BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 4}),  # K tails (72, 40), 3rd split past K
    ("W4A16_ASYM_CH", 1, torch.float16, 64, 48, 4, 2, {"BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 1}),  # one partial N tile
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-M{c[1]}" for c in CASES])
def test_kernel_matches_reference(case):
    fmt, m, dtype, h, i, e, top_k, cfg = case
    x, logits, args = make_moe(fmt, m, h, i, e, dtype)
    out = run_gemv(x, logits, top_k, m != 2, args, cfg)
    assert_close_to_ref(out, fused_moe_ref(x, logits, top_k, m != 2, *args), False)


def test_all_tokens_to_one_expert():
    x, logits, args = make_moe("W4A16_G32", 7, 64, 32, 4, torch.bfloat16)
    logits[:, 2] = 30.0
    for top_k in (1, 2):
        out = run_gemv(x, logits, top_k, True, args, {"BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 2})
        assert_close_to_ref(out, fused_moe_ref(x, logits, top_k, True, *args), False)


def test_split_sum_order():
    """moe_sum over [S, P, H]: j outer, splits inner, so S = 1 is the plain top-k sum bit for bit."""
    y = torch.randn(3, 4 * 2, 40)
    out = moe_sum(y, 2, torch.float32)
    ref = torch.stack([(y[0, 2 * t] + y[1, 2 * t] + y[2, 2 * t]) + y[0, 2 * t + 1] + y[1, 2 * t + 1] + y[2, 2 * t + 1] for t in range(4)])
    assert torch.equal(out, ref)
    assert torch.equal(moe_sum(y[:1], 2, torch.bfloat16), moe_sum(y[0], 2, torch.bfloat16))


def test_offered_only_for_weight_only_decode():
    for bits, act_bits, m, ok in [(4, 16, 1, True), (8, 16, 16, True), (4, 16, 17, False), (8, 8, 1, False), (4, 8, 1, False), (16, 16, 1, False)]:
        supported, reason = FAMILY.supports(Problem(m, 14336, 4096, bits, 128, torch.bfloat16, act_bits=act_bits))
        assert supported == ok and (ok or reason), (bits, act_bits, m)
    fams = {c["kernel"] for c in candidate_configs(4, 14336, 4096, 4, 128, torch.bfloat16)}
    assert fams == {"grouped", "gemv", "gemv_words", "grouped_words"}  # every family's configs
    assert {c["kernel"] for c in candidate_configs(4, 14336, 4096, 8, -1, torch.bfloat16, act_bits=8)} == {"grouped"}
    assert {c["kernel"] for c in candidate_configs(64, 14336, 4096, 4, 128, torch.bfloat16)} == {"grouped", "grouped_words"}
    assert REGISTRY.family("gemv") is FAMILY


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["W8A16", "W4A16_G128", "W4A16_ASYM_G128"])
@pytest.mark.parametrize("m", [1, 2, 7, 16])
def test_gpu_every_config(fmt, m):
    """Every offered GEMV config at an E 8 top-2 shape with K tails of no tile (H 1024, I 512)."""
    h, i, e, top_k = 1024, 512, 8, 2
    dtype = torch.bfloat16 if m % 2 else torch.float16
    x, logits, args = _gpu_moe(fmt, m, h, i, e, dtype)
    ref = fused_moe_ref(x, logits, top_k, True, *args)
    p = Problem(m, i, h, FORMATS[fmt.replace("G128", "G32").replace("W4A16_ASYM_G32", "W4A16_ASYM_CH")][0], args[-1], dtype, act_bits=16)
    for cfg in gemv_configs(p, exhaustive=False):
        assert_close_to_ref(run_gemv(x, logits, top_k, True, args, cfg), ref, False)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    x, logits, args = _gpu_moe("W4A16_G128", 4, 1024, 512, 8, torch.bfloat16)
    cfg = {"BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 4}
    assert_replay_equals_eager(lambda: run_gemv(x, logits, 2, True, args, cfg))
