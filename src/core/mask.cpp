// Mask specifications: construction, validation, parsing and description.
#include "seqpar/mask.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
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

MaskSpec MaskSpec::block_sparse(BlockPattern pattern, bool causal) {
  MaskSpec m = causal ? MaskSpec::causal() : none();
  m.block_pattern = std::make_shared<const BlockPattern>(std::move(pattern));
  return m;
}

namespace {

// Whether position p lies in a document, and that document's [begin, end).
bool document_of(const std::vector<int64_t>& offsets, int64_t p, int64_t* begin, int64_t* end) {
  const auto next = std::upper_bound(offsets.begin(), offsets.end(), p);
  if (next == offsets.begin() || next == offsets.end()) return false;
  *begin = *(next - 1);
  *end = *next;
  return true;
}

// Whether any key of sorted `keys` lies in [lo, hi].
bool any_key_in(std::span<const int64_t> keys, int64_t lo, int64_t hi) {
  const auto first = std::lower_bound(keys.begin(), keys.end(), lo);
  return first != keys.end() && *first <= hi;
}

// Whether a key of sorted `keys` lies in [lo, hi] inside a block of `row` (sorted) that is one
// of `key_blocks` (sorted: the blocks holding keys). Walks the shorter of the two lists over
// the blocks [lo, hi] meets and looks each up in the other.
bool any_key_in_row(const BlockPattern& pattern, std::span<const int64_t> row,
                    const std::vector<int64_t>& key_blocks, std::span<const int64_t> keys,
                    int64_t lo, int64_t hi) {
  lo = std::max<int64_t>(lo, 0);
  hi = std::min(hi, pattern.covered_len() - 1);
  if (lo > hi) return false;
  const int64_t B = pattern.block_size(), first_block = lo / B, last_block = hi / B;
  const auto row_a = std::lower_bound(row.begin(), row.end(), first_block);
  const auto row_b = std::upper_bound(row_a, row.end(), last_block);
  const auto keys_a = std::lower_bound(key_blocks.begin(), key_blocks.end(), first_block);
  const auto keys_b = std::upper_bound(keys_a, key_blocks.end(), last_block);
  auto hit = [&](int64_t kb) {
    return any_key_in(keys, std::max(lo, kb * B), std::min(hi, kb * B + B - 1));
  };
  if (row_b - row_a <= keys_b - keys_a) {
    for (auto it = row_a; it != row_b; ++it)
      if (std::binary_search(keys_a, keys_b, *it) && hit(*it)) return true;
  } else {
    for (auto it = keys_a; it != keys_b; ++it)
      if (std::binary_search(row_a, row_b, *it) && hit(*it)) return true;
  }
  return false;
}

}  // namespace

bool MaskSpec::allows(int64_t qp, int64_t kp) const {
  if (!band_allows(qp, kp)) return false;
  if (block_pattern && !block_pattern->allows(qp, kp)) return false;
  if (!has_documents()) return true;
  int64_t begin = 0, end = 0;
  return document_of(doc_offsets, qp, &begin, &end) && kp >= begin && kp < end;
}

bool MaskSpec::sees_any(std::span<const int64_t> q_pos, std::span<const int64_t> k_pos) const {
  // The keys in order: as they are where a layout's shard (or run of one) is already sorted, else
  // a sorted copy.
  std::vector<int64_t> sorted;
  std::span<const int64_t> keys = k_pos;
  if (!std::is_sorted(k_pos.begin(), k_pos.end())) {
    sorted.assign(k_pos.begin(), k_pos.end());
    std::sort(sorted.begin(), sorted.end());
    keys = sorted;
  }
  if (keys.empty()) return false;
  std::vector<int64_t> key_blocks;  // sorted blocks of the pattern that hold keys
  if (block_pattern) {
    for (const int64_t kp : keys) {
      const int64_t kb = block_pattern->block_of(kp);
      if (kb >= 0 && (key_blocks.empty() || key_blocks.back() != kb)) key_blocks.push_back(kb);
    }
  }
  for (const int64_t qp : q_pos) {
    // The keys a query sees form one interval: its band, cut to its document; a pattern keeps
    // the parts of it in the key blocks of the query's row.
    int64_t lo = window_left < 0 ? keys.front() : qp - window_left;
    int64_t hi = window_right < 0 ? keys.back() : qp + window_right;
    if (has_documents()) {
      int64_t begin = 0, end = 0;
      if (!document_of(doc_offsets, qp, &begin, &end)) continue;  // outside every document
      lo = std::max(lo, begin);
      hi = std::min(hi, end - 1);
    }
    if (block_pattern) {
      const int64_t qb = block_pattern->block_of(qp);
      if (qb >= 0 &&
          any_key_in_row(*block_pattern, block_pattern->row(qb), key_blocks, keys, lo, hi))
        return true;
    } else if (any_key_in(keys, lo, hi)) {
      return true;
    }
  }
  return false;
}

double MaskSpec::visible_pairs(int64_t S) const {
  double total = 0;
  for (int64_t i = 0; i < S; ++i) {
    int64_t lo = 0, hi = S - 1;
    if (window_left >= 0) lo = std::max(lo, i - window_left);
    if (window_right >= 0) hi = std::min(hi, i + window_right);
    if (has_documents()) {
      const auto it = std::upper_bound(doc_offsets.begin(), doc_offsets.end(), i);
      lo = std::max(lo, *(it - 1));
      hi = std::min(hi, *it - 1);
    }
    total += double(std::max<int64_t>(0, hi - lo + 1));
  }
  return total;
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
  std::string text = band;
  if (block_pattern) {  // its name says "-causal" or not; any other band is added
    const std::string& name = block_pattern->name();
    const std::string family = name.substr(0, name.find(':'));
    const bool causal_name =
        family.size() >= 7 && family.compare(family.size() - 7, 7, "-causal") == 0;
    text = name + (band == (causal_name ? "causal" : "full") ? "" : "+" + band);
  }
  if (!has_documents()) return text;
  return "docs:" + std::to_string(doc_offsets.size() - 1) + (text == "causal" ? "" : "+" + text);
}

Status MaskSpec::validate(int64_t seq_len) const {
  SP_CHECK_ARG(window_left >= -1 && window_right >= -1,
               "mask windows must be >= 0, or -1 for unbounded");
  if (block_pattern) {
    SP_CHECK_ARG(block_pattern->covered_len() >= seq_len,
                 "block pattern " + block_pattern->name() + " covers " +
                     std::to_string(block_pattern->covered_len()) + " tokens (" +
                     std::to_string(block_pattern->blocks()) + " blocks of " +
                     std::to_string(block_pattern->block_size()) + ") but the sequence has " +
                     std::to_string(seq_len));
  }
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

std::vector<int64_t> make_lognormal_document_offsets(int64_t seq_len, double mean, double sigma, uint64_t seed) {
  std::mt19937_64 bits(seed);
  const auto uniform = [&] { return (double(bits() >> 11) + 0.5) * 0x1.0p-53; };  // in (0, 1)
  const double mu = std::log(mean) - 0.5 * sigma * sigma;  // E[exp(mu + sigma z)] = mean
  std::vector<int64_t> offsets{0};
  while (offsets.back() < seq_len) {
    const double z = std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
    const double len = std::exp(mu + sigma * z);
    const int64_t tokens = len >= double(seq_len) ? seq_len : std::max<int64_t>(1, std::llround(len));
    offsets.push_back(std::min(seq_len, offsets.back() + tokens));
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
  if (text.rfind("docs-lognormal:", 0) == 0) {
    std::vector<std::string> fields;
    std::stringstream rest(text.substr(15));
    for (std::string field; std::getline(rest, field, ',');) fields.push_back(field);
    double mean = 0, sigma = 2.0;
    int64_t seed = 1;
    const auto parse_real = [](const std::string& f, double* out) {
      char* end = nullptr;
      *out = std::strtod(f.c_str(), &end);
      return !f.empty() && end == f.c_str() + f.size() && std::isfinite(*out);
    };
    const bool ok = !fields.empty() && fields.size() <= 3 && text.back() != ',' && parse_real(fields[0], &mean) &&
                    mean >= 1 && (fields.size() < 2 || (parse_real(fields[1], &sigma) && sigma >= 0 && sigma <= 8)) &&
                    (fields.size() < 3 || (parse_int(fields[2], &seed) && seed >= 0));
    if (!ok)
      return SP_STATUS(StatusCode::kInvalidArgument,
                       "bad mask '" + text + "': expected docs-lognormal:MEAN[,SIGMA[,SEED]] with MEAN >= 1 token, "
                       "0 <= SIGMA <= 8, SEED >= 0");
    return MaskSpec::documents(make_lognormal_document_offsets(seq_len, mean, sigma, uint64_t(seed)));
  }
  for (const bool causal : {false, true}) {
    const std::string bigbird = causal ? "bigbird-causal:" : "bigbird:";
    if (text.rfind(bigbird, 0) == 0) {
      std::vector<std::string> fields;
      std::stringstream rest(text.substr(bigbird.size()));
      for (std::string field; std::getline(rest, field, ',');) fields.push_back(field);
      int64_t w = 0, g = 0, r = 0, block = kDefaultMaskBlock;
      const bool ok =
          (fields.size() == 3 || fields.size() == 4) && parse_int(fields[0], &w) &&
          parse_int(fields[1], &g) && parse_int(fields[2], &r) && w >= 0 && g >= 0 && r >= 0 &&
          (fields.size() == 3 ||
           (fields[3].rfind("B=", 0) == 0 && parse_int(fields[3].substr(2), &block) && block >= 1));
      if (!ok || text.back() == ',') {
        return SP_STATUS(StatusCode::kInvalidArgument,
                         "bad mask '" + text + "': expected " + bigbird +
                             "W,G,R[,B=N] with W, G, R >= 0 and block size N >= 1");
      }
      SP_ASSIGN_OR_RETURN(BlockPattern pattern, bigbird_pattern(seq_len, w, g, r, block, causal));
      return MaskSpec::block_sparse(std::move(pattern), causal);
    }
    const std::string blocks = causal ? "blocks-causal:" : "blocks:";
    if (text.rfind(blocks, 0) == 0) {
      SP_CHECK_ARG(text.size() > blocks.size(),
                   "bad mask '" + text + "': expected " + blocks + "PATH");
      SP_ASSIGN_OR_RETURN(BlockPattern pattern,
                          read_block_pattern(text.substr(blocks.size()), text));
      const MaskSpec mask = MaskSpec::block_sparse(std::move(pattern), causal);
      SP_RETURN_IF_ERROR(mask.validate(seq_len));  // a file made for another length
      return mask;
    }
  }
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown mask '" + text +
                       "' (expected full, causal, window:L,R, docs:N, docs-lognormal:MEAN[,SIGMA[,SEED]], bigbird[-causal]:W,G,R[,B=N] "
                       "or blocks[-causal]:PATH)");
}

}  // namespace seqpar
