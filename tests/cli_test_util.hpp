// What the tool's end-to-end tests share: running the built `seqpar` binary with arguments
// (stdout and stderr together, and the exit code), and the last JSON object it printed.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace seqpar::testing {

struct CliResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

inline CliResult run_cli(const std::string& args) {
  const std::string cmd = std::string(SEQPAR_CLI_PATH) + " " + args + " 2>&1";
  std::FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WEXITSTATUS(status), out};
}

inline nlohmann::json last_json_line(const std::string& out) {
  const size_t start = out.rfind("\n{");
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start + 1));
}

}  // namespace seqpar::testing
