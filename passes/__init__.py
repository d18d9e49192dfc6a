"""qfuse.passes: Inductor pattern-matcher passes that fuse activation quantization
into the op before it. Importing this package changes no global Inductor config.

    model = torch.compile(model, options=qfuse.passes.inductor_options())   # or qfuse.compile(model)
    qfuse.passes.counters        # Counter of fusions since reset_counters()

Modules: manager (the CustomGraphPass, PassConfig, inductor_options), dedup_quant
(identical quant calls -> one), norm_quant / silu_mul_quant (recognizers),
rewrite (the shared rewrite), native_patterns (traced torch-native forms),
graph_utils, counters.
"""

if __name__ != "qfuse.passes":  # pragma: no cover - guard against a second import root
    raise ImportError(f"this package must be imported as 'qfuse.passes', not {__name__!r}")

from .counters import counters, reset_counters  # noqa: E402
from .manager import FUSIONS, PassConfig, QfusePostGradPass, inductor_options  # noqa: E402

__all__ = ["FUSIONS", "PassConfig", "QfusePostGradPass", "counters", "inductor_options", "reset_counters"]
