// Multi-tensor AdamW on the device, the update of src/train/adamw (torch's
// AdamW, decoupled weight decay, lerp for the first moment as torch writes
// it): scalars formed in double on the host, applied in fp32. A table of
// tensors and a table of fixed-size chunks are uploaded once at create; each
// step is a single launch with one block per chunk, so hundreds of small
// LoRA tensors cost one launch. The bf16 working copy is written from the
// updated master in the same pass. Gradient clipping uses the same tables.
#include <cmath>
#include <set>

#include "backends/cuda/context_impl.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkElems = 16384;

struct TensorDesc {
  float* p;
  float* g;
  bf16_bits* w;
  float* m;
  float* v;
  int32_t decay;
};
struct ChunkDesc {
  int32_t tensor;
  int64_t begin, end;
};

struct StepScalars {
  float grad_sign;
  float decay_mul;
  float lerp_coeff;
  int32_t lerp_from_m;
  float beta2;
  float one_minus_beta2;
  float bc2_sqrt;
  float neg_step_size;
  float eps;
};

__global__ void adamw_kernel(const TensorDesc* tensors, const ChunkDesc* chunks, StepScalars s) {
  const ChunkDesc c = chunks[blockIdx.x];
  const TensorDesc t = tensors[c.tensor];
  const float decay_mul = t.decay ? s.decay_mul : 1.0f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    const float g = s.grad_sign * t.g[i];
    const float m0 = t.m[i];
    const float pd = t.p[i] * decay_mul;
    const float mi = (s.lerp_from_m ? m0 : g) + s.lerp_coeff * (g - m0);
    const float vi = t.v[i] * s.beta2 + s.one_minus_beta2 * g * g;
    t.m[i] = mi;
    t.v[i] = vi;
    const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    const float p = pd + s.neg_step_size * (mi / denom);
    t.p[i] = p;
    if (t.w) dev::st(t.w, i, p);
  }
}

// Σ g² over the chunk, added into one double.
__global__ void sum_squares_kernel(const TensorDesc* tensors, const ChunkDesc* chunks, double* total) {
  __shared__ float scratch[32];
  const ChunkDesc c = chunks[blockIdx.x];
  const float* g = tensors[c.tensor].g;
  float acc = 0.0f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) acc += g[i] * g[i];
  acc = dev::block_sum(acc, scratch);
  if (threadIdx.x == 0) atomicAdd(total, static_cast<double>(acc));
}

__global__ void scale_kernel(const TensorDesc* tensors, const ChunkDesc* chunks, float coef) {
  const ChunkDesc c = chunks[blockIdx.x];
  float* g = tensors[c.tensor].g;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) g[i] *= coef;
}

}  // namespace

Result<CudaAdamW> CudaAdamW::create(CudaContext& ctx, const CudaAdamWConfig& c, std::vector<CudaAdamWParam> params) {
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0)) return invalid_argument("cuda adamw: beta1 must be in [0, 1), got ", c.beta1);
  if (!(c.beta2 >= 0.0 && c.beta2 < 1.0)) return invalid_argument("cuda adamw: beta2 must be in [0, 1), got ", c.beta2);
  if (!(c.eps >= 0.0) || !std::isfinite(c.eps)) return invalid_argument("cuda adamw: eps must be >= 0, got ", c.eps);
  if (!(c.weight_decay >= 0.0) || !std::isfinite(c.weight_decay)) {
    return invalid_argument("cuda adamw: weight_decay must be >= 0, got ", c.weight_decay);
  }
  CudaAdamW opt;
  opt.config_ = c;
  std::set<std::string> names;
  std::vector<ChunkDesc> chunks;
  for (size_t i = 0; i < params.size(); ++i) {
    const CudaAdamWParam& p = params[i];
    if (p.n < 0) return invalid_argument("cuda adamw: parameter '", p.name, "' has negative size ", p.n);
    if (p.n > 0 && (!p.param || !p.grad)) {
      return invalid_argument("cuda adamw: parameter '", p.name, "' has no ", p.param ? "gradient" : "data", " buffer");
    }
    if (!p.name.empty() && !names.insert(p.name).second) {
      return invalid_argument("cuda adamw: parameter '", p.name, "' is registered twice");
    }
    opt.offset_.push_back(opt.total_);
    opt.total_ += p.n;
    for (int64_t b = 0; b < p.n; b += kChunkElems) {
      chunks.push_back({static_cast<int32_t>(i), b, std::min(p.n, b + kChunkElems)});
    }
  }
  const int dev = ctx.device();
  LATHE_ASSIGN_OR_RETURN(opt.state_, DeviceBuffer::alloc(dev, static_cast<size_t>(opt.total_) * 2 * sizeof(float)));
  LATHE_TRY(fill_zero(ctx, opt.state_.data(), opt.state_.size_bytes()));
  float* m = static_cast<float*>(opt.state_.data());
  float* v = m + opt.total_;
  std::vector<TensorDesc> tensors;
  for (size_t i = 0; i < params.size(); ++i) {
    const CudaAdamWParam& p = params[i];
    tensors.push_back({p.param, p.grad, p.working, m + opt.offset_[i], v + opt.offset_[i], p.decay ? 1 : 0});
  }
  const size_t tb = tensors.size() * sizeof(TensorDesc), cb = chunks.size() * sizeof(ChunkDesc);
  LATHE_ASSIGN_OR_RETURN(opt.tables_, DeviceBuffer::alloc(dev, tb + cb + sizeof(double)));
  LATHE_TRY(copy_to_device(ctx, opt.tables_.data(), tensors.data(), tb));
  LATHE_TRY(copy_to_device(ctx, static_cast<char*>(opt.tables_.data()) + tb, chunks.data(), cb));
  LATHE_TRY(ctx.synchronize());  // the host vectors go out of scope
  opt.n_chunks_ = static_cast<int64_t>(chunks.size());
  opt.params_ = std::move(params);
  return std::move(opt);
}

Status CudaAdamW::step(CudaContext& ctx, double lr) {
  ++step_;
  const CudaAdamWConfig& c = config_;
  const double t = static_cast<double>(step_);
  const double bc1 = 1.0 - std::pow(c.beta1, t);
  const double bc2 = 1.0 - std::pow(c.beta2, t);
  const double w = 1.0 - c.beta1;
  StepScalars s{};
  s.grad_sign = c.maximize ? -1.0f : 1.0f;
  s.decay_mul = static_cast<float>(1.0 - lr * c.weight_decay);
  const bool from_m = std::abs(static_cast<float>(w)) < 0.5f;
  s.lerp_from_m = from_m ? 1 : 0;
  s.lerp_coeff = from_m ? static_cast<float>(w) : static_cast<float>(w) - 1.0f;
  s.beta2 = static_cast<float>(c.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.neg_step_size = static_cast<float>(-(lr / bc1));
  s.eps = static_cast<float>(c.eps);
  if (n_chunks_ == 0) return Status::ok();
  const auto* tensors = static_cast<const TensorDesc*>(tables_.data());
  const auto* chunks = reinterpret_cast<const ChunkDesc*>(static_cast<const char*>(tables_.data()) +
                                                          params_.size() * sizeof(TensorDesc));
  adamw_kernel<<<static_cast<unsigned>(n_chunks_), kThreads, 0, stream_of(ctx)>>>(tensors, chunks, s);
  return ctx.check_launch("adamw");
}

Result<double> CudaAdamW::clip_grad_norm(CudaContext& ctx, double max_norm) {
  if (n_chunks_ == 0) return 0.0;
  const size_t tb = params_.size() * sizeof(TensorDesc);
  const auto* tensors = static_cast<const TensorDesc*>(tables_.data());
  const auto* chunks = reinterpret_cast<const ChunkDesc*>(static_cast<const char*>(tables_.data()) + tb);
  auto* total = reinterpret_cast<double*>(static_cast<char*>(tables_.data()) + tb + n_chunks_ * sizeof(ChunkDesc));
  LATHE_TRY(fill_zero(ctx, total, sizeof(double)));
  sum_squares_kernel<<<static_cast<unsigned>(n_chunks_), kThreads, 0, stream_of(ctx)>>>(tensors, chunks, total);
  LATHE_TRY(ctx.check_launch("adamw sum_squares"));
  double sum = 0;
  LATHE_TRY(copy_to_host(ctx, &sum, total, sizeof(double)));
  const double norm = std::sqrt(sum);
  if (max_norm <= 0.0 || !std::isfinite(norm)) return norm;
  const float coef = static_cast<float>(max_norm) / (static_cast<float>(norm) + 1e-6f);
  if (coef < 1.0f) {
    scale_kernel<<<static_cast<unsigned>(n_chunks_), kThreads, 0, stream_of(ctx)>>>(tensors, chunks, coef);
    LATHE_TRY(ctx.check_launch("adamw scale"));
  }
  return norm;
}

Status CudaAdamW::read_moments(CudaContext& ctx, size_t i, std::vector<float>* m, std::vector<float>* v) const {
  if (i >= params_.size()) return invalid_argument("cuda adamw: no parameter ", i, " (have ", params_.size(), ")");
  const int64_t n = params_[i].n;
  m->resize(n);
  v->resize(n);
  if (n == 0) return Status::ok();
  const float* base = static_cast<const float*>(state_.data());
  LATHE_TRY(copy_to_host(ctx, m->data(), base + offset_[i], n * sizeof(float)));
  LATHE_TRY(copy_to_host(ctx, v->data(), base + total_ + offset_[i], n * sizeof(float)));
  return Status::ok();
}

Status CudaAdamW::write_moments(CudaContext& ctx, size_t i, std::span<const float> m, std::span<const float> v) {
  if (i >= params_.size()) return invalid_argument("cuda adamw: no parameter ", i, " (have ", params_.size(), ")");
  const int64_t n = params_[i].n;
  if (int64_t(m.size()) != n || int64_t(v.size()) != n)
    return invalid_argument("cuda adamw: moments of ", params_[i].name, " have ", m.size(), " and ", v.size(),
                            " values, the tensor has ", n);
  if (n == 0) return Status::ok();
  float* base = static_cast<float*>(state_.data());
  LATHE_TRY(copy_to_device(ctx, base + offset_[i], m.data(), n * sizeof(float)));
  return copy_to_device(ctx, base + total_ + offset_[i], v.data(), n * sizeof(float));
}

}  // namespace lathe::cuda
