// The GPU's EvalModel: a CudaCausalLM (bf16 weights, the adapter merged at
// load) sized once for the whole evaluation set. The loss runs the example
// through the model in chunks whose every logit row comes back to the host,
// so host and device hold [chunk, vocab] floats, never [n_tokens, vocab]; the
// KV cache carries the context from one chunk to the next, so the chunks add
// up to one pass. Generation picks each token's argmax on the device
// (forward_greedy) and only the id comes back. In a build without CUDA the
// load fails with the model's "no CUDA backend" error (no #ifdef here).
#include <algorithm>
#include <vector>

#include "models/cuda_causal_lm.h"
#include "train/evaluate.h"

namespace lathe {
namespace {

class CudaEvalModel : public EvalModel {
 public:
  CudaEvalModel(std::unique_ptr<CudaCausalLM> model, int device, int chunk)
      : model_(std::move(model)), device_(device), chunk_(chunk),
        logits_(static_cast<size_t>(chunk) * static_cast<size_t>(model_->config().vocab_size)) {}

  const ModelConfig& config() const override { return model_->config(); }
  Device device() const override { return Device::cuda(device_); }

  Result<double> nll_sum(const Example& ex) override {
    const auto n = int64_t(ex.input_ids.size());
    if (n > model_->max_seq())
      return invalid_argument("eval on cuda: an example of ", n, " tokens exceeds the model's ", model_->max_seq(),
                              " (max_seq)");
    const int64_t vocab = model_->config().vocab_size;
    model_->clear();
    double sum = 0;
    for (int64_t first = 0; first < n; first += chunk_) {
      const int64_t rows = std::min<int64_t>(chunk_, n - first);
      std::span<float> out(logits_.data(), static_cast<size_t>(rows * vocab));
      LATHE_TRY(model_->forward(std::span<const int32_t>(ex.input_ids).subspan(size_t(first), size_t(rows)), out,
                                /*all_logits=*/true));
      TensorView view{.data = logits_.data(), .dtype = DType::F32, .shape = Shape{rows, vocab}, .device = Device::cpu()};
      sum += example_nll_sum_rows(ex, view, first);
    }
    return sum;
  }

  // The cache holds max_seq tokens: a context that leaves less room than
  // max_new_tokens (only when the model's context is shorter than the
  // evaluation's) generates what fits.
  Result<std::vector<int32_t>> greedy(std::span<const int32_t> context, int max_new_tokens,
                                      std::span<const int32_t> stop_ids) override {
    std::vector<int32_t> out;
    if (max_new_tokens <= 0) return out;
    if (context.empty()) return invalid_argument("greedy_generate: empty context");
    const int budget = std::min(max_new_tokens, model_->max_seq() - int(context.size()));
    if (budget <= 0) return out;
    model_->clear();
    LATHE_ASSIGN_OR_RETURN(int32_t next, model_->forward_greedy(context));
    for (int step = 0; step < budget; ++step) {
      if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
      out.push_back(next);
      if (step + 1 == budget) break;
      LATHE_ASSIGN_OR_RETURN(next, model_->forward_greedy(std::span<const int32_t>(&out.back(), 1)));
    }
    return out;
  }

 private:
  std::unique_ptr<CudaCausalLM> model_;
  int device_;
  int chunk_;
  std::vector<float> logits_;  // [chunk, vocab]: one chunk's logits on the host
};

// Cache rows for the set: the longest example, or context + generation.
int64_t needed_tokens(std::span<const EvalRecord> records, int max_new_tokens) {
  int64_t most = 1;
  for (const EvalRecord& r : records) {
    most = std::max<int64_t>(most, int64_t(r.example.input_ids.size()));
    if (r.generation_context)
      most = std::max<int64_t>(most, int64_t(r.generation_context->size()) + std::max(max_new_tokens, 0));
  }
  return most;
}

}  // namespace

Result<std::unique_ptr<EvalModel>> cuda_eval_model(const CudaEvalOptions& options,
                                                   std::span<const EvalRecord> records) {
  if (options.chunk_tokens <= 0) return invalid_argument("eval on cuda: chunk_tokens must be positive");
  LATHE_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(options.model_dir + "/config.json"));
  int64_t max_seq = needed_tokens(records, options.max_new_tokens);
  if (cfg.max_position_embeddings > 0) max_seq = std::min<int64_t>(max_seq, cfg.max_position_embeddings);
  const int chunk = int(std::min<int64_t>(options.chunk_tokens, max_seq));
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<CudaCausalLM> model,
                         CudaCausalLM::load(options.model_dir, {.device = options.device,
                                                                .max_seq = int(max_seq),
                                                                .max_forward_tokens = chunk,
                                                                .max_logit_rows = chunk,
                                                                .adapter_dir = options.adapter_dir}));
  return std::unique_ptr<EvalModel>(new CudaEvalModel(std::move(model), options.device, chunk));
}

}  // namespace lathe
