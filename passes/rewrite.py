"""The one rewrite every fusion shares: ``quant_per_token_int8(reshape*(producer))``
becomes the fused op's ``(xq, scale[, residual_out])``.

The quantization is row-wise, so for a reshape that keeps the last dimension
``quant(reshape(y)) == reshape(quant(y))`` (codes and scales alike). The fused op
therefore runs on the producer's own inputs and its outputs are reshaped to what
the quant returned. Consumers are never dropped: the producer's float output
stays in the graph for any other reader (the fused op recomputes it internally),
and a residual's readers that come before the fused op keep the old node.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.fx import Graph, Node

from . import graph_utils as gu

aten = torch.ops.aten


@dataclasses.dataclass
class Plan:
    """What a recognizer found: the fused op call and the nodes it supersedes."""

    op: torch._ops.OpOverload
    args: tuple
    producer: Node  # the float tensor the quant read (before reshapes)
    residual: list[Node] = dataclasses.field(default_factory=list)  # nodes replaced by output 2
    dead: list[Node] = dataclasses.field(default_factory=list)  # erased when left without users
    fake: tuple = ()

    def validate(self) -> bool:
        """Run the fused op's own argument checks on the metadata; any rejection = no fusion."""
        try:
            self.fake = tuple(gu.fake_call(self.op, self.args))
        except (TypeError, ValueError, RuntimeError):
            return False
        return True


def quant_ok(quant: Node) -> bool:
    try:
        gu.getitem_users(quant)
    except ValueError:
        return False
    return True


def apply_plan(graph: Graph, quant: Node, chain: list[Node], plan: Plan) -> bool:
    """Insert the fused op, rewire the quant's (and the residual's) consumers, erase what died.
    Returns True when the producer's float output stayed alive for another consumer."""
    anchor = gu.insertion_point(graph, plan.args)
    with graph.inserting_before(anchor.next):
        fused = gu.call(graph, plan.op, plan.args, fake=plan.fake)
        outs = [gu.getitem(graph, fused, i) for i in range(len(plan.fake))]
    xq, scale = outs[0], outs[1]
    if chain:
        shape = list(chain[-1].args[1])
        with graph.inserting_before(quant):
            xq = gu.call(graph, aten.reshape.default, (xq, shape))
            scale = gu.call(graph, aten.reshape.default, (scale, shape[:-1] + [1]))
    for index, users in gu.getitem_users(quant).items():
        new = (xq, scale)[index]
        for u in users:
            u.replace_all_uses_with(new)
            graph.erase_node(u)
    graph.erase_node(quant)
    for r in plan.residual:
        gu.replace_uses_after(r, outs[2], graph)
    gu.erase_dead(graph, [*chain, plan.producer, *plan.residual, *plan.dead])
    return not plan.producer._erased
