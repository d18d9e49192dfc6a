"""Collapse identical ``quant_per_token_int8`` calls on the same tensor.

In a Hugging Face decoder q/k/v (and gate/up) are separate Linears, so the
post-grad graph quantizes one normalized tensor three (two) times:
``quant(reshape(norm, [-1, H]))`` once per ``QuantLinear``. Inductor does not
merge identical custom-op calls (seen on torch 2.13), so this runs first: it
keeps the earliest call and points every user of the others at it. Afterwards
each norm feeds exactly one quant, which the fusion patterns turn into one
fused op instead of recomputing the norm per consumer.
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

from .graph_utils import RESHAPES, erase_dead

QUANT = torch.ops.qfuse.quant_per_token_int8.default


def _freeze(x):
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(y) for y in x)
    return x


def _input_key(inp) -> tuple:
    """Two quant inputs are the same tensor when they are the same node, or the same
    reshape (same target, same shape arguments) of the same node."""
    if isinstance(inp, Node) and inp.op == "call_function" and inp.target in RESHAPES:
        return ("reshape", inp.target, inp.args[0], _freeze(inp.args[1:]), _freeze(tuple(sorted(inp.kwargs.items()))))
    return ("node", inp)


def dedup_quant(graph: Graph) -> int:
    """Remove duplicate per-token quant calls; returns how many were removed."""
    first: dict[tuple, Node] = {}
    removed = 0
    for q in list(graph.find_nodes(op="call_function", target=QUANT)):
        if q.kwargs or len(q.args) != 1:
            continue
        key = _input_key(q.args[0])
        keep = first.setdefault(key, q)
        if keep is q:
            continue
        inp = q.args[0]
        q.replace_all_uses_with(keep)  # q's getitems now read keep, which precedes them
        graph.erase_node(q)
        erase_dead(graph, [inp])
        removed += 1
    return removed
