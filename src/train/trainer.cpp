// The fine-tuning loop (see trainer.h): setup turns a recipe into a data set,
// a batch iterator, a trainable model, an optimizer and a schedule; run()
// is the step loop plus validation, and finish() writes the run's outputs.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "train/adamw.h"
#include "train/batcher.h"
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
  std::optional<AdamW> adamw;
  LrScheduleConfig schedule;
  int64_t total_steps = 0;

  Status setup(const TextCodec* given_codec);
  Status load_data();
  Status build_model();
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
  return write_recipe_yaml(r, (fs::path(config.run_dir) / "recipe.yaml").string());
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
  schedule = lr_schedule_config(r, total_steps);
  return lathe::validate(schedule).with_context("optim.sched");
}

// One optimizer step; step is 0-based (the schedule's index).
Result<TrainerImpl::StepResult> TrainerImpl::train_step(int64_t step) {
  const Clock::time_point t0 = Clock::now();
  GlobalBatch batch = batches->next();
  model->zero_grads();
  const float loss_scale = 1.0f / static_cast<float>(std::max<int64_t>(batch.n_supervised, 1));
  double loss_sum = 0.0;
  int64_t n_tokens = 0;
  for (const MicroBatch& mb : batch.micro_batches) {
    LATHE_ASSIGN_OR_RETURN(PassLoss pass, model->forward_backward(mb, loss_scale));
    loss_sum += pass.loss_sum;
    n_tokens += mb.n_tokens();
  }
  const double loss = loss_sum / static_cast<double>(std::max<int64_t>(batch.n_supervised, 1));
  const double grad_norm = adamw->clip_grad_norm(config.recipe.trainer.gradient_clip_val);
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    return invalid_argument("step ", step + 1, ": non-finite ", std::isfinite(loss) ? "gradient norm" : "loss",
                            " (loss ", loss, ", grad_norm ", grad_norm,
                            "); stopping before the update. Lower optim.lr or check the data");
  }
  const double lr = lr_at(schedule, step);
  adamw->step(lr);
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
    LATHE_ASSIGN_OR_RETURN(PassLoss pass, model->forward_loss(mb));
    loss_sum += pass.loss_sum;
    n += pass.n_supervised;
  }
  const double val_loss = n > 0 ? loss_sum / static_cast<double>(n) : std::nan("");
  return ValMetrics{.step = step, .val_loss = val_loss, .perplexity = perplexity_of(val_loss)};
}

Status TrainerImpl::finish(TrainSummary* s) {
  const fs::path run(config.run_dir);
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
  LATHE_ASSIGN_OR_RETURN(MetricsWriter metrics,
                         MetricsWriter::open((fs::path(t.config.run_dir) / "metrics.jsonl").string()));
  ProgressBar progress({.total_steps = t.total_steps,
                        .style = t.config.progress,
                        .print_every_n_steps = std::max<int64_t>(tr.log_every_n_steps, 1),
                        .out = t.config.log});
  TrainSummary s{.run_dir = t.config.run_dir, .model_dir = t.config.model_dir, .data_path = t.config.data_path};
  auto validate_now = [&](int64_t step) -> Status {
    if (t.val_batches.empty()) return Status::ok();
    LATHE_ASSIGN_OR_RETURN(ValMetrics v, t.validate(step));
    LATHE_TRY(metrics.write(v));
    progress.message("step " + std::to_string(step) + ": val_loss " + fixed(v.val_loss, 4) + ", perplexity " +
                     fixed(v.perplexity, 3));
    s.final_val_loss = v.val_loss;
    if (!s.best_val_loss || v.val_loss < *s.best_val_loss) {
      s.best_val_loss = v.val_loss;
      s.best_val_step = step;
    }
    return Status::ok();
  };

  for (int64_t step = 0; step < t.total_steps; ++step) {
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
    if ((tr.val_check_interval > 0 && m.step % tr.val_check_interval == 0) || last) LATHE_TRY(validate_now(m.step));
  }
  progress.finish();
  s.epochs_started = t.batches->state().epoch + (t.batches->state().index > 0 ? 1 : 0);
  LATHE_TRY(t.finish(&s));
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
