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
    for path in (ROOT / "ops").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith(("qfuse", "passes")), f"{path.name} imports {node.module}"
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                raise AssertionError(f"{path.name} imports from outside ops/")
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith(("qfuse", "passes")) for a in node.names), path.name
