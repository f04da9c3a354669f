// The training checkpoint file (checkpoint_file.hpp).
#include "model/checkpoint_file.hpp"
#include "model/fault_injection.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace seqpar::model {
namespace {
constexpr char kMagic[8] = {'S', 'E', 'Q', 'P', 'A', 'R', 'C', 'K'};
// 1: no checksum; 2: a checksum of everything before it at the end.
constexpr uint32_t kVersion = 2;

// A 64-bit checksum over 8-byte words (a multiply-rotate mix: fast enough for gigabytes of
// weights, and any torn or flipped byte changes it); a short tail is zero-padded.
class Checksum {
 public:
  void add(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    for (; n && filled_; --n) push(*p++);
    for (; n >= 8; n -= 8, p += 8) {  // whole words (little-endian, as push builds them)
      std::memcpy(&word_, p, 8);
      mix();
    }
    for (; n; --n) push(*p++);
  }
  uint64_t value() {
    if (filled_) mix();
    return h_ ^ (h_ >> 29);
  }

 private:
  void push(char c) {
    word_ |= uint64_t(uint8_t(c)) << (8 * filled_);
    if (++filled_ == 8) mix();
  }
  void mix() {
    h_ ^= word_ * 0x9E3779B97F4A7C15ull;
    h_ = ((h_ << 31) | (h_ >> 33)) * 0xBF58476D1CE4E5B9ull;
    word_ = 0, filled_ = 0;
  }
  uint64_t h_ = 0x5EC9A5C0FFEEull, word_ = 0;
  int filled_ = 0;
};

// Forces a file's (or a folder's) data to the disk, so that after a crash a checkpoint renamed
// into place is whole.
bool sync_to_disk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  return ::close(fd) == 0 && ok;
}

}  // namespace

Status write_checkpoint(const std::string& path, const TrainingState& s) {
  const int64_t count = int64_t(s.params.size());
  SP_CHECK_ARG(int64_t(s.first_moment.size()) == count && int64_t(s.second_moment.size()) == count,
               "internal: a checkpoint's parameters and moments differ in size");
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary);
    SP_CHECK_ARG(out.good(), "cannot write the checkpoint " + tmp);
    Checksum sum;
    const auto put = [&](const void* data, size_t n) {
      out.write(static_cast<const char*>(data), std::streamsize(n));
      sum.add(data, n);
    };
    const int64_t header[3] = {count, s.steps, s.optimizer_steps};
    put(kMagic, 8);
    put(&kVersion, sizeof(kVersion));
    put(header, sizeof(header));
    put(&s.data_position, sizeof(s.data_position));
    for (const std::vector<float>* a : {&s.params, &s.first_moment, &s.second_moment}) {
      put(a->data(), size_t(count) * sizeof(float));
      if (a == &s.params) {
        out.flush();
        fault_point("save", s.steps);  // the fault suite's kill midway through a save
      }
    }
    const uint64_t check = sum.value();
    out.write(reinterpret_cast<const char*>(&check), sizeof(check));
    out.close();  // close's errors too (NFS reports a full quota there)
    if (!out.good() || !sync_to_disk(tmp)) {  // a full disk: the previous checkpoint stays the newest
      std::filesystem::remove(tmp, ec);
      // A runtime failure, not a bad argument: the tool exits with 1.
      return SP_STATUS(StatusCode::kInternal,
                       "writing the checkpoint " + tmp + " failed (disk full?); the previous one is untouched");
    }
  }
  std::filesystem::rename(tmp, path, ec);
  SP_CHECK_ARG(!ec, "cannot move the checkpoint into place at " + path + ": " + ec.message());
  const std::filesystem::path folder = std::filesystem::absolute(path).parent_path();
  (void)sync_to_disk(folder.string());  // the rename itself, where the filesystem allows it
  return Status::Ok();
}

StatusOr<TrainingState> read_checkpoint(const std::string& path, int64_t parameter_count) {
  std::ifstream in(path, std::ios::binary);
  SP_CHECK_ARG(in.good(), "cannot read the checkpoint " + path);
  char magic[8];
  uint32_t version = 0;
  int64_t header[3] = {0, 0, 0};
  TrainingState s;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&version), sizeof(version));
  SP_CHECK_ARG(in.good() && std::memcmp(magic, kMagic, 8) == 0 && (version == 1 || version == kVersion),
               path + " is not a seqpar checkpoint (version 1 or " + std::to_string(kVersion) + ")");
  Checksum sum;
  sum.add(magic, 8), sum.add(&version, sizeof(version));
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  in.read(reinterpret_cast<char*>(&s.data_position), sizeof(s.data_position));
  sum.add(header, sizeof(header)), sum.add(&s.data_position, sizeof(s.data_position));
  SP_CHECK_ARG(header[0] == parameter_count, path + " holds " + std::to_string(header[0]) +
                                                 " parameters; this model has " + std::to_string(parameter_count));
  s.steps = header[1], s.optimizer_steps = header[2];
  for (std::vector<float>* a : {&s.params, &s.first_moment, &s.second_moment}) {
    a->resize(size_t(parameter_count));
    in.read(reinterpret_cast<char*>(a->data()), std::streamsize(parameter_count * sizeof(float)));
    sum.add(a->data(), size_t(parameter_count) * sizeof(float));
  }
  SP_CHECK_ARG(in.good(), path + " is truncated");
  if (version >= 2) {
    uint64_t check = 0;
    in.read(reinterpret_cast<char*>(&check), sizeof(check));
    SP_CHECK_ARG(in.good(), path + " is truncated");
    SP_CHECK_ARG(check == sum.value(), path + " is corrupt (its checksum does not match)");
  }
  SP_CHECK_ARG(in.peek() == std::char_traits<char>::eof(), path + " has bytes beyond its end: not a whole checkpoint");
  return s;
}

}  // namespace seqpar::model
