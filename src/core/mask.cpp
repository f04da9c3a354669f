// Mask specifications: construction, validation, parsing and description.
#include "seqpar/mask.hpp"

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace seqpar {

MaskSpec MaskSpec::window(int64_t left, int64_t right) {
  MaskSpec m;
  m.window_left = left;
  m.window_right = right;
  return m;
}

MaskSpec MaskSpec::documents(std::vector<int64_t> offsets, bool causal_inside) {
  MaskSpec m = causal_inside ? causal() : none();
  m.doc_offsets = std::move(offsets);
  return m;
}

bool MaskSpec::sees_any(std::span<const int64_t> q_pos, std::span<const int64_t> k_pos) const {
  std::vector<int64_t> keys(k_pos.begin(), k_pos.end());
  std::sort(keys.begin(), keys.end());
  if (keys.empty()) return false;
  for (const int64_t qp : q_pos) {
    // The keys a query sees form one interval: its band, cut to its document.
    int64_t lo = window_left < 0 ? keys.front() : qp - window_left;
    int64_t hi = window_right < 0 ? keys.back() : qp + window_right;
    if (has_documents()) {
      const auto next = std::upper_bound(doc_offsets.begin(), doc_offsets.end(), qp);
      if (next == doc_offsets.begin() || next == doc_offsets.end()) continue;  // outside every document
      lo = std::max(lo, *(next - 1));
      hi = std::min(hi, *next - 1);
    }
    const auto first = std::lower_bound(keys.begin(), keys.end(), lo);
    if (first != keys.end() && *first <= hi) return true;
  }
  return false;
}

std::string MaskSpec::describe() const {
  std::string band;
  if (window_left < 0 && window_right < 0) {
    band = "full";
  } else if (window_left < 0 && window_right == 0) {
    band = "causal";
  } else {
    band = "window:" + std::to_string(window_left) + "," + std::to_string(window_right);
  }
  if (!has_documents()) return band;
  return "docs:" + std::to_string(doc_offsets.size() - 1) + (band == "causal" ? "" : "+" + band);
}

Status MaskSpec::validate(int64_t seq_len) const {
  SP_CHECK_ARG(window_left >= -1 && window_right >= -1,
               "mask windows must be >= 0, or -1 for unbounded");
  if (!has_documents()) return Status::Ok();
  SP_CHECK_ARG(doc_offsets.size() >= 2 && doc_offsets.front() == 0,
               "document offsets must start at 0 and hold at least one document");
  SP_CHECK_ARG(std::is_sorted(doc_offsets.begin(), doc_offsets.end()),
               "document offsets must not decrease");
  SP_CHECK_ARG(doc_offsets.back() >= seq_len,
               "document offsets end at " + std::to_string(doc_offsets.back()) +
                   " but the sequence has " + std::to_string(seq_len) + " tokens");
  return Status::Ok();
}

std::vector<int64_t> make_document_offsets(int64_t seq_len, int64_t count) {
  // Lengths proportional to 1, 2, 3, ... so documents differ and boundaries fall mid-shard.
  std::vector<int64_t> offsets{0};
  const int64_t weight_total = count * (count + 1) / 2;
  int64_t acc_weight = 0;
  for (int64_t d = 1; d <= count; ++d) {
    acc_weight += d;
    offsets.push_back(d == count ? seq_len : seq_len * acc_weight / weight_total);
  }
  return offsets;
}

StatusOr<MaskSpec> parse_mask(const std::string& text, int64_t seq_len) {
  if (text == "full" || text == "none") return MaskSpec::none();
  if (text == "causal") return MaskSpec::causal();
  auto parse_int = [](const std::string& s, int64_t* out) {
    char* end = nullptr;
    *out = std::strtoll(s.c_str(), &end, 10);
    return !s.empty() && end == s.c_str() + s.size();
  };
  if (text.rfind("window:", 0) == 0) {
    const std::string rest = text.substr(7);
    const size_t comma = rest.find(',');
    int64_t left = 0, right = 0;
    if (comma == std::string::npos || !parse_int(rest.substr(0, comma), &left) ||
        !parse_int(rest.substr(comma + 1), &right) || left < -1 || right < -1) {
      return SP_STATUS(StatusCode::kInvalidArgument,
                       "bad mask '" + text + "': expected window:L,R with L, R >= -1");
    }
    return MaskSpec::window(left, right);
  }
  if (text.rfind("docs:", 0) == 0) {
    int64_t count = 0;
    if (!parse_int(text.substr(5), &count) || count < 1 || count > seq_len) {
      return SP_STATUS(StatusCode::kInvalidArgument,
                       "bad mask '" + text + "': expected docs:N with 1 <= N <= sequence length");
    }
    return MaskSpec::documents(make_document_offsets(seq_len, count));
  }
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown mask '" + text + "' (expected full, causal, window:L,R or docs:N)");
}

}  // namespace seqpar
