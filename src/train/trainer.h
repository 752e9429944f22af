// The fine-tuning loop: a recipe, a model directory and a data set in, a run
// directory out (metrics.jsonl, loss_curves.svg, recipe.yaml, and the trained
// adapter in PEFT's layout, or the full weights for full SFT).
//
// One optimizer step reads like the algorithm:
//   next global batch → zero grads → forward_backward every micro batch with
//   loss scale 1 / (supervised tokens of the global batch) → clip the global
//   grad norm → lr = schedule(step) → AdamW step → log → maybe validate.
//
// Decisions a user should know:
//   - Run length: trainer.max_steps and trainer.max_epochs both bound the run
//     and the first one reached ends it (-1 disables either; not both).
//     Epochs are global batches per epoch = training rows / global_batch_size,
//     the last partial batch dropped.
//   - Validation runs every trainer.val_check_interval steps and after the
//     last step (0: only after the last step), over the validation split
//     (validation.jsonl next to training.jsonl), limited to
//     trainer.limit_val_batches micro batches (-1: all; 0: none).
//     val_loss = Σ token losses / Σ supervised tokens; perplexity = exp(val_loss).
//   - A non-finite training loss or gradient norm stops the run with an
//     error naming the step; the weights are not updated by that step and
//     nothing is saved (the metrics written so far stay).
//   - Seeds: trainer.seed drives LoRA initialization and dropout masks;
//     data.seed (NeMo's separate data seed, same default) drives shuffling.
//   - Checkpoints (checkpoint.*, docs/checkpoints.md) are saved after a step
//     (every N steps, at validation, by time, and after the last step) by
//     a CheckpointManager writing in the background. resume=auto (the
//     default) continues from checkpoint.dir's newest committed checkpoint:
//     weights, optimizer moments and step, data position and dropout stream
//     restored, so the losses that follow are the uninterrupted run's, bit
//     for bit with the same thread count. A failed save fails the run at the
//     next save or at the end.
//
// Threads: run() on one thread; the kernels inside use OpenMP.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "train/example.h"
#include "train/metrics.h"
#include "train/recipe.h"

namespace lathe {

struct TrainerConfig {
  TrainRecipe recipe;
  std::string model_dir;  // HF model directory (config.json, *.safetensors, tokenizer files)
  std::string data_path;  // NeMo layout directory or a JSONL file; empty: recipe.data.dataset_root
  std::string run_dir;    // created if missing; outputs land here
  // A PEFT adapter directory to start LoRA from (its r, alpha, rsLoRA and
  // target modules replace the recipe's peft.* values); empty: A random, B zero.
  std::string adapter_dir;
  // "cpu", "cuda", "cuda:N", or "" / "auto": the GPU when the build has CUDA,
  // one is visible and the model is one the GPU path trains, else the CPU.
  std::string device;
  ProgressStyle progress = ProgressStyle::kAuto;
  std::FILE* log = stderr;  // borrowed: progress, data summary, validation lines
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t epochs_started = 0;        // epochs the sampler entered
  double final_train_loss = 0.0;     // loss of the last step
  std::optional<double> best_val_loss;
  std::optional<int64_t> best_val_step;
  std::optional<double> final_val_loss;
  int64_t tokens_processed = 0;      // every input token, all steps
  int64_t supervised_tokens = 0;     // loss tokens, all steps
  double train_seconds = 0.0;        // time in training steps
  double wall_seconds = 0.0;         // from run() entry to the end, saving included
  double tokens_per_s = 0.0;         // tokens_processed / train_seconds
  std::string output_dir;            // <run>/adapter (LoRA) or <run>/model (full SFT)
  std::string checkpoint_dir;        // checkpoint.dir, empty when checkpoints are off
  int64_t resumed_from_step = 0;     // 0: a fresh run
  bool full_sft = false;
  std::string run_dir;
  std::string model_dir;
  std::string data_path;
};

// The end-of-run text: numbers, where the outputs are, and the next commands.
std::string format_summary(const TrainSummary& s);

// The run's total optimizer steps: min(max_steps, max_epochs × batches per
// epoch), -1 meaning no bound.
int64_t resolve_total_steps(int64_t max_steps, int64_t max_epochs, int64_t batches_per_epoch);

class TrainableModel;
class TrainerImpl;

class Trainer {
 public:
  // Validates the recipe, loads and tokenizes the data (errors name
  // file:line), loads the model and builds the optimizer. codec: the text
  // codec to build examples with (borrowed for the call); null loads the
  // tokenizer and chat template of model_dir.
  static Result<std::unique_ptr<Trainer>> create(const TrainerConfig& config, const TextCodec* codec = nullptr);
  ~Trainer();

  // Trains to the end and writes the run directory's outputs.
  Result<TrainSummary> run();

  // The model being trained (its params() are the trained weights after run()).
  TrainableModel& model();

 private:
  explicit Trainer(std::unique_ptr<TrainerImpl> impl);
  std::unique_ptr<TrainerImpl> impl_;
};

}  // namespace lathe
