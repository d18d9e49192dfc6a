"""The device check every GPU benchmark makes after parsing its arguments (so ``--help`` works anywhere).

``qfuse bench sass`` makes none: it compiles for sm_90 on the CPU.
"""

from __future__ import annotations

import sys

import torch

EXIT_NO_GPU = 2


def require_cuda(name: str) -> None:
    """Exit (``SystemExit(2)``) with one line on stderr unless a CUDA device is available.

    ``name``: the benchmark, as in ``qfuse bench NAME``."""
    if not torch.cuda.is_available():
        print(f"qfuse bench {name}: needs a CUDA GPU, and torch.cuda.is_available() is False", file=sys.stderr)
        raise SystemExit(EXIT_NO_GPU)
