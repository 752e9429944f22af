// TrainRecipe checks and the settings derived from a recipe (optimizer and
// schedule configs, LoRA scale, HF module names). The key registry, parsing
// and YAML live in recipe_keys.cpp.
#include <climits>
#include <cmath>

#include "train/recipe.h"

namespace lathe {
namespace {

// HF projection names in the order a Llama block holds them.
constexpr std::string_view kHfModules[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"};

// The HF projections a NeMo (Megatron) linear covers; a HF name covers itself.
std::vector<std::string_view> covered(std::string_view m) {
  if (m == "linear_qkv") return {"q_proj", "k_proj", "v_proj"};
  if (m == "linear_proj") return {"o_proj"};
  if (m == "linear_fc1") return {"gate_proj", "up_proj"};
  if (m == "linear_fc2") return {"down_proj"};
  for (std::string_view h : kHfModules) if (h == m) return {h};
  return {};
}

Status validate_peft(const PeftRecipe& p) {
  if (p.peft_scheme == PeftScheme::kNone) return Status::ok();
  if (p.dim < 1) return invalid_argument("peft.dim must be >= 1, got ", p.dim);
  if (!(p.alpha > 0.0)) return invalid_argument("peft.alpha must be > 0, got ", p.alpha);
  if (!(p.dropout >= 0.0 && p.dropout < 1.0)) return invalid_argument("peft.dropout must be in [0, 1), got ", p.dropout);
  LATHE_TRY(hf_target_modules(p));
  return Status::ok();
}

Status validate_trainer(const TrainerRecipe& t) {
  if (t.max_steps == 0 || t.max_steps < -1) {
    return invalid_argument("trainer.max_steps must be > 0, or -1 to run trainer.max_epochs; got ", t.max_steps);
  }
  if (t.max_epochs == 0 || t.max_epochs < -1) {
    return invalid_argument("trainer.max_epochs must be > 0, or -1 for no limit; got ", t.max_epochs);
  }
  if (t.max_steps == -1 && t.max_epochs == -1) {
    return invalid_argument("trainer.max_steps and trainer.max_epochs are both -1: the run would never end; "
                            "set one, e.g. trainer.max_steps=1000");
  }
  if (t.val_check_interval < 0) {
    return invalid_argument("trainer.val_check_interval must be >= 0 (0: only at the end), got ",
                            t.val_check_interval);
  }
  if (t.limit_val_batches < -1) {
    return invalid_argument("trainer.limit_val_batches must be -1 (all), 0 (none) or a count; got ",
                            t.limit_val_batches);
  }
  if (t.log_every_n_steps < 1) return invalid_argument("trainer.log_every_n_steps must be >= 1, got ", t.log_every_n_steps);
  if (!(t.gradient_clip_val >= 0.0)) {
    return invalid_argument("trainer.gradient_clip_val must be >= 0 (0: off), got ", t.gradient_clip_val);
  }
  if (t.seed < 0) return invalid_argument("trainer.seed must be >= 0, got ", t.seed);
  if (!(t.gpu_memory_gib >= 0.0) || t.gpu_memory_gib > 1e6) {
    return invalid_argument("trainer.gpu_memory_gib must be >= 0 (0: the GPU's free memory), got ", t.gpu_memory_gib);
  }
  return Status::ok();
}

Status validate_data(const DataRecipe& d, int world_size) {
  if (d.seq_length < 2) return invalid_argument("data.seq_length must be >= 2, got ", d.seq_length);
  if (d.micro_batch_size < 1) return invalid_argument("data.micro_batch_size must be >= 1, got ", d.micro_batch_size);
  if (d.global_batch_size < 1) return invalid_argument("data.global_batch_size must be >= 1, got ", d.global_batch_size);
  const int64_t per_step = d.micro_batch_size * world_size;
  if (d.global_batch_size % per_step != 0) {
    const int64_t lower = d.global_batch_size / per_step * per_step;
    const int64_t upper = lower + per_step;
    return invalid_argument("data.global_batch_size (", d.global_batch_size,
                            ") must be divisible by data.micro_batch_size x world size (", d.micro_batch_size, " x ",
                            world_size, " = ", per_step, "); use ", lower > 0 ? std::to_string(lower) + " or " : "",
                            upper);
  }
  if (d.seq_length > INT32_MAX) return invalid_argument("data.seq_length is too large: ", d.seq_length);
  // The data set's own checks (template placeholders, label key).
  const DataOptions options{.prompt_template = d.prompt_template, .label_key = d.label_key,
                            .seq_length = static_cast<int32_t>(d.seq_length), .truncation = d.truncation,
                            .on_error = d.on_error};
  LATHE_TRY(options.validate());
  if (d.seed < 0) return invalid_argument("data.seed must be >= 0, got ", d.seed);
  if (d.packed_sequence && d.micro_batch_size != 1) {
    return invalid_argument("data.packed_sequence needs data.micro_batch_size=1 (a packed row already holds many "
                            "examples); got ", d.micro_batch_size);
  }
  return Status::ok();
}

Status validate_optim(const OptimRecipe& o, const TrainerRecipe& t) {
  if (!(o.lr > 0.0)) return invalid_argument("optim.lr must be > 0, got ", o.lr);
  Status adam = validate(AdamWConfig{.beta1 = o.betas[0], .beta2 = o.betas[1], .eps = o.eps,
                                     .weight_decay = o.weight_decay});
  if (!adam.is_ok()) {
    return invalid_argument("optim.betas must be in [0, 1), optim.eps and optim.weight_decay >= 0 (", adam.message(),
                            ")");
  }
  const SchedRecipe& s = o.sched;
  if (!(s.min_lr >= 0.0) || s.min_lr > o.lr) {
    return invalid_argument("optim.sched.min_lr must be in [0, optim.lr = ", o.lr, "], got ", s.min_lr);
  }
  if (s.warmup_steps < 0) return invalid_argument("optim.sched.warmup_steps must be >= 0, got ", s.warmup_steps);
  if (s.max_steps == 0 || s.max_steps < -1) {
    return invalid_argument("optim.sched.max_steps must be > 0, or -1 for the whole run; got ", s.max_steps);
  }
  const int64_t decay_steps = s.max_steps > 0 ? s.max_steps : t.max_steps;
  if (decay_steps > 0 && s.warmup_steps > decay_steps) {
    return invalid_argument("optim.sched.warmup_steps (", s.warmup_steps, ") exceeds the ", decay_steps,
                            " steps of the schedule; lower it or raise trainer.max_steps");
  }
  return Status::ok();
}

}  // namespace

Status validate(const TrainRecipe& r, int world_size) {
  if (world_size < 1) return invalid_argument("recipe: world size must be >= 1, got ", world_size);
  LATHE_TRY(validate_peft(r.peft).with_context("recipe"));
  LATHE_TRY(validate_trainer(r.trainer).with_context("recipe"));
  LATHE_TRY(validate_data(r.data, world_size).with_context("recipe"));
  LATHE_TRY(validate_optim(r.optim, r.trainer).with_context("recipe"));
  const CheckpointRecipe& c = r.checkpoint;
  if (c.every_n_train_steps < -1)
    return invalid_argument("recipe: checkpoint.every_n_train_steps must be >= -1, got ", c.every_n_train_steps);
  if (c.train_time_interval < 0)
    return invalid_argument("recipe: checkpoint.train_time_interval must be >= 0 minutes, got ", c.train_time_interval);
  if (c.save_top_k < -1) return invalid_argument("recipe: checkpoint.save_top_k must be >= -1, got ", c.save_top_k);
  if (c.monitor != "val_loss" && c.monitor != "train_loss")
    return invalid_argument("recipe: checkpoint.monitor must be val_loss or train_loss, got '", c.monitor, "'");
  return Status::ok();
}

Result<std::vector<std::string>> hf_target_modules(const PeftRecipe& p) {
  if (p.target_modules.empty()) {
    return invalid_argument("peft.target_modules is empty; LoRA needs at least one module, e.g. [linear_qkv]");
  }
  bool want[std::size(kHfModules)] = {};
  for (const std::string& m : p.target_modules) {
    std::vector<std::string_view> hf = covered(m);
    if (hf.empty()) return invalid_argument("peft.target_modules: unknown module '", m, "'");
    for (std::string_view h : hf) {
      for (size_t i = 0; i < std::size(kHfModules); ++i) want[i] = want[i] || kHfModules[i] == h;
    }
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < std::size(kHfModules); ++i) if (want[i]) out.emplace_back(kHfModules[i]);
  return out;
}

double lora_scale(const PeftRecipe& p) {
  const double r = static_cast<double>(p.dim);
  return p.rslora ? p.alpha / std::sqrt(r) : p.alpha / r;
}

int64_t grad_accumulation_steps(const TrainRecipe& r, int world_size) {
  return r.data.global_batch_size / (r.data.micro_batch_size * world_size);
}

AdamWConfig adamw_config(const TrainRecipe& r) {
  return AdamWConfig{.beta1 = r.optim.betas[0], .beta2 = r.optim.betas[1], .eps = r.optim.eps,
                     .weight_decay = r.optim.weight_decay, .amsgrad = false, .maximize = false,
                     .no_decay_norm_and_bias = r.optim.no_decay_norm_and_bias};
}

LrScheduleConfig lr_schedule_config(const TrainRecipe& r, int64_t total_steps) {
  const SchedRecipe& s = r.optim.sched;
  return LrScheduleConfig{.kind = s.name, .max_lr = r.optim.lr, .min_lr = s.min_lr, .warmup_steps = s.warmup_steps,
                          .max_steps = s.max_steps > 0 ? s.max_steps : total_steps};
}

std::string_view peft_scheme_name(PeftScheme s) { return s == PeftScheme::kLora ? "lora" : "none"; }

}  // namespace lathe
