// The distributed attention call behind seqpar.attention and seqpar.attention_backward: full
// sequence arrays in, sharded with a layout, the planned schedule run on P thread ranks,
// results unsharded into new arrays.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/mask.hpp"

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

// The layout `name` of seq_len tokens over `ranks` ranks, or ValueError. doc_offsets: the packed
// documents (cu_seqlens) that the documents layout balances (empty: one document); the other
// layouts ignore them.
Layout make_layout(const std::string& name, int64_t seq_len, int ranks, const std::vector<int64_t>& doc_offsets = {});

// ValueError with `message` unless cond holds.
void require(bool cond, const std::string& message);

// ValueError unless a call's mask arguments over seq_len tokens are sound: window bounds >= -1, the
// mask as a window or as parse_mask's text (not both), documents' offsets (cu_seqlens) from 0,
// never decreasing, to seq_len.
void check_mask_args(int64_t window_left, int64_t window_right, const std::string& mask_text,
                     const std::vector<int64_t>& doc_offsets, int64_t seq_len);
// `mask` (the call's window or text) with the documents' offsets ANDed in, when there are any.
StatusOr<MaskSpec> with_documents(MaskSpec mask, const std::vector<int64_t>& doc_offsets);

// "(2, 128, 8, 64)", numpy's way.
std::string shape_text(const TensorView& t);

}  // namespace seqpar::py
