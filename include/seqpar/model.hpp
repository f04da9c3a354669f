// The LLaMA-style model the training engine trains: its shape (ModelConfig, presets and JSON
// config files), and its parameters as one flat buffer of named tensors in Hugging Face's Llama
// naming (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...), so the
// optimizer, the gradient reduction and ZeRO see one array and safetensors export is a table walk.
//   per layer: x += o_proj(attention(rope(q_proj(n1(x))), rope(k_proj(n1(x))), v_proj(n1(x))))
//              x += down_proj(silu(gate_proj(n2(x))) * up_proj(n2(x)))
//   then norm, and the LM head (tied to the embedding, or its own lm_head.weight).
// A layer's token mixer is that softmax attention, or TransNormerLLM's linear attention
// (model/linear_attention_layer.hpp: linear_attn.{q,k,v,g,o}_proj, heads x head_dim wide, no
// RoPE, per-head decay), run by LASP over the sequence's ranks: `mixers` says which, layer by
// layer (Hugging Face's `layer_types`, "full_attention" / "linear_attention").
// Linear weights are [out, in] as in PyTorch (y = x W^T). RoPE is Hugging Face's rotate-half
// form over global positions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/status.hpp"

namespace seqpar {

// A layer's token mixer.
enum class MixerKind : uint8_t {
  kSoftmax,  // self_attn: causal softmax attention through the schedules
  kLinear,   // linear_attn: TNL's linear attention with decay through LASP
};

struct ModelConfig {
  int64_t vocab = 64;
  int64_t hidden = 64;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t ffn = 128;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tied = true;  // the LM head is the embedding
  std::vector<MixerKind> mixers;  // one per layer; empty: every layer softmax
  bool linear_silu_gate = false;  // linear layers' output gate: identity (TNL) or SiLU

  int64_t head_dim() const { return hidden / heads; }
  MixerKind mixer(int64_t layer) const { return mixers.empty() ? MixerKind::kSoftmax : mixers[size_t(layer)]; }
  bool has_linear_layers() const;
  bool has_softmax_layers() const;
  // A linear layer's per-head decays: TNL's lambda_h = exp(-s_h (1 - l / (L - 1) + 1e-5)), with
  // ALiBi's slopes s_h = 2^(-8 (h + 1) / H) (H a power of two; the interleaved form otherwise).
  // Heads divide hidden, K/V heads divide heads, an even head dim (RoPE pairs), all positive.
  Status validate() const;
  std::string describe() const;
  std::vector<double> linear_decays(int64_t layer) const;
};

// tiny (tests and the default run), 125m, 1b (Llama-3.2-1B's shape: 16 layers, hidden 2048,
// 32 heads, 8 K/V heads, FFN 8192, vocab 128256, tied), 8b (Llama-3-8B's); linear attention:
// tnl-tiny (tiny with every layer linear), tnl-1b (16 linear layers, hidden 2048, 16 heads of
// 128, FFN 5632, vocab 64000, tied: 1.02B), and the hybrids hybrid-tiny and hybrid-1b (every
// fourth layer softmax, the rest linear).
StatusOr<ModelConfig> model_preset(const std::string& name);
std::string model_preset_names();
// A JSON file with any of the fields above (Hugging Face's names are accepted too:
// hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// intermediate_size, vocab_size, rope_theta, rms_norm_eps, tie_word_embeddings), and
// layer_types (a list of "full_attention" / "linear_attention", one per layer) with
// linear_silu_gate.
StatusOr<ModelConfig> load_model_config(const std::string& path);

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // elements into the flat buffer
  int64_t numel = 0;
  bool decays = false;  // AdamW's weight decay applies (matrices; not norms)
};
std::vector<ParamInfo> parameter_table(const ModelConfig& config);
int64_t parameter_count(const ModelConfig& config);

// Where each tensor starts in the flat buffer, by name (parameter_table's order): what the
// model's passes find weights and gradients with.
// mix_gate: a linear layer's output gate (linear_attn.g_proj); -1 in softmax layers.
struct LayerOffsets {
  int64_t norm1 = 0, q = 0, k = 0, v = 0, mix_gate = -1, o = 0, norm2 = 0, gate = 0, up = 0, down = 0;
};
struct ParameterOffsets {
  int64_t embed = 0, final_norm = 0;
  int64_t head = 0;  // the embedding's when tied
  std::vector<LayerOffsets> layers;
};
ParameterOffsets parameter_offsets(const ModelConfig& config);

// Normal(0, 0.02) matrices and unit norm weights, from a seed (the same on every rank).
void init_parameters(const ModelConfig& config, uint64_t seed, float* params);

}  // namespace seqpar
