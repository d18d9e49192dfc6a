"""Small FX-graph helpers shared by the fusion passes: reading node metadata,
seeing through row-preserving reshapes, inserting a replacement node with its
FakeTensor metadata, and rewiring / erasing without ever dropping a consumer."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

import torch
from torch.fx import Graph, Node

aten = torch.ops.aten
RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)


def val(n) -> torch.Tensor | None:
    """The FakeTensor an FX node carries in ``meta['val']`` (None for non-nodes / missing)."""
    if not isinstance(n, Node):
        return None
    v = n.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None


def same_size(a, b) -> bool:
    """Statically equal sizes (symbolic sizes compare without adding guards)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return statically_known_true(a == b)


def same_shape(a: Sequence, b: Sequence) -> bool:
    return len(a) == len(b) and all(same_size(x, y) for x, y in zip(a, b))


def is_row_reshape(n: Node) -> bool:
    """A reshape/view that keeps the last dimension, so row r of its input is row r of its output."""
    if n.op != "call_function" or n.target not in RESHAPES:
        return False
    src, out = val(n.args[0]), val(n)
    return src is not None and out is not None and src.dim() >= 1 and out.dim() >= 1 and same_size(src.shape[-1], out.shape[-1])


def peel_row_reshapes(n: Node) -> tuple[Node, list[Node]]:
    """Walk up through row-preserving reshapes; returns (producer, reshape chain top-down)."""
    chain = []
    while isinstance(n, Node) and is_row_reshape(n):
        chain.append(n)
        n = n.args[0]
    return n, chain[::-1]


def getitem_users(n: Node) -> dict[int, list[Node]]:
    """``{index: [getitem nodes]}`` for a multi-output node; raises if a user is not a getitem."""
    out: dict[int, list[Node]] = {}
    for u in n.users:
        if u.op != "call_function" or u.target is not operator.getitem:
            raise ValueError(f"{n} has a non-getitem user {u}")
        out.setdefault(u.args[1], []).append(u)
    return out


def op_arg(n: Node, index: int, name: str, default=None):
    """Argument ``index`` / ``name`` of a call node (graphs may spell it positionally or by keyword)."""
    if len(n.args) > index:
        return n.args[index]
    return n.kwargs.get(name, default)


def fake_call(op, args: Sequence):
    """Run ``op`` on the FakeTensor metadata of ``args`` (nodes, possibly inside lists,
    e.g. symbolic sizes of a reshape) in the graph's fake mode."""
    import torch.utils._pytree as pytree
    from torch._guards import detect_fake_mode
    from torch.fx.node import map_arg

    fake_args = map_arg(tuple(args), lambda n: n.meta["val"])
    mode = detect_fake_mode([a for a in pytree.tree_leaves(fake_args) if isinstance(a, torch.Tensor)])
    if mode is None:
        raise RuntimeError("no fake mode found on the matched nodes")
    with mode:
        return op(*fake_args)


def insertion_point(graph: Graph, inputs: Iterable) -> Node:
    """The node after which a new node reading ``inputs`` can go: the latest input, or
    the last placeholder when every input is a placeholder/constant."""
    nodes = [a for a in inputs if isinstance(a, Node)]
    order = {n: i for i, n in enumerate(graph.nodes)}
    latest = max(nodes, key=order.__getitem__, default=None)
    if latest is None or latest.op == "placeholder":
        placeholders = list(graph.find_nodes(op="placeholder"))
        latest = placeholders[-1] if placeholders else None
    if latest is None:  # pragma: no cover - a graph with a match has inputs
        raise RuntimeError("empty graph")
    return latest


def call(graph: Graph, op, args: Sequence, fake=None) -> Node:
    """Insert ``op(*args)`` at the graph's current insertion point with its ``meta['val']``."""
    node = graph.call_function(op, tuple(args))
    node.meta["val"] = fake_call(op, args) if fake is None else fake
    return node


def getitem(graph: Graph, node: Node, i: int) -> Node:
    g = graph.call_function(operator.getitem, (node, i))
    g.meta["val"] = node.meta["val"][i]
    return g


def replace_uses_after(old: Node, new: Node, graph: Graph) -> int:
    """Point every user of ``old`` that comes after ``new`` at ``new``; users before it
    keep ``old`` (so ``old`` stays alive for them). Returns how many users moved."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    pos = order[new]
    moved = 0
    for u in list(old.users):
        if u is not new and order[u] > pos:
            u.replace_input_with(old, new)
            moved += 1
    return moved


def erase_dead(graph: Graph, nodes: Iterable[Node]) -> int:
    """Erase the given nodes that have no users left (latest first, repeated until stable)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    pending = sorted({n for n in nodes if isinstance(n, Node) and n in order and n.op == "call_function"}, key=order.__getitem__, reverse=True)
    erased = 0
    changed = True
    while changed:
        changed = False
        for n in pending:
            if not n._erased and not n.users and not n.is_impure():
                graph.erase_node(n)
                erased += 1
                changed = True
    return erased
