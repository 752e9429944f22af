// A decoder-only causal language model of the Llama family (Llama, Mistral,
// Qwen2, Qwen3) loaded from a Hugging Face directory, and its KV cache.
// Family differences (qkv bias, q/k norm, tied embeddings, rope scaling) are
// folded in at load; the forward pass reads the same for all of them.
//
// Threads: a CausalLM is immutable after load; forward() may run from several
// threads at once on different KvCaches. CPU: fp32 compute; bf16 weights may
// stay bf16 in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/hf_config.h"
#include "nn/arena.h"

namespace lathe {

struct LoadOptions {
  Device device = Device::cpu();
  // Keep bf16/f16 weights in their file dtype (converted per use) instead of
  // upcasting to f32 at load.
  bool keep_half_weights = true;
  // A PEFT LoRA adapter directory (adapter_config.json +
  // adapter_model.safetensors) merged into the base weights at load:
  // W' = W + scale·B·A in f32, the adapted weights held as f32 copies. Empty:
  // none. Errors name the adapter file and tensor (a module or layer the model
  // lacks, A/B shapes that do not fit the weight).
  std::string adapter_dir;
};

// Keys and values for one sequence: [n_layer][max_seq, n_head_kv, head_dim],
// plus the scratch arena of the passes that run on it (so a forward call
// allocates nothing once the arena has grown to its size). Move-only.
class KvCache {
 public:
  KvCache() = default;
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;
  int n_tokens() const { return n_tokens_; }   // tokens already in the cache
  int max_tokens() const { return max_tokens_; }
  void clear() { n_tokens_ = 0; }
  // Drops everything after the first n tokens.
  void truncate(int n);
  // Bytes held by the scratch arena (steady after the first calls of a size).
  int64_t scratch_bytes() const { return scratch_.capacity_bytes(); }

 private:
  friend class CausalLM;
  int n_tokens_ = 0;
  int max_tokens_ = 0;
  std::vector<Tensor> k_, v_;  // per layer, f32 [max_tokens, n_head_kv, head_dim]
  Arena scratch_;              // activations and workspaces of forward()
};

class CausalLmImpl;

class CausalLM {
 public:
  // Reads config.json and the safetensors weights of dir. Errors name the
  // file and tensor: unsupported architecture, missing or mis-shaped tensor.
  static Result<std::unique_ptr<CausalLM>> load(const std::string& dir, const LoadOptions& opts = {});
  ~CausalLM();

  const ModelConfig& config() const;
  int64_t n_params() const;

  KvCache new_cache(int max_tokens) const;

  // Appends tokens to the sequence held in cache and runs them.
  // logits: [n, vocab] f32 where n is tokens.size() when all_logits, else 1
  // (the last token's). Errors when the cache would overflow.
  Status forward(std::span<const int32_t> tokens, KvCache& cache, TensorView logits, bool all_logits) const;

  // The rotary frequencies in use, [head_dim / 2] (for tests and tools).
  const std::vector<float>& rope_inv_freq() const;

 private:
  explicit CausalLM(std::unique_ptr<CausalLmImpl> impl);
  std::unique_ptr<CausalLmImpl> impl_;
};

}  // namespace lathe
