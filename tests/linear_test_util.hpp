// Helpers shared by the linear-attention and LASP tests: a problem description, its seeded
// random inputs, and a relative-error expectation against fp64 results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "seqpar/linear_attention.hpp"
#include "test_util.hpp"

namespace seqpar::testing {

struct LinearProblem {
  int64_t batch = 1, seq = 64, heads = 2, kv_heads = 2, dk = 8, dv = 8;
  std::vector<double> decay{1.0};
  double scale = 1.0;
  int64_t chunk = 64;
  LinearAttentionParams params() const { return {decay, scale, chunk}; }
};

// q, k, v, dO and a nonzero incoming state and dState, uniform in [-1, 1).
struct LinearInputs {
  HostTensor q, k, v, dout, state_in, dstate_out;
};

inline LinearInputs make_linear_inputs(const LinearProblem& p, DType dtype, uint64_t seed) {
  return {random_tensor(dtype, {p.batch, p.seq, p.heads, p.dk}, seed),
          random_tensor(dtype, {p.batch, p.seq, p.kv_heads, p.dk}, seed + 1),
          random_tensor(dtype, {p.batch, p.seq, p.kv_heads, p.dv}, seed + 2),
          random_tensor(dtype, {p.batch, p.seq, p.heads, p.dv}, seed + 3),
          random_tensor(dtype, {p.batch, p.heads, p.dk, p.dv}, seed + 4),
          random_tensor(dtype, {p.batch, p.heads, p.dk, p.dv}, seed + 5)};
}

// max |got - want| <= rel * max(1, max |want|); the message names the tensor and the error.
inline void expect_close(const char* what, const HostTensor& got, const HostTensor& want, double rel) {
  const double err = max_abs_diff(got, want), bound = rel * std::max(1.0, max_abs(want));
  EXPECT_LE(err, bound) << what << ": max |error| " << err << " (bound " << bound << ")";
}

}  // namespace seqpar::testing
