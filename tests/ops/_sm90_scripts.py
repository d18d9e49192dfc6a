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


def run_sm90_script(script: str, cases: list[str], processes: int = 1) -> str:
    """stdout of ``python tests/ops/<script> <cases...>``, which must exit 0 (its stderr tail otherwise).
    ``processes`` > 1: the cases split into that many runs of consecutive cases, all at once (see
    :func:`run_sm90_script_per_case`; each process pays ~3 s of imports, so this pays off for
    many cases), the stdouts joined in case order."""
    n = min(processes, len(cases))
    if n > 1:
        return _run_at_once(script, [cases[i * len(cases) // n : (i + 1) * len(cases) // n] for i in range(n)])
    run = subprocess.run(**_command(script, cases), capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def run_sm90_script_per_case(script: str, cases: list[str]) -> str:
    """:func:`run_sm90_script` with one process per case, all at once (the compiles are
    independent and CPU-bound: CI's two cores run them in about half the time); the stdouts
    are joined in case order."""
    return _run_at_once(script, [[case] for case in cases])


def _run_at_once(script: str, chunks: list[list[str]]) -> str:
    """One process per chunk of cases, all started at once; their stdouts joined in chunk order."""
    procs = [subprocess.Popen(**_command(script, chunk), stdout=subprocess.PIPE, stderr=subprocess.PIPE) for chunk in chunks]
    outs = []
    for chunk, proc in zip(chunks, procs):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{' '.join(chunk)}: {err[-3000:]}"
        outs.append(out)
    return "".join(outs)
