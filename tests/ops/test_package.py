"""The op set is registered once, under one import root, and ops/ depends on nothing above it."""

import ast
import subprocess
import sys
from pathlib import Path

import torch

import qfuse.ops

ROOT = Path(__file__).resolve().parents[2]


def test_every_op_is_registered():
    for name in qfuse.ops.OP_NAMES:
        op = getattr(torch.ops.qfuse, name)
        assert op.default._schema.name == f"qfuse::{name}"


def test_importing_ops_under_another_name_fails_clearly():
    r = subprocess.run([sys.executable, "-c", "import ops"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "must be imported as 'qfuse.ops'" in r.stderr
    r = subprocess.run([sys.executable, "-c", "import passes"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "must be imported as 'qfuse.passes'" in r.stderr


def test_ops_import_neither_qfuse_nor_passes():
    for path in (ROOT / "ops").rglob("*.py"):
        depth = len(path.relative_to(ROOT / "ops").parts) - 1  # 0 in ops/, 1 in ops/wna16/, ...
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith(("qfuse", "passes")), f"{path.name} imports {node.module}"
            if isinstance(node, ast.ImportFrom) and node.level > depth + 1:
                raise AssertionError(f"{path.name} imports from outside ops/")
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith(("qfuse", "passes")) for a in node.names), path.name


def test_unverified_kernel_families_need_opt_in(monkeypatch):
    """Families kept opt-in are never autotuned into use by default; measured ones are offered."""
    from qfuse.ops._autotune import experimental_kernels
    from qfuse.ops.int8 import dispatch as int8_dispatch
    from qfuse.ops.wna16 import dispatch as wna16_dispatch

    seen = {}

    def fake_pick(op, key, cands, run, device, usable=None):
        seen[op] = cands() if callable(cands) else cands
        return seen[op][0]

    monkeypatch.setattr(wna16_dispatch, "pick_config", fake_pick)
    monkeypatch.setattr(wna16_dispatch, "run_config", lambda *a, **k: None)
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    assert not experimental_kernels()
    x = torch.randn(16, 4096).bfloat16()
    qw = torch.zeros(64, 2048, dtype=torch.uint8)
    s = torch.ones(64, 32).bfloat16()
    wna16_dispatch.wna16_gemm_triton(x, qw, s, None, None, 4, 128)
    assert {"tiled_words", "tiled_planes"} <= {c["kernel"] for c in seen["wna16_gemm"]}  # through the H200 grid
    wna16_dispatch.wna16_gemm_triton(x[:1], qw, s, None, None, 4, 128)
    assert not any(wna16_dispatch.is_experimental(c, 4) for c in seen["wna16_gemm"])  # register-capped GEMV: opt-in
    assert int8_dispatch.is_experimental({"kernel": "gemv8"})  # slower than the tile kernel on the H200
    assert int8_dispatch.is_experimental({"KERNEL": "gemv8"})  # a config stored in the spelling before "kernel"
    assert int8_dispatch.is_experimental({"kernel": "mma_words", "STREAM": 1})
    for measured in (
        {"kernel": "tile", "UNPACK_ASM": 1},
        {"kernel": "gemv"},
        {"kernel": "tile", "GS_PARTIAL": 1},
        {"kernel": "w8"},
        {"kernel": "tma"},
        {"UNPACK_ASM": 1},
    ):
        assert not int8_dispatch.is_experimental(measured)
