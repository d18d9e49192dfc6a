"""qfuse/bench/_wna16_tune.py: the parallel precompile survives a compiler abort."""

from __future__ import annotations

import os

from qfuse.bench._wna16_tune import precompile


def abort_on_first_bucket(args):
    """Stands in for a worker whose Triton compile hits an LLVM assertion (ends the process)."""
    jobs = args[0]
    if any(job[3] == 1 for job in jobs):  # the bucket holding an M = 1 job
        os.abort()
    return len(jobs)


def test_precompile_reports_a_dead_worker_instead_of_hanging():
    logged = []
    precompile([(64, 256)], [1, 16], [4], 128, "bfloat16", False, workers=2, log=logged.append, worker=abort_on_first_bucket)
    assert logged and "compile worker died" in logged[0]


def test_precompile_logs_nothing_when_workers_finish():
    logged = []
    precompile([(64, 256)], [16], [4], 128, "bfloat16", False, workers=2, log=logged.append, worker=len)
    assert logged == []
