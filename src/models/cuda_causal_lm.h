// A Llama-family causal LM on one NVIDIA GPU, for generation: bf16 weights
// (f32/f16 files converted at load, a PEFT adapter merged at load as on the
// CPU), a bf16 KV cache for one sequence, prefill (the flash forward over the
// prompt into the cache) and decode one token at a time. Every device buffer
// is planned and allocated at load from the options' sizes; a forward pass
// allocates nothing. A decode step can run as a captured CUDA graph: the
// token id and position it reads live in device memory, so one capture
// replays for every later step.
//
// Same families and quirks as CausalLM (family.h). head_dim 64 and 128 take
// the flash kernels; other head dims (up to 256) take the plain attention
// kernel. Threads: one thread drives a CudaCausalLM (it owns its stream).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "io/hf_config.h"
#include "models/family.h"

namespace lathe {

struct CudaModelOptions {
  int device = 0;                // CUDA device index
  int max_seq = 0;               // KV cache rows: prompt + generated tokens (> 0)
  int max_forward_tokens = 0;    // most tokens one pass runs (longer inputs go in chunks); 0: max_seq
  int max_logit_rows = 1;        // most rows of logits one forward() returns (all_logits)
  bool use_graphs = true;        // decode steps as a CUDA graph replay
  bool simple_attention = false;  // the plain attention kernel for every head_dim (a slow twin for tests)
  std::string adapter_dir;       // PEFT LoRA adapter merged at load; empty: none
};

class CudaCausalLmImpl;

class CudaCausalLM {
 public:
  // Reads config.json and the safetensors of dir. Errors name the file and
  // tensor (as CausalLM::load), or the option / device that does not fit.
  static Result<std::unique_ptr<CudaCausalLM>> load(const std::string& dir, const CudaModelOptions& opts);
  // Random bf16 weights made on the device (benchmarks): linear and embedding
  // weights of standard deviation init_range, norms one, biases zero.
  static Result<std::unique_ptr<CudaCausalLM>> random(const ModelHeader& header, const CudaModelOptions& opts,
                                                      uint64_t seed, float init_range = 0.02f);
  ~CudaCausalLM();

  const ModelConfig& config() const;
  int64_t n_params() const;
  size_t device_bytes() const;  // weights + cache + activations
  int n_tokens() const;         // tokens in the cache
  int max_seq() const;
  void clear();                 // empties the cache (the next forward starts at position 0)
  void set_use_graphs(bool on);  // drops a captured graph when turned off

  // Appends tokens to the sequence and runs them; logits (host, f32) receive
  // [rows, vocab] with rows = tokens.size() when all_logits (at most
  // max_logit_rows), else 1 (the last token's). Errors when the cache would
  // overflow or an id is outside the vocabulary.
  Status forward(std::span<const int32_t> tokens, std::span<float> logits, bool all_logits = false);
  // Like forward(), but picks the last token's argmax on the device and
  // returns it (greedy decoding without copying the logits to the host).
  Result<int32_t> forward_greedy(std::span<const int32_t> tokens);

 private:
  explicit CudaCausalLM(std::unique_ptr<CudaCausalLmImpl> impl);
  std::unique_ptr<CudaCausalLmImpl> impl_;
};

}  // namespace lathe
