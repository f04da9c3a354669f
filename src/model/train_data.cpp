// Training data sources and sharding (include/seqpar/train_data.hpp).
#include <filesystem>
#include <fstream>
#include <random>
#include <algorithm>
#include <cstring>

#include "seqpar/train_data.hpp"

namespace seqpar {
namespace {

// The recall task from a counter-based generator: sequence i depends on (seed, i) alone, so a
// resumed run at position i draws exactly what the uninterrupted one drew.
class RecallTask final : public TrainingData {
 public:
  RecallTask(int64_t seq, uint64_t seed) : seq_(seq), seed_(seed) {}
  void next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) override {
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + index_++);
    std::uniform_int_distribution<int32_t> filler(kRecallKeys + 1, int32_t(kRecallVocab) - 1);
    std::uniform_int_distribution<int32_t> key(1, kRecallKeys);
    inputs->assign(size_t(seq_), 0);
    targets->assign(size_t(seq_), -1);
    for (auto& t : *inputs) t = filler(rng);
    const int32_t k = key(rng);
    std::uniform_int_distribution<int64_t> where(seq_ / 4, std::max(seq_ / 4, seq_ / 2 - 1));
    (*inputs)[size_t(where(rng))] = k;
    inputs->back() = kRecallQuery;
    targets->back() = k;
  }
  int64_t vocab() const override { return kRecallVocab; }
  std::string describe() const override {
    return "recall (one of " + std::to_string(kRecallKeys) + " keys in the second quarter, queried at the end)";
  }
  uint64_t position() const override { return index_; }
  void seek(uint64_t position) override { index_ = position; }

 private:
  int64_t seq_;
  uint64_t seed_, index_ = 0;
};

// Windows of seq + 1 tokens from a token array, consecutive, wrapping at the end.
class TokenWindows final : public TrainingData {
 public:
  TokenWindows(std::vector<int32_t> tokens, int64_t vocab, int64_t seq, std::string what)
      : tokens_(std::move(tokens)), vocab_(vocab), seq_(seq), what_(std::move(what)) {}
  void next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) override {
    inputs->resize(size_t(seq_)), targets->resize(size_t(seq_));
    const uint64_t n = tokens_.size();
    for (int64_t i = 0; i < seq_; ++i) {
      (*inputs)[size_t(i)] = tokens_[(cursor_ + uint64_t(i)) % n];
      (*targets)[size_t(i)] = tokens_[(cursor_ + uint64_t(i) + 1) % n];
    }
    cursor_ = (cursor_ + uint64_t(seq_)) % n;
  }
  int64_t vocab() const override { return vocab_; }
  std::string describe() const override { return what_; }
  uint64_t position() const override { return cursor_; }
  void seek(uint64_t position) override { cursor_ = position % tokens_.size(); }

 private:
  std::vector<int32_t> tokens_;
  int64_t vocab_, seq_;
  std::string what_;
  uint64_t cursor_ = 0;
};

StatusOr<std::vector<char>> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SP_CHECK_ARG(in.good(), "cannot read " + path);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

StatusOr<std::unique_ptr<TrainingData>> make_training_data(const std::string& name, int64_t seq, uint64_t seed) {
  SP_CHECK_ARG(seq >= 2, "the sequence length must be at least 2");
  if (name == "recall") {
    SP_CHECK_ARG(seq >= 8, "the recall task needs sequences of at least 8 tokens");
    return std::unique_ptr<TrainingData>(new RecallTask(seq, seed));
  }
  if (name.rfind("text:", 0) == 0) {
    const std::string path = name.substr(5);
    SP_ASSIGN_OR_RETURN(const std::vector<char> bytes, read_file(path));
    SP_CHECK_ARG(int64_t(bytes.size()) > seq, path + " has " + std::to_string(bytes.size()) +
                                                  " bytes: fewer than one sequence of " + std::to_string(seq + 1));
    std::vector<int32_t> tokens(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) tokens[i] = int32_t(static_cast<unsigned char>(bytes[i]));
    return std::unique_ptr<TrainingData>(new TokenWindows(std::move(tokens), 256, seq, "text " + path + " (bytes)"));
  }
  if (name.rfind("tokens:", 0) == 0) {
    std::string path = name.substr(7), width = "u16";
    if (const size_t colon = path.rfind(':'); colon != std::string::npos &&
                                              (path.substr(colon + 1) == "u16" || path.substr(colon + 1) == "u32")) {
      width = path.substr(colon + 1);
      path = path.substr(0, colon);
    }
    SP_ASSIGN_OR_RETURN(const std::vector<char> bytes, read_file(path));
    const size_t w = width == "u16" ? 2 : 4;
    SP_CHECK_ARG(bytes.size() % w == 0, path + " has " + std::to_string(bytes.size()) + " bytes, not a whole number of " +
                                            width + " tokens");
    std::vector<int32_t> tokens(bytes.size() / w);
    int64_t vocab = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      uint32_t t = 0;
      std::memcpy(&t, bytes.data() + i * w, w);  // little-endian, as llm.c writes them
      SP_CHECK_ARG(t < (1u << 31), path + ": token " + std::to_string(t) + " at " + std::to_string(i) + " is too large");
      tokens[i] = int32_t(t);
      vocab = std::max<int64_t>(vocab, int64_t(t) + 1);
    }
    SP_CHECK_ARG(int64_t(tokens.size()) > seq, path + " has " + std::to_string(tokens.size()) +
                                                   " tokens: fewer than one sequence of " + std::to_string(seq + 1));
    return std::unique_ptr<TrainingData>(
        new TokenWindows(std::move(tokens), vocab, seq, "tokens " + path + " (" + width + ")"));
  }
  return SP_STATUS(StatusCode::kInvalidArgument,
                   "unknown data '" + name + "' (available: recall, tokens:PATH[:u16|u32], text:PATH)");
}

std::vector<int64_t> pack_documents(const std::vector<int32_t>& inputs, std::vector<int32_t>* targets, int32_t eod) {
  std::vector<int64_t> offsets{0};
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] != eod) continue;
    (*targets)[i] = -1;
    if (i + 1 < inputs.size()) offsets.push_back(int64_t(i + 1));
  }
  offsets.push_back(int64_t(inputs.size()));
  return offsets;
}

void add_documents(ShardBatch* b, std::vector<std::vector<int64_t>> documents, bool global_positions) {
  b->rope_positions.clear();
  if (!global_positions) {
    for (const std::vector<int64_t>& offsets : documents)
      for (int64_t p : b->positions) {  // the start of p's document: the last offset at or below p
        const auto start = std::upper_bound(offsets.begin(), offsets.end(), p) - 1;
        b->rope_positions.push_back(p - *start);
      }
  }
  b->documents = std::move(documents);
}

ShardBatch shard_batch(const Layout& layout, int rank, const std::vector<std::vector<int32_t>>& inputs,
                       const std::vector<std::vector<int32_t>>& targets) {
  ShardBatch b;
  b.batch = int64_t(inputs.size());
  b.positions = layout.positions(rank);
  b.seq = int64_t(b.positions.size());
  for (size_t s = 0; s < inputs.size(); ++s)
    for (int64_t p : b.positions) {
      b.inputs.push_back(inputs[s][size_t(p)]);
      b.targets.push_back(targets[s][size_t(p)]);
    }
  return b;
}

}  // namespace seqpar
