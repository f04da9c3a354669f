// `seqpar attn`'s check: the ranks' results brought to rank 0 (whole tensors, or the sampled
// query rows alone from the ranks that hold them), and compared there with the fp64 oracle
// (every row, sampled rows, or the sampled query rows' O, LSE and dQ) or with the whole
// problem run on one GPU (--check single, which says where the two disagree).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn_compute.hpp"

namespace seqpar::app {

// What rank 0 checks with: the gathered whole results (when the job needs them) and, for
// --check rows, the sampled query rows' O, LSE and dQ in fp64.
struct Collected {
  HostTensor o, lse, dq, dk, dv;             // global token order
  std::vector<int64_t> rows;                 // --check rows: the sampled query rows
  HostTensor rows_o, rows_lse, rows_dq;      // and the ranks' results there
};
// Collective: every rank calls it after computing.
Status collect_results(Communicator& comm, const Job& job, const Layout& layout, const RankRun& run, Collected* c);

struct CheckResult {
  std::string mode;  // full, sampled, rows, single or none
  double tolerance = 0;
  bool ok = true;
  nlohmann::ordered_json errors;         // per tensor: max |error| (relative to max |reference| in bf16/fp16);
                                         // single: relative Frobenius errors (LSE: max |error|)
  nlohmann::ordered_json oracle_errors;  // single: both results against the oracle's query rows
  nlohmann::ordered_json disagreeing = nlohmann::json::array();  // single: blocks past tolerance
  std::string single_error;              // single: why the one-GPU run did not happen
  int64_t rows_checked = 0;              // query rows compared (every row: S)
  int64_t oracle_rows = 0;               // single: query rows the oracle compared
  int64_t key_rows = 0;                  // sampled: key rows compared
};

// Rank 0: checks `c` as the job's check mode asks; `whole` holds the whole inputs when the job
// needs them (every mode but rows and none). head_groups: the blocks --check single reports
// disagreement in. Progress goes to stderr.
StatusOr<CheckResult> check_results(const Job& job, const AttentionParams& params, const Collected& c,
                                    Inputs& whole, int head_groups, int ranks);

// bf16/fp16 on GPUs: results pass within this fraction of the reference's largest value (the
// test suite holds the kernels to the stricter bf16 rule of CONVENTIONS.md).
inline constexpr double kLowPrecisionRelativeTolerance = 1e-2;
// --check single's LSE (fp32 from the same bf16 inputs): max |error|.
inline constexpr double kSingleLseTolerance = 1e-3;

}  // namespace seqpar::app
