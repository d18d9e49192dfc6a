"""Without a CUDA GPU every ``qfuse bench`` GPU benchmark stops with one line on stderr and a
non-zero exit (no traceback), and ``--help`` still works. ``torch.cuda.is_available`` is patched
to False, so this holds on a GPU machine too. Nothing here compiles a kernel."""

from __future__ import annotations

import pytest
import torch

from qfuse import cli

NO_GPU_NEEDED = {"sass", "report"}  # sass compiles for sm_90 on the CPU; report reads CSVs
ARGS: dict[str, list[str]] = {}  # minimal arguments of a benchmark that requires some
GPU_BENCHES = [name for name in cli._bench_names() if name not in NO_GPU_NEEDED]


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_the_gpu_benchmarks_are_found():
    assert {"gemm", "triton_bf16_ceiling"} <= set(GPU_BENCHES)
    assert NO_GPU_NEEDED <= set(cli._bench_names())


@pytest.mark.parametrize("name", GPU_BENCHES)
def test_gpu_bench_exits_with_one_line(name, no_cuda, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", name, *ARGS.get(name, [])])
    assert exc.value.code not in (0, None)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, captured.err
    assert "CUDA" in err and name in err, err
    assert "Traceback" not in captured.err and captured.out == ""


@pytest.mark.parametrize("name", sorted(cli._bench_names()))
def test_help_works_without_gpu(name, no_cuda, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", name, "--help"])
    assert exc.value.code in (0, None)
    assert f"qfuse bench {name}" in capsys.readouterr().out


def test_sass_is_not_gated_on_a_gpu(no_cuda, capsys):
    # its own argument check answers, not a device check
    assert cli.main(["bench", "sass", "not_a_kernel"]) == 2
    err = capsys.readouterr().err
    assert "unknown kernel" in err and "CUDA" not in err
