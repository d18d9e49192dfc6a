"""qfuse: quantized LLM inference that stays fast under torch.compile.

import qfuse
qfuse.quantize_model(model, "W4A8")
model = qfuse.compile(model)     # torch.compile + the fusion passes
"""

from pathlib import Path as _Path


def _map_source_subpackages() -> None:
    """In a source checkout imported without an editable install (the repository root
    on sys.path ahead of site-packages, as with `PYTHONPATH=.` or `python -m pytest`
    from the root), let qfuse.ops and qfuse.passes resolve to ../ops and ../passes,
    as the pyproject package-dir mapping does for installs."""
    here = _Path(__file__).resolve().parent
    root = here.parent
    if not (here / "ops").is_dir() and (root / "ops" / "__init__.py").is_file() and (root / "pyproject.toml").is_file():
        __path__.append(str(root))


_map_source_subpackages()

from . import ops  # noqa: E402  (registers torch.ops.qfuse.*)
from .attention import use_decode_attention  # noqa: E402
from .checkpoint import from_pretrained, load_quantized, save_quantized  # noqa: E402
from .compile import compile, compile_config, inductor_options  # noqa: E402,A004  (imports qfuse.passes lazily)
from .formats import CheckpointError  # noqa: E402
from .fused_projections import fuse_projections, unfuse_projections  # noqa: E402
from .linear import QuantLinear  # noqa: E402
from .moe import QuantMoE  # noqa: E402
from .norm import RMSNorm  # noqa: E402
from .quantize_model import quantize_model  # noqa: E402
from .schemes import SCHEMES, Scheme, get_scheme  # noqa: E402

__all__ = [
    "CheckpointError",
    "QuantLinear",
    "QuantMoE",
    "RMSNorm",
    "SCHEMES",
    "Scheme",
    "compile",
    "compile_config",
    "from_pretrained",
    "fuse_projections",
    "get_scheme",
    "inductor_options",
    "load_quantized",
    "ops",
    "quantize_model",
    "save_quantized",
    "unfuse_projections",
    "use_decode_attention",
]
__version__ = "0.1.0"
