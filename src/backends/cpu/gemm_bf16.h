// Internal to the CPU backend: GEMM with a bf16 right operand and f32 in and
// out, for training's frozen base under bf16 mixed precision.
//   C[m, n] = alpha · round_bf16(A)[m, k] · op(B) (+ C when accumulate)
// A is f32 [m, k] (rounded to bf16, nearest-even, while it is packed); B is
// bf16, [n, k] when trans_b (a weight W in y = x·Wᵀ) or [k, n] otherwise (W
// in dx = dy·W). Products are exact in f32 and sums accumulate in f32.
//
// With AVX512-BF16 (vdpbf16ps) the operands are packed into panels, pairs
// of k side by side in each 32-bit lane, and an 8 x 32 register tile does
// the work; the threads share the columns. Without it, B is widened to f32 a
// block at a time and multiplied by sgemm (A then stays f32: the portable
// path is slower and slightly more exact, never different in meaning).
// Scratch is per thread and kept from call to call: steady state allocates
// nothing. Where the CPU has AMX-BF16 and the OS grants the tile state,
// the AMX kernel (gemm_amx.h) runs instead; bf16_gemm_path() says which
// path runs, LATHE_CPU_GEMM (env.h) or force_bf16_gemm_path() picks one.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>

namespace lathe::cpu {

enum class Bf16GemmPath : uint8_t { kF32, kAvx512Bf16, kAmx };

// The path gemm_bf16 takes now: the forced one (force_bf16_gemm_path, else
// LATHE_CPU_GEMM) when this machine can run it, else the fastest it can
// (kF32 while set_portable_only is on). Thread-safe.
Bf16GemmPath bf16_gemm_path();
// Forces a path (tests and benchmarks); nullopt goes back to LATHE_CPU_GEMM
// or the default. A path the machine cannot run falls back as above.
void force_bf16_gemm_path(std::optional<Bf16GemmPath> path);

void gemm_bf16(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

// A frozen bf16 weight w [out, in] packed once for both of its GEMMs, the
// forward y = x·wᵀ and the input gradient dx = dy·w: the right operand of
// every call is then read as it lies, never re-packed (for the LM head that
// was 16 M elements per chunk). Both packings take the AMX tile layout
// (gemm_amx.h), which the AVX512-BF16 kernel reads too; on a machine
// without AVX512-BF16 nothing is packed and the calls take gemm_bf16 on w.
// Memory: about twice w's again. The same products and f32 sums as
// gemm_bf16 on w (bit for bit on the AMX path; the AVX512-BF16 kernel may
// cut k into other blocks). w is borrowed and must outlive the handle.
class PackedBf16Weight {
 public:
  PackedBf16Weight() = default;
  // Packs now (OpenMP threads) when this machine's kernels read packed weights.
  PackedBf16Weight(const uint16_t* w, int64_t out, int64_t in);

  // y[m, out] = alpha · round_bf16(x)[m, in] · wᵀ (+ y when accumulate).
  void forward(int64_t m, float alpha, const float* x, int64_t ldx, bool accumulate, float* y, int64_t ldy) const;
  // dx[m, in] = alpha · round_bf16(dy)[m, out] · w (+ dx when accumulate).
  void backward(int64_t m, float alpha, const float* dy, int64_t lddy, bool accumulate, float* dx,
                int64_t lddx) const;

  const uint16_t* weight() const { return w_; }
  // The packings (gemm_amx.h's layout) of op(B) = wᵀ (n out, k in) and of
  // op(B) = w (n in, k out); null when nothing is packed.
  const uint32_t* packed_forward() const { return fwd_.get(); }
  const uint32_t* packed_backward() const { return bwd_.get(); }
  int64_t out() const { return out_; }
  int64_t in() const { return in_; }
  bool packed() const { return fwd_ != nullptr; }

 private:
  struct Free {
    void operator()(uint32_t* p) const { std::free(p); }
  };
  const uint16_t* w_ = nullptr;
  int64_t out_ = 0, in_ = 0;
  std::unique_ptr<uint32_t[], Free> fwd_, bwd_;  // op(B) = wᵀ (n out, k in); op(B) = w (n in, k out)
};

}  // namespace lathe::cpu
