// Random-init weights for a Llama-family model, written the way Hugging Face
// save_pretrained writes them (names, order, shards over 5 GB with an index),
// initialized as transformers does: normal(0, initializer_range) for linear
// and embedding weights, ones for RMSNorm weights, zeros for biases.
//
// Every element comes from a counter-based generator keyed by (seed, tensor
// name, element index), so the values do not depend on thread count, on the
// order tensors are made in, or on which shard they land in. Only one shard
// is in memory at a time: an 8B model in bf16 (16 GB) peaks at about 5.3 GB.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/hf_config.h"

namespace lathe {

enum class InitKind : uint8_t { kNormal, kOnes, kZeros };

struct TensorSpec {
  std::string name;  // "model.layers.0.self_attn.q_proj.weight"
  Shape shape;
  InitKind init = InitKind::kNormal;
};

// The tensors of cfg's checkpoint in save_pretrained order. lm_head.weight is
// absent when the embeddings are tied.
std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& cfg);

struct RandomInitOptions {
  uint64_t seed = 0;
  DType dtype = DType::F32;  // f32, bf16 or f16
  float initializer_range = 0.02f;
  uint64_t max_shard_bytes = 5000000000;  // save_pretrained's default max_shard_size ("5GB")
};

// One tensor's values (deterministic in seed and spec.name).
Tensor random_tensor(const TensorSpec& spec, const RandomInitOptions& opts);

// Safetensors metadata key marking weights this file wrote (value "seed=N"),
// so init-model can tell its own output, safe to overwrite, from a real model.
constexpr const char* kRandomInitMetadataKey = "lathe_random_init";

// Writes dir/model.safetensors, or model-0000i-of-0000n.safetensors plus
// model.safetensors.index.json when the weights pass max_shard_bytes.
// dir must exist. Holds one shard in memory at a time.
Status write_random_weights(const std::string& dir, const ModelConfig& cfg, const RandomInitOptions& opts);

}  // namespace lathe
