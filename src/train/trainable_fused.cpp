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
// dA_i += scale·du_iᵀ·x then run as f32 sgemms, as in nn/lora.cpp. The
// products and sums are those of the unfused bf16-mixed path (gemm_bf16 on
// the same operands), so fusing changes the schedule, not the numerics.
#include <cstring>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_bf16.h"
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
                                         std::span<const TensorView> ys, bool accumulate, LayerActs& s) {
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
  cpu::gemm_bf16_amx_packed_group(n, {items, count});
  return Status::ok();
}

Status TrainableModelImpl::fused_backward(int l, std::span<const Proj> js, TensorView x,
                                          std::span<const TensorView> dys, TensorView dx, bool accumulate,
                                          const LayerActs& s) {
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
  {
    PhaseScope timed(*this, kPhaseFused);
    cpu::gemm_bf16_amx_packed_group(n, {items, count});
  }
  if (rank == 0) return Status::ok();
  PhaseScope timed(*this, kPhaseLora);
  TensorView da = arena.alloc(DType::F32, {rank, in});
  cpu::sgemm(true, false, rank, in, n, scale, du.ptr<const float>(), rank, x.ptr<const float>(), in, 0.0f,
             da.ptr<float>(), in);
  for (size_t i = 0; i < js.size(); ++i) {
    const TLinear& L = blocks[size_t(l)].proj[js[i]];
    if (L.lora < 0) continue;
    const TLora& a = loras[size_t(L.lora)];
    if (a.db)
      cpu::sgemm(true, false, a.out, a.r, n, 1.0f, dys[i].ptr<const float>(), a.out, s.lora[js[i]].u.ptr<const float>(),
                 a.r, 1.0f, a.db, a.r);
    if (!a.da) continue;
    const float* src = da.ptr<const float>() + off[i] * in;
    for (int64_t e = 0; e < a.r * in; ++e) a.da[e] += src[e];
  }
  return Status::ok();
}

}  // namespace lathe
