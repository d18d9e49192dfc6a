"""compressed-tensors checkpoints (llm-compressor's output, what vLLM and SGLang load):
reading ``pack-quantized`` / ``int-quantized`` / ``naive-quantized`` layers into qfuse, and
writing qfuse layers back.

compressed-tensors stores *signed* codes ``q`` (int4 in [-8, 7], int8 in [-128, 127]) and
signed zero points ``zp``; ``W[n, k] = (q[n, k] - zp[n, g(k)]) * weight_scale[n, g(k)]``.

* ``pack-quantized`` (weight-only): ``weight_packed`` int32 ``[N, ceil(K b / 32)]``, codes
  stored as ``q + 2**(b-1)``, element k in word k // pf (pf = 32 / b), bits b*(k % pf);
  ``weight_shape`` ``[N, K]``; ``weight_zero_point`` (asymmetric only) int32
  ``[ceil(N b / 32), groups]``, the same ``+ 2**(b-1)`` codes packed along N (before
  compressed-tensors 0.9.4: unpacked int8 ``[N, groups]``, also read; a per-tensor zero
  point is never packed: int8 ``[1]``); ``weight_g_idx`` ``[K]`` with ``actorder: group``
  (GPTQ act-order; compressed-tensors 0.20 removed it: its ``QuantizationArgs`` refuses
  ``actorder: group``, so act-order layers, read or written, need an older release or an
  engine that reads ``weight_g_idx`` itself).
* ``int-quantized`` / ``naive-quantized``: ``weight`` int8 ``[N, K]`` holding ``q``; with int8
  activations, ``input_scale`` ``[1]`` for static per-tensor activation scales.
* ``weight_scale``: ``[N, groups]`` (group), ``[N, 1]`` (channel) or ``[1]`` (tensor).

A group layer whose in_features K the group size G does not divide has ``groups = ceil(K / G)``
scale (and zero-point) columns, the last one covering the K % G last inputs (the shapes
compressed-tensors allocates; its 0.20 compressors refuse to write or read such a layer, its
block strategy ``[1, G]`` computes the same). qfuse's kernels run no partial group, but the
layer is exactly a layer of group g' = the largest group they run (128, 64, 32) dividing
both G and K: each scale / zero-point column repeated G / g' times, cut to K / g' columns.
Without such a g' (K not a multiple of 32, say), or with act-order, the layer is refused.

Since the stored ``q + 2**(b-1)`` is exactly qfuse's unsigned code with the implicit zero
point ``2**(b-1)``, 4-bit ``weight_packed`` words hold qfuse's byte layout bit for bit.

Schemes the format cannot express: W4A8 with group 128 uses an integer second-level scale
(``w_int = q * group_scale``, an exact int8 in [-128, 112]). qfuse writes those layers as
standard int-quantized W8A8 layers holding ``w_int`` (so every engine runs identical math,
with 8-bit weight storage) and lists them in ``config.json`` under :data:`EXTENSION_KEY`, so
qfuse reloads them as 4-bit W4A8_G128 (its ``group_sizes`` names the layers of group 64 or 32,
those whose K 128 does not divide).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from ..linear import QuantLinear
from ..ops.int4_packing import pack_int4, unpack_int4
from ..ops.quant_int8 import check_static_scale
from ..ops.w4a8_gemm import GROUP_SCALE_MAX, w4a8_int_weight
from ..schemes import W4A8_GROUP_SIZES, WNA16_GROUP_SIZES, Scheme, make_scheme
from .base import FLOAT_DTYPES, LayerSpec, optional_bias, wna16_linear
from .files import CheckpointError, CheckpointFiles
from .packing import pack_int32, unpack_int32

NAME = "compressed-tensors"
EXTENSION_KEY = "qfuse_extension"
EXTENSION_NAME = "qfuse.w4a8_integer_group_scale"
W4A8_G128 = "W4A8_G128"
_LAYER_TENSORS = (
    "weight_packed",
    "weight_shape",
    "weight_scale",
    "weight_zero_point",
    "weight_g_idx",
    "weight",
    "input_scale",
    "input_zero_point",
    "bias",
)


def is_compressed_tensors(qc: dict) -> bool:
    return str(qc.get("quant_method", "")).lower() == NAME


def _matches(prefix: str, target: str) -> bool:
    """compressed-tensors target matching: an exact module name, ``re:<regex>`` (re.match), or
    a class name. Only linear layers are read, so ``Linear`` is the class name that matches."""
    if target.startswith("re:"):
        return re.match(target[3:], prefix) is not None
    return target == prefix or target == "Linear"


# the layer formats whose tensors qfuse reads (weight_packed words, or int weights)
LAYER_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")


class CompressedTensorsCheckpoint:
    """The quantized layers of a compressed-tensors checkpoint."""

    name = NAME

    def __init__(self, files: CheckpointFiles, qc: dict, config: dict):
        self.files = files
        p = files.path
        status = qc.get("quantization_status", "compressed")
        if status != "compressed":
            raise CheckpointError(f"{p}: quantization_status is {status!r}; qfuse reads 'compressed' checkpoints")
        for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
            if qc.get(key):
                raise CheckpointError(f"{p}: compressed-tensors {key} is not supported by qfuse")
        self.groups = qc.get("config_groups")
        if not isinstance(self.groups, dict) or not self.groups:
            raise CheckpointError(f"{p}: quantization_config has no config_groups")
        self.default_format = qc.get("format")
        if self.default_format not in (None, "mixed-precision", *LAYER_FORMATS):
            raise CheckpointError(f"{p}: compressed-tensors format {self.default_format!r} is not supported (qfuse reads {', '.join(LAYER_FORMATS)})")
        self.ignore = list(qc.get("ignore") or [])
        ext = config.get(EXTENSION_KEY) or {}
        if ext and ext.get("name") != EXTENSION_NAME:
            raise CheckpointError(f"{p}: unknown {EXTENSION_KEY} {ext.get('name')!r}")
        self.w4a8_g128_layers = set(ext.get("layers", ()))
        self.w4a8_groups = {name: 128 for name in self.w4a8_g128_layers}  # prefix -> the layer's group size
        for name, g in (ext.get("group_sizes") or {}).items():
            if name not in self.w4a8_g128_layers or g not in W4A8_GROUP_SIZES:
                raise CheckpointError(
                    f"{p}: {EXTENSION_KEY} group_sizes: {name!r}: {g!r} is not a listed layer with a group size in {W4A8_GROUP_SIZES}"
                )
            self.w4a8_groups[name] = g
        self.stored_group: dict[str, int] = {}  # prefix -> the checkpoint's group size G of a layer regrouped at g' < G

    def _group(self, prefix: str) -> dict:
        where = f"{self.files.path}: layer {prefix}"
        if any(_matches(prefix, t) for t in self.ignore):
            raise CheckpointError(f"{where} has quantized tensors but the config's ignore list names it")
        # as compressed-tensors' apply_quantization_config: a target names the last group that
        # lists it; of the targets that match, an exact name wins over a regex (each kind in
        # sorted order), and a regex over the class name
        group_of = {t: g for g in self.groups.values() for t in g.get("targets", ())}
        by_name = sorted((t for t in group_of if t != "Linear" and _matches(prefix, t)), key=lambda t: ("re:" in t, t))
        found = by_name or [t for t in group_of if t == "Linear"]
        if not found:
            raise CheckpointError(f"{where} has quantized tensors but no config group targets it")
        return group_of[found[0]]

    def _scheme(self, prefix: str, group: dict) -> tuple[Scheme, bool]:
        """(qfuse scheme, act_order) of one layer from its config group."""
        where = f"{self.files.path / 'config.json'}: layer {prefix}"
        w, a = group.get("weights") or {}, group.get("input_activations")
        fmt = group.get("format") or self.default_format
        if fmt not in (None, *LAYER_FORMATS):
            raise CheckpointError(f"{where}: compressed-tensors format {fmt!r} is not supported (qfuse reads {', '.join(LAYER_FORMATS)})")
        if group.get("output_activations"):
            raise CheckpointError(f"{where}: output activation quantization is not supported")
        if w.get("type", "int") != "int" or a and a.get("type", "int") != "int":
            raise CheckpointError(f"{where}: only integer quantization is supported (got weights type {w.get('type')!r})")
        try:
            bits, group_size = int(w.get("num_bits", 8)), int(w.get("group_size") or -1)
        except (TypeError, ValueError):
            raise CheckpointError(
                f"{where}: weights num_bits={w.get('num_bits')!r} and group_size={w.get('group_size')!r} must be integers"
            ) from None
        strategy = w.get("strategy") or ("group" if group_size > 0 else "channel")
        if strategy not in ("group", "channel", "tensor"):
            raise CheckpointError(f"{where}: weight strategy {strategy!r} is not supported (group, channel, tensor)")
        if strategy == "group" and group_size <= 0:
            raise CheckpointError(f"{where}: weight strategy 'group' needs a positive group_size, got {w.get('group_size')!r}")
        group_size = group_size if strategy == "group" else -1
        act_order = w.get("actorder") in ("group", "dynamic", True)
        try:
            if a is None and prefix in self.w4a8_g128_layers:
                raise ValueError(f"{EXTENSION_NAME} layers are dynamic W8A8 per-channel layers, this one is weight-only")
            if a is None:
                return make_scheme(bits, 16, group_size, bool(w.get("symmetric", True))), act_order
            if int(a.get("num_bits", 8)) != 8 or not a.get("symmetric", True):
                raise ValueError("activations must be symmetric int8")
            dynamic = a.get("dynamic", False)
            a_strategy = a.get("strategy")
            if not ((a_strategy == "token" and dynamic is True) or (a_strategy == "tensor" and dynamic is False)):
                raise ValueError(
                    f"activation strategy {a_strategy!r} with dynamic={dynamic!r} is not supported (dynamic per-token or static per-tensor)"
                )
            if act_order:
                raise ValueError("act-order with int8 activations is not supported")
            if prefix in self.w4a8_g128_layers:
                if bits != 8 or strategy != "channel" or a_strategy != "token":
                    raise ValueError(f"{EXTENSION_NAME} layers are dynamic W8A8 per-channel layers")
                return make_scheme(4, 8, self.w4a8_groups[prefix], True), False
            if not w.get("symmetric", True):
                raise ValueError("int8-activation layers need symmetric weights")
            if bits == 4 and strategy == "group":
                raise ValueError(
                    "W4A8 with floating-point group scales cannot run exactly on qfuse's W4A8 kernels "
                    "(their group scale is an integer); quantize the float model with W4A8_G128 instead"
                )
            return make_scheme(bits, 8, -1, True, static_act=a_strategy == "tensor"), False
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from None

    def layers(self) -> dict[str, LayerSpec]:
        specs = {}
        f = self.files
        for name in f.names():
            prefix, _, leaf = name.rpartition(".")
            if leaf != "weight_scale" or prefix in specs:
                continue
            scheme, act_order = self._scheme(prefix, self._group(prefix))
            if f"{prefix}.weight_packed" in f:
                shape = f.get(f"{prefix}.weight_shape", (torch.int64, torch.int32), (2,))
                n, k = (int(v) for v in shape)
                packed, want = f.shape(f"{prefix}.weight_packed"), (n, -(-k * scheme.weight_bits // 32))
                if packed != want:
                    raise CheckpointError(
                        f"{f.where(prefix)}: tensor '{prefix}.weight_packed' has shape {list(packed)}, but "
                        f"'{prefix}.weight_shape' {[n, k]} with {scheme.weight_bits}-bit codes needs {list(want)}"
                    )
            elif f"{prefix}.weight" in f:
                n, k = f.shape(f"{prefix}.weight")
            else:
                raise CheckpointError(f"{f.where(prefix)}: layer {prefix} has a weight_scale but neither weight_packed nor weight")
            unused = {
                "weight": f"{prefix}.weight_packed" in f and "the layer's weights are in weight_packed",
                "weight_g_idx": not act_order and "the config sets no group actorder for the layer",
                "input_scale": not scheme.static_act and "the config's activations are not static per-tensor",
            }
            for leaf, why in unused.items():
                if why and f"{prefix}.{leaf}" in f:
                    raise CheckpointError(f"{f.file_of[f'{prefix}.{leaf}']}: tensor '{prefix}.{leaf}' is stored but {why}")
            if scheme.weight_only and scheme.group_size != -1 and k % scheme.group_size:
                scheme = self._regrouped(prefix, scheme, k, act_order)
            tensors = [f"{prefix}.{t}" for t in _LAYER_TENSORS if f"{prefix}.{t}" in f]
            specs[prefix] = LayerSpec(prefix, scheme, n, k, act_order=act_order, tensors=tensors)
        for name in f.names():  # quantized data of a layer without weight_scale would otherwise load as a plain tensor
            prefix, _, leaf = name.rpartition(".")
            if prefix not in specs and (leaf in _LAYER_TENSORS[:5] + ("input_scale",) or leaf == "weight" and f.dtype(name)[0] in "IU"):
                raise CheckpointError(
                    f"{f.file_of[name]}: tensor {name!r} ({f.dtype(name)}) is quantized data, but there is no '{prefix}.weight_scale'"
                )
        for prefix in self.w4a8_g128_layers - set(specs):
            raise CheckpointError(f"{f.path}: {EXTENSION_KEY} lists layer {prefix}, which has no quantized tensors")
        return specs

    def _regrouped(self, prefix: str, scheme: Scheme, k: int, act_order: bool) -> Scheme:
        """The scheme of a weight-only layer whose group G does not divide its in_features K
        (a partial last group): group g' = the largest group the kernels run that divides both
        G and K, so that each stored group is exactly G / g' groups of g' (see the module doc)."""
        g = scheme.group_size
        where = f"{self.files.where(prefix)}: layer {prefix}: {_partial(k, g)}"
        if act_order:
            raise CheckpointError(f"{where}, which qfuse re-expresses only in layers without act-order (weight_g_idx)")
        exact = next((h for h in WNA16_GROUP_SIZES if g % h == 0 and k % h == 0), None)
        if exact is None:
            sizes = ", ".join(str(h) for h in WNA16_GROUP_SIZES)
            raise CheckpointError(
                f"{where}, and no group size qfuse's kernels run ({sizes}) divides both, so the layer cannot be re-expressed exactly"
            )
        self.stored_group[prefix] = g
        return make_scheme(scheme.weight_bits, 16, exact, scheme.symmetric)

    def _signed_codes(self, spec: LayerSpec, bits: int, where: str) -> Tensor:
        """The layer's signed codes ``q`` as int16 ``[N, K]``."""
        f, p = self.files, spec.prefix
        n, k = spec.out_features, spec.in_features
        if f"{p}.weight_packed" in f:
            if bits not in (4, 8):
                raise CheckpointError(f"{where}: {bits}-bit weights are not supported (qfuse runs 4- and 8-bit)")
            words = f.get(f"{p}.weight_packed", (torch.int32,), (n, -(-k * bits // 32)))
            return unpack_int32(words, bits, dim=1)[:, :k].to(torch.int16) - (1 << (bits - 1))
        q = f.get(f"{p}.weight", (torch.int8,), (n, k)).to(torch.int16)
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if q.numel() and (int(q.min()) < lo or int(q.max()) > hi):
            raise CheckpointError(f"{where}: weight codes lie in [{int(q.min())}, {int(q.max())}], outside the {bits}-bit range [{lo}, {hi}]")
        return q

    def _scale(self, spec: LayerSpec, groups: int, where: str) -> Tensor:
        """``weight_scale`` as ``[N, groups]`` (a per-tensor scale broadcast over N)."""
        t = self.files.get(f"{spec.prefix}.weight_scale", FLOAT_DTYPES)
        n = spec.out_features
        if t.numel() == 1 and groups == 1:
            return t.reshape(1, 1).expand(n, 1).contiguous()
        if tuple(t.shape) != (n, groups):
            raise CheckpointError(f"{where}: weight_scale has shape {list(t.shape)}, expected [{n}, {groups}]")
        return t

    def build(self, spec: LayerSpec, dtype: torch.dtype) -> QuantLinear:
        f, p, s = self.files, spec.prefix, spec.scheme
        where = f"{f.where(p)}: layer {p}"
        n, k = spec.out_features, spec.in_features
        if s.group_size != -1 and k % s.group_size:
            raise CheckpointError(f"{where}: in_features={k} is not divisible by group_size={s.group_size}")
        stored = self.stored_group.get(p)  # a partial last group: stored with group G, run with s.group_size
        groups = 1 if s.group_size == -1 else k // s.group_size if stored is None else -(-k // stored)
        # where errors about the per-group tensors say why the layer has the group count it has
        gwhere = where if stored is None else f"{where}: {_partial(k, stored)}"
        bias = optional_bias(f, p, n)
        if s.weight_only:
            bits = s.weight_bits
            q = self._signed_codes(spec, bits, where)
            zeros = None
            if f"{p}.weight_zero_point" in f:
                zp = f.get(f"{p}.weight_zero_point", (torch.int32, torch.int8))
                if zp.dtype == torch.int32:  # packed along N (compressed-tensors >= 0.9.4)
                    if zp.shape != (-(-n * bits // 32), groups):
                        raise CheckpointError(f"{gwhere}: weight_zero_point has shape {list(zp.shape)}, expected [{-(-n * bits // 32)}, {groups}]")
                    zeros = unpack_int32(zp, bits, dim=0)[:n]
                else:  # unpacked: before 0.9.4, and per-tensor ([1]) zero points, which are never packed
                    if zp.numel() == 1 and groups == 1:
                        zp = zp.reshape(1, 1).expand(n, 1)
                    if zp.shape != (n, groups):
                        raise CheckpointError(f"{gwhere}: weight_zero_point has shape {list(zp.shape)}, expected [{n}, {groups}]")
                    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
                    if zp.numel() and (int(zp.min()) < lo or int(zp.max()) > hi):
                        raise CheckpointError(
                            f"{where}: weight_zero_point values lie in [{int(zp.min())}, {int(zp.max())}], outside the {bits}-bit range [{lo}, {hi}]"
                        )
                    zeros = (zp.to(torch.int16) - lo).to(torch.uint8)
                if s.symmetric and bool((zeros != 1 << (bits - 1)).any()):  # older compressed-tensors stored zeros for symmetric layers
                    raise CheckpointError(f"{where}: the config says symmetric but weight_zero_point holds nonzero zero points")
            elif not s.symmetric:
                raise CheckpointError(f"{where}: the config says asymmetric but weight_zero_point is missing")
            codes = (q + (1 << (bits - 1))).to(torch.uint8)
            g_idx = f.get(f"{p}.weight_g_idx", (torch.int32, torch.int64), (k,)) if spec.act_order else None
            if g_idx is not None and g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
                raise CheckpointError(f"{where}: weight_g_idx values must lie in [0, {groups})")
            scale = self._scale(spec, groups, gwhere)
            if stored is not None:  # each stored group is stored / g' groups of g' (the last cut to K)
                repeat, run_groups = stored // s.group_size, k // s.group_size
                scale, zeros = (None if t is None else _regroup(t, repeat, run_groups) for t in (scale, zeros))
            return wna16_linear(spec, codes, scale, zeros, bias, g_idx, dtype, where)
        if f"{p}.weight_zero_point" in f and bool(f.get(f"{p}.weight_zero_point").any()):
            raise CheckpointError(f"{where}: weight_zero_point holds nonzero zero points, but int8-activation layers are symmetric")
        # releases before mid 2024 also stored the (all-zero) input zero point of symmetric static layers
        if f"{p}.input_zero_point" in f and bool(f.get(f"{p}.input_zero_point").any()):
            raise CheckpointError(f"{where}: input_zero_point is not zero; int8 activations must be symmetric")
        tensors: dict[str, Tensor | None] = {}
        if p in self.w4a8_g128_layers:
            w_int = self._signed_codes(spec, 8, where)
            u, group_scale = _factor_w4a8_groups(w_int, s.group_size, where)
            tensors.update(qweight=pack_int4(u), group_scale=group_scale)
            w_scale = self._scale(spec, 1, where).reshape(-1)
        else:
            q = self._signed_codes(spec, s.weight_bits, where)
            scale = f.get(f"{p}.weight_scale", FLOAT_DTYPES)
            if scale.numel() not in (1, n):
                raise CheckpointError(f"{where}: weight_scale has shape {list(scale.shape)}, expected [{n}, 1] or [1]")
            if s.weight_bits == 8:
                tensors.update(wq=q.to(torch.int8).contiguous())
                w_scale = scale.reshape(-1)
            else:
                tensors.update(qweight=pack_int4((q + 8).to(torch.uint8)), group_scale=None)
                w_scale = scale.reshape(-1).expand(n)
        tensors["w_scale"] = w_scale.float().contiguous()
        if not bool(torch.isfinite(tensors["w_scale"]).all()):
            raise CheckpointError(f"{where}: weight_scale holds NaN or inf")
        if s.static_act:
            x_scale = f.get(f"{p}.input_scale", FLOAT_DTYPES).float().reshape(-1)
            if x_scale.numel() != 1:
                raise CheckpointError(f"{where}: input_scale must hold one value, got shape {list(x_scale.shape)}")
            try:
                check_static_scale(x_scale)
            except ValueError as e:
                raise CheckpointError(f"{where}: input_scale: {e}") from None
            tensors["input_scale"] = x_scale
        return QuantLinear(k, n, s, tensors, None if bias is None else bias.to(dtype))


def _partial(k: int, group_size: int) -> str:
    return f"in_features={k} is not divisible by group_size={group_size} (a partial last group)"


def _regroup(t: Tensor, repeat: int, groups: int) -> Tensor:
    """Per-group values ``t`` [N, ceil(K / G)] as [N, K / g'] for g' = G / ``repeat``."""
    return t.repeat_interleave(repeat, dim=1)[:, :groups].contiguous()


def _factor_w4a8_groups(w_int: Tensor, group_size: int, where: str) -> tuple[Tensor, Tensor]:
    """Split int8 weights ``w_int`` [N, K] into 4-bit codes ``u = q + 8`` and integer group
    scales ``gs`` in [1, 16] per ``group_size`` inputs with ``q * gs == w_int``: for each group
    the smallest ``gs`` that divides every weight and leaves ``q`` in [-8, 7]. Any such split
    gives the same ``w_int``, so the kernel's result is exact whichever is found."""
    n, k = w_int.shape
    if k % group_size:
        raise CheckpointError(f"{where}: in_features={k} is not divisible by the {EXTENSION_KEY} group size {group_size}")
    wg = w_int.reshape(n, k // group_size, group_size).to(torch.int32)
    gs = torch.zeros(n, k // group_size, dtype=torch.int32)
    for cand in range(GROUP_SCALE_MAX, 0, -1):  # one candidate at a time: 4 bytes per weight
        q = torch.div(wg, cand, rounding_mode="floor")
        ok = ((q * cand == wg) & (q >= -8) & (q <= 7)).all(-1)
        gs = torch.where(ok, cand, gs)  # descending, so the smallest working candidate is kept
    if not bool((gs > 0).all()):
        raise CheckpointError(f"{where}: weights are not 4-bit codes times an integer group scale in [1, 16]")
    u = (wg // gs.unsqueeze(-1) + 8).reshape(n, k).to(torch.uint8)
    return u, gs.to(torch.int8)


# ----------------------------------------------------------------------------- writing


def _args(bits: int, strategy: str, group_size: int | None, symmetric: bool = True, actorder: str | None = None) -> dict:
    return {
        "num_bits": bits,
        "type": "int",
        "symmetric": symmetric,
        "strategy": strategy,
        "group_size": group_size,
        "dynamic": False,
        "actorder": actorder,
        "observer": "minmax",
        "observer_kwargs": {},
        "block_structure": None,
    }


def _act_args(static: bool) -> dict:
    return {
        "num_bits": 8,
        "type": "int",
        "symmetric": True,
        "strategy": "tensor" if static else "token",
        "group_size": None,
        "dynamic": not static,
        "actorder": None,
        "observer": "minmax" if static else None,
        "observer_kwargs": {},
        "block_structure": None,
    }


def _pad_to(t: Tensor, dim: int, multiple: int) -> Tensor:
    extra = -t.shape[dim] % multiple
    if not extra:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def layer_to_ct(layer: QuantLinear) -> tuple[dict, dict[str, Tensor], bool]:
    """One QuantLinear -> (its config group entry: weights / input_activations / format,
    its tensors by local name, whether it uses the W4A8_G128 extension)."""
    s = layer.scheme
    n, k = layer.out_features, layer.in_features
    perm = layer.act_perm
    if s.weight_only:
        bits, g = s.weight_bits, s.group_size
        u = unpack_int4(layer.qweight) if bits == 4 else layer.qweight
        out = {}
        actorder = None
        if perm is not None:  # back to the model's input-channel order, with the groups in g_idx
            u = torch.empty_like(u).index_copy_(1, perm, u)
            gg = k if g == -1 else g
            g_idx = torch.empty(k, dtype=torch.int32).index_copy_(0, perm.cpu(), (torch.arange(k, dtype=torch.int32) // gg))
            out["weight_g_idx"] = g_idx
            actorder = "group"
        out["weight_packed"] = pack_int32(_pad_to(u, 1, 32 // bits), bits, dim=1)
        out["weight_scale"] = layer.scales.contiguous()
        out["weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
        if layer.zeros is not None:
            out["weight_zero_point"] = pack_int32(_pad_to(layer.zeros, 0, 32 // bits), bits, dim=0)
        strategy, group_size = ("channel", None) if g == -1 else ("group", g)
        entry = {"weights": _args(bits, strategy, group_size, layer.zeros is None, actorder), "input_activations": None, "format": "pack-quantized"}
        return entry, out, False
    if perm is not None:
        raise ValueError("an int8-activation layer with act_perm cannot be saved")
    out = {}
    extension = False
    if s.weight_bits == 8:
        out["weight"] = layer.wq.contiguous()
        w_scale = layer.w_scale.float()
        bits = 8
    elif s.group_size == -1:
        out["weight"] = (unpack_int4(layer.qweight).to(torch.int16) - 8).to(torch.int8)
        w_scale = layer.w_scale.float()
        bits = 4
    else:
        out["weight"] = w4a8_int_weight(layer.qweight, layer.group_scale, s.group_size).to(torch.int8)
        w_scale = layer.w_scale.float()
        bits, extension = 8, True
    # one scale for several output channels is per tensor; a layer of one output channel (Qwen2-MoE's
    # shared_expert_gate) is per channel, which the W4A8_G128 extension requires
    strategy = "tensor" if w_scale.numel() == 1 and n > 1 else "channel"
    out["weight_scale"] = w_scale.reshape(-1, 1) if strategy == "channel" else w_scale.reshape(1)
    if s.static_act:
        out["input_scale"] = layer.input_scale.float().reshape(1)
    entry = {"weights": _args(bits, strategy, None), "input_activations": _act_args(s.static_act), "format": "int-quantized"}
    return entry, out, extension
