// The sampler and micro batches: splitmix64 against its published vectors,
// permutations, the varlen layout (positions restart, labels never cross a
// document), data-parallel shares, and exact resume from a saved state.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "train/batcher.h"

namespace lathe {
namespace {

Example make_example(std::vector<int32_t> ids, std::vector<uint8_t> mask) { return {std::move(ids), std::move(mask)}; }

std::vector<Example> random_examples(int n, int32_t max_len, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<Example> out;
  for (int i = 0; i < n; ++i) {
    auto len = 2 + static_cast<int32_t>(rng.below(static_cast<uint64_t>(max_len - 1)));
    Example e;
    for (int32_t j = 0; j < len; ++j) {
      e.input_ids.push_back(static_cast<int32_t>(rng.below(1000)));
      e.loss_mask.push_back(j > 0 && rng.below(3) != 0);
    }
    e.loss_mask.back() = 1;
    out.push_back(std::move(e));
  }
  return out;
}

TEST(SplitMix64, MatchesReferenceVector) {
  // splitmix64 seeded with 1234567 (Vigna's reference generator).
  SplitMix64 rng(1234567);
  EXPECT_EQ(rng.next(), 6457827717110365317ULL);
  EXPECT_EQ(rng.next(), 3203168211198807973ULL);
  EXPECT_EQ(rng.next(), 9817491932198370423ULL);
  EXPECT_EQ(rng.next(), 4593380528125082431ULL);
  EXPECT_EQ(rng.next(), 16408922859458223821ULL);
}

TEST(SplitMix64, BelowStaysInRangeAndCoversIt) {
  SplitMix64 rng(1);
  std::vector<int> hits(7, 0);
  for (int i = 0; i < 7000; ++i) {
    uint64_t v = rng.below(7);
    ASSERT_LT(v, 7u);
    ++hits[v];
  }
  for (int h : hits) EXPECT_GT(h, 800);  // ~1000 each
}

TEST(EpochPermutation, IsAPermutationFixedBySeedAndEpoch) {
  auto p = epoch_permutation(42, 0, 1000);
  std::vector<int32_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int32_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_EQ(p, epoch_permutation(42, 0, 1000));
  EXPECT_NE(p, epoch_permutation(42, 1, 1000));
  EXPECT_NE(p, epoch_permutation(43, 0, 1000));
}

TEST(MicroBatch, VarlenLayoutWithRestartingPositions) {
  std::vector<Example> ex = {make_example({10, 11, 12}, {0, 1, 1}), make_example({20, 21}, {0, 1}),
                             make_example({30, 31, 32, 33}, {0, 0, 1, 1})};
  std::vector<PackedRow> rows = {{{0, 1}, 5}, {{2}, 4}};
  BatchOptions opt{.seq_length = 6, .micro_batch_size = 2, .global_batch_size = 2};
  std::vector<int32_t> ids = {0, 1};
  MicroBatch mb = make_micro_batch(ex, rows, ids, opt);
  const int32_t I = kIgnoreIndex;
  EXPECT_EQ(mb.n_rows, 2);
  EXPECT_EQ(mb.input_ids, (std::vector<int32_t>{10, 11, 12, 20, 21, 30, 31, 32, 33}));
  EXPECT_EQ(mb.position_ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 1, 2, 3}));
  EXPECT_EQ(mb.labels, (std::vector<int32_t>{11, 12, I, 21, I, I, 32, 33, I}));
  EXPECT_EQ(mb.cu_seqlens, (std::vector<int32_t>{0, 3, 5, 9}));
  EXPECT_EQ(mb.row_starts, (std::vector<int32_t>{0, 5, 9}));
  EXPECT_EQ(mb.max_seqlen, 4);
  EXPECT_EQ(mb.n_supervised, 5);

  opt.pad_to_seq_length = true;
  opt.pad_id = 7;
  MicroBatch padded = make_micro_batch(ex, rows, ids, opt);
  EXPECT_EQ(padded.input_ids, (std::vector<int32_t>{10, 11, 12, 20, 21, 7, 30, 31, 32, 33, 7, 7}));
  EXPECT_EQ(padded.position_ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(padded.labels, (std::vector<int32_t>{11, 12, I, 21, I, I, I, 32, 33, I, I, I}));
  EXPECT_EQ(padded.cu_seqlens, (std::vector<int32_t>{0, 3, 5, 6, 10, 12}));
  EXPECT_EQ(padded.row_starts, (std::vector<int32_t>{0, 6, 12}));
  EXPECT_EQ(padded.n_supervised, 5);
}

// Every row's tokens, labels and positions, flattened, to compare batches.
std::vector<int32_t> flatten(const GlobalBatch& gb) {
  std::vector<int32_t> out = {static_cast<int32_t>(gb.epoch), static_cast<int32_t>(gb.index)};
  for (const MicroBatch& mb : gb.micro_batches) {
    for (const auto* v : {&mb.input_ids, &mb.labels, &mb.position_ids, &mb.cu_seqlens, &mb.row_starts})
      out.insert(out.end(), v->begin(), v->end());
  }
  return out;
}

TEST(BatchIterator, EachEpochUsesDistinctRowsAndCountsTargets) {
  auto ex = random_examples(23, 40, 3);
  auto rows = pack_first_fit_decreasing(example_lengths(ex), 64);
  BatchOptions opt{.seq_length = 64, .micro_batch_size = 1, .global_batch_size = 2, .seed = 9};
  auto it = BatchIterator::create(ex, rows, opt);
  ASSERT_TRUE(it.is_ok()) << it.status().message();
  int64_t bpe = it->batches_per_epoch();
  ASSERT_EQ(bpe, static_cast<int64_t>(rows.size()) / 2);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::multiset<int32_t> firsts;  // a row's first token and length identify it here
    for (int64_t b = 0; b < bpe; ++b) {
      GlobalBatch gb = it->next();
      EXPECT_EQ(gb.epoch, epoch);
      EXPECT_EQ(gb.index, b);
      ASSERT_EQ(gb.micro_batches.size(), 2u);
      int64_t sum = 0;
      for (const MicroBatch& mb : gb.micro_batches) {
        sum += mb.n_supervised;
        int64_t labelled =
            std::count_if(mb.labels.begin(), mb.labels.end(), [](int32_t l) { return l != kIgnoreIndex; });
        EXPECT_EQ(labelled, mb.n_supervised);
        for (size_t d = 0; d + 1 < mb.cu_seqlens.size(); ++d) {
          EXPECT_EQ(mb.position_ids[static_cast<size_t>(mb.cu_seqlens[d])], 0);
          EXPECT_EQ(mb.labels[static_cast<size_t>(mb.cu_seqlens[d + 1] - 1)], kIgnoreIndex);  // never crosses
        }
        EXPECT_LE(mb.n_tokens(), 64);
        firsts.insert(mb.input_ids[0] * 1000 + static_cast<int32_t>(mb.n_tokens()));
      }
      EXPECT_EQ(gb.n_supervised, sum);
    }
    EXPECT_EQ(firsts.size(), static_cast<size_t>(2 * bpe));
    std::set<int32_t> distinct(firsts.begin(), firsts.end());
    EXPECT_EQ(distinct.size(), firsts.size());
  }
}

TEST(BatchIterator, DataParallelRanksSplitTheSameGlobalBatch) {
  auto ex = random_examples(40, 30, 5);
  auto rows = one_example_per_row(example_lengths(ex));
  BatchOptions one{.seq_length = 32, .micro_batch_size = 2, .global_batch_size = 8, .seed = 11};
  auto single = BatchIterator::create(ex, rows, one);
  ASSERT_TRUE(single.is_ok());
  std::vector<BatchIterator> ranks;
  for (int32_t r = 0; r < 2; ++r) {
    BatchOptions o = one;
    o.dp_world_size = 2;
    o.dp_rank = r;
    ranks.push_back(*BatchIterator::create(ex, rows, o));
  }
  for (int step = 0; step < 12; ++step) {
    GlobalBatch all = single->next();
    GlobalBatch r0 = ranks[0].next(), r1 = ranks[1].next();
    ASSERT_EQ(all.micro_batches.size(), 4u);
    ASSERT_EQ(r0.micro_batches.size(), 2u);
    EXPECT_EQ(r0.n_supervised, all.n_supervised);
    EXPECT_EQ(r1.n_supervised, all.n_supervised);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(r0.micro_batches[k].input_ids, all.micro_batches[2 * k].input_ids);
      EXPECT_EQ(r1.micro_batches[k].input_ids, all.micro_batches[2 * k + 1].input_ids);
    }
  }
}

TEST(BatchIterator, ResumeGivesIdenticalBatches) {
  auto ex = random_examples(50, 24, 8);
  auto rows = pack_first_fit_decreasing(example_lengths(ex), 48);
  BatchOptions opt{.seq_length = 48, .micro_batch_size = 2, .global_batch_size = 4, .seed = 2024};
  auto a = BatchIterator::create(ex, rows, opt);
  ASSERT_TRUE(a.is_ok());
  int64_t bpe = a->batches_per_epoch();
  ASSERT_GE(bpe, 2);
  for (int64_t i = 0; i < bpe + 1; ++i) a->next();  // into the second epoch
  std::string saved = to_json(a->state()).dump();
  std::vector<std::vector<int32_t>> want;
  for (int64_t i = 0; i < 2 * bpe; ++i) want.push_back(flatten(a->next()));

  BatchOptions other = opt;
  other.seed = 1;  // the saved state's seed wins
  auto b = BatchIterator::create(ex, rows, other);
  ASSERT_TRUE(b.is_ok());
  auto state = sampler_state_from_json(nlohmann::json::parse(saved));
  ASSERT_TRUE(state.is_ok()) << state.status().message();
  EXPECT_EQ(state->epoch, 1);
  EXPECT_EQ(state->index, 1);
  ASSERT_TRUE(b->restore(*state).is_ok());
  for (const auto& w : want) EXPECT_EQ(flatten(b->next()), w);
  EXPECT_EQ(a->state(), b->state());
}

TEST(BatchIterator, RejectsBadOptionsAndStates) {
  auto ex = random_examples(10, 8, 1);
  auto rows = one_example_per_row(example_lengths(ex));
  EXPECT_FALSE(
      BatchIterator::create(ex, rows, {.seq_length = 8, .micro_batch_size = 2, .global_batch_size = 3}).is_ok());
  EXPECT_FALSE(BatchIterator::create(ex, rows, {.seq_length = 8, .global_batch_size = 11}).is_ok());
  EXPECT_FALSE(BatchIterator::create(ex, rows, {.seq_length = 4, .global_batch_size = 1}).is_ok());  // rows too long
  EXPECT_FALSE(BatchIterator::create(ex, rows, {.seq_length = 8, .dp_world_size = 2, .dp_rank = 2}).is_ok());
  auto it = BatchIterator::create(ex, rows, {.seq_length = 8, .global_batch_size = 5});
  ASSERT_TRUE(it.is_ok());
  EXPECT_FALSE(it->restore({.seed = 1, .epoch = 0, .index = 0, .n_rows = 11}).is_ok());
  EXPECT_FALSE(it->restore({.seed = 1, .epoch = 0, .index = 3, .n_rows = 10}).is_ok());
  EXPECT_FALSE(sampler_state_from_json(nlohmann::json{{"seed", 1}}).is_ok());
}

TEST(BatchIterator, NoShuffleKeepsOrder) {
  auto ex = random_examples(6, 8, 2);
  auto rows = one_example_per_row(example_lengths(ex));
  auto it = BatchIterator::create(ex, rows, {.seq_length = 8, .global_batch_size = 3, .shuffle = false});
  ASSERT_TRUE(it.is_ok());
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < 6; i += 3) {
      GlobalBatch gb = it->next();
      for (size_t m = 0; m < 3; ++m) EXPECT_EQ(gb.micro_batches[m].input_ids, ex[i + m].input_ids);
    }
  }
}

TEST(EvalMicroBatches, CoverEveryRowOnceAcrossRanks) {
  auto ex = random_examples(11, 8, 4);
  auto rows = one_example_per_row(example_lengths(ex));
  int64_t want = 0;
  for (const Example& e : ex) want += e.n_targets();
  for (int32_t world : {1, 2, 3}) {
    int64_t supervised = 0, n_rows = 0;
    for (int32_t rank = 0; rank < world; ++rank) {
      BatchOptions o{.seq_length = 8, .micro_batch_size = 2, .dp_world_size = world, .dp_rank = rank};
      for (const MicroBatch& mb : eval_micro_batches(ex, rows, o)) {
        supervised += mb.n_supervised;
        n_rows += mb.n_rows;
      }
    }
    EXPECT_EQ(n_rows, 11) << "world " << world;
    EXPECT_EQ(supervised, want) << "world " << world;
  }
}

}  // namespace
}  // namespace lathe
