"""ops/wna16/tiled_planes.py against the reference kernel of ``qfuse::wna16_gemm``.

CPU (CI): the launcher under the Triton interpreter, where the nibble planes come from
integer ops (the interpreter cannot run inline PTX), and the kernel compiled for sm_90 with
the PTX (tests/ops/_compile_sm90.py, a subprocess: a bad asm operand list aborts the
compiling process; on the H200 it once did, under triton 3.6). GPU (``pytest -m gpu``): the PTX
planes, every config shape the dispatcher offers, extreme codes, both dtypes. Tolerance:
tests/ops/test_wna16_gemm_kernel.py's (the kernel skips the weight's rounding to the
activation dtype and sums in another order).
"""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.wna16.tiled_planes import w4a16_tiled_planes
from tests.ops._sm90_scripts import run_sm90_script
from tests.ops.test_wna16_gemm_kernel import assert_close_to_ref, make_problem

CFGS = [
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 1},
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 3},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 2, "GROUP_M": 2},
]


def _codes_at_the_extremes(n, k, group_size):
    """Every code 0 or 15 and zero points at the other end: |u - z| = 15 in every nibble slot."""
    codes = torch.randint(0, 2, (n, k), dtype=torch.uint8) * 15
    qw = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    z = (15 - codes[:, ::group_size]).contiguous()
    return qw, z


# ---------------------------------------------------------------- CPU: Triton interpreter


@pytest.mark.parametrize("group_size", [-1, 32, 64])
@pytest.mark.parametrize("cfg", range(len(CFGS)))
@pytest.mark.parametrize("swap_ab", [False, True])
def test_interpreter(group_size, cfg, swap_ab):
    i = 2 * cfg + (group_size > 0) + swap_ab
    dtype = (torch.float16, torch.bfloat16)[i % 2]
    x, qw, s, z, b = make_problem(7, 40, 128, 4, group_size, dtype, asym=(cfg + swap_ab) % 2 == 1, bias=i % 3 != 1)
    out = w4a16_tiled_planes(x, qw, s, z, b, group_size, {**CFGS[cfg], "SWAP_AB": swap_ab})
    assert_close_to_ref(out, x, qw, s, z, b, 4, group_size)


@pytest.mark.parametrize("group_size,split_k", [(-1, 1), (128, 2), (-1, 3)])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_interpreter_four_planes(group_size, split_k, swap_ab):
    dtype = torch.bfloat16 if swap_ab else torch.float16
    m = 3 if split_k == 3 else 17  # split 3 of K = 384: the last split ends in a masked tile
    x, qw, s, z, b = make_problem(m, 24, 384 if split_k == 3 else 256, 4, group_size, dtype, asym=split_k != 2, bias=swap_ab)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64 if split_k == 3 else 128, "SPLIT_K": split_k, "SWAP_AB": swap_ab, "PLANES": 4}
    assert_close_to_ref(w4a16_tiled_planes(x, qw, s, z, b, group_size, cfg), x, qw, s, z, b, 4, group_size)


@pytest.mark.parametrize(
    "group_size,planes,cfg",
    [(g, p, c) for g in (-1, 32, 64) for p in (2, 4) for c in range(len(CFGS)) if p == 2 or (g != 32 and CFGS[c]["BLOCK_K"] >= 64)],
)  # 4 planes: BLOCK_K >= 64
def test_interpreter_join(group_size, planes, cfg):
    """JOIN: the planes joined back to natural K order, the group scale on the weights, one dot."""
    i = cfg + planes // 2 + (group_size > 0)
    dtype = (torch.float16, torch.bfloat16)[i % 2]
    x, qw, s, z, b = make_problem(7 + 10 * cfg, 40, 128, 4, group_size, dtype, asym=i % 3 != 0, bias=i % 2 == 0)
    out = w4a16_tiled_planes(x, qw, s, z, b, group_size, {**CFGS[cfg], "JOIN": True, "PLANES": planes})
    assert_close_to_ref(out, x, qw, s, z, b, 4, group_size)


@pytest.mark.parametrize("planes", [2, 4])
def test_tolerance_catches_swapped_planes_join(planes):
    x, qw, s, z, b = make_problem(2, 32, 128, 4, 64, torch.bfloat16, asym=True, bias=False)
    swapped = ((qw >> 4) | (qw << 4)).contiguous()
    with pytest.raises(AssertionError):
        assert_close_to_ref(
            w4a16_tiled_planes(x, swapped, s, z, b, 64, {**CFGS[0], "BLOCK_K": 64, "JOIN": True, "PLANES": planes}), x, qw, s, z, b, 4, 64
        )


def test_four_planes_need_whole_mma_depth():
    x, qw, s, z, b = make_problem(2, 16, 128, 4, 32, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="BLOCK_K >= 64"):
        w4a16_tiled_planes(x, qw, s, z, b, 32, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 128, "PLANES": 4})


@pytest.mark.parametrize("m,k", [(33, 104), (2, 98)])  # K not a whole number of BLOCK_K tiles
def test_interpreter_odd_k_and_m(m, k):
    x, qw, s, z, b = make_problem(m, 24, k, 4, -1, torch.bfloat16, asym=True, bias=True)
    out = w4a16_tiled_planes(x, qw, s, z, b, -1, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "SPLIT_K": 2, "SWAP_AB": m > 16})
    assert_close_to_ref(out, x, qw, s, z, b, 4, -1)


@pytest.mark.parametrize("planes", [2, 4])
def test_interpreter_extreme_codes(planes):
    x, _, s, _, _ = make_problem(3, 16, 256, 4, 128, torch.bfloat16, asym=False, bias=False)
    qw, z = _codes_at_the_extremes(16, 256, 128)
    out = w4a16_tiled_planes(x, qw, s, z, None, 128, {**CFGS[1], "BLOCK_K": 128, "SWAP_AB": True, "PLANES": planes})
    assert_close_to_ref(out, x, qw, s, z, None, 4, 128)


@pytest.mark.parametrize("planes", [2, 4])
def test_tolerance_catches_swapped_planes(planes):
    x, qw, s, z, b = make_problem(2, 32, 128, 4, 128, torch.bfloat16, asym=True, bias=False)
    swapped = ((qw >> 4) | (qw << 4)).contiguous()  # even and odd k exchanged
    cfg = {**CFGS[0], "BLOCK_K": 128, "PLANES": planes}
    with pytest.raises(AssertionError):
        assert_close_to_ref(w4a16_tiled_planes(x, swapped, s, z, b, 128, cfg), x, qw, s, z, b, 4, 128)


# ---------------------------------------------------------------- GPU: the PTX planes

GPU_CFGS = [
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 4, "SWAP_AB": True, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "SWAP_AB": False, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 2, "SWAP_AB": True, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 1, "SWAP_AB": True, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 2, "SWAP_AB": True, "PLANES": 4, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 256, "SPLIT_K": 1, "SWAP_AB": False, "PLANES": 4, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 4, "JOIN": True, "PLANES": 4, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 256, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 1, "JOIN": True, "PLANES": 2, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 1, "JOIN": True, "PLANES": 4, "num_warps": 8, "num_stages": 4},
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", range(len(GPU_CFGS)))
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("asym", [False, True])
def test_gpu_configs(cfg, group_size, dtype, asym):
    if GPU_CFGS[cfg].get("PLANES") == 4 and group_size == 32:
        pytest.skip("4 planes need a group of at least 64 (BLOCK_K >= 64)")
    for m, (n, k) in ((1, (4096, 4096)), (7, (4000, 4096)), (16, (1000, 2944)), (200, (6144, 4096))):
        x, qw, s, z, b = make_problem(m, n, k, 4, group_size, dtype, asym, bias=m % 2 == 1, device="cuda")
        assert_close_to_ref(w4a16_tiled_planes(x, qw, s, z, b, group_size, GPU_CFGS[cfg]), x, qw, s, z, b, 4, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cfg", [0, 4, 6, 7])
def test_gpu_extreme_codes(dtype, cfg):
    x, _, s, _, _ = make_problem(5, 256, 512, 4, 128, dtype, asym=False, bias=False, device="cuda")
    qw, z = _codes_at_the_extremes(256, 512, 128)
    out = w4a16_tiled_planes(x, qw.cuda(), s, z.cuda(), None, 128, GPU_CFGS[cfg])
    assert_close_to_ref(out, x, qw.cuda(), s, z.cuda(), None, 4, 128)


@pytest.mark.parametrize("planes", [2, 4])
def test_unaligned_weight_storage(planes):
    """A weight view starting at an odd byte (a slice of a larger buffer) still runs."""
    x, qw, s, z, b = make_problem(3, 16, 128, 4, -1, torch.bfloat16, asym=True, bias=False)
    buf = torch.empty(qw.numel() + 1, dtype=torch.uint8)
    shifted = buf[1:].view(qw.shape)
    shifted.copy_(qw)
    assert shifted.storage_offset() % 2 == 1
    out = w4a16_tiled_planes(x, shifted, s, z, b, -1, {**CFGS[0], "BLOCK_K": 128, "PLANES": planes})
    assert_close_to_ref(out, x, qw, s, z, b, 4, -1)


def test_ptx_compiles_for_sm90():
    """The inline PTX assembles for Hopper with the installed Triton (no GPU needed): dtype x
    planes x SWAP_AB x zero points x argument specialization, in a covering set of 8; and
    the JOIN form (planes joined back to natural K order) in 4 more."""
    cases = [
        "bf16,4,1,1,1",
        "bf16,4,0,0,0",
        "fp16,4,1,0,1",
        "fp16,4,0,1,0",
        "bf16,2,1,0,0",
        "bf16,2,0,1,1",
        "fp16,2,1,1,1",
        "fp16,2,0,0,0",
        "bf16,4,1,1,1,1",
        "fp16,4,1,0,0,1",
        "bf16,2,1,0,1,1",
        "fp16,2,1,1,0,1",
    ]  # JOIN
    assert run_sm90_script("_compile_sm90.py", cases).count("compiled") == len(cases)
