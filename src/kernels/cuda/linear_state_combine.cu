// LASP's carried-state combine on the GPU (kernels/cuda/linear_cuda.hpp; the CPU version and the math
// are in seqpar/linear_attention.hpp): out = lambda_h^length carried + local, elementwise over
// fp32 states [B, H, d_k, d_v]. A rank's own state terms need no kernel of their own: the linear
// kernels take the carried state as state_in (dstate_out) and apply it on tensor cores.
#include <algorithm>
#include <string>
#include <utility>

#include "core/cuda_check.hpp"
#include "kernels/cuda/linear_host.hpp"
#include "kernels/cuda/linear_cuda.hpp"

namespace seqpar {
namespace {

// log2(1 / lambda_h) per head (cuda::fill_decays), as the linear kernels carry them.
struct HeadDecays {
  float log2_inv_decay[cuda::kLinearMaxHeads];
};

__global__ void combine_states(const float* carried, const float* local, float* out, int64_t elems, int heads,
                               int64_t per_head, float length, const HeadDecays decays) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < elems; e += int64_t(gridDim.x) * blockDim.x) {
    const int h = int((e / per_head) % heads);
    out[e] = exp2f(-decays.log2_inv_decay[h] * length) * carried[e] + local[e];
  }
}

}  // namespace

Status linear_state_combine_cuda(const TensorView& carried, const TensorView& local, int64_t length,
                                 const LinearAttentionParams& params, const TensorView& out, void* stream) {
  SP_CHECK_ARG(carried.ndim == 4 && length >= 0, "states must be [B, H, d_k, d_v] and the length non-negative");
  const int64_t B = carried.shape[0], H = carried.shape[1], Dk = carried.shape[2], Dv = carried.shape[3];
  SP_CHECK_SUPPORTED(H <= cuda::kLinearMaxHeads, "at most " + std::to_string(cuda::kLinearMaxHeads) + " heads");
  SP_RETURN_IF_ERROR(validate_linear_params(params, H));
  const cuda::LinearCudaDims d{B, 0, H, H, Dk, Dv, DType::kF32};
  for (const auto& [name, t] : {std::pair{"carried", &carried}, {"local", &local}, {"out", &out}}) {
    SP_CHECK_ARG(t->data != nullptr, std::string(name) + " is null");
    SP_RETURN_IF_ERROR(cuda::check_linear_cuda_state(name, *t, d));
  }
  HeadDecays decays{};
  cuda::fill_decays(params, H, decays.log2_inv_decay);
  const int64_t elems = B * H * Dk * Dv;
  if (elems == 0) return Status::Ok();
  const unsigned blocks = unsigned(std::min<int64_t>((elems + 255) / 256, 4096));
  combine_states<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(carried.data), static_cast<const float*>(local.data), static_cast<float*>(out.data),
      elems, int(H), Dk * Dv, float(length), decays);
  SP_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace seqpar
