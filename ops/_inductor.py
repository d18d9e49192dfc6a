"""Inductor lowerings for qfuse's ops, registered before a compile: each op a fallback (a call of
its own kernel), the same as the fallback Inductor would create on first use.

Inductor creates that implicit fallback the first time a graph uses an op with no lowering, and
torch 2.11 first formats the op's arguments for a ``log.info`` line, logged or not (2.13 formats
it lazily). The string of an argument is the string of the IR that produced it, which repeats
its producers' strings: with the fusion passes one qfuse op's outputs feed the next directly,
so the arguments of an op first used at the end of a deep graph (the final norm) spell out the
whole decoder, each shared producer once per path to it. The 32-layer Llama-3-8B W4A8 decode
step (passes on) had not left that formatting after 240 s on the H200 (torch 2.11); W8A8 with
the passes off, whose qfuse ops are separated by Inductor's own kernels, compiled in 55 s.
"""

from __future__ import annotations

from ._custom_op import OPS


def register_inductor_fallbacks() -> None:
    """Give every qfuse op without an Inductor lowering its fallback now, with the layout
    constraint the implicit fallback would take from the op's tags. Idempotent."""
    from torch._inductor import lowering

    tag_of, constraint_of = (getattr(lowering, n, None) for n in ("get_layout_constraint_tag", "tag_to_layout_constraint"))
    if tag_of is None or constraint_of is None:  # a torch without them (2.11 and 2.13 have both): the implicit fallback stays
        return
    for op in OPS:
        target = op.default
        if target not in lowering.lowerings:
            lowering.make_fallback(target, layout_constraint=constraint_of(tag_of(target, with_default=True)), warn=False)
