// The GPU side of a TrainableModel: a CudaTrainableModel built from a loaded
// TrainableModel, LoRA (its frozen base rounded to bf16 and uploaded, its
// LoRA table and values copied) or full SFT (every weight: bf16 copies and
// f32 masters in the host's table), plus parsing of
// `--device cpu|cuda|cuda:N`. The host model stays the source of truth for
// saving: copy the trained parameters back with
// download_params(host.params()) before save_adapter_peft() / save_full().
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "train/cuda_model.h"
#include "train/trainable_model.h"

namespace lathe {

struct DeviceChoice {
  bool cuda = false;
  int index = 0;
};
// "" or "auto": the first GPU when this build has CUDA and one is visible,
// else the CPU. "cpu", "cuda" (= cuda:0), "cuda:N". Errors name the value.
Result<DeviceChoice> parse_device(const std::string& text);

// Refuses what the GPU path does not do (o/MLP biases,
// head_dim other than 32/64/128, a full SFT larger than the device's
// memory) with a message saying so. Without a
// recompute mode the host's activations_checkpoint picks full or none;
// max_arena_bytes and keep_layers as CudaTrainOptions' (selective's).
// device_budget_bytes (> 0): the device memory the arena and the
// optimizer's moments may take together. With selective and no
// max_arena_bytes, the arena's budget is what the moments leave; with
// fit_recompute, a mode whose arena does not fit takes the next that
// does (none → selective → full: the same values, less memory). Where the
// mode taken still does not fit: with budget_key (the recipe key that set
// the budget), an error naming it and the bytes the least plan needs;
// without, the plan is tried and the allocation says what is missing.
Result<std::unique_ptr<CudaTrainableModel>> upload_to_cuda(TrainableModel& host, int device, int64_t max_tokens,
                                                           const cuda::CudaAdamWConfig& adamw,
                                                           std::optional<CudaRecompute> recompute = std::nullopt,
                                                           int64_t max_arena_bytes = 0, int64_t keep_layers = -1,
                                                           int64_t max_seqlen = 0, int64_t device_budget_bytes = 0,
                                                           bool fit_recompute = false, const char* budget_key = nullptr);

}  // namespace lathe
