"""Run one of the tests/ops/_*_sm90.py compile scripts in a fresh process without the Triton
interpreter (they compile for sm_90 on the CPU; an LLVM abort there ends only that process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _command(script: str, cases: list[str]) -> dict:
    """The subprocess arguments that run ``tests/ops/<script> <cases...>`` without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return dict(args=[sys.executable, str(ROOT / "tests" / "ops" / script), *cases], cwd=ROOT, env=env, text=True)


def run_sm90_script(script: str, cases: list[str]) -> str:
    """stdout of ``python tests/ops/<script> <cases...>``, which must exit 0 (its stderr tail otherwise)."""
    run = subprocess.run(**_command(script, cases), capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def run_sm90_script_per_case(script: str, cases: list[str]) -> str:
    """:func:`run_sm90_script` with one process per case, all at once (the compiles are
    independent and CPU-bound: CI's two cores run them in about half the time); the stdouts
    are joined in case order."""
    procs = [subprocess.Popen(**_command(script, [case]), stdout=subprocess.PIPE, stderr=subprocess.PIPE) for case in cases]
    outs = []
    for case, proc in zip(cases, procs):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{case}: {err[-3000:]}"
        outs.append(out)
    return "".join(outs)
