"""SiLU-and-mul followed by per-token int8 quant.

    quant(silu(gate) * up)   (either operand order)   -> silu_and_mul_quant(gate, up)

``silu`` is matched in the form Inductor decomposes it into on this torch (a
traced pattern, see native_patterns.py), per activation dtype. Checks: gate, up
and the product share one dtype and one shape (no broadcast, no promotion).

Numerics: ``silu_and_mul_quant`` rounds silu to the activation dtype and the
product once more, exactly as the eager model does. Inductor's own kernel for the
unfused graph computes the same formula in fp32 and may round differently in
the last bit, so the fused result equals eager bit for bit and the unfused
compile within that rounding (an int8 code moves by at most 1).
"""

from __future__ import annotations

import torch
from torch.fx import Node

from . import graph_utils as gu
from .native_patterns import silu_patterns
from .rewrite import Plan

aten = torch.ops.aten


def silu_mul(prod: Node) -> Plan | None:
    if prod.op != "call_function" or prod.target is not aten.mul.Tensor or prod.kwargs or len(prod.args) != 2:
        return None
    pv = gu.val(prod)
    if pv is None:
        return None
    for dt, pattern in silu_patterns():
        if pv.dtype != dt:
            continue
        for act, up in (prod.args, prod.args[::-1]):
            if not isinstance(act, Node) or not isinstance(up, Node):
                continue
            m = pattern.match(act)
            if not m:
                continue
            gate = m.kwargs["gate"]
            gv, uv = gu.val(gate), gu.val(up)
            if gv is None or uv is None or not (gv.dtype == uv.dtype == dt):
                continue
            if not (gu.same_shape(gv.shape, pv.shape) and gu.same_shape(uv.shape, pv.shape)):
                continue
            plan = Plan(torch.ops.qfuse.silu_and_mul_quant.default, (gate, up), prod, dead=list(m.nodes))
            if plan.validate():
                return plan
    return None
