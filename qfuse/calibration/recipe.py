"""Calibration recipes: which algorithms ``quantize_model(..., calibration=...)`` runs.

A recipe is one step or a list of them (:class:`SmoothQuant`, :class:`AWQ`, :class:`GPTQ`, with
their options), or their names joined by ``+`` (``"gptq"``, ``"sq+gptq"``, ``"awq+gptq"``;
``"rtn"`` is the empty recipe). The steps always run in the order SmoothQuant, AWQ, GPTQ: the
first two change the float weights, GPTQ chooses the codes.
"""

from __future__ import annotations

from ..schemes import Scheme
from .awq import AWQ
from .gptq import GPTQ
from .smoothquant import SmoothQuant

STEPS = {"sq": SmoothQuant, "smoothquant": SmoothQuant, "awq": AWQ, "gptq": GPTQ, "gptq-mse": lambda: GPTQ(mse=True)}
_ORDER = (SmoothQuant, AWQ, GPTQ)


def parse_recipe(calibration) -> list:
    """The steps of ``calibration`` in running order; raises ``ValueError`` for an unknown name,
    a step given twice or an object that is no step."""
    if calibration is None:
        return []
    if isinstance(calibration, type):
        calibration = [calibration]  # a step's class: refused below with its hint
    items = calibration.split("+") if isinstance(calibration, str) else [calibration] if isinstance(calibration, _ORDER) else list(calibration)
    steps = []
    for item in items:
        if isinstance(item, str):
            key = item.strip().lower()
            if key == "rtn":
                continue
            if key not in STEPS:
                raise ValueError(f"unknown calibration step {item!r}; steps: rtn, {', '.join(STEPS)} (join them with '+')")
            item = STEPS[key]()
        if isinstance(item, type) and issubclass(item, _ORDER):
            raise TypeError(f"calibration: got the class {item.__name__}; pass a step, {item.__name__}() or its name")
        if not isinstance(item, _ORDER):
            raise TypeError(f"calibration steps are SmoothQuant(...), AWQ(...), GPTQ(...) or their names, got {item!r}")
        steps.append(item)
    kinds = [type(s) for s in steps]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"calibration: each step may appear once, got {', '.join(k.__name__ for k in kinds)}")
    return sorted(steps, key=lambda s: _ORDER.index(type(s)))


def recipe_name(steps: list) -> str:
    """``"rtn"``, ``"sq"``, ``"awq+gptq"``, ...: the short name of a parsed recipe."""
    short = {SmoothQuant: "sq", AWQ: "awq", GPTQ: "gptq"}
    return "+".join(short[type(s)] + ("-mse" if getattr(s, "mse", False) else "") for s in steps) or "rtn"


def check_recipe(steps: list, scheme: Scheme) -> None:
    """SmoothQuant moves activation outliers into the weights: it serves int8 activations only.
    GPTQ's ``act_order="group"`` stores a ``g_idx``, which int8-activation checkpoints cannot hold."""
    if scheme.weight_only and any(isinstance(s, SmoothQuant) for s in steps):
        raise ValueError(
            f"SmoothQuant helps int8 activation quantization; {scheme.name} keeps activations in 16 bits "
            "(use AWQ and/or GPTQ for weight-only schemes)"
        )
    if not scheme.weight_only and any(isinstance(s, GPTQ) and s.act_order == "group" for s in steps):
        raise ValueError(
            f"GPTQ(act_order='group') gives scattered scale groups (a g_idx), which weight-only formats store and "
            f"{scheme.name} checkpoints cannot: use act_order='weight' (the default) or None"
        )
