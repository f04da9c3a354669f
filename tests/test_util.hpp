// Helpers for the tests: seeded random tensors and error measures against fp64 results.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "seqpar/attention.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::testing {

// Uniform in [-1, 1) from a fixed seed, in any dtype.
HostTensor random_tensor(DType dtype, const std::vector<int64_t>& shape, uint64_t seed);
// Same values converted to another dtype.
HostTensor cast(const HostTensor& t, DType dtype);
// max |a - b| over all elements (NaN counts as infinite error); -inf == -inf counts as 0.
double max_abs_diff(const HostTensor& a, const HostTensor& b);
// Largest |x| (the scale for relative tolerances).
double max_abs(const HostTensor& t);

// A file in the temp directory holding `text`, named from `stem` and the process id (tests run
// in parallel processes), removed with the object.
struct TempFile {
  std::filesystem::path path;
  TempFile(const std::string& stem, const std::string& text);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

}  // namespace seqpar::testing

namespace seqpar::testing {

// Attention as a plain low-precision implementation computes it (the baseline of the bf16
// rule): inputs in `dtype`, products accumulated in fp32 and rounded to `dtype` (scores S,
// probabilities P, dP, dS and every output), softmax statistics in fp32. Returns o, lse (fp32),
// dq, dk, dv converted to fp64. dout may be empty to skip the backward.
// With query_rows, only those rows of o, lse, dq are computed (dk, dv then hold partial sums
// and must not be compared).
ReferenceResult plain_lowp_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                     const HostTensor* dout, const AttentionParams& params,
                                     DType dtype, const std::vector<int64_t>& query_rows = {});
// max |a - b| over the given rows (dim `seq_dim`) of two tensors of one shape (infinite where
// the shapes differ).
double max_abs_diff_rows(const HostTensor& a, const HostTensor& b, int seq_dim,
                         const std::vector<int64_t>& rows);

// The bf16 rule: max|ours - oracle| <= 2 * max|plain - oracle| + max|round(oracle) - oracle|.
// Returns an explanation when it fails, empty when it holds.
std::string check_lowp_rule(const char* what, const HostTensor& ours, const HostTensor& plain,
                            const HostTensor& oracle, DType rounding);
// The same rule on a subset of rows along seq_dim.
std::string check_lowp_rule_rows(const char* what, const HostTensor& ours, const HostTensor& plain,
                                 const HostTensor& oracle, DType rounding, int seq_dim,
                                 const std::vector<int64_t>& rows);
// The given rows of dim `seq_dim`, in list order, as an fp64 tensor of that many rows: how a
// full-length result is put beside the query-side oracle's (ReferenceRows::query_side_only).
HostTensor take_rows(const HostTensor& t, int seq_dim, const std::vector<int64_t>& rows);

}  // namespace seqpar::testing
