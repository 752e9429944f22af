// Token sampling: the logits processors and warpers of Hugging Face
// generate(), applied in its order — repetition penalty → temperature →
// top-k → top-p → min-p — then one draw from what is left.
//
// Temperature 0 means greedy (argmax after the repetition penalty), as
// do_sample=False does. The random stream is std::mt19937_64 turned into
// uniforms by bit arithmetic (never a std:: distribution, whose output differs
// between standard libraries), and every sort breaks ties by token id, so one
// seed gives the same tokens on every platform.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

struct SamplingOptions {
  float temperature = 1.0f;         // 0: greedy
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off; keep p >= min_p * max p
  float repetition_penalty = 1.0f;  // 1: off; over prompt + generated tokens
  uint64_t seed = 0;
  int max_new_tokens = 256;
  std::vector<int32_t> stop_token_ids;   // generation ends after one of these
  std::vector<std::string> stop_strings;  // text ends before the first match

  bool greedy() const { return temperature == 0.0f; }
  // Messages name the field: "sampling: top_p must be in (0, 1], got 1.5".
  Status validate() const;
};

// HF RepetitionPenaltyLogitsProcessor: for every distinct token in context,
// logit > 0 is divided by penalty, logit < 0 multiplied by it. Ids outside
// [0, logits.size()) are ignored.
void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> context, float penalty);

// A token and its probability under the warped distribution.
struct Candidate {
  int32_t id = 0;
  float logit = 0.0f;
  double prob = 0.0;
};

// Temperature, top-k, top-p and min-p over logits (already penalized). Returns
// the tokens that survive, sorted by id, with probabilities renormalized over
// them. Exposed for tests; Sampler::sample() uses it.
std::vector<Candidate> warp_logits(std::span<const float> logits, const SamplingOptions& opts);

// Index of the largest logit (the first on ties).
int32_t argmax(std::span<const float> logits);

// One sequence's sampler. Not thread-safe: one per sequence.
class Sampler {
 public:
  explicit Sampler(const SamplingOptions& opts);

  // Picks the next token. logits: [vocab] f32, penalized in place. context:
  // prompt + generated ids so far (for the repetition penalty).
  int32_t sample(std::span<float> logits, std::span<const int32_t> context);

  const SamplingOptions& options() const { return opts_; }

 private:
  double uniform();  // [0, 1) with 53 random bits

  SamplingOptions opts_;
  std::mt19937_64 rng_;
};

}  // namespace lathe
