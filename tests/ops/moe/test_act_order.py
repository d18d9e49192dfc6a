"""Act-order experts (``fused_moe``'s ``w13_act_perm``) in every kernel family, under the Triton
interpreter (CPU, CI): each family runs fc1 on one gathered activation row per pair
(ops/moe/align.py ``pair_rows``, row divisor 1) and must match the op's reference; the entry
point gathers and picks a config itself. On the GPU: every family at decode M."""

from __future__ import annotations

import pytest
import torch

from qfuse.bench.moe import random_act_perm
from qfuse.ops.moe.align import pair_rows
from qfuse.ops.moe.dispatch import REGISTRY, candidate_configs, fused_moe_triton
from qfuse.ops.moe.fused_moe import fused_moe_ref
from qfuse.ops.moe.routing import topk_routing
from tests.ops.moe.test_grouped_gemm import _gpu_moe, assert_close_to_ref

# (format, M, H, I, E, top_k): 4-bit group 128 reaches all four families at decode M
CASES = [("W4A16_G128", 1, 128, 128, 4, 2), ("W4A16_ASYM_G128", 7, 128, 256, 5, 2), ("W8A16", 16, 128, 128, 4, 3)]


def _first_config_of_each_family(m, h, i, bits, group, dtype):
    first = {}
    for cfg in candidate_configs(m, i, h, bits, group, dtype):
        first.setdefault(cfg["kernel"], cfg)
    return first


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-M{c[1]}" for c in CASES])
def test_every_family_reads_pair_rows(case):
    fmt, m, h, i, e, top_k = case
    x, logits, args = _gpu_moe(fmt, m, h, i, e, torch.bfloat16, device="cpu")
    perm = random_act_perm(e, h, m)
    ref = fused_moe_ref(x, logits, top_k, True, *args, perm)
    weights, experts = topk_routing(logits, top_k, True)
    bits, group = args[-3], args[-1]
    families = _first_config_of_each_family(m, h, i, bits, group, x.dtype)
    assert {"grouped", "gemv", "gemv_words"} <= set(families) and ("grouped_words" in families) == (bits == 4)
    for kernel, cfg in families.items():
        out = REGISTRY.run(cfg, pair_rows(x, experts, perm), weights, experts, *args)
        try:
            assert_close_to_ref(out, ref, False)
        except AssertionError as err:
            raise AssertionError(f"{kernel} {cfg}: {err}") from None


def test_entry_point_gathers_the_pair_rows():
    x, logits, args = _gpu_moe("W4A16_G128", 3, 128, 128, 4, torch.bfloat16, device="cpu")
    perm = random_act_perm(4, 128)
    assert_close_to_ref(fused_moe_triton(x, logits, 2, True, *args, perm), fused_moe_ref(x, logits, 2, True, *args, perm), False)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["W4A16_G128", "W4A16_ASYM_G128", "W8A16"])
@pytest.mark.parametrize("m", [1, 2, 7, 16, 64, 257])
def test_gpu_act_order(fmt, m):
    h, i, e, top_k = 1024, 512, 8, 2
    x, logits, args = _gpu_moe(fmt, m, h, i, e, torch.bfloat16)
    perm = random_act_perm(e, h, m).cuda()
    ref = fused_moe_ref(x, logits, top_k, True, *args, perm)
    assert_close_to_ref(torch.ops.qfuse.fused_moe(x, logits, top_k, True, *args, perm), ref, False)
    weights, experts = topk_routing(logits, top_k, True)
    for cfg in _first_config_of_each_family(m, h, i, args[-3], args[-1], x.dtype).values():
        assert_close_to_ref(REGISTRY.run(cfg, pair_rows(x, experts, perm), weights, experts, *args), ref, False)
