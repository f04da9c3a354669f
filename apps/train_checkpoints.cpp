// seqpar train's checkpoint folder and SIGTERM (train_checkpoints.hpp).
#include "train_checkpoints.hpp"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>

#include "model/checkpoint_file.hpp"

namespace seqpar::app {
namespace {

namespace fs = std::filesystem;
std::atomic<bool> g_termination{false};
extern "C" void on_termination(int) { g_termination.store(true); }

// The step-numbered checkpoints of dir, by step.
std::map<int64_t, fs::path> checkpoints_in(const std::string& dir) {
  std::map<int64_t, fs::path> found;
  std::error_code ec;
  static const std::regex name(R"(step-(\d+)\.ckpt)");
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (e.is_regular_file(ec) && std::regex_match(file, m, name)) found[std::stoll(m[1].str())] = e.path();
  }
  return found;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld.ckpt", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

StatusOr<std::string> newest_checkpoint(const std::string& dir, int64_t parameter_count) {
  const std::map<int64_t, fs::path> found = checkpoints_in(dir);
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const StatusOr<model::TrainingState> state = model::read_checkpoint(it->second.string(), parameter_count);
    if (state.ok()) return it->second.string();
    std::fprintf(stderr, "seqpar train: skipping %s: %s\n", it->second.string().c_str(),
                 state.status().message().c_str());
  }
  return std::string();
}

void prune_checkpoints(const std::string& dir, int keep) {
  if (keep <= 0) return;
  const std::map<int64_t, fs::path> found = checkpoints_in(dir);
  int left = int(found.size());
  std::error_code ec;
  for (const auto& [step, path] : found)
    if (left-- > keep) fs::remove(path, ec);
}

void catch_termination() {
  struct sigaction action {};
  action.sa_handler = on_termination;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

StatusOr<bool> termination_requested(Communicator& comm) {
  double asked = g_termination.load() ? 1.0 : 0.0;
  const PhaseScope other(comm, Phase::kOther);
  SP_RETURN_IF_ERROR(comm.all_reduce(&asked, 1, DType::kF64, ReduceOp::kSum));
  return asked > 0;
}

}  // namespace seqpar::app
