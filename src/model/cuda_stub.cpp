// The model's GPU entry points for builds without CUDA: clear refusals (the CPU trainer is whole).
#ifndef SEQPAR_HAVE_CUDA
#include "model/host_offload.hpp"
#include "model/model_pass.hpp"

namespace seqpar::model {
namespace {
Status no_cuda() {
  return SP_STATUS(StatusCode::kUnsupported, "seqpar was built without CUDA: train with --device cpu");
}
}  // namespace

StatusOr<std::unique_ptr<TrainingMemory>> make_cuda_training_memory() { return no_cuda(); }
StatusOr<std::unique_ptr<HostOffload>> make_cuda_host_offload(TrainingMemory&) { return no_cuda(); }
StatusOr<std::unique_ptr<ModelPass>> make_cuda_model_pass(const TrainOptions&, const Layout&, Communicator&,
                                                          TrainingMemory&) {
  return no_cuda();
}

}  // namespace seqpar::model
#endif
