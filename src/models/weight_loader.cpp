// WeightLoader: tensors by name with their shapes checked, parameters
// counted, adapters merged. The merge runs in f32 on the CPU, one weight at a
// time, so the peak extra memory is one f32 copy per adapted weight.
#include "models/weight_loader.h"

#include "models/family.h"
#include "nn/lora.h"

namespace lathe {

namespace {

// W [out, in] f32 += scale · B [out, r] · A [r, in] (A, B in any float dtype),
// in lora_merge's order (the export merges the same way).
void merge_lora(Tensor& w, const LoraPair& p, float scale) {
  const Tensor a = p.a.to_f32(), b = p.b.to_f32();
  lora_merge(w.data<float>(), a.data<float>(), b.data<float>(), w.size(0), w.size(1), a.size(0), scale);
}

// Every module of the adapter must be a projection of the model: one that is
// not names a layer or projection the model lacks (checked before any merge).
Status check_adapter_modules(const PeftAdapter& ad, const std::string& model_dir, int n_layer) {
  static constexpr const char* kLeaves[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                            "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                            "mlp.down_proj"};
  std::set<std::string> known;
  for (int i = 0; i < n_layer; ++i)
    for (const char* leaf : kLeaves) known.insert(names::layer(i, leaf));
  for (const auto& [module, pair] : ad.modules)
    if (!known.count(module))
      return not_found(ad.weights_path, ": tensor 'base_model.model.", module, ".lora_A.weight' adapts '", module,
                       "', which is not a linear layer of the model in ", model_dir, " (it has layers 0..",
                       n_layer - 1, " with self_attn.{q,k,v,o}_proj and mlp.{gate,up,down}_proj)");
  return Status::ok();
}

}  // namespace

Result<WeightLoader> WeightLoader::open(const WeightStore& store, const std::string& adapter_dir, int n_layer,
                                        bool keep_half_weights) {
  WeightLoader ld;
  ld.store_ = &store;
  ld.keep_half_weights_ = keep_half_weights;
  if (!adapter_dir.empty()) {
    LATHE_ASSIGN_OR_RETURN(PeftAdapter adapter, load_peft_adapter(adapter_dir));
    LATHE_TRY(check_adapter_modules(adapter, store.dir(), n_layer));
    ld.adapter_ = std::make_shared<PeftAdapter>(std::move(adapter));
  }
  return ld;
}

Status WeightLoader::apply_adapter(const std::string& module, Tensor* w) const {
  if (!adapter_) return Status::ok();
  const PeftAdapter& ad = *adapter_;
  auto it = ad.modules.find(module);
  if (it == ad.modules.end()) {
    if (ad.config.targets(module))
      return not_found(ad.weights_path, ": no tensor 'base_model.model.", module,
                       ".lora_A.weight', though target_modules of ", ad.config_path, " names the module");
    return Status::ok();
  }
  const LoraPair& p = it->second;
  const int64_t out = w->size(0), in = w->size(1), r = ad.config.r;
  const std::string key = "base_model.model." + module;
  if (!(p.a.shape() == Shape{r, in}))
    return invalid_argument(ad.weights_path, ": tensor '", key, ".lora_A.weight' has shape ", p.a.shape().str(),
                            ", expected ", Shape{r, in}.str(), " (the base weight is ", w->shape().str(), ")");
  if (!(p.b.shape() == Shape{out, r}))
    return invalid_argument(ad.weights_path, ": tensor '", key, ".lora_B.weight' has shape ", p.b.shape().str(),
                            ", expected ", Shape{out, r}.str(), " (the base weight is ", w->shape().str(), ")");
  *w = w->to_f32();  // a private copy: the file mapping is read-only
  merge_lora(*w, p, ad.config.scale());
  return Status::ok();
}

Result<Tensor> WeightLoader::get(const std::string& name, const Shape& shape) {
  LATHE_ASSIGN_OR_RETURN(Tensor t, store_->get(name, shape));
  if (t.dtype() != DType::F32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16)
    return invalid_argument(store_->file_of(name), ": tensor '", name, "' has dtype ", dtype_name(t.dtype()),
                            ", expected F32, BF16 or F16");
  if (seen_.insert(t.raw()).second) n_params_ += t.numel();
  if (!keep_half_weights_ && t.dtype() != DType::F32) t = t.to_f32();
  return t;
}

Result<Tensor> WeightLoader::linear_weight(const std::string& module, int64_t out, int64_t in) {
  LATHE_ASSIGN_OR_RETURN(Tensor w, get(module + ".weight", {out, in}));
  LATHE_TRY(apply_adapter(module, &w));
  return w;
}

}  // namespace lathe
