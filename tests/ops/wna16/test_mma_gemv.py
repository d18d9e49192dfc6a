"""The tensor-core GEMV of 4-bit ``qfuse::wna16_gemm`` (ops/wna16/mma_gemv.py) against the
reference kernel ``wna16_gemm_ref``.

CPU (CI): under the Triton interpreter, which has no warps, the launcher runs the same index
arithmetic with element ``e`` as lane ``e % 32`` and the MMA as a sum over each lane group.
GPU (``pytest -m gpu``): every config at the real decode shapes, both dtypes, with and
without zero points: there the inline PTX (``mma.sync``, the lane ids) runs. Tolerance:
``assert_close_to_ref`` of tests/ops/test_wna16_gemm_kernel.py.
"""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.wna16.dispatch import candidate_configs, is_experimental, run_config, usable_configs
from qfuse.ops.wna16.mma_gemv import mma_gemv_supported, w4a16_mma_gemv
from tests.ops.test_wna16_gemm_kernel import _in_shard, assert_close_to_ref, make_problem


def _interpreter_cases() -> list:
    """Every (m, split_k, row_tiles, warps, steps) config x group size, each in one activation
    dtype, alternating over that grid so that every config and every group size runs in both
    dtypes. The dtype's code (the bf16 / fp16 decode of the activation pairs, the dtype of the
    scale and bias loads and of the stores) is per element and the same in every config and
    group: the other dtype of a (config, group) pair adds no path; it runs with ``pytest -m slow``
    (the full product)."""
    configs = [(1, 1, 1, 4, 1), (2, 2, 2, 2, 2), (1, 3, 1, 1, 1), (1, 2, 2, 1, 4)]
    cases = []
    for i, cfg in enumerate(configs):
        for j, group_size in enumerate([-1, 128, 256]):
            for d, (name, dtype) in enumerate([("bf16", torch.bfloat16), ("fp16", torch.float16)]):
                marks = () if d == (i + j) % 2 else (pytest.mark.slow,)
                cases.append(pytest.param(dtype, group_size, *cfg, marks=marks, id="-".join(map(str, (name, group_size, *cfg)))))
    return cases


@pytest.mark.parametrize("dtype,group_size,m,split_k,row_tiles,warps,steps", _interpreter_cases())
def test_mma_gemv_interpreter(dtype, group_size, m, split_k, row_tiles, warps, steps):
    # N = one row tile (16 * row_tiles * warps rows) + 8: a partial last row tile (its rows g + 8
    # past N wrap and are masked; 72 at 64-row tiles); K = 768 = 6 steps of 128
    asym = split_k != 1
    n = 16 * row_tiles * warps + 8
    x, qw, s, z, b = make_problem(m, n, 768, 4, group_size, dtype, asym=asym, bias=not asym)
    cfg = {"ROW_TILES": row_tiles, "STEPS": steps, "SPLIT_K": split_k, "num_warps": warps}
    assert_close_to_ref(w4a16_mma_gemv(x, qw, s, z, b, group_size, cfg), x, qw, s, z, b, 4, group_size)


def test_mma_gemv_tolerance_catches_a_nibble_swap():
    x, qw, s, z, b = make_problem(1, 32, 256, 4, 128, torch.bfloat16, asym=True, bias=False)
    out = w4a16_mma_gemv(x, ((qw >> 4) | (qw << 4)).contiguous(), s, z, b, 128, {"ROW_TILES": 1, "SPLIT_K": 1, "num_warps": 2})
    with pytest.raises(AssertionError):
        assert_close_to_ref(out, x, qw, s, z, b, 4, 128)


def test_mma_gemv_activations_at_an_odd_element():
    x, qw, s, z, b = make_problem(1, 32, 256, 4, -1, torch.float16, asym=False, bias=True)
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)
    shifted.copy_(x)
    assert shifted.data_ptr() % 4
    out = w4a16_mma_gemv(shifted, qw, s, z, b, -1, {"ROW_TILES": 1, "SPLIT_K": 1, "num_warps": 2})
    assert_close_to_ref(out, x, qw, s, z, b, 4, -1)


def test_mma_gemv_supported_and_rejects():
    assert mma_gemv_supported(4096, 128) and mma_gemv_supported(14336, -1) and mma_gemv_supported(4096, 256)
    assert not mma_gemv_supported(4096, 64) and not mma_gemv_supported(4000, -1)
    x, qw, s, z, b = make_problem(1, 16, 256, 4, 64, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="K % 128 == 0"):
        w4a16_mma_gemv(x, qw, s, z, b, 64, {"ROW_TILES": 1, "SPLIT_K": 1})


def test_mma_gemv_is_opt_in(monkeypatch):
    cands = [c for c in candidate_configs(1, 4096, 4096, 4, 128) if c["kernel"] == "mma_gemv"]
    assert cands and all(is_experimental(c, 4) for c in cands)
    assert not any(c["kernel"] == "mma_gemv" for c in candidate_configs(16, 4096, 4096, 4, 128))  # decode M only
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    assert not any(c["kernel"] == "mma_gemv" for c in usable_configs(1, 4096, 4096, 4, 128))
    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "1")
    assert any(c["kernel"] == "mma_gemv" for c in usable_configs(1, 4096, 4096, 4, 128))
    x, qw, s, z, b = make_problem(2, 40, 512, 4, 128, torch.bfloat16, asym=True, bias=True)
    assert_close_to_ref(run_config(cands[0], x, qw, s, z, b, 4, 128), x, qw, s, z, b, 4, 128)


SHAPES = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192), (1000, 2944))


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,group_size,dtype", _in_shard([(n, k, g, d) for n, k in SHAPES for g in (128, -1) for d in ("bfloat16", "float16")]))
def test_gpu_every_mma_gemv_config(n, k, group_size, dtype):
    for asym in (False, True):
        for m in (1, 2):
            x, qw, s, z, b = make_problem(m, n, k, 4, group_size, getattr(torch, dtype), asym, bias=asym, device="cuda")
            cands = [c for c in candidate_configs(m, n, k, 4, group_size) if c["kernel"] == "mma_gemv"]
            assert cands
            for cfg in cands + [{**cands[0], "STEPS": 1}, {**cands[0], "STEPS": 4}]:
                assert_close_to_ref(run_config(cfg, x, qw, s, z, b, 4, group_size), x, qw, s, z, b, 4, group_size)
