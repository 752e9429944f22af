// The Llama-family architectures lathe runs and how they differ. Everything
// that varies between Llama, Mistral, Qwen2 and Qwen3 is a field here, decided
// once at load from config.json; the forward pass has no per-family branches.
// The tensor names are those transformers writes (model.layers.{i}.…).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "io/hf_config.h"

namespace lathe {

struct FamilyQuirks {
  std::string family;      // "llama", "mistral", "qwen2", "qwen3"
  bool qkv_bias = false;   // q/k/v projections have biases (Qwen2; Llama's attention_bias)
  bool o_bias = false;     // o_proj has a bias (Llama's attention_bias)
  bool mlp_bias = false;   // gate/up/down have biases (Llama's mlp_bias)
  bool qk_norm = false;    // RMSNorm over head_dim on q and k before RoPE (Qwen3)
  bool tied_embeddings = false;
  int sliding_window = 0;  // every layer attends to this many tokens; 0: all (Mistral)
};

// Picks the family from cfg.architecture / cfg.model_type. Unsupported ones
// are an error naming source (the config file) and the architecture.
Result<FamilyQuirks> family_quirks(const ModelConfig& cfg, const std::string& source);

// What every loader reads before the weights: config.json (validated), the
// family's quirks and the RoPE inverse frequencies [head_dim / 2].
struct ModelHeader {
  ModelConfig cfg;
  FamilyQuirks quirks;
  std::vector<float> inv_freq;
};
// Errors name dir/config.json.
Result<ModelHeader> load_model_header(const std::string& dir);
// The same from a config already in memory (random-init models); errors name source.
Result<ModelHeader> model_header_from_config(ModelConfig cfg, const std::string& source);

// Tensor names of the Hugging Face layout.
namespace names {
inline constexpr const char* kEmbed = "model.embed_tokens.weight";
inline constexpr const char* kFinalNorm = "model.norm.weight";
inline constexpr const char* kLmHead = "lm_head.weight";
// "model.layers.{layer}.{leaf}", e.g. leaf "self_attn.q_proj.weight".
// Inline: the GPU trainer's standalone benchmark uses these names without
// linking the models library.
inline std::string layer(int layer, const char* leaf) { return "model.layers." + std::to_string(layer) + "." + leaf; }
inline std::string layer(int64_t layer_index, const char* leaf) { return layer(static_cast<int>(layer_index), leaf); }
inline std::string layer(int64_t layer_index, const std::string& leaf) {
  return layer(static_cast<int>(layer_index), leaf.c_str());
}
// A decoder layer's seven projections, in the trainers' order (q, k, v, o,
// gate, up, down: train/trainable_impl.h's Proj, train/cuda_model_impl.h's
// CudaProj).
inline constexpr const char* kProjPaths[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                              "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                              "mlp.down_proj"};
}  // namespace names

}  // namespace lathe
