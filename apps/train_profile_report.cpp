// train_profile_report.hpp: StepReport::work_ms (whose last entry is the pass's span) for the
// tool's --json lines and text lines.
#include "train_profile_report.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

namespace seqpar::app {

nlohmann::ordered_json work_object(const StepReport& r) {
  nlohmann::ordered_json w = nlohmann::ordered_json::object();
  for (const auto& [kind, ms] : r.work_ms) w[kind] = ms;
  w["outside_pass"] = r.seconds * 1e3 - r.work_ms.back().second;
  w["step"] = r.seconds * 1e3;
  return w;
}

std::string work_line(const StepReport& r) {
  std::vector<std::pair<std::string, double>> parts(r.work_ms.begin(), r.work_ms.end() - 1);
  parts.emplace_back("outside_pass", r.seconds * 1e3 - r.work_ms.back().second);
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string line;
  for (const auto& [kind, ms] : parts) {
    if (ms < 0.005 * r.seconds * 1e3) continue;
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%s%s %.1f%% (%.1f ms)", line.empty() ? "" : ", ", kind.c_str(),
                  100 * ms / (r.seconds * 1e3), ms);
    line += buf;
  }
  return line;
}

}  // namespace seqpar::app
