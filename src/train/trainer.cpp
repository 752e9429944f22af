// The fine-tuning loop (see trainer.h): setup turns a recipe into a data set,
// a batch iterator, a trainable model, an optimizer and a schedule; run()
// is the step loop plus validation, and finish() writes the run's outputs.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/device.h"
#include "core/env.h"
#include "io/storage.h"
#include "train/adamw.h"
#include "train/batcher.h"
#include "train/checkpoint_manager.h"
#include "train/cuda_trainable.h"
#include "train/dataset.h"
#include "train/lr_schedule.h"
#include "train/packing.h"
#include "train/text_codec.h"
#include "train/trainable_model.h"

namespace lathe {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

DataOptions data_options(const DataRecipe& d) {
  return {.prompt_template = d.prompt_template,
          .label_key = d.label_key,
          .seq_length = static_cast<int32_t>(d.seq_length),
          .truncation = d.truncation,
          .on_error = d.on_error};
}

BatchOptions batch_options(const DataRecipe& d) {
  return {.seq_length = static_cast<int32_t>(d.seq_length),
          .micro_batch_size = static_cast<int32_t>(d.micro_batch_size),
          .global_batch_size = static_cast<int32_t>(d.global_batch_size),
          .seed = static_cast<uint64_t>(d.seed),
          .shuffle = d.shuffle};
}

Result<TrainableModelOptions> model_options(const TrainRecipe& r) {
  TrainableModelOptions o;
  o.full_sft = r.peft.peft_scheme == PeftScheme::kNone;
  o.lora.r = static_cast<int>(r.peft.dim);
  o.lora.alpha = static_cast<float>(r.peft.alpha);
  o.lora.dropout = static_cast<float>(r.peft.dropout);
  o.lora.rslora = r.peft.rslora;
  LATHE_ASSIGN_OR_RETURN(o.lora.target_modules, hf_target_modules(r.peft));
  o.activations_checkpoint = r.trainer.activations_checkpoint;
  const std::string& granularity = r.trainer.activations_checkpoint_granularity;
  if (granularity != "full" && granularity != "selective")
    return invalid_argument("trainer.activations_checkpoint_granularity '", granularity,
                            "': expected full or selective");
  o.bf16_base = r.trainer.precision == Precision::kBf16Mixed;
  o.seed = static_cast<uint64_t>(r.trainer.seed);
  return o;
}

std::vector<PackedRow> make_rows(const std::vector<Example>& examples, const DataRecipe& d) {
  std::vector<int32_t> lengths = example_lengths(examples);
  return d.packed_sequence ? pack_first_fit_decreasing(lengths, static_cast<int32_t>(d.seq_length))
                           : one_example_per_row(lengths);
}

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << v;
  return os.str();
}

}  // namespace

int64_t resolve_total_steps(int64_t max_steps, int64_t max_epochs, int64_t batches_per_epoch) {
  int64_t total = std::numeric_limits<int64_t>::max();
  if (max_steps > 0) total = max_steps;
  if (max_epochs > 0) total = std::min(total, max_epochs * batches_per_epoch);
  return total == std::numeric_limits<int64_t>::max() ? -1 : total;
}

class TrainerImpl {
 public:
  TrainerConfig config;
  TextCodec codec;
  SftDataset train_data;
  std::vector<PackedRow> train_rows;
  SftDataset val_data;
  std::vector<MicroBatch> val_batches;
  std::optional<BatchIterator> batches;
  std::unique_ptr<TrainableModel> model;
  std::unique_ptr<CudaTrainableModel> gpu;  // set when training on the GPU; model then holds the host copy
  std::optional<AdamW> adamw;
  LrScheduleConfig schedule;
  int64_t total_steps = 0;

  // Checkpoints (null when checkpoint.save_top_k is 0 and save_last false).
  std::unique_ptr<CheckpointManager> ckpt;
  int64_t start_step = 0;                // steps done before this process (resume)
  TrainSummary resumed;                  // counters restored from the checkpoint
  std::optional<double> last_val_loss;   // the newest validation, named in checkpoints
  int64_t last_saved_step = -1;
  Clock::time_point last_save_time = Clock::now();

  Status setup(const TextCodec* given_codec);
  Status setup_checkpoints();
  Status resume_from(const std::string& url);
  CheckpointSnapshot snapshot(int64_t step, double train_loss, const TrainSummary& s);
  Status maybe_save(int64_t step, double train_loss, bool validated, bool last, const TrainSummary& s);
  Status load_data();
  Status build_model();
  Status build_gpu();
  // The pass and optimizer calls, on the GPU when gpu is set.
  Result<PassLoss> pass(const MicroBatch& mb, float loss_scale, bool backward);
  Status zero_grads();
  Result<double> clip_grad_norm(double max_norm);
  Status optimizer_step(double lr);
  // The GPU's parameters, moments and step count into model and adamw (for
  // saving and checkpoints); a no-op on the CPU.
  Status state_to_host();
  // The reverse, after a checkpoint was restored into model and adamw.
  Status state_to_device();
  struct StepResult {
    StepMetrics metrics;
    int64_t n_tokens = 0;  // input tokens of the global batch
  };
  Result<StepResult> train_step(int64_t step);
  Result<ValMetrics> validate(int64_t step);
  Status finish(TrainSummary* s);
  void note(const std::string& line) const {
    std::fprintf(config.log, "%s\n", line.c_str());
    std::fflush(config.log);
  }
};

Status TrainerImpl::setup(const TextCodec* given_codec) {
  TrainRecipe& r = config.recipe;
  if (config.data_path.empty()) config.data_path = r.data.dataset_root;
  if (config.data_path.empty()) return invalid_argument("no data: pass --data PATH or set data.dataset_root");
  r.data.dataset_root = config.data_path;
  if (config.run_dir.empty()) return invalid_argument("no run directory given");
  LATHE_TRY(lathe::validate(r));
  LATHE_TRY(parse_device(config.device).status());
  if (!fs::is_directory(config.model_dir))
    return not_found("model directory ", config.model_dir, " does not exist");
  if (given_codec != nullptr) {
    codec = *given_codec;
  } else {
    LATHE_ASSIGN_OR_RETURN(codec, load_text_codec(config.model_dir));
  }
  LATHE_TRY(load_data());
  LATHE_TRY(build_model());
  std::error_code ec;
  fs::create_directories(config.run_dir, ec);
  if (ec) return io_error("cannot create run directory ", config.run_dir, ": ", ec.message());
  LATHE_TRY(write_recipe_yaml(r, (fs::path(config.run_dir) / "recipe.yaml").string()));
  return setup_checkpoints();
}

Status TrainerImpl::load_data() {
  const DataRecipe& d = config.recipe.data;
  DataOptions opts = data_options(d);
  LATHE_ASSIGN_OR_RETURN(std::optional<std::string> train_file, find_split_file(config.data_path, Split::kTrain));
  std::vector<std::string> files = {*train_file};
  LATHE_ASSIGN_OR_RETURN(train_data, load_sft_dataset(files, opts, codec));
  note("train data: " + describe(train_data.stats));
  if (train_data.examples.empty()) return invalid_argument(*train_file, ": no usable training examples");
  train_rows = make_rows(train_data.examples, d);
  LATHE_ASSIGN_OR_RETURN(BatchIterator it, BatchIterator::create(train_data.examples, train_rows, batch_options(d)));
  batches.emplace(std::move(it));

  const TrainerRecipe& t = config.recipe.trainer;
  total_steps = resolve_total_steps(t.max_steps, t.max_epochs, batches->batches_per_epoch());
  if (t.limit_val_batches == 0) return Status::ok();
  LATHE_ASSIGN_OR_RETURN(std::optional<std::string> val_file, find_split_file(config.data_path, Split::kValidation));
  if (!val_file) return Status::ok();
  std::vector<std::string> val_files = {*val_file};
  LATHE_ASSIGN_OR_RETURN(val_data, load_sft_dataset(val_files, opts, codec));
  note("validation data: " + describe(val_data.stats));
  std::vector<PackedRow> val_rows = make_rows(val_data.examples, d);
  val_batches = eval_micro_batches(val_data.examples, val_rows, batch_options(d));
  if (t.limit_val_batches > 0 && static_cast<int64_t>(val_batches.size()) > t.limit_val_batches)
    val_batches.resize(static_cast<size_t>(t.limit_val_batches));
  return Status::ok();
}

Status TrainerImpl::build_model() {
  const TrainRecipe& r = config.recipe;
  LATHE_ASSIGN_OR_RETURN(TrainableModelOptions mopts, model_options(r));
  if (!config.adapter_dir.empty() && mopts.full_sft)
    return invalid_argument("--adapter ", config.adapter_dir, " starts a LoRA run, but the recipe asks for full SFT");
  mopts.adapter_dir = config.adapter_dir;
  LATHE_ASSIGN_OR_RETURN(model, TrainableModel::load(config.model_dir, mopts));
  if (codec.vocab_size > model->config().vocab_size)
    return invalid_argument("tokenizer of ", config.model_dir, " has ", codec.vocab_size,
                            " ids but the model's vocab_size is ", model->config().vocab_size);
  std::vector<AdamWParam> params;
  for (const ParamInfo& p : model->param_table()) {
    params.push_back({.name = p.name,
                      .param = model->params().data() + p.offset,
                      .grad = model->grads().data() + p.offset,
                      .n = p.numel()});
  }
  LATHE_ASSIGN_OR_RETURN(AdamW opt, AdamW::create(adamw_config(r), std::move(params)));
  adamw.emplace(std::move(opt));
  LATHE_TRY(build_gpu());
  schedule = lr_schedule_config(r, total_steps);
  return lathe::validate(schedule).with_context("optim.sched");
}

namespace {

// The device memory the arena and the optimizer's moments may take:
// trainer.gpu_memory_gib (all this run holds, as nvidia-smi counts it) or
// the memory free now, each less 1 GiB for the CUDA context, the libraries'
// workspaces and the decode graphs (at least 1 byte: nothing fits); 0
// where the free memory cannot be read (upload_to_cuda then says why the
// device is unusable).
int64_t device_budget(const TrainerRecipe& t, int device) {
  constexpr int64_t kGiB = int64_t(1) << 30;
  int64_t bytes = static_cast<int64_t>(t.gpu_memory_gib * double(kGiB));
  if (t.gpu_memory_gib <= 0.0) {
    const Result<size_t> free_b = cuda::free_bytes(device);
    if (!free_b.is_ok()) return 0;
    bytes = static_cast<int64_t>(*free_b);
  }
  return std::max<int64_t>(1, bytes - kGiB);
}

}  // namespace

Status TrainerImpl::build_gpu() {
  LATHE_ASSIGN_OR_RETURN(DeviceChoice dev, parse_device(config.device));
  if (!dev.cuda) return Status::ok();
  const bool asked = !config.device.empty() && config.device != "auto";
  const DataRecipe& d = config.recipe.data;
  const AdamWConfig a = adamw_config(config.recipe);
  const TrainerRecipe& t = config.recipe.trainer;
  const CudaRecompute recompute = !t.activations_checkpoint ? CudaRecompute::kNone
                                  : t.activations_checkpoint_granularity == "selective" ? CudaRecompute::kSelective
                                                                                        : CudaRecompute::kFull;
  auto g = upload_to_cuda(*model, dev.index, d.micro_batch_size * d.seq_length,
                          {.beta1 = a.beta1, .beta2 = a.beta2, .eps = a.eps, .weight_decay = a.weight_decay,
                           .no_decay_norm_and_bias = a.no_decay_norm_and_bias},
                          recompute, 0, -1, d.seq_length, device_budget(t, dev.index), !t.activations_checkpoint,
                          t.gpu_memory_gib > 0.0 ? "trainer.gpu_memory_gib (less 1 GiB for the CUDA context)" : nullptr);
  if (!g.is_ok() && !asked && g.status().code() == StatusCode::kUnsupported) {
    note("device: cpu (" + g.status().message() + ")");
    return Status::ok();
  }
  LATHE_ASSIGN_OR_RETURN(gpu, std::move(g));
  std::string what = std::to_string(gpu->arena_bytes() >> 20) + " MiB";
  if (gpu->recompute() != recompute) {
    note(std::string("device: keeping every activation would not fit the device's memory (trainer.gpu_memory_gib, "
                     "else the free memory): ") +
         (gpu->recompute() == CudaRecompute::kSelective ? "selective" : "full") +
         " recomputation instead (the same values; trainer.activations_checkpoint chooses)");
  }
  if (gpu->recompute() == CudaRecompute::kSelective) {
    what += "; selective: " + std::to_string(gpu->layers_kept()) + " of " +
            std::to_string(model->config().num_hidden_layers) + " layers keep q|k|v";
    if (gpu->layers_offloaded() > 0)
      what += ", " + std::to_string(gpu->layers_offloaded()) + " keep gate|up in host memory";
  }
  note("device: cuda:" + std::to_string(dev.index) + " (" + what + ")");
  return Status::ok();
}

Result<PassLoss> TrainerImpl::pass(const MicroBatch& mb, float loss_scale, bool backward) {
  if (gpu) return backward ? gpu->forward_backward(mb, loss_scale) : gpu->forward_loss(mb);
  return backward ? model->forward_backward(mb, loss_scale) : model->forward_loss(mb);
}
Status TrainerImpl::zero_grads() {
  if (gpu) return gpu->zero_grads();
  model->zero_grads();
  return Status::ok();
}
Result<double> TrainerImpl::clip_grad_norm(double max_norm) {
  if (gpu) return gpu->clip_grad_norm(max_norm);
  return adamw->clip_grad_norm(max_norm);
}
Status TrainerImpl::optimizer_step(double lr) {
  if (gpu) return gpu->adamw_step(lr);
  adamw->step(lr);
  return Status::ok();
}
Status TrainerImpl::state_to_host() {
  if (!gpu) return Status::ok();
  LATHE_TRY(gpu->download_params(model->params().subspan(0, size_t(gpu->n_params()))));
  std::vector<float> m, v;
  for (size_t i = 0; i < model->param_table().size(); ++i) {
    LATHE_TRY(gpu->optimizer().read_moments(gpu->context(), i, &m, &v));
    std::copy(m.begin(), m.end(), adamw->exp_avg(i).begin());
    std::copy(v.begin(), v.end(), adamw->exp_avg_sq(i).begin());
  }
  adamw->set_steps_taken(gpu->optimizer().steps_taken());
  model->set_passes_run(gpu->passes_run());  // the dropout stream, for the checkpoint
  return Status::ok();
}

Status TrainerImpl::state_to_device() {
  if (!gpu) return Status::ok();
  LATHE_TRY(gpu->upload_params(model->params().subspan(0, size_t(gpu->n_params()))));
  for (size_t i = 0; i < model->param_table().size(); ++i) {
    LATHE_TRY(gpu->optimizer().write_moments(gpu->context(), i, adamw->exp_avg(i), adamw->exp_avg_sq(i)));
  }
  gpu->optimizer().set_steps_taken(adamw->steps_taken());
  gpu->set_passes_run(model->passes_run());
  return Status::ok();
}

// One optimizer step; step is 0-based (the schedule's index).
Result<TrainerImpl::StepResult> TrainerImpl::train_step(int64_t step) {
  const Clock::time_point t0 = Clock::now();
  GlobalBatch batch = batches->next();
  LATHE_TRY(zero_grads());
  const float loss_scale = 1.0f / static_cast<float>(std::max<int64_t>(batch.n_supervised, 1));
  double loss_sum = 0.0;
  int64_t n_tokens = 0;
  for (const MicroBatch& mb : batch.micro_batches) {
    LATHE_ASSIGN_OR_RETURN(PassLoss p, pass(mb, loss_scale, true));
    loss_sum += p.loss_sum;
    n_tokens += mb.n_tokens();
  }
  const double loss = loss_sum / static_cast<double>(std::max<int64_t>(batch.n_supervised, 1));
  LATHE_ASSIGN_OR_RETURN(const double grad_norm, clip_grad_norm(config.recipe.trainer.gradient_clip_val));
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    return invalid_argument("step ", step + 1, ": non-finite ", std::isfinite(loss) ? "gradient norm" : "loss",
                            " (loss ", loss, ", grad_norm ", grad_norm,
                            "); stopping before the update. Lower optim.lr or check the data");
  }
  const double lr = lr_at(schedule, step);
  LATHE_TRY(optimizer_step(lr));
  const double dt = std::max(seconds_since(t0), 1e-9);
  return StepResult{.metrics = {.step = step + 1,
                                .loss = loss,
                                .lr = lr,
                                .grad_norm = grad_norm,
                                .tokens = batch.n_supervised,
                                .tokens_per_s = static_cast<double>(n_tokens) / dt},
                    .n_tokens = n_tokens};
}

Result<ValMetrics> TrainerImpl::validate(int64_t step) {
  double loss_sum = 0.0;
  int64_t n = 0;
  for (const MicroBatch& mb : val_batches) {
    LATHE_ASSIGN_OR_RETURN(PassLoss p, pass(mb, 1.0f, false));
    loss_sum += p.loss_sum;
    n += p.n_supervised;
  }
  const double val_loss = n > 0 ? loss_sum / static_cast<double>(n) : std::nan("");
  return ValMetrics{.step = step, .val_loss = val_loss, .perplexity = perplexity_of(val_loss)};
}

Status TrainerImpl::finish(TrainSummary* s) {
  const fs::path run(config.run_dir);
  LATHE_TRY(state_to_host());
  s->full_sft = model->full_sft();
  s->output_dir = (run / (s->full_sft ? "model" : "adapter")).string();
  LATHE_TRY(s->full_sft ? model->save_full(s->output_dir) : model->save_adapter_peft(s->output_dir));
  if (s->full_sft) {
    // The full model must stand alone for generate and eval: its tokenizer too.
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                             "generation_config.json"}) {
      const fs::path src = fs::path(config.model_dir) / name;
      if (!fs::exists(src)) continue;
      std::error_code ec;
      fs::copy_file(src, fs::path(s->output_dir) / name, fs::copy_options::overwrite_existing, ec);
      if (ec) return io_error("cannot copy ", src.string(), " into ", s->output_dir, ": ", ec.message());
    }
  }
  return write_loss_svg((run / "metrics.jsonl").string(), (run / "loss_curves.svg").string());
}

// ---- Checkpoints and resume ------------------------------------------------

namespace {

using json = nlohmann::json;

// The tokenizer files a checkpoint carries, so it stands alone.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                           "tokenizer.model", "chat_template.jinja"};

json opt_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }
std::optional<double> opt_double(const json& j) {
  return j.is_number() ? std::optional<double>(j.get<double>()) : std::nullopt;
}

// A resumed run's metrics.jsonl keeps the records of the steps the
// checkpoint covers and drops the rest (steps the killed run did after it).
Status keep_metrics_through(const std::string& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::ok();
  std::string kept, line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a torn last line (no newline)
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    if (j["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << kept;
    if (!out.flush()) return io_error("cannot write ", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return io_error("cannot rename ", tmp, " to ", path);
  return Status::ok();
}

}  // namespace

Status TrainerImpl::setup_checkpoints() {
  const CheckpointRecipe& c = config.recipe.checkpoint;
  const ResumeRecipe& rr = config.recipe.resume;
  if (c.save_top_k != 0 || c.save_last) {
    CheckpointRunInfo info;
    info.full_sft = model->full_sft();
    info.lora = model->lora_config();
    std::error_code ec;
    info.base_model.path = fs::absolute(config.model_dir, ec).lexically_normal().string();
    LATHE_ASSIGN_OR_RETURN(info.base_model.hash, base_model_hash(config.model_dir));
    info.recipe_yaml = recipe_to_yaml(config.recipe);
    for (const char* name : kTokenizerFiles) {
      std::ifstream f(fs::path(config.model_dir) / name, std::ios::binary);
      if (!f) continue;
      info.extra_files.emplace_back(name, std::string(std::istreambuf_iterator<char>(f), {}));
    }
    const CheckpointPolicy policy{.dir = c.dir.empty() ? (fs::path(config.run_dir) / "checkpoints").string() : c.dir,
                                  .save_top_k = c.save_top_k,
                                  .monitor = c.monitor,
                                  .save_last = c.save_last,
                                  .async_save = c.async_save,
                                  .file_delay_ms = env::checkpoint_write_delay_ms(),
                                  .log = config.log};
    LATHE_ASSIGN_OR_RETURN(ckpt, CheckpointManager::open(policy, std::move(info)));
    const int64_t n_state = static_cast<int64_t>(adamw->state_arena().size());
    int64_t n_params = 0;
    for (const ParamInfo& p : model->param_table()) n_params += p.numel();
    ckpt->reserve(n_params + n_state);
    LATHE_ASSIGN_OR_RETURN(std::vector<std::string> removed, ckpt->remove_uncommitted());
    for (const std::string& d : removed)
      note("checkpoint: removed " + ckpt->root_url() + "/" + d + " (a save that did not finish)");
  }
  std::string from;
  if (!rr.path.empty()) {
    LATHE_ASSIGN_OR_RETURN(from, resolve_checkpoint(rr.path));
  } else if (ckpt && rr.mode == ResumeMode::kAuto) {
    from = ckpt->newest_committed();
  } else if (ckpt && !ckpt->kept().empty()) {
    return invalid_argument("checkpoint.dir ", ckpt->root_url(), " already holds checkpoints of an earlier run (",
                            ckpt->kept().back(), "); resume=auto continues from them, or set checkpoint.dir elsewhere");
  }
  if (!from.empty()) LATHE_TRY(resume_from(from));
  if (!from.empty()) LATHE_TRY(state_to_device().with_context("resuming on the GPU"));
  return Status::ok();
}

Status TrainerImpl::resume_from(const std::string& url) {
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> dir, open_existing_storage(url));
  LATHE_ASSIGN_OR_RETURN(CheckpointMetadata md, read_committed_metadata(*dir));
  if (md.full_sft != model->full_sft())
    return invalid_argument("checkpoint ", url, " is from a ", md.full_sft ? "full SFT" : "LoRA",
                            " run; this run's peft.peft_scheme differs");
  LATHE_ASSIGN_OR_RETURN(std::string hash, base_model_hash(config.model_dir));
  if (hash != md.base_model.hash)
    return invalid_argument("checkpoint ", url, " was trained on base model ", md.base_model.path, " (", md.base_model.hash,
                            "), but --model ", config.model_dir, " differs (", hash, ")");
  LATHE_ASSIGN_OR_RETURN(std::vector<uint8_t> state_bytes, read_verified(*dir, md, kCheckpointTrainerStateFile));
  LATHE_ASSIGN_OR_RETURN(std::vector<LoadedSlice> weights, load_rank_slices(*dir, md, ShardKind::kModel, 0, 1));
  LATHE_ASSIGN_OR_RETURN(std::vector<LoadedSlice> moments, load_rank_slices(*dir, md, ShardKind::kOptim, 0, 1));
  std::map<std::string, const LoadedSlice*> by_name;
  for (const LoadedSlice& w : weights) by_name[w.name] = &w;
  for (const LoadedSlice& m : moments) by_name[m.name] = &m;
  auto take = [&](const std::string& name, const Shape& shape, std::span<float> into) -> Status {
    auto it = by_name.find(name);
    if (it == by_name.end()) return invalid_argument("checkpoint ", url, " has no tensor ", name);
    if (!(it->second->shape == shape))
      return invalid_argument("checkpoint ", url, ": tensor ", name, " has shape ", it->second->shape.str(),
                              ", this run's is ", shape.str());
    std::copy(it->second->data.begin(), it->second->data.end(), into.begin());
    return Status::ok();
  };
  const std::vector<ParamInfo>& table = model->param_table();
  if (weights.size() != table.size())
    return invalid_argument("checkpoint ", url, " holds ", weights.size(), " trainable tensors, this run has ",
                            table.size(), " (different peft settings?)");
  for (size_t i = 0; i < table.size(); ++i) {
    const ParamInfo& p = table[i];
    LATHE_TRY(take(p.name, p.shape, model->params().subspan(size_t(p.offset), size_t(p.numel()))));
    LATHE_TRY(take(p.name + ".exp_avg", p.shape, adamw->exp_avg(i)));
    LATHE_TRY(take(p.name + ".exp_avg_sq", p.shape, adamw->exp_avg_sq(i)));
    if (adamw->config().amsgrad) LATHE_TRY(take(p.name + ".max_exp_avg_sq", p.shape, adamw->max_exp_avg_sq(i)));
  }
  const std::string where = dir->url_of(kCheckpointTrainerStateFile);
  const json st = json::parse(state_bytes.begin(), state_bytes.end(), nullptr, false);
  if (st.is_discarded() || !st.is_object()) return invalid_argument(where, ": not valid JSON");
  try {
    LATHE_ASSIGN_OR_RETURN(SamplerState sampler, sampler_state_from_json(st.at("data")));
    LATHE_TRY(batches->restore(sampler).with_context(where));
    start_step = st.at("step").get<int64_t>();
    adamw->set_steps_taken(st.at("optimizer").at("step").get<int64_t>());
    model->set_passes_run(st.at("rng").at("dropout_passes").get<uint64_t>());
    const json& p = st.at("progress");
    resumed.steps = start_step;
    resumed.train_seconds = p.at("train_seconds").get<double>();
    resumed.tokens_processed = p.at("tokens_processed").get<int64_t>();
    resumed.supervised_tokens = p.at("supervised_tokens").get<int64_t>();
    resumed.final_train_loss = p.at("final_train_loss").get<double>();
    resumed.best_val_loss = opt_double(p.at("best_val_loss"));
    if (p.at("best_val_step").is_number()) resumed.best_val_step = p.at("best_val_step").get<int64_t>();
    resumed.final_val_loss = opt_double(p.at("final_val_loss"));
    last_val_loss = resumed.final_val_loss;
  } catch (const std::exception& e) {
    return invalid_argument(where, ": ", e.what());
  }
  if (start_step > total_steps && total_steps >= 0)
    return invalid_argument("checkpoint ", url, " is at step ", start_step, ", past this run's ", total_steps, " steps");
  last_saved_step = start_step;
  note("resuming from " + url + " at step " + std::to_string(start_step));
  return Status::ok();
}

CheckpointSnapshot TrainerImpl::snapshot(int64_t step, double train_loss, const TrainSummary& s) {
  CheckpointSnapshot snap;
  snap.step = step;
  snap.metrics["train_loss"] = train_loss;
  if (last_val_loss && std::isfinite(*last_val_loss)) snap.metrics["val_loss"] = *last_val_loss;
  const std::vector<ParamInfo>& table = model->param_table();
  for (size_t i = 0; i < table.size(); ++i) {
    const ParamInfo& p = table[i];
    snap.model.push_back({p.name, p.shape, model->params().subspan(size_t(p.offset), size_t(p.numel()))});
    snap.optim.push_back({p.name + ".exp_avg", p.shape, adamw->exp_avg(i)});
    snap.optim.push_back({p.name + ".exp_avg_sq", p.shape, adamw->exp_avg_sq(i)});
    if (adamw->config().amsgrad) snap.optim.push_back({p.name + ".max_exp_avg_sq", p.shape, adamw->max_exp_avg_sq(i)});
  }
  const TrainRecipe& r = config.recipe;
  const json state = {
      {"format_version", 1},
      {"step", step},
      {"consumed_samples", step * r.data.global_batch_size},
      {"data", to_json(batches->state())},
      {"rng", {{"trainer_seed", r.trainer.seed}, {"dropout_passes", model->passes_run()}, {"data_seed", r.data.seed}}},
      {"lr_scheduler", {{"step", step}, {"last_lr", lr_at(schedule, step - 1)}, {"total_steps", total_steps}}},
      {"optimizer", {{"name", "adamw"}, {"step", adamw->steps_taken()}}},
      {"progress",
       {{"train_seconds", s.train_seconds},
        {"tokens_processed", s.tokens_processed},
        {"supervised_tokens", s.supervised_tokens},
        {"final_train_loss", s.final_train_loss},
        {"best_val_loss", opt_json(s.best_val_loss)},
        {"best_val_step", s.best_val_step ? json(*s.best_val_step) : json(nullptr)},
        {"final_val_loss", opt_json(s.final_val_loss)}}}};
  snap.trainer_state_json = state.dump(1) + "\n";
  return snap;
}

Status TrainerImpl::maybe_save(int64_t step, double train_loss, bool validated, bool last, const TrainSummary& s) {
  if (!ckpt || step == last_saved_step) return Status::ok();
  const CheckpointRecipe& c = config.recipe.checkpoint;
  bool due = last;
  if (c.every_n_train_steps > 0 && step % c.every_n_train_steps == 0) due = true;
  if (c.every_n_train_steps == 0 && validated) due = true;
  if (c.train_time_interval > 0 && seconds_since(last_save_time) >= c.train_time_interval * 60.0) due = true;
  if (!due) return Status::ok();
  LATHE_TRY(state_to_host());
  LATHE_TRY(ckpt->save(snapshot(step, train_loss, s)));
  last_saved_step = step;
  last_save_time = Clock::now();
  return Status::ok();
}

Trainer::Trainer(std::unique_ptr<TrainerImpl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;
TrainableModel& Trainer::model() { return *impl_->model; }

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainerConfig& config, const TextCodec* codec) {
  auto impl = std::make_unique<TrainerImpl>();
  impl->config = config;
  LATHE_TRY(impl->setup(codec));
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Result<TrainSummary> Trainer::run() {
  TrainerImpl& t = *impl_;
  const Clock::time_point t0 = Clock::now();
  const TrainerRecipe& tr = t.config.recipe.trainer;
  const std::string metrics_path = (fs::path(t.config.run_dir) / "metrics.jsonl").string();
  if (t.start_step > 0) LATHE_TRY(keep_metrics_through(metrics_path, t.start_step));
  LATHE_ASSIGN_OR_RETURN(MetricsWriter metrics, MetricsWriter::open(metrics_path, t.start_step > 0));
  ProgressBar progress({.total_steps = t.total_steps,
                        .style = t.config.progress,
                        .print_every_n_steps = std::max<int64_t>(tr.log_every_n_steps, 1),
                        .out = t.config.log});
  TrainSummary s = t.resumed;
  s.run_dir = t.config.run_dir;
  s.model_dir = t.config.model_dir;
  s.data_path = t.config.data_path;
  auto validate_now = [&](int64_t step) -> Status {
    if (t.val_batches.empty()) return Status::ok();
    LATHE_ASSIGN_OR_RETURN(ValMetrics v, t.validate(step));
    LATHE_TRY(metrics.write(v));
    progress.message("step " + std::to_string(step) + ": val_loss " + fixed(v.val_loss, 4) + ", perplexity " +
                     fixed(v.perplexity, 3));
    s.final_val_loss = v.val_loss;
    t.last_val_loss = v.val_loss;
    if (!s.best_val_loss || v.val_loss < *s.best_val_loss) {
      s.best_val_loss = v.val_loss;
      s.best_val_step = step;
    }
    return Status::ok();
  };

  for (int64_t step = t.start_step; step < t.total_steps; ++step) {
    const Clock::time_point ts = Clock::now();
    LATHE_ASSIGN_OR_RETURN(TrainerImpl::StepResult r, t.train_step(step));
    const StepMetrics& m = r.metrics;
    s.train_seconds += seconds_since(ts);
    s.tokens_processed += r.n_tokens;
    s.supervised_tokens += m.tokens;
    s.final_train_loss = m.loss;
    s.steps = m.step;
    LATHE_TRY(metrics.write(m));
    progress.update(m);
    const bool last = m.step == t.total_steps;
    const bool validated = (tr.val_check_interval > 0 && m.step % tr.val_check_interval == 0) || last;
    if (validated) LATHE_TRY(validate_now(m.step));
    LATHE_TRY(t.maybe_save(m.step, m.loss, validated && !t.val_batches.empty(), last, s));
  }
  progress.finish();
  s.epochs_started = t.batches->state().epoch + (t.batches->state().index > 0 ? 1 : 0);
  LATHE_TRY(t.finish(&s));
  if (t.ckpt) {
    LATHE_TRY(t.ckpt->wait());
    s.checkpoint_dir = t.ckpt->root_url();
  }
  s.resumed_from_step = t.start_step;
  s.tokens_per_s = s.train_seconds > 0 ? static_cast<double>(s.tokens_processed) / s.train_seconds : 0.0;
  s.wall_seconds = seconds_since(t0);
  return s;
}

std::string format_summary(const TrainSummary& s) {
  std::ostringstream os;
  os << "finished " << s.steps << " steps in " << format_duration(s.wall_seconds) << " ("
     << fixed(s.tokens_per_s, 0) << " tokens/s while training)\n";
  os << "  final train loss  " << fixed(s.final_train_loss, 4) << "\n";
  if (s.best_val_loss) {
    os << "  best val loss     " << fixed(*s.best_val_loss, 4) << " at step " << *s.best_val_step
       << " (perplexity " << fixed(perplexity_of(*s.best_val_loss), 3) << ")\n";
  }
  os << "  metrics           " << (fs::path(s.run_dir) / "metrics.jsonl").string() << ", "
     << (fs::path(s.run_dir) / "loss_curves.svg").string() << "\n";
  os << "  " << (s.full_sft ? "model             " : "adapter           ") << s.output_dir << "\n";
  if (!s.checkpoint_dir.empty()) {
    os << "  checkpoints       " << s.checkpoint_dir;
    if (s.resumed_from_step > 0) os << " (resumed at step " << s.resumed_from_step << ")";
    os << "\n";
  }
  os << "next:\n";
  if (s.full_sft) {
    os << "  lathe generate --model " << s.output_dir << " --prompt \"...\"\n";
    os << "  lathe eval --model " << s.output_dir << " --data " << s.data_path << "\n";
  } else {
    os << "  lathe generate --model " << s.model_dir << " --adapter " << s.output_dir << " --prompt \"...\"\n";
    os << "  lathe eval --model " << s.model_dir << " --adapter " << s.output_dir << " --data " << s.data_path
       << "\n";
  }
  return os.str();
}

}  // namespace lathe
