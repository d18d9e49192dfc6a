"""``QuantLinear``: an ``nn.Linear`` replacement whose forward calls the qfuse ops."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import ops  # noqa: F401  (registers torch.ops.qfuse.*)
from .eager_graphs import graphs_of, replayable
from .ops.w4a8_gemm import dequantize_w4a8
from .ops.w8a8_gemm import MAX_K
from .ops.wna16_gemm import dequantize_wna16
from .quantizers import quantize_w4a8, quantize_w8a8, quantize_wna16
from .schemes import Scheme, get_scheme

_ACT_DTYPES = (torch.float16, torch.bfloat16)


class KeepsFloat32Buffers(nn.Module):
    """``Module.to(dtype)`` / ``.half()`` / ``.bfloat16()`` convert every float buffer; the int8
    paths' float32 scales (``w_scale``, ``input_scale``) are exact values of the quantization, which
    bf16 would round by up to 2^-9 (fp16 flushes scales under 6e-5 to subnormals): they stay
    float32, moved to the new device."""

    def _apply(self, fn, recurse=True):
        kept = {n: b for n, b in self._buffers.items() if b is not None and b.dtype == torch.float32}
        out = super()._apply(fn, recurse)
        for name, old in kept.items():
            new = self._buffers[name]
            if new is not None and new.dtype != torch.float32:
                self._buffers[name] = old.to(device=new.device)
        return out


class QuantLinear(KeepsFloat32Buffers):
    """A linear layer with quantized, prepacked weights (buffers, so ``state_dict`` round-trips).

    Weight-only schemes call ``qfuse::wna16_gemm``. int8-activation schemes call
    ``qfuse::quant_per_token_int8`` then ``qfuse::w8a8_gemm`` / ``qfuse::w4a8_gemm`` as two
    ops, so the fusion passes can merge the quantization into the op that produced x.
    A static-activation scheme (``scheme.static_act``, from a compressed-tensors checkpoint)
    quantizes with its calibrated ``input_scale`` through ``qfuse::quant_per_tensor_int8``.
    Inputs may have any leading shape ``[..., in_features]``.

    ``act_perm`` (optional, int64 ``[in_features]``): the weight's input channels are stored
    sorted by scale group (a GPTQ act-order checkpoint, whose ``g_idx`` is not monotonic), so
    each call gathers ``x[..., act_perm]`` first (one small kernel, fused by Inductor under
    ``torch.compile``); the weight itself is never repacked per call.

    Called eagerly on CUDA at decode sizes, the forward is replayed as a CUDA graph from the
    second call of an input shape on (qfuse/eager_graphs.py: the same kernels, a fraction of
    the host time).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        scheme: Scheme | str,
        tensors: dict[str, Tensor | None],
        bias: Tensor | None,
        act_perm: Tensor | None = None,
    ):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.scheme = get_scheme(scheme)
        for name, t in tensors.items():
            self.register_buffer(name, t)
        self.register_buffer("bias", bias)
        self.register_buffer("act_perm", act_perm)

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: Scheme | str) -> "QuantLinear":
        """Quantize ``linear`` (fp16/bf16 weight) with ``scheme``; the result lives on the same device."""
        scheme = get_scheme(scheme)
        if scheme.static_act:
            raise ValueError(f"{scheme.name}: static activation scales come from calibration or a checkpoint, not from the weight")
        w = linear.weight.detach()
        check_quantizable(w, scheme, "linear")
        n, k = w.shape
        if scheme.weight_only:
            tensors = quantize_wna16(w, scheme.weight_bits, scheme.group_size, scheme.symmetric, w.dtype)
        elif scheme.weight_bits == 8:
            tensors = quantize_w8a8(w)
        else:
            tensors = quantize_w4a8(w, scheme.group_size)
        bias = None if linear.bias is None else linear.bias.detach().to(w.dtype).clone()
        return cls(k, n, scheme, tensors, bias)

    def _per_row(self, name: str) -> bool:
        """Whether buffer ``name`` holds one row per output channel (codes, scales, zero points, bias);
        the others (``act_perm``, ``input_scale``, a per-tensor weight scale ``[1]``) serve every row."""
        b = self._buffers[name]
        return b is not None and name not in ("act_perm", "input_scale") and b.dim() >= 1 and b.shape[0] == self.out_features

    def _with_rows(self, select, out_features: int) -> "QuantLinear":
        """A QuantLinear of the same scheme whose per-row buffers are ``select(buffer)``; the input
        permutation and per-tensor buffers are shared."""
        picked = {n: select(b) if self._per_row(n) else b for n, b in self._buffers.items()}
        bias, act_perm = picked.pop("bias"), picked.pop("act_perm")
        return QuantLinear(self.in_features, out_features, self.scheme, picked, bias, act_perm)

    def rows(self, start: int, stop: int) -> "QuantLinear":
        """Output channels ``start:stop`` as a QuantLinear of the same scheme, views of this one's buffers."""
        if not 0 <= start < stop <= self.out_features:
            raise IndexError(f"QuantLinear.rows: [{start}, {stop}) outside its {self.out_features} output features")
        return self._with_rows(lambda b: b[start:stop], stop - start)

    def take_rows(self, index: Tensor) -> "QuantLinear":
        """Output channels ``index`` (int64 ``[n]``), in that order, as a QuantLinear of the same scheme
        (copies of this one's per-row buffers; the input permutation and per-tensor buffers shared)."""
        return self._with_rows(lambda b: b.index_select(0, index.to(b.device)), index.numel())

    @classmethod
    def concat(cls, layers: list["QuantLinear"]) -> "QuantLinear":
        """One QuantLinear whose output is the layers' outputs side by side (``torch.cat(..., -1)``),
        bit for bit: their per-row buffers stacked along the output channels. The layers must share
        scheme, input features, input permutation and static input scale. A per-tensor weight scale
        is repeated per channel where the layers' differ (the same value on each row: exact); a
        missing bias is zeros where another layer has one."""
        first = layers[0]
        for lay in layers[1:]:
            if lay.scheme != first.scheme or lay.in_features != first.in_features:
                raise ValueError(
                    f"QuantLinear.concat: {lay.scheme.name} with {lay.in_features} inputs against {first.scheme.name} with {first.in_features}"
                )
            for n in ("act_perm", "input_scale"):
                a, b = first._buffers.get(n), lay._buffers.get(n)
                if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                    raise ValueError(f"QuantLinear.concat: the layers' {n} differ")
        tensors: dict[str, Tensor | None] = {}
        for n, b in first._buffers.items():
            parts = [lay._buffers[n] for lay in layers]
            if n in ("act_perm", "input_scale") or all(p is None for p in parts):
                tensors[n] = None if b is None else b.clone()
            elif n == "bias":
                ref = next(p for p in parts if p is not None)
                tensors[n] = torch.cat([ref.new_zeros(lay.out_features) if p is None else p for p, lay in zip(parts, layers)])
            elif not any(lay._per_row(n) for lay in layers) and all(torch.equal(p, b) for p in parts):
                tensors[n] = b.clone()  # one per-tensor scale for all
            else:
                tensors[n] = torch.cat([p if lay._per_row(n) else p.expand(lay.out_features, *p.shape[1:]) for p, lay in zip(parts, layers)])
        bias, act_perm = tensors.pop("bias"), tensors.pop("act_perm")
        return cls(first.in_features, sum(lay.out_features for lay in layers), first.scheme, tensors, bias, act_perm)

    def forward(self, x: Tensor) -> Tensor:
        if replayable(x):
            return graphs_of(self)(self._forward, tuple(self._buffers.values()), x)
        return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        if x.dim() == 0 or x.shape[-1] != self.in_features:  # reshape(-1, K) would fold a wrong K into M
            raise ValueError(
                f"QuantLinear({self.in_features} -> {self.out_features}): input of shape {list(x.shape)} does not end in {self.in_features}"
            )
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.act_perm is not None:
            # advanced indexing: 3.4-3.6 us per decode call on the H200 in a CUDA graph, against
            # 4.4-4.7 us for index_select; under torch.compile Inductor's gather takes 1.5-1.9 us
            x2 = x2[:, self.act_perm]
        s = self.scheme
        bias = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        if s.weight_only:
            scales = self.scales if self.scales.dtype == x.dtype else self.scales.to(x.dtype)
            out = torch.ops.qfuse.wna16_gemm(x2, self.qweight, scales, self.zeros, bias, s.weight_bits, s.group_size)
        else:
            if s.static_act:
                x_scale = self.input_scale.float()
                xq = torch.ops.qfuse.quant_per_tensor_int8(x2, x_scale)
            else:
                xq, x_scale = torch.ops.qfuse.quant_per_token_int8(x2)
            w_scale = self.w_scale.float()  # float32 already (KeepsFloat32Buffers): no kernel under compile
            if s.weight_bits == 8:
                out = torch.ops.qfuse.w8a8_gemm(xq, x_scale, self.wq, w_scale, bias, x.dtype)
            else:
                out = torch.ops.qfuse.w4a8_gemm(xq, x_scale, self.qweight, w_scale, self.group_scale, bias, s.group_size, x.dtype)
        return out.reshape(*lead, self.out_features)

    def dequantized_weight(self) -> Tensor:
        """The float weight ``[out, in]`` the kernel effectively multiplies by.

        Weight-only schemes: in the scales' dtype (the kernel's tensor-core operand).
        int8-activation schemes: float32 ``w_scale * w_int`` (activations are quantized too).
        Input channels are in the model's order (``act_perm`` undone).
        """
        s = self.scheme
        if s.weight_only:
            w = dequantize_wna16(self.qweight, self.scales, self.zeros, s.weight_bits, s.group_size).to(self.scales.dtype)
        elif s.weight_bits == 8:
            w = self.wq.float() * self.w_scale.float().reshape(-1, 1)
        else:
            w = dequantize_w4a8(self.qweight, self.w_scale.float(), self.group_scale, s.group_size)
        if self.act_perm is not None:
            w = torch.empty_like(w).index_copy_(1, self.act_perm, w)
        return w

    def weight_bytes(self) -> int:
        """Bytes of every quantized-weight buffer (codes, scales, zero points; not the bias)."""
        return sum(b.numel() * b.element_size() for name, b in self.named_buffers() if name != "bias")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme.name}, bias={self.bias is not None}"


def check_quantizable(w: Tensor, scheme: Scheme, name: str) -> None:
    """Raise a ValueError/TypeError saying why ``w`` [N, K] cannot take ``scheme``."""
    if w.dtype not in _ACT_DTYPES:
        raise TypeError(
            f"{name}: weight dtype {w.dtype} is not supported; qfuse runs fp16/bf16 models (convert first, e.g. model.to(torch.bfloat16))"
        )
    if w.dim() != 2:
        raise ValueError(f"{name}: weight must be 2-D, got {tuple(w.shape)}")
    k = w.shape[1]
    if scheme.weight_bits == 4 and k % 2:
        raise ValueError(f"{name}: in_features={k} must be even for 4-bit weights")
    if scheme.group_size != -1 and k % scheme.group_size:
        raise ValueError(f"{name}: in_features={k} is not divisible by group_size={scheme.group_size} of {scheme.name}")
    if not scheme.weight_only and k > MAX_K:
        raise ValueError(f"{name}: in_features={k} exceeds {MAX_K}, past which {scheme.op}'s int32 accumulator could overflow")
