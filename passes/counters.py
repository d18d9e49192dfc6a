"""Match counters: how many times each fusion fired since the last reset.

``qfuse.passes.counters`` is a ``collections.Counter`` keyed by fusion name
(``"rms_norm_quant"``, ``"add_rms_norm_quant"``, ...), plus ``"dedup_quant"``
(identical quant calls removed) and ``"kept_float_output"`` (fusions where the
norm/activation float output stayed for another consumer). The same numbers go
to ``torch._dynamo.utils.counters["qfuse"]`` and to the ``qfuse.passes`` logger
(INFO, one line per compiled graph). A compile served from the FX graph cache
runs no pass, so it counts nothing.
"""

from __future__ import annotations

import collections
import logging

log = logging.getLogger("qfuse.passes")

counters: collections.Counter[str] = collections.Counter()


def record(name: str, n: int = 1) -> None:
    if n:
        from torch._dynamo.utils import counters as torch_counters

        counters[name] += n
        torch_counters["qfuse"][name] += n


def reset_counters() -> None:
    from torch._dynamo.utils import counters as torch_counters

    counters.clear()
    torch_counters["qfuse"].clear()
