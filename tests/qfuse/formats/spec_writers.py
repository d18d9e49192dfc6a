"""AutoAWQ GEMM and GPTQ checkpoint writers, written from the format reference
(the published GPTQ / AWQ packing layouts), not from qfuse.

The writers use nothing from qfuse (in particular not ``qfuse.formats.packing``): the packing
is the reference pseudocode (one shift per code position of a word, AutoAWQ's interleave
spelled out), so a mistake in qfuse's vectorized unpacking cannot be mirrored here. Each writer returns, per layer, the integer
codes it stored and the weight the *format* defines from them::

    Wt[k, n] = (q[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n]      (Wt = W.T, [K, N])

computed in float32 and rounded once to the scales' dtype (fp16). Both formats' kernels
compute ``scales * (q - z)`` in fp16; that product of an integer below 2**8 and an fp16
scale is exact in float32, so this single rounding is bit-identical to theirs.

Also here: the loading side's counterpart, a small ``nn.Module`` tree whose names match
a checkpoint's layers, and the checks every loader test makes on a loaded layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

import qfuse

# AutoAWQ GEMM: nibble i of a word holds logical column AWQ_ORDER[i] of its 8 columns
# (reference 1.4, WQLinear_GEMM.from_linear's order_map).
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
MODEL_CONFIG = {"architectures": ["SpecTestModel"], "model_type": "spec-test", "torch_dtype": "float16"}


@dataclass
class SpecLayer:
    """What a writer stored for one linear layer, in the formats' own orientation."""

    codes: Tensor  # int64 [K, N], unsigned codes q
    zeros: Tensor  # int64 [groups, N], the real zero points z (no v1 offset)
    scales: Tensor  # fp16 [groups, N]
    g_idx: Tensor  # int64 [K], the scale group of each input channel
    bits: int
    group_size: int  # -1: one group over all of K

    @property
    def weight(self) -> Tensor:
        """The dequantized weight [N, K] the format defines, in the scales' dtype."""
        wt = (self.codes - self.zeros[self.g_idx]).float() * self.scales[self.g_idx].float()
        return wt.t().to(self.scales.dtype).contiguous()

    @property
    def out_features(self) -> int:
        return self.codes.shape[1]

    @property
    def in_features(self) -> int:
        return self.codes.shape[0]


def natural_g_idx(k: int, group_size: int) -> Tensor:
    return torch.arange(k) // (k if group_size == -1 else group_size)


def act_order_g_idx(k: int, group_size: int) -> Tensor:
    """GPTQ desc_act: columns are quantized in the order ``perm`` (GPTQ takes argsort of the
    Hessian diagonal; any permutation is legal, so a random one), groups are consecutive in
    that order, and ``g_idx = (arange(K) // G)[invperm]`` maps each column back."""
    perm = torch.randperm(k)
    invperm = torch.argsort(perm)
    return natural_g_idx(k, group_size)[invperm]


# ----------------------------------------------------------------- quantization math


def _groups_of(w: Tensor, g_idx: Tensor, groups: int) -> list[Tensor]:
    """The columns of ``w`` [N, K] in each scale group, as [N, G] float32 blocks."""
    return [w[:, g_idx == g].float() for g in range(groups)]


def awq_quantize(w: Tensor, group_size: int) -> SpecLayer:
    """AutoAWQ ``pseudo_quantize_tensor(zero_point=True)`` (reference 1.3), per group of
    ``group_size`` input channels; the codes use the fp16 scale that is stored."""
    n, k = w.shape
    g_idx = natural_g_idx(k, group_size)
    scales, zeros = [], []
    for x in _groups_of(w, g_idx, int(g_idx.max()) + 1):
        max_val, min_val = x.amax(dim=1), x.amin(dim=1)
        s = ((max_val - min_val).clamp(min=1e-5) / 15).half()
        scales.append(s)
        zeros.append((-torch.round(min_val / s.float())).clamp(0, 15))
    scales_t, zeros_t = torch.stack(scales), torch.stack(zeros).to(torch.int64)  # [groups, N]
    codes = torch.round(w.float() / scales_t.float()[g_idx].t()) + zeros_t[g_idx].t()
    codes = codes.clamp(0, 15).to(torch.int64).t().contiguous()
    return SpecLayer(codes, zeros_t, scales_t, g_idx, 4, group_size)


def gptq_quantize(w: Tensor, bits: int, group_size: int, sym: bool, g_idx: Tensor, min_zero: int = 0) -> SpecLayer:
    """AutoGPTQ ``Quantizer.find_params`` + ``quantize`` (reference 2.3) per scale group
    (the groups of ``g_idx``: act-order groups are scattered channels). Rounding to nearest,
    without GPTQ's error feedback: the loader only sees codes, zeros and scales.
    ``min_zero=1`` keeps asymmetric zero points off 0 (v1 cannot store 0 for AutoGPTQ's kernels)."""
    maxq = (1 << bits) - 1
    scales, zeros = [], []
    for x in _groups_of(w, g_idx, int(g_idx.max()) + 1):
        xmin = x.amin(dim=1).clamp(max=0)  # the range always includes 0
        xmax = x.amax(dim=1).clamp(min=0)
        if sym:
            xmax = torch.maximum(xmin.abs(), xmax)
            xmin = torch.where(xmin < 0, -xmax, xmin)
        dead = (xmin == 0) & (xmax == 0)
        xmin, xmax = torch.where(dead, -1.0, xmin), torch.where(dead, 1.0, xmax)
        s = ((xmax - xmin) / maxq).half()
        z = torch.full_like(xmin, (maxq + 1) // 2) if sym else torch.round(-xmin / s.float()).clamp(min_zero, maxq)
        scales.append(s)
        zeros.append(z)
    scales_t, zeros_t = torch.stack(scales), torch.stack(zeros).to(torch.int64)
    codes = torch.round(w.float() / scales_t.float()[g_idx].t()) + zeros_t[g_idx].t()
    codes = codes.clamp(0, maxq).to(torch.int64).t().contiguous()
    return SpecLayer(codes, zeros_t, scales_t, g_idx.to(torch.int64), bits, group_size)


# ----------------------------------------------------------------- packing (reference pseudocode)


def as_int32(words: Tensor) -> Tensor:
    """int64 words in [0, 2**32) -> int32 with the same bit pattern (safetensors stores int32)."""
    assert int(words.min()) >= 0 and int(words.max()) < 2**32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(codes: Tensor, bits: int) -> Tensor:
    """GPTQ qweight: ``qweight[r, n] |= q[r*pf + j, n] << (b*j)``; [K, N] -> int32 [K/pf, N]."""
    pf = 32 // bits
    words = torch.zeros(codes.shape[0] // pf, codes.shape[1], dtype=torch.int64)
    for j in range(pf):
        words |= codes[j::pf, :] << (bits * j)
    return as_int32(words)


def pack_columns(values: Tensor, bits: int) -> Tensor:
    """GPTQ qzeros: ``qzeros[g, c] |= zs[g, c*pf + j] << (b*j)``; [R, N] -> int32 [R, N/pf]."""
    pf = 32 // bits
    words = torch.zeros(values.shape[0], values.shape[1] // pf, dtype=torch.int64)
    for j in range(pf):
        words |= values[:, j::pf] << (bits * j)
    return as_int32(words)


def awq_pack(values: Tensor) -> Tensor:
    """AutoAWQ GEMM: ``qweight[:, c] |= intw[:, 8c + AWQ_ORDER[i]] << 4i``; [R, N] -> int32 [R, N/8]."""
    words = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int64)
    for i, column in enumerate(AWQ_ORDER):
        words |= values[:, column::8] << (4 * i)
    return as_int32(words)


def gptq_stored_zeros(zeros: Tensor, bits: int, fmt: str) -> Tensor:
    """The qzeros words: v2 stores z; v1 stores z - 1, masked per code (reference 2.5), so a
    zero point of 0 becomes 2**b - 1 in its own code position and nothing else changes."""
    mask = (1 << bits) - 1
    return pack_columns((zeros - 1) & mask if fmt == "gptq" else zeros, bits)


def autogptq_unmasked_v1_zeros(zeros: Tensor, bits: int) -> Tensor:
    """AutoGPTQ's historical v1 packing (reference 2.5): ``z - 1`` cast to uint32 and OR-ed in
    unmasked, so a zero point of 0 (-1 = 0xFFFFFFFF) sets every higher bit of its word."""
    pf = 32 // bits
    stored = (zeros - 1) & 0xFFFFFFFF
    words = torch.zeros(zeros.shape[0], zeros.shape[1] // pf, dtype=torch.int64)
    for j in range(pf):
        words |= (stored[:, j::pf] << (bits * j)) & 0xFFFFFFFF
    return as_int32(words)


# ----------------------------------------------------------------- files


def _save(path: Path, tensors: dict[str, Tensor], config: dict, side_config: tuple[str, dict] | None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if side_config is not None:
        (path / side_config[0]).write_text(json.dumps(side_config[1], indent=2))


def write_awq_layers(
    path: Path,
    layers: dict[str, SpecLayer],
    group_size: int,
    extra_tensors: dict[str, Tensor] | None = None,
    config_style: str = "config.json",
    version: str = "gemm",
) -> None:
    """Store already-quantized layers as an AutoAWQ GEMM checkpoint (reference 1.2)."""
    tensors = dict(extra_tensors or {})
    for prefix, layer in layers.items():
        tensors[f"{prefix}.qweight"] = awq_pack(layer.codes)  # [K, N/8]
        tensors[f"{prefix}.qzeros"] = awq_pack(layer.zeros)  # [K/G, N/8]
        tensors[f"{prefix}.scales"] = layer.scales  # [K/G, N]
    if config_style == "config.json":  # transformers' AwqConfig
        qc = {"quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": version, "modules_to_not_convert": None}
        _save(Path(path), tensors, {**MODEL_CONFIG, "quantization_config": qc}, None)
    elif config_style == "quant_config.json":  # older AutoAWQ: its own key names, no quant_method
        qc = {"zero_point": True, "q_group_size": group_size, "w_bit": 4, "version": version.upper()}
        _save(Path(path), tensors, dict(MODEL_CONFIG), ("quant_config.json", qc))
    else:
        raise ValueError(config_style)


def write_awq(
    path: Path, layers: dict[str, Tensor], group_size: int, extra_tensors: dict[str, Tensor] | None = None, config_style: str = "config.json"
) -> dict[str, SpecLayer]:
    """Quantize float weights ``[N, K]`` the AutoAWQ way and write the checkpoint."""
    quantized = {prefix: awq_quantize(w, group_size) for prefix, w in layers.items()}
    write_awq_layers(path, quantized, group_size, extra_tensors, config_style)
    return quantized


def write_gptq_layers(
    path: Path,
    layers: dict[str, SpecLayer],
    *,
    bits: int,
    group_size: int,
    sym: bool,
    fmt: str,
    desc_act: bool,
    config_style: str = "config.json",
    extra_tensors: dict[str, Tensor] | None = None,
    dynamic: dict | None = None,
    format_key: str = "checkpoint_format",
) -> None:
    """Store already-quantized layers as a GPTQ checkpoint (reference 2.2, 2.4, 2.5); each
    layer is packed with its own bits (a ``dynamic`` override may differ from ``bits``)."""
    assert fmt in ("gptq", "gptq_v2")
    tensors = dict(extra_tensors or {})
    for prefix, layer in layers.items():
        tensors[f"{prefix}.qweight"] = pack_rows(layer.codes, layer.bits)
        tensors[f"{prefix}.qzeros"] = gptq_stored_zeros(layer.zeros, layer.bits, fmt)
        tensors[f"{prefix}.scales"] = layer.scales
        tensors[f"{prefix}.g_idx"] = layer.g_idx.to(torch.int32)  # always written, act-order or not
    qc = {
        "bits": bits,
        "group_size": group_size,
        "desc_act": desc_act,
        "sym": sym,
        "damp_percent": 0.01,
        "static_groups": False,
        "true_sequential": True,
        format_key: fmt,
    }
    if dynamic is not None:
        qc["dynamic"] = dynamic
    if config_style == "config.json":  # transformers / GPTQModel
        _save(Path(path), tensors, {**MODEL_CONFIG, "quantization_config": {**qc, "quant_method": "gptq"}}, None)
    elif config_style == "quantize_config.json":  # AutoGPTQ: no quant_method in its file
        _save(Path(path), tensors, dict(MODEL_CONFIG), ("quantize_config.json", {**qc, "model_file_base_name": "model"}))
    else:
        raise ValueError(config_style)


def write_gptq(
    path: Path,
    layers: dict[str, Tensor],
    *,
    bits: int,
    group_size: int,
    sym: bool,
    fmt: str = "gptq",
    desc_act: bool = False,
    config_style: str = "config.json",
    extra_tensors: dict[str, Tensor] | None = None,
    overrides: dict[str, dict] | None = None,
    dynamic: dict | None = None,
    format_key: str = "checkpoint_format",
) -> dict[str, SpecLayer]:
    """Quantize float weights ``[N, K]`` the GPTQ way and write the checkpoint.

    ``overrides``: per-layer ``{"bits", "group_size"}`` the layer is quantized with instead (the
    test writes the matching ``dynamic`` itself). v1 asymmetric zero points avoid 0, the case
    AutoGPTQ stored lossily (reference 2.5); ``write_gptq_layers`` takes any codes.
    """
    quantized = {}
    for prefix, w in layers.items():
        args = {"bits": bits, "group_size": group_size, **(overrides or {}).get(prefix, {})}
        k = w.shape[1]
        g_idx = act_order_g_idx(k, args["group_size"]) if desc_act else natural_g_idx(k, args["group_size"])
        min_zero = 1 if fmt == "gptq" and not sym else 0
        quantized[prefix] = gptq_quantize(w, args["bits"], args["group_size"], sym, g_idx, min_zero)
    write_gptq_layers(
        path,
        quantized,
        bits=bits,
        group_size=group_size,
        sym=sym,
        fmt=fmt,
        desc_act=desc_act,
        config_style=config_style,
        extra_tensors=extra_tensors,
        dynamic=dynamic,
        format_key=format_key,
    )
    return quantized


def edit_quant_config(path: Path, **changes) -> None:
    """Change keys of a written checkpoint's quantization config, wherever it lives."""
    path = Path(path)
    for name in ("quantize_config.json", "quant_config.json"):
        if (path / name).is_file():
            qc = json.loads((path / name).read_text())
            (path / name).write_text(json.dumps({**qc, **changes}))
            return
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"].update(changes)
    (path / "config.json").write_text(json.dumps(config))


def edit_tensor(path: Path, name: str, value: Tensor | None) -> None:
    """Replace (``None``: remove) one stored tensor of a written checkpoint."""
    file = str(Path(path) / "model.safetensors")
    tensors = load_file(file)
    if value is None:
        del tensors[name]
    else:
        tensors[name] = value
    save_file(tensors, file, metadata={"format": "pt"})


# ----------------------------------------------------------------- the loading side


def random_weight(n: int, k: int) -> Tensor:
    """fp16 weights of a trained layer's scale; outputs of x ~ N(0, 1) stay O(1)."""
    return (torch.randn(n, k) * k**-0.5).half()


def model_for(shapes: dict[str, tuple[int, int, bool]], extra: dict[str, Tensor] | None = None, device: str = "cpu") -> nn.Module:
    """An ``nn.Module`` tree with an fp16 ``nn.Linear(K, N, bias)`` at each dotted name of
    ``shapes`` (``{name: (N, K, bias)}``) and an ``nn.Embedding`` for each ``<name>.weight`` of
    ``extra`` (the checkpoint's unquantized tensors); ``device="meta"`` builds a skeleton."""
    with torch.device(device):
        root = nn.Module()
        for name, (n, k, bias) in shapes.items():
            _install(root, name, nn.Linear(k, n, bias=bias, dtype=torch.float16))
        for name, t in (extra or {}).items():
            _install(root, name.removesuffix(".weight"), nn.Embedding(*t.shape, dtype=t.dtype))
    return root


def _install(root: nn.Module, name: str, module: nn.Module) -> None:
    *parents, leaf = name.split(".")
    node = root
    for part in parents:
        if not hasattr(node, part):
            node.add_module(part, nn.Module())
        node = getattr(node, part)
    node.add_module(leaf, module)


X_ROWS = (1, 2, 7, 16)  # decode, tiny batch, odd, one full tile


def check_loaded_layer(layer: nn.Module, spec: SpecLayer, bias: Tensor | None, name: str) -> None:
    """The checks every loader test makes on one loaded layer:

    (a) ``dequantized_weight()`` is the format's weight, bit for bit, in the model's K order;
    (b) the forward matches ``x @ W.T + bias`` in float32 for fp16 x of several row counts,
        within one fp16 rounding of the result (2**-11 relative, doubled) plus float32
        summation-order noise (1e-4 absolute on outputs of size ~1);
    (c) ``act_perm`` is set exactly when ``g_idx`` is not ``k // G`` (GPTQ act-order).
    """
    assert isinstance(layer, qfuse.QuantLinear), f"{name}: {type(layer).__name__}"
    w = spec.weight
    got = layer.dequantized_weight()
    assert got.dtype == w.dtype and got.shape == w.shape, f"{name}: {got.dtype} {tuple(got.shape)}"
    assert torch.equal(got, w), f"{name}: {int((got != w).sum())} of {w.numel()} weights differ"
    for m in X_ROWS:
        x = torch.randn(m, spec.in_features).half()
        out = layer(x)
        ref = x.float() @ w.float().t() + (0 if bias is None else bias.float())
        assert out.dtype == torch.float16 and out.shape == (m, spec.out_features)
        torch.testing.assert_close(out.float(), ref, rtol=2**-10, atol=1e-4, msg=lambda s: f"{name}, M={m}: {s}")
    monotonic = torch.equal(spec.g_idx, natural_g_idx(spec.in_features, spec.group_size))
    assert (layer.act_perm is None) == monotonic, f"{name}: act_perm {layer.act_perm is not None}, g_idx monotonic {monotonic}"
