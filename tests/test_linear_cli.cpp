// `seqpar linear-attn` end to end: runs of both algorithms that pass their own oracle check
// with bytes equal to the formula, the JSON fields, .npy dumps, and bad arguments refused with
// exit code 2 and the reason.
#include <gtest/gtest.h>

#include "cli_test_util.hpp"

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using Result = seqpar::testing::CliResult;
using seqpar::testing::last_json_line;

Result run_tool(const std::string& args) { return seqpar::testing::run_cli("linear-attn " + args); }

TEST(LinearCli, BothAlgorithmsPassTheOracleWithTheFormulaBytes) {
  for (const char* algo : {"lasp", "lasp2"}) {
    const Result r = run_tool(std::string("--algo ") + algo +
                              " --seq 301 --heads 4 --kv-heads 2 --dk 8 --dv 6 --decay 0.9,0.7,1,0.95 "
                              "--chunk 40 --ranks 3 --dtype fp64 --check --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = last_json_line(r.output);
    EXPECT_EQ(j["algo_ran"], algo);
    EXPECT_TRUE(j["check_passed"].get<bool>());
    for (const char* t : {"o", "final_state", "dq", "dk", "dv"}) EXPECT_LE(j["max_rel_err"][t].get<double>(), 1e-10) << t;
    EXPECT_EQ(j["bytes_sent_per_rank"], j["bytes_expected_per_rank"]);
    const int64_t message = 1 * 4 * 8 * 6 * 8;  // B H d_k d_v fp64
    EXPECT_EQ(j["state_message_bytes"], message);
    const nlohmann::json chain = {{"forward", {message, message, 0}}, {"backward", {0, message, message}}};
    if (std::string(algo) == "lasp") {
      EXPECT_EQ(j["bytes_sent_per_rank"], chain);
    }
  }
}

TEST(LinearCli, DumpsNpyFiles) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "seqpar_linear_cli_dump";
  std::filesystem::remove_all(dir);
  const Result r = run_tool("--seq 50 --heads 2 --dk 4 --dv 4 --ranks 2 --decay 0.8 --dump " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"q", "k", "v", "dO", "O", "dQ", "dK", "dV", "final_state"})
    EXPECT_TRUE(std::filesystem::exists(dir / (std::string(name) + ".npy"))) << name;
  EXPECT_GT(std::filesystem::file_size(dir / "O.npy"), 50u * 2 * 4 * 4);
  std::filesystem::remove_all(dir);
}

TEST(LinearCli, RefusesBadArgumentsWithExitCode2) {
  const std::pair<const char*, const char*> cases[] = {
      {"--decay 0", "(0, 1]"},
      {"--decay 1.01", "(0, 1]"},
      {"--heads 4 --decay 0.9,0.8", "one per query head"},
      {"--heads 6 --kv-heads 4", "divisible"},
      {"--seq 3 --ranks 4", "at least --ranks"},
      {"--algo ring", "unknown LASP algorithm"},
      {"--dtype bf16", "fp32 or fp64"},
  };
  for (const auto& [args, reason] : cases) {
    const std::string seq = std::string(args).find("--seq") == std::string::npos ? "--seq 64 " : "";
    const Result r = run_tool(seq + "--dk 4 --dv 4 " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(reason), std::string::npos) << args << "\n" << r.output;
  }
}

}  // namespace
