"""Layer-by-layer calibration of a decoder: SmoothQuant, AWQ and GPTQ in one pass over the
layers, so peak memory stays near one decoder layer's activations for the calibration batches.

For each decoder layer, on the hidden states the already-quantized layers before it produce and
with the mask and rotary inputs the model gives its kind of layer (``config.layer_types``:
sliding-window and full attention get different masks; one forward, stopped at the first layer
of the last kind, captures each kind's call):

1. **Statistics pass** (float layer): per-channel ``max |x|`` of every Linear's input, the GPTQ
   Hessians ``X^T X`` and, for AWQ, a sample of the inputs (at most ``AWQ.tokens`` rows).
2. **SmoothQuant**, then **AWQ scales**: each scale vector ``s`` is folded into the op before its
   Linears (norm weight or previous Linear's rows divided, the Linears' columns multiplied), and
   the statistics follow exactly: ``max|x| / s``, ``H / (s s^T)``, ``X / s``. Then AWQ clipping.
3. **Quantization**: GPTQ from the Hessians, else round to nearest; W8A8 static searches its
   ``input_scale`` (:mod:`.static_scales`).
4. **Propagation pass**: the layer's Linears become :class:`FakeQuantLinear` modules (the
   algorithm's own weights and activation quantization) and the layer is run again; its
   outputs are the next layer's inputs.

On the CPU the passes run in float32 (bf16 matmuls are ~10x slower there: 90 vs 8.5 ms for
512x576x1536 on 2 cores); on CUDA in the model's dtype. The norms keep the model's dtype.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..schemes import Scheme
from .awq import AWQ, apply_clip, search_clip, search_scales
from .fake_quant import fake_quant_linear
from .gptq import GPTQ, Hessian, gptq_quantize
from .grid import QuantizedWeight, WeightGrid
from .smoothquant import SmoothQuant, check_foldable, smoothquant_scales
from .static_scales import search_static_scale


class _StopForward(Exception):
    """Raised by the hook that captures the last needed decoder layer's inputs."""


@dataclass
class CalibratedLinear:
    """One calibrated Linear: its scheme, the buffers of its :class:`qfuse.QuantLinear`
    (``tensors``, ``bias``, ``act_perm``) and the algorithm's own float32 weight ``w_hat``."""

    scheme: Scheme
    tensors: dict[str, Tensor | None]
    bias: Tensor | None
    act_perm: Tensor | None
    w_hat: Tensor
    input_scale: Tensor | None = None


@dataclass
class _Stats:
    absmax: Tensor | None = None
    hessian: Hessian | None = None
    samples: list[Tensor] = field(default_factory=list)


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's decoder layers: the largest ``nn.ModuleList`` named ``layers``."""
    found = [(n, m) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] == "layers" and isinstance(m, nn.ModuleList) and len(m)]
    if not found:
        raise ValueError(
            f"calibration runs decoder layer by decoder layer and found no `layers` nn.ModuleList in "
            f"{type(model).__name__} (a Hugging Face Llama / Qwen2 / Mistral decoder is expected)"
        )
    return max(found, key=lambda item: len(item[1]))


def token_batches(data, device: torch.device, pad_token_id: int | None = None) -> list[Tensor]:
    """Calibration token ids as a list of ``[B, T]`` long tensors on ``device``. ``data``: a ``[B, T]``
    or ``[T]`` tensor, a list of them, or a tokenizer's output (a mapping with ``input_ids`` and
    optionally ``attention_mask``): each row of a padded one becomes its own ``[1, T_i]`` batch of
    its unpadded tokens, so padding counts in no statistic and no sequence attends to it. Token
    ids alone carry no mask: rows that start or end with two ``pad_token_id`` (the model's) or more
    get a warning, for their padding would count."""
    if isinstance(data, Mapping):
        data = _unpadded_rows(data)
    if isinstance(data, Tensor):
        data = [data] if data.dim() == 2 else [data.unsqueeze(0)] if data.dim() == 1 else None
        if data is None:
            raise ValueError("calibration_data: a tensor must be [B, T] or [T] token ids")
    batches = []
    for b in data:
        b = torch.as_tensor(b)
        if b.dim() == 1:
            b = b.unsqueeze(0)
        if b.dim() != 2 or b.dtype not in (torch.int32, torch.int64) or b.numel() == 0:
            raise ValueError(f"calibration_data: each batch must be non-empty [B, T] or [T] integer token ids, got {b.dtype} {tuple(b.shape)}")
        batches.append(b.long().to(device))
    if not batches:
        raise ValueError("calibration_data is empty")
    if isinstance(pad_token_id, int) and not isinstance(pad_token_id, bool):
        _warn_padding(batches, pad_token_id)
    return batches


def model_pad_token_id(model: nn.Module):
    """``model.config.pad_token_id`` (None where the model has no config or no pad token)."""
    return getattr(getattr(model, "config", None), "pad_token_id", None)


def _warn_padding(batches: list[Tensor], pad: int) -> None:
    padded = sum(int(((b[:, :2] == pad).all(dim=1) | (b[:, -2:] == pad).all(dim=1)).sum()) for b in batches if b.shape[1] >= 2)
    if padded:
        rows = sum(b.shape[0] for b in batches)
        warnings.warn(
            f"calibration_data: {padded} of {rows} rows start or end with runs of the pad token {pad}, which would count "
            "in the calibration statistics as text; pass the tokenizer's output (input_ids with its attention_mask) "
            "to leave padding out",
            stacklevel=3,
        )


def _unpadded_rows(encoded: Mapping) -> Tensor | list[Tensor]:
    """``input_ids`` of a tokenizer's output, as is without an ``attention_mask``, else a list of
    each row's tokens under its mask (one contiguous run of ones: left or right padding)."""
    if "input_ids" not in encoded:
        raise ValueError(f"calibration_data: a mapping needs input_ids (a tokenizer's output), got keys {sorted(encoded)}")
    ids = torch.as_tensor(encoded["input_ids"])
    if encoded.get("attention_mask") is None:
        return ids
    mask = torch.as_tensor(encoded["attention_mask"])
    if ids.dim() == 1:
        ids, mask = ids.unsqueeze(0), mask.unsqueeze(0)
    if mask.shape != ids.shape:
        raise ValueError(f"calibration_data: attention_mask {tuple(mask.shape)} and input_ids {tuple(ids.shape)} differ in shape")
    rows = []
    for i, (row, keep) in enumerate(zip(ids, mask.bool())):
        at = keep.nonzero().flatten()
        if at.numel() and at[-1] - at[0] + 1 != at.numel():
            raise ValueError(f"calibration_data: row {i}'s attention_mask has gaps (packed sequences?); pass each sequence as its own row")
        if at.numel():
            rows.append(row[at])
    return rows


def layer_kinds(model: nn.Module, n: int) -> list[str]:
    """Each decoder layer's attention kind, from ``config.layer_types`` (Hugging Face: "full_attention",
    "sliding_attention", ...), or "" for all where the model declares none. The model gives the
    layers of one kind the same mask and rotary inputs (Gemma 3: its local rotary base too)."""
    kinds = getattr(getattr(model, "config", None), "layer_types", None)
    return [str(k) for k in kinds] if isinstance(kinds, (list, tuple)) and len(kinds) == n else [""] * n


@torch.no_grad()
def _capture_inputs(model: nn.Module, firsts: dict[str, nn.Module], batches: list[Tensor]) -> dict[str, list[tuple[tuple, dict]]]:
    """Per layer kind, the positional and keyword arguments the kind's first decoder layer
    (``firsts``) is called with, per batch; each batch's forward stops at the last of them."""
    captured: dict[str, list] = {k: [] for k in firsts}

    def hook(kind):
        def record(module, args, kwargs):
            captured[kind].append((args, kwargs))
            if all(len(c) == len(captured[kind]) for c in captured.values()):
                raise _StopForward

        return record

    handles = [layer.register_forward_pre_hook(hook(k), with_kwargs=True) for k, layer in firsts.items()]
    params = inspect.signature(model.forward).parameters
    # no KV cache for a Hugging Face model; a decoder without the argument (qfuse's TinyLlama) has none
    kwargs = {"use_cache": False} if "use_cache" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()) else {}
    try:
        for b in batches:
            try:
                model(input_ids=b, **kwargs)
            except _StopForward:
                pass
    finally:
        for h in handles:
            h.remove()
    return captured


def _hidden(args: tuple, kwargs: dict) -> Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple, kwargs: dict, h: Tensor) -> tuple[tuple, dict]:
    if args:
        return (h, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": h}


def _cast_floats(obj, dtype: torch.dtype):
    """``obj`` (tensors in tuples / dicts) with floating tensors cast to ``dtype``."""
    if isinstance(obj, Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, tuple):
        return tuple(_cast_floats(o, dtype) for o in obj)
    if isinstance(obj, list):
        return [_cast_floats(o, dtype) for o in obj]
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj


def _run_layer(layer: nn.Module, inputs: list[tuple[tuple, dict]]) -> list[Tensor]:
    outs = []
    for args, kwargs in inputs:
        out = layer(*args, **kwargs)
        outs.append(out[0] if isinstance(out, tuple) else out)
    return outs


def _awq_groups(layer: nn.Module, names: set[str]) -> list[tuple[str, list[str]]]:
    """(previous op, Linears it feeds) of a Llama-style layer, for the Linears being quantized."""
    groups = [
        ("input_layernorm", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
        ("self_attn.v_proj", ["self_attn.o_proj"]),
        ("post_attention_layernorm", ["mlp.gate_proj", "mlp.up_proj"]),
        ("mlp.up_proj", ["mlp.down_proj"]),
    ]
    out = []
    for prev, linears in groups:
        if not all(n in names for n in linears):
            continue
        try:
            p = layer.get_submodule(prev)
        except AttributeError:
            continue
        lin = layer.get_submodule(linears[0])
        if isinstance(p, nn.Linear) and p.out_features != lin.in_features:  # grouped-query attention: v_proj narrower than o_proj
            continue
        out.append((prev, linears))
    return out


def _fold(layer: nn.Module, prev: str, s: Tensor, work: dict[str, Tensor]) -> None:
    """Divide the output channels of ``prev`` (a norm, or a Linear of this layer) by ``s``."""
    if prev in work:
        work[prev] = work[prev] / s.unsqueeze(1)
        bias = layer.get_submodule(prev).bias
        if bias is not None:
            bias.copy_(bias.float() / s)
        return
    mod = layer.get_submodule(prev)
    if isinstance(mod, nn.Linear):  # a Linear left float (ignore=): its output rows
        mod.weight.copy_(mod.weight.float() / s.unsqueeze(1))
        if mod.bias is not None:
            mod.bias.copy_(mod.bias.float() / s)
        return
    for name in ("weight", "bias"):
        t = getattr(mod, name, None)
        if isinstance(t, Tensor):
            t.copy_(t.float() / s)


def _scale_inputs(linears: list[str], s: Tensor, work: dict, stats: dict[str, _Stats]) -> None:
    """The Linears' columns multiplied by ``s``; their input statistics follow ``x -> x / s``."""
    for n in linears:
        work[n] = work[n] * s
    for st in {id(stats[n]): stats[n] for n in linears}.values():
        if st.absmax is not None:
            st.absmax = st.absmax / s
        if st.hessian is not None:
            st.hessian.sum /= s.unsqueeze(0) * s.unsqueeze(1)
        st.samples = [x / s for x in st.samples]


class LayerCalibrator:
    """Runs one recipe on the decoder layers of a model (see the module docstring)."""

    def __init__(self, recipe: list, schemes: dict[str, Scheme], awq_tokens: int = 4096):
        """``awq_tokens``: the input rows each Linear keeps for the AWQ and static-scale searches
        (evenly spaced over the calibration tokens)."""
        self.sq = next((r for r in recipe if isinstance(r, SmoothQuant)), None)
        self.awq = next((r for r in recipe if isinstance(r, AWQ)), None)
        self.gptq = next((r for r in recipe if isinstance(r, GPTQ)), None)
        self.schemes = schemes
        self.awq_tokens = awq_tokens
        self.static = any(s.static_act for s in schemes.values())

    @torch.no_grad()
    def run(self, model: nn.Module, data, progress: bool = True) -> dict[str, CalibratedLinear]:
        prefix, layers = decoder_layers(model)
        device = next(model.parameters()).device
        model_dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        compute = torch.float32 if device.type == "cpu" else model_dtype
        batches = token_batches(data, device, model_pad_token_id(model))
        if self.sq is not None or self.awq is not None:
            check_foldable(layers, " + ".join(type(r).__name__ for r in (self.sq, self.awq) if r))
        kinds = layer_kinds(model, len(layers))
        # each layer runs with the mask / rotary inputs of its kind, on the hidden states the
        # (quantized) layers before it produce
        per_kind = _cast_floats(_capture_inputs(model, {k: layers[kinds.index(k)] for k in dict.fromkeys(kinds)}, batches), compute)
        hidden = [_hidden(a, k) for a, k in per_kind[kinds[0]]]
        per_kind = {kind: [_with_hidden(a, k, None) for a, k in calls] for kind, calls in per_kind.items()}  # only the other arguments
        done: dict[str, CalibratedLinear] = {}
        desc = "qfuse calibrate (" + "+".join(type(r).__name__ for r in (self.sq, self.awq, self.gptq) if r) + ")"
        for i, layer in enumerate(tqdm(layers, desc=desc.replace("()", "(rtn)"), unit="layer", disable=not progress)):
            names = {n for n, m in layer.named_modules() if isinstance(m, nn.Linear) and f"{prefix}.{i}.{n}" in self.schemes}
            layer.to(compute)  # the inputs are in the compute dtype, quantized or not (an ignored layer)
            inputs = [_with_hidden(a, k, h) for (a, k), h in zip(per_kind[kinds[i]], hidden)]
            if names:
                done.update(self._calibrate_layer(layer, f"{prefix}.{i}.", names, inputs, model_dtype))
            hidden = _run_layer(layer, inputs)
            for p in layer.parameters():  # what stays float (the norms, an ignored layer) returns to the model's dtype
                p.data = p.data.to(model_dtype)
            for b in layer.buffers():
                if b.is_floating_point():
                    b.data = b.data.to(model_dtype)
        return done

    def _statistics(self, layer: nn.Module, names: set[str], inputs) -> dict[str, _Stats]:
        """The input statistics of every Linear; those fed by one norm share one :class:`_Stats`
        (q/k/v, gate/up), so their Hessian is accumulated once."""
        stats = {n: _Stats() for n in names}
        hooked = set(names)
        for prev, linears in _awq_groups(layer, names):
            if not isinstance(layer.get_submodule(prev), nn.Linear):
                for n in linears[1:]:
                    stats[n] = stats[linears[0]]
                    hooked.discard(n)
        total = sum(_hidden(a, k).shape[:-1].numel() for a, k in inputs)
        stride = max(total // self.awq_tokens, 1)

        def hook(name):
            def record(module, args):
                x = args[0].reshape(-1, args[0].shape[-1]).float()
                st = stats[name]
                amax = x.abs().amax(dim=0)
                st.absmax = amax if st.absmax is None else torch.maximum(st.absmax, amax)
                if self.gptq is not None:
                    st.hessian = st.hessian or Hessian(x.shape[1], x.device)
                    st.hessian.add(x)
                if self.awq is not None or self.static:
                    st.samples.append(x[::stride].clone())

            return record

        handles = [layer.get_submodule(n).register_forward_pre_hook(hook(n)) for n in hooked]
        try:
            _run_layer(layer, inputs)
        finally:
            for h in handles:
                h.remove()
        return stats

    def _calibrate_layer(self, layer: nn.Module, prefix: str, names: set[str], inputs, model_dtype) -> dict[str, CalibratedLinear]:
        stats = self._statistics(layer, names, inputs)
        work = {n: layer.get_submodule(n).weight.detach().float().clone() for n in names}
        grids = {n: WeightGrid(self.schemes[prefix + n], work[n].shape[1], model_dtype) for n in names}
        if self.sq is not None:
            for norm, linears in _awq_groups(layer, names):
                if isinstance(layer.get_submodule(norm), nn.Linear):
                    continue  # SmoothQuant smooths only what a norm feeds
                s = smoothquant_scales(stats[linears[0]].absmax, [work[n] for n in linears], self.sq.alpha)
                _fold(layer, norm, s, work)
                _scale_inputs(linears, s, work, stats)
        if self.awq is not None:
            for prev, linears in _awq_groups(layer, names):
                x = torch.cat(stats[linears[0]].samples)
                s = search_scales(x, [work[n] for n in linears], [grids[n] for n in linears], self.awq)
                _fold(layer, prev, s, work)
                _scale_inputs(linears, s, work, stats)
            if self.awq.clip:
                for n in sorted(names):
                    if n.rsplit(".", 1)[-1] in ("q_proj", "k_proj"):
                        continue
                    m = search_clip(torch.cat(stats[n].samples), work[n], grids[n], self.awq)
                    work[n] = apply_clip(work[n], m, grids[n].group)
        out = {}
        for n in sorted(names):
            grid, scheme = grids[n], self.schemes[prefix + n]
            if self.gptq is not None:
                q: QuantizedWeight = gptq_quantize(work[n], stats[n].hessian.value(), grid, self.gptq)
            else:
                q = grid.rtn(work[n])
            mod = layer.get_submodule(n)
            bias = None if mod.bias is None else mod.bias.detach().to(model_dtype).clone()
            input_scale = None
            if scheme.static_act:
                input_scale = search_static_scale(torch.cat(stats[n].samples), work[n], stats[n].absmax)
            tensors = grid.pack(q)
            if input_scale is not None:
                tensors["input_scale"] = input_scale
            w_hat = q.dequantized(grid)
            out[prefix + n] = CalibratedLinear(scheme, tensors, bias, q.perm, w_hat, input_scale)
            layer.set_submodule(n, fake_quant_linear(scheme, grid, q, bias, model_dtype, input_scale))
        return out
