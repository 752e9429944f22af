// Rotary frequencies and validation of the rope op contract (src/ops/rope.h).
//
// The frequencies replay transformers' float32 tensor arithmetic step by step:
// `scalar / tensor` in torch is reciprocal(tensor) * scalar, `tensor / scalar`
// a true division, every intermediate rounded to f32. powf is taken correctly
// rounded (through double); torch's vectorized pow agrees but for rare
// one-ulp cases.
#include "ops/rope.h"

#include <cmath>
#include <numbers>

#include "ops/arg_checks.h"

namespace lathe {
using namespace ops_detail;

namespace {

std::vector<float> default_inv_freq(float theta, int head_dim) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) {
    float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    float p = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
    inv[static_cast<size_t>(i)] = 1.0f / p;
  }
  return inv;
}

// transformers' _compute_llama3_parameters: long wavelengths are divided by
// factor, short ones kept, the band between blended smoothly.
void apply_llama3(const RopeParams& p, std::vector<float>& inv) {
  const float old_len = static_cast<float>(p.original_max_position_embeddings);
  const float low_wavelen = static_cast<float>(p.original_max_position_embeddings / double(p.low_freq_factor));
  const float high_wavelen = static_cast<float>(p.original_max_position_embeddings / double(p.high_freq_factor));
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float band = p.high_freq_factor - p.low_freq_factor;
  for (float& f : inv) {
    float wavelen = (1.0f / f) * two_pi;
    float scaled = wavelen > low_wavelen ? f / p.factor : f;
    float smooth = ((1.0f / wavelen) * old_len - p.low_freq_factor) / band;
    float smoothed = (1.0f - smooth) * scaled / p.factor + smooth * scaled;
    bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f = medium ? smoothed : scaled;
  }
}

}  // namespace

Result<std::vector<float>> rope_inv_freq(const RopeParams& p, int head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0)
    return invalid_argument("rope: head_dim ", head_dim, " must be positive and even");
  if (!(p.theta > 0.0f)) return invalid_argument("rope: rope_theta ", p.theta, " must be positive");
  std::vector<float> inv = default_inv_freq(p.theta, head_dim);
  if (p.type.empty() || p.type == "default") return inv;
  if (p.type == "linear") {
    if (!(p.factor > 0.0f)) return invalid_argument("rope: linear factor ", p.factor, " must be positive");
    for (float& f : inv) f = f / p.factor;
    return inv;
  }
  if (p.type == "llama3") {
    if (!(p.factor > 0.0f) || !(p.high_freq_factor > p.low_freq_factor) || !(p.low_freq_factor > 0.0f) ||
        p.original_max_position_embeddings <= 0)
      return invalid_argument("rope: llama3 scaling needs factor > 0, high_freq_factor > low_freq_factor > 0 "
                              "and original_max_position_embeddings > 0");
    apply_llama3(p, inv);
    return inv;
  }
  return unsupported("rope: rope_type '", p.type, "' is not supported (default, linear, llama3 are)");
}

Status validate(const RopeTablesArgs& a) {
  const char* op = "rope";
  LATHE_TRY(check_rank(op, "inv_freq", a.inv_freq, 1));
  LATHE_TRY(check_dtype(op, "inv_freq", a.inv_freq, DType::F32));
  LATHE_TRY(check_rank(op, "positions", a.positions, 1));
  LATHE_TRY(check_dtype(op, "positions", a.positions, DType::I32));
  Shape want{a.positions.shape[0], a.inv_freq.shape[0]};
  LATHE_TRY(check_dtype(op, "cos", a.cos, DType::F32));
  LATHE_TRY(check_dtype(op, "sin", a.sin, DType::F32));
  LATHE_TRY(check_shape(op, "cos", a.cos, want));
  LATHE_TRY(check_shape(op, "sin", a.sin, want));
  return Status::ok();
}

Status validate(const RopeArgs& a) {
  const char* op = "rope";
  LATHE_TRY(check_rank(op, "x", a.x, 3));
  LATHE_TRY(check_dtype(op, "x", a.x, DType::F32));
  int64_t head_dim = a.x.shape[2];
  if (head_dim % 2 != 0) return invalid_argument("rope: head_dim ", head_dim, " is odd");
  Shape want{a.x.shape[0], head_dim / 2};
  LATHE_TRY(check_dtype(op, "cos", a.cos, DType::F32));
  LATHE_TRY(check_dtype(op, "sin", a.sin, DType::F32));
  LATHE_TRY(check_shape(op, "cos", a.cos, want));
  LATHE_TRY(check_shape(op, "sin", a.sin, want));
  return Status::ok();
}

}  // namespace lathe
