"""One GEMM for the projections that read the same input: ``qfuse.fuse_projections(model)``.

A Hugging Face decoder layer multiplies the same hidden state by q_proj, k_proj and v_proj, and
the MLP's input by gate_proj and up_proj: five GEMMs a layer where two would do. At decode
sizes each small GEMM pays a launch and a partly idle GPU: on the H200, W4A16 at batch 1 takes
5.35 us for a 4096 x 4096 weight and 6.6 us for the 6144 x 4096 of q, k and v stacked, at batch
16 8.6 and 10.4 us (docs/bench/current/wna16_w4.csv), and the shipped kernel configs are tuned
for the stacked shapes. ``fuse_projections`` stacks each group's weights into one layer
(``qkv_proj``, ``gate_up_proj``, registered on the same parent) and turns the members into
:class:`ProjectionSlice` modules:

* the first member a forward calls runs the stacked layer once on its input and keeps the other
  members' column blocks; each other member called with that same tensor returns its block
  (transformers calls q, k, v, and gate, up, with one tensor each; under ``torch.compile`` this
  bookkeeping is traced away, leaving one GEMM and views);
* a member called with another tensor, or alone, runs the stacked layer and returns its block.

Each output column is computed from the same weights as before (every qfuse weight format is per
output channel). With int8 activations the result is the same bits (integer accumulation); with
float accumulation (weight-only schemes, bf16) the stacked shape may run another kernel config
and round differently in the last bits (on the CPU reference kernels here it was bit-equal).

Works on ``QuantLinear`` groups of one scheme (after ``quantize_model`` or ``from_pretrained``)
and on float ``nn.Linear`` groups (the bf16 baseline). ``save_quantized`` writes the members
under their own names (what serving engines load); ``unfuse_projections`` restores them.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import Tensor, nn

from .linear import QuantLinear

log = logging.getLogger("qfuse.fused_projections")

# (stacked layer's name, its members in output order)
GROUPS = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj")))


class _Pending:
    """The column blocks of one group's last stacked output not yet returned, with its input."""

    def __init__(self):
        self.input: Tensor | None = None
        self.blocks: list[Tensor | None] = []


class ProjectionSlice(nn.Module):
    """Columns ``[start, start + out_features)`` of the stacked layer ``parent.<fused_name>``
    (looked up at each call, so a stacked layer swapped for another, e.g. quantized, is used)."""

    def __init__(self, parent: nn.Module, fused_name: str, index: int, sizes: tuple[int, ...], pending: _Pending):
        super().__init__()
        self.fused_name, self.index, self.sizes = fused_name, index, sizes
        self.start, self.out_features = sum(sizes[:index]), sizes[index]
        self.in_features = getattr(parent, fused_name).in_features
        # plain attributes: the parent is not a child (no cycle in modules() / state_dict)
        self.__dict__["_parent"] = parent
        self.__dict__["_pending"] = pending

    @property
    def fused(self) -> nn.Module:
        return getattr(self._parent, self.fused_name)

    def forward(self, x: Tensor) -> Tensor:
        pending = self._pending
        if pending.input is x and pending.blocks[self.index] is not None:
            out = pending.blocks[self.index]
            pending.blocks[self.index] = None
            if all(b is None for b in pending.blocks):
                pending.input, pending.blocks = None, []
            return out
        blocks = list(torch.split(self.fused(x), self.sizes, dim=-1))
        out = blocks[self.index]
        blocks[self.index] = None
        pending.input, pending.blocks = x, blocks
        return out

    def layer(self) -> nn.Module:
        """This member as a standalone layer: a QuantLinear of views (``QuantLinear.rows``) or an
        ``nn.Linear`` of copies of the stacked layer's rows."""
        fused, stop = self.fused, self.start + self.out_features
        if isinstance(fused, QuantLinear):
            return fused.rows(self.start, stop)
        lin = nn.Linear(self.in_features, self.out_features, bias=fused.bias is not None, device=fused.weight.device, dtype=fused.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(fused.weight[self.start : stop])
            if fused.bias is not None:
                lin.bias.copy_(fused.bias[self.start : stop])
        return lin

    def extra_repr(self) -> str:
        return f"{self.fused_name}[:, {self.start}:{self.start + self.out_features}]"


def _stack(layers: list[nn.Module]) -> nn.Module | None:
    """The stacked layer of ``layers``, or None when they cannot be stacked (logged)."""
    if all(type(m) is QuantLinear for m in layers):
        try:
            return QuantLinear.concat(layers)
        except ValueError as e:
            log.info("not fused: %s", e)
            return None
    if all(type(m) is nn.Linear for m in layers):
        w = layers[0].weight
        if any(m.in_features != layers[0].in_features or m.weight.dtype != w.dtype or m.weight.device != w.device for m in layers):
            return None
        has_bias = any(m.bias is not None for m in layers)
        lin = nn.Linear(w.shape[1], sum(m.out_features for m in layers), bias=has_bias, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.cat([m.weight for m in layers]))
            if has_bias:
                lin.bias.copy_(torch.cat([m.bias if m.bias is not None else w.new_zeros(m.out_features) for m in layers]))
        return lin.requires_grad_(layers[0].weight.requires_grad)
    return None


def fuse_projections(model: nn.Module) -> nn.Module:
    """Stack every q/k/v and gate/up group of ``model`` into one layer (module docstring); returns
    the model. Groups whose layers cannot be stacked (mixed schemes or types, different input
    permutations) are left as they are, with an INFO log line; none fused at all warns."""
    fused = 0
    for parent in list(model.modules()):
        for fused_name, names in GROUPS:
            layers = [getattr(parent, n, None) for n in names]
            if any(not isinstance(m, nn.Module) for m in layers) or hasattr(parent, fused_name):
                continue
            stacked = _stack(layers)
            if stacked is None:
                continue
            parent.add_module(fused_name, stacked)
            pending, sizes = _Pending(), tuple(m.out_features for m in layers)
            for i, n in enumerate(names):
                setattr(parent, n, ProjectionSlice(parent, fused_name, i, sizes, pending))
            fused += 1
    if not fused:
        warnings.warn("fuse_projections: no q/k/v or gate/up group to stack in this model", stacklevel=2)
    return model


def unfuse_projections(model: nn.Module) -> nn.Module:
    """Undo :func:`fuse_projections`: each member a standalone layer again (QuantLinear of copied
    rows, or nn.Linear), the stacked layers removed; returns the model."""
    for parent in list(model.modules()):
        for fused_name, names in GROUPS:
            if not isinstance(getattr(parent, names[0], None), ProjectionSlice):
                continue
            for n in names:
                layer = getattr(parent, n).layer()
                if isinstance(layer, QuantLinear):
                    layer = QuantLinear.concat([layer])  # copies: the views would keep the whole stacked buffers alive
                setattr(parent, n, layer)
            delattr(parent, fused_name)
    return model


def member_layers(model: nn.Module) -> tuple[dict[str, nn.Module], set[str]]:
    """``({member name: standalone layer (views)}, {stacked layers' names})`` of a fused model:
    what ``save_quantized`` writes in place of the stacked layers."""
    members, stacked = {}, set()
    for name, m in model.named_modules():
        if isinstance(m, ProjectionSlice):
            members[name] = m.layer()
            stacked.add(name.rsplit(".", 1)[0] + "." + m.fused_name if "." in name else m.fused_name)
    return members, stacked
