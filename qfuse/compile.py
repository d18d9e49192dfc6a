"""``qfuse.compile``: ``torch.compile`` with qfuse's Inductor fusion passes switched on.

    model = qfuse.compile(model, fullgraph=True)                 # passes on
    model = torch.compile(model, options=qfuse.inductor_options())  # the same, by hand

Nothing here touches global Inductor config; the passes live in the options of
that one compile. ``torch.compile`` refuses ``mode=`` together with ``options=``,
so ``qfuse.compile`` turns a ``mode`` into its Inductor options
(``torch._inductor.list_mode_options``) and merges them.
"""

from __future__ import annotations

import torch


def inductor_options(config=None, **config_fields) -> dict:
    """The ``options=`` dict for ``torch.compile`` that installs the qfuse fusion passes.

    Keyword arguments set fields of :class:`qfuse.passes.PassConfig`
    (``dedup_quant``, ``fuse_norm_quant``, ``fuse_act_quant``, ``hf_rms_norm``, ``torch_rms_norm``).
    """
    from qfuse.passes import inductor_options as _options  # imports torch._inductor lazily

    return _options(config, **config_fields)


def compile(model, *, passes: bool = True, pass_config=None, **torch_compile_kwargs):  # noqa: A001 - mirrors torch.compile
    """``torch.compile(model, **torch_compile_kwargs)`` with the qfuse passes installed.

    ``passes=False`` compiles without them (same call otherwise, for A/B runs).
    ``pass_config``: a :class:`qfuse.passes.PassConfig`. A pass the caller already put in
    ``options["post_grad_custom_post_pass"]`` runs after qfuse's.
    """
    kwargs = dict(torch_compile_kwargs)
    backend = kwargs.get("backend", "inductor")
    if backend != "inductor":
        raise ValueError(f"qfuse.compile: the fusion passes need backend='inductor', got backend={backend!r}")
    if not passes:
        return torch.compile(model, **kwargs)
    mode = kwargs.pop("mode", None)
    options = dict(kwargs.pop("options", None) or {})
    if mode not in (None, "default"):
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode, kwargs.get("dynamic")), **options}
    from qfuse.passes import inductor_options as _options

    options.update(_options(pass_config, then=options.get("post_grad_custom_post_pass")))
    return torch.compile(model, options=options, **kwargs)
