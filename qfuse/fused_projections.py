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
and on float ``nn.Linear`` groups (the bf16 baseline). The model's ``state_dict`` gives the
members' entries under their own names (views of the stacked rows; a member keeps its own bias
or none), and ``load_state_dict`` takes them, so transformers' ``save_pretrained`` writes what the
unfused architecture loads; ``save_quantized`` writes the members too (what serving engines
load); ``unfuse_projections`` restores them.
"""

from __future__ import annotations

import functools
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

    def __init__(self, parent: nn.Module, fused_name: str, index: int, sizes: tuple[int, ...], pending: _Pending, has_bias: bool = True):
        super().__init__()
        self.fused_name, self.index, self.sizes = fused_name, index, sizes
        self.has_bias = has_bias  # the member's own; the stacked layer has zeros for a member without one
        self.start, self.out_features = sum(sizes[:index]), sizes[index]
        self.in_features = getattr(parent, fused_name).in_features
        # plain attributes: the parent is not a child (no cycle in modules() / state_dict)
        self.__dict__["_parent"] = parent
        self.__dict__["_pending"] = pending

    @property
    def fused(self) -> nn.Module:
        return getattr(self._parent, self.fused_name)

    @property
    def _own_bias(self) -> bool:
        """Whether this member has a bias (the stacked layer's rows of it; zeros stand for none)."""
        return self.fused.bias is not None and getattr(self, "has_bias", True)

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
        ``nn.Linear`` of copies of the stacked layer's rows; a bias only if the member had one."""
        fused, stop, bias = self.fused, self.start + self.out_features, self._own_bias
        if isinstance(fused, QuantLinear):
            layer = fused.rows(self.start, stop)
            if not bias:
                layer.register_buffer("bias", None)
            return layer
        lin = nn.Linear(self.in_features, self.out_features, bias=bias, device=fused.weight.device, dtype=fused.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(fused.weight[self.start : stop])
            if bias:
                lin.bias.copy_(fused.bias[self.start : stop])
        return lin.requires_grad_(fused.weight.requires_grad)

    def state(self) -> dict[str, Tensor]:
        """This member's entries of a state_dict: views of the stacked layer's rows (the member's bias
        only if it had one)."""
        fused, stop = self.fused, self.start + self.out_features
        if isinstance(fused, QuantLinear):
            return self.layer().state_dict()
        out = {"weight": fused.weight.detach()[self.start : stop]}
        if self._own_bias:
            out["bias"] = fused.bias.detach()[self.start : stop]
        return out

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
            for i, (n, m) in enumerate(zip(names, layers)):
                setattr(parent, n, ProjectionSlice(parent, fused_name, i, sizes, pending, m.bias is not None))
            parent._register_state_dict_hook(functools.partial(_member_entries, fused_name=fused_name, names=names))
            parent._register_load_state_dict_pre_hook(functools.partial(_stacked_entries, fused_name=fused_name, names=names), with_module=True)
            fused += 1
    if not fused:
        warnings.warn("fuse_projections: no q/k/v or gate/up group to stack in this model", stacklevel=2)
    return model


def _member_entries(module, state_dict, prefix, local_metadata, fused_name, names):
    """state_dict hook of a fused parent: the stacked layer's entries given as its members' (the
    names the model's architecture and other tools load), views of its rows."""
    stacked = f"{prefix}{fused_name}."
    for key in [k for k in state_dict if k.startswith(stacked)]:
        del state_dict[key]
    for n in names:
        state_dict.update({f"{prefix}{n}.{k}": v for k, v in getattr(module, n).state().items()})


def _stacked_entries(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs, fused_name, names):
    """load_state_dict pre-hook of a fused parent: members' entries (a state_dict of this model or of
    the unfused architecture) stacked into the stacked layer's."""
    stacked = f"{prefix}{fused_name}."
    if any(k.startswith(stacked) for k in state_dict):
        return
    fused = getattr(module, fused_name)
    slices = [getattr(module, n) for n in names]
    for key, target in fused.state_dict(keep_vars=True).items():
        member_keys = [f"{prefix}{n}.{key}" for n in names]
        parts = [state_dict.get(k) for k in member_keys]
        per_row = key == "weight" or key == "bias" or (isinstance(fused, QuantLinear) and fused._per_row(key))
        if all(p is None for p in parts) or (key != "bias" and any(p is None for p in parts)):
            continue  # load_state_dict names the stacked entry missing and the members' unexpected
        for k in member_keys:
            state_dict.pop(k, None)
        if not per_row:  # the input permutation, a static input scale: one for every member
            state_dict[stacked + key] = parts[0]
            continue
        ref, rows = next(p for p in parts if p is not None), []
        for p, sl in zip(parts, slices):
            if p is None:  # a member without a bias: zeros in the stacked one
                p = ref.new_zeros(sl.out_features)
            elif p.shape[0] != sl.out_features:  # a member's per-tensor weight scale, per row in the stack
                p = p.expand(sl.out_features, *p.shape[1:])
            rows.append(p)
        state_dict[stacked + key] = torch.cat(rows)  # on the entries' device: load_state_dict moves it (or assigns it)


def _drop_hooks(parent: nn.Module, fused_name: str) -> None:
    for hooks in (parent._state_dict_hooks, parent._load_state_dict_pre_hooks):
        for key in [k for k, h in hooks.items() if getattr(getattr(h, "hook", h), "keywords", {}).get("fused_name") == fused_name]:
            del hooks[key]


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
            _drop_hooks(parent, fused_name)
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
