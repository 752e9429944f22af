// Training checkpoints: the on-disk (or in-bucket) format, its writer and
// its verified readers. Everything goes through Storage, so a checkpoint
// root may be a local directory or "s3://bucket/prefix" alike.
//
// Layout of one checkpoint, <root>/step=000500-val_loss=1.2345/:
//   model-rank00000.safetensors   trainable weights (LoRA only for PEFT runs),
//                                 named as TrainableModel::param_table()
//   optim-rank00000.safetensors   "<param>.exp_avg", "<param>.exp_avg_sq"
//   trainer_state.json            step, data position, RNG, schedule, optimizer step
//   recipe.yaml, tokenizer files  what the run was started with
//   metadata.json                 format_version, every tensor's global shape
//                                 and dtype, which flat [offset, offset+length)
//                                 of it each shard file holds, every file's
//                                 size and CRC32C, the base model reference
//   COMMITTED                     written last: size and CRC32C of metadata.json
// and <root>/last holds the name of the newest committed checkpoint.
//
// Sharding: rank r of N writes contiguous slices of each tensor's flattened
// data. A rank file whose slice is a whole tensor stores it under its global
// shape (any safetensors tool reads it); a partial slice is stored 1-D.
// Loading into M ranks assembles each rank's slices from whatever files
// overlap them, so N and M need not match.
//
// Threads: every function here may run on any thread; none keeps state.
// Errors name the checkpoint file at fault and the cause.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/storage.h"
#include "nn/lora.h"

namespace lathe {

constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kCheckpointLastFile = "last";
inline constexpr const char* kCheckpointCommittedFile = "COMMITTED";
inline constexpr const char* kCheckpointMetadataFile = "metadata.json";
inline constexpr const char* kCheckpointTrainerStateFile = "trainer_state.json";
inline constexpr const char* kCheckpointRecipeFile = "recipe.yaml";

// ---- Reader API: what `lathe checkpoint` and `lathe export` use -----------

struct CheckpointInfo {
  std::string location;                 // url of the checkpoint directory
  std::string name;                     // "step=000500-val_loss=1.2345"
  bool committed = false;               // COMMITTED present and matching metadata.json
  int64_t step = 0;
  std::map<std::string, double> metrics;  // val_loss, train_loss (those known at save time)
  int64_t total_bytes = 0;              // every file of the checkpoint
  int world_size = 1;
  bool full_sft = false;
  std::string base_model_path;
  std::string base_model_hash;
  LoraConfig lora;                      // meaningful when !full_sft
  std::string recipe_yaml;
  int format_version = 0;               // 0 when metadata.json is missing
  std::string problem;                  // why it is not committed/valid, empty when fine
};

// A checkpoint directory, or a checkpoints root (follows its `last`), or
// "<root>/last" itself; returns the checkpoint directory's url.
Result<std::string> resolve_checkpoint(const std::string& location);
// Metadata only, no checksums read: works on uncommitted ones too (committed=false).
Result<CheckpointInfo> inspect_checkpoint(const std::string& location);
// Every checkpoint directory under root, committed or not, by step.
Result<std::vector<CheckpointInfo>> list_checkpoints(const std::string& root);
// The trainable weights, whole tensors in f32 under param_table() names, in
// metadata order, after checking COMMITTED, sizes and checksums.
Result<std::vector<std::pair<std::string, Tensor>>> load_checkpoint_model(const std::string& location);

// ---- Format level ----------------------------------------------------------

enum class ShardKind : uint8_t { kModel, kOptim };
std::string shard_file_name(ShardKind kind, int rank);  // "model-rank00000.safetensors"

// One rank's piece of one tensor: elements [offset, offset + data.size()) of
// its row-major flattening. data is borrowed.
struct TensorSlice {
  std::string name;
  Shape shape;  // global
  int64_t offset = 0;
  std::span<const float> data;
};

struct RankShard {
  std::vector<TensorSlice> model;
  std::vector<TensorSlice> optim;
};

struct BaseModelRef {
  std::string path;
  std::string hash;  // base_model_hash()
};

// What one checkpoint holds. Spans and strings are borrowed for the write.
struct CheckpointContents {
  int64_t step = 0;
  std::map<std::string, double> metrics;
  bool full_sft = false;
  LoraConfig lora;
  BaseModelRef base_model;
  std::string trainer_state_json;
  std::string recipe_yaml;
  std::vector<std::pair<std::string, std::string>> extra_files;  // tokenizer files: name, bytes
  std::vector<RankShard> ranks;  // world size = ranks.size()
};

struct CheckpointWriteOptions {
  int64_t file_delay_ms = 0;          // test knob: sleep before each file (LATHE_CHECKPOINT_WRITE_DELAY_MS)
  int64_t chunk_bytes = 8ll << 20;    // bytes per Storage write
};

// Writes every file of the checkpoint into ckpt (a Storage rooted at the
// checkpoint directory), then metadata.json, then COMMITTED. Does not touch
// the root's `last`. Rank slices must tile each tensor exactly. The same as
// write_rank_shards for every rank, then commit_checkpoint.
Status write_checkpoint(Storage& ckpt, const CheckpointContents& c, const CheckpointWriteOptions& opt = {});

// Splits n elements over world ranks: rank r holds [begin, end).
std::pair<int64_t, int64_t> even_split(int64_t n, int rank, int world);

// The parsed metadata.json.
struct CheckpointFileRecord {
  std::string name;
  int64_t size = 0;
  uint32_t crc32c = 0;
  int rank = -1;                      // shard files only
  ShardKind kind = ShardKind::kModel;
  struct Slice {
    std::string tensor;
    int64_t offset = 0, length = 0;
  };
  std::vector<Slice> slices;          // shard files only
};
struct CheckpointTensorRecord {
  std::string name;
  Shape shape;
  std::string dtype = "F32";
  ShardKind kind = ShardKind::kModel;
};
struct CheckpointMetadata {
  int format_version = 0;
  int64_t step = 0;
  std::map<std::string, double> metrics;
  int world_size = 1;
  bool full_sft = false;
  LoraConfig lora;
  BaseModelRef base_model;
  std::vector<CheckpointTensorRecord> tensors;
  std::vector<CheckpointFileRecord> files;
  const CheckpointFileRecord* file(const std::string& name) const;
  int64_t total_bytes() const;
};

// Distributed saving, in two steps. Each rank writes its own two shard files
// (any thread or process, at the same time) and hands their records to the
// committing rank, which writes the small files of c (c.ranks unused),
// metadata.json and COMMITTED after checking that the slices of all ranks
// tile every tensor in tensors.
Result<std::vector<CheckpointFileRecord>> write_rank_shards(Storage& ckpt, int rank, int world, const RankShard& shard,
                                                            const CheckpointWriteOptions& opt = {});
Status commit_checkpoint(Storage& ckpt, const CheckpointContents& c, int world,
                         const std::vector<CheckpointTensorRecord>& tensors,
                         std::vector<CheckpointFileRecord> shard_files, const CheckpointWriteOptions& opt = {});

// Parses metadata.json text; where: its url, for messages.
Result<CheckpointMetadata> parse_checkpoint_metadata(const std::string& text, const std::string& where);
// Reads metadata.json and checks COMMITTED against it (a missing or
// mismatched COMMITTED is an error naming the checkpoint).
Result<CheckpointMetadata> read_committed_metadata(Storage& ckpt);
// Reads a file listed in the metadata and checks its size and CRC32C.
Result<std::vector<uint8_t>> read_verified(Storage& ckpt, const CheckpointMetadata& m, const std::string& name);
// Checks every file's size and CRC32C.
Status verify_checkpoint(Storage& ckpt, const CheckpointMetadata& m);

// A slice owned by the reader.
struct LoadedSlice {
  std::string name;
  Shape shape;  // global
  int64_t offset = 0;
  std::vector<float> data;
};
// This rank's share (even_split of each tensor over world ranks) of the
// tensors of one kind, assembled from the verified shard files.
Result<std::vector<LoadedSlice>> load_rank_slices(Storage& ckpt, const CheckpointMetadata& m, ShardKind kind,
                                                  int rank, int world);

// A cheap content hash of a base model directory: config.json and every
// *.safetensors file's name and header (not its data). "fnv1a64:<16 hex>".
Result<std::string> base_model_hash(const std::string& model_dir);

// "step=000500-val_loss=1.2345", or "step=000500" without a val_loss.
std::string checkpoint_name(int64_t step, const std::map<std::string, double>& metrics);
// The step a checkpoint name encodes; -1 when the name is not one.
int64_t step_of_checkpoint_name(const std::string& name);

// Splits a checkpoint url into its parent root and its name.
std::pair<std::string, std::string> split_checkpoint_location(const std::string& location);
// Opens a location for reading: a local directory that does not exist is
// kNotFound (open_storage would create it).
Result<std::unique_ptr<Storage>> open_existing_storage(const std::string& location);

}  // namespace lathe
