// How the layouts cut positions into chunks and pieces (the contiguous and zigzag layouts, and
// the documents layout's per-document zigzag), and the documents layout's shards
// (LayoutKind::kDocuments: every rank about the same visible work of packed documents, causal
// inside each; document_layout.cpp says how and why).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace seqpar::parallel {

// Start of chunk c when `len` tokens are cut into `n` chunks, earlier chunks one longer (with
// len < n the first len chunks hold one token, the rest none).
inline int64_t chunk_start(int64_t len, int64_t n, int64_t c) {
  return c * (len / n) + std::min<int64_t>(c, len % n);
}

// Appends piece `part` of `parts` of the zigzag over positions [begin, begin + len): chunks part
// and 2 * parts - 1 - part of 2 * parts. Every piece carries the same causal work (to a chunk's
// rounding); piece `part` is empty only when len <= part.
void append_zigzag_piece(int64_t begin, int64_t len, int64_t parts, int64_t part, std::vector<int64_t>* out);

// Per-rank global positions, each rank's sorted, together every position of [0, seq_len) once,
// none empty. `doc_offsets`: cu_seqlens-style starts and the end (already validated: start at
// 0, never decrease, end at or past seq_len); empty is one document. Needs seq_len >= ranks.
std::vector<std::vector<int64_t>> document_balanced_positions(int64_t seq_len, int ranks,
                                                              const std::vector<int64_t>& doc_offsets);

}  // namespace seqpar::parallel
