// The `seqpar` tool end to end: a run that must pass its own oracle check with bytes equal to
// the formula, JSON fields, .npy dumps, and clear errors with exit code 2 for bad arguments.
#include <gtest/gtest.h>

#include "cli_test_util.hpp"
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "seqpar/gpu.hpp"

namespace {

using Result = seqpar::testing::CliResult;
using seqpar::testing::last_json_line;

Result run_tool(const std::string& args) { return seqpar::testing::run_cli(args); }

// A passing --check rows report over `asked` sampled rows (the sampling drops repeats, so at
// least half of them).
void expect_rows_check_passed(const nlohmann::json& j, int asked) {
  EXPECT_EQ(j["check"], "rows");
  EXPECT_GE(j["check_rows"], asked / 2 + asked % 2);
  EXPECT_LE(j["check_rows"], asked);
  EXPECT_TRUE(j["check_passed"].get<bool>()) << j.dump();
}

TEST(Cli, AttnRunsChecksAndReportsJson) {
  const Result r = run_tool("attn --algo ring --layout zigzag --mask causal --seq 301 --heads 4 "
                            "--kv-heads 2 --head-dim 32 --ranks 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = last_json_line(r.output);
  for (const char* key : {"algo", "layout", "mask", "ranks", "seq", "heads", "kv_heads", "head_dim",
                          "fwd_s", "bwd_s", "max_abs_err", "bytes_sent_per_rank",
                          "bytes_expected_per_rank"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["ranks"], 3);
  EXPECT_EQ(j["bytes_sent_per_rank"], j["bytes_expected_per_rank"]);
  EXPECT_EQ(j["bytes_sent_per_rank"]["forward"].size(), 3u);
  for (const char* g : {"o", "lse", "dq", "dk", "dv"}) EXPECT_LE(j["max_abs_err"][g].get<double>(), 1e-4) << g;
}

// On the GPU machine: every GPU a rank (NCCL), both backwards, checked against the oracle
// with the bytes equal to the GPU formula. Skipped without a GPU.
TEST(Cli, CudaRanksCheckAgainstTheOracle) {
  if (seqpar::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here";
  for (const char* algo : {"ring", "burst"}) {
    const Result r = run_tool(std::string("attn --device cuda --algo ") + algo +
                              " --layout zigzag --mask causal --seq 3001 --heads 8 --kv-heads 4 "
                              "--head-dim 128 --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = last_json_line(r.output);
    EXPECT_EQ(j["dtype"], "bf16");
    EXPECT_EQ(j["ranks"], seqpar::cuda_device_count());
    EXPECT_EQ(j["bytes_sent_per_rank"], j["bytes_expected_per_rank"]);
    EXPECT_TRUE(j["check_passed"].get<bool>()) << r.output;
  }
}

// On the GPU machine: --check rows over GPU ranks, whose sampled rows come home through the
// NCCL communicator's all-reduce of host memory; the oracle agrees with the full check's.
TEST(Cli, CudaRanksRowsCheck) {
  if (seqpar::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here";
  const Result r = run_tool("attn --device cuda --layout zigzag --mask causal --seq 3001 --heads 8 --kv-heads 4 "
                            "--head-dim 128 --check rows --sample-rows 16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = last_json_line(r.output);
  expect_rows_check_passed(j, 16);
  for (const char* g : {"o", "lse", "dq"}) EXPECT_GT(j["max_abs_err"][g].get<double>(), 0.0) << g;  // bf16, not a copy
}

// On the GPU machine: two GPU ranks against the whole problem on one GPU (the check the
// scaling runs use where the fp64 oracle is too slow). One rank would make the same calls as
// the single GPU, and the errors below would be exactly 0.
TEST(Cli, CudaRanksMatchTheSingleGpuResult) {
  if (seqpar::cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Result r = run_tool("attn --device cuda --ranks 2 --algo auto --layout zigzag --mask causal "
                            "--seq 8192 --heads 8 --head-dim 128 --check single --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = last_json_line(r.output);
  EXPECT_EQ(j["check"], "single");
  for (const char* g : {"o", "lse", "dq", "dk", "dv"}) {
    EXPECT_LE(j["relative_err"][g].get<double>(), g == std::string("lse") ? 1e-3 : 1e-2) << g;
    EXPECT_GT(j["relative_err"][g].get<double>(), 0.0) << g << ": two bf16 runs do not agree bit for bit";
  }
  for (const char* who : {"ranks", "single"})
    for (const char* g : {"o", "lse", "dq"}) EXPECT_LE(j["oracle_err"][who][g].get<double>(), 1e-2) << who << " " << g;
  EXPECT_TRUE(j["disagreeing_blocks"].empty()) << j["disagreeing_blocks"].dump();
  EXPECT_TRUE(j["check_passed"].get<bool>()) << r.output;
}

// Four GPU ranks (the schedules whose fp32 accumulators travel) over a longer sequence than the
// oracle tests reach, both backwards, against the single GPU and the oracle rows.
TEST(Cli, CudaFourRanksMatchTheSingleGpuResultAt64K) {
  if (seqpar::cuda_device_count() < 4) GTEST_SKIP() << "needs four CUDA devices";
  for (const char* algo : {"ring", "burst"}) {
    const Result r = run_tool(std::string("attn --device cuda --ranks 4 --algo ") + algo +
                              " --layout zigzag --mask causal --seq 65536 --heads 8 --head-dim 128 "
                              "--check single --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = last_json_line(r.output);
    EXPECT_TRUE(j["disagreeing_blocks"].empty()) << algo << ": " << j["disagreeing_blocks"].dump();
    EXPECT_TRUE(j["check_passed"].get<bool>()) << algo << ": " << r.output;
  }
}

TEST(Cli, Fp64MatchesOracleTightly) {
  const Result r = run_tool("attn --layout striped --mask docs:4 --seq 123 --heads 2 --head-dim 16 "
                            "--ranks 4 --dtype fp64 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = last_json_line(r.output);
  for (const char* g : {"o", "lse", "dq", "dk", "dv"}) EXPECT_LE(j["max_abs_err"][g].get<double>(), 1e-10) << g;
}

// Block-sparse masks on CPU ranks: BigBird (causal and not) and a pattern file, checked
// against the oracle with bytes equal to the walked schedule.
TEST(Cli, BlockSparseMasksPassTheCheck) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto file = dir / ("seqpar_cli_pattern_" + std::to_string(getpid()) + ".txt");
  {
    std::ofstream out(file);
    out << "block_size 32\n";
    for (int qb = 0; qb < 4; ++qb) {
      for (int kb = 0; kb < 4; ++kb) out << (kb == qb || kb == 0 ? "1 " : "0 ");
      out << "\n";
    }
  }
  const std::pair<std::string, std::string> cases[] = {
      {"bigbird:1,1,2,B=16", "zigzag"},
      {"bigbird-causal:1,1,1,B=16", "contiguous --algo distflash"},
      {"blocks:" + file.string(), "striped"}};
  for (const auto& [mask, layout] : cases) {
    const Result r = run_tool("attn --mask " + mask + " --layout " + layout +
                              " --seq 123 --heads 2 --head-dim 16 --ranks 4 --dtype fp64 --json");
    ASSERT_EQ(r.exit_code, 0) << mask << "\n" << r.output;
    const auto j = last_json_line(r.output);
    EXPECT_EQ(j["mask"], mask);
    EXPECT_TRUE(j["check_passed"].get<bool>()) << j.dump();
    EXPECT_EQ(j["bytes_sent_per_rank"], j["bytes_expected_per_rank"]);
    for (const char* g : {"o", "lse", "dq", "dk", "dv"}) EXPECT_LE(j["max_abs_err"][g].get<double>(), 1e-10) << g;
  }
  // A pattern made for another length is refused with the numbers.
  const Result r = run_tool("attn --mask blocks:" + file.string() + " --seq 200");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("covers 128 tokens (4 blocks of 32) but the sequence has 200"), std::string::npos)
      << r.output;
  std::filesystem::remove(file);
}

TEST(Cli, AlgorithmsAndAutoReportWhatRan) {
  Result r = run_tool("attn --algo burst --seq 200 --heads 4 --head-dim 16 --ranks 3 --dtype fp64 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  EXPECT_EQ(j["algorithm"], "burst");
  EXPECT_EQ(j["bytes_sent_per_rank"], j["bytes_expected_per_rank"]);
  EXPECT_LE(j["max_abs_err"]["dq"].get<double>(), 1e-10);
  // Two ranks, MHA: Burst's pack returned once moves the fewest bytes; GQA 8:1: the ring's K/V.
  r = run_tool("attn --algo auto --seq 200 --heads 8 --head-dim 16 --ranks 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(last_json_line(r.output)["algorithm"], "burst-return");
  r = run_tool("attn --algo auto --seq 200 --heads 8 --kv-heads 1 --head-dim 16 --ranks 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(last_json_line(r.output)["algorithm"], "ring-return");
  EXPECT_NE(r.output.find("auto chose ring-return"), std::string::npos) << r.output;
  // DistFlashAttn on contiguous causal; the double ring on two nodes, bytes split by link.
  r = run_tool("attn --algo distflash --layout contiguous --seq 301 --heads 4 --head-dim 16 --ranks 5 --dtype fp64 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LE(last_json_line(r.output)["max_abs_err"]["dk"].get<double>(), 1e-10);
  r = run_tool("attn --algo double-ring --ranks-per-node 2 --seq 301 --heads 4 --head-dim 16 --ranks 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = last_json_line(r.output);
  EXPECT_EQ(j["inter_node_bytes_per_rank"]["sent"], j["inter_node_bytes_per_rank"]["walked"]);
  EXPECT_GT(j["inter_node_bytes_per_rank"]["sent"][0].get<int64_t>(), 0);
  // Refused with the reason, as a bad argument.
  r = run_tool("attn --algo distflash --layout zigzag --seq 64 --ranks 4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("use ring or burst"), std::string::npos) << r.output;
}

TEST(Cli, PrintSchedule) {
  const Result r = run_tool("attn --algo distflash --layout contiguous --seq 64 --ranks 8 --print-schedule 7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 7 of 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("forward: 5 shard pairs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("recv O[7]<-r0 (merge)"), std::string::npos) << r.output;
  EXPECT_EQ(run_tool("attn --seq 64 --ranks 2 --print-schedule 2").exit_code, 2);
  // Ulysses x ring on a 2 x 2 grid: the all-to-all of head parts, concatenation, the ring of
  // group spans, the split and the all-to-all home.
  const Result u = run_tool("attn --algo ulysses-ring --ulysses 2 --heads 4 --seq 64 --ranks 4 --print-schedule 1");
  ASSERT_EQ(u.exit_code, 0) << u.output;
  for (const char* step : {"post #0 (all-to-all): send Q[1]/h0->r0 send KV[1]/h0->r0", "concat KV[0+2]/h1",
                           "compute Q[0+2]/h1 x KV[0+2]/h1", "split O[0+2]/h1", "recv O[1]/h0<-r0 (merge)"})
    EXPECT_NE(u.output.find(step), std::string::npos) << step << "\n" << u.output;
  // Attention2D's collectives by name.
  const Result a = run_tool("attn --algo attention2d --layout striped --seq 64 --ranks 4 --print-schedule 2");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  for (const char* step : {"(transpose swap)", "(row all-gather)", "(column all-gather)", "(row reduce-scatter)"})
    EXPECT_NE(a.output.find(step), std::string::npos) << step << "\n" << a.output;
}

TEST(Cli, NewAlgorithmsRunAndReportBytesPerCollective) {
  for (const char* algo : {"ulysses", "ulysses-overlap", "ulysses-ring", "attention2d", "attention2d-overlap"}) {
    SCOPED_TRACE(algo);
    const Result r = run_tool(std::string("attn --algo ") + algo +
                              " --ranks 4 --ranks-per-node 2 --layout striped --mask causal --seq 256 --heads 8 "
                              "--kv-heads 2 --head-dim 16 --check full --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = last_json_line(r.output);
    EXPECT_TRUE(j["check_passed"].get<bool>());
    EXPECT_EQ(j["bytes_sent_per_rank"], j["bytes_expected_per_rank"]);
    for (const char* pass : {"forward", "backward"})
      for (int rank = 0; rank < 4; ++rank) {  // the collectives' bytes add up to the rank's
        int64_t sum = 0, links = 0;
        for (const auto& [name, bytes] : j["walked_bytes_per_rank_by_collective"].items()) sum += bytes[pass][rank].get<int64_t>();
        for (const auto& [name, bytes] : j["walked_bytes_per_rank_by_link"].items()) links += bytes[pass][rank].get<int64_t>();
        EXPECT_EQ(sum, j["bytes_sent_per_rank"][pass][rank].get<int64_t>());
        EXPECT_EQ(links, sum);
      }
  }
  // Ulysses keeping the forward's head-part Q and K/V: fewer backward bytes, same check.
  int64_t backward[2];
  for (int keep = 0; keep < 2; ++keep) {
    const Result r = run_tool(std::string("attn --algo ulysses --ranks 4 --seq 256 --heads 4 --kv-heads 4 "
                                          "--head-dim 16 --check full --json") +
                              (keep ? " --keep-forward-state" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = last_json_line(r.output);
    EXPECT_TRUE(j["check_passed"].get<bool>());
    backward[keep] = j["bytes_sent_per_rank"]["backward"][0].get<int64_t>();
  }
  EXPECT_LT(backward[1], backward[0]);
  const Result refused = run_tool("attn --algo attention2d --ranks 6 --seq 64");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("square number of ranks"), std::string::npos) << refused.output;
}

TEST(Cli, SampledCheckOnLargerProblem) {
  const Result r = run_tool("attn --seq 2048 --heads 2 --head-dim 64 --ranks 2 --check sampled "
                            "--sample-rows 16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(last_json_line(r.output)["check"], "sampled");
}

// --check rows: O, LSE and dQ of sampled query rows, fetched from the ranks that hold them and
// checked against the oracle at their global positions (striped rows and documents make the
// positions matter); fp64 holds them to the oracle within 1e-10.
TEST(Cli, RowsCheckFetchesSampledRowsFromTheirRanks) {
  for (const char* layout : {"zigzag --mask causal", "striped --mask docs:4"}) {
    const Result r = run_tool(std::string("attn --layout ") + layout + " --seq 301 --heads 4 --kv-heads 2 "
                              "--head-dim 16 --ranks 3 --dtype fp64 --check rows --sample-rows 9 --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = last_json_line(r.output);
    expect_rows_check_passed(j, 9);
    EXPECT_FALSE(j["max_abs_err"].contains("dk"));
    for (const char* g : {"o", "lse", "dq"}) EXPECT_LE(j["max_abs_err"][g].get<double>(), 1e-10) << layout << " " << g;
  }
}

TEST(Cli, DumpWritesNpyFiles) {
  const auto dir = std::filesystem::temp_directory_path() / "seqpar_cli_dump";
  std::filesystem::remove_all(dir);
  const Result r = run_tool("attn --seq 40 --heads 2 --head-dim 8 --ranks 2 --dump " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"q", "k", "v", "dO", "O", "LSE", "dQ", "dK", "dV"}) {
    std::ifstream f(dir / (std::string(name) + ".npy"), std::ios::binary);
    ASSERT_TRUE(f.good()) << name;
    std::string head(128, '\0');
    f.read(head.data(), 128);
    EXPECT_EQ(head.substr(1, 5), "NUMPY") << name;
    const bool lse = std::string(name) == "LSE";
    EXPECT_NE(head.find(lse ? "'shape': (1, 2, 40)" : "'shape': (1, 40, 2, 8)"), std::string::npos)
        << head;
    const auto size = std::filesystem::file_size(dir / (std::string(name) + ".npy"));
    EXPECT_EQ(size, 128u + (lse ? 80u : 640u) * 4u) << name;
  }
}

TEST(Cli, BadArgumentsFailClearly) {
  const std::pair<const char*, const char*> cases[] = {
      {"attn --heads 6 --kv-heads 4", "divisible"},
      {"attn --mask triangle", "unknown mask"},
      {"attn --mask bigbird:1,1", "expected bigbird:W,G,R[,B=N]"},
      {"attn --mask blocks:/no/such/seqpar/pattern", "cannot read block pattern file"},
      {"attn --layout diagonal", "unknown layout"},
      {"attn --algo magic", "available: ring|burst|"},
      {"attn --dtype bf16", "fp32 or fp64"},
      {"attn --seq 5 --ranks 4 --layout zigzag", "at least 8 tokens"},
      {"attn --seq -3", "positive"},
      {"attn --ranks 0", "between 1 and 1024"},
      {"attn --device tpu", "unknown device"},
      {"attn --check single", "needs --device cuda"},
      {"attn --max-call-rows -1", "--max-call-rows must be"},
      {"attn --check most", "must be auto, full, sampled, rows, single or none"},
      {"attn --dtype bf16", "needs --device cuda"},
      {"attn --device cuda --dtype fp64 --ranks 1", seqpar::cuda_device_count() ? "bf16 or fp16" : "no CUDA GPU"},
      // Too large for memory: refused with the estimate before anything is allocated (this
      // ended in std::bad_alloc, exit 134).
      {"attn --seq 99999999999999", "of host memory"},
      {"attn --seq 99999999999999 --check rows", "is available"},
      {"attn --sample-rows -3", "--sample-rows must be at least 1; got -3"},
      {"attn --sample-rows 0 --check rows", "--sample-rows must be at least 1"},
      // An unwritable --dump folder is found before the run, not after it.
      {"attn --dump /proc/seqpar-no-such-folder --seq 64", "--dump: cannot create the folder"},
      {"attn --kv-heads -2", "--kv-heads must be positive"},
      // CLI11's own parse errors exit 2 as well (they were 109 and 114).
      {"attn --seq notanumber", "Could not convert"},
      {"attn --no-such-option", "was not expected"},
      {"", "A subcommand is required"},
  };
  for (const auto& [args, expected] : cases) {
    const Result r = run_tool(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << args << "\n" << r.output;
  }
  const Result help = run_tool("attn --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--layout"), std::string::npos);
}

}  // namespace

TEST(Cli, TrainRefusesGpusWithoutCudaOrBesideRanks) {
  // --gpus is a GPU rank count in place of --ranks: refused as a bad argument elsewhere.
  for (const char* args : {"train --gpus 2", "train --device cuda --gpus 2 --ranks 2", "train --device cuda --gpus -1"}) {
    const Result r = run_tool(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("--gpus"), std::string::npos) << args << "\n" << r.output;
  }
}
