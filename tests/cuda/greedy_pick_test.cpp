// The greedy pick (decode_ops.h): greedy_pick after the LM head, and the
// same pick fused into a ring GEMV's epilogue (GemvPick) against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/cuda/decode_ops.h"
#include "cuda/cuda_test_util.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

// The greedy pick after the LM head: the largest logit's column, the first
// of equals, NaN never winning (an all-NaN row gives 0); rows of a width
// that is not a multiple of 4 (unaligned rows after the first) and one that
// is; greedy_pick (a cluster of blocks per row at the larger widths, the
// equal maxima of row 0 in its first and last block),
// ordinary and overlapped, and with greedy_pick's feed: the picks become
// the tokens, the positions advance, and each row's pick lands in its slot
// of the host ring (position mod slots).
TEST(CudaGenArgmax, FirstOfEqualsAndNaNNeverWins) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  for (int64_t cols : {int64_t(128256), int64_t(128257), int64_t(1003)}) {
    SCOPED_TRACE(::testing::Message() << "cols=" << cols);
    const int64_t rows = 4;
    std::vector<float> x = random_bf16(rows * cols, 77 + uint32_t(cols));
    std::vector<int32_t> want(static_cast<size_t>(rows));
    // Row 0: a maximum at two columns. Row 1: NaN above everything, the max after it.
    // Row 2: the max in the very last column. Row 3: all NaN.
    x[0 * cols + 17] = 9.0f;
    x[0 * cols + cols - 5] = 9.0f;
    want[0] = 17;
    x[1 * cols + 3] = NAN;
    x[1 * cols + 900] = 8.0f;
    want[1] = 900;
    x[2 * cols + cols - 1] = 7.5f;
    want[2] = static_cast<int32_t>(cols - 1);
    for (int64_t j = 0; j < cols; ++j) x[3 * cols + j] = NAN;
    want[3] = 0;
    DeviceBuffer dx = upload(ctx, x);
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(overlap ? "greedy_pick, overlapped" : "greedy_pick");
      DeviceBuffer next = upload(ctx, std::vector<int32_t>(size_t(rows), -1));
      Status st = greedy_pick(ctx, {.logits = dptr<float>(dx), .next = dptr<int32_t>(next), .rows = rows,
                                    .vocab = cols, .feed = {}, .overlap = overlap});
      ASSERT_TRUE(st.is_ok()) << st.message();
      EXPECT_EQ(download<int32_t>(ctx, next, rows), want);
    }
    constexpr int kSlots = 3;
    const std::vector<int32_t> pos = {0, 4, 8, 2};
    DeviceBuffer next = upload(ctx, std::vector<int32_t>(size_t(rows), -1));
    DeviceBuffer tokens = upload(ctx, std::vector<int32_t>(size_t(rows), -1)), positions = upload(ctx, pos);
    auto ring = PinnedBuffer::alloc(ctx.device(), rows * kSlots * sizeof(int32_t));
    ASSERT_TRUE(ring.is_ok()) << ring.status().message();
    auto* host = static_cast<int32_t*>(ring->data());
    std::fill(host, host + rows * kSlots, -1);
    Status st = greedy_pick(ctx, {.logits = dptr<float>(dx), .next = dptr<int32_t>(next), .rows = rows, .vocab = cols,
                                  .feed = {.tokens = dptr<int32_t>(tokens), .positions = dptr<int32_t>(positions),
                                           .host_ring = static_cast<int32_t*>(ring->device_data()),
                                           .ring_slots = kSlots},
                                  .overlap = true});
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(download<int32_t>(ctx, next, rows), want);
    EXPECT_EQ(download<int32_t>(ctx, tokens, rows), want);
    EXPECT_EQ(download<int32_t>(ctx, positions, rows), (std::vector<int32_t>{1, 5, 9, 3}));
    ASSERT_TRUE(ctx.synchronize().is_ok());
    for (int64_t r = 0; r < rows; ++r)
      for (int k = 0; k < kSlots; ++k)
        EXPECT_EQ(host[r * kSlots + k], k == pos[r] % kSlots ? want[r] : -1) << "row " << r << " slot " << k;
  }
  Status st = greedy_pick(ctx, {.logits = nullptr, .next = nullptr, .rows = 1, .vocab = 8, .feed = {}});
  EXPECT_NE(st.message().find("null argument"), std::string::npos) << st.message();
}

// The greedy pick fused into a ring GEMV's kStoreF32 epilogue (GemvPick,
// as the LM head runs it) picks what greedy_pick picks from the logits the
// GEMV stores, with the repetition penalty and the feed, for 1..4 rows and
// any ring grid: equal logits go to the lower column (a bias makes columns
// 17 and 4001, whose weights are equal, the largest), NaN never wins (row 5
// of w holds one), a row of NaN logits gives 0 (x row 3 holds one), and a
// second call gives the same (the count is left zero).
TEST(CudaGemv, FusedGreedyPickIsGreedyPickOfTheLogits) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  if (!gemv_fuses_pick({.rows = 1, .n = 8, .k = 8, .epilogue = GemvEpilogue::kStoreF32, .shape = kGemvBulkShape},
                       ctx.device()))
    GTEST_SKIP() << "no shared-memory ring on this GPU";
  const int64_t k = 2048, n = 5003, words = (n + 31) / 32;
  constexpr int kSlots = 3;
  std::vector<float> w = random_bf16(n * k, 81, 0.05f), h = random_bf16(4 * k, 82, 2.0f), bias(n, 0.0f);
  std::copy(w.begin() + 17 * k, w.begin() + 18 * k, w.begin() + 4001 * k);
  bias[17] = bias[4001] = 64.0f;
  bias[5] = 128.0f;
  w[5 * k + 9] = NAN;
  h[3 * k + 100] = NAN;
  std::vector<uint32_t> seen(size_t(4 * words), 0u);
  seen[1 * words + 17 / 32] |= 1u << (17 % 32);  // row 1 holds 17 and 4001: both penalized below the rest
  seen[1 * words + 4001 / 32] |= 1u << (4001 % 32);
  DeviceBuffer dw = upload_bf16(ctx, w), dh = upload(ctx, h), db = upload_bf16(ctx, bias);
  DeviceBuffer dnorm = upload_bf16(ctx, random_bf16(k, 83)), dseen = upload(ctx, seen);
  DeviceBuffer slots = upload(ctx, std::vector<GemvPickSlot>(size_t(kGemvPickSlots)));
  DeviceBuffer count = upload(ctx, std::vector<unsigned>{0u});
  auto ring = PinnedBuffer::alloc(ctx.device(), 4 * kSlots * sizeof(int32_t));
  ASSERT_TRUE(ring.is_ok()) << ring.status().message();
  auto* host = static_cast<int32_t*>(ring->data());
  const std::vector<int32_t> pos0 = {0, 4, 8, 2};
  struct Out {
    std::vector<int32_t> next, tokens, positions, host;
  };
  // The picks and the feed's writes, fused (ring kib, per_sm) or by greedy_pick on the stored logits (kib 0).
  auto run = [&](int64_t rows, uint16_t kib, uint8_t per_sm) {
    DeviceBuffer logits = upload(ctx, std::vector<float>(size_t(rows * n))), next = upload(ctx, std::vector<int32_t>(4, -1));
    DeviceBuffer tokens = upload(ctx, std::vector<int32_t>(4, -1)), positions = upload(ctx, pos0);
    std::fill(host, host + 4 * kSlots, -1);
    const GreedyFeed feed{.tokens = dptr<int32_t>(tokens), .positions = dptr<int32_t>(positions),
                          .host_ring = static_cast<int32_t*>(ring->device_data()), .ring_slots = kSlots};
    const SeenPenalty pen{.seen = dptr<uint32_t>(dseen), .stride = words, .penalty = 32.0f};
    GemvArgs g{.w = dptr<bf16_bits>(dw), .bias = dptr<bf16_bits>(db), .out = logits.data(), .rows = rows, .n = n,
               .k = k, .epilogue = GemvEpilogue::kStoreF32, .x_f32 = dptr<float>(dh), .norm_w = dptr<bf16_bits>(dnorm),
               .shape = kGemvBulkShape, .ring_kib = kib, .blocks_per_sm = per_sm};
    if (kib > 0) {
      g.pick = {.next = dptr<int32_t>(next), .feed = feed, .penalty = pen, .slots = dptr<GemvPickSlot>(slots),
                .count = dptr<unsigned>(count)};
    }
    Status st = gemv(ctx, g);
    EXPECT_TRUE(st.is_ok()) << st.message();
    if (kib == 0) {
      st = greedy_pick(ctx, {.logits = dptr<float>(logits), .next = dptr<int32_t>(next), .rows = rows, .vocab = n,
                             .feed = feed, .penalty = pen});
      EXPECT_TRUE(st.is_ok()) << st.message();
    }
    EXPECT_TRUE(ctx.synchronize().is_ok());
    return Out{download<int32_t>(ctx, next, 4), download<int32_t>(ctx, tokens, 4), download<int32_t>(ctx, positions, 4),
               std::vector<int32_t>(host, host + 4 * kSlots)};
  };
  for (int64_t rows : {1, 2, 3, 4}) {
    const Out want = run(rows, 0, 0);
    EXPECT_EQ(want.next[0], 17);
    if (rows > 1) EXPECT_TRUE(want.next[1] != 17 && want.next[1] != 4001) << want.next[1];
    if (rows > 3) EXPECT_EQ(want.next[3], 0);
    for (auto [kib, per_sm] : {std::pair<uint16_t, uint8_t>{96, 2}, {32, 1}, {48, 3}, {96, 2}}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows, ring " << kib << " KiB " << int(per_sm) << "/SM");
      const Out got = run(rows, kib, per_sm);
      EXPECT_EQ(got.next, want.next);
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.positions, want.positions);
      EXPECT_EQ(got.host, want.host);
    }
  }
  EXPECT_EQ(download<unsigned>(ctx, count, 1)[0], 0u);
  GemvArgs bad{.w = dptr<bf16_bits>(dw), .out = slots.data(), .rows = 1, .n = n, .k = k,
               .epilogue = GemvEpilogue::kStoreBf16, .x_f32 = dptr<float>(dh), .shape = kGemvBulkShape};
  bad.pick = {.next = dptr<int32_t>(count), .slots = dptr<GemvPickSlot>(slots), .count = dptr<unsigned>(count)};
  const Status st = gemv(ctx, bad);
  EXPECT_NE(st.message().find("a fused pick needs"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace lathe::cuda
