"""ops/w4a16_tma.py against the reference kernel of ``qfuse::wna16_gemm``.

CPU (CI): the launcher under the Triton interpreter (TMA descriptors interpreted, nibble planes
from integer ops), and the kernel compiled for sm_90 with its PTX (tests/ops/_compile_sm90.py).
GPU (``pytest -m gpu``): the PTX planes through real TMA descriptors at the issue's shapes, every
dispatcher config of the family, extreme codes. Tolerance: tests/ops/test_wna16_gemm_kernel.py's.
"""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.w4a16_tma import tma_supported, w4a16_tma
from qfuse.ops.wna16_dispatch import candidate_configs
from tests.ops.test_w4a16_tiled_planes import _codes_at_the_extremes
from tests.ops.test_wna16_gemm_kernel import assert_close_to_ref, make_problem

CFG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64}


# ---------------------------------------------------------------- CPU: Triton interpreter

@pytest.mark.parametrize("group_size,split_k", [(-1, 1), (32, 1), (64, 2), (-1, 3), (128, 2)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("asym", [False, True])
def test_interpreter(group_size, split_k, dtype, asym):
    # M and N not multiples of the tile (TMA zero-fills, the store masks); per-channel K = 160 ends
    # in a partial BLOCK_K tile; split 3 of it ends in a split with a tile wholly past K
    k = 160 if group_size == -1 else 256
    x, qw, s, z, b = make_problem(37, 40, k, 4, group_size, dtype, asym, bias=asym != (split_k == 2))
    out = w4a16_tma(x, qw, s, z, b, group_size, {**CFG, "SPLIT_K": split_k})
    assert_close_to_ref(out, x, qw, s, z, b, 4, group_size)


def test_interpreter_extreme_codes():
    x, _, s, _, _ = make_problem(3, 16, 256, 4, 128, torch.bfloat16, asym=False, bias=False)
    qw, z = _codes_at_the_extremes(16, 256, 128)
    assert_close_to_ref(w4a16_tma(x, qw, s, z, None, 128, CFG), x, qw, s, z, None, 4, 128)


def test_tolerance_catches_swapped_nibbles():
    x, qw, s, z, b = make_problem(5, 32, 128, 4, 64, torch.bfloat16, asym=True, bias=False)
    swapped = ((qw >> 4) | (qw << 4)).contiguous()  # even and odd k exchanged
    with pytest.raises(AssertionError):
        assert_close_to_ref(w4a16_tma(x, swapped, s, z, b, 64, CFG), x, qw, s, z, b, 4, 64)


def test_unaligned_operands_are_copied():
    """A descriptor base must be 16-byte aligned: views that start mid-buffer still run."""
    x, qw, s, z, b = make_problem(3, 16, 128, 4, -1, torch.bfloat16, asym=True, bias=False)
    wbuf = torch.empty(qw.numel() + 1, dtype=torch.uint8)
    qw_off = wbuf[1:].view(qw.shape)
    qw_off.copy_(qw)
    xbuf = torch.empty(x.numel() + 1, dtype=x.dtype)
    x_off = xbuf[1:].view(x.shape)
    x_off.copy_(x)
    assert qw_off.data_ptr() % 16 and x_off.data_ptr() % 16
    assert_close_to_ref(w4a16_tma(x_off, qw_off, s, z, b, -1, CFG), x, qw, s, z, b, 4, -1)


def test_rejects_k_without_whole_tma_rows():
    assert tma_supported(4096) and not tma_supported(4080)
    x, qw, s, z, b = make_problem(2, 16, 112, 4, -1, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="multiple of 32"):
        w4a16_tma(x, qw, s, z, b, -1, CFG)


def test_dispatcher_offers_it_only_where_it_applies():
    def tma(m, k, bits=4):
        return [c for c in candidate_configs(m, 4096, k, bits, 128) if c["kernel"] == "tiled_tma"]

    assert tma(256, 4096) and tma(4096, 4096)
    assert not tma(64, 4096) and not tma(256, 4096, bits=8) and not tma(256, 4080)
    assert all(c["BLOCK_M"] <= 2 * 128 and c["SPLIT_K"] in (1, 2, 4) for c in tma(128, 4096))


def test_ptx_compiles_for_sm90_with_an_asynchronous_wgmma():
    """The TMA kernel with the planes PTX compiles for Hopper with the installed Triton, and its
    loop's wgmma (and the tiled_planes JOIN form's) stays asynchronous: the only ``wgmma.wait_group 0`` is the last wait (after the
    loop); inside it, every wait leaves MMAs in flight. A change that makes Triton wait for
    every slice (a use of the accumulator in the loop, a weight operand stored to shared memory
    in the loop) fails here, on the CPU."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    cases = ["tma,bf16,128,0,1", "tma,fp16,-1,1,2", "tma,bf16,64,1,1", "tma,fp16,128,0,4",
             "bf16,2,1,0,1,1", "fp16,4,1,1,1,1",  # tiled_planes JOIN: the same loop, pointer-fed
             "bf16,2,1,0,1"]  # control: tiled_planes without JOIN, whose loop is synchronous
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(root / "tests/ops/_compile_sm90.py"), *cases], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("compiled") == len(cases)
    def asynchronous(line: str) -> bool:
        # triton 3.6: 3,3,3,3,0 (a wait per K = 16 piece); 3.7.1: 1,1,0; a synchronous loop: 0 per slice
        waits = [int(w) for w in line.split(" waits ")[1].split(",") if w]
        return bool(waits[:-1]) and waits[-1] == 0 and 0 not in waits[:-1]

    lines = run.stdout.splitlines()
    assert all(asynchronous(line) for line in lines[:-1]), lines
    assert not asynchronous(lines[-1]), lines[-1]  # the check tells a synchronous loop apart


# ---------------------------------------------------------------- GPU: real descriptors, PTX planes

# (group, dtype, zero points): a covering set, each value of each twice (every combination compiles
# its own ~15 configs x 2 shape specializations; all 16 took most of a 380 s GPU run)
GPU_QUANT = [(-1, torch.bfloat16, True), (32, torch.float16, False), (64, torch.bfloat16, False), (128, torch.float16, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("group_size,dtype,asym", GPU_QUANT)
def test_gpu_every_config(group_size, dtype, asym):
    """Every config the dispatcher offers for this family, at prefill M and odd shapes (N % 16 != 0)."""
    for m, (n, k) in ((200, (4000, 4096)), (1024, (4096, 4096)), (300, (1000, 2944))):
        x, qw, s, z, b = make_problem(m, n, k, 4, group_size, dtype, asym, bias=m % 2 == 0, device="cuda")
        for cfg in candidate_configs(m, n, k, 4, group_size):
            if cfg["kernel"] == "tiled_tma":
                assert_close_to_ref(w4a16_tma(x, qw, s, z, b, group_size, cfg), x, qw, s, z, b, 4, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_extreme_codes(dtype):
    x, _, s, _, _ = make_problem(300, 256, 512, 4, 128, dtype, asym=False, bias=False, device="cuda")
    qw, z = _codes_at_the_extremes(256, 512, 128)
    for cfg in ({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4},
                {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 2, "num_warps": 8, "num_stages": 3}):
        assert_close_to_ref(w4a16_tma(x, qw.cuda(), s, z.cuda(), None, 128, cfg), x, qw.cuda(), s, z.cuda(), None, 4, 128)
