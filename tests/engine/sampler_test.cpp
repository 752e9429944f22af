// Sampler: each warper on distributions whose answer is known by hand, the
// whole chain against Hugging Face transformers' processors (fixture made by
// tools/make_sampler_fixtures.py), draw frequencies within statistical
// bounds, and seeded determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/sampler.h"

namespace lathe {
namespace {

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

std::vector<int32_t> ids_of(const std::vector<Candidate>& c) {
  std::vector<int32_t> ids;
  for (const Candidate& x : c) ids.push_back(x.id);
  return ids;
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeOncePerToken) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f};
  std::vector<int32_t> context = {0, 1, 0, 0, 7, -1};  // repeats count once; out-of-range ids ignored
  apply_repetition_penalty(logits, context, 2.0f);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f}));
}

TEST(Sampler, TemperatureScalesLogitsBeforeSoftmax) {
  std::vector<float> logits = {1.0f, 0.0f};
  auto c = warp_logits(logits, {.temperature = 2.0f});
  ASSERT_EQ(c.size(), 2u);
  double e = std::exp(0.5);
  EXPECT_NEAR(c[0].prob, e / (e + 1.0), 1e-6);
}

TEST(Sampler, TopKKeepsTheKLargestAndTiesAtTheThreshold) {
  std::vector<float> logits = {0.1f, 3.0f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(ids_of(warp_logits(logits, {.top_k = 1})), (std::vector<int32_t>{1}));
  EXPECT_EQ(ids_of(warp_logits(logits, {.top_k = 2})), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids_of(warp_logits(logits, {.top_k = 4})), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(warp_logits(logits, {.top_k = 0}).size(), 5u);
}

TEST(Sampler, TopPKeepsTheMinimalSetReachingP) {
  auto logits = log_probs({0.1, 0.5, 0.15, 0.25});
  EXPECT_EQ(ids_of(warp_logits(logits, {.top_p = 0.4f})), (std::vector<int32_t>{1}));
  EXPECT_EQ(ids_of(warp_logits(logits, {.top_p = 0.7f})), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(ids_of(warp_logits(logits, {.top_p = 0.8f})), (std::vector<int32_t>{1, 2, 3}));
  auto c = warp_logits(logits, {.top_p = 0.7f});
  EXPECT_NEAR(c[0].prob, 0.5 / 0.75, 1e-6);  // renormalized over what is kept
  EXPECT_NEAR(c[1].prob, 0.25 / 0.75, 1e-6);
}

TEST(Sampler, TopPOverALargeFlatVocabularyMatchesAFullSort) {
  // Nearly flat: the kept set runs past the first partial-sort window.
  std::vector<float> logits(5000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f;
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) total += (p[i] = std::exp(static_cast<double>(logits[i])));
  std::vector<size_t> order(p.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
  size_t expected = 0;
  double above = 0;
  while (above < 0.9) above += p[order[expected++]] / total;
  EXPECT_GT(expected, 1000u);
  EXPECT_EQ(warp_logits(logits, {.top_p = 0.9f}).size(), expected);
}

TEST(Sampler, MinPThresholdIsRelativeToTheMaxProbability) {
  auto logits = log_probs({0.1, 0.5, 0.15, 0.25});
  EXPECT_EQ(ids_of(warp_logits(logits, {.min_p = 0.25f})), (std::vector<int32_t>{1, 2, 3}));  // p >= 0.125
  EXPECT_EQ(ids_of(warp_logits(logits, {.min_p = 0.45f})), (std::vector<int32_t>{1, 3}));     // p >= 0.225
  EXPECT_EQ(ids_of(warp_logits(logits, {.min_p = 0.6f})), (std::vector<int32_t>{1}));
}

TEST(Sampler, TopKRunsBeforeTopP) {
  // After top-k=2 the kept mass is {0.4, 0.3} → {4/7, 3/7}: top-p 0.5 keeps one.
  // Over the full distribution top-p 0.5 would keep two.
  auto logits = log_probs({0.4, 0.3, 0.2, 0.1});
  EXPECT_EQ(ids_of(warp_logits(logits, {.top_k = 2, .top_p = 0.5f})), (std::vector<int32_t>{0}));
  EXPECT_EQ(ids_of(warp_logits(logits, {.top_p = 0.5f})), (std::vector<int32_t>{0, 1}));
}

TEST(Sampler, MatchesTransformersProcessors) {
  std::ifstream f(LATHE_TEST_DATA "/engine/sampler_warpers.json");
  ASSERT_TRUE(f.good());
  auto j = nlohmann::json::parse(f);
  ASSERT_GT(j["cases"].size(), 0u);
  for (const auto& c : j["cases"]) {
    auto logits = c["logits"].get<std::vector<float>>();
    auto context = c["context"].get<std::vector<int32_t>>();
    SamplingOptions o{.temperature = c["temperature"], .top_k = c["top_k"], .top_p = c["top_p"],
                      .min_p = c["min_p"], .repetition_penalty = c["repetition_penalty"]};
    apply_repetition_penalty(logits, context, o.repetition_penalty);
    auto got = warp_logits(logits, o);
    auto want_ids = c["kept_ids"].get<std::vector<int32_t>>();
    auto want_probs = c["kept_probs"].get<std::vector<double>>();
    SCOPED_TRACE(c.dump().substr(0, 160));
    ASSERT_EQ(ids_of(got), want_ids);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i].prob, want_probs[i], 1e-5);
  }
}

TEST(Sampler, GreedyTakesTheFirstArgmaxAfterThePenalty) {
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.5f};
  Sampler s({.temperature = 0.0f});
  EXPECT_EQ(s.sample(logits, {}), 1);
  Sampler penalized({.temperature = 0.0f, .repetition_penalty = 2.0f});
  std::vector<int32_t> context = {1, 2};
  EXPECT_EQ(penalized.sample(logits, context), 3);  // 3/2 < 2.5
}

TEST(Sampler, DrawFrequenciesFollowTheWarpedDistribution) {
  const int n = 40000;
  auto logits = log_probs({0.5, 0.3, 0.15, 0.05});
  for (int top_k : {0, 2}) {
    Sampler s({.top_k = top_k, .seed = 42});
    std::vector<int> counts(4, 0);
    for (int i = 0; i < n; ++i) {
      std::vector<float> l = logits;
      counts[static_cast<size_t>(s.sample(l, {}))]++;
    }
    std::vector<double> want = top_k == 2 ? std::vector<double>{0.625, 0.375, 0, 0}
                                          : std::vector<double>{0.5, 0.3, 0.15, 0.05};
    for (size_t t = 0; t < 4; ++t) {
      double freq = static_cast<double>(counts[t]) / n;
      double sigma = std::sqrt(want[t] * (1 - want[t]) / n);
      EXPECT_NEAR(freq, want[t], 5 * sigma + 1e-12) << "token " << t << " top_k " << top_k;
    }
  }
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> logits(1000, 0.0f);
  auto draw = [&](uint64_t seed) {
    Sampler s({.top_p = 0.95f, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      std::vector<float> l = logits;
      out.push_back(s.sample(l, out));
    }
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, DrawsAreTheUniformsOfMt19937_64) {
  // mt19937_64 is fully specified by the standard, so this holds on every platform.
  std::vector<float> logits(100, 0.0f);
  Sampler s({.seed = 0});
  std::mt19937_64 ref(0);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> l = logits;
    auto want = static_cast<int32_t>(static_cast<double>(ref() >> 11) * 0x1.0p-53 * 100);
    int32_t got = s.sample(l, {});
    EXPECT_LE(std::abs(got - want), 1) << "draw " << i;  // a boundary may round either way
  }
}

TEST(Sampler, ValidateNamesTheBadField) {
  EXPECT_TRUE(SamplingOptions{}.validate().is_ok());
  auto msg = [](SamplingOptions o) { return o.validate().message(); };
  EXPECT_NE(msg({.temperature = -1.0f}).find("temperature"), std::string::npos);
  EXPECT_NE(msg({.top_k = -3}).find("top_k"), std::string::npos);
  EXPECT_NE(msg({.top_p = 0.0f}).find("top_p"), std::string::npos);
  EXPECT_NE(msg({.top_p = 1.5f}).find("top_p"), std::string::npos);
  EXPECT_NE(msg({.min_p = 2.0f}).find("min_p"), std::string::npos);
  EXPECT_NE(msg({.repetition_penalty = 0.0f}).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(msg({.max_new_tokens = -1}).find("max_new_tokens"), std::string::npos);
  EXPECT_NE(msg({.stop_strings = {""}}).find("stop"), std::string::npos);
}

}  // namespace
}  // namespace lathe
