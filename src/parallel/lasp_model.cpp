// Around LASP's passes (seqpar/lasp.hpp): the algorithms' names, the latency/bandwidth model of
// --algo auto, the bytes each rank sends (the paper's formula, and the walk of the steps), and
// the sequence groups of a data-sequence hybrid world.
#include "parallel/lasp_steps.hpp"
#include "seqpar/lasp.hpp"

namespace seqpar {

const char* lasp_algorithm_name(LaspAlgorithm algorithm) {
  switch (algorithm) {
    case LaspAlgorithm::kChain: return "lasp";
    case LaspAlgorithm::kAllGather: return "lasp2";
    case LaspAlgorithm::kAuto: return "auto";
    case LaspAlgorithm::kUlysses: return "ulysses";
  }
  return "?";
}

StatusOr<LaspAlgorithm> parse_lasp_algorithm(const std::string& name) {
  if (name == "lasp") return LaspAlgorithm::kChain;
  if (name == "lasp2") return LaspAlgorithm::kAllGather;
  if (name == "auto") return LaspAlgorithm::kAuto;
  if (name == "ulysses") return LaspAlgorithm::kUlysses;
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown LASP algorithm '" + name + "' (expected lasp, lasp2, ulysses or auto)");
}

double lasp_chain_seconds(int ranks, int64_t state_bytes, const LaspLinkModel& link) {
  return (ranks - 1) * (link.latency_s + static_cast<double>(state_bytes) / link.bytes_per_s);
}

double lasp_allgather_seconds(int ranks, int64_t state_bytes, const LaspLinkModel& link) {
  // The Communicator's ring all_gather: T-1 dependent steps, one block each.
  return (ranks - 1) * (link.latency_s + static_cast<double>(state_bytes) / link.bytes_per_s);
}

LaspAlgorithm choose_lasp_algorithm(int ranks, int64_t state_bytes, const LaspLinkModel& link) {
  return lasp_allgather_seconds(ranks, state_bytes, link) < lasp_chain_seconds(ranks, state_bytes, link)
             ? LaspAlgorithm::kAllGather
             : LaspAlgorithm::kChain;
}

int64_t lasp_state_bytes(int64_t batch, int64_t heads, int64_t dk, int64_t dv, DType dtype) {
  return batch * heads * dk * dv * static_cast<int64_t>(dtype_size(dtype));
}

LaspTraffic lasp_expected_bytes(LaspAlgorithm algorithm, int ranks, int rank, int64_t state_bytes) {
  if (algorithm == LaspAlgorithm::kAllGather) {
    const int64_t gathered = (ranks - 1) * state_bytes;
    return {gathered, gathered};
  }
  return {rank < ranks - 1 ? state_bytes : 0, rank > 0 ? state_bytes : 0};
}

LaspTraffic lasp_walked_bytes(LaspAlgorithm algorithm, int ranks, int rank, int64_t state_bytes) {
  using lasp::Pass;
  return {lasp::walk_bytes(lasp::pass_steps(algorithm, Pass::kForward, rank, ranks), ranks, state_bytes),
          lasp::walk_bytes(lasp::pass_steps(algorithm, Pass::kBackward, rank, ranks), ranks, state_bytes)};
}

StatusOr<std::unique_ptr<Communicator>> make_sequence_group(Communicator& world, int sequence_ranks) {
  SP_CHECK_ARG(sequence_ranks >= 1 && world.size() % sequence_ranks == 0,
               "the world size (" + std::to_string(world.size()) + ") must be divisible by the sequence-parallel size (" +
                   std::to_string(sequence_ranks) + ")");
  return world.split(world.rank() / sequence_ranks, world.rank());
}

}  // namespace seqpar
