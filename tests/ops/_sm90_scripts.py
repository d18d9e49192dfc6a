"""Run one of the tests/ops/_*_sm90.py compile scripts in a fresh process without the Triton
interpreter (they compile for sm_90 on the CPU; an LLVM abort there ends only that process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_sm90_script(script: str, cases: list[str]) -> str:
    """stdout of ``python tests/ops/<script> <cases...>``, which must exit 0 (its stderr tail otherwise)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "ops" / script), *cases], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout
