"""``QuantMoE``: a Hugging Face sparse-MoE block whose experts run in ``qfuse::fused_moe``.

transformers 5 keeps a sparse-MoE block's experts fused: ``experts.gate_up_proj [E, 2I, H]``
(gate rows, then up rows) and ``experts.down_proj [E, H, I]``, with a router ``gate`` holding
``weight [E, H]``. The blocks converted here (``SPARSE_MOE_BLOCKS``):

* ``MixtralSparseMoeBlock``: softmax, top-k, always renormalized;
* ``Qwen2MoeSparseMoeBlock``: the same with ``norm_topk_prob``, plus a dense ``shared_expert``
  (an MLP of nn.Linears) scaled by ``sigmoid(shared_expert_gate(x))``;
* ``Qwen3MoeSparseMoeBlock``: as Qwen2-MoE without the shared expert.

Each returns one tensor of the input's shape (no router logits), and so does ``QuantMoE``.
The router stays in float (``F.linear`` with its weight: a few columns, and routing is
sensitive); the shared expert and its gate are kept as the very modules of the block, so
``quantize_model`` converts their nn.Linears like any other. HF's Qwen routers round the top-k
weights to the activation dtype before use; ``fused_moe`` keeps them in float32, a difference of
one rounding of a factor.

On disk (Hugging Face checkpoints, and what vLLM and compressed-tensors expect) each expert is
three Linears, ``<block>.experts.<e>.<gate>`` / ``<up>`` / ``<down>``, which transformers fuses on
load and splits on save (``conversion_mapping.py``); :data:`CHECKPOINT_NAMES` has the names, and
:meth:`QuantExperts.expert_layers` / :meth:`QuantExperts.from_expert_layers` convert between the
fused buffers and per-expert ``QuantLinear`` layers (qfuse/checkpoint.py).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import ops  # noqa: F401  (registers torch.ops.qfuse.*)
from .eager_graphs import graphs_of, own_tensors, replayable
from .linear import KeepsFloat32Buffers, QuantLinear
from .ops.moe.fused_moe import GROUP_SIZES
from .ops.moe.tile_major import from_tile_major, tile_major_supported, to_tile_major
from .ops.w4a8_gemm import dequantize_w4a8
from .ops.wna16_gemm import dequantize_wna16
from .quantizers import quantize_w4a8, quantize_w8a8, quantize_wna16
from .schemes import Scheme, get_scheme

SPARSE_MOE_BLOCKS = ("MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock")
_ACT_DTYPES = (torch.float16, torch.bfloat16)
_TENSOR_NAMES = ("w13", "w13_scale", "w13_zeros", "w13_group_scale", "w2", "w2_scale", "w2_zeros", "w2_group_scale")
# act-order experts (GPTQ desc_act / compressed-tensors group actorder checkpoints): int64 [E, H] and [E, I],
# the input channel order of each expert's stored w13 and w2 (QuantExperts.from_expert_layers)
_ACT_PERM_NAMES = ("w13_act_perm", "w2_act_perm")
# Checkpoint names of a block's experts, as transformers 5.24 saves them (conversion_mapping.py:
# "mixtral" renames ".block_sparse_moe." to ".mlp." on load and merges experts.*.w1 / w3 into
# gate_up_proj and w2 into down_proj; "qwen2_moe", also used for "qwen3_moe", merges
# experts.*.gate_proj / up_proj and down_proj under the same block name). Block class ->
# (the last component of the block's name on disk, None where it is the module's own;
# the gate, up and down projection names of expert e, under "<block>.experts.<e>.").
CHECKPOINT_NAMES = {
    "MixtralSparseMoeBlock": ("block_sparse_moe", ("w1", "w3", "w2")),
    "Qwen2MoeSparseMoeBlock": (None, ("gate_proj", "up_proj", "down_proj")),
    "Qwen3MoeSparseMoeBlock": (None, ("gate_proj", "up_proj", "down_proj")),
}
# Per-expert QuantLinear buffer names of each format, by fused_moe tensor suffix ("" is the codes)
_LINEAR_NAMES = {
    "weight_only": {"": "qweight", "_scale": "scales", "_zeros": "zeros"},
    "w8a8": {"": "wq", "_scale": "w_scale"},
    "w4a8": {"": "qweight", "_scale": "w_scale", "_group_scale": "group_scale"},
}


def is_sparse_moe_block(module: nn.Module) -> bool:
    """Whether ``module`` is one of the Hugging Face sparse-MoE blocks :class:`QuantMoE` converts."""
    return type(module).__name__ in SPARSE_MOE_BLOCKS


def sparse_moe_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, block)`` of every convertible sparse-MoE block in ``model``."""
    return [(n, m) for n, m in model.named_modules() if is_sparse_moe_block(m)]


def _quantize_stack(w: Tensor, scheme: Scheme) -> dict[str, Tensor | None]:
    """Quantize each expert ``w[e] [N, K]`` with the dense quantizer of ``scheme`` and stack the results:
    ``{"w", "scale", "zeros", "group_scale"}`` in the layouts of ops/moe/fused_moe.py."""
    if scheme.weight_only:
        parts = [quantize_wna16(we, scheme.weight_bits, scheme.group_size, scheme.symmetric, w.dtype) for we in w]
        names = {"w": "qweight", "scale": "scales", "zeros": "zeros"}
    elif scheme.weight_bits == 8:
        parts = [quantize_w8a8(we) for we in w]
        names = {"w": "wq", "scale": "w_scale"}
    else:
        parts = [quantize_w4a8(we, scheme.group_size) for we in w]
        names = {"w": "qweight", "scale": "w_scale", "group_scale": "group_scale"}
    out: dict[str, Tensor | None] = {"w": None, "scale": None, "zeros": None, "group_scale": None}
    for key, src in names.items():
        if parts[0][src] is not None:
            out[key] = torch.stack([p[src] for p in parts]).contiguous()
    return out


def _linear_names(scheme: Scheme) -> dict[str, str]:
    if scheme.weight_only:
        return _LINEAR_NAMES["weight_only"]
    return _LINEAR_NAMES["w8a8" if scheme.weight_bits == 8 else "w4a8"]


def block_routing(block: nn.Module, name: str = "") -> tuple[int, bool]:
    """``(top_k, renormalize)`` of a Hugging Face sparse-MoE block; a ValueError for experts that are not SiLU-gated."""
    label = name or type(block).__name__
    act = getattr(block.experts, "act_fn", None)
    if not isinstance(act, nn.SiLU) and type(act).__name__ != "SiLUActivation":
        raise ValueError(f"{label}: experts use {type(act).__name__}; fused_moe runs SiLU-gated experts only")
    return block.gate.top_k, bool(getattr(block.gate, "norm_topk_prob", True))  # Mixtral's router always renormalizes


def check_moe_quantizable(gate_up: Tensor, down: Tensor, scheme: Scheme | None, name: str) -> None:
    """Raise a TypeError/ValueError saying why these expert weights cannot take ``scheme``."""
    if gate_up.dtype not in _ACT_DTYPES or down.dtype not in _ACT_DTYPES:
        raise TypeError(f"{name}: expert weights are {gate_up.dtype}; qfuse runs fp16/bf16 models (convert first, e.g. model.to(torch.bfloat16))")
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[1] % 2:
        raise ValueError(f"{name}: expected gate_up_proj [E, 2I, H] and down_proj [E, H, I], got {tuple(gate_up.shape)} and {tuple(down.shape)}")
    e, two_i, h = gate_up.shape
    if tuple(down.shape) != (e, h, two_i // 2):
        raise ValueError(f"{name}: down_proj must have shape {(e, h, two_i // 2)}, got {tuple(down.shape)}")
    if scheme is None:
        return
    if scheme.static_act:
        raise ValueError(f"{name}: {scheme.name} (static activation scales) is not supported for MoE experts; pass the block in ignore=...")
    i = two_i // 2
    if scheme.weight_bits == 4 and (h % 2 or i % 2):
        raise ValueError(f"{name}: hidden size {h} and expert intermediate size {i} must be even for 4-bit experts")
    if scheme.group_size != -1 and (scheme.group_size not in GROUP_SIZES or h % scheme.group_size or i % scheme.group_size):
        raise ValueError(f"{name}: group_size={scheme.group_size} of {scheme.name} must divide hidden size {h} and expert intermediate size {i}")
    if scheme.weight_bits == 8 and not scheme.weight_only and scheme.group_size != -1:
        raise ValueError(f"{name}: W8A8 experts are per channel")
    for label, w in (("gate_up_proj", gate_up), ("down_proj", down)):
        if not w.is_meta and not torch.isfinite(w).all():
            raise ValueError(f"{name}: experts.{label} has {int((~torch.isfinite(w)).sum())} NaN/inf value(s) of {w.numel()}")


def _act_order_moved_to_rows(layers: list[tuple[QuantLinear, QuantLinear, QuantLinear]], scheme: Scheme, name: str):
    """``(layers, {"w13_act_perm", "w2_act_perm"})``: each expert's down act-order moved onto its gate and up
    rows, and the experts' input orders stacked (None where no expert has one; see ``from_expert_layers``)."""
    if all(lin.act_perm is None for triple in layers for lin in triple):
        return layers, {}
    if not scheme.weight_only:
        raise ValueError(f"{name}: act-order experts must be weight-only, not {scheme.name}")
    moved, w13_perm, w2_perm = [], [], []
    for e, (gate, up, down) in enumerate(layers):
        h, i = gate.in_features, down.in_features
        same = gate.act_perm is None and up.act_perm is None
        same = same or (gate.act_perm is not None and up.act_perm is not None and torch.equal(gate.act_perm, up.act_perm))
        if not same:
            raise ValueError(f"{name}.{e}: gate and up read the same input but have different act-order input orders; fused_moe needs one")
        if down.act_perm is not None and gate.out_features == up.out_features == i:  # other shapes: refused by the caller's checks
            gate, up = gate.take_rows(down.act_perm), up.take_rows(down.act_perm)
        device = gate.scales.device
        w13_perm.append(gate.act_perm if gate.act_perm is not None else torch.arange(h, device=device))
        w2_perm.append(down.act_perm if down.act_perm is not None else torch.arange(i, device=device))
        moved.append((gate, up, down))
    perms = {}
    if any(lin.act_perm is not None for lin, _, _ in layers):
        perms["w13_act_perm"] = torch.stack(w13_perm).to(torch.int64).contiguous()
    if any(lin.act_perm is not None for _, _, lin in layers):
        perms["w2_act_perm"] = torch.stack(w2_perm).to(torch.int64).contiguous()
    return moved, perms


def tile_major_allowed(scheme: Scheme | None, hidden_size: int, intermediate_size: int) -> bool:
    """Whether these experts' codes may be stored tile-major: weight-only experts whose 2I, H and bytes per row
    of w13 and w2 are multiples of 64 (``fused_moe``'s ``tile_major``)."""
    if scheme is None or not scheme.weight_only:
        return False
    h, i, bits = hidden_size, intermediate_size, scheme.weight_bits
    return tile_major_supported(2 * i, h * bits // 8) and tile_major_supported(h, i * bits // 8)


def holds_tile_major(scheme: Scheme | None, hidden_size: int, intermediate_size: int) -> bool:
    """Whether :class:`QuantExperts` stores these experts' codes tile-major by default: W4A16 experts whose 2I, H
    and bytes per row of w13 and w2 are multiples of 64 (Mixtral, Qwen-MoE). W8A16 experts read either layout
    (``tile_major=True``) but keep the natural one: Mixtral W8A16 on an H100 took 0-3 % longer tile-major at M = 1-16
    (140.7 / 462.8 / 514.2 us against 140.3 / 448.3 / 498.2 at M = 1 / 8 / 16, one run)."""
    return scheme is not None and scheme.weight_bits == 4 and tile_major_allowed(scheme, hidden_size, intermediate_size)


class QuantExperts(KeepsFloat32Buffers):
    """E SiLU-gated expert MLPs with prepacked weights (buffers: ``state_dict`` round-trips), run by
    ``qfuse::fused_moe``. ``scheme=None`` keeps the experts in float (bf16/fp16).

    W4A16 experts whose matrices are whole 64-row x 64-byte tiles hold their codes tile-major
    (:attr:`tile_major`, ops/moe/tile_major.py; ``tile_major=False``: the natural packing; W8A16
    experts with ``tile_major=True``): given in the natural packing, stored reordered, and given back natural by
    :meth:`expert_layers`, :meth:`dequantized_weights` and ``state_dict`` (a state_dict is natural
    either way, and loads into either layout)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, top_k: int, renormalize: bool,
                 scheme: Scheme | str | None, tensors: dict[str, Tensor | None], tile_major: bool | None = None):  # fmt: skip
        super().__init__()
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.top_k = top_k
        self.renormalize = renormalize
        self.scheme = None if scheme is None else get_scheme(scheme)
        default = holds_tile_major(self.scheme, hidden_size, intermediate_size)
        if tile_major and not tile_major_allowed(self.scheme, hidden_size, intermediate_size):
            raise ValueError(
                f"QuantExperts: tile-major codes need weight-only experts with 2I, H and each row's bytes multiples of 64; "
                f"got {'float' if self.scheme is None else self.scheme.name} experts, H={hidden_size}, I={intermediate_size}"
            )
        self._tile_major = default if tile_major is None else tile_major
        for name in _TENSOR_NAMES + _ACT_PERM_NAMES:
            t = tensors.get(name)
            self.register_buffer(name, to_tile_major(t) if name in ("w13", "w2") and t is not None and self.tile_major else t)

    @property
    def tile_major(self) -> bool:
        """Whether the codes are stored tile-major (fixed when the module is built)."""
        return self._tile_major

    def natural_codes(self, name: str, e: int | None = None) -> Tensor:
        """``w13`` or ``w2`` (expert ``e``'s only, if given) in the natural packing (a copy where stored tile-major)."""
        t = getattr(self, name) if e is None else getattr(self, name)[e]
        return from_tile_major(t) if self.tile_major else t

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.tile_major:  # saved in the natural packing
            for name in ("w13", "w2"):
                destination[prefix + name] = self.natural_codes(name)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        if self.tile_major:  # a state_dict holds natural codes
            for name in ("w13", "w2"):
                if prefix + name in state_dict:
                    state_dict[prefix + name] = to_tile_major(state_dict[prefix + name])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    @classmethod
    def from_weights(
        cls,
        gate_up_proj: Tensor,
        down_proj: Tensor,
        top_k: int,
        renormalize: bool,
        scheme: Scheme | str | None,
        name: str = "experts",
        tile_major: bool | None = None,
    ) -> "QuantExperts":
        """Quantize ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]`` (fp16/bf16) with ``scheme`` (None: keep float);
        ``tile_major``: the codes' layout (None: tile-major where :func:`holds_tile_major`)."""
        scheme = None if scheme is None else get_scheme(scheme)
        gate_up, down = gate_up_proj.detach(), down_proj.detach()
        check_moe_quantizable(gate_up, down, scheme, name)
        e, two_i, h = gate_up.shape
        if scheme is None:
            tensors = {"w13": gate_up.contiguous().clone(), "w2": down.contiguous().clone()}
        else:
            tensors = {f"w13_{k}" if k != "w" else "w13": v for k, v in _quantize_stack(gate_up, scheme).items()}
            tensors.update({f"w2_{k}" if k != "w" else "w2": v for k, v in _quantize_stack(down, scheme).items()})
        return cls(e, h, two_i // 2, top_k, renormalize, scheme, tensors, tile_major)

    @property
    def format(self) -> tuple[int, int, int]:
        """``(weight_bits, act_bits, group_size)`` of ``fused_moe``."""
        s = self.scheme
        return (16, 16, -1) if s is None else (s.weight_bits, s.act_bits, s.group_size)

    def forward(self, x: Tensor, router_logits: Tensor) -> Tensor:
        """``x [T, H]`` and ``router_logits [T, E]`` -> ``[T, H]``."""
        bits, act_bits, group_size = self.format
        w13_scale, w2_scale = self.w13_scale, self.w2_scale
        if act_bits == 16 and bits != 16:  # Module.to(dtype) converts float buffers; the op wants x.dtype scales
            w13_scale, w2_scale = w13_scale.to(x.dtype), w2_scale.to(x.dtype)
        elif act_bits == 8:
            w13_scale, w2_scale = w13_scale.float(), w2_scale.float()
        w13, w2 = (self.w13.to(x.dtype), self.w2.to(x.dtype)) if bits == 16 else (self.w13, self.w2)
        return torch.ops.qfuse.fused_moe(
            x, router_logits, self.top_k, self.renormalize, w13, w13_scale, self.w13_zeros, self.w13_group_scale,
            w2, w2_scale, self.w2_zeros, self.w2_group_scale, bits, act_bits, group_size, self.w13_act_perm, self.tile_major,
        )  # fmt: skip

    def dequantized_weights(self) -> tuple[Tensor, Tensor]:
        """``(gate_up [E, 2I, H], down [E, H, I])``: the float weights the kernel multiplies by (weight-only:
        in the scales' dtype; int8 activations: float32 ``scale * w_int``, the activations being quantized too),
        in the model's channel order (act-order undone)."""
        bits, act_bits, group_size = self.format
        if bits == 16:
            return self.w13, self.w2
        out = []
        for w, s, z, gs in (
            (self.natural_codes("w13"), self.w13_scale, self.w13_zeros, self.w13_group_scale),
            (self.natural_codes("w2"), self.w2_scale, self.w2_zeros, self.w2_group_scale),
        ):
            per_expert = []
            for e in range(self.num_experts):
                if act_bits == 16:
                    per_expert.append(dequantize_wna16(w[e], s[e], None if z is None else z[e], bits, group_size).to(s.dtype))
                elif bits == 8:
                    per_expert.append(w[e].float() * s[e].float().reshape(-1, 1))
                else:
                    per_expert.append(dequantize_w4a8(w[e], s[e].float(), None if gs is None else gs[e], group_size))
            out.append(torch.stack(per_expert))
        gate_up, down = out
        if self.w2_act_perm is not None:  # w13's rows and w2's columns are stored in w2's act order
            i = self.intermediate_size
            inverse = torch.argsort(self.w2_act_perm, dim=1)
            rows = torch.cat([inverse, inverse + i], dim=1)
            gate_up = torch.gather(gate_up, 1, rows.unsqueeze(2).expand_as(gate_up))
            down = torch.empty_like(down).scatter_(2, self.w2_act_perm.unsqueeze(1).expand_as(down), down)
        if self.w13_act_perm is not None:
            gate_up = torch.empty_like(gate_up).scatter_(2, self.w13_act_perm.unsqueeze(1).expand_as(gate_up), gate_up)
        return gate_up, down

    def expert_layers(self, e: int) -> tuple[QuantLinear, QuantLinear, QuantLinear]:
        """Expert ``e``'s gate ``[I, H]``, up ``[I, H]`` and down ``[H, I]`` projections as QuantLinears of
        the experts' scheme, each exactly a dense layer of that scheme; their buffers are views of this module's
        (the codes of tile-major experts: natural copies; act-order experts: the layers as loaded, each with its
        ``act_perm``; gate and up are then copies)."""
        if self.scheme is None:
            raise ValueError("expert_layers: the experts are not quantized (scheme=None); their float weights are w13 and w2")
        if not 0 <= e < self.num_experts:
            raise IndexError(f"expert_layers: expert {e} of {self.num_experts}")
        h, i = self.hidden_size, self.intermediate_size
        names = _linear_names(self.scheme)
        # expert e's buffers, its codes in the natural packing (once per weight: gate and up share w13's)
        own = {}
        for n in _TENSOR_NAMES:
            t = getattr(self, n)
            own[n] = self.natural_codes(n, e) if n in ("w13", "w2") else None if t is None else t[e]
        out = []
        for w, rows, k in (("w13", slice(0, i), h), ("w13", slice(i, 2 * i), h), ("w2", slice(0, h), i)):
            tensors = {lin: None if own[w + suffix] is None else own[w + suffix][rows] for suffix, lin in names.items()}
            perm = self.w2_act_perm if w == "w2" else self.w13_act_perm
            perm = None if perm is None or torch.equal(perm[e], torch.arange(k, device=perm.device)) else perm[e]  # natural: none
            out.append(QuantLinear(k, rows.stop - rows.start, self.scheme, tensors, None, perm))
        if out[2].act_perm is not None:  # gate / up rows back from down's act order (from_expert_layers)
            inverse = torch.argsort(out[2].act_perm)
            out[0], out[1] = out[0].take_rows(inverse), out[1].take_rows(inverse)
        return out[0], out[1], out[2]

    @classmethod
    def from_expert_layers(
        cls,
        layers: list[tuple[QuantLinear, QuantLinear, QuantLinear]],
        top_k: int,
        renormalize: bool,
        scheme: Scheme | str,
        name: str = "experts",
        tile_major: bool | None = None,
    ) -> "QuantExperts":
        """The inverse of :meth:`expert_layers`: each expert's ``(gate, up, down)`` QuantLinears of ``scheme``,
        stacked into the fused buffers. With an asymmetric weight-only scheme, a layer without zero points
        (a checkpoint reader drops zero points that all equal 2**(bits-1)) gets them back. A ValueError
        names the first layer that does not fit (shape, scheme, bias, act-order).

        Act-order layers (``act_perm``: GPTQ ``desc_act``, compressed-tensors group actorder; weight-only
        schemes): gate and up, which read the same input, must share one input order, kept as
        ``w13_act_perm[e]`` (``fused_moe`` gathers each pair's activations in it). Down's order ``p`` costs
        nothing at run time: gate's and up's rows are stored in that order (``rows'[j] = rows[p[j]]``), so
        ``h`` comes out as ``h[p]``, which is what down's stored columns multiply; ``w2_act_perm[e] = p`` is
        kept for :meth:`expert_layers` and :meth:`dequantized_weights`. Experts without act-order in a block
        that has some get the identity. ``tile_major``: as in :meth:`from_weights`."""
        scheme = get_scheme(scheme)
        if not layers:
            raise ValueError(f"{name}: no experts")
        i, h = layers[0][0].out_features, layers[0][0].in_features
        if scheme.static_act:
            raise ValueError(f"{name}: {scheme.name} (static activation scales) is not supported for MoE experts")
        if scheme.group_size != -1 and (scheme.group_size not in GROUP_SIZES or h % scheme.group_size or i % scheme.group_size):
            raise ValueError(f"{name}: group_size={scheme.group_size} of {scheme.name} must divide hidden size {h} and expert intermediate size {i}")
        if not scheme.weight_only and scheme.weight_bits == 8 and scheme.group_size != -1:
            raise ValueError(f"{name}: W8A8 experts are per channel")
        names = _linear_names(scheme)
        layers, perms = _act_order_moved_to_rows(layers, scheme, name)
        parts: dict[str, list[list[Tensor | None]]] = {}
        for e, triple in enumerate(layers):
            for j, (lin, (n, k)) in enumerate(zip(triple, ((i, h), (i, h), (h, i)))):
                label = f"{name}.{e}.{('gate', 'up', 'down')[j]}"
                if (lin.out_features, lin.in_features) != (n, k):
                    raise ValueError(f"{label}: [{lin.out_features}, {lin.in_features}], expected [{n}, {k}]")
                s = lin.scheme
                if (s.weight_bits, s.act_bits, s.group_size, s.static_act) != (scheme.weight_bits, scheme.act_bits, scheme.group_size, False) or (
                    not s.symmetric and scheme.symmetric
                ):
                    raise ValueError(f"{label}: scheme {s.name}, the other experts' is {scheme.name}")
                if lin.bias is not None:
                    raise ValueError(f"{label}: has a bias; fused_moe experts have none")
                for suffix, attr in names.items():
                    t = getattr(lin, attr, None)
                    if suffix == "_zeros" and t is None and not scheme.symmetric:
                        groups = lin.scales.shape[1]
                        t = torch.full((n, groups), 1 << (scheme.weight_bits - 1), dtype=torch.uint8, device=lin.scales.device)
                    if suffix == "_scale" and not scheme.weight_only:
                        t = t.float().reshape(-1).expand(n)  # a per-tensor scale ([1]) per channel
                    key = ("w13" if j < 2 else "w2") + suffix
                    parts.setdefault(key, [[] for _ in layers])[e].append(t)
        tensors: dict[str, Tensor | None] = {}
        for key, per_expert in parts.items():
            if any(t is None for ts in per_expert for t in ts):
                if not all(t is None for ts in per_expert for t in ts):
                    raise ValueError(f"{name}: {key} is present for some experts only")
                tensors[key] = None
                continue
            tensors[key] = torch.stack([torch.cat(ts) if len(ts) > 1 else ts[0] for ts in per_expert]).contiguous()
        return cls(len(layers), h, i, top_k, renormalize, scheme, {**tensors, **perms}, tile_major)

    def weight_bytes(self) -> int:
        """Bytes of every expert buffer (codes, scales, zero points)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        name = "float" if self.scheme is None else self.scheme.name
        return (
            f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
            f"top_k={self.top_k}, renormalize={self.renormalize}, scheme={name}{', tile_major=True' if self.tile_major else ''}"
        )


def router_logits_recorded() -> bool:
    """Whether transformers is recording router logits (``output_router_logits=True``: its
    load-balancing loss reads them). It records them by a forward hook on the router module
    (transformers 5, ``utils/output_capturing.py``), so the router module must run then; its
    logits are the ``F.linear`` the block computes otherwise."""
    capturing = sys.modules.get("transformers.utils.output_capturing")
    collector = getattr(capturing, "_active_collector", None)
    if collector is None:
        return False
    if torch.compiler.is_compiling():  # Dynamo cannot trace ContextVar.get: transformers keeps a plain global while compiling
        collected = getattr(collector, "global_var", None) if getattr(collector, "compiling", False) else None
    else:
        collected = collector.get()
    return collected is not None and "router_logits" in collected


class QuantMoE(nn.Module):
    """A sparse-MoE block: float router ``gate``, :class:`QuantExperts`, and (Qwen2-MoE) the block's own
    ``shared_expert`` and ``shared_expert_gate`` modules. ``forward(hidden_states [..., H]) -> [..., H]``,
    as the Hugging Face block."""

    def __init__(
        self,
        gate: nn.Module,
        experts: QuantExperts,
        shared_expert: nn.Module | None = None,
        shared_expert_gate: nn.Module | None = None,
        block_type: str | None = None,
    ):
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.shared_expert = shared_expert
        self.shared_expert_gate = shared_expert_gate
        self.block_type = block_type  # the Hugging Face block's class name (CHECKPOINT_NAMES); None when unknown

    @classmethod
    def from_block(cls, block: nn.Module, scheme: Scheme | str | None, name: str = "") -> "QuantMoE":
        """Convert a Hugging Face ``MixtralSparseMoeBlock`` / ``Qwen2MoeSparseMoeBlock`` / ``Qwen3MoeSparseMoeBlock``
        (fp16/bf16): experts quantized with ``scheme`` (None: kept float), router and shared expert kept as they are."""
        label = name or type(block).__name__
        if not is_sparse_moe_block(block):
            raise TypeError(f"{label}: {type(block).__name__} is not a supported sparse-MoE block ({', '.join(SPARSE_MOE_BLOCKS)})")
        top_k, renormalize = block_routing(block, label)
        quant = QuantExperts.from_weights(block.experts.gate_up_proj, block.experts.down_proj, top_k, renormalize, scheme, f"{label}.experts")
        return cls.with_experts(block, quant)

    @classmethod
    def with_experts(cls, block: nn.Module, experts: QuantExperts) -> "QuantMoE":
        """A QuantMoE of a Hugging Face sparse-MoE block (or another QuantMoE) with these experts: the block's
        router, shared expert and shared-expert gate modules, and its block type."""
        block_type = block.block_type if isinstance(block, QuantMoE) else type(block).__name__
        return cls(block.gate, experts, getattr(block, "shared_expert", None), getattr(block, "shared_expert_gate", None), block_type)

    def forward(self, hidden_states: Tensor) -> Tensor:
        # eager CUDA calls at decode sizes: a CUDA-graph replay (qfuse/eager_graphs.py), unless the
        # router's output is being recorded (a replay runs no forward hook)
        if replayable(hidden_states) and not router_logits_recorded():
            return graphs_of(self)(self._forward, own_tensors(self), hidden_states)
        return self._forward(hidden_states)

    def _forward(self, hidden_states: Tensor) -> Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        if router_logits_recorded():  # the router module itself, whose forward hook records its logits
            out = self.gate(x)
            router_logits = out[0] if isinstance(out, tuple) else out
        else:
            router_logits = F.linear(x, self.gate.weight)
        out = self.experts(x, router_logits)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(shape)
