// LoRA forward and backward (see lora.h) as f32 GEMMs: x·Aᵀ (k the input
// width, n the rank) on the AVX-512 kernel for such shapes (gemm_skinny.h),
// which beat OpenBLAS there on both CPUs measured; the products with k or
// an output side equal to the rank stay on OpenBLAS, which was faster for
// them on a Xeon (bench_gemm_bf16's second table). Adapters that share an
// input run as one wider GEMM where they can. With LoraWeights::bf16 the
// products x·Aᵀ, u·Bᵀ, dy·B and du·A go to gemm_bf16 instead, the factors
// rounded to a bf16 copy per call (r rows or columns: small).
#include "nn/lora.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_bf16.h"
#include "backends/cpu/gemm_skinny.h"
#include "core/parallel.h"

namespace lathe {

namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Alias {
  const char* name;
  std::vector<const char*> leaves;
};
const Alias kAliases[] = {
    {"linear_qkv", {"q_proj", "k_proj", "v_proj"}}, {"linear_proj", {"o_proj"}},
    {"linear_fc1", {"gate_proj", "up_proj"}},       {"linear_fc2", {"down_proj"}},
    {"q_proj", {"q_proj"}}, {"k_proj", {"k_proj"}}, {"v_proj", {"v_proj"}}, {"o_proj", {"o_proj"}},
    {"gate_proj", {"gate_proj"}}, {"up_proj", {"up_proj"}}, {"down_proj", {"down_proj"}},
};
const char* const kLeafOrder[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

Status check_lora(const LoraWeights& w, const TensorView& x, const TensorView& y) {
  if (w.a.shape.rank() != 2 || w.b.shape.rank() != 2 || x.shape.rank() != 2 || y.shape.rank() != 2 ||
      w.a.shape[1] != x.shape[1] || w.b.shape[1] != w.a.shape[0] || y.shape[1] != w.b.shape[0] ||
      y.shape[0] != x.shape[0])
    return invalid_argument("lora: shapes do not chain: x ", x.shape.str(), ", A ", w.a.shape.str(), ", B ",
                            w.b.shape.str(), ", y ", y.shape.str());
  return Status::ok();
}

// t as bf16 (arena scratch).
const uint16_t* bf16_copy(const TensorView& t, Arena& arena) {
  TensorView c = arena.alloc(DType::BF16, t.shape);
  convert_from_f32(t.ptr<const float>(), c.data, DType::BF16, t.numel());
  return c.ptr<const uint16_t>();
}

// C[m, n] = alpha · X[m, k] · Fᵀ (+ C): F [n, k] f32, the factor (A, or B).
void times_factor_t(bool bf16, int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx,
                    const TensorView& f, bool accumulate, float* c, int64_t ldc, Arena& arena) {
  if (bf16)
    return cpu::gemm_bf16(true, m, n, k, alpha, x, ldx, bf16_copy(f, arena), k, accumulate, c, ldc);
  cpu::sgemm(false, true, m, n, k, alpha, x, ldx, f.ptr<const float>(), k, accumulate ? 1.0f : 0.0f, c, ldc);
}

// C[m, n] = alpha · X[m, k] · F (+ C): F [k, n] f32.
void times_factor(bool bf16, int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx,
                  const TensorView& f, bool accumulate, float* c, int64_t ldc, Arena& arena) {
  if (bf16)
    return cpu::gemm_bf16(false, m, n, k, alpha, x, ldx, bf16_copy(f, arena), n, accumulate, c, ldc);
  cpu::sgemm(false, false, m, n, k, alpha, x, ldx, f.ptr<const float>(), n, accumulate ? 1.0f : 0.0f, c, ldc);
}

}  // namespace

float LoraConfig::scale() const {
  return rslora ? alpha / std::sqrt(float(r)) : alpha / float(r);
}

Status LoraConfig::validate() const {
  if (r <= 0) return invalid_argument("peft: dim ", r, " must be positive");
  if (!(alpha > 0.0f)) return invalid_argument("peft: alpha ", alpha, " must be positive");
  if (!(dropout >= 0.0f && dropout < 1.0f)) return invalid_argument("peft: dropout ", dropout, " must be in [0, 1)");
  auto leaves = lora_target_leaves(target_modules);
  return leaves.is_ok() ? Status::ok() : leaves.status();
}

Result<std::vector<std::string>> lora_target_leaves(const std::vector<std::string>& modules) {
  if (modules.empty()) return invalid_argument("peft: target_modules is empty");
  std::vector<bool> on(std::size(kLeafOrder), false);
  for (const std::string& m : modules) {
    const Alias* hit = nullptr;
    for (const Alias& a : kAliases)
      if (m == a.name) hit = &a;
    if (!hit)
      return invalid_argument("peft: target module '", m, "' is unknown (linear_qkv, linear_proj, linear_fc1, "
                              "linear_fc2, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj are known)");
    for (const char* leaf : hit->leaves)
      for (size_t i = 0; i < std::size(kLeafOrder); ++i)
        if (std::string_view(leaf) == kLeafOrder[i]) on[i] = true;
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < std::size(kLeafOrder); ++i)
    if (on[i]) out.emplace_back(kLeafOrder[i]);
  return out;
}

std::string lora_module_path(const std::string& leaf) {
  const bool attn = leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj" || leaf == "o_proj";
  return (attn ? "self_attn." : "mlp.") + leaf;
}

void lora_init_a(float* a, int64_t r, int64_t in, uint64_t seed) {
  const double bound = 1.0 / std::sqrt(double(in));
  for (int64_t i = 0; i < r * in; ++i) {
    const double u = double(mix(seed + uint64_t(i) * 0x9E3779B97F4A7C15ull) >> 11) * 0x1.0p-53;  // [0, 1)
    a[i] = float((2.0 * u - 1.0) * bound);
  }
}

bool lora_dropout_keep(uint64_t seed, int64_t i, float p) {
  const double u = double(mix(seed ^ (uint64_t(i) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull)) >> 11) * 0x1.0p-53;
  return u >= double(p);
}

void lora_merge(float* w, const float* a, const float* b, int64_t out, int64_t in, int64_t r, float scale) {
  parallel_for(out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      float* row = w + o * in;
      for (int64_t k = 0; k < r; ++k) {
        const float c = scale * b[o * r + k];
        const float* arow = a + k * in;
        for (int64_t i = 0; i < in; ++i) row[i] += c * arow[i];
      }
    }
  });
}

Status lora_forward(const LoraWeights& w, TensorView x, TensorView y, Arena& arena, LoraSaved* saved) {
  LATHE_TRY(check_lora(w, x, y));
  std::optional<Arena::Scope> scope;
  if (!saved) scope.emplace(arena);
  const int64_t n = x.shape[0], in = x.shape[1], r = w.a.shape[0], out = w.b.shape[0];
  TensorView xin = x;
  if (w.dropout > 0.0f) {
    xin = arena.alloc(DType::F32, x.shape);
    const float keep_scale = 1.0f / (1.0f - w.dropout);
    const float* src = x.ptr<const float>();
    float* dst = xin.ptr<float>();
    parallel_for(n * in, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        dst[i] = lora_dropout_keep(w.dropout_seed, i, w.dropout) ? src[i] * keep_scale : 0.0f;
    });
  }
  TensorView u = arena.alloc(DType::F32, {n, r});
  Arena::Scope copies(arena);  // the bf16 factors
  if (w.bf16)
    times_factor_t(true, n, r, in, w.scale, xin.ptr<const float>(), in, w.a, false, u.ptr<float>(), r, arena);
  else
    cpu::sgemm_skinny(false, true, n, r, in, w.scale, xin.ptr<const float>(), in, w.a.ptr<const float>(), in, 0.0f,
                      u.ptr<float>(), r);
  times_factor_t(w.bf16, n, out, r, 1.0f, u.ptr<const float>(), r, w.b, true, y.ptr<float>(), out, arena);
  if (saved) *saved = {.x_drop = w.dropout > 0.0f ? xin : TensorView{}, .u = u};
  return Status::ok();
}

Status lora_backward(const LoraWeights& w, TensorView x, TensorView dy, TensorView dx, const LoraSaved& saved,
                     Arena& arena) {
  LATHE_TRY(check_lora(w, x, dy));
  Arena::Scope scope(arena);
  const int64_t n = x.shape[0], in = x.shape[1], r = w.a.shape[0], out = w.b.shape[0];
  const float* g = dy.ptr<const float>();
  TensorView du = arena.alloc(DType::F32, {n, r});  // ∂L/∂u = dy·B
  times_factor(w.bf16, n, r, out, 1.0f, g, out, w.b, false, du.ptr<float>(), r, arena);
  if (!w.db.empty())
    cpu::sgemm(true, false, out, r, n, 1.0f, g, out, saved.u.ptr<const float>(), r, 1.0f, w.db.ptr<float>(), r);
  const TensorView xin = saved.x_drop.empty() ? x : saved.x_drop;
  if (!w.da.empty())
    cpu::sgemm(true, false, r, in, n, w.scale, du.ptr<const float>(), r, xin.ptr<const float>(), in, 1.0f,
               w.da.ptr<float>(), in);
  if (dx.empty()) return Status::ok();
  if (w.dropout == 0.0f) {
    times_factor(w.bf16, n, in, r, w.scale, du.ptr<const float>(), r, w.a, true, dx.ptr<float>(), in, arena);
    return Status::ok();
  }
  TensorView dxin = arena.alloc(DType::F32, x.shape);
  times_factor(w.bf16, n, in, r, w.scale, du.ptr<const float>(), r, w.a, false, dxin.ptr<float>(), in, arena);
  const float keep_scale = 1.0f / (1.0f - w.dropout);
  float* d = dx.ptr<float>();
  const float* t = dxin.ptr<const float>();
  parallel_for(n * in, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      if (lora_dropout_keep(w.dropout_seed, i, w.dropout)) d[i] += t[i] * keep_scale;
  });
  return Status::ok();
}

namespace {

// True when the group can share its GEMMs: same input width and scale, no dropout.
bool groupable(std::span<const LoraWeights> w, TensorView x) {
  if (w.size() < 2 || w.size() > kMaxLoraGroup) return false;
  for (const LoraWeights& a : w)
    if (a.dropout > 0.0f || a.scale != w[0].scale || a.bf16 != w[0].bf16 || a.a.shape.rank() != 2 ||
        a.a.shape[1] != x.shape[1])
      return false;
  return true;
}

// The A factors stacked: [Σr, in]; offsets[i] is adapter i's first row.
TensorView stack_a(std::span<const LoraWeights> w, Arena& arena, int64_t* offsets) {
  int64_t rows = 0;
  for (size_t i = 0; i < w.size(); ++i) offsets[i] = rows, rows += w[i].a.shape[0];
  const int64_t in = w[0].a.shape[1];
  TensorView s = arena.alloc(DType::F32, {rows, in});
  for (size_t i = 0; i < w.size(); ++i)
    std::memcpy(s.ptr<float>() + offsets[i] * in, w[i].a.data, size_t(w[i].a.nbytes()));
  return s;
}

}  // namespace

Status lora_forward_group(std::span<const LoraWeights> w, TensorView x, std::span<const TensorView> y, Arena& arena,
                          std::span<LoraSaved> saved) {
  LATHE_CHECK(w.size() == y.size() && w.size() == saved.size(), "lora group: ", w.size(), " adapters, ", y.size(),
              " outputs, ", saved.size(), " saved");
  if (!groupable(w, x)) {
    for (size_t i = 0; i < w.size(); ++i) LATHE_TRY(lora_forward(w[i], x, y[i], arena, &saved[i]));
    return Status::ok();
  }
  for (size_t i = 0; i < w.size(); ++i) LATHE_TRY(check_lora(w[i], x, y[i]));
  const int64_t n = x.shape[0], in = x.shape[1];
  for (size_t i = 0; i < w.size(); ++i) saved[i] = {.x_drop = {}, .u = arena.alloc(DType::F32, {n, w[i].a.shape[0]})};
  {
    Arena::Scope scope(arena);
    int64_t off[kMaxLoraGroup];
    TensorView a = stack_a(w, arena, off);
    const int64_t rows = a.shape[0];
    TensorView u = arena.alloc(DType::F32, {n, rows});
    if (w[0].bf16)
      times_factor_t(true, n, rows, in, w[0].scale, x.ptr<const float>(), in, a, false, u.ptr<float>(), rows, arena);
    else
      cpu::sgemm_skinny(false, true, n, rows, in, w[0].scale, x.ptr<const float>(), in, a.ptr<const float>(), in,
                        0.0f, u.ptr<float>(), rows);
    for (size_t i = 0; i < w.size(); ++i) {
      const int64_t r = w[i].a.shape[0];
      for (int64_t t = 0; t < n; ++t)
        std::memcpy(saved[i].u.ptr<float>() + t * r, u.ptr<const float>() + t * rows + off[i],
                    sizeof(float) * size_t(r));
    }
  }
  Arena::Scope copies(arena);  // the bf16 factors
  for (size_t i = 0; i < w.size(); ++i) {
    const int64_t r = w[i].a.shape[0], out = w[i].b.shape[0];
    times_factor_t(w[i].bf16, n, out, r, 1.0f, saved[i].u.ptr<const float>(), r, w[i].b, true, y[i].ptr<float>(),
                   out, arena);
  }
  return Status::ok();
}

Status lora_backward_group(std::span<const LoraWeights> w, TensorView x, std::span<const TensorView> dy, TensorView dx,
                           std::span<const LoraSaved> saved, Arena& arena) {
  LATHE_CHECK(w.size() == dy.size() && w.size() == saved.size(), "lora group: ", w.size(), " adapters, ", dy.size(),
              " gradients, ", saved.size(), " saved");
  if (!groupable(w, x)) {
    for (size_t i = 0; i < w.size(); ++i) LATHE_TRY(lora_backward(w[i], x, dy[i], dx, saved[i], arena));
    return Status::ok();
  }
  for (size_t i = 0; i < w.size(); ++i) LATHE_TRY(check_lora(w[i], x, dy[i]));
  Arena::Scope scope(arena);
  const int64_t n = x.shape[0], in = x.shape[1];
  int64_t off[kMaxLoraGroup];
  TensorView a = stack_a(w, arena, off);
  const int64_t rows = a.shape[0];
  TensorView du = arena.alloc(DType::F32, {n, rows});  // [∂L/∂u_0 | ∂L/∂u_1 | ...]
  for (size_t i = 0; i < w.size(); ++i) {
    const int64_t r = w[i].a.shape[0], out = w[i].b.shape[0];
    const float* g = dy[i].ptr<const float>();
    times_factor(w[i].bf16, n, r, out, 1.0f, g, out, w[i].b, false, du.ptr<float>() + off[i], rows, arena);
    if (!w[i].db.empty())
      cpu::sgemm(true, false, out, r, n, 1.0f, g, out, saved[i].u.ptr<const float>(), r, 1.0f, w[i].db.ptr<float>(), r);
  }
  TensorView da = arena.alloc(DType::F32, {rows, in});
  cpu::sgemm(true, false, rows, in, n, w[0].scale, du.ptr<const float>(), rows, x.ptr<const float>(), in, 0.0f,
             da.ptr<float>(), in);
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i].da.empty()) continue;
    float* dst = w[i].da.ptr<float>();
    const float* src = da.ptr<const float>() + off[i] * in;
    for (int64_t e = 0; e < w[i].a.numel(); ++e) dst[e] += src[e];
  }
  if (!dx.empty())
    times_factor(w[0].bf16, n, in, rows, w[0].scale, du.ptr<const float>(), rows, a, true, dx.ptr<float>(), in, arena);
  return Status::ok();
}

}  // namespace lathe
