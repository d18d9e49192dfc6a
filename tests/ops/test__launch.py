"""ops/_launch.py: the compiled-kernel cache behind every Triton launch.

On the CPU the kernels run in the interpreter, where ``launch`` is plain ``kernel[grid](...)``;
the cache's keying is tested here with a stand-in for a JITFunction and its CompiledKernel, and
on the GPU against real kernels (first and repeat launches, aligned and misaligned inputs).
"""

from __future__ import annotations

import pytest
import torch

from qfuse.ops import _launch
from qfuse.ops.quant_int8 import quant_per_token_int8_ref

from .test_wna16_gemm_kernel import assert_close_to_ref, make_problem


def _kernel_fn(x_ptr, out_ptr, n, BLOCK, FLAG=False, SCALE=2):
    pass


class _Compiled:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("compiled", grid, args))


class _Jit:
    """Stands in for a JITFunction: ``[grid](*args, **meta)`` "compiles", logs and returns the kernel."""

    fn = staticmethod(_kernel_fn)

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.log.append(("jit", grid, args, meta))
            return _Compiled(self.log)

        return run


@pytest.fixture
def cached(monkeypatch):
    """Launches take the compiled path (as on CUDA) and start from an empty cache."""
    monkeypatch.setattr(_launch, "_compiled_launch", lambda t: t is not None)
    monkeypatch.setattr(_launch, "_compiled", {})


def test_repeat_launch_runs_the_compiled_kernel_with_every_parameter_bound(cached):
    k = _Jit()
    x, out = torch.zeros(64), torch.zeros(64)
    _launch.launch(k, (4,), x, out, 64, BLOCK=32, num_warps=4)
    _launch.launch(k, (4,), x, out, 64, BLOCK=32, num_warps=4)
    assert [e[0] for e in k.log] == ["jit", "compiled"]
    # the tail after the positional arguments: BLOCK from meta, FLAG and SCALE their defaults;
    # num_warps is a launch option, not a parameter; the 1-D grid is padded to three
    assert k.log[1] == ("compiled", (4, 1, 1), (x, out, 64, 32, False, 2))


@pytest.mark.parametrize(
    "change",
    ["int argument", "meta-parameter", "launch option", "misaligned tensor", "dtype"],
)
def test_any_change_of_specialization_goes_back_to_triton(cached, change):
    k = _Jit()
    x, out = torch.zeros(64), torch.zeros(64)
    _launch.launch(k, (4,), x, out, 64, BLOCK=32, num_warps=4)
    args, meta = [x, out, 64], {"BLOCK": 32, "num_warps": 4}
    if change == "int argument":
        args[2] = 48
    elif change == "meta-parameter":
        meta["BLOCK"] = 64
    elif change == "launch option":
        meta["num_warps"] = 8
    elif change == "misaligned tensor":
        args[0] = x[1:]  # 4 bytes past a 16-byte boundary: Triton specializes pointers on that
    else:
        args[0] = x.double()
    _launch.launch(k, (4,), *args, **meta)
    assert [e[0] for e in k.log] == ["jit", "jit"]


def test_new_pointer_of_the_same_alignment_reuses_the_kernel(cached):
    k = _Jit()
    _launch.launch(k, (2, 3), torch.zeros(64), torch.zeros(64), 64, BLOCK=32)
    _launch.launch(k, (2, 3), torch.ones(64), torch.zeros(64), 64, BLOCK=32)
    assert [e[0] for e in k.log] == ["jit", "compiled"]


def test_missing_parameter_is_an_error(cached):
    with pytest.raises(TypeError, match="BLOCK"):
        _launch.launch(_Jit(), (1,), torch.zeros(4), torch.zeros(4), 4)


def test_cpu_tensors_take_triton_path_every_time():
    k = _Jit()
    for _ in range(2):
        _launch.launch(k, (1,), torch.zeros(4), torch.zeros(4), 4, BLOCK=4)
    assert [e[0] for e in k.log] == ["jit", "jit"]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 16])
def test_gpu_repeat_and_misaligned_launches_match_reference(m):
    """The ops through the cache: the same call again (the compiled path) gives the same bits, and
    a fresh x and x at an offset of 2 bytes (another specialization) each match the reference."""
    x0, qw, s, z, b = make_problem(m, 512, 1024, 4, 128, torch.bfloat16, True, True, device="cuda")
    buf = torch.randn(m * 1024 + 1, device="cuda", dtype=torch.bfloat16)
    for x in (x0, buf[: m * 1024].view(m, 1024), buf[1:].view(m, 1024)):
        first = torch.ops.qfuse.wna16_gemm(x, qw, s, z, b, 4, 128)
        assert torch.equal(torch.ops.qfuse.wna16_gemm(x, qw, s, z, b, 4, 128), first)
        assert_close_to_ref(first, x, qw, s, z, b, 4, 128)
        xq, scale = torch.ops.qfuse.quant_per_token_int8(x)
        xq_ref, scale_ref = quant_per_token_int8_ref(x)
        assert torch.equal(xq, xq_ref) and torch.equal(scale, scale_ref)
