// The distributed attention call behind seqpar.attention and seqpar.attention_backward: full
// sequence arrays in, sharded with a layout, the planned schedule run on P thread ranks,
// results unsharded into new arrays.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "seqpar/layout.hpp"

namespace seqpar::py {

struct AttentionCall {
  TensorView q, k, v;                 // [B, S, H, D], [B, S, H_kv, D] x2
  std::optional<TensorView> o, lse;   // given: run the backward alone against them
  std::optional<TensorView> dout;     // given: run the backward ([B, S, H, D])
  int64_t window_left = -1, window_right = -1;
  std::vector<int64_t> doc_offsets;   // documents: global start offsets and the total (cu_seqlens)
  std::string mask;                   // a mask in parse_mask's text, instead of the window
  std::string algo = "auto";
  int ranks = 1;
  std::string layout = "zigzag";
  double scale = 0.0;                 // 0: 1/sqrt(D)
};

// Checks the call (ValueError / TypeError with the reason) and runs it. Returns a dict with
// o and lse (when the forward ran), dq, dk, dv (when the backward ran) and "algo", the
// algorithm that ran.
nb::dict run_attention(const AttentionCall& call);

// The layout `name` of seq_len tokens over `ranks` ranks, or ValueError.
Layout make_layout(const std::string& name, int64_t seq_len, int ranks);

// ValueError with `message` unless cond holds.
void require(bool cond, const std::string& message);

// "(2, 128, 8, 64)", numpy's way.
std::string shape_text(const TensorView& t);

}  // namespace seqpar::py
