// The checkpoint manager: when the trainer asks it to save, it copies the
// state into a host staging buffer (the only time the training loop is
// blocked) and a background thread writes the checkpoint, then points
// `last` at it, then deletes checkpoints that fell out of the top k. At
// most one save is in flight: the next save() first waits for the previous
// one, so memory stays bounded at one staging copy.
//
// Failure rules: `last` is written only after COMMITTED, and an old
// checkpoint is deleted only after a new one is committed, so a crash or a
// failed write at any point leaves `last` naming a complete checkpoint. A
// failed background write is logged at once and returned by the next
// save() or wait(); its partial directory is removed.
//
// Threads: save(), wait() and the rest are called from the training thread;
// the writer thread only touches the staging buffer and Storage.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/status.h"
#include "train/checkpoint.h"

namespace lathe {

struct CheckpointPolicy {
  std::string dir;                 // checkpoints root: a path or s3://bucket/prefix
  int64_t save_top_k = 2;          // -1: keep all
  std::string monitor = "val_loss";  // lower is better; checkpoints without it rank last
  bool save_last = true;           // keep the newest besides the top k
  bool async_save = true;
  int64_t file_delay_ms = 0;       // test knob (env LATHE_CHECKPOINT_WRITE_DELAY_MS)
  std::FILE* log = stderr;         // borrowed: save failures and removals
};

// What a run's checkpoints share (written into every one).
struct CheckpointRunInfo {
  bool full_sft = false;
  LoraConfig lora;
  BaseModelRef base_model;
  std::string recipe_yaml;
  std::vector<std::pair<std::string, std::string>> extra_files;  // tokenizer files: name, bytes
};

// One tensor of the state; data is borrowed for the save() call only.
struct StateTensor {
  std::string name;
  Shape shape;
  std::span<const float> data;
};

struct CheckpointSnapshot {
  int64_t step = 0;
  std::map<std::string, double> metrics;  // val_loss, train_loss
  std::vector<StateTensor> model;
  std::vector<StateTensor> optim;
  std::string trainer_state_json;
};

struct SaveTiming {
  double stall_ms = 0;        // save() time: waiting for the previous save + the staging copy
  double write_s = 0;         // background write, COMMITTED and `last` included
  int64_t bytes = 0;          // bytes written
};

class CheckpointManager {
 public:
  // Opens (creates) the root and lists the committed checkpoints already
  // there, so top-k ranking includes them. root: the Storage to use instead
  // of opening policy.dir (tests inject failures through it); taken.
  static Result<std::unique_ptr<CheckpointManager>> open(const CheckpointPolicy& policy, CheckpointRunInfo run,
                                                         std::unique_ptr<Storage> root = nullptr);
  ~CheckpointManager();  // waits for a save in flight

  // Copies the snapshot into staging and starts the write (or writes it
  // before returning, without async_save). Returns the error of a previous
  // save that failed, or of this one when synchronous.
  Status save(const CheckpointSnapshot& s);
  // Waits for the save in flight; its error, if any.
  Status wait();
  // Allocates (and touches) the staging buffer for n_floats of state now, so
  // the first save() does not pay for it inside the training loop.
  void reserve(int64_t n_floats);

  // The newest committed checkpoint's url (by step; `last` agrees unless a
  // run died between COMMITTED and `last`), or "" when there is none.
  std::string newest_committed() const;
  // Removes checkpoint directories without COMMITTED (a save that was
  // killed); returns their names.
  Result<std::vector<std::string>> remove_uncommitted();

  const std::string& root_url() const { return root_url_; }
  SaveTiming last_timing() const { return timing_; }  // of the last finished save
  std::vector<std::string> kept() const;              // committed names, by step

 private:
  struct Known {
    std::string name;
    int64_t step = 0;
    double metric = 0;
    bool has_metric = false;
  };
  CheckpointManager() = default;
  Status write_staged();  // on the writer thread (or inline)
  Status prune();
  void stage(const CheckpointSnapshot& s);

  CheckpointPolicy policy_;
  CheckpointRunInfo run_;
  std::unique_ptr<Storage> root_;
  std::string root_url_;
  std::vector<Known> known_;  // committed checkpoints, oldest first

  std::vector<float> staging_;  // [every model tensor | every optim tensor]
  CheckpointContents pending_;  // slices point into staging_
  std::string pending_name_;
  std::thread writer_;
  Status writer_status_;
  SaveTiming timing_, pending_timing_;
};

}  // namespace lathe
