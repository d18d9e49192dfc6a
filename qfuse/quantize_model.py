"""``quantize_model``: convert a model's ``nn.Linear`` and RMSNorm modules in place."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from torch import nn
from tqdm.auto import tqdm

from .linear import QuantLinear, check_quantizable
from .norm import RMSNorm, is_convertible_rmsnorm
from .schemes import Scheme, get_scheme


def _ignored(name: str, ignore: Iterable[str]) -> bool:
    """A module is skipped when an ``ignore`` entry equals its full name or its last
    component, or matches its full name as a glob (``"model.layers.0.*"``)."""
    last = name.rsplit(".", 1)[-1]
    return any(pat == name or pat == last or fnmatch.fnmatchcase(name, pat) for pat in ignore)


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def quantize_model(
    model: nn.Module, scheme: Scheme | str, *, ignore: Iterable[str] = ("lm_head",), progress: bool = True
) -> nn.Module:
    """Quantize ``model`` in place with ``scheme`` and return it.

    Every ``nn.Linear`` not matched by ``ignore`` becomes a :class:`qfuse.QuantLinear`;
    every RMSNorm of a Hugging Face Llama / Qwen2 / Mistral model (and ``torch.nn.RMSNorm``)
    becomes a :class:`qfuse.RMSNorm` calling ``qfuse::rms_norm``. All layers are checked
    before any is changed: a layer the scheme cannot take (fp32 weights, in_features not
    divisible by the group size, ...) raises a ``ValueError``/``TypeError`` naming every
    such layer, and the model is left untouched. Add such layers to ``ignore`` to keep
    them in floating point.
    """
    scheme = get_scheme(scheme)
    ignore = tuple(ignore)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and not _ignored(n, ignore)]
    norms = [(n, m) for n, m in model.named_modules() if is_convertible_rmsnorm(m)]
    problems = []
    for name, mod in linears:
        try:
            check_quantizable(mod.weight, scheme, name)
        except (TypeError, ValueError) as e:
            problems.append(e)
    if problems:
        kind = TypeError if all(isinstance(e, TypeError) for e in problems) else ValueError
        lines = "\n  ".join(str(e) for e in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise kind(f"cannot quantize {len(problems)} layer(s) with {scheme.name} (model left unchanged):\n  {lines}{more}\n"
                   "pass their names in ignore=... to keep them in floating point")
    for name, mod in tqdm(linears, desc=f"qfuse {scheme.name}", unit="layer", disable=not progress):
        _set_submodule(model, name, QuantLinear.from_linear(mod, scheme))
    for name, mod in norms:
        _set_submodule(model, name, RMSNorm.from_module(mod))
    return model
