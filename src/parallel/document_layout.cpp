// The documents layout (LayoutKind::kDocuments): shards that give every rank about the same
// visible work when a sequence packs documents, causal inside each. Token-balanced layouts do not:
// a document's work is its causal triangle, L (L + 1) / 2 pairs, so the rank holding one long
// document's end (contiguous) or most of one long document (zigzag of the whole sequence) does
// most of the work; striped balances the work but scatters every document over every rank, so
// every shard pair is visible and nothing is skipped.
//
// How. Each document is either dealt whole to one rank or cut into m pieces by a zigzag of its
// own (2m chunks; piece i holds chunks i and 2m-1-i), whose pieces carry equal work. Whole
// documents and pieces go, largest first, each to the rank where the larger of its work and its
// tokens (each over its mean) stays the smallest: list scheduling in two dimensions, so that
// long documents' pieces (much work per token) and short documents (little) mix and memory stays
// balanced too. Which documents to cut: the coarsest cut that meets the targets. With T the mean
// rank's work, every document above beta T is cut into ceil(work / (beta T)) pieces (at most P,
// at most its length), beta halving from 1 until the busiest rank carries at most 1.05 T and
// 1.25x the mean tokens, or every document is cut as far as it goes; the best assignment seen is
// kept. Cutting little matters for traffic: a rank's K/V (and results) travel only to ranks
// whose queries see them (MaskSpec::sees_any), so ranks that share no document exchange nothing,
// and a document cut into m pieces ties m ranks together, not P.
//
// Why not a solver: greedy scheduling on these items lands within 5% of the mean work (the
// balance test measures it on lognormal documents up to 1M tokens) in O(items x P); a solver
// would gain a few percent and cost time on every new set of documents (packed training has
// new ones every step).
//
// What it does not promise: few position runs. A whole document is one run, a piece two, so a
// rank holds many runs; the schedules and the CPU kernels take any positions, our CUDA kernels
// make one call per pair of runs, the Hopper kernels take one run (and no documents) and refuse.
#include "parallel/document_layout.hpp"

#include <array>
#include <cmath>
#include <tuple>
#include <utility>

namespace seqpar::parallel {

namespace {

// The two chunks [begin, end) of a piece, offsets inside its document.
std::array<std::pair<int64_t, int64_t>, 2> piece_chunks(int64_t len, int64_t parts, int64_t part) {
  const int64_t n = 2 * parts, last = n - 1 - part;
  return {{{chunk_start(len, n, part), chunk_start(len, n, part + 1)},
           {chunk_start(len, n, last), chunk_start(len, n, last + 1)}}};
}

// The targets: the busiest rank's work and tokens at most this much above their means.
constexpr double kWorkTolerance = 0.05, kTokenTolerance = 0.25;

struct Document {
  int64_t begin = 0, len = 0;
  int64_t work = 0;  // its causal triangle
  int64_t max_parts = 1;
};

// One piece (or a whole document: parts == 1) to place.
struct Item {
  int64_t work = 0, tokens = 0;
  size_t doc = 0;
  int64_t part = 0, parts = 1;
};

// Causal work of positions [a, b) of a document: a query at offset t sees t + 1 keys.
int64_t causal_work(int64_t a, int64_t b) { return (b * (b + 1) - a * (a + 1)) / 2; }

struct Assignment {
  std::vector<int> rank_of;  // per item
  double busiest_work = 0, busiest_tokens = 0;  // over their means
  // At most 1 when both targets are met; lower is better.
  double score() const {
    return std::max(busiest_work / (1 + kWorkTolerance), busiest_tokens / (1 + kTokenTolerance));
  }
};

// Two-dimensional list scheduling: items (in items_of's order) each onto the rank where the
// larger of its work and token loads, each over its mean, stays the smallest (then their sum,
// then the lower rank). O(items x ranks).
Assignment deal(const std::vector<Item>& items, int ranks, double mean_work, double mean_tokens) {
  std::vector<double> work(ranks, 0.0), tokens(ranks, 0.0);  // over the means
  Assignment a;
  for (const Item& item : items) {
    const double w = double(item.work) / mean_work, t = double(item.tokens) / mean_tokens;
    int pick = 0;
    double pick_max = 0, pick_sum = 0;
    for (int r = 0; r < ranks; ++r) {
      const double m = std::max(work[r] + w, tokens[r] + t), sum = work[r] + w + tokens[r] + t;
      if (r == 0 || m < pick_max || (m == pick_max && sum < pick_sum)) pick = r, pick_max = m, pick_sum = sum;
    }
    work[size_t(pick)] += w, tokens[size_t(pick)] += t;
    a.rank_of.push_back(pick);
  }
  a.busiest_work = *std::max_element(work.begin(), work.end());
  a.busiest_tokens = *std::max_element(tokens.begin(), tokens.end());
  return a;
}

// The items of documents cut into `parts`, largest first: by the larger of work and tokens,
// each over its mean (ties by document and piece, so the order is fixed).
std::vector<Item> items_of(const std::vector<Document>& docs, const std::vector<int64_t>& parts, double mean_work,
                           double mean_tokens) {
  std::vector<Item> items;
  for (size_t d = 0; d < docs.size(); ++d)
    for (int64_t p = 0; p < parts[d]; ++p) {
      Item item{0, 0, d, p, parts[d]};
      for (const auto& [a, b] : piece_chunks(docs[d].len, parts[d], p))
        item.work += causal_work(a, b), item.tokens += b - a;
      items.push_back(item);
    }
  const auto size = [&](const Item& x) { return std::max(double(x.work) / mean_work, double(x.tokens) / mean_tokens); };
  std::sort(items.begin(), items.end(), [&](const Item& x, const Item& y) {
    const double sx = size(x), sy = size(y);
    return sx != sy ? sx > sy : std::tie(x.doc, x.part) < std::tie(y.doc, y.part);
  });
  return items;
}

}  // namespace

void append_zigzag_piece(int64_t begin, int64_t len, int64_t parts, int64_t part, std::vector<int64_t>* out) {
  for (const auto& [a, b] : piece_chunks(len, parts, part))
    for (int64_t t = a; t < b; ++t) out->push_back(begin + t);
}

std::vector<std::vector<int64_t>> document_balanced_positions(int64_t seq_len, int ranks,
                                                              const std::vector<int64_t>& doc_offsets) {
  std::vector<Document> docs;
  const std::vector<int64_t> one{0, seq_len};
  const std::vector<int64_t>& offsets = doc_offsets.empty() ? one : doc_offsets;
  int64_t total = 0;
  for (size_t d = 0; d + 1 < offsets.size() && offsets[d] < seq_len; ++d) {
    const int64_t len = std::min(offsets[d + 1], seq_len) - offsets[d];
    if (len == 0) continue;
    docs.push_back({offsets[d], len, causal_work(0, len), std::min<int64_t>(ranks, len)});
    total += docs.back().work;
  }
  const double mean = double(total) / ranks, mean_tokens = double(seq_len) / ranks;

  std::vector<int64_t> parts(docs.size(), 1);
  std::vector<Item> best_items;
  Assignment best;
  for (double beta = 1;; beta /= 2) {
    bool cut_through = true;  // every document cut as far as it goes
    int64_t count = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      const double want = std::ceil(double(docs[d].work) / (beta * mean));
      parts[d] = std::clamp<int64_t>(int64_t(std::min(want, double(ranks))), 1, docs[d].max_parts);
      cut_through = cut_through && parts[d] == docs[d].max_parts;
      count += parts[d];
    }
    // Every rank needs a row: cut the document of the largest pieces further until there are
    // as many items as ranks (there are enough: seq_len >= ranks).
    while (count < ranks) {
      size_t widest = docs.size();
      for (size_t d = 0; d < docs.size(); ++d)
        if (parts[d] < docs[d].max_parts &&
            (widest == docs.size() || docs[d].work * parts[widest] > docs[widest].work * parts[d]))
          widest = d;
      ++parts[widest], ++count;
    }
    std::vector<Item> items = items_of(docs, parts, mean, mean_tokens);
    Assignment a = deal(items, ranks, mean, mean_tokens);
    if (best_items.empty() || a.score() < best.score()) best = std::move(a), best_items = std::move(items);
    if (best.score() <= 1 || cut_through || beta * mean < 1) break;
  }

  std::vector<std::vector<int64_t>> positions(ranks);
  for (size_t i = 0; i < best_items.size(); ++i) {
    const Item& item = best_items[i];
    append_zigzag_piece(docs[item.doc].begin, docs[item.doc].len, item.parts, item.part, &positions[best.rank_of[i]]);
  }
  for (std::vector<int64_t>& p : positions) std::sort(p.begin(), p.end());
  return positions;
}

}  // namespace seqpar::parallel
