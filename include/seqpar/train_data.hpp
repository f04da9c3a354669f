// The training data path: sources of (input, target) pairs of a sequence length, and the shard
// of a batch a rank trains on. Pairs are made before splitting, so the target of a shard's last
// row (the next shard's first token) is never lost, and tokens, targets and positions move
// together into the layout (contiguous, zigzag, striped).
//   recall  the embedded default, a long-range task: one key token (from 8) stands somewhere in
//           the sequence's second quarter among random filler tokens, and the last position
//           holds a query mark whose target is the key. Only that target counts, so the loss
//           starts at ln 8 = 2.08 and can fall only if the query's attention reaches the key,
//           which sits on another rank with the contiguous and zigzag layouts at 2 and 4 ranks.
//   tokens  a flat file of uint16 or uint32 tokens (llm.c's and nanoGPT's .bin data, header-less),
//           read as consecutive windows of seq + 1 tokens, wrapping at the end.
//   text    any file as bytes (vocab 256), windows as for tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "seqpar/layout.hpp"
#include "seqpar/status.hpp"
#include "seqpar/transformer.hpp"

namespace seqpar {

class TrainingData {
 public:
  virtual ~TrainingData() = default;
  // The next sequence's inputs and targets ([seq] each; a negative target is not counted).
  virtual void next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) = 0;
  virtual int64_t vocab() const = 0;  // tokens are below this
  virtual std::string describe() const = 0;
  // Where the source stands, to resume from a checkpoint exactly.
  virtual uint64_t position() const = 0;
  virtual void seek(uint64_t position) = 0;
};

inline constexpr int64_t kRecallVocab = 64;
inline constexpr int32_t kRecallQuery = 0, kRecallKeys = 8;  // keys are tokens 1..8

// name: "recall", "tokens:PATH[:u16|u32]" or "text:PATH".
StatusOr<std::unique_ptr<TrainingData>> make_training_data(const std::string& name, int64_t seq, uint64_t seed);

// Rank `rank`'s rows of the batch's sequences under the layout (rows at layout.positions(rank)).
ShardBatch shard_batch(const Layout& layout, int rank, const std::vector<std::vector<int32_t>>& inputs,
                       const std::vector<std::vector<int32_t>>& targets);

// Packing (seqpar train --pack): a sequence's documents end at each `eod` input token. Returns the
// documents' start offsets followed by the sequence's length (MaskSpec::documents' form) and
// stops counting each EOD's target, the next document's first token, which its document cannot
// predict.
std::vector<int64_t> pack_documents(const std::vector<int32_t>& inputs, std::vector<int32_t>* targets, int32_t eod);
// Gives a shard its sequences' documents (pack_documents' offsets, one list per sequence) and
// RoPE positions: restarting at 0 in every document, or the global positions when
// `global_positions`.
void add_documents(ShardBatch* batch, std::vector<std::vector<int64_t>> documents, bool global_positions);

}  // namespace seqpar
