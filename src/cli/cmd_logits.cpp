// `lathe logits`: runs a model over token ids and writes the logits of every
// position, the format transformers users compare against:
//   in:  FILE.safetensors with `input_ids` [batch, seq] (i64 or i32)
//   out: FILE.safetensors with `logits` [batch, seq, vocab] f32
// Each batch row is an independent sequence (no padding, no attention mask).
// With --reference, also compares with the `logits` of that file and fails
// when max|a − b| / max|b| exceeds --tolerance.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "io/safetensors.h"
#include "io/hf_config.h"
#include "models/causal_lm.h"
#include "models/cuda_causal_lm.h"

namespace lathe::cli {
namespace {

struct LogitsFlags {
  std::string model_dir;
  std::string adapter_dir;
  std::string input_ids;
  std::string out;
  std::string reference;
  double tolerance = 1e-4;
  std::string device = "cpu";
};

Result<std::vector<int32_t>> read_ids(const std::string& path, int64_t* batch, int64_t* seq) {
  LATHE_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(path));
  const SafetensorsEntry* e = f.find("input_ids");
  if (!e) return not_found(path, ": no tensor 'input_ids'");
  if (e->shape.rank() != 2 || (e->dtype != DType::I64 && e->dtype != DType::I32))
    return invalid_argument(path, ": tensor 'input_ids' is ", dtype_name(e->dtype), " ", e->shape.str(),
                            ", expected i64 or i32 [batch, seq]");
  LATHE_ASSIGN_OR_RETURN(Tensor t, f.tensor("input_ids"));
  *batch = t.size(0);
  *seq = t.size(1);
  std::vector<int32_t> ids(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t v = t.dtype() == DType::I64 ? t.data<int64_t>()[i] : t.data<int32_t>()[i];
    if (v < 0 || v > INT32_MAX) return invalid_argument(path, ": input_ids[", i, "] = ", v, " is not a token id");
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return ids;
}

Status compare(const std::string& path, const Tensor& logits, double tolerance) {
  LATHE_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(path));
  const SafetensorsEntry* e = f.find("logits");
  if (!e) return not_found(path, ": no tensor 'logits'");
  if (!(e->shape == logits.shape()))
    return invalid_argument(path, ": reference logits have shape ", e->shape.str(), ", computed ",
                            logits.shape().str());
  LATHE_ASSIGN_OR_RETURN(Tensor ref_raw, f.tensor("logits"));
  Tensor ref = ref_raw.to_f32();
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    double a = logits.data<float>()[i], b = ref.data<float>()[i];
    diff = std::isfinite(a) ? std::max(diff, std::abs(a - b)) : INFINITY;
    scale = std::max(scale, std::abs(b));
  }
  double rel = scale > 0 ? diff / scale : diff;
  std::printf("max relative error vs %s: %.3g (tolerance %.3g)\n", path.c_str(), rel, tolerance);
  if (!(rel <= tolerance))
    return error(StatusCode::kInternal, "logits differ from ", path, ": relative error ", rel, " > ", tolerance);
  return Status::ok();
}

// Every row's logits on the GPU (bf16 weights and activations: compare with a
// bf16-sized --tolerance).
Status cuda_logits(const LogitsFlags& fl, Device device, const std::vector<int32_t>& ids, Tensor& logits) {
  const int64_t batch = logits.size(0), seq = logits.size(1), vocab = logits.size(2);
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<CudaCausalLM> model,
                         CudaCausalLM::load(fl.model_dir, {.device = device.index, .max_seq = static_cast<int>(seq),
                                                           .max_logit_rows = static_cast<int>(seq),
                                                           .adapter_dir = fl.adapter_dir}));
  if (model->config().vocab_size != vocab) return invalid_argument("logits: vocab size changed under the model");
  for (int64_t b = 0; b < batch; ++b) {
    model->clear();
    std::span<float> rows(logits.data<float>() + b * seq * vocab, static_cast<size_t>(seq * vocab));
    std::span<const int32_t> row(ids.data() + b * seq, static_cast<size_t>(seq));
    LATHE_TRY(model->forward(row, rows, /*all_logits=*/true).with_context(fl.input_ids + " row " + std::to_string(b)));
  }
  return Status::ok();
}

Status run_logits(const LogitsFlags& fl) {
  LATHE_ASSIGN_OR_RETURN(Device device, parse_device(fl.device));
  int64_t batch = 0, seq = 0;
  Tensor logits;
  if (!device.is_cpu()) {
    LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, read_ids(fl.input_ids, &batch, &seq));
    LATHE_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(fl.model_dir));
    logits = Tensor::zeros(DType::F32, {batch, seq, cfg.vocab_size});
    if (seq > 0) LATHE_TRY(cuda_logits(fl, device, ids, logits));
  } else {
    LATHE_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model,
                           CausalLM::load(fl.model_dir, {.adapter_dir = fl.adapter_dir}));
    LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, read_ids(fl.input_ids, &batch, &seq));
    const int64_t vocab = model->config().vocab_size;
    logits = Tensor::empty(DType::F32, {batch, seq, vocab});
    KvCache cache = model->new_cache(static_cast<int>(seq));
    for (int64_t b = 0; b < batch && seq > 0; ++b) {
      cache.clear();
      TensorView rows = logits.view().slice_rows(b, b + 1).reshape({seq, vocab});
      std::span<const int32_t> row(ids.data() + b * seq, static_cast<size_t>(seq));
      LATHE_TRY(model->forward(row, cache, rows, /*all_logits=*/true).with_context(fl.input_ids + " row " + std::to_string(b)));
    }
  }
  LATHE_TRY(write_safetensors(fl.out, {{"logits", logits}}));
  if (!fl.reference.empty()) LATHE_TRY(compare(fl.reference, logits, fl.tolerance));
  return Status::ok();
}

}  // namespace

void add_logits(CLI::App& app, int* rc) {
  auto fl = std::make_shared<LogitsFlags>();  // shared: outlives this call, owned by the callback
  auto* cmd = app.add_subcommand("logits", "Compute the logits of token ids with a model (as transformers does)");
  cmd->add_option("--model", fl->model_dir, "Model directory (config.json + *.safetensors)")->required();
  cmd->add_option("--adapter", fl->adapter_dir, "PEFT LoRA adapter directory, merged into the model at load");
  cmd->add_option("--input-ids", fl->input_ids, "safetensors file with `input_ids` [batch, seq] i64 or i32")
      ->required();
  cmd->add_option("--out", fl->out, "Output safetensors file; holds `logits` [batch, seq, vocab] f32")->required();
  cmd->add_option("--reference", fl->reference, "Compare with the `logits` tensor of this safetensors file");
  cmd->add_option("--tolerance", fl->tolerance, "Largest max|a-b|/max|b| accepted by --reference")
      ->default_val(1e-4);
  cmd->add_option("--device", fl->device, "cpu, cuda, cuda:N or auto (a GPU when there is one)")
      ->capture_default_str();
  cmd->callback([fl, rc] { *rc = report("logits", run_logits(*fl)); });
}

}  // namespace lathe::cli
