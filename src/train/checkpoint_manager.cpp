// The checkpoint manager (checkpoint_manager.h): staging copy, background
// write, `last`, top-k pruning. The staging copy runs across the OpenMP
// threads (memory bandwidth bound, so it is the stall to keep small); the
// writer thread owns the staging buffer until the save completes.
#include "train/checkpoint_manager.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/parallel.h"

namespace lathe {

using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::string join(const std::string& root, const std::string& name) {
  return !root.empty() && root.back() == '/' ? root + name : root + "/" + name;
}

void copy_parallel(float* dst, const float* src, int64_t n) {
  parallel_for(n, int64_t{1} << 20, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, size_t(e - b) * sizeof(float));
  });
}

// One checkpoint directory seen through the root's Storage: every path gets
// "<name>/" in front, so the whole save goes through one Storage object.
class PrefixedStorage final : public Storage {
 public:
  PrefixedStorage(Storage& base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}
  std::string url() const override { return base_.url_of(prefix_.substr(0, prefix_.size() - 1)); }
  Result<std::unique_ptr<StorageWriter>> open_writer(const std::string& path) override {
    return base_.open_writer(prefix_ + path);
  }
  Result<std::vector<uint8_t>> read(const std::string& path) override { return base_.read(prefix_ + path); }
  Result<std::vector<uint8_t>> read_range(const std::string& path, int64_t offset, int64_t n) override {
    return base_.read_range(prefix_ + path, offset, n);
  }
  Result<int64_t> size(const std::string& path) override { return base_.size(prefix_ + path); }
  Result<std::vector<StorageEntry>> list(const std::string& prefix) override {
    LATHE_ASSIGN_OR_RETURN(std::vector<StorageEntry> all, base_.list(prefix_ + prefix));
    for (StorageEntry& e : all) e.path = e.path.substr(prefix_.size());
    return all;
  }
  Result<std::vector<std::string>> list_dirs(const std::string& prefix) override {
    return base_.list_dirs(prefix_ + prefix);
  }
  Status remove(const std::string& path) override { return base_.remove(prefix_ + path); }
  Status remove_prefix(const std::string& prefix) override { return base_.remove_prefix(prefix_ + prefix); }

 private:
  Storage& base_;
  std::string prefix_;  // "step=000010/"
};

}  // namespace

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::open(const CheckpointPolicy& policy,
                                                                   CheckpointRunInfo run,
                                                                   std::unique_ptr<Storage> root) {
  std::unique_ptr<CheckpointManager> m(new CheckpointManager());
  m->policy_ = policy;
  m->run_ = std::move(run);
  if (root) {
    m->root_ = std::move(root);
  } else {
    LATHE_ASSIGN_OR_RETURN(m->root_, open_storage(policy.dir));
  }
  m->root_url_ = m->root_->url();
  LATHE_ASSIGN_OR_RETURN(std::vector<std::string> dirs, m->root_->list_dirs(""));
  for (const std::string& d : dirs) {
    const int64_t step = step_of_checkpoint_name(d);
    if (step < 0) continue;
    LATHE_ASSIGN_OR_RETURN(bool committed, m->root_->exists(d + "/" + kCheckpointCommittedFile));
    if (!committed) continue;
    Known k{.name = d, .step = step};
    // The metric comes from metadata.json; an unreadable one ranks last.
    if (Result<std::string> text = m->root_->read_text(d + "/" + kCheckpointMetadataFile); text.is_ok()) {
      if (Result<CheckpointMetadata> md = parse_checkpoint_metadata(*text, d); md.is_ok()) {
        k.step = md->step;
        if (auto it = md->metrics.find(policy.monitor); it != md->metrics.end())
          k.metric = it->second, k.has_metric = true;
      }
    }
    m->known_.push_back(k);
  }
  std::sort(m->known_.begin(), m->known_.end(), [](const Known& a, const Known& b) { return a.step < b.step; });
  return m;
}

CheckpointManager::~CheckpointManager() {
  if (writer_.joinable()) writer_.join();
}

std::string CheckpointManager::newest_committed() const {
  return known_.empty() ? std::string() : join(root_url_, known_.back().name);
}

std::vector<std::string> CheckpointManager::kept() const {
  std::vector<std::string> out;
  for (const Known& k : known_) out.push_back(k.name);
  return out;
}

Result<std::vector<std::string>> CheckpointManager::remove_uncommitted() {
  LATHE_TRY(wait());
  LATHE_ASSIGN_OR_RETURN(std::vector<std::string> dirs, root_->list_dirs(""));
  std::vector<std::string> removed;
  for (const std::string& d : dirs) {
    if (step_of_checkpoint_name(d) < 0) continue;
    LATHE_ASSIGN_OR_RETURN(bool committed, root_->exists(d + "/" + kCheckpointCommittedFile));
    if (committed) continue;
    LATHE_TRY(root_->remove_prefix(d + "/"));
    removed.push_back(d);
  }
  return removed;
}

Status CheckpointManager::wait() {
  if (writer_.joinable()) writer_.join();
  Status s = writer_status_;
  writer_status_ = Status::ok();
  return s;
}

void CheckpointManager::reserve(int64_t n_floats) {
  if (writer_.joinable()) writer_.join();  // the writer owns staging_ while a save is in flight
  if (int64_t(staging_.size()) < n_floats) staging_.resize(size_t(n_floats));
}

void CheckpointManager::stage(const CheckpointSnapshot& s) {
  int64_t total = 0;
  for (const StateTensor& t : s.model) total += int64_t(t.data.size());
  for (const StateTensor& t : s.optim) total += int64_t(t.data.size());
  if (int64_t(staging_.size()) < total) staging_.resize(size_t(total));  // reused from save to save

  pending_ = CheckpointContents{.step = s.step,
                                .metrics = s.metrics,
                                .full_sft = run_.full_sft,
                                .lora = run_.lora,
                                .base_model = run_.base_model,
                                .trainer_state_json = s.trainer_state_json,
                                .recipe_yaml = run_.recipe_yaml,
                                .extra_files = run_.extra_files,
                                .ranks = {RankShard{}}};
  float* at = staging_.data();
  auto put = [&](const std::vector<StateTensor>& from, std::vector<TensorSlice>* to) {
    for (const StateTensor& t : from) {
      copy_parallel(at, t.data.data(), int64_t(t.data.size()));
      to->push_back({t.name, t.shape, 0, std::span<const float>(at, t.data.size())});
      at += t.data.size();
    }
  };
  put(s.model, &pending_.ranks[0].model);
  put(s.optim, &pending_.ranks[0].optim);
  pending_name_ = checkpoint_name(s.step, s.metrics);
}

Status CheckpointManager::save(const CheckpointSnapshot& s) {
  const Clock::time_point t0 = Clock::now();
  LATHE_TRY(wait());
  stage(s);
  pending_timing_ = SaveTiming{.stall_ms = ms_since(t0)};
  if (!policy_.async_save) {
    writer_status_ = write_staged();
    return wait();
  }
  writer_ = std::thread([this] { writer_status_ = write_staged(); });
  return Status::ok();
}

Status CheckpointManager::write_staged() {
  const Clock::time_point t0 = Clock::now();
  const std::string name = pending_name_;
  Status s = [&]() -> Status {
    LATHE_TRY(root_->remove_prefix(name + "/"));  // leftovers of an earlier, interrupted save of this step
    PrefixedStorage ckpt(*root_, name + "/");
    LATHE_TRY(write_checkpoint(ckpt, pending_, {.file_delay_ms = policy_.file_delay_ms}));
    LATHE_TRY(root_->write_text(kCheckpointLastFile, name + "\n"));
    return Status::ok();
  }();
  if (!s.is_ok()) {
    std::fprintf(policy_.log, "error: checkpoint %s was not saved: %s\n", join(root_url_, name).c_str(),
                 s.message().c_str());
    std::fflush(policy_.log);
    (void)root_->remove_prefix(name + "/");  // best effort: never leave a partial one behind
    return s.with_context("checkpoint " + join(root_url_, name));
  }
  Known k{.name = name, .step = pending_.step};
  if (auto it = pending_.metrics.find(policy_.monitor); it != pending_.metrics.end())
    k.metric = it->second, k.has_metric = true;
  std::erase_if(known_, [&](const Known& o) { return o.name == name; });
  known_.push_back(k);
  std::sort(known_.begin(), known_.end(), [](const Known& a, const Known& b) { return a.step < b.step; });
  Status p = prune();
  pending_timing_.write_s = ms_since(t0) / 1000.0;
  for (const TensorSlice& t : pending_.ranks[0].model) pending_timing_.bytes += int64_t(t.data.size_bytes());
  for (const TensorSlice& t : pending_.ranks[0].optim) pending_timing_.bytes += int64_t(t.data.size_bytes());
  timing_ = pending_timing_;
  return p;
}

// Keeps the best save_top_k by monitor (ties and missing metrics: newer
// first) and, with save_last, the newest. COMMITTED goes first, so a crash
// mid-delete leaves an uncommitted directory, which the next start removes.
Status CheckpointManager::prune() {
  if (policy_.save_top_k < 0 || known_.empty()) return Status::ok();
  std::vector<const Known*> ranked;
  for (const Known& k : known_) ranked.push_back(&k);
  std::stable_sort(ranked.begin(), ranked.end(), [](const Known* a, const Known* b) {
    if (a->has_metric != b->has_metric) return a->has_metric;
    if (a->has_metric && a->metric != b->metric) return a->metric < b->metric;
    return a->step > b->step;
  });
  std::vector<std::string> keep;
  for (size_t i = 0; i < ranked.size() && int64_t(i) < policy_.save_top_k; ++i) keep.push_back(ranked[i]->name);
  if (policy_.save_last) keep.push_back(known_.back().name);
  std::vector<Known> still;
  for (const Known& k : known_)
    if (std::find(keep.begin(), keep.end(), k.name) != keep.end()) still.push_back(k);
  // Without save_last the newest may fall out: `last` moves to the newest kept before anything goes.
  if (!still.empty() && still.back().name != known_.back().name)
    LATHE_TRY(root_->write_text(kCheckpointLastFile, still.back().name + "\n"));
  if (still.empty()) LATHE_TRY(root_->remove(kCheckpointLastFile));
  for (const Known& k : known_) {
    if (std::find(keep.begin(), keep.end(), k.name) != keep.end()) continue;
    LATHE_TRY(root_->remove(k.name + "/" + kCheckpointCommittedFile));
    LATHE_TRY(root_->remove_prefix(k.name + "/"));
  }
  known_ = std::move(still);
  return Status::ok();
}

}  // namespace lathe
