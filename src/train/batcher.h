// Batches for the trainer: rows (packed or one example each) shuffled per
// epoch with lathe's own PRNG, grouped into global batches of
// global_batch_size rows = micro_batch_size x grad_accum x dp_world_size, and
// handed out as this rank's micro batches in the flat varlen layout the
// attention kernels take: all tokens of a micro batch in one list, document
// boundaries in cu_seqlens, positions restarting at 0 per document, and
// labels already shifted (labels[j] is the token predicted at position j).
//
// Determinism: the permutation of epoch e depends only on (seed, e, n_rows),
// through splitmix64 and an unbiased bounded draw, never on the platform's
// std:: distributions. SamplerState {seed, epoch, index} restores the exact
// batch sequence, for checkpoints. An epoch's last partial global batch is
// dropped (NeMo's drop_last).
//
// The loss is normalized as the mean over all supervised tokens of the
// global batch, so each GlobalBatch carries that count over every rank's
// share (computed locally: every rank holds the whole index).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "train/example.h"
#include "train/packing.h"

namespace lathe {

constexpr int32_t kIgnoreIndex = -100;  // labels value for "no loss here"

// splitmix64: a tiny, well-mixed generator whose output is the same everywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t bound);  // uniform in [0, bound), bound > 0 (Lemire's method)

 private:
  uint64_t state_;
};

// The permutation of [0, n) for an epoch (Fisher-Yates).
std::vector<int32_t> epoch_permutation(uint64_t seed, int64_t epoch, int32_t n);

struct BatchOptions {
  int32_t seq_length = 2048;        // data.seq_length
  int32_t micro_batch_size = 1;     // data.micro_batch_size: rows per micro batch
  int32_t global_batch_size = 1;    // data.global_batch_size: rows per optimizer step, all ranks
  int32_t dp_world_size = 1;        // data-parallel ranks
  int32_t dp_rank = 0;
  uint64_t seed = 1234;             // data.seed
  bool shuffle = true;              // data.shuffle
  bool pad_to_seq_length = false;   // pad each row to seq_length (fixed shapes); padding is its own document
  int32_t pad_id = 0;
  int32_t grad_accum() const { return global_batch_size / (micro_batch_size * dp_world_size); }
  Status validate() const;
};

// Where the sampler stands: the next global batch is number `index` of epoch
// `epoch`. n_rows guards against resuming on different data.
struct SamplerState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t index = 0;
  int64_t n_rows = 0;
  bool operator==(const SamplerState&) const = default;
};
nlohmann::json to_json(const SamplerState& s);
Result<SamplerState> sampler_state_from_json(const nlohmann::json& j);

struct MicroBatch {
  int32_t n_rows = 0;
  std::vector<int32_t> input_ids;     // [n_tokens]
  std::vector<int32_t> labels;        // [n_tokens] next token of the same document, or kIgnoreIndex
  std::vector<int32_t> position_ids;  // [n_tokens], 0 at each document's first token
  std::vector<int32_t> cu_seqlens;    // [n_docs + 1], document starts in the flat tokens, then n_tokens
  std::vector<int32_t> row_starts;    // [n_rows + 1], row starts in the flat tokens, then n_tokens
  int32_t max_seqlen = 0;             // longest document
  int64_t n_supervised = 0;           // labels != kIgnoreIndex
  int64_t n_tokens() const { return static_cast<int64_t>(input_ids.size()); }
};

struct GlobalBatch {
  std::vector<MicroBatch> micro_batches;  // [grad_accum], this rank's share
  int64_t n_supervised = 0;               // over the whole global batch (all ranks): the loss divisor
  int64_t epoch = 0;
  int64_t index = 0;                      // global batch number within the epoch
};

// Builds one micro batch from rows; examples and rows are borrowed for the call.
MicroBatch make_micro_batch(std::span<const Example> examples, std::span<const PackedRow> rows,
                            std::span<const int32_t> row_ids, const BatchOptions& opt);

// Evaluation: every row once, in order, nothing dropped; micro batch k of
// micro_batch_size rows (the last may be smaller) goes to rank k % dp_world_size.
std::vector<MicroBatch> eval_micro_batches(std::span<const Example> examples, std::span<const PackedRow> rows,
                                           const BatchOptions& opt);

class BatchIterator {
 public:
  // examples and rows are borrowed and must outlive the iterator.
  static Result<BatchIterator> create(std::span<const Example> examples, std::span<const PackedRow> rows,
                                      const BatchOptions& options);

  GlobalBatch next();
  SamplerState state() const { return {options_.seed, epoch_, index_, static_cast<int64_t>(rows_.size())}; }
  Status restore(const SamplerState& s);
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

 private:
  void start_epoch(int64_t epoch);

  std::span<const Example> examples_;
  std::span<const PackedRow> rows_;
  BatchOptions options_;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  std::vector<int32_t> order_;  // [n_rows] the current epoch's row order
};

}  // namespace lathe
