"""``qfuse bench profile``'s kernel categories, from kernel names as the H200 run printed them."""

import pytest

from qfuse.bench.profile import category


@pytest.mark.parametrize(
    "name,expected",
    [
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm (Inductor)"),
        ("triton_poi_fused_cat_cos_mul_neg_sin_1", "rope (Inductor)"),
        # the H200 run's repeat_kv kernel: 89 us a layer at batch 16, context 1024
        (
            "triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy__unsafe_view_add_arange_cat_clone_cos_expand_le_",
            "attention inputs (Inductor)",
        ),
        ("triton_poi_fused_index_put_2", "kv cache write (Inductor)"),
        ("triton_poi_fused_scatter_3", "kv cache write (Inductor)"),  # "scatter" holds "cat": not rope
        ("triton_poi_fused_add_3", "residual add (Inductor)"),
        ("triton_poi_fused_clone_expand_5", "other (Inductor)"),  # "expand" is not the attention's "exp"
        ("triton_red_fused__softmax_exp_sub_6", "attention (Inductor)"),
        ("triton_poi_fused_mul_silu_4", "act (Inductor)"),
        ("triton_tem_fused_mm_0", "GEMM (Inductor template)"),
        ("triton_poi_fused_view_9", "other (Inductor)"),
        ("_wna16_gemv_words_kernel", "qfuse GEMM"),
        ("_int8_gemv_kernel", "qfuse GEMM"),
        ("_rms_norm_kernel", "qfuse norm"),
        ("_quant_per_token_kernel", "qfuse quant"),
        ("_silu_and_mul_kernel", "qfuse act"),
        ("_decode_attention_kernel", "attention"),  # qfuse::decode_attention, both launches
        ("_decode_attention_combine_kernel", "attention"),
        ("nvjet_tst_128x8_64x12_4x1_v_bz_TNT", "cuBLAS GEMM"),
        ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __nv_bfloat16>", "cuBLAS GEMM"),
        ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>", "attention"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "aten elementwise"),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy / memset"),
        ("some_unknown_kernel", "other"),
    ],
)
def test_category(name, expected):
    assert category(name) == expected
