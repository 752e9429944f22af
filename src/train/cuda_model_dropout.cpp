// LoRA dropout in CudaTrainableModel's pass (cuda_model.h): the CPU
// trainer's masks, regenerated from their seeds wherever the pass needs
// them. Each pass draws a base from the model's seed and its index
// (TrainableModelImpl's passes and dropout_base, the same mix), each adapter
// of it a seed from the base, its layer and its projection; element
// i = row·in + col of the adapter's input survives when the hash says so
// (backends/cuda/lora_ops.h). So a forward recomputed for the backward, and
// a run resumed at the same pass count, draw the very masks the CPU trainer
// draws. Per group with LoRA members (cuda_model_impl.h's layout):
//   forward   u_k = (mask_k∘x)·A4_kᵀ per member (mask_k∘x exact bf16), summed
//             and scaled by s/(1 − p) by lora_u's lora_sum_parts;
//   backward  dA_k = [du_hi | du_lo]ᵀ·(mask_k∘x) / (1 − p) (du carries s);
//             dx = dy·W in f32, + mask_k ∘ (du4_k·A4_k) / (1 − p) per member
//             (f32 GEMM, masked add), rounded to bf16 once by the last add.
// dB = dyᵀ·(s·u) and du = s·dy·B do not see the mask: they read u and dy
// as without dropout (group_backward). Each step runs over chunks of
// tokens, as many as the scratch (drop_tmp, drop_acc: 64 MiB each) holds
// rows of the group's input, not the whole micro batch.
#include <algorithm>
#include <array>

#include "backends/cuda/lora_ops.h"
#include "train/cuda_model_impl.h"

namespace lathe {

namespace {

// TrainableModelImpl's mix (splitmix64 with its increment).
uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

int64_t CudaModelImpl::max_lora_in() const {
  int64_t in = 0;
  for (int g = 0; g < kGnum; ++g)
    if (!group(g).loras.empty()) in = std::max(in, group(g).in);
  return in;
}

void CudaModelImpl::start_pass() { dropout_base = mix64(o.seed ^ mix64(passes++)); }

cuda::LoraDropoutMask CudaModelImpl::mask_of(const CLora& a) const {
  return {.seed = mix64(dropout_base ^ uint64_t(a.layer * kCnumProj + a.proj)), .p = o.lora_dropout};
}

// x.lora_f32 [n, lw] = each member's masked x times its A4 (member k in
// columns [slot·4r, slot·4r + 4r)), chunk_rows(G) tokens at a time (the
// masked x passes through drop_tmp).
Status CudaModelImpl::lora_u_dropout_products(const CGroup& G, const bf16p xe, int64_t n) {
  const int64_t r = o.lora_r, step = chunk_rows(G);
  const bf16p xd = reinterpret_cast<bf16p>(x.drop_tmp);
  for (int64_t r0 = 0; r0 < n; r0 += step) {
    const int64_t rows = std::min(step, n - r0);
    for (int k : G.loras) {
      const CLora& a = loras[size_t(k)];
      LATHE_TRY(cuda::lora_dropout_apply(ctx, {.x = xe + r0 * G.ldx + G.x_col, .ld_x = G.ldx, .out = xd,
                                               .rows = rows, .cols = G.in, .row0 = r0, .mask = mask_of(a)}));
      LATHE_TRY(cuda::gemm(ctx, {.a = xd, .b = a.a4, .c = x.lora_f32 + r0 * G.lw + a.slot * 4 * r, .m = rows,
                                 .n = 4 * r, .k = G.in, .trans_b = true, .c_dtype = DType::F32, .ldb = G.ldw,
                                 .ldc = G.lw}));
    }
  }
  return Status::ok();
}

// dA_k += [du_hi | du_lo]ᵀ·(mask_k∘x) / (1 − p), du's terms in dy_ext; the
// product summed over the chunks of tokens in f32 (beta = 1 after the first),
// each member's in its own block of x.lora_f32 (lora_part_floats apart),
// then the members' sums in one launch.
Status CudaModelImpl::lora_da_dropout(const CGroup& G, const bf16p xe, const bf16p dye, int64_t ld_dy, int64_t n) {
  const int64_t r = o.lora_r, step = chunk_rows(G);
  const bf16p xd = reinterpret_cast<bf16p>(x.drop_tmp);
  const float keep_scale = 1.0f / (1.0f - o.lora_dropout);
  std::array<cuda::LoraPartsArgs, kCnumProj> sums;
  int n_sums = 0;
  float* part = x.lora_f32;
  for (int k : G.loras) {
    const CLora& a = loras[size_t(k)];
    for (int64_t r0 = 0; r0 < n; r0 += step) {
      const int64_t rows = std::min(step, n - r0);
      LATHE_TRY(cuda::lora_dropout_apply(ctx, {.x = xe + r0 * G.ldx + G.x_col, .ld_x = G.ldx, .out = xd,
                                               .rows = rows, .cols = G.in, .row0 = r0, .mask = mask_of(a)}));
      LATHE_TRY(cuda::gemm(ctx, {.a = dye + r0 * ld_dy + G.out + a.slot * 4 * r + 2 * r, .b = xd, .c = part,
                                 .m = 2 * r, .n = G.in, .k = rows, .trans_a = true, .c_dtype = DType::F32,
                                 .beta = r0 > 0 ? 1.0f : 0.0f, .lda = ld_dy}));
    }
    sums[size_t(n_sums++)] = {.src = part, .rows = r, .cols = G.in, .n_parts = 2, .row_stride = G.in,
                              .part_stride = r * G.in, .scale = keep_scale, .sum = a.da, .accumulate = true};
    part += lora_part_floats(2 * r * G.in);
  }
  return cuda::lora_sum_parts_many(ctx, sums.data(), n_sums);
}

// dx (bf16, packed [n, in]) = dy·W + Σ_k mask_k ∘ (du_k·A_k) / (1 − p), per
// chunk of tokens: the sum in f32 (drop_acc) and rounded once by the last
// member's masked add. dx may overlay x_ext: nothing here reads x.
Status CudaModelImpl::lora_dx_dropout(const CGroup& G, const bf16p dye, int64_t ld_dy, bf16p dx, int64_t n) {
  const int64_t r = o.lora_r, step = chunk_rows(G);
  const float keep_scale = 1.0f / (1.0f - o.lora_dropout);
  for (int64_t r0 = 0; r0 < n; r0 += step) {
    const int64_t rows = std::min(step, n - r0);
    const bf16p dy = dye + r0 * ld_dy;
    LATHE_TRY(phase(kPhGemmBwd));
    LATHE_TRY(cuda::gemm(ctx, {.a = dy, .b = G.w, .c = x.drop_acc, .m = rows, .n = G.in, .k = G.out,
                               .c_dtype = DType::F32, .lda = ld_dy, .ldb = G.ldw}));
    LATHE_TRY(phase(kPhLora));
    for (size_t i = 0; i < G.loras.size(); ++i) {
      const CLora& a = loras[size_t(G.loras[i])];
      LATHE_TRY(cuda::gemm(ctx, {.a = dy + G.out + a.slot * 4 * r, .b = a.a4, .c = x.drop_tmp, .m = rows, .n = G.in,
                                 .k = 4 * r, .c_dtype = DType::F32, .lda = ld_dy, .ldb = G.ldw}));
      const bool last = i + 1 == G.loras.size();
      LATHE_TRY(cuda::lora_dropout_add(ctx, {.src = x.drop_tmp, .acc = x.drop_acc, .scale = keep_scale,
                                             .out = last ? dx + r0 * G.in : nullptr, .rows = rows, .cols = G.in,
                                             .row0 = r0, .mask = mask_of(a)}));
    }
  }
  return Status::ok();
}

}  // namespace lathe
