// Export of a trained model into the two forms the Hugging Face world loads
// unchanged:
//   hf       the merged model as transformers' save_pretrained writes it after
//            PEFT's merge_and_unload: W' = W + scale · B·A for every adapted
//            module, in the base model's dtype; config.json, model.safetensors
//            (or model-0000i-of-0000n.safetensors + model.safetensors.index.json
//            past 5 GB), generation_config.json and the tokenizer files.
//            Full-SFT weights are written as they are, in that dtype.
//   hf-peft  adapter_config.json + adapter_model.safetensors with PEFT's key
//            names and shapes (the writer the trainer uses, io/peft_adapter.h).
//
// The functions take plain inputs (a base model directory, named f32 tensors,
// the LoRA config), not a checkpoint, so the CLI maps any checkpoint reader's
// output onto them and the merge math is testable on its own. They read the
// base through WeightStore (memory-mapped; untouched tensors are copied from
// the mapping once) and write only under the output directory, which must not
// be the base model's. Not thread-safe per call; the merge itself uses OpenMP.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/peft_adapter.h"
#include "nn/lora.h"

namespace lathe {

// What a training run leaves to export.
struct ExportSource {
  std::string base_model_dir;  // config.json, *.safetensors, generation_config.json
  // Trained tensors with TrainableModel::param_table() names, any float dtype:
  // LoRA factors ("base_model.model.<module>.lora_A.weight" [r, in],
  // ".lora_B.weight" [out, r]) or, for full SFT, transformers' weight names.
  std::vector<std::pair<std::string, Tensor>> tensors;
  bool full_sft = false;
  LoraConfig lora;  // LoRA runs: r, alpha, rslora, dropout, target_modules
  // Tokenizer files written beside the model (name → bytes); empty: those
  // of base_model_dir, if it has any.
  std::vector<std::pair<std::string, std::string>> tokenizer_files;
};

struct HfExportOptions {
  std::optional<DType> dtype;                      // default: the base model's (config dtype / torch_dtype)
  uint64_t max_shard_bytes = 5'000'000'000ull;     // transformers' max_shard_size="5GB"
};

// The file names of a tokenizer, as transformers reads and writes them.
const std::vector<std::string>& tokenizer_file_names();

// The dtype the base model is stored in: config.json's dtype/torch_dtype when
// it names f32/bf16/f16, else the dtype of its first weight.
Result<DType> base_model_dtype(const std::string& base_model_dir);

// The base weights with the source applied, in transformers' state_dict order
// (embeddings, each layer's attention, MLP and norms, final norm, head), in
// dtype. LoRA: every adapted module merged (f32 merge, one rounding to dtype);
// full SFT: the trained tensors replace the base's. Errors name the tensor and
// what disagrees (unknown module, shape, rank, a missing A or B, a target
// module without factors).
Result<std::vector<std::pair<std::string, Tensor>>> merged_weights(const ExportSource& source, DType dtype);

// Writes the `hf` export to out_dir (created).
Status export_hf(const ExportSource& source, const std::string& out_dir, const HfExportOptions& options = {});

// Writes the `hf-peft` export to out_dir (created). LoRA sources only.
Status export_hf_peft(const ExportSource& source, const std::string& out_dir);

// PEFT's adapter_config for a LoRA config on base_model_dir (target_modules
// resolved to HF leaf names such as "q_proj").
Result<PeftAdapterConfig> peft_config_of(const LoraConfig& lora, const std::string& base_model_dir);

}  // namespace lathe
