// Block-sparse mask patterns: construction from rows, BigBird from a fixed seed, and the
// pattern file format (include/seqpar/mask.hpp).
#include <algorithm>
#include <fstream>
#include <sstream>

#include "seqpar/mask.hpp"

namespace seqpar {

StatusOr<BlockPattern> BlockPattern::from_rows(int64_t block_size,
                                               const std::vector<std::vector<int64_t>>& rows,
                                               std::string name) {
  SP_CHECK_ARG(block_size >= 1,
               "block pattern block size must be >= 1, got " + std::to_string(block_size));
  SP_CHECK_ARG(!rows.empty(), "block pattern needs at least one block");
  const int64_t n = static_cast<int64_t>(rows.size());
  BlockPattern p;
  p.block_size_ = block_size;
  p.name_ = std::move(name);
  p.row_begin_.reserve(n + 1);
  for (int64_t qb = 0; qb < n; ++qb) {
    std::vector<int64_t> row = rows[qb];
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    SP_CHECK_ARG(row.empty() || (row.front() >= 0 && row.back() < n),
                 "block pattern row " + std::to_string(qb) + " names key block " +
                     std::to_string(row.front() < 0 ? row.front() : row.back()) +
                     " outside the grid of " + std::to_string(n) + " blocks");
    p.cols_.insert(p.cols_.end(), row.begin(), row.end());
    p.row_begin_.push_back(static_cast<int64_t>(p.cols_.size()));
  }
  return p;
}

std::span<const int64_t> BlockPattern::row(int64_t qb) const {
  if (qb < 0 || qb >= blocks()) return {};
  return {cols_.data() + row_begin_[qb], cols_.data() + row_begin_[qb + 1]};
}

bool BlockPattern::allows_blocks(int64_t qb, int64_t kb) const {
  if (kb < 0) return false;
  const std::span<const int64_t> r = row(qb);
  return std::binary_search(r.begin(), r.end(), kb);
}

namespace {

// splitmix64: a fixed, portable stream (std distributions differ between libraries).
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t kBigBirdSeed = 0x5eed'b16b'12d0'0001ull;

}  // namespace

StatusOr<BlockPattern> bigbird_pattern(int64_t seq_len, int64_t window, int64_t global,
                                       int64_t random, int64_t block_size, bool causal) {
  SP_CHECK_ARG(seq_len >= 1 && block_size >= 1 && window >= 0 && global >= 0 && random >= 0,
               "BigBird needs seq_len, block size >= 1 and window, global, random >= 0");
  const int64_t n = (seq_len + block_size - 1) / block_size;
  std::vector<std::vector<int64_t>> rows(n);
  for (int64_t qb = 0; qb < n; ++qb) {
    const int64_t last = causal ? qb : n - 1;  // the last key block this row may hold
    std::vector<int64_t>& row = rows[qb];
    if (qb < global) {  // a global query block sees every key block
      for (int64_t kb = 0; kb <= last; ++kb) row.push_back(kb);
      continue;
    }
    // The fixed part: global columns and the window, sorted and distinct.
    for (int64_t kb = 0; kb < std::min(global, last + 1); ++kb) row.push_back(kb);
    for (int64_t kb = std::max(global, qb - window); kb <= std::min(last, qb + window); ++kb)
      row.push_back(kb);
    const int64_t fixed = static_cast<int64_t>(row.size());
    const int64_t free = last + 1 - fixed, picks = std::min(random, free);
    uint64_t state = kBigBirdSeed ^ (static_cast<uint64_t>(qb) * 0xD1B54A32D192ED03ull);
    auto taken = [&](int64_t kb) {
      return std::binary_search(row.begin(), row.begin() + fixed, kb) ||
             std::find(row.begin() + fixed, row.end(), kb) != row.end();
    };
    if (free <= 4 * picks) {  // few blocks left: the first picks of a partial Fisher-Yates
      std::vector<int64_t> candidates;
      for (int64_t kb = 0; kb <= last; ++kb)
        if (!std::binary_search(row.begin(), row.end(), kb)) candidates.push_back(kb);
      for (int64_t i = 0; i < picks; ++i) {
        const int64_t j = i + static_cast<int64_t>(next_random(state) % (free - i));
        std::swap(candidates[i], candidates[j]);
        row.push_back(candidates[i]);
      }
    } else {  // many left: draw until `picks` new ones, O(picks) expected draws
      while (static_cast<int64_t>(row.size()) < fixed + picks) {
        const int64_t kb = static_cast<int64_t>(next_random(state) % (last + 1));
        if (!taken(kb)) row.push_back(kb);
      }
    }
  }
  const std::string name = std::string(causal ? "bigbird-causal:" : "bigbird:") +
                           std::to_string(window) + "," + std::to_string(global) + "," +
                           std::to_string(random) + ",B=" + std::to_string(block_size);
  return BlockPattern::from_rows(block_size, rows, name);
}

StatusOr<BlockPattern> read_block_pattern(const std::string& path, std::string name) {
  std::ifstream in(path);
  SP_CHECK_ARG(in.good(), "cannot read block pattern file '" + path + "'");
  auto at = [&](int64_t line) { return path + ":" + std::to_string(line) + ": "; };
  int64_t block_size = 0, width = -1, first_row_line = 0, line_no = 0;
  std::vector<std::vector<int64_t>> rows;
  std::string line;
  while (std::getline(in, line)) {
    ++line_no;
    line = line.substr(0, line.find('#'));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (block_size == 0) {  // the header
      std::istringstream words(line);
      std::string key, extra;
      int64_t value = 0;
      SP_CHECK_ARG(
          (words >> key >> value) && key == "block_size" && value >= 1 && !(words >> extra),
          at(line_no) + "expected the header 'block_size N' with N >= 1, got '" + line + "'");
      block_size = value;
      continue;
    }
    std::vector<int64_t> row;
    int64_t entries = 0;
    for (const char c : line) {
      if (c == ' ' || c == '\t' || c == '\r') continue;
      SP_CHECK_ARG(c == '0' || c == '1', at(line_no) + "unexpected '" + std::string(1, c) +
                                             "' in a row (rows hold 0 and 1 only)");
      if (c == '1') row.push_back(entries);
      ++entries;
    }
    if (width < 0) {
      width = entries;
      first_row_line = line_no;
    }
    SP_CHECK_ARG(entries == width, at(line_no) + "row of " + std::to_string(entries) +
                                       " entries, but the first row (line " +
                                       std::to_string(first_row_line) + ") has " +
                                       std::to_string(width));
    rows.push_back(std::move(row));
  }
  SP_CHECK_ARG(block_size > 0, path + ": no 'block_size N' header (empty file, or only comments)");
  SP_CHECK_ARG(!rows.empty(), at(line_no) + "no rows after the header");
  SP_CHECK_ARG(static_cast<int64_t>(rows.size()) == width,
               at(line_no) + std::to_string(rows.size()) + " rows of " + std::to_string(width) +
                   " entries: the grid must be square (one row per query block, one entry per "
                   "key block)");
  return BlockPattern::from_rows(block_size, rows, name.empty() ? "blocks:" + path : name);
}

}  // namespace seqpar
