// The TransNormerLLM-style token mixer's CUDA half (linear_attention_layer.hpp has the math and
// the CPU half): the same steps over the CUDA layer pieces (layers_cuda.hpp) and LASP on device
// tensors, queued on the training memory's stream. Mixed precision as the GPU engine keeps it:
// weights, x, dy and the kept activations bf16; the norm's rstd, y, dx and dw fp32.
#pragma once

#include "model/layers_cuda.hpp"
#include "model/linear_attention_layer.hpp"
#include "model/training_memory.hpp"

namespace seqpar::model::cuda {

// One rank's mixer on `device` (the memory's GPU); its scratch comes from `memory` and is given
// back at the end of each call. One per model pass (it keeps the norm's weight of ones).
class LinearMixer {
 public:
  LinearMixer(TrainingMemory& memory, Device device) : memory_(memory), device_(device) {}

  // linear_mixer_forward of linear_attention_layer.hpp: x [rows, hidden] bf16; y [rows, hidden]
  // fp32, written or (run.accumulate) added to.
  Status forward(Communicator& comm, const Layout& layout, LaspAlgorithm algorithm,
                 const LinearAttentionParams& params, const LinearMixerShape& shape,
                 const LinearMixerSlots<const bf16_t*>& w, const bf16_t* x,
                 const LinearMixerActs<bf16_t, float>& acts, float* y, LaspContext* ctx,
                 LinearMixerRun run);

  // linear_mixer_backward: dy [rows, hidden] bf16; dx [rows, hidden] fp32 (overwritten); the
  // weights' gradients (fp32) added to.
  Status backward(Communicator& comm, const Layout& layout, const LinearAttentionParams& params,
                  const LinearMixerShape& shape, const LinearMixerSlots<const bf16_t*>& w,
                  const bf16_t* x, const LinearMixerActs<bf16_t, float>& acts, const bf16_t* dy,
                  float* dx, const LinearMixerSlots<float*>& dw, LaspContext* ctx);

 private:
  // The output norm has no weight: rmsnorm's with a bf16 weight of ones [width], made once.
  StatusOr<const bf16_t*> norm_weight(int64_t width);
  // o (bf16) widened into fp32 scratch: rmsnorm reads the fp32 input the residual stream has.
  StatusOr<Array<float>> widened(const bf16_t* o, int64_t n);

  TrainingMemory& memory_;
  Device device_;
  Array<bf16_t> ones_;
};

}  // namespace seqpar::model::cuda
