// sample_pick (decode_ops.h) against the CPU sampler's warpers
// (engine/sampler.h: warp_logits, Hugging Face's order): N draws of one
// logits row (a row per draw, the row index in the random stream) under
// temperature, top-k, top-p, min-p and all four; every drawn id must be one
// the CPU keeps, and each kept token's frequency must match its probability
// within 5 standard deviations (+0.002). Ties at the top-k and top-p
// thresholds follow the CPU (ties at the k-th stay; at the top-p crossing
// the first in id order). The same seed gives the same draws, another seed
// others; with a feed, the positions salt the draws and move on. The cases
// take both of the kernel's ends: the whole cluster (no top-k, many
// survivors; top-k with more than 256 ties) and block 0 alone (top-k).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "backends/cuda/decode_ops.h"
#include "cuda/cuda_test_util.h"
#include "engine/sampler.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

bool clusters_run() {
  auto info = device_info(0);
  return info.is_ok() && info.value().sm_major >= 9;
}

// n draws of `row`, one row each; returns the ids.
std::vector<int32_t> draw(CudaContext& ctx, const std::vector<float>& row, int64_t n, const SamplingOptions& o,
                          uint64_t seed, Status* st) {
  const int64_t vocab = int64_t(row.size());
  std::vector<float> rows(size_t(n * vocab));
  for (int64_t r = 0; r < n; ++r) std::copy(row.begin(), row.end(), rows.begin() + r * vocab);
  DeviceBuffer dx = upload(ctx, rows), next = upload(ctx, std::vector<int32_t>(size_t(n), -1));
  *st = sample_pick(ctx, {.logits = dptr<float>(dx), .next = dptr<int32_t>(next), .rows = n, .vocab = vocab,
                          .inv_temperature = 1.0f / o.temperature, .top_k = o.top_k, .top_p = o.top_p,
                          .min_p = o.min_p, .seed = seed, .salt = 7, .feed = {}, .overlap = false});
  if (!st->is_ok()) return {};
  return download<int32_t>(ctx, next, n);
}

void check_distribution(const std::vector<int32_t>& ids, const std::vector<float>& row, const SamplingOptions& o) {
  const std::vector<Candidate> kept = warp_logits(row, o);
  std::map<int32_t, double> want;
  for (const Candidate& c : kept) want[c.id] = c.prob;
  std::map<int32_t, int64_t> count;
  for (int32_t id : ids) ++count[id];
  for (const auto& [id, k] : count) EXPECT_TRUE(want.count(id)) << "drew id " << id << " (" << k << "x), not kept";
  const double n = double(ids.size());
  for (const auto& [id, p] : want) {
    const double f = count.count(id) ? double(count[id]) / n : 0.0;
    EXPECT_LE(std::abs(f - p), 5.0 * std::sqrt(p * (1 - p) / n) + 0.002)
        << "id " << id << ": drawn " << f << ", p " << p;
  }
}

// 20,000 draws of row: exactly the ids the CPU keeps are drawn, at its
// probabilities. Returns how many it keeps.
size_t draws_are_the_cpus(CudaContext& ctx, const std::vector<float>& row, const SamplingOptions& o, uint64_t seed) {
  Status st;
  const std::vector<int32_t> ids = draw(ctx, row, 20000, o, seed, &st);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!st.is_ok()) return 0;
  std::set<int32_t> drawn(ids.begin(), ids.end()), kept;
  for (const Candidate& c : warp_logits(row, o)) kept.insert(c.id);
  EXPECT_EQ(drawn, kept);
  check_distribution(ids, row, o);
  return kept.size();
}

TEST(CudaSamplePick, MatchesTheCpuWarpers) {
  LATHE_SKIP_WITHOUT_GPU();
  if (!clusters_run()) GTEST_SKIP() << "sample_pick runs on sm_90+";
  CudaContext ctx = make_context();
  std::vector<float> row = random_bf16(1000, 91, 2.5f);
  row[17] = NAN;        // never drawn
  row[18] = -INFINITY;  // never drawn
  const SamplingOptions cases[] = {
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_p = 0.9f},
      {.temperature = 1.0f, .top_k = 20},
      {.temperature = 1.3f, .min_p = 0.05f},
      {.temperature = 0.8f, .top_k = 50, .top_p = 0.8f, .min_p = 0.02f},
  };
  constexpr int64_t kDraws = 20000;
  for (const SamplingOptions& o : cases) {
    SCOPED_TRACE(::testing::Message() << "T " << o.temperature << " top_k " << o.top_k << " top_p " << o.top_p
                                      << " min_p " << o.min_p);
    Status st;
    const std::vector<int32_t> ids = draw(ctx, row, kDraws, o, 5, &st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    check_distribution(ids, row, o);
    EXPECT_EQ(draw(ctx, row, kDraws, o, 5, &st), ids) << "the same seed";
    EXPECT_NE(draw(ctx, row, kDraws, o, 6, &st), ids) << "another seed";
  }
  // A Llama-3 vocabulary (32 ids a thread): the distribution of a peaked row,
  // over the whole row (no top-k) and from each block's candidates (top-k).
  std::vector<float> big = random_bf16(128256, 92, 3.0f);
  for (const SamplingOptions& o : {SamplingOptions{.temperature = 0.6f, .top_p = 0.9f},
                                   SamplingOptions{.temperature = 1.0f, .top_p = 0.99f},  // a flat row
                                   SamplingOptions{.temperature = 0.6f, .top_k = 50, .top_p = 0.9f},
                                   SamplingOptions{.temperature = 1.0f, .top_k = 128, .min_p = 0.05f}}) {
    SCOPED_TRACE(::testing::Message() << "vocab 128256, top_k " << o.top_k);
    Status st;
    const std::vector<int32_t> ids = draw(ctx, big, 4000, o, 1, &st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    check_distribution(ids, big, o);
  }
}

// A Llama-3 vocabulary's row (normal logits, seed) with `ties` ids
// first, first + stride, ... set to `value`.
std::vector<float> tied_row(uint32_t seed, int ties, int first, int stride, float value) {
  std::vector<float> row = random_bf16(128256, seed, 1.0f);
  for (int i = 0; i < ties; ++i) row[size_t(first + stride * i)] = value;
  return row;
}

// Top-k over a Llama-3 vocabulary with ties at the k-th largest: 100 and
// 300 equal maxima spread over the first block's ids, the rest below. Every
// tie stays (top-k keeps ties), top-p then takes the first 95% in id order,
// as on the CPU, and the draw is uniform over them.
TEST(CudaSamplePick, TopKTiesOnALlamaVocabulary) {
  LATHE_SKIP_WITHOUT_GPU();
  if (!clusters_run()) GTEST_SKIP() << "sample_pick runs on sm_90+";
  CudaContext ctx = make_context();
  for (int ties : {100, 300}) {
    SCOPED_TRACE(::testing::Message() << ties << " ties");
    const SamplingOptions o{.temperature = 1.0f, .top_k = 5, .top_p = 0.95f};
    // Past top-k's 5: the ties stay, top-p takes 95% of them.
    EXPECT_GT(draws_are_the_cpus(ctx, tied_row(93, ties, 7, 37, 8.0f), o, 4), size_t(ties) * 9 / 10);
  }
}

// Top-p alone over a Llama-3 vocabulary with ties at its crossing: 200 and
// 300 equal maxima (the rest far below), top-p 0.5: the first ones in id
// order until half the mass, as on the CPU, whether the top-p search stops
// early (at most 256 tokens hold the mass) or runs to the end.
TEST(CudaSamplePick, TopPTiesOnALlamaVocabulary) {
  LATHE_SKIP_WITHOUT_GPU();
  if (!clusters_run()) GTEST_SKIP() << "sample_pick runs on sm_90+";
  CudaContext ctx = make_context();
  for (int ties : {200, 300}) {
    SCOPED_TRACE(::testing::Message() << ties << " ties");
    const SamplingOptions o{.temperature = 1.0f, .top_p = 0.5f};
    EXPECT_EQ(draws_are_the_cpus(ctx, tied_row(95, ties, 11, 401, 12.0f), o, 5), size_t(ties / 2) + 1);
  }
}

// Ties at the thresholds: logits 3, 1 ×4, 0 ×3. top-k 3 keeps all five of
// 3 and 1 (ties at the 3rd stay); top-p crossing inside the 1s keeps their
// first ones in id order, exactly as many as the CPU.
TEST(CudaSamplePick, TiesFollowTheCpu) {
  LATHE_SKIP_WITHOUT_GPU();
  if (!clusters_run()) GTEST_SKIP() << "sample_pick runs on sm_90+";
  CudaContext ctx = make_context();
  const std::vector<float> row = {0.f, 1.f, 3.f, 1.f, 0.f, 1.f, 1.f, 0.f};
  for (const SamplingOptions& o : {SamplingOptions{.temperature = 1.0f, .top_k = 3},
                                   SamplingOptions{.temperature = 1.0f, .top_p = 0.75f},
                                   SamplingOptions{.temperature = 1.0f, .top_p = 0.85f},
                                   SamplingOptions{.temperature = 1.0f, .top_k = 5, .top_p = 0.75f}}) {
    SCOPED_TRACE(::testing::Message() << "top_k " << o.top_k << " top_p " << o.top_p);
    draws_are_the_cpus(ctx, row, o, 3);
  }
}

// The repetition penalty (SeenPenalty: the row's bitmap of tokens held):
// greedy_pick and sample_pick see the logits the CPU's
// apply_repetition_penalty leaves, for positive and negative logits, the
// argmax among them; a row without the bitmap's tokens is untouched.
TEST(CudaSamplePick, RepetitionPenaltyAsTheCpu) {
  LATHE_SKIP_WITHOUT_GPU();
  if (!clusters_run()) GTEST_SKIP() << "sample_pick runs on sm_90+";
  CudaContext ctx = make_context();
  constexpr int64_t kVocab = 5000;
  std::vector<float> row = random_bf16(kVocab, 94, 2.0f);
  const int32_t top = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
  std::vector<int32_t> held = {top, 7, 4095, 4999};
  for (int i = 0; i < 40; ++i) held.push_back((i * 977) % kVocab);
  row[7] = -1.5f;  // a negative logit held
  std::vector<uint32_t> bits(size_t((kVocab + 31) / 32), 0);
  for (int32_t id : held) bits[size_t(id / 32)] |= 1u << (id % 32);
  std::vector<float> want_row = row;
  apply_repetition_penalty(want_row, held, 2.0f);
  // Row 0 with the bitmap, row 1 (the same logits) with an empty one.
  std::vector<float> rows = row;
  rows.insert(rows.end(), row.begin(), row.end());
  std::vector<uint32_t> both = bits;
  both.insert(both.end(), bits.size(), 0u);
  DeviceBuffer dx = upload(ctx, rows), dseen = upload(ctx, both), next = upload(ctx, std::vector<int32_t>(2, -1));
  const SeenPenalty pen{.seen = dptr<uint32_t>(dseen), .stride = int64_t(bits.size()), .penalty = 2.0f};
  Status st = greedy_pick(ctx, {.logits = dptr<float>(dx), .next = dptr<int32_t>(next), .rows = 2, .vocab = kVocab,
                                .feed = {}, .penalty = pen});
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(download<int32_t>(ctx, next, 2), (std::vector<int32_t>{argmax(want_row), top}));
  ASSERT_NE(argmax(want_row), top) << "the test's penalty must move the argmax";
  // Drawn: many rows of row 0's logits, all with its bitmap (stride 0).
  constexpr int64_t kDraws = 20000;
  std::vector<float> many;
  for (int64_t r = 0; r < kDraws; ++r) many.insert(many.end(), row.begin(), row.end());
  DeviceBuffer dm = upload(ctx, many), dnext = upload(ctx, std::vector<int32_t>(size_t(kDraws), -1));
  const SamplingOptions o{.temperature = 0.7f, .top_k = 30};
  st = sample_pick(ctx, {.logits = dptr<float>(dm), .next = dptr<int32_t>(dnext), .rows = kDraws, .vocab = kVocab,
                         .inv_temperature = 1.0f / o.temperature, .top_k = o.top_k, .seed = 9,
                         .penalty = {.seen = dptr<uint32_t>(dseen), .stride = 0, .penalty = 2.0f}});
  ASSERT_TRUE(st.is_ok()) << st.message();
  check_distribution(download<int32_t>(ctx, dnext, kDraws), want_row, o);
}

TEST(CudaSamplePick, FeedSaltsByPositionAndAdvances) {
  LATHE_SKIP_WITHOUT_GPU();
  if (!clusters_run()) GTEST_SKIP() << "sample_pick runs on sm_90+";
  CudaContext ctx = make_context();
  const std::vector<float> row = random_bf16(3000, 93, 0.5f);  // flat: every draw could be anything
  std::vector<float> rows;
  for (int r = 0; r < 2; ++r) rows.insert(rows.end(), row.begin(), row.end());
  DeviceBuffer dx = upload(ctx, rows);
  constexpr int kSlots = 4;
  auto ring = PinnedBuffer::alloc(ctx.device(), 2 * kSlots * sizeof(int32_t));
  ASSERT_TRUE(ring.is_ok()) << ring.status().message();
  auto* host = static_cast<int32_t*>(ring->data());
  // Rows 0 and 1 at positions 5 and 5: different rows, different draws (the
  // row is in the stream); the same position again: the same draw.
  std::vector<std::vector<int32_t>> got;
  for (int rep = 0; rep < 2; ++rep) {
    DeviceBuffer next = upload(ctx, std::vector<int32_t>(2, -1)), tokens = upload(ctx, std::vector<int32_t>(2, -1));
    DeviceBuffer positions = upload(ctx, std::vector<int32_t>{5, 5});
    Status st = sample_pick(ctx, {.logits = dptr<float>(dx), .next = dptr<int32_t>(next), .rows = 2, .vocab = 3000,
                                  .inv_temperature = 1.0f, .seed = 11,
                                  .feed = {.tokens = dptr<int32_t>(tokens), .positions = dptr<int32_t>(positions),
                                           .host_ring = static_cast<int32_t*>(ring->device_data()),
                                           .ring_slots = kSlots},
                                  .overlap = true});
    ASSERT_TRUE(st.is_ok()) << st.message();
    const std::vector<int32_t> ids = download<int32_t>(ctx, next, 2);
    EXPECT_EQ(download<int32_t>(ctx, tokens, 2), ids);
    EXPECT_EQ(download<int32_t>(ctx, positions, 2), (std::vector<int32_t>{6, 6}));
    ASSERT_TRUE(ctx.synchronize().is_ok());
    EXPECT_EQ(host[0 * kSlots + 1], ids[0]);
    EXPECT_EQ(host[1 * kSlots + 1], ids[1]);
    got.push_back(ids);
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_NE(got[0][0], got[0][1]);
  Status st = sample_pick(ctx, {.logits = dptr<float>(dx), .next = dptr<int32_t>(dx), .rows = 1, .vocab = 3000,
                                .inv_temperature = 1.0f, .top_p = 1.5f});
  EXPECT_NE(st.message().find("top_p"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace lathe::cuda
