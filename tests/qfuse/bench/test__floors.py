"""The bytes behind the int8-activation GEMMs' bandwidth floors (``qfuse bench int8_gemm``, ``report``)."""

from __future__ import annotations

from qfuse.bench._floors import int8_gemm_bytes


def test_int8_gemm_bytes_count_what_each_op_reads_and_writes():
    m, n, k = 16, 8192, 4096
    act_out = m * k + 4 * m + 2 * m * n  # int8 activations, fp32 token scales, bf16 output
    assert int8_gemm_bytes(m, n, k, 8) == n * k + 4 * n + act_out
    assert int8_gemm_bytes(m, n, k, 4, 128) == n * k // 2 + 4 * n + n * k // 128 + act_out
    # the per-channel W4A8 op reads no int8 group scales
    assert int8_gemm_bytes(m, n, k, 4) == n * k // 2 + 4 * n + act_out
