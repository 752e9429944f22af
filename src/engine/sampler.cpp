// Sampling, in the order of Hugging Face generate()'s processors and warpers.
// Candidates are kept as a list rather than a masked [vocab] array so each
// warper works on what survived the previous one; top-p sorts only as far as
// it needs (a growing partial sort) because a full sort of a 128k vocabulary
// per token would cost as much as a small model's forward pass.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "core/check.h"

namespace lathe {

namespace {

// Higher probability first; the lower id first among equals (platform-independent order).
bool by_prob_desc(const Candidate& a, const Candidate& b) {
  if (a.prob != b.prob) return a.prob > b.prob;
  return a.id < b.id;
}

void normalize(std::vector<Candidate>& c) {
  double total = 0.0;
  for (const Candidate& x : c) total += x.prob;
  for (Candidate& x : c) x.prob /= total;
}

// HF TopKLogitsWarper: drops logits below the k-th largest (ties at it stay).
void keep_top_k(std::vector<Candidate>& c, int top_k) {
  if (top_k <= 0 || static_cast<size_t>(top_k) >= c.size()) return;
  std::vector<float> values(c.size());
  for (size_t i = 0; i < c.size(); ++i) values[i] = c[i].logit;
  auto kth = values.begin() + (top_k - 1);
  std::nth_element(values.begin(), kth, values.end(), std::greater<float>());
  float threshold = *kth;
  std::erase_if(c, [threshold](const Candidate& x) { return x.logit < threshold; });
}

void softmax(std::vector<Candidate>& c) {
  float max_logit = -INFINITY;
  for (const Candidate& x : c) max_logit = std::max(max_logit, x.logit);
  for (Candidate& x : c) x.prob = std::exp(static_cast<double>(x.logit) - max_logit);
  normalize(c);
}

// HF TopPLogitsWarper: keeps the most probable tokens until their mass reaches
// top_p (the token that crosses it included). Sorts a prefix that grows until
// it holds that mass.
void keep_top_p(std::vector<Candidate>& c, float top_p) {
  if (top_p >= 1.0f || c.size() <= 1) return;
  size_t k = std::min<size_t>(c.size(), 256);
  while (true) {
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(k), c.end(), by_prob_desc);
    double mass = 0.0;
    for (size_t i = 0; i < k; ++i) mass += c[i].prob;
    if (mass >= top_p || k == c.size()) break;
    k = std::min(c.size(), k * 4);
  }
  double above = 0.0;
  size_t keep = 0;
  while (keep < c.size() && (keep == 0 || above < top_p)) above += c[keep++].prob;
  c.resize(keep);
  normalize(c);
}

// HF MinPLogitsWarper: drops tokens with p < min_p * max p. The ratio does
// not depend on normalization, so no re-softmax is needed first.
void keep_min_p(std::vector<Candidate>& c, float min_p) {
  if (min_p <= 0.0f || c.size() <= 1) return;
  double max_prob = 0.0;
  for (const Candidate& x : c) max_prob = std::max(max_prob, x.prob);
  double threshold = static_cast<double>(min_p) * max_prob;
  std::erase_if(c, [threshold](const Candidate& x) { return x.prob < threshold; });
  normalize(c);
}

}  // namespace

Status SamplingOptions::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    return invalid_argument("sampling: temperature must be >= 0, got ", temperature);
  if (top_k < 0) return invalid_argument("sampling: top_k must be >= 0 (0 turns it off), got ", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) return invalid_argument("sampling: top_p must be in (0, 1], got ", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return invalid_argument("sampling: min_p must be in [0, 1], got ", min_p);
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    return invalid_argument("sampling: repetition_penalty must be > 0, got ", repetition_penalty);
  if (max_new_tokens < 0) return invalid_argument("sampling: max_new_tokens must be >= 0, got ", max_new_tokens);
  for (const std::string& s : stop_strings)
    if (s.empty()) return invalid_argument("sampling: stop strings must not be empty");
  return Status::ok();
}

void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> context, float penalty) {
  if (penalty == 1.0f) return;
  std::unordered_set<int32_t> seen;
  for (int32_t id : context) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size() || !seen.insert(id).second) continue;
    float& x = logits[static_cast<size_t>(id)];
    x = x < 0.0f ? x * penalty : x / penalty;
  }
}

int32_t argmax(std::span<const float> logits) {
  LATHE_CHECK(!logits.empty(), "argmax of no logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

std::vector<Candidate> warp_logits(std::span<const float> logits, const SamplingOptions& opts) {
  std::vector<Candidate> c;
  if (opts.greedy()) {
    int32_t id = argmax(logits);
    c.push_back({.id = id, .logit = logits[static_cast<size_t>(id)], .prob = 1.0});
    return c;
  }
  c.reserve(logits.size());
  float inv_t = 1.0f / opts.temperature;
  for (size_t i = 0; i < logits.size(); ++i) {
    float x = logits[i] * inv_t;
    if (x > -INFINITY) c.push_back({.id = static_cast<int32_t>(i), .logit = x, .prob = 0.0});
  }
  if (c.empty()) {  // everything masked: fall back to the first token rather than nothing
    c.push_back({.id = argmax(logits), .logit = 0.0f, .prob = 1.0});
    return c;
  }
  keep_top_k(c, opts.top_k);
  softmax(c);
  keep_top_p(c, opts.top_p);
  keep_min_p(c, opts.min_p);
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  return c;
}

Sampler::Sampler(const SamplingOptions& opts) : opts_(opts), rng_(opts.seed) {}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> context) {
  apply_repetition_penalty(logits, context, opts_.repetition_penalty);
  if (opts_.greedy()) return argmax(logits);
  std::vector<Candidate> c = warp_logits(logits, opts_);
  double u = uniform();
  double acc = 0.0;
  for (const Candidate& x : c) {
    acc += x.prob;
    if (u < acc) return x.id;
  }
  return c.back().id;  // u landed in the rounding slack above the last sum
}

}  // namespace lathe
