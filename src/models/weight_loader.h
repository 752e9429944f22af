// Fetching a model's weights by their Hugging Face names, shared by the CPU
// CausalLM and the CUDA model: shape and dtype checks with errors naming the
// file and tensor, parameter counting (a tied tensor counts once), and the
// merge of a PEFT LoRA adapter into the linear weights it targets
// (W' = W + scale·B·A in f32), so neither forward pass knows there was one.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"

namespace lathe {

class WeightLoader {
 public:
  // adapter_dir empty: no adapter. Otherwise the adapter is read and every
  // module it adapts must be a projection of the n_layer-layer model.
  static Result<WeightLoader> open(const WeightStore& store, const std::string& adapter_dir, int n_layer,
                                   bool keep_half_weights);

  // A tensor with its expected shape, f32/bf16/f16 (bf16/f16 widened to f32
  // unless keep_half_weights).
  Result<Tensor> get(const std::string& name, const Shape& shape);
  // The linear weight "<module>.weight" [out, in] with the adapter's factors
  // merged when the adapter targets module (the result is then an f32 copy).
  Result<Tensor> linear_weight(const std::string& module, int64_t out, int64_t in);

  int64_t n_params() const { return n_params_; }

 private:
  Status apply_adapter(const std::string& module, Tensor* w) const;

  const WeightStore* store_ = nullptr;
  std::shared_ptr<PeftAdapter> adapter_;  // null: none
  bool keep_half_weights_ = true;
  std::set<const void*> seen_;
  int64_t n_params_ = 0;
};

}  // namespace lathe
