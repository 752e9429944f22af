// Text generation for one sequence: prefill the prompt, then decode one token
// at a time through the KV cache, sampling each, until a stop token, a stop
// string or the token budget ends it. Text streams out in pieces as it is
// decoded; a piece never holds half a UTF-8 character (IncrementalDecoder)
// nor text that could still turn out to begin a stop string (StopMatcher).
//
// The loop is written against a step function so tests can drive it with a
// scripted model; generate() binds it to a CausalLM and its KvCache.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "models/causal_lm.h"
#include "models/cuda_causal_lm.h"

namespace lathe {

struct GenerationResult {
  std::vector<int32_t> token_ids;  // generated ids, a final stop token included (as HF generate returns it)
  std::string text;                // generated text: ends before a stop string; never holds a stop token
  std::string finish_reason;       // "stop" (stop token or string) or "length"
  int prompt_tokens = 0;
  double prefill_seconds = 0.0;  // prompt forward + first sample
  double decode_seconds = 0.0;   // every later forward + sample
  int decode_steps = 0;          // forwards after the prefill (one token each)

  double prefill_tokens_per_s() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0.0; }
  double decode_tokens_per_s() const { return decode_seconds > 0 ? decode_steps / decode_seconds : 0.0; }
};

// Called on the generating thread with each new, non-empty piece of text.
using TextCallback = std::function<void(std::string_view piece)>;

// Runs tokens (appended to the sequence so far) and writes the logits of the
// last one into logits ([vocab] f32).
using StepFn = std::function<Status(std::span<const int32_t> tokens, std::span<float> logits)>;

struct GenerateArgs {
  std::span<const int32_t> prompt;  // at least one token
  SamplingOptions sampling;
  int max_context_tokens = 0;       // prompt + generated must fit; 0: no limit
  bool skip_special_tokens = true;  // in the text (ids are always exact)
};

// The generation loop over any model step. vocab_size sizes the logits.
// Borrows everything; calls on_text (may be empty) on this thread.
Result<GenerationResult> generate_with(const StepFn& step, int vocab_size, const Tokenizer& tokenizer,
                                       const GenerateArgs& args, const TextCallback& on_text);

// generate_with() on a CausalLM with a fresh KvCache sized prompt +
// max_new_tokens (capped at max_position_embeddings).
Result<GenerationResult> generate(const CausalLM& model, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                  const SamplingOptions& sampling, const TextCallback& on_text);

// The generation loop on a CudaCausalLM: its cache is cleared first; the
// length is capped by the max_seq it was loaded with. The tokens are picked
// on the device (greedy, or drawn there under temperature, top-k, top-p,
// min-p and the repetition penalty where samples_on_device()) and fed to
// the next step there, steps queued ahead of the host; where the device
// cannot, generate_with(): the logits come to the host each step for the
// Sampler.
// Drawn on the device, the same seed gives the same tokens run after run,
// but not the CPU sampler's.
Result<GenerationResult> generate(CudaCausalLM& model, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                  const SamplingOptions& sampling, const TextCallback& on_text);

// The ids that end generation when the user names none: generation_config's
// eos_token_id, else config.json's, else the tokenizer's eos token.
std::vector<int32_t> default_stop_token_ids(const GenerationConfig& gen, const ModelConfig& cfg,
                                            const Tokenizer& tokenizer);

}  // namespace lathe
