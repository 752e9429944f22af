// Multi-tensor AdamW over fp32 master parameters, with fp32 first and second
// moments, and gradient clipping by global L2 norm.
//
// The update is torch.optim.AdamW's (decoupled weight decay, bias correction as
// torch computes it, amsgrad and maximize optional), so a run here and the same
// run under PyTorch agree to fp32 rounding. The optimizer borrows the parameter
// and gradient buffers (they normally live in the trainer's arenas) and owns one
// state arena holding every tensor's moments back to back, so a checkpoint is a
// single write. Work is split into fixed-size element chunks across all tensors
// (many small LoRA tensors still fill every thread), and each chunk runs a
// vectorized loop chosen once per process for the CPU's widest ISA.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

// torch.optim.AdamW's defaults.
struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p *= 1 - lr * weight_decay
  bool amsgrad = false;
  bool maximize = false;
  // When true, parameters whose name says they are a norm weight or a bias
  // (is_no_decay_param) get no weight decay: a second parameter group, as NeMo
  // and many fine-tuning scripts set up. Off by default: torch's single group.
  bool no_decay_norm_and_bias = false;
};
Status validate(const AdamWConfig& c);  // messages start with "adamw: "

// One trainable tensor. Buffers are borrowed and must outlive the optimizer.
struct AdamWParam {
  std::string name;         // HF-style name, used for no-decay decisions and errors
  float* param = nullptr;   // [n] fp32 master weights, updated in place by step()
  float* grad = nullptr;    // [n] fp32 gradient, read by step(), scaled by clip_grad_norm()
  int64_t n = 0;
  bool decay = true;        // false: weight decay never applies to this tensor
};

// True for names of norm weights (".*norm.*") and biases ("*.bias").
bool is_no_decay_param(std::string_view name);

class AdamW {
 public:
  // Validates config and params (non-null buffers, n >= 0, unique names) and
  // allocates zeroed state. With no_decay_norm_and_bias, matching params get
  // decay = false.
  static Result<AdamW> create(const AdamWConfig& config, std::vector<AdamWParam> params);

  // One update of every parameter with learning rate lr (from the schedule).
  // Multi-threaded inside (OpenMP); call from one thread at a time.
  void step(double lr);

  // torch.nn.utils.clip_grad_norm_ over all registered gradients:
  // total = sqrt(sum of squares), coef = max_norm / (total + 1e-6), and the
  // gradients are scaled by min(coef, 1). Returns the pre-clip total norm.
  // max_norm <= 0 only measures. A non-finite total leaves gradients as they
  // are (torch would poison them with NaN) so the caller can skip the step.
  double clip_grad_norm(double max_norm);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t n) { step_ = n; }  // when restoring a checkpoint
  const AdamWConfig& config() const { return config_; }
  size_t n_params() const { return params_.size(); }
  const AdamWParam& param(size_t i) const { return params_[i]; }

  // Moments of parameter i ([n] each). max_exp_avg_sq is empty unless amsgrad.
  std::span<float> exp_avg(size_t i);
  std::span<float> exp_avg_sq(size_t i);
  std::span<float> max_exp_avg_sq(size_t i);
  // The whole state arena, [n_state_sets * total elements]: every m, then every
  // v, then (amsgrad) every max v, each in parameter order. For checkpoints.
  std::span<float> state_arena() { return state_; }

 private:
  struct Chunk {
    int32_t param;  // index into params_
    int64_t begin;  // element range inside that tensor
    int64_t end;
  };
  AdamW() = default;

  AdamWConfig config_;
  std::vector<AdamWParam> params_;
  std::vector<int64_t> offset_;  // element offset of each param in one state set
  int64_t total_ = 0;            // elements over all params
  std::vector<float> state_;     // [m | v | max v]
  std::vector<Chunk> chunks_;
  int64_t step_ = 0;
};

// clip_grad_norm's math over any set of gradient buffers.
double global_grad_norm(std::span<const std::span<const float>> grads);
double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm);

}  // namespace lathe
