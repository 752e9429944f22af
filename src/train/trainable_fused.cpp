// bf16-mixed on AMX: the frozen projections that share an input and their
// LoRA adapters as one row-split group of tile GEMMs (gemm_amx.h,
// gemm_bf16_amx_packed_group), one parallel region per group:
//   forward   y_i = x·W_iᵀ,  u_i = scale·x·A_iᵀ,  y_i += u_i·B_iᵀ
//   backward  dx = Σ dy_i·W_i,  du_i = dy_i·B_i,  dx += scale·du·A
// Each thread runs all of these on its own chunk of rows, so x (or dy_i)
// is packed for the tiles once for its base and adapter products, and u or
// du never leave the thread's cache before their second product. The
// adapter factors are rounded to bf16 and packed per call (r rows or
// columns: small). The weight gradients dB_i += dy_iᵀ·u_i and
// dA_i += scale·du_iᵀ·x are f32 sums too, formed in the same region: after
// its products, each thread adds its chunk's rows into its own partial
// sums (AVX-512 FMAs while dy and du are in cache), which are added up
// after the region. The tile products and sums are those of the unfused
// bf16-mixed path (gemm_bf16 on the same operands); the weight gradients'
// f32 sums run in another order than that path's sgemms.
#include <immintrin.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_bf16.h"
#include "core/parallel.h"
#include "train/trainable_impl.h"

namespace lathe {

namespace {

// f [rows, cols] f32 as a packed right operand: op(B) = fᵀ (n rows, k
// cols) when trans_b, else f (n cols, k rows). Arena scratch.
const uint32_t* pack_factor(const float* f, int64_t rows, int64_t cols, bool trans_b, Arena& arena) {
  TensorView b16 = arena.alloc(DType::BF16, {rows, cols});
  convert_from_f32(f, b16.data, DType::BF16, rows * cols);
  const int64_t n = trans_b ? rows : cols, k = trans_b ? cols : rows;
  TensorView dst = arena.alloc(DType::I32, {cpu::amx_packed_b_words(n, k)});
  cpu::amx_pack_b(trans_b, n, k, b16.ptr<const uint16_t>(), cols, reinterpret_cast<uint32_t*>(dst.data), false);
  return reinterpret_cast<const uint32_t*>(dst.data);
}

constexpr size_t kMaxItems = 3 * kMaxLoraGroup + 1;

inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n > 0 ? __mmask16((1u << n) - 1) : 0; }

// acc[j · nc + c] += Σ_{t < rows} s[t · lds + j] · v[t · ldv + c] for j < nj,
// c < nc: four rows per pass over acc.
__attribute__((target("avx512f"))) void outer_accumulate(const float* s, int64_t lds, const float* v, int64_t ldv,
                                                          int64_t rows, int64_t nj, int64_t nc, float* acc) {
  for (int64_t t0 = 0; t0 < rows; t0 += 4) {
    const int64_t tr = std::min<int64_t>(4, rows - t0);
    for (int64_t j = 0; j < nj; ++j) {
      __m512 b[4];
      for (int64_t k = 0; k < 4; ++k) b[k] = _mm512_set1_ps(k < tr ? s[(t0 + k) * lds + j] : 0.0f);
      float* a = acc + j * nc;
      for (int64_t c = 0; c < nc; c += 16) {
        const __mmask16 m = mask16(nc - c);
        __m512 x = _mm512_maskz_loadu_ps(m, a + c);
        for (int64_t k = 0; k < tr; ++k) x = _mm512_fmadd_ps(b[k], _mm512_maskz_loadu_ps(m, v + (t0 + k) * ldv + c), x);
        _mm512_mask_storeu_ps(a + c, m, x);
      }
    }
  }
}

// What the backward group's chunks add into each thread's partial sums:
// adapter i's dBᵀ [r_i, out_i] from u_i and dy_i, then duᵀ·x [rank, in].
struct WeightGrads {
  int n = 0;
  const float* u[kMaxLoraGroup];
  const float* dy[kMaxLoraGroup];
  int64_t r[kMaxLoraGroup], out[kMaxLoraGroup], off[kMaxLoraGroup];  // off: into a thread's partials
  const float* du;
  const float* x;
  int64_t rank, in, a_off, per_thread;
  float* partials;  // [threads][per_thread]
  const cpu::AmxGroupAfter* next = nullptr;  // the caller's row work, after these sums

  static void add_chunk(void* ctx, int64_t r0, int64_t rows, int thread) {
    const WeightGrads& g = *static_cast<const WeightGrads*>(ctx);
    float* p = g.partials + thread * g.per_thread;
    for (int i = 0; i < g.n; ++i)
      outer_accumulate(g.u[i] + r0 * g.r[i], g.r[i], g.dy[i] + r0 * g.out[i], g.out[i], rows, g.r[i], g.out[i],
                       p + g.off[i]);
    outer_accumulate(g.du + r0 * g.rank, g.rank, g.x + r0 * g.in, g.in, rows, g.rank, g.in, p + g.a_off);
    if (g.next) g.next->fn(g.next->ctx, r0, rows, thread);
  }
};

}  // namespace

bool TrainableModelImpl::fused_ok(int l, std::span<const Proj> js) const {
  if (!opts.bf16_base || cpu::bf16_gemm_path() != cpu::Bf16GemmPath::kAmx || js.size() > kMaxLoraGroup) return false;
  for (Proj j : js) {
    const TLinear& L = blocks[size_t(l)].proj[j];
    if (!L.packed || !L.packed->packed() || L.b || L.dw) return false;
    if (L.lora >= 0 && (opts.lora.dropout > 0.0f || loras[size_t(L.lora)].in != L.in)) return false;
  }
  return true;
}

Status TrainableModelImpl::fused_forward(int l, std::span<const Proj> js, TensorView x,
                                         std::span<const TensorView> ys, bool accumulate, LayerActs& s,
                                         const cpu::AmxGroupAfter* after) {
  const int64_t n = x.shape[0];
  for (size_t i = 0; i < js.size(); ++i) {
    const TLinear& L = blocks[size_t(l)].proj[js[i]];
    if (x.shape[1] != L.in || !(ys[i].shape == Shape{n, L.out}))
      return invalid_argument("linear: x ", x.shape.str(), " and y ", ys[i].shape.str(), " do not fit w [", L.out,
                              ", ", L.in, "]");
    s.lora[js[i]] = {};
    if (L.lora >= 0) s.lora[js[i]].u = arena.alloc(DType::F32, {n, loras[size_t(L.lora)].r});
  }
  Arena::Scope scope(arena);
  const float scale = opts.lora.scale();
  cpu::AmxGroupItem items[kMaxItems];
  size_t count = 0;
  for (size_t i = 0; i < js.size(); ++i) {
    const TLinear& L = blocks[size_t(l)].proj[js[i]];
    items[count++] = {L.out, L.in, 1.0f, x.ptr<const float>(), L.in, L.packed->packed_forward(), accumulate,
                      ys[i].ptr<float>(), L.out};
  }
  for (Proj j : js) {  // u = scale·x·Aᵀ: the same packed x
    const TLinear& L = blocks[size_t(l)].proj[j];
    if (L.lora < 0) continue;
    const TLora& a = loras[size_t(L.lora)];
    items[count++] = {a.r, a.in, scale, x.ptr<const float>(), a.in, pack_factor(a.a, a.r, a.in, true, arena), false,
                      s.lora[j].u.ptr<float>(), a.r};
  }
  for (size_t i = 0; i < js.size(); ++i) {  // y += u·Bᵀ, on the rows u was just computed for
    const TLinear& L = blocks[size_t(l)].proj[js[i]];
    if (L.lora < 0) continue;
    const TLora& a = loras[size_t(L.lora)];
    items[count++] = {a.out, a.r, 1.0f, s.lora[js[i]].u.ptr<const float>(), a.r,
                      pack_factor(a.b, a.out, a.r, true, arena), true, ys[i].ptr<float>(), a.out};
  }
  PhaseScope timed(*this, kPhaseFused);
  cpu::gemm_bf16_amx_packed_group(n, {items, count}, cpu::AmxTiles::kHardware, after);
  return Status::ok();
}

Status TrainableModelImpl::fused_backward(int l, std::span<const Proj> js, TensorView x,
                                          std::span<const TensorView> dys, TensorView dx, bool accumulate,
                                          const LayerActs& s, const cpu::AmxGroupAfter* after,
                                          const cpu::AmxGroupAfter* before) {
  const int64_t n = x.shape[0], in = x.shape[1];
  for (size_t i = 0; i < js.size(); ++i) {
    const TLinear& L = blocks[size_t(l)].proj[js[i]];
    if (in != L.in || !(dys[i].shape == Shape{n, L.out}) || (!dx.empty() && !(dx.shape == x.shape)))
      return invalid_argument("linear backward: dy ", dys[i].shape.str(), " and dx ", dx.shape.str(),
                              " do not fit w [", L.out, ", ", L.in, "]");
  }
  Arena::Scope scope(arena);
  int64_t off[kMaxLoraGroup] = {}, rank = 0;
  for (size_t i = 0; i < js.size(); ++i) {
    const int lo = blocks[size_t(l)].proj[js[i]].lora;
    off[i] = rank;
    if (lo >= 0) rank += loras[size_t(lo)].r;
  }
  const float scale = opts.lora.scale();
  TensorView du = rank > 0 ? arena.alloc(DType::F32, {n, rank}) : TensorView{};
  TensorView a_stack = rank > 0 ? arena.alloc(DType::F32, {rank, in}) : TensorView{};
  cpu::AmxGroupItem items[kMaxItems];
  size_t count = 0;
  for (size_t i = 0; i < js.size(); ++i) {
    const TLinear& L = blocks[size_t(l)].proj[js[i]];
    const float* g = dys[i].ptr<const float>();
    if (!dx.empty())
      items[count++] = {L.in, L.out, 1.0f, g, L.out, L.packed->packed_backward(), accumulate || i > 0,
                        dx.ptr<float>(), L.in};
    if (L.lora < 0) continue;
    const TLora& a = loras[size_t(L.lora)];
    std::memcpy(a_stack.ptr<float>() + off[i] * in, a.a, sizeof(float) * size_t(a.r * in));
    items[count++] = {a.r, a.out, 1.0f, g, a.out, pack_factor(a.b, a.out, a.r, false, arena), false,
                      du.ptr<float>() + off[i], rank};  // du_i = dy_i·B_i, on dy_i's packing
  }
  if (!dx.empty() && rank > 0)
    items[count++] = {in, rank, scale, du.ptr<const float>(), rank,
                      pack_factor(a_stack.ptr<const float>(), rank, in, false, arena), true, dx.ptr<float>(), in};
  if (rank == 0) {
    PhaseScope timed(*this, kPhaseFused);
    cpu::gemm_bf16_amx_packed_group(n, {items, count}, cpu::AmxTiles::kHardware, after, before);
    return Status::ok();
  }
  WeightGrads g;
  for (size_t i = 0; i < js.size(); ++i) {
    const TLinear& L = blocks[size_t(l)].proj[js[i]];
    if (L.lora < 0) continue;
    const TLora& a = loras[size_t(L.lora)];
    g.u[g.n] = s.lora[js[i]].u.ptr<const float>(), g.dy[g.n] = dys[i].ptr<const float>();
    g.r[g.n] = a.r, g.out[g.n] = a.out, g.off[g.n] = g.n == 0 ? 0 : g.off[g.n - 1] + g.r[g.n - 1] * g.out[g.n - 1];
    ++g.n;
  }
  g.du = du.ptr<const float>(), g.x = x.ptr<const float>(), g.rank = rank, g.in = in;
  g.a_off = g.off[g.n - 1] + g.r[g.n - 1] * g.out[g.n - 1];
  g.per_thread = g.a_off + rank * in;
  g.next = after;
  const int threads = std::max(1, num_threads());
  TensorView partials = arena.alloc(DType::F32, {threads * g.per_thread});
  std::memset(partials.data, 0, size_t(partials.nbytes()));
  g.partials = partials.ptr<float>();
  const cpu::AmxGroupAfter sums{&WeightGrads::add_chunk, &g};
  {
    PhaseScope timed(*this, kPhaseFused);
    cpu::gemm_bf16_amx_packed_group(n, {items, count}, cpu::AmxTiles::kHardware, &sums, before);
  }
  PhaseScope timed(*this, kPhaseLora);
  int k = 0;
  for (size_t i = 0; i < js.size(); ++i) {  // dB_i += Σ_threads dBᵀ partials, transposed; dA_i += scale · Σ partials
    const TLinear& L = blocks[size_t(l)].proj[js[i]];
    if (L.lora < 0) continue;
    const TLora& a = loras[size_t(L.lora)];
    for (int t = 0; t < threads; ++t) {
      const float* p = g.partials + t * g.per_thread;
      if (a.db)
        for (int64_t j = 0; j < a.r; ++j)
          for (int64_t o = 0; o < a.out; ++o) a.db[o * a.r + j] += p[g.off[k] + j * a.out + o];
      if (a.da)
        for (int64_t e = 0; e < a.r * in; ++e) a.da[e] += scale * p[g.a_off + off[i] * in + e];
    }
    ++k;
  }
  return Status::ok();
}

}  // namespace lathe
