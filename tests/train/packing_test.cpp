// First-fit-decreasing packing against a plain quadratic FFD written here,
// plus its invariants: every example placed once, no row over capacity.
#include <gtest/gtest.h>

#include <algorithm>

#include "train/batcher.h"
#include "train/packing.h"

namespace lathe {
namespace {

// Obviously-right FFD: sort by length (ties by index), scan rows from the first.
std::vector<std::vector<int32_t>> naive_ffd(const std::vector<int32_t>& lengths, int32_t capacity) {
  std::vector<int32_t> order(lengths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int32_t>> rows;
  std::vector<int32_t> used;
  for (int32_t e : order) {
    size_t r = 0;
    while (r < rows.size() && used[r] + lengths[e] > capacity) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.push_back(0);
    }
    rows[r].push_back(e);
    used[r] += lengths[e];
  }
  return rows;
}

TEST(Packing, SmallCaseByHand) {
  std::vector<int32_t> lengths = {5, 4, 3, 3, 2, 1};
  auto rows = pack_first_fit_decreasing(lengths, 8);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].examples, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(rows[1].examples, (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(rows[2].examples, (std::vector<int32_t>{4}));
  EXPECT_EQ(rows[0].n_tokens, 8);
  EXPECT_EQ(rows[1].n_tokens, 8);
  EXPECT_EQ(rows[2].n_tokens, 2);
  EXPECT_DOUBLE_EQ(packing_fill(rows, 8), 18.0 / 24.0);
}

TEST(Packing, MatchesNaiveFfdAndKeepsInvariants) {
  SplitMix64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    int32_t capacity = 16 + static_cast<int32_t>(rng.below(500));
    auto n = static_cast<size_t>(rng.below(400));
    std::vector<int32_t> lengths(n);
    for (auto& l : lengths) l = 1 + static_cast<int32_t>(rng.below(trial % 2 ? static_cast<uint64_t>(capacity) : 20));
    auto rows = pack_first_fit_decreasing(lengths, capacity);
    auto want = naive_ffd(lengths, capacity);
    ASSERT_EQ(rows.size(), want.size());
    std::vector<int> seen(n, 0);
    for (size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(rows[r].examples, want[r]) << "trial " << trial << " row " << r;
      int32_t sum = 0;
      for (int32_t e : rows[r].examples) {
        sum += lengths[static_cast<size_t>(e)];
        ++seen[static_cast<size_t>(e)];
      }
      EXPECT_EQ(sum, rows[r].n_tokens);
      EXPECT_LE(sum, capacity);
      EXPECT_FALSE(rows[r].examples.empty());
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  }
}

TEST(Packing, OneExamplePerRow) {
  std::vector<int32_t> lengths = {3, 1, 2};
  auto rows = one_example_per_row(lengths);
  ASSERT_EQ(rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rows[i].examples, std::vector<int32_t>{static_cast<int32_t>(i)});
    EXPECT_EQ(rows[i].n_tokens, lengths[i]);
  }
}

}  // namespace
}  // namespace lathe
