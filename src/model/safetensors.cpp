// Safetensors reading and writing (include/seqpar/safetensors.hpp), with nlohmann-json for the
// header. Little-endian hosts only (x86-64, AArch64), as the format's bytes are little-endian.
#include "seqpar/safetensors.hpp"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "seqpar/dtype.hpp"

namespace seqpar {
namespace {

size_t element_size(const std::string& dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

}  // namespace

Status save_safetensors(const std::string& path, const std::vector<NamedArray>& arrays,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t at = 0;
  for (const NamedArray& a : arrays) {
    int64_t n = 1;
    for (int64_t d : a.shape) n *= d;
    SP_CHECK_ARG(element_size(a.dtype) > 0 && size_t(n) * element_size(a.dtype) == a.bytes.size(),
                 "safetensors: " + a.name + " has " + std::to_string(a.bytes.size()) + " bytes for its " + a.dtype +
                     " shape");
    header[a.name] = {{"dtype", a.dtype}, {"shape", a.shape}, {"data_offsets", {at, at + a.bytes.size()}}};
    at += a.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary);
  SP_CHECK_ARG(out.good(), "cannot write " + path);
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const NamedArray& a : arrays) out.write(a.bytes.data(), std::streamsize(a.bytes.size()));
  SP_CHECK_ARG(out.good(), "writing " + path + " failed");
  return Status::Ok();
}

StatusOr<std::vector<NamedArray>> load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SP_CHECK_ARG(in.good(), "cannot read " + path);
  uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  SP_CHECK_ARG(in.good() && length > 0 && length < (1ull << 30), path + " is not a safetensors file");
  std::string text(length, '\0');
  in.read(text.data(), std::streamsize(length));
  nlohmann::ordered_json header;  // tensors in the header's order
  try {
    header = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    return SP_STATUS(StatusCode::kInvalidArgument, path + ": bad safetensors header: " + e.what());
  }
  const std::streamoff data_start = std::streamoff(8 + length);
  std::vector<NamedArray> arrays;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    NamedArray a;
    try {
      a.name = it.key();
      a.dtype = it.value().at("dtype").get<std::string>();
      a.shape = it.value().at("shape").get<std::vector<int64_t>>();
      const auto range = it.value().at("data_offsets").get<std::vector<uint64_t>>();
      SP_CHECK_ARG(range.size() == 2 && range[1] >= range[0], path + ": " + a.name + " has a bad byte range");
      a.bytes.resize(range[1] - range[0]);
      in.seekg(data_start + std::streamoff(range[0]));
      in.read(a.bytes.data(), std::streamsize(a.bytes.size()));
    } catch (const std::exception& e) {
      return SP_STATUS(StatusCode::kInvalidArgument, path + ": " + it.key() + ": " + e.what());
    }
    SP_CHECK_ARG(in.good(), path + " is truncated at " + a.name);
    arrays.push_back(std::move(a));
  }
  return arrays;
}

Status save_model_safetensors(const std::string& path, const ModelConfig& config, const float* params) {
  std::vector<NamedArray> arrays;
  for (const ParamInfo& p : parameter_table(config)) {
    NamedArray a{p.name, "F32", p.shape, std::vector<char>(size_t(p.numel) * 4)};
    std::memcpy(a.bytes.data(), params + p.offset, a.bytes.size());
    arrays.push_back(std::move(a));
  }
  return save_safetensors(path, arrays, {{"format", "pt"}, {"written_by", "seqpar"}});
}

StatusOr<std::vector<float>> load_model_safetensors(const std::string& path, const ModelConfig& config) {
  SP_ASSIGN_OR_RETURN(const std::vector<NamedArray> arrays, load_safetensors(path));
  std::map<std::string, const NamedArray*> by_name;
  for (const NamedArray& a : arrays) by_name[a.name] = &a;
  std::vector<float> params(size_t(parameter_count(config)));
  for (const ParamInfo& p : parameter_table(config)) {
    const auto it = by_name.find(p.name);
    SP_CHECK_ARG(it != by_name.end(), path + " has no " + p.name);
    const NamedArray& a = *it->second;
    SP_CHECK_ARG(a.shape == p.shape, path + ": " + p.name + " has another shape than the model's " + config.describe());
    const DType from = a.dtype == "F32" ? DType::kF32 : a.dtype == "F16" ? DType::kF16 : DType::kBF16;
    SP_CHECK_ARG(a.dtype == "F32" || a.dtype == "F16" || a.dtype == "BF16",
                 path + ": " + p.name + " is " + a.dtype + " (F32, F16 or BF16 are read)");
    convert(a.bytes.data(), from, params.data() + p.offset, DType::kF32, p.numel);
  }
  return params;
}

Status write_hf_config(const std::string& path, const ModelConfig& c) {
  // Linear-attention layers have no transformers architecture to name; the file still reads
  // back here (load_model_config) with its layer_types.
  const bool llama = !c.has_linear_layers();
  nlohmann::ordered_json j = {{"architectures", {llama ? "LlamaForCausalLM" : "SeqparHybridForCausalLM"}},
                                    {"model_type", "llama"},
                                    {"vocab_size", c.vocab},
                                    {"hidden_size", c.hidden},
                                    {"intermediate_size", c.ffn},
                                    {"num_hidden_layers", c.layers},
                                    {"num_attention_heads", c.heads},
                                    {"num_key_value_heads", c.kv_heads},
                                    {"head_dim", c.head_dim()},
                                    {"hidden_act", "silu"},
                                    {"rms_norm_eps", c.norm_eps},
                                    {"rope_theta", c.rope_theta},
                                    {"tie_word_embeddings", c.tied},
                                    {"attention_bias", false},
                                    {"mlp_bias", false},
                                    {"max_position_embeddings", 1 << 21},
                                    {"torch_dtype", "float32"}};
  if (!llama) {
    j["model_type"] = "seqpar_hybrid";
    std::vector<std::string> types;
    for (int64_t l = 0; l < c.layers; ++l)
      types.push_back(c.mixer(l) == MixerKind::kLinear ? "linear_attention" : "full_attention");
    j["layer_types"] = types;
    j["linear_silu_gate"] = c.linear_silu_gate;
  }
  std::ofstream out(path);
  SP_CHECK_ARG(out.good(), "cannot write " + path);
  out << j.dump(2) << "\n";
  SP_CHECK_ARG(out.good(), "writing " + path + " failed");
  return Status::Ok();
}

}  // namespace seqpar
