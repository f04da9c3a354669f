"""bench/peer_step_profile.py's pure parts (no torch, no GPU): which kind each of the PyTorch
peer's kernels is counted in, and how busy time and the step's table are made from a trace."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from peer_step_profile import busy_ms, kernel_kind, summarize  # noqa: E402

V = 128256


def test_kernel_kinds_of_the_peers_step():
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_64x128x128_4x1x1") == "attention"
    gemm = "nvjet_tst_256x128_64x4_1x2_h_bz_coopB_TNT"
    assert kernel_kind(gemm, [[65536, 2048], [2048, 8192]], V, "aten::mm") == "products"
    assert kernel_kind(gemm, [[65536, 2048], [2048, V]], V, "aten::mm") == "lm_head"
    assert kernel_kind("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>",
                       [[1, 65536, V], []], V, "aten::_to_copy") == "lm_head"
    assert kernel_kind("void at::native::cunn_SoftMaxForward<8, float, float, float, LogSoftMaxForwardEpilogue>") == "lm_head"
    assert kernel_kind("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>") == "casts"
    assert kernel_kind("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "norms"
    assert kernel_kind("triton_poi_fused_mul_silu_1") == "swiglu"
    assert kernel_kind("triton_poi_fused_add_cat_mul_neg_slice_2") == "rope"
    assert kernel_kind("triton_poi_fused_add_3") == "other"
    assert kernel_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "communication"
    assert kernel_kind("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>") == "optimizer"
    assert kernel_kind("void at::native::indexSelectLargeIndex<c10::BFloat16, long>", [[V, 2048], [65536]], V,
                       "aten::index_select") == "embedding"
    assert kernel_kind("void at::native::embedding_backward_feature_kernel<float>") == "embedding"


def test_busy_time_is_the_union_of_kernel_intervals():
    assert busy_ms([]) == 0
    assert busy_ms([(0, 1000), (500, 1500), (3000, 4000)]) == 2.5
    assert busy_ms([(0, 4000), (1000, 2000)]) == 4.0


def test_summary_counts_each_kernel_once_by_its_operators_dims():
    events = [
        {"cat": "cpu_op", "name": "aten::mm", "args": {"External id": 1, "Input Dims": [[8, 4], [4, V]]}},
        {"cat": "cpu_op", "name": "aten::mm", "args": {"External id": 2, "Input Dims": [[8, 4], [4, 16]]}},
        {"cat": "kernel", "name": "nvjet_a", "ts": 0, "dur": 2000, "args": {"External id": 1}},
        {"cat": "kernel", "name": "nvjet_a", "ts": 2000, "dur": 1000, "args": {"External id": 2}},
        {"cat": "kernel", "name": "fmha_fwd", "ts": 2500, "dur": 1000, "args": {}},
        {"cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 9000, "args": {}},
    ]
    s = summarize(events, V, wall_ms=5.0)
    assert s["work_ms"]["lm_head"] == 2.0 and s["work_ms"]["products"] == 1.0 and s["work_ms"]["attention"] == 1.0
    assert s["busy_ms"] == 3.5 and s["idle_ms"] == 1.5
    assert s["longest"][0] == ["nvjet_a", 3.0]
