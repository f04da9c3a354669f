// The fault points of fault_injection.hpp.
#include "model/fault_injection.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

namespace seqpar::model {
namespace {

thread_local int64_t t_step = -1;
thread_local int t_rank = -1;

}  // namespace

void set_fault_context(int64_t step, int rank) { t_step = step, t_rank = rank; }

void fault_point(const char* where, int64_t at_step) {
  const char* spec = std::getenv("SEQPAR_FAULT_KILL");
  if (!spec || !*spec) return;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const long attempt = restart ? std::atol(restart) : 0;
  std::stringstream entries(spec);
  for (std::string entry; std::getline(entries, entry, ',');) {
    char name[32] = {};
    long long step = -1;
    int rank = -1;
    long want = 0;
    if (std::sscanf(entry.c_str(), "%31[a-z]:%lld:%d:%ld", name, &step, &rank, &want) < 3) continue;
    if (std::strcmp(name, where) || step != (at_step >= 0 ? at_step : t_step) || rank != t_rank || want != attempt) continue;
    std::fprintf(stderr, "seqpar: SEQPAR_FAULT_KILL: rank %d kills itself in the %s of step %lld (attempt %ld)\n",
                 rank, where, step, attempt);
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
}

}  // namespace seqpar::model
