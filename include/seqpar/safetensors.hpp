// Safetensors files (Hugging Face's format: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the bytes), so trained weights load in
// `transformers` (Llama naming, model.hpp's parameter table) and its weights load here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "seqpar/model.hpp"

namespace seqpar {

struct NamedArray {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "I32", "F64"
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

Status save_safetensors(const std::string& path, const std::vector<NamedArray>& arrays,
                        const std::map<std::string, std::string>& metadata = {});
StatusOr<std::vector<NamedArray>> load_safetensors(const std::string& path);

// The model's parameters (flat, parameter_table's order) as F32 tensors in Llama naming, and back
// (F32, F16 or BF16 tensors; every parameter must be there with its shape; a tied model takes
// the embedding and ignores lm_head.weight).
Status save_model_safetensors(const std::string& path, const ModelConfig& config, const float* params);
StatusOr<std::vector<float>> load_model_safetensors(const std::string& path, const ModelConfig& config);
// Hugging Face's config.json for LlamaForCausalLM with this shape.
Status write_hf_config(const std::string& path, const ModelConfig& config);

}  // namespace seqpar
