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

void prune_checkpoints(const std::string& dir, int keep, int64_t saved) {
  std::map<int64_t, fs::path> found = checkpoints_in(dir);
  std::error_code ec;
  for (auto it = found.upper_bound(saved); it != found.end(); it = found.erase(it)) {
    const std::string stale = it->second.string() + ".stale";
    fs::rename(it->second, stale, ec);
    std::fprintf(stderr, "seqpar train: %s is from a later step than this run's; set aside as %s\n",
                 it->second.string().c_str(), stale.c_str());
  }
  if (keep <= 0) return;
  int left = int(found.size());
  for (const auto& [step, path] : found)
    if (left-- > keep) fs::remove(path, ec);
}

StatusOr<std::string> agreed_checkpoint(Communicator& comm, const std::string& dir, int64_t parameter_count) {
  double step = -1;  // rank 0's choice; -1: none
  if (comm.rank() == 0) {
    SP_ASSIGN_OR_RETURN(const std::string newest, newest_checkpoint(dir, parameter_count));
    if (!newest.empty()) {
      std::smatch m;
      static const std::regex name(R"(.*step-(\d+)\.ckpt)");
      if (std::regex_match(newest, m, name)) step = double(std::stoll(m[1].str()));
    }
  }
  double sum = comm.rank() == 0 ? step : 0.0;
  const PhaseScope other(comm, Phase::kOther);
  SP_RETURN_IF_ERROR(comm.all_reduce(&sum, 1, DType::kF64, ReduceOp::kSum));
  return sum < 0 ? std::string() : checkpoint_path(dir, int64_t(sum));
}

void catch_termination() {
  struct sigaction action {};
  action.sa_handler = on_termination;
  // Restart interrupted calls; a second SIGTERM acts as the default again (ends a stuck run).
  action.sa_flags = SA_RESTART | SA_RESETHAND;
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
