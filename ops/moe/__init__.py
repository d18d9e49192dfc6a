"""The fused mixture-of-experts op ``qfuse::fused_moe`` and its CUDA kernels.

* ``fused_moe.py``: the op (math docstring, argument checks, plain-torch reference kernel,
  fake kernel, CUDA registration);
* ``routing.py``: softmax + top-k routing, shared by the reference and the CUDA path;
* ``align.py``: token-to-expert sorting with each expert's rows padded to a whole block;
* ``grouped_gemm.py``: the Triton grouped GEMM (fc1 with the SiLU-and-mul epilogue, fc2 with
  the routing-weight epilogue) and the top-k sum;
* ``dispatch.py``: the kernel family, its configs by M bucket and the CUDA entry point.
"""
