// Multi-tensor AdamW and global-norm gradient clipping (see adamw.h).
// The per-element update mirrors torch's single-tensor AdamW step:
//   p  = p * (1 - lr * wd)
//   m  = lerp(m, g, 1 - beta1)
//   v  = v * beta2 + (1 - beta2) * g * g
//   p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// with scalars formed in double and applied in fp32, as torch does.
#include "train/adamw.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/parallel.h"

namespace lathe {
namespace {

// Elements per work item: large enough to amortize scheduling, small enough
// that a few LoRA tensors still spread over all threads.
constexpr int64_t kChunkElems = int64_t{1} << 15;

struct ChunkArgs {
  float* p;
  const float* g;
  float* m;
  float* v;
  float* vmax;  // amsgrad only
  int64_t n;
  float grad_sign;      // -1 when maximizing
  float decay_mul;      // 1 - lr * wd (1 when the tensor has no decay)
  float lerp_coeff;     // torch's lerp: w for w < 0.5, else w - 1
  bool lerp_from_m;     // base of the lerp: m for w < 0.5, else g
  float beta2;
  float one_minus_beta2;
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float neg_step_size;  // -lr / (1 - beta1^t)
  float eps;
};

template <bool kAmsgrad>
[[gnu::always_inline]] inline void adamw_body(const ChunkArgs& a) {
  float* __restrict p = a.p;
  const float* __restrict gr = a.g;
  float* __restrict m = a.m;
  float* __restrict v = a.v;
  float* __restrict vmax = a.vmax;
#pragma omp simd
  for (int64_t i = 0; i < a.n; ++i) {
    const float g = a.grad_sign * gr[i];
    const float pd = p[i] * a.decay_mul;
    const float mi = (a.lerp_from_m ? m[i] : g) + a.lerp_coeff * (g - m[i]);
    const float vi = v[i] * a.beta2 + a.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    float vd = vi;
    if constexpr (kAmsgrad) {
      vd = std::max(vmax[i], vi);
      vmax[i] = vd;
    }
    const float denom = std::sqrt(vd) / a.bc2_sqrt + a.eps;
    p[i] = pd + a.neg_step_size * (mi / denom);
  }
}

// One copy of the loop per ISA; the widest the CPU has is picked at run time.
void adamw_default(const ChunkArgs& a) { adamw_body<false>(a); }
void adamw_default_ams(const ChunkArgs& a) { adamw_body<true>(a); }
[[gnu::target("avx2,fma")]] void adamw_avx2(const ChunkArgs& a) { adamw_body<false>(a); }
[[gnu::target("avx2,fma")]] void adamw_avx2_ams(const ChunkArgs& a) { adamw_body<true>(a); }
[[gnu::target("avx512f")]] void adamw_avx512(const ChunkArgs& a) { adamw_body<false>(a); }
[[gnu::target("avx512f")]] void adamw_avx512_ams(const ChunkArgs& a) { adamw_body<true>(a); }

using ChunkFn = void (*)(const ChunkArgs&);

ChunkFn pick_kernel(bool amsgrad) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return amsgrad ? adamw_avx512_ams : adamw_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return amsgrad ? adamw_avx2_ams : adamw_avx2;
  return amsgrad ? adamw_default_ams : adamw_default;
}

double sum_squares(const float* x, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return acc;
}

struct Span {
  const float* data;
  int64_t begin;
  int64_t end;
};

// Splits tensors into chunks of at most kChunkElems elements.
template <class Get>
std::vector<Span> chunk_spans(size_t n_tensors, Get get) {
  std::vector<Span> out;
  for (size_t t = 0; t < n_tensors; ++t) {
    auto [data, n] = get(t);
    for (int64_t b = 0; b < n; b += kChunkElems) out.push_back({data, b, std::min(n, b + kChunkElems)});
  }
  return out;
}

// Partial sums per chunk, added in chunk order: the result does not depend on
// the thread count.
double total_norm(const std::vector<Span>& spans) {
  std::vector<double> partial(spans.size(), 0.0);
  parallel_for(static_cast<int64_t>(spans.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      partial[c] = sum_squares(spans[c].data + spans[c].begin, spans[c].end - spans[c].begin);
    }
  });
  double sum = 0.0;
  for (double s : partial) sum += s;
  return std::sqrt(sum);
}

void scale_spans(const std::vector<Span>& spans, float coef) {
  parallel_for(static_cast<int64_t>(spans.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      float* x = const_cast<float*>(spans[c].data);  // spans made from mutable buffers
      for (int64_t i = spans[c].begin; i < spans[c].end; ++i) x[i] *= coef;
    }
  });
}

// torch: clip_coef = max_norm / (total + 1e-6), clamped to at most 1, formed
// in fp32 from the fp32 total as torch does (the sum itself is exact-er here:
// fp64 accumulation).
double clip_spans(const std::vector<Span>& spans, double max_norm) {
  const double norm = total_norm(spans);
  if (max_norm <= 0.0 || !std::isfinite(norm)) return norm;
  const float coef = static_cast<float>(max_norm) / (static_cast<float>(norm) + 1e-6f);
  if (coef < 1.0f) scale_spans(spans, coef);
  return norm;
}

}  // namespace

Status validate(const AdamWConfig& c) {
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0)) return invalid_argument("adamw: beta1 must be in [0, 1), got ", c.beta1);
  if (!(c.beta2 >= 0.0 && c.beta2 < 1.0)) return invalid_argument("adamw: beta2 must be in [0, 1), got ", c.beta2);
  if (!(c.eps >= 0.0) || !std::isfinite(c.eps)) return invalid_argument("adamw: eps must be >= 0, got ", c.eps);
  if (!(c.weight_decay >= 0.0) || !std::isfinite(c.weight_decay)) {
    return invalid_argument("adamw: weight_decay must be >= 0, got ", c.weight_decay);
  }
  return Status::ok();
}

bool is_no_decay_param(std::string_view name) {
  constexpr std::string_view kBias = ".bias";
  if (name == "bias" || (name.size() >= kBias.size() && name.substr(name.size() - kBias.size()) == kBias)) {
    return true;
  }
  return name.find("norm") != std::string_view::npos;
}

Result<AdamW> AdamW::create(const AdamWConfig& config, std::vector<AdamWParam> params) {
  LATHE_TRY(validate(config));
  std::set<std::string_view> names;
  AdamW opt;
  opt.config_ = config;
  for (size_t i = 0; i < params.size(); ++i) {
    AdamWParam& p = params[i];
    if (p.n < 0) return invalid_argument("adamw: parameter '", p.name, "' has negative size ", p.n);
    if (p.n > 0 && (p.param == nullptr || p.grad == nullptr)) {
      return invalid_argument("adamw: parameter '", p.name, "' has no ", p.param ? "gradient" : "data", " buffer");
    }
    if (!p.name.empty() && !names.insert(p.name).second) {
      return invalid_argument("adamw: parameter '", p.name, "' is registered twice");
    }
    if (config.no_decay_norm_and_bias && is_no_decay_param(p.name)) p.decay = false;
    opt.offset_.push_back(opt.total_);
    opt.total_ += p.n;
    for (int64_t b = 0; b < p.n; b += kChunkElems) {
      opt.chunks_.push_back({static_cast<int32_t>(i), b, std::min(p.n, b + kChunkElems)});
    }
  }
  opt.params_ = std::move(params);
  opt.state_.assign(static_cast<size_t>(opt.total_) * (config.amsgrad ? 3 : 2), 0.0f);
  return opt;
}

std::span<float> AdamW::exp_avg(size_t i) {
  return {state_.data() + offset_[i], static_cast<size_t>(params_[i].n)};
}
std::span<float> AdamW::exp_avg_sq(size_t i) {
  return {state_.data() + total_ + offset_[i], static_cast<size_t>(params_[i].n)};
}
std::span<float> AdamW::max_exp_avg_sq(size_t i) {
  if (!config_.amsgrad) return {};
  return {state_.data() + 2 * total_ + offset_[i], static_cast<size_t>(params_[i].n)};
}

void AdamW::step(double lr) {
  ++step_;
  const AdamWConfig& c = config_;
  const double t = static_cast<double>(step_);
  const double bc1 = 1.0 - std::pow(c.beta1, t);
  const double bc2 = 1.0 - std::pow(c.beta2, t);
  const double w = 1.0 - c.beta1;
  ChunkArgs base{};
  base.grad_sign = c.maximize ? -1.0f : 1.0f;
  base.lerp_from_m = std::abs(static_cast<float>(w)) < 0.5f;
  base.lerp_coeff = base.lerp_from_m ? static_cast<float>(w) : static_cast<float>(w) - 1.0f;
  base.beta2 = static_cast<float>(c.beta2);
  base.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  base.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  base.neg_step_size = static_cast<float>(-(lr / bc1));
  base.eps = static_cast<float>(c.eps);
  const float decay_mul = static_cast<float>(1.0 - lr * c.weight_decay);
  const ChunkFn kernel = pick_kernel(c.amsgrad);

  parallel_for(static_cast<int64_t>(chunks_.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t ci = b; ci < e; ++ci) {
      const Chunk& ch = chunks_[ci];
      const AdamWParam& p = params_[ch.param];
      const int64_t off = offset_[ch.param] + ch.begin;
      ChunkArgs a = base;
      a.p = p.param + ch.begin;
      a.g = p.grad + ch.begin;
      a.m = state_.data() + off;
      a.v = state_.data() + total_ + off;
      a.vmax = c.amsgrad ? state_.data() + 2 * total_ + off : nullptr;
      a.n = ch.end - ch.begin;
      a.decay_mul = p.decay ? decay_mul : 1.0f;
      kernel(a);
    }
  });
}

double AdamW::clip_grad_norm(double max_norm) {
  std::vector<Span> spans = chunk_spans(params_.size(), [&](size_t t) {
    return std::pair<const float*, int64_t>(params_[t].grad, params_[t].n);
  });
  return clip_spans(spans, max_norm);
}

double global_grad_norm(std::span<const std::span<const float>> grads) {
  return total_norm(chunk_spans(grads.size(), [&](size_t t) {
    return std::pair<const float*, int64_t>(grads[t].data(), static_cast<int64_t>(grads[t].size()));
  }));
}

double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm) {
  return clip_spans(chunk_spans(grads.size(), [&](size_t t) {
    return std::pair<const float*, int64_t>(grads[t].data(), static_cast<int64_t>(grads[t].size()));
  }), max_norm);
}

}  // namespace lathe
