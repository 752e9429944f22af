// Sampler and micro-batch assembly for training; see batcher.h. Global batch
// b of an epoch is rows order[b*G, (b+1)*G) of that epoch's permutation;
// within it, micro step m spans micro_batch_size x dp_world_size rows of
// which rank r takes its micro_batch_size (Megatron's order), so the same
// rows train whatever the rank count, only their placement differs.
#include "train/batcher.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace lathe {

uint64_t SplitMix64::next() {
  state_ += 0x9E3779B97F4A7C15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::below(uint64_t bound) {
  // Multiply-shift with rejection of the biased low range (Lemire 2019).
  unsigned __int128 m = static_cast<unsigned __int128>(next()) * bound;
  auto low = static_cast<uint64_t>(m);
  if (low < bound) {
    uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next()) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

std::vector<int32_t> epoch_permutation(uint64_t seed, int64_t epoch, int32_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  uint64_t stream = SplitMix64(seed).next() + static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ULL;
  SplitMix64 rng(SplitMix64(stream).next());
  for (int32_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int32_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

Status BatchOptions::validate() const {
  if (seq_length < 2) return invalid_argument("data.seq_length must be at least 2, got ", seq_length);
  if (micro_batch_size < 1) return invalid_argument("data.micro_batch_size must be at least 1, got ", micro_batch_size);
  if (dp_world_size < 1 || dp_rank < 0 || dp_rank >= dp_world_size)
    return invalid_argument("data-parallel rank ", dp_rank, " is outside world size ", dp_world_size);
  int64_t per_step = int64_t{micro_batch_size} * dp_world_size;
  if (global_batch_size < 1 || global_batch_size % per_step != 0)
    return invalid_argument("data.global_batch_size (", global_batch_size, ") must be a positive multiple of ",
                            "data.micro_batch_size x data-parallel size (", micro_batch_size, " x ", dp_world_size,
                            " = ", per_step, ")");
  if (pad_id < 0) return invalid_argument("pad id must be a token id, got ", pad_id);
  return Status::ok();
}

nlohmann::json to_json(const SamplerState& s) {
  return {{"seed", s.seed}, {"epoch", s.epoch}, {"index", s.index}, {"n_rows", s.n_rows}};
}

Result<SamplerState> sampler_state_from_json(const nlohmann::json& j) {
  SamplerState s;
  if (!j.is_object()) return invalid_argument("sampler state: expected an object");
  for (const char* key : {"seed", "epoch", "index", "n_rows"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer())
      return invalid_argument("sampler state: \"", key, "\" is missing or not an integer");
  }
  s.seed = j["seed"].get<uint64_t>();
  s.epoch = j["epoch"].get<int64_t>();
  s.index = j["index"].get<int64_t>();
  s.n_rows = j["n_rows"].get<int64_t>();
  return s;
}

namespace {

// Appends one document (or the padding segment when ex is null).
void append_document(const Example* ex, int32_t pad_len, const BatchOptions& opt, MicroBatch& mb) {
  auto start = static_cast<int32_t>(mb.input_ids.size());
  mb.cu_seqlens.push_back(start);
  int32_t len = ex ? static_cast<int32_t>(ex->input_ids.size()) : pad_len;
  for (int32_t j = 0; j < len; ++j) {
    auto uj = static_cast<size_t>(j);
    mb.input_ids.push_back(ex ? ex->input_ids[uj] : opt.pad_id);
    mb.position_ids.push_back(j);
    bool target = ex && j + 1 < len && ex->loss_mask[uj + 1] != 0;
    mb.labels.push_back(target ? ex->input_ids[uj + 1] : kIgnoreIndex);
    mb.n_supervised += target;
  }
  mb.max_seqlen = std::max(mb.max_seqlen, len);
}

}  // namespace

MicroBatch make_micro_batch(std::span<const Example> examples, std::span<const PackedRow> rows,
                            std::span<const int32_t> row_ids, const BatchOptions& opt) {
  MicroBatch mb;
  mb.n_rows = static_cast<int32_t>(row_ids.size());
  for (int32_t r : row_ids) {
    const PackedRow& row = rows[static_cast<size_t>(r)];
    mb.row_starts.push_back(static_cast<int32_t>(mb.input_ids.size()));
    for (int32_t e : row.examples) append_document(&examples[static_cast<size_t>(e)], 0, opt, mb);
    if (opt.pad_to_seq_length && row.n_tokens < opt.seq_length)
      append_document(nullptr, opt.seq_length - row.n_tokens, opt, mb);
  }
  mb.row_starts.push_back(static_cast<int32_t>(mb.input_ids.size()));
  mb.cu_seqlens.push_back(static_cast<int32_t>(mb.input_ids.size()));
  return mb;
}

std::vector<MicroBatch> eval_micro_batches(std::span<const Example> examples, std::span<const PackedRow> rows,
                                           const BatchOptions& opt) {
  std::vector<int32_t> all(rows.size());
  std::iota(all.begin(), all.end(), 0);
  std::vector<MicroBatch> out;
  auto mbs = static_cast<size_t>(opt.micro_batch_size);
  for (size_t k = 0, start = 0; start < all.size(); ++k, start += mbs) {
    if (static_cast<int32_t>(k % static_cast<size_t>(opt.dp_world_size)) != opt.dp_rank) continue;
    std::span<const int32_t> ids(all.data() + start, std::min(mbs, all.size() - start));
    out.push_back(make_micro_batch(examples, rows, ids, opt));
  }
  return out;
}

Result<BatchIterator> BatchIterator::create(std::span<const Example> examples, std::span<const PackedRow> rows,
                                            const BatchOptions& options) {
  LATHE_TRY(options.validate());
  for (size_t i = 0; i < rows.size(); ++i) {
    int32_t n = 0;
    for (int32_t e : rows[i].examples) {
      if (e < 0 || static_cast<size_t>(e) >= examples.size())
        return invalid_argument("batcher: row ", i, " refers to example ", e, " of ", examples.size());
      const Example& ex = examples[static_cast<size_t>(e)];
      if (ex.loss_mask.size() != ex.input_ids.size())
        return invalid_argument("batcher: example ", e, " has mismatched ids and loss mask");
      n += static_cast<int32_t>(ex.input_ids.size());
    }
    if (n != rows[i].n_tokens || n > options.seq_length)
      return invalid_argument("batcher: row ", i, " holds ", n, " tokens, more than seq_length ", options.seq_length,
                              " or not its recorded ", rows[i].n_tokens);
  }
  BatchIterator it;
  it.examples_ = examples;
  it.rows_ = rows;
  it.options_ = options;
  it.batches_per_epoch_ = static_cast<int64_t>(rows.size()) / options.global_batch_size;
  if (it.batches_per_epoch_ == 0)
    return invalid_argument("data: ", rows.size(), " rows (sequences after packing) are fewer than ",
                            "data.global_batch_size=", options.global_batch_size, "; lower it or add data");
  it.start_epoch(0);
  return it;
}

void BatchIterator::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  index_ = 0;
  auto n = static_cast<int32_t>(rows_.size());
  if (options_.shuffle) {
    order_ = epoch_permutation(options_.seed, epoch, n);
  } else {
    order_.resize(static_cast<size_t>(n));
    std::iota(order_.begin(), order_.end(), 0);
  }
}

Status BatchIterator::restore(const SamplerState& s) {
  if (s.n_rows != static_cast<int64_t>(rows_.size()))
    return invalid_argument("sampler state: saved for ", s.n_rows, " rows but the data set now has ", rows_.size(),
                            " (different data, seq_length or packing)");
  if (s.epoch < 0 || s.index < 0 || s.index > batches_per_epoch_)
    return invalid_argument("sampler state: epoch ", s.epoch, " index ", s.index, " is out of range (",
                            batches_per_epoch_, " batches per epoch)");
  options_.seed = s.seed;
  start_epoch(s.epoch);
  index_ = s.index;
  return Status::ok();
}

GlobalBatch BatchIterator::next() {
  if (index_ >= batches_per_epoch_) start_epoch(epoch_ + 1);
  const BatchOptions& o = options_;
  GlobalBatch gb;
  gb.epoch = epoch_;
  gb.index = index_;
  int64_t base = index_ * o.global_batch_size;
  std::span<const int32_t> batch_rows(order_.data() + base, static_cast<size_t>(o.global_batch_size));
  for (int32_t r : batch_rows) {
    for (int32_t e : rows_[static_cast<size_t>(r)].examples) {
      const Example& ex = examples_[static_cast<size_t>(e)];
      for (size_t j = 1; j < ex.loss_mask.size(); ++j) gb.n_supervised += ex.loss_mask[j] != 0;
    }
  }
  size_t per_step = static_cast<size_t>(o.micro_batch_size) * static_cast<size_t>(o.dp_world_size);
  for (int32_t m = 0; m < o.grad_accum(); ++m) {
    size_t offset = static_cast<size_t>(m) * per_step + static_cast<size_t>(o.dp_rank * o.micro_batch_size);
    auto mine = batch_rows.subspan(offset, static_cast<size_t>(o.micro_batch_size));
    gb.micro_batches.push_back(make_micro_batch(examples_, rows_, mine, o));
  }
  ++index_;
  return gb;
}

}  // namespace lathe
