// The training checkpoint file (checkpoint_file.hpp).
#include "model/checkpoint_file.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>

namespace seqpar::model {
namespace {
constexpr char kMagic[8] = {'S', 'E', 'Q', 'P', 'A', 'R', 'C', 'K'};
constexpr uint32_t kVersion = 1;
}  // namespace

Status write_checkpoint(const std::string& path, const TrainingState& s) {
  const int64_t count = int64_t(s.params.size());
  SP_CHECK_ARG(int64_t(s.first_moment.size()) == count && int64_t(s.second_moment.size()) == count,
               "internal: a checkpoint's parameters and moments differ in size");
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    SP_CHECK_ARG(out.good(), "cannot write the checkpoint " + tmp);
    const int64_t header[3] = {count, s.steps, s.optimizer_steps};
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(&kVersion), sizeof(kVersion));
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(reinterpret_cast<const char*>(&s.data_position), sizeof(s.data_position));
    for (const std::vector<float>* a : {&s.params, &s.first_moment, &s.second_moment})
      out.write(reinterpret_cast<const char*>(a->data()), std::streamsize(count * sizeof(float)));
    SP_CHECK_ARG(out.good(), "writing the checkpoint " + tmp + " failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  SP_CHECK_ARG(!ec, "cannot move the checkpoint into place at " + path + ": " + ec.message());
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
  SP_CHECK_ARG(in.good() && std::memcmp(magic, kMagic, 8) == 0 && version == kVersion,
               path + " is not a seqpar checkpoint (version " + std::to_string(kVersion) + ")");
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  in.read(reinterpret_cast<char*>(&s.data_position), sizeof(s.data_position));
  SP_CHECK_ARG(header[0] == parameter_count, path + " holds " + std::to_string(header[0]) +
                                                 " parameters; this model has " + std::to_string(parameter_count));
  s.steps = header[1], s.optimizer_steps = header[2];
  for (std::vector<float>* a : {&s.params, &s.first_moment, &s.second_moment}) {
    a->resize(size_t(parameter_count));
    in.read(reinterpret_cast<char*>(a->data()), std::streamsize(parameter_count * sizeof(float)));
  }
  SP_CHECK_ARG(in.good(), path + " is truncated");
  return s;
}

}  // namespace seqpar::model
