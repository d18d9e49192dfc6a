"""qfuse.passes: Inductor pattern-matcher passes that fuse activation quantization
into the op before it. Importing this package changes no global Inductor config."""

if __name__ != "qfuse.passes":  # pragma: no cover - guard against a second import root
    raise ImportError(f"this package must be imported as 'qfuse.passes', not {__name__!r}")

from .counters import counters, reset_counters  # noqa: E402
from .manager import FUSIONS, PassConfig, QfusePostGradPass, inductor_options  # noqa: E402

__all__ = ["FUSIONS", "PassConfig", "QfusePostGradPass", "counters", "inductor_options", "reset_counters"]
