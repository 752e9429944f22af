// Training recipes: every setting of a fine-tuning run in one aggregate struct,
// plus a registry of dotted keys ("peft.dim", "optim.sched.warmup_steps"), each
// with a type, default and one-line doc.
//
// Keys use NeMo 2's names where NeMo has them, so a NeMo user's vocabulary
// carries over; defaults follow NeMo 2's LoRA fine-tuning recipe unless noted.
// A recipe is built from the defaults, then a YAML file (nested maps, dotted
// keys, or both), then `key=value` overrides from the command line, each value
// parsed by its key's type. Errors name the source line, the key, the value and
// the expected type; an unknown key gets the closest known key as a suggestion.
// The registry also renders the `lathe finetune --help` key table and writes the
// effective recipe back as YAML (recipe.yaml in the run directory), which loads
// back to the same recipe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "train/adamw.h"
#include "train/dataset.h"
#include "train/lr_schedule.h"

namespace lathe {

enum class PeftScheme : uint8_t { kLora, kNone };  // none: full-parameter SFT
enum class LoraDropoutPosition : uint8_t { kPre, kPost };
enum class OptimizerName : uint8_t { kAdamW };
enum class ResumeMode : uint8_t { kAuto, kNone };

struct PeftRecipe {
  PeftScheme peft_scheme = PeftScheme::kLora;
  int64_t dim = 32;      // LoRA rank r; NeMo's default
  double alpha = 32.0;   // scale = alpha / dim (alpha / sqrt(dim) with rslora); NeMo's default
  double dropout = 0.0;  // NeMo's default
  LoraDropoutPosition dropout_position = LoraDropoutPosition::kPre;  // NeMo's default
  bool rslora = false;
  // NeMo 2's LoRA default: all four Megatron linears, i.e. all seven HF
  // projections. HF names (q_proj ... down_proj) are accepted too.
  std::vector<std::string> target_modules = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};
};

// trainer.precision, NeMo's names: 32 (f32 throughout) or bf16-mixed (the
// frozen base in bf16, its GEMMs with bf16 operands and f32 sums; LoRA only).
enum class Precision : uint8_t { kF32, kBf16Mixed };

struct TrainerRecipe {
  int64_t max_steps = 1000;          // optimizer steps; -1: run max_epochs instead
  int64_t max_epochs = -1;           // -1: no epoch limit
  int64_t val_check_interval = 30;   // validate every N steps; 0: only at the end
  int64_t limit_val_batches = -1;    // -1: whole validation set; 0: no validation
  int64_t log_every_n_steps = 10;
  double gradient_clip_val = 1.0;    // max global grad norm; 0: no clipping
  int64_t seed = 1234;               // initialization and dropout
  bool activations_checkpoint = false;  // recompute activations in backward
  // With activations_checkpoint: "full" (each layer's forward reruns) or, on
  // the GPU, "selective" (only the norms, q|k|v, o and RoPE rerun); the CPU
  // trainer always recomputes fully.
  std::string activations_checkpoint_granularity = "full";
  // On the GPU: GiB of device memory the run may hold in all (as nvidia-smi
  // counts it; 1 GiB of it is left to the CUDA context and libraries).
  // Without activations_checkpoint, a run whose activations do not fit
  // recomputes selectively instead (or fully where even that does not fit:
  // the same values, less memory). With selective, what the optimizer and
  // the always-kept activations leave goes to layers that also keep q/k/v
  // (rerunning no projection), and [gate | up] of some layers waits in
  // pinned host memory when that lets more of them keep it. 0: the memory
  // free when training starts.
  double gpu_memory_gib = 0.0;
  Precision precision = Precision::kF32;
};

struct DataRecipe {
  std::string dataset_root;          // directory with training.jsonl etc., or a file
  int64_t seq_length = 2048;
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 128;   // = micro_batch_size * world_size * accumulation steps
  std::string prompt_template = "{input} {output}";
  std::string label_key = "output";  // the supervised field of {input, output} records
  bool packed_sequence = false;
  Truncation truncation = Truncation::kRight;  // dataset.h: right | drop
  OnError on_error = OnError::kStop;           // dataset.h: stop (alias fail) | skip
  bool shuffle = true;
  int64_t seed = 1234;               // data order; NeMo's data modules default to 1234
};

struct SchedRecipe {
  LrScheduleKind name = LrScheduleKind::kCosine;
  int64_t warmup_steps = 50;  // NeMo's fine-tuning recipe
  double min_lr = 0.0;        // NeMo's fine-tuning recipe
  int64_t max_steps = -1;     // decay length; -1: the run's total steps
};

struct OptimRecipe {
  OptimizerName name = OptimizerName::kAdamW;
  double lr = 1e-4;                          // NeMo's LoRA recipe
  double weight_decay = 0.01;                // NeMo's fine-tuning recipe uses 0.1
  std::array<double, 2> betas = {0.9, 0.98};  // NeMo's fine-tuning recipe
  double eps = 1e-5;                         // NeMo's fine-tuning recipe (Megatron adam_eps)
  bool no_decay_norm_and_bias = false;
  SchedRecipe sched;
};

// Checkpoints (train/checkpoint_manager.h). Names as NeMo's ModelCheckpoint.
struct CheckpointRecipe {
  std::string dir;                    // empty: <run-dir>/checkpoints; a path or s3://bucket/prefix
  int64_t every_n_train_steps = 0;    // 0: whenever validation runs; N > 0: every N steps; -1: never by step
  double train_time_interval = 0.0;   // minutes between saves; 0: off
  int64_t save_top_k = 2;             // best k by monitor are kept; -1: keep all; 0 (with save_last false): no checkpoints
  std::string monitor = "val_loss";   // val_loss | train_loss, lower is better
  bool save_last = true;              // always keep the newest one too
  bool async_save = true;             // write in a background thread while training continues
};

// Resuming (NeMo's AutoResume with resume_if_exists and
// resume_ignore_no_checkpoint, its fine-tuning default).
struct ResumeRecipe {
  ResumeMode mode = ResumeMode::kAuto;  // auto: continue from checkpoint.dir's newest committed one, if any
  std::string path;                     // a checkpoint (or checkpoints root) to resume from; overrides mode
};

struct TrainRecipe {
  PeftRecipe peft;
  TrainerRecipe trainer;
  DataRecipe data;
  OptimRecipe optim;
  CheckpointRecipe checkpoint;
  ResumeRecipe resume;
};

// Range and consistency checks (global batch divisible by micro batch times
// world size, warmup within the run, ...). Messages name the key and the fix.
Status validate(const TrainRecipe& r, int world_size = 1);

// ---- Loading -------------------------------------------------------------
// Each applies on top of what *r already holds; on error *r may be partly
// updated. None validates: call validate() once the world size is known.

// Reads a YAML recipe: nested maps (peft: {dim: 16}), dotted keys
// (peft.dim: 16), or both. source names the text in errors ("recipe.yaml").
Status apply_recipe_yaml(TrainRecipe* r, std::string_view yaml_text, std::string_view source);
Status apply_recipe_file(TrainRecipe* r, const std::string& path);
// One command-line override "key=value". Lists as [a,b] or a,b; a string in
// double quotes is read as a YAML double-quoted scalar (so "\n" is a newline).
Status apply_recipe_override(TrainRecipe* r, std::string_view key_equals_value);
Status set_recipe_value(TrainRecipe* r, std::string_view key, std::string_view value);
// Defaults, then the file at path (skipped when empty), then the overrides.
Result<TrainRecipe> load_recipe(const std::string& path, std::span<const std::string> overrides);

// ---- Introspection and output --------------------------------------------
struct RecipeKeyInfo {
  std::string name;           // "peft.dim"
  std::string type;           // "int", "float", "bool", "string", "enum", "list"
  std::string default_value;  // rendered as in YAML
  std::string doc;            // one line; enums and lists end with their choices
};
const std::vector<RecipeKeyInfo>& recipe_keys();  // registry order
// The value of key in r, rendered as in YAML; error for an unknown key.
Result<std::string> get_recipe_value(const TrainRecipe& r, std::string_view key);
// The key table for `lathe finetune --help`: name, type, default, doc.
std::string render_recipe_help();
// Every key of r as nested YAML that apply_recipe_yaml reads back to r.
std::string recipe_to_yaml(const TrainRecipe& r);
// Writes recipe_to_yaml(r) to path (through a temporary file and a rename).
Status write_recipe_yaml(const TrainRecipe& r, const std::string& path);

// ---- Derived settings ----------------------------------------------------
// target_modules as HF projection names in canonical order (q_proj, k_proj,
// v_proj, o_proj, gate_proj, up_proj, down_proj), NeMo names expanded:
// linear_qkv = q,k,v; linear_proj = o; linear_fc1 = gate,up; linear_fc2 = down.
Result<std::vector<std::string>> hf_target_modules(const PeftRecipe& p);
double lora_scale(const PeftRecipe& p);  // alpha / dim, or alpha / sqrt(dim) with rslora
// global_batch_size / (micro_batch_size * world_size); validate() first.
int64_t grad_accumulation_steps(const TrainRecipe& r, int world_size);
AdamWConfig adamw_config(const TrainRecipe& r);
// total_steps: the run's resolved step count (trainer.max_steps, or what
// max_epochs works out to); optim.sched.max_steps overrides it when > 0.
LrScheduleConfig lr_schedule_config(const TrainRecipe& r, int64_t total_steps);

std::string_view peft_scheme_name(PeftScheme s);

}  // namespace lathe
